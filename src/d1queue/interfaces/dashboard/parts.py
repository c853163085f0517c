"""The parts the dashboard's pages are built of: a page as a list of
sections, tables as lists of columns, and the small pieces several pages
show (notices, pagers, badges, links to jobs, inline and confirming forms).

A section is a function from what its page shows (a `*Shown` dataclass,
read by pages.py) to markup; a page is the sections of its tuple, in order
(`render`). Nothing here reads a database: every part can be called, and
tested, with made-up values. Every value goes through `h.e`, `h.q` or `h.qs`
(html.py); a column's header is fixed markup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qs, urlparse

from ..router import Reply
from . import html as h
from .request import Request, csrf_field, html_page

V = TypeVar("V")
R = TypeVar("R")


def render(shown: V, sections: Iterable[Callable[[V], str]]) -> str:
    """A page's body: each of its sections over what the page shows."""
    return "".join(section(shown) for section in sections)


def page(request: Request, title: str, body: str, *, status: int = 200, current: str = "") -> Reply:
    """A page in the frame (`current`: the navigation link it is under)."""
    return Reply(status, html_page(request, title, body, current=current))


def live(id: str, sections: Sequence[Callable[[V], str]]) -> Callable[[V], str]:
    """The section made of `sections`, in a block the page's script
    refreshes (data-live)."""

    def block(shown: V) -> str:
        return f'<div id="{id}" data-live>{render(shown, sections)}</div>'

    return block


def titled(id: str, title: str, content: str) -> str:
    """A section under its heading, refreshed by the page's script."""
    return (
        f'<section id="{id}" data-live aria-labelledby="{id}-h">'
        f'<h2 id="{id}-h">{title}</h2>{content}</section>'
    )


# -- tables ---------------------------------------------------------------------


@dataclass(frozen=True)
class Column(Generic[R]):
    """A table's column: its header (fixed markup), the markup of its cell
    for a row, and its class, the header's and the cell's (`cell_cls`: the
    cell's, where it differs). `row_header`: the cell is the row's header."""

    header: str
    cell: Callable[[R], object]
    cls: str = ""
    cell_cls: str | None = None
    row_header: bool = False

    def th(self) -> str:
        return f'<th scope="col"{_class(self.cls)}>{self.header}</th>'

    def td(self, row: R) -> str:
        if self.row_header:
            return f'<th scope="row">{self.cell(row)}</th>'
        cls = self.cls if self.cell_cls is None else self.cell_cls
        return f"<td{_class(cls)}>{self.cell(row)}</td>"


def _class(cls: str) -> str:
    return f' class="{cls}"' if cls else ""


