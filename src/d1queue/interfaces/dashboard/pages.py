"""The dashboard's pages and the actions behind their forms: the overview,
a queue (and its flow limits), its completed jobs, a job (with its
dependencies, dependents and batch), a batch, the failed jobs, the
schedules. Each
handler gets a request the dashboard already admitted (auth.py): signed in,
and for an action carrying the session's CSRF token. Input is checked before
anything is written; a bad value is a 400 page that says what was wrong (422
for limits, as the API answers the same body). Payloads are
shown with their secrets masked (mask.py), error texts scrubbed of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlparse

from ...core.bounds import (
    LIMIT_RANGE,
    PERIOD_RANGE,
    STORED_ID_PATTERN,
    STORED_NAME_RULE,
    is_stored_name,
)
from ...core.flow import LIMIT_FIELDS, Limits, LimitsError
from ...store import stats as counters
from ...store.dashboard import BATCH_PAGE, PAGE, STATES, Links, Store
from ...store.failed import FailedJob
from ...store.workflows import JobView
from ..router import Reply
from ..service import Service, stored_payload
from . import html as h
from .auth import safe_back
from .mask import mask, scrub
from .request import Refused, Request, csrf_field, html_page, known, redirect

AGES: dict[str, tuple[str, int | None, int | None]] = {
    "": ("Any age", None, None),
    "1h": ("Failed in the last hour", 3600, None),
    "1d": ("Failed in the last day", 86400, None),
    "7d": ("Failed in the last 7 days", 7 * 86400, None),
    "gt1d": ("Failed more than a day ago", None, 86400),
    "gt7d": ("Failed more than 7 days ago", None, 7 * 86400),
}
"""The failed list's age filter: (label, newer than s, older than s)."""

SCHEDULES_PAGE = 50
"""Schedules listed a page."""

