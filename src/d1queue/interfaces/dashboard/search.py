"""The search box every signed-in page carries (html.search_form), and what
a search answers (/ui/search?q=...&cursor=...):

- one word of an id's shape: the job with that id (its page), else the
  batch (its page): a point read each, in that order; found neither, the
  search goes on as text;
- `batch:<id>` alone: the batch's page;
- else a page of matching jobs, newest first, 50 a page with the filter
  and the cursor in the URL, so it can be shared. Qualifiers: `queue:`,
  `name:`, `state:`, `group:`, `batch:`; other words (and `error:`) are
  text looked for in the payload or the error. `state:completed` reads the
  completed jobs kept, `state:failed` the failed jobs, any other state (or
  none) the queued ones.

Above the results, the bulk actions (bulk.py): on the jobs ticked, or on
every job the search matches, after a confirmation stating the count.

A page reads at most bounds.SEARCH_ROWS rows a shard (store/sql.py
SEARCH_LIVE), whatever the number of jobs, and says so when it stopped
before the end: the next page reads on from there."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.bounds import SEARCH_ROWS, STORED_ID_PATTERN, is_stored_name
from ...store.dashboard import STATES, SearchFilters, SearchPage
from . import html as h
from .html import search_form
from .parts import Column, badge, crumbs, empty, group, job_anchor, job_link, nav, queue_link, table
from .request import Request

QUALIFIERS = ("queue", "name", "state", "group", "batch", "error")
"""The `key:value` words a search understands."""

SEARCH_STATES = (*STATES, "completed", "failed")

MAX_QUERY = 300
"""Characters of a search, at most."""


@dataclass
class Query:
    """A search's words: its qualifiers, and the rest as text."""

    fields: dict[str, str]
    text: str
    problem: str = ""
    """Why the query cannot be answered as written (shown, escaped)."""

    @property
    def source(self) -> str:
        """Which jobs it reads (store/dashboard.py SEARCH_SOURCES)."""
        state = self.fields.get("state", "")
        return state if state in ("completed", "failed") else "live"

    def filters(self) -> SearchFilters:
        f = self.fields
        state = f.get("state", "")
        return SearchFilters(
            queue=f.get("queue", ""),
            name=f.get("name", ""),
            state="" if state in ("completed", "failed") else state,
            group=f.get("group", ""),
            batch=f.get("batch", ""),
            text=self.text,
        )


def parse(q: str) -> Query:
    fields: dict[str, str] = {}
    rest: list[str] = []
    for word in q.split():
        key, sep, value = word.partition(":")
        if sep and key.lower() in QUALIFIERS and value:
            fields[key.lower()] = value
        else:
            rest.append(word)
    if "error" in fields:
        rest.append(fields.pop("error"))
    problem = ""
    for key in ("queue", "name", "batch"):
        held = fields.get(key, "")
        if held and not (is_stored_name(held) or STORED_ID_PATTERN.fullmatch(held)):
            problem = f"{key}:{held} is not a {key} this deployment could hold."
    if len(fields.get("group", "")) > 128:
        problem = "A group is at most 128 characters."
    if "state" in fields and fields["state"] not in SEARCH_STATES:
        problem = f"state is one of {', '.join(SEARCH_STATES)}."
    return Query(fields, " ".join(rest), problem)


HELP = (
    "<p class=\"muted\">A job's or batch's id jumps to its page. Words are looked for in "
    "payloads and errors; qualifiers narrow: <code>queue:mail</code>, "
    "<code>name:mail.send</code>, <code>state:delayed</code>, <code>group:acct-7</code>, "
    "<code>batch:&lt;id&gt;</code>. <code>state:completed</code> searches the completed jobs "
    "kept, <code>state:failed</code> the failed jobs, any other the queued ones (but those a "
    "worker holds now or that wait out a retry: Running now lists the held ones, their "
    "queue's page all of them). Each page "
    f"reads at most {SEARCH_ROWS:,} jobs a database and says when it stopped early.</p>"
)


