"""The "Running now" page (/ui/running): every job a worker holds now, or
marked cancelling while held, across queues and shards, 50 a page in
(queue, lease end, id) order, each with its name, queue, group, attempt,
how long it has run (since its claim), its latest progress report and a
button cancelling it (the job page's own action: a held job is marked and
its drain ends it cancelled).

A page reads at most bounds.RUNNING_ROWS rows of the locked band a shard
(store/sql.py RUNNING_NOW and RUNNING_SPAN): jobs waiting out a retry share the band and are
read and passed over, so with many of them a page may stop before it is
full, and says so; the next page reads on from there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.bounds import RUNNING_ROWS
from ...store.dashboard import RunningPage
from . import html as h
from .parts import (
    Column,
    badge,
    button,
    crumbs,
    empty,
    group,
    inline_form,
    job_anchor,
    nav,
    notice,
    queue_link,
    short,
    table,
    titled,
)
from .request import Request, csrf_field

HERE = "/ui/running"


@dataclass
class RunningShown:
    """What the page shows (Pages.running_page reads it)."""

    request: Request
    cursor: str
    found: RunningPage

    def link(self, cursor: str = "") -> str:
        return h.e(HERE + h.qs({"cursor": cursor}))


def running_heading(shown: RunningShown) -> str:
    return (
        crumbs([("/ui", "Overview")], "Running now")
        + "<h1>Running now</h1>"
        + notice(shown.request)
        + '<p class="muted">Jobs a worker holds now, across every queue, in order of '
        "queue and then of when their lease ends.</p>"
    )


def _state(row: dict[str, Any]) -> str:
    return "cancelling" if row.get("cancel_at") is not None else "reserved"


def _progress(row: dict[str, Any], now: int) -> str:
    """The job's latest progress report, if its running attempt made one
    (a report kept from an earlier attempt is not this one's)."""
    value = row.get("progress_value")
    if value is None or row.get("progress_attempt") != row.get("attempts"):
        return '<span class="muted">—</span>'
    note = row.get("progress_note")
    said = h.e(short(str(value), 40)) + (f" — {h.e(short(str(note), 80))}" if note else "")
    at = row.get("progress_at")
    when = f' <span class="muted">({h.when(int(at), now)})</span>' if at else ""
    return said + when


def _for(row: dict[str, Any], now: int) -> str:
    """How long its attempt has run: since its claim (reserved_at)."""
    started = row.get("reserved_at")
    if started is None:
        return '<span class="muted">—</span>'
    seconds = max(0, now - int(started)) / 1000
    return f'<span title="{h.e(h.absolute(int(started)))}">{h.age(seconds)}</span>'


def _claim(row: dict[str, Any]) -> str:
    """Which drain holds it: the first characters of its claim's token,
    which the jobs one drain claimed in one round share (a drain runs in
    one invocation: a cron run, a push's short drain or a consumer)."""
    claim = row.get("claim")
    if not claim:
        return '<span class="muted">—</span>'
    return (
        f'<span title="the claim it was taken by: jobs claimed together by one drain '
        f'share it">{h.e(claim)}</span>'
    )


def _cancel(shown: RunningShown, row: dict[str, Any]) -> str:
    if _state(row) == "cancelling":
        return '<span class="muted">Cancel asked: its drain ends it.</span>'
    id = str(row["id"])
    back = HERE + h.qs({"cursor": shown.cursor})
    fields = csrf_field(shown.request) + h.hidden("back", back)
    return inline_form(
        f"/ui/jobs/{h.q(id)}/cancel",
        fields,
        button("Cancel", cls="danger", title=f"Cancel job {id}"),
    )


def running_columns(shown: RunningShown) -> list[Column[dict[str, Any]]]:
    now = shown.request.now_ms
    columns: list[Column[dict[str, Any]]] = [
        Column("Job id", lambda r: job_anchor(str(r["id"])), cell_cls="mono"),
        Column("Name", lambda r: h.e(r["name"])),
        Column("Queue", lambda r: queue_link(str(r["queue"]))),
        Column("Group", lambda r: group(r.get("grp")), "hide-narrow"),
        Column("State", lambda r: badge(_state(r))),
        Column("Attempt", lambda r: f"{h.e(r['attempts'])} of {h.e(r['max_attempts'])}", "num"),
        Column("Running for", lambda r: _for(r, now), "num"),
        Column("Claim", _claim, "hide-narrow", cell_cls="mono"),
        Column("Progress", lambda r: _progress(r, now)),
    ]
    if not shown.request.readonly:
        columns.append(Column("Action", lambda r: _cancel(shown, r)))
    return columns


def running_list(shown: RunningShown) -> str:
    found = shown.found
    said = (
        f'<p class="notice" role="status">Stopped early: this page read {found.scanned:,} '
        f"jobs held or waiting out a retry (at most {RUNNING_ROWS:,} a database a page); "
        "the next page reads on.</p>"
        if found.stopped_early and found.next_cursor
        else ""
    )
    if found.rows:
        listing = table("Jobs running now", running_columns(shown), found.rows)
    else:
        listing = empty(
            "<strong>No job is running now"
            f"{' after the last page' if shown.cursor else ''}.</strong> A job shows here "
            "from its claim by a drain until it is settled."
        )
    links = []
    if shown.cursor:
        links.append(f'<a href="{shown.link()}">« First page</a>')
    if found.next_cursor:
        links.append(f'<a href="{shown.link(found.next_cursor)}">Next page »</a>')
    return titled("running", "Jobs", said + listing + nav(links))


RUNNING = (running_heading, running_list)
