"""What the schedules pages show: every schedule by id, a page at a time,
with its next run and its last (the job it pushed), and a schedule's own
page: its definition, its last runs (the time and job of each, newest
first), "Run now", pause or resume, and, for a schedule made over the API,
the form editing its cron, time zone and payload. Each page is the tuple of
its sections (SCHEDULES, SCHEDULE) over what Pages reads for it
(SchedulesShown, ScheduleShown).

"Run now" carries a job id the page made (`run`): the server pushes the
schedule's job under it, so a click sent twice (a double click, a re-send
after a lost reply) pushes one job. A read-only session sees no form, and
the server refuses their POSTs (auth.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...core.job import new_id
from . import html as h
from .mask import mask
from .parts import (
    Column,
    button,
    crumbs,
    curl,
    empty,
    inline_form,
    job_link,
    notice,
    pager,
    pause_form,
    paused_badge,
    props,
    queue_link,
    table,
)
from .request import Request, csrf_field

SCHEDULES_PAGE = 50
"""Schedules listed a page."""

Schedule = dict[str, Any]
"""A schedule as the API answers it (Service.schedules)."""

Run = list[Any]
"""A schedule's run as kept (Service.schedule_runs): [time, job id] or
[time, job id, "now"] (pushed by "Run now")."""


@dataclass
class SchedulesShown:
    """What the schedules' page shows (Pages.schedules_page reads it)."""

    request: Request
    cursor: str | None
    page: dict[str, Any]
    """Service.schedules: `schedules` and `next_cursor`."""
    runs: dict[str, list[Run]] = field(default_factory=dict)
    """The last runs of the page's schedules, by id."""


def schedule_link(id: str) -> str:
    return f'<a href="/ui/schedules/{h.q(id)}">{h.e(id)}</a>'


def run_now_form(id: str, csrf: str, back: str) -> str:
    """The "Run now" button: posts a job id made for this page (new_id), so
    the same click sent again pushes nothing more."""
    fields = csrf + h.hidden("run", new_id()) + h.hidden("back", back)
    return inline_form(
        f"/ui/schedules/{h.q(id)}/run", fields, button("Run now", title=f"Run {id} now")
    )


def last_run(runs: list[Run], now: int) -> str:
    """A schedule's newest run: when, and the job it pushed."""
    if not runs:
        return '<span class="muted">not yet</span>'
    at, job = runs[0][0], str(runs[0][1])
    return f"{h.when(at, now)} {job_link(job)}"


def schedule_columns(
    now: int, csrf: str | None, back: str, runs: dict[str, list[Run]]
) -> list[Column[Schedule]]:
    """The list's columns (`back`: where its buttons return; `csrf` None:
    read-only, no buttons)."""

    def actions(s: Schedule) -> str:
        assert csrf is not None
        path = f"/ui/schedules/{h.q(s['id'])}"
        return run_now_form(s["id"], csrf, back) + pause_form(
            path, bool(s["paused"]), csrf, back, f"schedule {s['id']}"
        )

    columns: list[Column[Schedule]] = [
        Column("Schedule", lambda s: schedule_link(s["id"]), row_header=True),
        Column(
            "Cron",
            lambda s: f'<code>{h.e(s["cron"])}</code> <span class="muted">{h.e(s["tz"])}</span>',
        ),
        Column("Job", lambda s: h.e(s["name"])),
        Column("Queue", lambda s: queue_link(s.get("queue") or ""), "hide-narrow"),
        Column("Next run", lambda s: h.when(s.get("next_run_at"), now)),
        Column("Last run", lambda s: last_run(runs.get(s["id"], []), now), "hide-narrow"),
        Column("State", lambda s: paused_badge(bool(s["paused"]))),
        Column("Declared in", lambda s: h.e(s.get("source", "")), "hide-narrow"),
    ]
    return columns if csrf is None else [*columns, Column("Actions", actions)]


def schedules_heading(shown: SchedulesShown) -> str:
    return f"<h1>Schedules</h1>{notice(shown.request)}"


def schedules(shown: SchedulesShown) -> str:
    request, cursor = shown.request, shown.cursor
    rows = shown.page["schedules"]
    if rows:
        back = "/ui/schedules" + h.qs({"cursor": cursor})
        csrf = None if request.readonly else csrf_field(request)
        columns = schedule_columns(request.now_ms, csrf, back, shown.runs)
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


# -- a schedule -------------------------------------------------------------------


@dataclass
class ScheduleShown:
    """What a schedule's page shows (Pages.schedule_page reads it)."""

    request: Request
    schedule: Schedule
    """Service.schedule: as the API answers it."""
    runs: list[Run]


