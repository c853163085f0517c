"""What the failed-jobs pages show: the list, filtered by queue, job name,
error text and age, with the jobs chosen for a bulk retry or delete; and
the confirmation a bulk action asks for. The list is the tuple of its
sections (FAILED) over what Pages reads for it (FailedShown)."""

from __future__ import annotations

from dataclasses import dataclass

from ...store.bulk import new_run_id
from ...store.dashboard import Page
from . import html as h
from .mask import scrub
from .parts import (
    JOB_ID,
    NAME,
    SELECT,
    Column,
    Row,
    attempts,
    bulk_actions,
    confirm_form,
    empty,
    filters,
    notice,
    pager,
    queue_link,
    search_field,
    select_field,
    short,
    table,
)
from .request import Request, csrf_field

AGES: dict[str, tuple[str, int | None, int | None]] = {
    "": ("Any age", None, None),
    "1h": ("Failed in the last hour", 3600, None),
    "1d": ("Failed in the last day", 86400, None),
    "7d": ("Failed in the last 7 days", 7 * 86400, None),
    "gt1d": ("Failed more than a day ago", None, 86400),
    "gt7d": ("Failed more than 7 days ago", None, 7 * 86400),
}
"""The failed list's age filter: (label, newer than s, older than s)."""

ACTIONS = (("retry", "Retry", ""), ("delete", "Delete", "danger"))
"""The bulk actions on failed jobs: (action, label, the button's class)."""


def age_range(age: str, now: int) -> tuple[int, int]:
    """The failure times (epoch ms, from inclusive, to exclusive) filter
    `age` (a key of AGES) keeps."""
    _, newer, older = AGES[age]
    since = now - newer * 1000 if newer else 0
    before = now - older * 1000 if older else now + 1
    return since, before


@dataclass
class FailedShown:
    """What the failed jobs' page shows (Pages.failed_page reads it)."""

    request: Request
    queue: str
    name: str
    error: str
    age: str
    cursor: str
    jobs: Page

    @property
    def filters(self) -> dict[str, str]:
        return {"queue": self.queue, "name": self.name, "error": self.error, "age": self.age}


def failed_heading(shown: FailedShown) -> str:
    return f"<h1>Failed jobs</h1>{notice(shown.request)}"


def failed_filters(shown: FailedShown) -> str:
    fields = [
        search_field("queue", "Queue", shown.queue, "any queue"),
        search_field("name", "Job name", shown.name, "any name"),
        search_field("error", "Error contains", shown.error, "e.g. timed out"),
        select_field("age", "Age", ((k, v[0]) for k, v in AGES.items()), shown.age),
    ]
    return filters("/ui/failed", "Filter failed jobs", fields)


def failed_columns(now: int, readonly: bool = False) -> list[Column[Row]]:
    """The failed list's columns: a check box each (none when read-only)."""
    return [
        *(() if readonly else (SELECT,)),
        JOB_ID,
        Column("Queue", lambda r: queue_link(r["queue"])),
        NAME,
        Column("Error", lambda r: h.e(short(scrub(r["error"], r["payload"])))),
        Column("Attempts", attempts, "num hide-narrow"),
        Column("Failed", lambda r: h.when(r["failed_at"], now)),
    ]


def _listing(shown: FailedShown) -> str:
    if shown.jobs.rows:
        readonly = shown.request.readonly
        return ("" if readonly else bulk_actions(ACTIONS)) + table(
            "Failed jobs", failed_columns(shown.request.now_ms, readonly), shown.jobs.rows
        )
    if any(shown.filters.values()) or shown.cursor:
        return empty(
            "<strong>No failed jobs match this filter.</strong> "
            '<a href="/ui/failed">Clear the filter</a> to see them all.'
        )
    return empty(
        "<strong>No failed jobs.</strong> A job lands here when its handler fails it or its "
        "attempts run out; nothing to do for now."
    )


def failed_list(shown: FailedShown) -> str:
    """The failed jobs, newest first, a page at a time, in the form that
    sends those chosen to a bulk action."""
    here = "/ui/failed" + h.qs({**shown.filters, "cursor": shown.cursor})
    more = pager("/ui/failed", shown.filters, shown.cursor, shown.jobs.next_cursor)
    listed = f'<section id="failed" data-live aria-label="Failed jobs list">{_listing(shown)}'
    if shown.request.readonly:
        return f"{listed}{more}</section>"
    return (
        '<form method="post" action="/ui/failed/bulk" aria-label="Act on selected jobs">'
        f"{csrf_field(shown.request)}{h.hidden('back', here)}"
        f'<section id="failed" data-live aria-label="Failed jobs list">{_listing(shown)}'
        f"{more}</section></form>"
    )


FAILED = (failed_heading, failed_filters, failed_list)


def confirm_bulk(request: Request, action: str, ids: list[str], back: str) -> str:
    """The page asking to confirm retrying or deleting the failed jobs
    `ids`, listing the first ten."""
    n = len(ids)
    jobs = f"{n} failed job{'s' if n != 1 else ''}"
    question = (
        f"Put {jobs} back on {'their queues' if n != 1 else 'its queue'}, "
        "each with its registered attempts afresh?"
        if action == "retry"
        else f"Remove {jobs} for good? This cannot be undone."
    )
    listing = "".join(f'<li class="mono">{h.e(i)}</li>' for i in ids[:10])
    more = f"<li>and {n - 10} more</li>" if n > 10 else ""
    verb = "Retry" if action == "retry" else "Delete"
    fields = (
        "".join(h.hidden("ids", i) for i in ids)
        + h.hidden("action", action)
        + h.hidden("run", new_run_id())
    )
    submit = f"{verb} {n} job{'s' if n != 1 else ''}"
    cls = "primary" if action == "retry" else "danger"
    return f"<h1>Confirm</h1><p>{h.e(question)}</p><ul>{listing}{more}</ul>" + confirm_form(
        request, "/ui/failed/bulk", fields, back, submit, cls
    )
