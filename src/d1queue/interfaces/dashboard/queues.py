"""What the queue pages show: the overview (every queue, the last hour's
chart), a queue (its counts, flow limits and jobs) and its completed jobs.
Each page is the tuple of its sections (OVERVIEW, QUEUE, COMPLETED) over
what Pages reads for it (OverviewShown, QueueShown, CompletedShown)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...store import stats as counters
from ...store.admin import QueueStats
from ...store.dashboard import STATES, Page
from . import html as h
from .chart import chart
from .limits import limits_brief, limits_form, limits_usage
from .mask import mask, scrub
from .parts import (
    JOB_ID,
    NAME,
    Column,
    Row,
    attempts,
    badge,
    crumbs,
    curl,
    empty,
    filters,
    group,
    job_link,
    notice,
    pager,
    pause_form,
    paused_badge,
    queue_link,
    search_field,
    select_field,
    short,
    stats,
    table,
    titled,
)
from .request import Request, csrf_field

# -- the overview -----------------------------------------------------------------


@dataclass
class QueueRow:
    """A queue on the overview: its stats (zeros for a queue known only from
    its counters) and its jobs done in the last hour and day."""

    name: str
    stats: QueueStats
    done: counters.Done


@dataclass
class OverviewShown:
    """What the overview shows (Pages.overview reads it)."""

    request: Request
    stats: list[QueueStats]
    chart: list[counters.Minute]
    done: dict[str, counters.Done]

    def rows(self) -> list[QueueRow]:
        """Every queue with stats or counters, by name."""
        by_name = {s.queue: s for s in self.stats}
        return [
            QueueRow(n, by_name.get(n) or QueueStats(n), self.done.get(n, counters.Done()))
            for n in sorted(set(by_name) | set(self.done))
        ]


def _failed_link(r: QueueRow) -> str:
    failed = r.stats.failed
    return f'<a href="/ui/failed{h.qs({"queue": r.name})}">{failed}</a>' if failed else "0"


def queue_columns(csrf: str | None) -> list[Column[QueueRow]]:
    """The overview's columns (`csrf`: the field its buttons send; None:
    read-only, no buttons)."""
    columns = [
        Column("Queue", lambda r: queue_link(r.name), row_header=True),
        Column("Ready", lambda r: r.stats.ready, "num"),
        Column("Delayed", lambda r: r.stats.delayed, "num hide-narrow"),
        Column("Reserved", lambda r: r.stats.reserved, "num hide-narrow"),
        Column("Failed", _failed_link, "num"),
        Column("Oldest ready", lambda r: h.age(r.stats.oldest_ready_age_s), "hide-narrow"),
        Column("State", lambda r: paused_badge(r.stats.paused)),
        Column("Done 1 h", lambda r: r.done.hour, "num"),
        Column("Done 24 h", lambda r: r.done.day, "num hide-narrow"),
        Column("Limits", lambda r: limits_brief(r.stats.limits, r.stats.reserved), "hide-narrow"),
    ]
    if csrf is None:
        return columns
    return [
        *columns,
        Column(
            "Action",
            lambda r: pause_form(
                f"/ui/queues/{h.q(r.name)}", r.stats.paused, csrf, "/ui", f"queue {r.name}"
            ),
        ),
    ]


def overview_heading(shown: OverviewShown) -> str:
    return f"<h1>Overview</h1>{notice(shown.request)}"


def queues(shown: OverviewShown) -> str:
    """Every queue, with its counts and a button pausing or resuming it."""
    rows = shown.rows()
    if rows:
        csrf = None if shown.request.readonly else csrf_field(shown.request)
        listing = table("Queues", queue_columns(csrf), rows)
    else:
        listing = empty(
            "<strong>No queues yet.</strong> A queue appears here when a job is pushed to "
            "it. Push one with the API, for example:",
            curl(
                shown.request,
                "/v1/queues/default/jobs",
                '{"name": "example.echo", "payload": {"hello": "world"}}',
            ),
        )
    return titled("queues", "Queues", listing)


def activity(shown: OverviewShown) -> str:
    return titled("activity", "Last hour", chart(shown.chart, shown.request.now_ms))


OVERVIEW = (overview_heading, queues, activity)


# -- a queue ----------------------------------------------------------------------


@dataclass
class QueueShown:
    """What a queue's page shows (Pages.queue_page reads it)."""

    request: Request
    queue: str
    state: str
    name: str
    cursor: str
    stats: QueueStats
    jobs: Page
    flow: dict[str, Any]
    """Service.limits: the limits in force, their source and use now."""

    @property
    def home(self) -> str:
        return f"/ui/queues/{h.q(self.queue)}"

    @property
    def here(self) -> str:
        """This page with its filters and cursor, where its forms return."""
        return self.home + h.qs({"state": self.state, "name": self.name, "cursor": self.cursor})