def editable_payload(payload: Any) -> str:
    """The payload as the edit form's text: its JSON, unless masking would
    change it (it holds secrets, which a page never shows): then empty,
    and an empty field keeps the payload as it is."""
    if mask(payload) != payload:
        return ""
    return json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True)


def schedule_heading(shown: ScheduleShown) -> str:
    id = shown.schedule["id"]
    return (
        crumbs([("/ui", "Overview"), ("/ui/schedules", "Schedules")], id)
        + f"<h1>Schedule {h.e(id)}</h1>{notice(shown.request)}"
    )


def schedule_props(shown: ScheduleShown) -> str:
    s, now = shown.schedule, shown.request.now_ms
    payload = json.dumps(mask(s.get("payload")), indent=2, ensure_ascii=False, sort_keys=True)
    return props(
        [
            ("Cron", f"<code>{h.e(s['cron'])}</code>"),
            ("Time zone", h.e(s["tz"])),
            ("Job", h.e(s["name"])),
            ("Queue", queue_link(s.get("queue") or "")),
            ("Catch-up", h.e(s.get("catch_up", ""))),
            ("State", paused_badge(bool(s["paused"]))),
            ("Next run", h.when(s.get("next_run_at"), now)),
            ("Last slot", h.when(s.get("last_run_at"), now)),
            ("Declared in", h.e(s.get("source", ""))),
            ("Payload", f"<pre>{h.e(payload)}</pre>"),
        ]
    )


def schedule_actions(shown: ScheduleShown) -> str:
    request, s = shown.request, shown.schedule
    if request.readonly:
        return ""
    csrf = csrf_field(request)
    back = f"/ui/schedules/{h.q(s['id'])}"
    return (
        '<div class="actions">'
        + run_now_form(s["id"], csrf, back)
        + pause_form(back, bool(s["paused"]), csrf, back, f"schedule {s['id']}")
        + '<span class="muted">Run now pushes its job once, now, beside its slots.</span></div>'
    )


def schedule_runs(shown: ScheduleShown) -> str:
    """Its last runs, newest first: when, the job pushed, by what."""
    now = shown.request.now_ms
    if not shown.runs:
        listed = '<p class="muted">None yet: its first slot (or Run now) records one.</p>'
    else:
        columns: list[Column[Run]] = [
            Column("When", lambda r: h.when(r[0], now)),
            Column("Job", lambda r: job_link(str(r[1])), cell_cls="mono"),
            Column("By", lambda r: "Run now" if len(r) > 2 and r[2] == "now" else "its cron"),
        ]
        listed = table("Last runs, newest first", columns, shown.runs)
    return f'<h2 id="runs-h">Last runs</h2>{listed}'


def schedule_edit(shown: ScheduleShown) -> str:
    """The form changing an API schedule's cron, time zone and payload; a
    code-declared one is changed in its code (the cron syncs it)."""
    request, s = shown.request, shown.schedule
    if request.readonly:
        return ""
    if s.get("source") == "code":
        return (
            '<h2 id="edit-h">Edit</h2><p class="muted">Declared in the Worker\'s code: change '
            "it there; the next cron run after a deployment syncs it.</p>"
        )
    text = editable_payload(s.get("payload"))
    secret = (
        '<p class="muted">The payload holds secrets, shown masked: leave it empty to keep it '
        "as it is, or give it whole.</p>"
        if not text and mask(s.get("payload")) != s.get("payload")
        else '<p class="muted">Empty keeps the payload as it is.</p>'
    )
    return (
        '<h2 id="edit-h">Edit</h2>'
        f'<form method="post" action="/ui/schedules/{h.q(s["id"])}/edit" class="limits-form" '
        f'aria-labelledby="edit-h">{csrf_field(request)}<div class="fields">'
        f'<div class="field"><label for="e-cron">Cron (5 fields or @daily…)</label>'
        f'<input type="text" id="e-cron" name="cron" value="{h.e(s["cron"])}" required></div>'
        f'<div class="field"><label for="e-tz">Time zone (IANA)</label>'
        f'<input type="text" id="e-tz" name="tz" value="{h.e(s["tz"])}"></div></div>'
        f'<div class="field"><label for="e-payload">Payload (JSON)</label>'
        f'<textarea id="e-payload" name="payload" rows="6">{h.e(text)}</textarea>{secret}</div>'
        '<div class="actions"><button type="submit" class="primary">Save</button>'
        '<span class="muted">Saved only if the API would accept it; it then runs from '
        "its next slot.</span></div></form>"
    )


SCHEDULE = (schedule_heading, schedule_props, schedule_actions, schedule_runs, schedule_edit)
