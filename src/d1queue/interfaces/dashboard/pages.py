"""The dashboard's pages and the actions behind their forms: what each
reads and does. The overview, a queue (and its flow limits), its completed
jobs, a job (with its dependencies, dependents and batch), a batch, the
batches index, the failed jobs, the schedules and a schedule (its last runs,
Run now, Edit), the metrics (charts and job names), the search, the jobs
running now; the bulk actions and their audit log are bulk.py's
(BulkPages), whose forms the search and the lists carry.

Each handler gets a request the dashboard already admitted (auth.py):
signed in, and for an action carrying the session's CSRF token. It checks
its input, reads what its page shows (a `*Shown`), and answers with its
page's sections (queues.py, jobs.py, failed.py, schedules.py, built of
parts.py's parts): a new section is a function added to its page's tuple;
a new page is a handler here, a route in app.py and a tuple of sections.
Input is checked before anything is written; a bad value is a 400 page
that says what was wrong (422 for limits, as the API answers the same
body). Payloads are shown with their secrets masked (mask.py), error texts
scrubbed of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...core.bounds import STORED_ID_PATTERN, STORED_NAME_RULE, is_stored_name
from ...core.schedule import DEFAULT_TZ
from ...store.bulk import RUN_ID, new_run_id
from ...store.dashboard import FIRST, PAGE, STATES, Store
from ..router import Reply
from ..service import ApiError, Service
from . import html as h
from .auth import safe_back
from .batches import BATCHES, BatchesShown
from .bulk import BulkPages, completed_bulk, failed_bulk, queue_bulk, search_bulk
from .failed import AGES, FAILED, FailedShown, age_range, confirm_bulk
from .jobs import (
    BATCH,
    BATCH_GONE,
    JOB,
    JOB_GONE,
    BatchShown,
    JobShown,
    shown_fields,
)
from .limits import confirm_limits, limits_of_form
from .metrics import DEFAULT_SORT, METRICS, SORTS, WINDOW_LABELS, MetricsShown
from .parts import not_found, page, render, with_notice
from .queues import COMPLETED, OVERVIEW, QUEUE, CompletedShown, OverviewShown, QueueShown
from .request import Refused, Request, known, redirect
from .running import RUNNING, RunningShown
from .schedules import SCHEDULE, SCHEDULES, SCHEDULES_PAGE, ScheduleShown, SchedulesShown
from .search import MAX_QUERY, SEARCH, SearchShown, parse

RUN_NONCE = re.compile(r"[0-9a-f]{32}")
"""A Run now form's job id (job.new_id, made by the page)."""


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


@contextmanager
def unreadable_as_400() -> Iterator[None]:
    """A cursor or page number the store cannot read (its ValueError) as a
    400 page saying why."""
    try:
        yield
    except ValueError as exc:
        raise Refused(400, str(exc)) from None