def queue_heading(shown: QueueShown) -> str:
    return (
        crumbs([("/ui", "Overview")], f"Queue {shown.queue}")
        + f"<h1>Queue {h.e(shown.queue)}</h1>{notice(shown.request)}"
    )


def queue_summary(shown: QueueShown) -> str:
    """The queue's counts, and its buttons."""
    s = shown.stats
    counts = stats(
        [
            (s.ready, "ready"),
            (s.delayed, "delayed"),
            (s.reserved, "reserved"),
            (f'<a href="/ui/failed{h.qs({"queue": shown.queue})}">{s.failed}</a>', "failed"),
            (h.age(s.oldest_ready_age_s), "oldest ready"),
            ("Paused" if s.paused else "Running", "state"),
        ]
    )
    control = (
        ""
        if shown.request.readonly
        else pause_form(shown.home, s.paused, csrf_field(shown.request), shown.here)
    )
    return (
        f'<div id="queue-summary" data-live>{counts}<div class="actions">{control}'
        f'<a class="button" href="{shown.home}/completed">Completed jobs</a>'
        f'<a class="button" href="{h.e("/ui/metrics" + h.qs({"queue": shown.queue}))}">'
        "Metrics</a></div></div>"
    )


def queue_limits(shown: QueueShown) -> str:
    """The queue's flow limits, their use now, and the form changing them."""
    form = (
        ""
        if shown.request.readonly
        else limits_form(shown.request, shown.queue, shown.flow["limits"], shown.here)
    )
    return (
        '<h2 id="limits-h">Flow limits</h2>'
        f'<div id="queue-limits" data-live>{limits_usage(shown.flow)}</div>{form}'
    )


def jobs_filters(shown: QueueShown) -> str:
    fields = [
        select_field(
            "state", "State", [("", "All states"), *((s, s.title()) for s in STATES)], shown.state
        ),
        search_field("name", "Job name", shown.name, "e.g. mail.send"),
    ]
    return '<h2 id="jobs-h">Jobs</h2>' + filters(shown.home, "Filter jobs", fields)


def job_columns(now: int) -> list[Column[Row]]:
    """The queue's jobs' columns (`now`: the time they are shown from)."""
    return [
        JOB_ID,
        NAME,
        Column("Group", lambda r: group(r["grp"]), "hide-narrow"),
        Column("State", lambda r: badge(r["state"])),
        Column("Attempts", attempts, "num"),
        Column("Priority", lambda r: r["priority"], "num hide-narrow"),
        Column("Available at", lambda r: h.when(r["available_at"], now)),
        Column(
            "Last error",
            lambda r: h.e(short(scrub(r["last_error"], r["payload"]))),
            "hide-narrow",
        ),
    ]