NOTICES = {
    "signed_in": "Signed in.",
    "paused": "Queue paused: its jobs wait until it is resumed.",
    "resumed": "Queue running again: the next cron run drains it.",
    "schedule_paused": "Schedule paused: it enqueues nothing until resumed.",
    "schedule_resumed": "Schedule running again, from its next slot.",
    "cancelled": "Job cancelled.",
    "run_now": "Job made due now: the next drain runs it.",
    "already_ready": "The job was already due; nothing changed.",
    "retried": "{n} failed job(s) put back on their queues.",
    "removed": "{n} failed job(s) removed for good.",
    "limits_set": "Limits saved: every drain claims under them from its next claim.",
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


def check_name(kind: str, value: str) -> str:
    """A queue, job name or schedule id to show or act on: any a row may
    have (a write of a new one goes through the Service, which checks it)."""
    if not is_stored_name(value):
        raise Refused(400, f"{kind} names match {STORED_NAME_RULE}; {value!r} does not")
    return value


def check_id(value: str) -> str:
    if not STORED_ID_PATTERN.fullmatch(value):
        raise Refused(400, f"{value!r} is not a job id")
    return value


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


class Pages:
    """The pages and actions over one Service and its dashboard Store."""

    def __init__(self, service: Service, store: Store) -> None:
        self.service, self.store = service, store

    # -- overview ---------------------------------------------------------------

    async def overview(self, request: Request) -> Reply:
        known(request)
        now = request.now_ms
        queues = await self.service.admin.stats()
        chart, done = await self.store.counters(now)
        by_name = {s.queue: s for s in queues}
        names = sorted(set(by_name) | set(done))
        csrf = csrf_field(request)
        rows = []
        for name in names:
            s = by_name.get(name)
            d = done.get(name, counters.Done())
            paused = bool(s and s.paused)
            action = "resume" if paused else "pause"
            button = (
                f'<form method="post" action="/ui/queues/{h.q(name)}/{action}" class="inline">'
                f"{csrf}{h.hidden('back', '/ui')}"
                f'<button type="submit" title="{action.title()} queue {h.e(name)}">'
                f"{action.title()}</button></form>"
            )
            state = (
                '<span class="badge paused">Paused</span>'
                if paused
                else '<span class="badge running">Running</span>'
            )
            failed = s.failed if s else 0
            limits = _limits_brief(s.limits, s.reserved) if s else _limits_brief(None, 0)
            failed_link = (
                f'<a href="/ui/failed{h.qs({"queue": name})}">{failed}</a>' if failed else "0"
            )
            rows.append(
                "<tr>"
                f'<th scope="row"><a href="/ui/queues/{h.q(name)}">{h.e(name)}</a></th>'
                f'<td class="num">{s.ready if s else 0}</td>'
                f'<td class="num hide-narrow">{s.delayed if s else 0}</td>'
                f'<td class="num hide-narrow">{s.reserved if s else 0}</td>'
                f'<td class="num">{failed_link}</td>'
                f'<td class="hide-narrow">{h.age(s.oldest_ready_age_s if s else None)}</td>'
                f"<td>{state}</td>"
                f'<td class="num">{d.hour}</td><td class="num hide-narrow">{d.day}</td>'
                f'<td class="hide-narrow">{limits}</td>'
                f"<td>{button}</td></tr>"
            )
        if rows:
            table = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Queues</caption>'
                '<thead><tr><th scope="col">Queue</th><th scope="col" class="num">Ready</th>'
                '<th scope="col" class="num hide-narrow">Delayed</th>'
                '<th scope="col" class="num hide-narrow">Reserved</th>'
                '<th scope="col" class="num">Failed</th>'
                '<th scope="col" class="hide-narrow">Oldest ready</th>'
                '<th scope="col">State</th><th scope="col" class="num">Done 1 h</th>'
                '<th scope="col" class="num hide-narrow">Done 24 h</th>'
                '<th scope="col" class="hide-narrow">Limits</th>'
                '<th scope="col">Action</th></tr>'
                f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
            )
        else:
            table = (
                '<div class="empty"><p><strong>No queues yet.</strong> A queue appears here '
                "when a job is pushed to it. Push one with the API, for example:</p>"
                '<pre>curl -H "Authorization: Bearer $TOKEN" '
                f"{h.e(_origin(request))}/v1/queues/default/jobs \\\n"
                '     -d \'{"name": "example.echo", "payload": {"hello": "world"}}\'</pre></div>'
            )
        body = (
            f"<h1>Overview</h1>{notice(request)}"
            f'<section id="queues" data-live aria-labelledby="queues-h">'
            f'<h2 id="queues-h">Queues</h2>{table}</section>'
            f'<section id="activity" data-live aria-labelledby="activity-h">'
            f'<h2 id="activity-h">Last hour</h2>{_chart(chart, now)}</section>'
        )
        return Reply(200, html_page(request, "Overview", body, current="/ui"))

    # -- a queue ----------------------------------------------------------------

    async def queue_page(self, request: Request, queue: str) -> Reply:
        check_name("queue", queue)
        known(request, "state", "name", "cursor")
        state, name, cursor = request.param("state"), request.param("name"), request.param("cursor")
        if state and state not in STATES:
            raise Refused(400, f"state must be one of {', '.join(STATES)} (or empty for all).")
        if name:
            check_name("job", name)
        (stats,) = await self.service.admin.stats(queue)
        try:
            page = await self.store.queue_jobs(queue, state=state, name=name, cursor=cursor or None)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        flow = await self.service.limits(queue)  # one round trip (a shard each)
        now = request.now_ms
        here = f"/ui/queues/{h.q(queue)}" + h.qs({"state": state, "name": name, "cursor": cursor})
        action = "resume" if stats.paused else "pause"
        control = (
            f'<form method="post" action="/ui/queues/{h.q(queue)}/{action}" class="inline">'
            f"{csrf_field(request)}{h.hidden('back', here)}"
            f'<button type="submit">{action.title()}</button></form>'
        )
        summary = (
            '<ul class="stats">'
            f'<li><span class="n">{stats.ready}</span>ready</li>'
            f'<li><span class="n">{stats.delayed}</span>delayed</li>'
            f'<li><span class="n">{stats.reserved}</span>reserved</li>'
            f'<li><span class="n"><a href="/ui/failed{h.qs({"queue": queue})}">{stats.failed}'
            "</a></span>failed</li>"
            f'<li><span class="n">{h.age(stats.oldest_ready_age_s)}</span>oldest ready</li>'
            f'<li><span class="n">{"Paused" if stats.paused else "Running"}</span>state</li></ul>'
        )
        filters = (
            f'<form method="get" action="/ui/queues/{h.q(queue)}" class="filters" '
            'role="search" aria-label="Filter jobs">'
            '<div><label for="f-state">State</label><select id="f-state" name="state">'
            + h.options([("", "All states"), *((s, s.title()) for s in STATES)], state)
            + "</select></div>"
            '<div><label for="f-name">Job name</label>'
            f'<input type="search" id="f-name" name="name" value="{h.e(name)}" '
            'placeholder="e.g. mail.send"></div>'
            '<div><button type="submit">Filter</button> '
            f'<a class="button" href="/ui/queues/{h.q(queue)}">Clear</a></div></form>'
        )
        rows = []
        for r in page.rows:
            rows.append(
                "<tr>"
                f'<td class="mono"><a href="/ui/jobs/{h.q(r["id"])}">{h.e(r["id"])}</a></td>'
                f"<td>{h.e(r['name'])}</td>"
                f'<td class="hide-narrow">{_group(r["grp"])}</td>'
                f'<td><span class="badge {h.e(r["state"])}">{h.e(r["state"])}</span></td>'
                f'<td class="num">{r["attempts"]} / {r["max_attempts"]}</td>'
                f'<td class="num hide-narrow">{r["priority"]}</td>'
                f"<td>{h.when(r['available_at'], now)}</td>"
                f'<td class="hide-narrow">{h.e(_short(scrub(r["last_error"], r["payload"])))}'
                "</td></tr>"
            )
        if rows:
            listing = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Jobs</caption>'
                '<thead><tr><th scope="col">Job id</th><th scope="col">Name</th>'
                '<th scope="col" class="hide-narrow">Group</th>'
                '<th scope="col">State</th><th scope="col" class="num">Attempts</th>'
                '<th scope="col" class="num hide-narrow">Priority</th>'
                '<th scope="col">Available at</th><th scope="col" class="hide-narrow">'
                f"Last error</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            )
        elif state or name or cursor:
            listing = (
                '<div class="empty"><p><strong>No jobs match this filter.</strong> '
                f'<a href="/ui/queues/{h.q(queue)}">Clear the filter</a> to see every job '
                "on the queue.</p></div>"
            )
        else:
            listing = (
                '<div class="empty"><p><strong>This queue holds no jobs.</strong> '
                "Those that completed are under "
                f'<a href="/ui/queues/{h.q(queue)}/completed">Completed jobs</a> (while they '
                "are kept); failed ones are under "
                f'<a href="/ui/failed{h.qs({"queue": queue})}">Failed jobs</a>. '
                f"Push one with <code>POST {h.e(request.base)}/v1/queues/{h.e(queue)}/jobs"
                "</code>.</p></div>"
            )
        pager = _pager(
            f"/ui/queues/{h.q(queue)}",
            {"state": state, "name": name},
            cursor,
            page.next_cursor,
        )
        body = (
            f'<p><a href="/ui">Overview</a> › queue</p><h1>Queue {h.e(queue)}</h1>'
            f"{notice(request)}"
            f'<div id="queue-summary" data-live>{summary}'
            f'<div class="actions">{control}'
            f'<a class="button" href="/ui/queues/{h.q(queue)}/completed">Completed jobs</a>'
            "</div></div>"
            '<h2 id="limits-h">Flow limits</h2>'
            f'<div id="queue-limits" data-live>{_limits_usage(flow)}</div>'
            f"{_limits_form(request, queue, flow['limits'], here)}"
            f'<h2 id="jobs-h">Jobs</h2>{filters}'
            f'<section id="jobs" data-live aria-labelledby="jobs-h">{listing}{pager}</section>'
        )
        return Reply(200, html_page(request, f"Queue {queue}", body))

    async def completed_page(self, request: Request, queue: str) -> Reply:
        """A queue's completed jobs kept as history, newest first, a page at a
        time (cursor paging, one query a shard), with their results masked
        and cut short."""
        check_name("queue", queue)
        known(request, "cursor")
        cursor = request.param("cursor")
        try:
            page = await self.store.completed(queue, cursor or None)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        now = request.now_ms
        rows = []
        for r in page.rows:
            batch = _job_link(r["batch"], "/ui/batches/") if r["batch"] else ""
            result = _brief(r["result"])
            rows.append(
                "<tr>"
                f'<td class="mono"><a href="/ui/jobs/{h.q(r["id"])}">{h.e(r["id"])}</a></td>'
                f"<td>{h.e(r['name'])}</td>"
                f"<td>{h.when(r['completed_at'], now)}</td>"
                f'<td class="num hide-narrow">{r["attempts"]} / {r["max_attempts"]}</td>'
                f'<td class="hide-narrow">{batch}</td>'
                f'<td class="result">'
                + (f"<code>{h.e(result)}</code>" if result else '<span class="muted">—</span>')
                + "</td></tr>"
            )
        if rows:
            listing = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Completed '
                'jobs</caption><thead><tr><th scope="col">Job id</th><th scope="col">Name</th>'
                '<th scope="col">Completed</th>'
                '<th scope="col" class="num hide-narrow">Attempts</th>'
                '<th scope="col" class="hide-narrow">Batch</th><th scope="col">Result</th>'
                f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            )
        elif cursor:
            listing = (
                '<div class="empty"><p><strong>No more completed jobs.</strong> '
                f'<a href="/ui/queues/{h.q(queue)}/completed">Back to the newest</a>.</p></div>'
            )
        elif not self.service.keeps_history(queue):
            listing = (
                '<div class="empty"><p><strong>This queue keeps no history:</strong> a job is '
                "deleted as it completes (D1QUEUE_KEEP_COMPLETED_S is 0, or the Worker's "
                "registry opts the queue out with <code>registry.history(queue, keep=False)"
                "</code>).</p></div>"
            )
        else:
            listing = (
                '<div class="empty"><p><strong>No completed jobs kept.</strong> A job appears '
                "here when it completes, with its result, and stays for "
                "D1QUEUE_KEEP_COMPLETED_S.</p></div>"
            )
        pager = _pager(f"/ui/queues/{h.q(queue)}/completed", {}, cursor, page.next_cursor)
        body = (
            f'<p><a href="/ui">Overview</a> › <a href="/ui/queues/{h.q(queue)}">queue '
            f"{h.e(queue)}</a> › completed</p><h1>Completed jobs of {h.e(queue)}</h1>"
            f'<p class="muted">Newest first. Results are shown with their secrets masked; '
            "a job's page shows its whole result.</p>"
            f'<section id="completed" data-live aria-label="Completed jobs">{listing}{pager}'
            "</section>"
        )
        return Reply(200, html_page(request, f"Completed jobs of {queue}", body))

    async def _set_paused(self, request: Request, queue: str, paused: bool) -> Reply:
        check_name("queue", queue)
        back = safe_back(request.field("back"), f"/ui/queues/{h.q(queue)}", "back")
        await self.service.set_paused(queue, paused)
        return redirect(with_notice(back, "paused" if paused else "resumed"))

    async def set_limits(self, request: Request, queue: str) -> Reply:
        """Replace the queue's flow limits from the queue page's form: first a
        confirmation page giving the limits now and those sent, then (with
        `confirm=yes`) the write, through the API's own Service.set_limits.
        Limits the form's values do not make (Limits.parse's rule) are a 422
        page saying why, at either step, and nothing is written."""
        check_name("queue", queue)
        home = f"/ui/queues/{h.q(queue)}"
        back = safe_back(request.field("back"), home, "back")
        limits = limits_of_form(request)
        if request.field("confirm") != "yes":
            now = await self.service.limits(queue)
            new = _limits_text(limits.as_dict()) or "no limits"
            was = _limits_text(now["limits"]) or "no limits"
            note = (
                "<p>These replace the limits declared in code (Registry.limit) for this "
                "queue, until set again here or over the API.</p>"
                if now["source"] == "code"
                else ""
            )
            fields = "".join(h.hidden(k, v) for k, v in _form_values(limits.as_dict()).items())
            body = (
                f"<h1>Confirm</h1><p>Set the flow limits of queue {h.e(queue)} to "
                f"<strong>{h.e(new)}</strong>?</p><p>Now: {h.e(was)} "
                f"({h.e(now['running'])} running). Every drain claims under the new limits "
                "from its next claim; jobs running now are not stopped.</p>"
                f'{note}<form method="post" action="{home}/limits">{csrf_field(request)}'
                f"{fields}{h.hidden('back', back)}{h.hidden('confirm', 'yes')}"
                '<div class="actions"><button type="submit" class="primary" autofocus>'
                f'Set limits</button><a class="button" href="{h.e(back)}">Go back</a>'
                "</div></form>"
            )
            return Reply(200, html_page(request, "Confirm", body))
        await self.service.set_limits(queue, limits.as_dict())
        return redirect(with_notice(back, "limits_set"))

    async def pause(self, request: Request, queue: str) -> Reply:
        return await self._set_paused(request, queue, True)

    async def resume(self, request: Request, queue: str) -> Reply:
        return await self._set_paused(request, queue, False)

    # -- a job ------------------------------------------------------------------

    async def job_page(self, request: Request, id: str) -> Reply:
        """A job wherever it is in its life (Store.job: waiting, ready,
        delayed, reserved, completed and kept, failed), with its workflow:
        the jobs it waits for and those waiting for it, each linked with its
        state, and its batch. Two round trips: the job, then its links."""
        check_id(id)
        known(request)
        found = await self.store.job(id)
        if found is None:
            body = (
                f"<h1>Job {h.e(id)}</h1>"
                '<div class="empty"><p><strong>This job is not queued, not failed and not '
                "kept as completed:</strong> it was cancelled or removed, completed on a "
                "queue that keeps no history (or longer ago than it keeps it), or never "
                'existed. <a href="/ui">Back to the overview</a>.</p></div>'
            )
            return Reply(404, html_page(request, "Job not found", body))
        job = _job_fields(found)
        links = await self.store.links(id, job["after"])
        now = request.now_ms
        state = job["state"]
        failed, completed = state == "failed", state == "completed"
        # A failed job's stored text is decoded as the API does; text that is
        # not JSON comes as a string, shown quoted as what it is.
        pretty = _pretty(mask(job["payload"]))
        props = [
            ("Id", f'<span class="mono">{h.e(job["id"])}</span>'),
            ("Queue", f'<a href="/ui/queues/{h.q(job["queue"])}">{h.e(job["queue"])}</a>'),
            ("Name", h.e(job["name"])),
            ("Group", _group(job.get("group"))),
            ("State", _badge(state)),
            ("Attempts", f"{job['attempts']} of {job['max_attempts']}"),
            ("Priority", h.e(job["priority"])),
            ("Created", h.when(job.get("created_at"), now)),
        ]
        if failed:
            props.append(("Failed at", h.when(job.get("failed_at"), now)))
        elif completed:
            props.append(("Completed at", h.when(job.get("completed_at"), now)))
        else:
            label = "May start at" if state == "waiting" else "Available at"
            props.append((label, h.when(job.get("available_at"), now)))
            if job.get("reserved_until"):
                props.append(("Lease ends", h.when(job["reserved_until"], now)))
            if job.get("unique_key"):
                props.append(("Unique key", f'<span class="mono">{h.e(job["unique_key"])}</span>'))
        if job["batch"]:
            props.append(("Batch", _job_link(job["batch"], "/ui/batches/")))
        if job["after"] and not failed:  # a failure's row does not keep the flag
            props.append(("Ignores failed dependencies", "yes" if job["ignore_failed"] else "no"))
        error = scrub(job.get("error") if failed else job.get("last_error"), job["payload"])
        csrf = csrf_field(request)
        here = f"/ui/jobs/{h.q(id)}"
        if failed:
            actions = (
                '<form method="post" action="/ui/failed/bulk" class="inline">'
                f"{csrf}{h.hidden('ids', id)}{h.hidden('action', 'retry')}"
                f"{h.hidden('back', '/ui/failed')}"
                '<button type="submit">Retry</button></form>'
                '<form method="post" action="/ui/failed/bulk" class="inline">'
                f"{csrf}{h.hidden('ids', id)}{h.hidden('action', 'delete')}"
                f"{h.hidden('back', '/ui/failed')}"
                '<button type="submit" class="danger">Delete</button></form>'
            )
        elif completed:
            actions = '<span class="muted">It completed: nothing is left to do.</span>'
        else:
            held = state == "reserved"
            delayed = state == "delayed"
            why = ' title="A worker is running it now"' if held else ""
            actions = (
                f'<form method="post" action="{here}/run" class="inline">{csrf}'
                f'<button type="submit"{" disabled" if not delayed else ""}'
                f"{why if held else ''}>Run now</button></form>"
                f'<form method="post" action="{here}/cancel" class="inline">{csrf}'
                f'<button type="submit" class="danger"{" disabled" if held else ""}{why}>'
                "Cancel job</button></form>"
            )
            if held:
                actions += '<span class="muted">A worker holds this job: wait for it.</span>'
            elif state == "waiting":
                actions += (
                    '<span class="muted">It waits for its dependencies: the last one to '
                    "complete makes it ready.</span>"
                )
            elif not delayed:
                actions += '<span class="muted">It is due: the next drain runs it.</span>'
        result = ""
        if completed:
            result = "<h2>Result</h2>" + (
                '<p class="muted">None (the handler returned nothing).</p>'
                if job["result"] is None
                else f"<pre>{h.e(_cut(_pretty(mask(job['result'])), RESULT_SHOWN))}</pre>"
            )
        body = (
            f'<p><a href="/ui/queues/{h.q(job["queue"])}">Queue {h.e(job["queue"])}</a> › job</p>'
            f"<h1>Job {h.e(job['name'])}</h1>{notice(request)}"
            f'<div id="job" data-live><dl class="props">'
            + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in props)
            + f'</dl><div class="actions">{actions}</div>'
            f"{result}"
            f"<h2>{'Error' if failed else 'Last error'}</h2>"
            + (f"<pre>{h.e(error)}</pre>" if error else '<p class="muted">None.</p>')
            + _workflow(job["after"], links)
            + f"<h2>Payload</h2><pre>{h.e(pretty)}</pre></div>"
        )
        return Reply(200, html_page(request, f"Job {id}", body))

    async def batch_page(self, request: Request, id: str) -> Reply:
        """A batch's progress (its counters, state and times, a progress
        bar), its jobs' ids a page at a time with their states, and its
        callback jobs. Two round trips: the batch, then the states."""
        check_id(id)
        known(request, "page")
        text = request.param("page") or "1"
        if not re.fullmatch(r"[1-9][0-9]{0,5}", text):
            raise Refused(400, f"page is a number from 1; {text!r} is not.")
        try:
            found = await self.store.batch(id, int(text))
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        if found is None:
            body = (
                f"<h1>Batch {h.e(id)}</h1>"
                '<div class="empty"><p><strong>There is no such batch:</strong> it never '
                "existed, or it finished longer ago than completed jobs are kept "
                '(D1QUEUE_KEEP_COMPLETED_S) and was pruned. <a href="/ui">Back to the '
                "overview</a>.</p></div>"
            )
            return Reply(404, html_page(request, "Batch not found", body))
        b, now = found.batch, request.now_ms
        done = b.completed + b.failed
        summary = (
            '<ul class="stats">'
            f'<li><span class="n">{b.total}</span>total</li>'
            f'<li><span class="n">{b.pending}</span>pending</li>'
            f'<li><span class="n">{b.completed}</span>completed</li>'
            f'<li><span class="n">{b.failed}</span>failed</li>'
            f'<li><span class="n">{_badge(b.state)}</span>state</li></ul>'
            f'<p class="progress"><label for="batch-progress">{done} of {b.total} ended '
            f"({b.completed} completed, {b.failed} failed)</label>"
            f'<progress id="batch-progress" max="{max(b.total, 1)}" value="{done}">'
            f"{done} of {b.total}</progress></p>"
            '<dl class="props">'
            f"<dt>Created</dt><dd>{h.when(b.created_at, now)}</dd>"
            f"<dt>Finished</dt><dd>{h.when(b.finished_at, now)}</dd></dl>"
        )
        # A callback not enqueued while the batch runs may still be; once it
        # finished, its condition did not hold (on_success after a failure,
        # on_failure when none failed).
        not_yet = (
            "not enqueued yet" if b.state == "running" else "not enqueued: its case did not occur"
        )
        if found.callbacks:
            items = "".join(
                f"<li>{h.e(kind)}: {_job_link(cid)} "
                + (
                    _badge(found.states[cid])
                    if cid in found.states
                    else GONE
                    if fired
                    else f'<span class="muted">{h.e(not_yet)}</span>'
                )
                + "</li>"
                for kind, cid, fired in found.callbacks
            )
            callbacks = f'<ul class="links" aria-label="Callbacks">{items}</ul>'
        else:
            callbacks = '<p class="muted">None: the batch was pushed without callbacks.</p>'
        n = len(b.ids)
        first = (found.page - 1) * BATCH_PAGE + 1
        shown = (
            f'<p class="muted">Jobs {first} to {first + len(found.ids) - 1} of {n}.</p>'
            if found.pages > 1
            else ""
        )
        links = []
        base = f"/ui/batches/{h.q(id)}"
        if found.page > 1:
            links.append(f'<a href="{h.e(base + h.qs({"page": found.page - 1}))}">« Previous</a>')
        if found.page < found.pages:
            links.append(f'<a href="{h.e(base + h.qs({"page": found.page + 1}))}">Next page »</a>')
        pager = f'<nav class="pager" aria-label="Pages">{"".join(links)}</nav>' if links else ""
        jobs = (
            _linked(found.ids, found.states, "Jobs of the batch")
            if found.ids
            else '<p class="muted">No jobs.</p>'
        )
        body = (
            f'<p><a href="/ui">Overview</a> › batch</p><h1>Batch {h.e(id)}</h1>'
            f'<div id="batch" data-live>{summary}'
            f'<h2 id="callbacks-h">Callbacks</h2>{callbacks}'
            f'<h2 id="batch-jobs-h">Jobs</h2>{shown}{jobs}{pager}</div>'
        )
        return Reply(200, html_page(request, f"Batch {id}", body))

    async def cancel(self, request: Request, id: str) -> Reply:
        check_id(id)
        job = await self.service.job(id)  # 404 if gone
        await self.service.cancel(id)  # 409 if a worker holds it
        return redirect(with_notice(f"/ui/queues/{h.q(job['queue'])}", "cancelled"))

    async def run_now(self, request: Request, id: str) -> Reply:
        check_id(id)
        outcome = await self.store.run_now(id)
        if outcome == "missing":
            raise Refused(
                404, f"Job {id} is not queued: it completed, failed, was cancelled, or never was."
            )
        if outcome == "reserved":
            raise Refused(409, f"Job {id} is running now; it cannot be moved.")
        code = "run_now" if outcome == "done" else "already_ready"
        return redirect(with_notice(f"/ui/jobs/{h.q(id)}", code))

    # -- failed jobs ------------------------------------------------------------

    async def failed_page(self, request: Request) -> Reply:
        known(request, "queue", "name", "error", "age", "cursor")
        queue, name = request.param("queue"), request.param("name")
        error, age, cursor = request.param("error"), request.param("age"), request.param("cursor")
        if queue:
            check_name("queue", queue)
        if name:
            check_name("job", name)
        if len(error) > 200:
            raise Refused(400, "The error text to look for is at most 200 characters.")
        if age not in AGES:
            raise Refused(400, f"age must be one of {', '.join(a for a in AGES if a)}.")
        now = request.now_ms
        _, newer, older = AGES[age]
        since = now - newer * 1000 if newer else 0
        before = now - older * 1000 if older else now + 1
        try:
            page = await self.store.failed(
                queue=queue,
                name=name,
                error=error,
                since_ms=since,
                before_ms=before,
                cursor=cursor or None,
            )
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        filters = {"queue": queue, "name": name, "error": error, "age": age}
        here = "/ui/failed" + h.qs({**filters, "cursor": cursor})
        form = (
            '<form method="get" action="/ui/failed" class="filters" role="search" '
            'aria-label="Filter failed jobs">'
            '<div><label for="f-queue">Queue</label>'
            f'<input type="search" id="f-queue" name="queue" value="{h.e(queue)}" '
            'placeholder="any queue"></div>'
            '<div><label for="f-name">Job name</label>'
            f'<input type="search" id="f-name" name="name" value="{h.e(name)}" '
            'placeholder="any name"></div>'
            '<div><label for="f-error">Error contains</label>'
            f'<input type="search" id="f-error" name="error" value="{h.e(error)}" '
            'placeholder="e.g. timed out"></div>'
            '<div><label for="f-age">Age</label><select id="f-age" name="age">'
            + h.options(((k, v[0]) for k, v in AGES.items()), age)
            + "</select></div>"
            '<div><button type="submit">Filter</button> '
            '<a class="button" href="/ui/failed">Clear</a></div></form>'
        )
        rows = []
        for r in page.rows:
            rid = r["id"]
            rows.append(
                "<tr>"
                f'<td><input type="checkbox" name="ids" value="{h.e(rid)}" id="sel-{h.e(rid)}" '
                f'data-select aria-label="Select job {h.e(rid)}"></td>'
                f'<td class="mono"><a href="/ui/jobs/{h.q(rid)}">{h.e(rid)}</a></td>'
                f'<td><a href="/ui/queues/{h.q(r["queue"])}">{h.e(r["queue"])}</a></td>'
                f"<td>{h.e(r['name'])}</td>"
                f"<td>{h.e(_short(scrub(r['error'], r['payload'])))}</td>"
                f'<td class="num hide-narrow">{r["attempts"]} / {r["max_attempts"]}</td>'
                f"<td>{h.when(r['failed_at'], now)}</td></tr>"
            )
        if rows:
            listing = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Failed jobs'
                '</caption><thead><tr><th scope="col"><input type="checkbox" id="select-all" '
                'aria-label="Select every job on this page"></th>'
                '<th scope="col">Job id</th><th scope="col">Queue</th><th scope="col">Name</th>'
                '<th scope="col">Error</th><th scope="col" class="num hide-narrow">Attempts</th>'
                '<th scope="col">Failed</th></tr></thead>'
                f"<tbody>{''.join(rows)}</tbody></table></div>"
            )
        elif any(filters.values()) or cursor:
            listing = (
                '<div class="empty"><p><strong>No failed jobs match this filter.</strong> '
                '<a href="/ui/failed">Clear the filter</a> to see them all.</p></div>'
            )
        else:
            listing = (
                '<div class="empty"><p><strong>No failed jobs.</strong> A job lands here when '
                "its handler fails it or its attempts run out; nothing to do for now.</p></div>"
            )
        bulk = (
            '<div class="actions"><span data-selected-count class="muted"></span>'
            '<button type="submit" name="action" value="retry" data-needs-selection>Retry'
            "</button>"
            '<button type="submit" name="action" value="delete" class="danger" '
            "data-needs-selection>Delete</button>"
            '<span class="muted">the selected jobs (you will be asked to confirm)</span></div>'
            if rows
            else ""
        )
        pager = _pager("/ui/failed", filters, cursor, page.next_cursor)
        body = (
            f"<h1>Failed jobs</h1>{notice(request)}{form}"
            f'<form method="post" action="/ui/failed/bulk" aria-label="Act on selected jobs">'
            f"{csrf_field(request)}{h.hidden('back', here)}"
            f'<section id="failed" data-live aria-label="Failed jobs list">{bulk}{listing}'
            f"{pager}</section></form>"
        )
        return Reply(200, html_page(request, "Failed jobs", body, current="/ui/failed"))

    async def bulk(self, request: Request) -> Reply:
        """Retry or delete the selected failed jobs: first a confirmation page
        giving the count, then (with `confirm=yes`) the action itself."""
        action = request.field("action")
        if action not in ("retry", "delete"):
            raise Refused(400, "action must be retry or delete.")
        ids = list(dict.fromkeys(request.form.get("ids", [])))
        if not ids:
            raise Refused(400, "Select at least one failed job first.")
        if len(ids) > PAGE:
            raise Refused(400, f"At most {PAGE} jobs at once (one page).")
        for id in ids:
            check_id(id)
        back = safe_back(request.field("back"), "/ui/failed", "back")
        n = len(ids)
        jobs = f"{n} failed job{'s' if n != 1 else ''}"
        if request.field("confirm") != "yes":
            question = (
                f"Put {jobs} back on {'their queues' if n != 1 else 'its queue'}, "
                "each with its registered attempts afresh?"
                if action == "retry"
                else f"Remove {jobs} for good? This cannot be undone."
            )
            fields = "".join(h.hidden("ids", i) for i in ids)
            verb = "Retry" if action == "retry" else "Delete"
            listing = "".join(f'<li class="mono">{h.e(i)}</li>' for i in ids[:10])
            more = f"<li>and {n - 10} more</li>" if n > 10 else ""
            body = (
                f"<h1>Confirm</h1><p>{h.e(question)}</p><ul>{listing}{more}</ul>"
                f'<form method="post" action="/ui/failed/bulk">{csrf_field(request)}{fields}'
                f"{h.hidden('action', action)}{h.hidden('back', back)}"
                f'{h.hidden("confirm", "yes")}<div class="actions">'
                f'<button type="submit" class="{"primary" if action == "retry" else "danger"}" '
                f"autofocus>{verb} {n} job{'s' if n != 1 else ''}</button>"
                f'<a class="button" href="{h.e(back)}">Go back</a></div></form>'
            )
            return Reply(200, html_page(request, "Confirm", body))
        if action == "retry":
            done = await self.store.retry_many(ids)
            return redirect(with_notice(back, "retried", done))
        done = await self.store.delete_many(ids)
        return redirect(with_notice(back, "removed", done))

    # -- schedules --------------------------------------------------------------

    async def schedules_page(self, request: Request) -> Reply:
        known(request, "cursor")
        now = request.now_ms
        cursor = request.param("cursor") or None
        if cursor is not None:
            check_name("schedule id", cursor)
        page = await self.service.schedules(SCHEDULES_PAGE, cursor)
        csrf = csrf_field(request)
        rows = []
        for sch in page["schedules"]:
            paused = bool(sch["paused"])
            action = "resume" if paused else "pause"
            back = "/ui/schedules" + h.qs({"cursor": cursor} if cursor else {})
            button = (
                f'<form method="post" action="/ui/schedules/{h.q(sch["id"])}/{action}" '
                f'class="inline">{csrf}{h.hidden("back", back)}'
                f'<button type="submit" title="{action.title()} schedule {h.e(sch["id"])}">'
                f"{action.title()}</button></form>"
            )
            state = (
                '<span class="badge paused">Paused</span>'
                if paused
                else '<span class="badge running">Running</span>'
            )
            queue = sch.get("queue") or ""
            rows.append(
                "<tr>"
                f'<th scope="row">{h.e(sch["id"])}</th>'
                f"<td><code>{h.e(sch['cron'])}</code> "
                f'<span class="muted">{h.e(sch["tz"])}</span></td>'
                f"<td>{h.e(sch['name'])}</td>"
                f'<td class="hide-narrow"><a href="/ui/queues/{h.q(queue)}">{h.e(queue)}</a></td>'
                f"<td>{h.when(sch.get('next_run_at'), now)}</td>"
                f'<td class="hide-narrow">{h.when(sch.get("last_run_at"), now)}</td>'
                f"<td>{state}</td>"
                f'<td class="hide-narrow">{h.e(sch.get("source", ""))}</td>'
                f"<td>{button}</td></tr>"
            )
        if rows:
            table = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Schedules'
                '</caption><thead><tr><th scope="col">Schedule</th><th scope="col">Cron</th>'
                '<th scope="col">Job</th><th scope="col" class="hide-narrow">Queue</th>'
                '<th scope="col">Next run</th><th scope="col" class="hide-narrow">Last run</th>'
                '<th scope="col">State</th><th scope="col" class="hide-narrow">Declared in</th>'
                '<th scope="col">Action</th></tr>'
                f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
                + _pager("/ui/schedules", {}, cursor or "", page.get("next_cursor"))
            )
        else:
            table = (
                '<div class="empty"><p><strong>No schedules yet.</strong> Declare one beside '
                'its handler (<code>@registry.job("report.daily", schedule="0 6 * * *", '
                'tz="Europe/Berlin")</code>) or create one with the API:</p>'
                '<pre>curl -H "Authorization: Bearer $TOKEN" '
                f"{h.e(_origin(request))}/v1/schedules \\\n"
                '     -d \'{"cron": "*/5 * * * *", "name": "example.echo"}\'</pre></div>'
            )
        body = (
            f"<h1>Schedules</h1>{notice(request)}"
            f'<section id="schedules" data-live aria-label="Schedule list">{table}</section>'
        )
        return Reply(200, html_page(request, "Schedules", body, current="/ui/schedules"))

    async def _set_schedule_paused(self, request: Request, id: str, paused: bool) -> Reply:
        check_name("schedule id", id)
        back = safe_back(request.field("back"), "/ui/schedules", "back")
        if paused:
            await self.service.pause_schedule(id)
        else:
            await self.service.resume_schedule(id)
        return redirect(with_notice(back, "schedule_paused" if paused else "schedule_resumed"))

    async def pause_schedule(self, request: Request, id: str) -> Reply:
        return await self._set_schedule_paused(request, id, True)

    async def resume_schedule(self, request: Request, id: str) -> Reply:
        return await self._set_schedule_paused(request, id, False)