class Pages:
    """The pages and actions over one Service and its dashboard Store."""

    def __init__(self, service: Service, store: Store) -> None:
        self.service, self.store = service, store
        self.bulk_pages = BulkPages(store)

    # -- the queues -------------------------------------------------------------

    async def overview(self, request: Request) -> Reply:
        known(request)
        queues = await self.service.admin.stats()
        chart, done = await self.store.counters(request.now_ms)
        shown = OverviewShown(request, queues, chart, done)
        return page(request, "Overview", render(shown, OVERVIEW), current="/ui")

    async def queue_page(self, request: Request, queue: str) -> Reply:
        check_name("queue", queue)
        known(request, "state", "name", "cursor")
        state, name, cursor = request.param("state"), request.param("name"), request.param("cursor")
        if state and state not in STATES:
            raise Refused(400, f"state must be one of {', '.join(STATES)} (or empty for all).")
        if name:
            check_name("job", name)
        (stats,) = await self.service.admin.stats(queue)
        with unreadable_as_400():
            jobs = await self.store.queue_jobs(queue, state=state, name=name, cursor=cursor or None)
        flow = await self.service.limits(queue)  # one round trip (a shard each)
        shown = QueueShown(request, queue, state, name, cursor, stats, jobs, flow)
        return page(request, f"Queue {queue}", render(shown, (*QUEUE, queue_bulk)))

    async def completed_page(self, request: Request, queue: str) -> Reply:
        """A queue's completed jobs kept as history, newest first, a page at a
        time (cursor paging, one query a shard), with their results masked
        and cut short."""
        check_name("queue", queue)
        known(request, "cursor")
        cursor = request.param("cursor")
        with unreadable_as_400():
            jobs = await self.store.completed(queue, cursor or None)
        shown = CompletedShown(request, queue, cursor, jobs, self.service.keeps_history(queue))
        return page(
            request, f"Completed jobs of {queue}", render(shown, (*COMPLETED, completed_bulk))
        )

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
        back = safe_back(request.field("back"), f"/ui/queues/{h.q(queue)}", "back")
        limits = limits_of_form(request)
        if request.field("confirm") != "yes":
            now = await self.service.limits(queue)
            return page(request, "Confirm", confirm_limits(request, queue, limits, now, back))
        await self.service.set_limits(queue, limits.as_dict())
        return redirect(with_notice(back, "limits_set"))

    async def pause(self, request: Request, queue: str) -> Reply:
        return await self._set_paused(request, queue, True)

    async def resume(self, request: Request, queue: str) -> Reply:
        return await self._set_paused(request, queue, False)

    # -- metrics ----------------------------------------------------------------

    async def metrics_page(self, request: Request) -> Reply:
        """Charts and the job names' table for a window, every queue or one,
        every job name or one: one read of the stored metrics (one round
        trip a shard, as GET /v1/metrics), whatever the number of jobs."""
        known(request, "window", "queue", "name", "sort")
        window = request.param("window") or "1h"
        queue, name = request.param("queue"), request.param("name")
        sort = request.param("sort") or DEFAULT_SORT
        if window not in WINDOW_LABELS:
            raise Refused(400, f"window must be one of {', '.join(WINDOW_LABELS)}.")
        if queue:
            check_name("queue", queue)
        if name:
            check_name("job", name)
        if sort.lstrip("-") not in SORTS or sort.count("-") > 1:
            keys = ", ".join(SORTS)
            raise Refused(400, f"sort is one of {keys}, or one of them after '-' (descending).")
        read = await self.service.metrics_window(window, queue or None, name or None)
        shown = MetricsShown(request, window, queue, name, sort, read)
        return page(request, "Metrics", render(shown, METRICS), current="/ui/metrics")

    # -- search -----------------------------------------------------------------

    async def search(self, request: Request) -> Reply:
        """The search box's answer (search.py): an id's job or batch (a
        point read each, at most two), a batch's page, or a page of the
        jobs matching (one query a shard, reading at most SEARCH_ROWS
        rows each)."""
        known(request, "q", "cursor")
        q = " ".join(request.param("q").split())
        cursor = request.param("cursor")
        if len(q) > MAX_QUERY:
            raise Refused(400, f"A search is at most {MAX_QUERY} characters.")
        if cursor and not STORED_ID_PATTERN.fullmatch(cursor):
            raise Refused(400, "the page cursor is not one this dashboard made")
        query = parse(q)
        if q and not cursor and not query.fields and STORED_ID_PATTERN.fullmatch(q):
            if await self.store.job(q) is not None:
                return redirect(f"/ui/jobs/{h.q(q)}")
            if await self.store.batch(q) is not None:
                return redirect(f"/ui/batches/{h.q(q)}")
        if list(query.fields) == ["batch"] and not query.text and not query.problem:
            return redirect(f"/ui/batches/{h.q(query.fields['batch'])}")
        found = None
        if q and not query.problem:
            found = await self.store.search(query.source, query.filters(), cursor or FIRST)
        shown = SearchShown(request, q, query, cursor, found)
        return page(request, "Search", render(shown, (SEARCH[0], search_bulk, *SEARCH[1:])))

    # -- running now ------------------------------------------------------------

    async def running_page(self, request: Request) -> Reply:
        """Every job held now, across queues, a page at a time: one batch a
        shard, reading at most RUNNING_ROWS rows of its locked band twice."""
        known(request, "cursor")
        cursor = request.param("cursor")
        with unreadable_as_400():
            found = await self.store.running(cursor or None)
        shown = RunningShown(request, cursor, found)
        return page(request, "Running now", render(shown, RUNNING), current="/ui/running")

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
            return not_found(request, "Job", id, JOB_GONE)
        job = shown_fields(found)
        links = await self.store.links(id, job["after"])
        return page(request, f"Job {id}", render(JobShown(request, id, job, links), JOB))

    async def batch_page(self, request: Request, id: str) -> Reply:
        """A batch's progress (its counters, state and times, a progress
        bar), its jobs' ids a page at a time with their states, and its
        callback jobs. Two round trips: the batch, then the states."""
        check_id(id)
        known(request, "page")
        text = request.param("page") or "1"
        if not re.fullmatch(r"[1-9][0-9]{0,5}", text):
            raise Refused(400, f"page is a number from 1; {text!r} is not.")
        with unreadable_as_400():
            found = await self.store.batch(id, int(text))
        if found is None:
            return not_found(request, "Batch", id, BATCH_GONE)
        return page(request, f"Batch {id}", render(BatchShown(request, id, found), BATCH))

    async def batches_page(self, request: Request) -> Reply:
        """Every batch, newest first, a page at a time after a keyset cursor:
        one query a shard (sql.LIST_BATCHES), reading about two rows a
        batch listed, however many batches are kept."""
        known(request, "cursor")
        cursor = request.param("cursor")
        with unreadable_as_400():
            found = await self.store.batches(cursor or None)
        shown = BatchesShown(request, cursor, found)
        return page(request, "Batches", render(shown, BATCHES), current="/ui/batches")

    async def cancel(self, request: Request, id: str) -> Reply:
        check_id(id)
        job = await self.service.job(id)  # 404 if gone
        # Back where the button was (Running now), else the job's queue.
        back = safe_back(request.field("back"), f"/ui/queues/{h.q(job['queue'])}", "back")
        # A job a worker took meanwhile is marked, and its drain ends it.
        done = await self.service.cancel(id)  # 409 if it ended meanwhile
        notice = "cancelled" if done["cancelled"] else "cancelling"
        return redirect(with_notice(back, notice))

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
        since, before = age_range(age, request.now_ms)
        with unreadable_as_400():
            jobs = await self.store.failed(
                queue=queue,
                name=name,
                error=error,
                since_ms=since,
                before_ms=before,
                cursor=cursor or None,
            )
        shown = FailedShown(request, queue, name, error, age, cursor, jobs)
        return page(
            request, "Failed jobs", render(shown, (*FAILED, failed_bulk)), current="/ui/failed"
        )

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
        if request.field("confirm") != "yes":
            return page(request, "Confirm", confirm_bulk(request, action, ids, back))
        # A bulk action on a selection (bulk.py), in the audit log: the run's
        # id comes from the confirmation, so the confirmation sent again
        # finds its run done and does nothing twice (without one, as a form
        # from before the log sends it, each send is a run of its own).
        run_id = request.field("run")
        if run_id and not RUN_ID.fullmatch(run_id):
            raise Refused(400, "The confirmation's run id is malformed.")
        done = await self.bulk_pages.selection(
            request, run_id or new_run_id(), action, "failed", ids
        )
        return redirect(with_notice(back, "retried" if action == "retry" else "removed", done))

    # -- schedules --------------------------------------------------------------

    async def schedules_page(self, request: Request) -> Reply:
        known(request, "cursor")
        cursor = request.param("cursor") or None
        if cursor is not None:
            check_name("schedule id", cursor)
        found = await self.service.schedules(SCHEDULES_PAGE, cursor)
        runs = await self.service.schedule_runs([s["id"] for s in found["schedules"]])
        shown = SchedulesShown(request, cursor, found, runs)
        return page(request, "Schedules", render(shown, SCHEDULES), current="/ui/schedules")

    async def schedule_page(self, request: Request, id: str) -> Reply:
        """A schedule, its last runs, Run now, and (an API one's) edit form:
        two reads, each one query a shard (the schedule, its runs)."""
        check_name("schedule id", id)
        known(request)
        try:
            schedule = await self.service.schedule(id)
        except ApiError as exc:
            if exc.status != 404:
                raise
            why = "<strong>There is no such schedule:</strong> it never existed or was deleted."
            return not_found(request, "Schedule", id, why)
        runs = (await self.service.schedule_runs([id])).get(id, [])
        shown = ScheduleShown(request, schedule, runs)
        return page(request, f"Schedule {id}", render(shown, SCHEDULE), current="/ui/schedules")

    async def run_schedule(self, request: Request, id: str) -> Reply:
        """Push the schedule's job once now, under the job id the page made
        (`run`): the same click sent again pushes nothing more."""
        check_name("schedule id", id)
        nonce = request.field("run")
        if not RUN_NONCE.fullmatch(nonce):
            raise Refused(400, "The Run now form was not one this dashboard made; reload it.")
        back = safe_back(request.field("back"), f"/ui/schedules/{h.q(id)}", "back")
        done = await self.service.run_schedule_now(id, nonce)
        return redirect(
            with_notice(back, "schedule_run" if done["pushed"] else "schedule_run_again")
        )

    async def edit_schedule(self, request: Request, id: str) -> Reply:
        """Change an API schedule's cron, time zone and payload by the API's
        own rules (Service.edit_schedule): a value they refuse is an error
        page saying which, and nothing is written. An empty time zone is
        UTC, as the API's default; an empty payload keeps the payload."""
        check_name("schedule id", id)
        cron, tz, text = request.field("cron"), request.field("tz"), request.field("payload")
        payload: Any
        if text.strip():
            try:
                payload = json.loads(text)
            except (ValueError, RecursionError) as exc:
                raise Refused(
                    422, f"Nothing was changed: the payload is not JSON ({exc})."
                ) from None
        else:
            payload = (await self.service.schedule(id)).get("payload")
        try:
            await self.service.edit_schedule(id, cron, tz.strip() or DEFAULT_TZ, payload)
        except ApiError as exc:
            if exc.status == 404:
                raise
            raise Refused(exc.status, f"Nothing was changed: {exc.message}.") from None
        return redirect(with_notice(f"/ui/schedules/{h.q(id)}", "schedule_edited"))

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