def jobs(shown: QueueShown) -> str:
    """The queue's jobs in claim order, a page at a time."""
    queue, home = shown.queue, shown.home
    if shown.jobs.rows:
        listing = table("Jobs", job_columns(shown.request.now_ms), shown.jobs.rows)
    elif shown.state or shown.name or shown.cursor:
        listing = empty(
            f'<strong>No jobs match this filter.</strong> <a href="{home}">Clear the filter</a> '
            "to see every job on the queue."
        )
    else:
        listing = empty(
            "<strong>This queue holds no jobs.</strong> Those that completed are under "
            f'<a href="{home}/completed">Completed jobs</a> (while they are kept); failed '
            f'ones are under <a href="/ui/failed{h.qs({"queue": queue})}">Failed jobs</a>. '
            f"Push one with <code>POST {h.e(shown.request.base)}/v1/queues/{h.e(queue)}/jobs"
            "</code>."
        )
    more = pager(
        home, {"state": shown.state, "name": shown.name}, shown.cursor, shown.jobs.next_cursor
    )
    return f'<section id="jobs" data-live aria-labelledby="jobs-h">{listing}{more}</section>'


QUEUE = (queue_heading, queue_summary, queue_limits, jobs_filters, jobs)


# -- its completed jobs -----------------------------------------------------------

RESULT_BRIEF = 120
"""Characters of a result a list shows."""


def brief(value: Any) -> str:
    """A result in a list: compact JSON, masked, cut short (not yet escaped)."""
    if value is None:
        return ""
    return short(json.dumps(mask(value), ensure_ascii=False, sort_keys=True), RESULT_BRIEF)


@dataclass
class CompletedShown:
    """What a queue's completed jobs' page shows (Pages.completed_page)."""

    request: Request
    queue: str
    cursor: str
    jobs: Page
    keeps: bool
    """The queue keeps completed jobs as history."""


def _result(r: Row) -> str:
    result = brief(r["result"])
    return f"<code>{h.e(result)}</code>" if result else '<span class="muted">—</span>'


def completed_columns(now: int) -> list[Column[Row]]:
    return [
        JOB_ID,
        NAME,
        Column("Completed", lambda r: h.when(r["completed_at"], now)),
        Column("Attempts", attempts, "num hide-narrow"),
        Column(
            "Batch",
            lambda r: job_link(r["batch"], "/ui/batches/") if r["batch"] else "",
            "hide-narrow",
        ),
        Column("Result", _result, cell_cls="result"),
    ]


def completed_heading(shown: CompletedShown) -> str:
    queue = shown.queue
    return (
        crumbs([("/ui", "Overview"), (f"/ui/queues/{h.q(queue)}", f"Queue {queue}")], "Completed")
        + f"<h1>Completed jobs of {h.e(queue)}</h1>"
        '<p class="muted">Newest first. Results are shown with their secrets masked; '
        "a job's page shows its whole result.</p>"
    )


def completed(shown: CompletedShown) -> str:
    """The queue's completed jobs kept, newest first, a page at a time."""
    base = f"/ui/queues/{h.q(shown.queue)}/completed"
    if shown.jobs.rows:
        listing = table("Completed jobs", completed_columns(shown.request.now_ms), shown.jobs.rows)
    elif shown.cursor:
        listing = empty(
            f'<strong>No more completed jobs.</strong> <a href="{base}">Back to the newest</a>.'
        )
    elif not shown.keeps:
        listing = empty(
            "<strong>This queue keeps no history:</strong> a job is deleted as it completes "
            "(D1QUEUE_KEEP_COMPLETED_S is 0, or the Worker's registry opts the queue out with "
            "<code>registry.history(queue, keep=False)</code>)."
        )
    else:
        listing = empty(
            "<strong>No completed jobs kept.</strong> A job appears here when it completes, "
            "with its result, and stays for D1QUEUE_KEEP_COMPLETED_S."
        )
    more = pager(base, {}, shown.cursor, shown.jobs.next_cursor)
    return (
        f'<section id="completed" data-live aria-label="Completed jobs">{listing}{more}</section>'
    )


COMPLETED = (completed_heading, completed)