_INTEGER = re.compile(r"-?[0-9]{1,12}")
"""A form's number, read as an integer for Limits.parse to judge; any other
text goes to it as the text, which it refuses saying what it got."""

_FORM_FIELDS = {
    "rate": ("rate_limit", "rate_period_s"),
    "group_rate": ("group_rate_limit", "group_rate_period_s"),
}
"""The form's two fields of each rate: its limit and its period_s."""


def _form_number(request: Request, name: str) -> object:
    """A field of the limits form: None when empty, an int when it is one,
    else its text (cut short: it is only quoted in the error)."""
    text = request.field(name).strip()
    if not text:
        return None
    if _INTEGER.fullmatch(text):
        return int(text)
    return text if len(text) <= 24 else text[:23] + "…"


def limits_of_form(request: Request) -> Limits:
    """The limits the queue page's form sends, judged by Limits.parse, the
    rule the API applies to a PUT body: an empty field is no limit of that
    kind, a rate with one of its two fields filled is refused. A 422 page
    with LimitsError's message otherwise, before anything is written."""
    body: dict[str, Any] = {}
    for name in LIMIT_FIELDS:
        if name in _FORM_FIELDS:
            limit, period = (_form_number(request, f) for f in _FORM_FIELDS[name])
            if limit is None and period is None:
                body[name] = None
                continue
            body[name] = {
                k: v for k, v in (("limit", limit), ("period_s", period)) if v is not None
            }
        else:
            body[name] = _form_number(request, name)
    try:
        return Limits.parse(body)
    except LimitsError as exc:
        raise Refused(422, f"Nothing was changed: {exc}.") from None