def table(
    caption: str,
    columns: Sequence[Column[R]],
    rows: Iterable[R],
    *,
    wrap: str = "table-wrap",
    caption_shown: bool = False,
) -> str:
    """A table of `rows`, a cell a column; its caption is for screen readers
    only unless `caption_shown`."""
    head = "".join(c.th() for c in columns)
    body = "".join("<tr>" + "".join(c.td(r) for c in columns) + "</tr>" for r in rows)
    cap = "<caption>" if caption_shown else '<caption class="visually-hidden">'
    return (
        f'<div class="{wrap}"><table>{cap}{caption}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def crumbs(trail: Iterable[tuple[str, str]], here: str) -> str:
    """Where a page is: each (address, name) up to it as a link, then its
    own name; names are escaped here (a queue's, a job's, from the rows)."""
    links = "".join(f'<a href="{h.e(href)}">{h.e(name)}</a> › ' for href, name in trail)
    return (
        f'<nav class="crumbs" aria-label="Breadcrumb"><p>{links}'
        f'<span aria-current="page">{h.e(here)}</span></p></nav>'
    )


def empty(text: str, more: str = "") -> str:
    """What a list shows with nothing in it: `text` (markup), then `more`."""
    return f'<div class="empty"><p>{text}</p>{more}</div>'


def not_found(request: Request, kind: str, id: str, why: str) -> Reply:
    """The 404 page of a `kind` (Job, Batch) with no `id`: why (markup),
    and the way back."""
    body = f"<h1>{h.e(kind)} {h.e(id)}</h1>" + empty(
        f'{why} <a href="/ui">Back to the overview</a>.'
    )
    return page(request, f"{kind} not found", body, status=404)


def curl(request: Request, path: str, body: str) -> str:
    """An example call of the API: POST `body` (JSON) to `path`."""
    return (
        '<pre>curl -H "Authorization: Bearer $TOKEN" '
        f"{h.e(origin(request))}{path} \\\n     -d '{body}'</pre>"
    )


def stats(items: Iterable[tuple[object, str]]) -> str:
    """Counts in a row: each value (markup) over its label."""
    cells = "".join(f'<li><span class="n">{value}</span>{label}</li>' for value, label in items)
    return f'<ul class="stats">{cells}</ul>'


def props(items: Iterable[tuple[str, object]]) -> str:
    """Named values (markup), one under the other."""
    return '<dl class="props">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


# -- paging -----------------------------------------------------------------------


def nav(links: list[str]) -> str:
    """The links to other pages of a list (nothing when there are none)."""
    return f'<nav class="pager" aria-label="Pages">{"".join(links)}</nav>' if links else ""


def pager(base: str, filters: Mapping[str, str], cursor: str, next_cursor: str | None) -> str:
    """A cursor-paged list's links: to its first page, and to the next."""
    links = []
    if cursor:
        links.append(f'<a href="{h.e(base + h.qs(filters))}">« First page</a>')
    if next_cursor:
        links.append(
            f'<a href="{h.e(base + h.qs({**filters, "cursor": next_cursor}))}">Next page »</a>'
        )
    return nav(links)


# -- notices ----------------------------------------------------------------------

NOTICES = {
    "signed_in": "Signed in.",
    "paused": "Queue paused: its jobs wait until it is resumed.",
    "resumed": "Queue running again: the next cron run drains it.",
    "schedule_paused": "Schedule paused: it enqueues nothing until resumed.",
    "schedule_resumed": "Schedule running again, from its next slot.",
    "cancelled": "Job cancelled.",
    "cancelling": "Job running: marked, and its drain ends it cancelled.",
    "run_now": "Job made due now: the next drain runs it.",
    "already_ready": "The job was already due; nothing changed.",
    "retried": "{n} failed job(s) put back on their queues.",
    "removed": "{n} failed job(s) removed for good.",
    "limits_set": "Limits saved: every drain claims under them from its next claim.",
    "schedule_run": "The schedule's job was pushed now: the next drain runs it.",
    "schedule_run_again": "That Run now was done already: nothing more was pushed.",
    "schedule_edited": "Schedule saved: it runs from its next slot as it now reads.",
}
"""The messages an action's redirect may ask a page to show (`?notice=`):
fixed texts, so nothing from the URL is shown as a message."""


def with_notice(path: str, code: str, n: int | None = None) -> str:
    """`path` with `?notice=code` (and `n`), any earlier notice dropped."""
    parsed = urlparse(path)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items() if k not in ("notice", "n")}
    query["notice"] = code
    if n is not None:
        query["n"] = str(n)
    return parsed.path + h.qs(query)


def notice(request: Request) -> str:
    """The message an action's redirect asked for (`?notice=`), if it is
    one of NOTICES: nothing from the URL is shown as a message."""
    code = request.param("notice")
    text = NOTICES.get(code)
    if text is None:
        return ""
    n = request.param("n")
    text = text.format(n=int(n) if n.isdigit() else "Some")
    return f'<p class="notice" role="status">{h.e(text)}</p>'


# -- small pieces -----------------------------------------------------------------


def badge(state: str) -> str:
    return f'<span class="badge {h.e(state)}">{h.e(state)}</span>'


def paused_badge(paused: bool) -> str:
    """A queue's or a schedule's state."""
    if paused:
        return '<span class="badge paused">Paused</span>'
    return '<span class="badge running">Running</span>'


def job_link(id: str, base: str = "/ui/jobs/") -> str:
    return f'<a class="mono" href="{base}{h.q(id)}">{h.e(id)}</a>'


def job_anchor(id: str) -> str:
    """A job's id linking to its page, in a list's id cell (which sets the font)."""
    return f'<a href="/ui/jobs/{h.q(id)}">{h.e(id)}</a>'


def queue_link(queue: str) -> str:
    return f'<a href="/ui/queues/{h.q(queue)}">{h.e(queue)}</a>'


def group(group: str | None) -> str:
    return h.e(group) if group is not None else '<span class="muted">—</span>'


GONE = '<span class="muted" title="Cancelled, pruned or never queued">not kept</span>'
"""The state shown for an id found nowhere."""


def linked(ids: list[str], states: Mapping[str, str], label: str) -> str:
    """A list of jobs, each a link to its page with its state."""
    items = "".join(
        f"<li>{job_link(i)} {badge(states[i]) if i in states else GONE}</li>" for i in ids
    )
    return f'<ul class="links" aria-label="{h.e(label)}">{items}</ul>'