@dataclass
class SearchShown:
    request: Request
    q: str
    query: Query
    cursor: str
    found: SearchPage | None

    def link(self, cursor: str = "", q: str | None = None) -> str:
        return h.e("/ui/search" + h.qs({"q": self.q if q is None else q, "cursor": cursor}))


def search_heading(shown: SearchShown) -> str:
    return (
        crumbs([("/ui", "Overview")], "Search") + "<h1>Search</h1>" + search_form(shown.q, "page")
    )


def _other_sources(shown: SearchShown) -> str:
    """Links to the same search in the other kinds of jobs."""
    words = [w for w in shown.q.split() if not w.lower().startswith("state:")]
    out = []
    for source, label in (("live", "queued"), ("completed", "completed"), ("failed", "failed")):
        if source != shown.query.source:
            q = " ".join(words if source == "live" else [*words, f"state:{source}"])
            out.append(f'<a href="{shown.link(q=q)}">Search the {label} jobs</a>')
    return nav(out)


BULK_FORM = "bulk-form"
"""The id of the form the bulk actions send (bulk.py search_bulk): the
results' check boxes belong to it wherever it is on the page."""

SELECT_FOUND: Column[dict[str, object]] = Column(
    '<input type="checkbox" id="select-all" aria-label="Select every job on this page">',
    lambda r: (
        f'<input type="checkbox" name="ids" value="{h.e(r["id"])}" form="{BULK_FORM}" '
        f'data-select aria-label="Select job {h.e(r["id"])}">'
    ),
)


def search_columns(now: int, selectable: bool = False) -> list[Column[dict[str, object]]]:
    """The results' columns: a check box each first when they can be acted on."""
    columns: list[Column[dict[str, object]]] = [
        Column("Job id", lambda r: job_anchor(str(r["id"])), cell_cls="mono"),
        Column("Queue", lambda r: queue_link(str(r["queue"]))),
        Column("Name", lambda r: h.e(r["name"])),
        Column("Group", lambda r: group(r["grp"]), "hide-narrow"),  # type: ignore[arg-type]
        Column(
            "Batch",
            lambda r: job_link(str(r["batch"]), "/ui/batches/") if r["batch"] else "",
            "hide-narrow",
        ),
        Column("State", lambda r: badge(str(r["state"]))),
        Column("Attempts", lambda r: f"{r['attempts']} / {r['max_attempts']}", "num hide-narrow"),
        Column("At", lambda r: h.when(int(r["at"]), now)),  # type: ignore[call-overload]
    ]
    return [SELECT_FOUND, *columns] if selectable else columns


def search_results(shown: SearchShown) -> str:
    if not shown.q:
        return HELP
    if shown.query.problem:
        return f'<p class="error-box" role="alert">{h.e(shown.query.problem)}</p>{HELP}'
    found = shown.found
    assert found is not None
    held = (
        '<p class="notice" role="status">Jobs a worker holds now are not searched: '
        '<a href="/ui/running">Running now</a> lists them.</p>'
        if shown.query.fields.get("state") == "reserved"
        else ""
    )
    said = held + (
        f'<p class="notice" role="status">Stopped early: this page read {found.scanned:,} '
        f"jobs (at most {SEARCH_ROWS:,} a database a page) and more are left to read; "
        "more may match further on.</p>"
        if found.stopped_early and found.next_cursor
        else ""
    )
    if found.rows:
        selectable = not shown.request.readonly
        listing = table("Jobs found", search_columns(shown.request.now_ms, selectable), found.rows)
    else:
        listing = empty(
            f"<strong>No job matches “{h.e(shown.q)}” in the {found.scanned:,} read"
            f"{' on this page' if shown.cursor else ''}.</strong>"
        )
    links = []
    if shown.cursor:
        links.append(f'<a href="{shown.link()}">« First page</a>')
    if found.next_cursor:
        links.append(f'<a href="{shown.link(found.next_cursor)}">Next page »</a>')
    return (
        f'<section id="results" aria-label="Jobs found">{said}{listing}{nav(links)}'
        f"{_other_sources(shown)}{HELP}</section>"
    )


SEARCH = (search_heading, search_results)