def _form_values(limits: Mapping[str, Any]) -> dict[str, str]:
    """A limits body (the PUT body's shape) as the form's fields ("" for none)."""
    out = {}
    for name in LIMIT_FIELDS:
        value = limits.get(name)
        if name in _FORM_FIELDS:
            limit, period = _FORM_FIELDS[name]
            out[limit] = "" if value is None else str(value["limit"])
            out[period] = "" if value is None else str(value["period_s"])
        else:
            out[name] = "" if value is None else str(value)
    return out


def _period(seconds: int) -> str:
    """A rate's period as an operator reads it: 10 s, 1 min, 2 h, 1 d."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _limits_text(limits: Mapping[str, Any] | None, running: int | None = None) -> str:
    """A limits body in words ("" for none): `running` is the queue's jobs
    held now, shown against its concurrency."""
    if not limits:
        return ""
    parts = []
    n = limits.get("concurrency")
    if n is not None:
        parts.append(
            f"concurrency {running}/{n} running" if running is not None else f"concurrency {n}"
        )
    n = limits.get("group_concurrency")
    if n is not None:
        parts.append(f"group concurrency {n}")
    for name, label in (("rate", "rate"), ("group_rate", "group rate")):
        rate = limits.get(name)
        if rate is not None:
            parts.append(f"{label} {rate['limit']} per {_period(rate['period_s'])}")
    return ", ".join(parts)


def _limits_brief(limits: Mapping[str, Any] | None, running: int) -> str:
    """The overview's Limits cell, from the stats' read alone."""
    text = _limits_text(limits, running)
    return h.e(text) if text else '<span class="muted">none</span>'


RESULT_SHOWN = 20_000
"""Characters of a completed job's result its page shows (a result is at
most bounds.MAX_RESULT_BYTES as compact JSON; pretty-printed it is longer)."""
RESULT_BRIEF = 120
"""Characters of a result a list shows."""


def _after_ids(text: str | None) -> list[str]:
    """A failed job's stored `after` (a JSON array, or NULL) as ids; text
    that is not one (written by something else) as none."""
    try:
        ids = json.loads(text) if text else []
    except ValueError:
        return []
    return [str(i) for i in ids] if isinstance(ids, list) else []


def _job_fields(found: JobView | FailedJob) -> dict[str, Any]:
    """What the job page shows of a job, wherever it is in its life."""
    if isinstance(found, FailedJob):
        return {
            **{k: found[k] for k in ("id", "queue", "name", "group", "attempts")},
            **{k: found[k] for k in ("max_attempts", "priority", "created_at", "failed_at")},
            "state": "failed",
            "error": found.error,
            "payload": stored_payload(found.payload),
            "after": _after_ids(found.after),
            "ignore_failed": False,
            "batch": found.batch,
        }
    job = found.job
    return {
        "id": job.id,
        "queue": job.queue,
        "name": job.name,
        "group": job.group,
        "state": found.state,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "created_at": job.created_at,
        "available_at": job.available_at,
        "reserved_until": job.reserved_until if found.state == "reserved" else None,
        "unique_key": job.unique_key,
        "last_error": job.last_error,
        "payload": job.payload,
        "completed_at": found.completed_at,
        "result": found.result,
        "after": list(job.after or []),
        "ignore_failed": found.ignore_failed,
        "batch": job.batch,
    }


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _cut(text: str, n: int) -> str:
    """`text` at most `n` characters, saying how much was left out."""
    if len(text) <= n:
        return text
    return f"{text[:n]}\n… ({len(text) - n} more characters not shown)"


def _brief(value: Any) -> str:
    """A result in a list: compact JSON, masked, cut short (not yet escaped)."""
    if value is None:
        return ""
    return _short(json.dumps(mask(value), ensure_ascii=False, sort_keys=True), RESULT_BRIEF)


def _badge(state: str) -> str:
    return f'<span class="badge {h.e(state)}">{h.e(state)}</span>'


def _job_link(id: str, base: str = "/ui/jobs/") -> str:
    return f'<a class="mono" href="{base}{h.q(id)}">{h.e(id)}</a>'


GONE = '<span class="muted" title="Cancelled, pruned or never queued">not kept</span>'
"""The state shown for an id found nowhere."""


def _linked(ids: list[str], states: Mapping[str, str], label: str) -> str:
    """A list of jobs, each a link to its page with its state."""
    items = "".join(
        f"<li>{_job_link(i)} {_badge(states[i]) if i in states else GONE}</li>" for i in ids
    )
    return f'<ul class="links" aria-label="{h.e(label)}">{items}</ul>'


def _workflow(after: list[str], links: Links) -> str:
    """The job page's dependencies (`after`) and dependents, each linked."""
    if not after and not links.dependents:
        return ""
    parts = ["<h2>Workflow</h2>"]
    if after:
        done = sum(links.states.get(i) == "completed" for i in after)
        parts.append(
            f"<h3>Waits for {len(after)} job{'s' if len(after) != 1 else ''} "
            f'<span class="muted">({done} completed)</span></h3>'
            + _linked(after, links.states, "Dependencies")
        )
    if links.dependents:
        more = (
            f'<p class="muted">Only the first {len(links.dependents)} are listed.</p>'
            if links.more_dependents
            else ""
        )
        parts.append(
            "<h3>Waited for by</h3>" + _linked(links.dependents, links.states, "Dependents") + more
        )
    return "".join(parts)


