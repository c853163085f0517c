"""What the schedules page shows: every schedule by id, a page at a time,
with its next and last run and a button pausing or resuming it. The page
is the tuple of its sections (SCHEDULES) over what Pages reads for it
(SchedulesShown)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import html as h
from .parts import Column, curl, empty, notice, pager, pause_form, paused_badge, queue_link, table
from .request import Request, csrf_field

SCHEDULES_PAGE = 50
"""Schedules listed a page."""

Schedule = dict[str, Any]
"""A schedule as the API answers it (Service.schedules)."""


@dataclass
class SchedulesShown:
    """What the schedules' page shows (Pages.schedules_page reads it)."""

    request: Request
    cursor: str | None
    page: dict[str, Any]
    """Service.schedules: `schedules` and `next_cursor`."""


def schedule_columns(now: int, csrf: str | None, back: str) -> list[Column[Schedule]]:
    """The list's columns (`back`: where its buttons return; `csrf` None:
    read-only, no buttons)."""

    def toggle(s: Schedule) -> str:
        assert csrf is not None
        path = f"/ui/schedules/{h.q(s['id'])}"
        return pause_form(path, bool(s["paused"]), csrf, back, f"schedule {s['id']}")

    columns: list[Column[Schedule]] = [
        Column("Schedule", lambda s: h.e(s["id"]), row_header=True),
        Column(
            "Cron",
            lambda s: f'<code>{h.e(s["cron"])}</code> <span class="muted">{h.e(s["tz"])}</span>',
        ),
        Column("Job", lambda s: h.e(s["name"])),
        Column("Queue", lambda s: queue_link(s.get("queue") or ""), "hide-narrow"),
        Column("Next run", lambda s: h.when(s.get("next_run_at"), now)),
        Column("Last run", lambda s: h.when(s.get("last_run_at"), now), "hide-narrow"),
        Column("State", lambda s: paused_badge(bool(s["paused"]))),
        Column("Declared in", lambda s: h.e(s.get("source", "")), "hide-narrow"),
    ]
    return columns if csrf is None else [*columns, Column("Action", toggle)]


def schedules_heading(shown: SchedulesShown) -> str:
    return f"<h1>Schedules</h1>{notice(shown.request)}"


def schedules(shown: SchedulesShown) -> str:
    request, cursor = shown.request, shown.cursor
    rows = shown.page["schedules"]
    if rows:
        back = "/ui/schedules" + h.qs({"cursor": cursor})
        csrf = None if request.readonly else csrf_field(request)
        columns = schedule_columns(request.now_ms, csrf, back)
        listing = table("Schedules", columns, rows) + pager(
            "/ui/schedules", {}, cursor or "", shown.page.get("next_cursor")
        )
    else:
        listing = empty(
            "<strong>No schedules yet.</strong> Declare one beside its handler "
            '(<code>@registry.job("report.daily", schedule="0 6 * * *", '
            'tz="Europe/Berlin")</code>) or create one with the API:',
            curl(request, "/v1/schedules", '{"cron": "*/5 * * * *", "name": "example.echo"}'),
        )
    return f'<section id="schedules" data-live aria-label="Schedule list">{listing}</section>'


SCHEDULES = (schedules_heading, schedules)