def short(text: str | None, n: int = 120) -> str:
    """`text` on one line, at most `n` characters (not yet escaped)."""
    if not text:
        return ""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def origin(request: Request) -> str:
    """Where the API is, as a curl example shows it: the origin and the prefix."""
    host = request.headers.get("host", "")
    return f"{'https' if request.secure else 'http'}://{host}{request.base}"


Row = dict[str, Any]
"""A row of a listing's page (store/dashboard.py's Page)."""

JOB_ID: Column[Row] = Column("Job id", lambda r: job_anchor(r["id"]), cell_cls="mono")
"""A job list's first column: the job's id, linking to its page."""

NAME: Column[Row] = Column("Name", lambda r: h.e(r["name"]))
"""A job list's column of job names."""


def attempts(row: Row) -> str:
    """A listed job's attempts out of its allowed ones."""
    return f"{row['attempts']} / {row['max_attempts']}"


# -- forms ------------------------------------------------------------------------


def filters(action: str, label: str, fields: Iterable[str]) -> str:
    """A list's filter form (GET `action`), with a link clearing it."""
    return (
        f'<form method="get" action="{action}" class="filters" role="search" '
        f'aria-label="{label}">{"".join(fields)}<div><button type="submit">Filter</button> '
        f'<a class="button" href="{action}">Clear</a></div></form>'
    )


def search_field(name: str, label: str, value: str, placeholder: str) -> str:
    """A filter form's text field."""
    return (
        f'<div><label for="f-{name}">{label}</label>'
        f'<input type="search" id="f-{name}" name="{name}" value="{h.e(value)}" '
        f'placeholder="{h.e(placeholder)}"></div>'
    )


def select_field(name: str, label: str, choices: Iterable[tuple[str, str]], value: str) -> str:
    """A filter form's choice of (value, label) pairs."""
    return (
        f'<div><label for="f-{name}">{label}</label><select id="f-{name}" name="{name}">'
        f"{h.options(choices, value)}</select></div>"
    )


SELECT: Column[Row] = Column(
    '<input type="checkbox" id="select-all" aria-label="Select every job on this page">',
    lambda r: (
        f'<input type="checkbox" name="ids" value="{h.e(r["id"])}" id="sel-{h.e(r["id"])}" '
        f'data-select aria-label="Select job {h.e(r["id"])}">'
    ),
)
"""A job list's column of check boxes choosing the jobs a bulk action takes
(the page's script counts them, and ticks them all from the header's)."""


def bulk_actions(buttons: Iterable[tuple[str, str, str]]) -> str:
    """The buttons acting on the jobs chosen in a list (SELECT): each
    (action, label, class), sent as `action` by the form around the list."""
    sent = "".join(
        f'<button type="submit" name="action" value="{action}"{_class(cls)} '
        f"data-needs-selection>{label}</button>"
        for action, label, cls in buttons
    )
    return (
        f'<div class="actions"><span data-selected-count class="muted"></span>{sent}'
        '<span class="muted">the selected jobs (you will be asked to confirm)</span></div>'
    )


def button(label: str, *, cls: str = "", disabled: bool = False, title: str = "") -> str:
    off = " disabled" if disabled else ""
    hint = f' title="{h.e(title)}"' if title else ""
    return f'<button type="submit"{_class(cls)}{off}{hint}>{label}</button>'


def inline_form(action: str, fields: str, submit: str) -> str:
    """A one-button form posting `fields` (the CSRF field first) to `action`."""
    return f'<form method="post" action="{action}" class="inline">{fields}{submit}</form>'


def pause_form(path: str, paused: bool, csrf: str, back: str, what: str = "") -> str:
    """The button pausing (or, paused, resuming) the queue or schedule at
    `path`; `what` names it in the button's title."""
    action = "resume" if paused else "pause"
    title = f"{action.title()} {what}" if what else ""
    return inline_form(
        f"{path}/{action}", csrf + h.hidden("back", back), button(action.title(), title=title)
    )


def confirm_form(
    request: Request, action: str, fields: str, back: str, submit: str, cls: str
) -> str:
    """A confirmation's form: `fields` sent again with `confirm=yes` by
    `submit` (its label), or back to `back`."""
    return (
        f'<form method="post" action="{action}">{csrf_field(request)}{fields}'
        f"{h.hidden('back', back)}{h.hidden('confirm', 'yes')}"
        f'<div class="actions"><button type="submit" class="{cls}" autofocus>{submit}</button>'
        f'<a class="button" href="{h.e(back)}">Go back</a></div></form>'
    )