def _group(group: str | None) -> str:
    return h.e(group) if group is not None else '<span class="muted">—</span>'


NO_GROUP = '<span class="muted">no group</span>'
"""Jobs pushed without a group: Service.limits names them ""."""

SOURCES = {
    "api": "Set here or over the API (PUT /v1/queues/…/limits).",
    "code": "Declared in the Worker's code (Registry.limit); saving the form below replaces them.",
    "none": "None: drains claim this queue's jobs as fast as they run them.",
}


def _limits_usage(flow: Mapping[str, Any]) -> str:
    """The queue page's limits and their use now (Service.limits)."""
    limits, running = flow["limits"], flow["running"]
    source = h.e(SOURCES.get(flow["source"], ""))
    rows = []
    n = limits["concurrency"]
    rows.append(
        (
            "Concurrency",
            f"{running} of {n} running" if n is not None else f"no limit ({running} running)",
        )
    )
    n = limits["group_concurrency"]
    rows.append(("Per group", f"at most {n} running" if n is not None else "no limit"))
    for name, label in (("rate", "Rate"), ("group_rate", "Rate per group")):
        rate = limits[name]
        rows.append(
            (
                label,
                f"{rate['limit']} claims per {_period(rate['period_s'])}"
                if rate is not None
                else "no limit",
            )
        )
    props = "".join(f"<dt>{k}</dt><dd>{h.e(v)}</dd>" for k, v in rows)
    busiest = flow["running_by_group"]
    groups = ""
    if busiest:
        cap = limits["group_concurrency"]
        of = f" / {cap}" if cap is not None else ""
        cells = "".join(
            f'<tr><th scope="row">{h.e(g) if g else NO_GROUP}</th><td class="num">{k}{of}</td></tr>'
            for g, k in busiest.items()
        )
        groups = (
            '<div class="table-wrap narrow"><table><caption>Running now, busiest groups '
            'first</caption><thead><tr><th scope="col">Group</th>'
            f'<th scope="col" class="num">Running</th></tr></thead><tbody>{cells}</tbody>'
            "</table></div>"
        )
    return f'<p class="muted">{source}</p><dl class="props">{props}</dl>{groups}'


def _limits_form(request: Request, queue: str, limits: Mapping[str, Any], back: str) -> str:
    """The form changing the queue's limits, filled with those in force;
    sent, it asks to confirm (Pages.set_limits)."""
    values = _form_values(limits)
    lo, hi = LIMIT_RANGE
    plo, phi = PERIOD_RANGE
    labels = {
        "concurrency": "Concurrency",
        "group_concurrency": "Group concurrency",
        "rate_limit": "Rate: claims",
        "rate_period_s": "Rate: per seconds",
        "group_rate_limit": "Group rate: claims",
        "group_rate_period_s": "Group rate: per seconds",
    }
    fields = "".join(
        f'<div><label for="l-{name}">{label}</label>'
        f'<input type="number" id="l-{name}" name="{name}" value="{h.e(values[name])}" '
        f'min="{plo if name.endswith("period_s") else lo}" '
        f'max="{phi if name.endswith("period_s") else hi}" step="1" inputmode="numeric">'
        "</div>"
        for name, label in labels.items()
    )
    return (
        f'<form method="post" action="/ui/queues/{h.q(queue)}/limits" class="limits-form" '
        'aria-labelledby="limits-h">'
        f"{csrf_field(request)}{h.hidden('back', back)}"
        f'<div class="fields">{fields}</div>'
        f'<p class="muted">An empty field is no limit of that kind; a rate needs both its '
        f"claims ({lo} to {hi}) and its period ({plo} to {phi} seconds).</p>"
        '<div class="actions"><button type="submit">Change limits</button>'
        '<span class="muted">(you will be asked to confirm)</span></div></form>'
    )


def _origin(request: Request) -> str:
    """Where the API is, as a curl example shows it: the origin and the prefix."""
    host = request.headers.get("host", "")
    return f"{'https' if request.secure else 'http'}://{host}{request.base}"


def _short(text: str | None, n: int = 120) -> str:
    if not text:
        return ""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _pager(base: str, filters: Mapping[str, str], cursor: str, next_cursor: str | None) -> str:
    links = []
    if cursor:
        links.append(f'<a href="{h.e(base + h.qs(filters))}">« First page</a>')
    if next_cursor:
        links.append(
            f'<a href="{h.e(base + h.qs({**filters, "cursor": next_cursor}))}">Next page »</a>'
        )
    return f'<nav class="pager" aria-label="Pages">{"".join(links)}</nav>' if links else ""


def _chart(minutes: list[counters.Minute], now_ms: int) -> str:
    """The last hour as an SVG bar chart (no script, no inline style: the
    CSP allows neither), with its numbers in words for screen readers."""
    series = counters.per_minute(minutes, now_ms)
    completed = sum(m.completed for m in series)
    retried = sum(m.retried for m in series)
    failed = sum(m.failed for m in series)
    summary = f"{completed} completed, {retried} retried, {failed} failed in the last hour"
    if not completed and not retried and not failed:
        return (
            '<div class="empty"><p><strong>No jobs ran in the last hour.</strong> The chart '
            "fills in as cron runs drain jobs (each run records its counts).</p></div>"
        )
    top = max(m.completed + m.retried + m.failed for m in series) or 1
    width, height, bar = 600, 120, 10
    bars = []
    for i, m in enumerate(series):
        x = i * bar
        y = height
        for cls, n in (("c", m.completed), ("r", m.retried), ("f", m.failed)):
            if not n:
                continue
            tall = max(1, round(n / top * (height - 4)))
            y -= tall
            bars.append(
                f'<rect class="{cls}" x="{x + 1}" y="{y}" width="{bar - 2}" height="{tall}"/>'
            )
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height + 1}" role="img" '
        'aria-labelledby="chart-t"><title id="chart-t">'
        f"{h.e(summary)} (peak {top} a minute)</title>"
        f'<line class="axis" x1="0" y1="{height}" x2="{width}" y2="{height}"/>'
        f"{''.join(bars)}</svg>"
        '<ul class="legend"><li><span class="sw c"></span>completed</li>'
        '<li><span class="sw r"></span>retried</li><li><span class="sw f"></span>failed</li>'
        f"<li>{h.e(summary)}; peak {top} a minute; oldest minute on the left</li></ul>"
    )
