"""Cancelling a running job: the mark (202 cancelling), the watch a handler
declares, the end (cancelled, never run again, a failure for its waiters
and batch), what a cancel of an ended job says, and all of it under D1
faults, lost replies and a worker that died. Real SQLite."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from d1queue import Config, D1Queue, QueuedJob, Registry, drain
from d1queue.core.context import JobContext
from d1queue.core.outcomes import CANCELLED_ERROR, is_cancelled
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1

from .conftest import Clock
from .test_api import TOKEN, Client

PAID = Config(plan="paid")
WATCH = "SELECT cancel_at FROM"
MARK = "SET cancel_at = ?2"


class Gate:
    """A handler's run held open until the test lets it go: it says when it
    started, and how it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.go = asyncio.Event()
        self.runs = 0
        self.seen: list[str] = []


def jobs(gate: Gate) -> Registry:
    reg = Registry()

    @reg.job("watched", timeout_s=30, cancel_watch_s=1, subrequests=2)
    async def watched(payload: Any, ctx: JobContext) -> str:
        gate.runs += 1
        gate.started.set()
        try:
            await asyncio.sleep(25)
        except asyncio.CancelledError:
            gate.seen.append(f"cancelled, ctx.cancelled={ctx.cancelled}")
            raise
        return "finished"

    @reg.job("plain", timeout_s=30, max_attempts=5)
    async def plain(payload: Any) -> str:
        gate.runs += 1
        gate.started.set()
        await gate.go.wait()
        if payload == "fail":
            raise RuntimeError("it broke after the cancel")
        return "done"

    @reg.job("after", max_attempts=3)
    async def after(payload: Any) -> None:
        gate.seen.append("a waiter ran")

    return reg


def client(db: SqliteD1, queue: D1Queue, reg: Registry) -> Client:
    return Client(Api(Service(queue, reg), TOKEN, "9.9", SPEC), db)


def tables(db: SqliteD1) -> dict[str, list[Any]]:
    """Every row of the tables a cancel could touch."""
    names = ("d1queue_jobs", "d1queue_failed_jobs", "d1queue_batches", "d1queue_deps")
    return {t: [dict(r) for r in db.query(f"SELECT * FROM {t}")] for t in names}


def statements(db: SqliteD1, text: str) -> int:
    return sum(text in s for s in db.statements)


async def test_a_watched_job_is_cancelled_while_it_runs_and_never_runs_again(
    db: SqliteD1, queue: D1Queue
) -> None:
    gate = Gate()
    reg = jobs(gate)
    api = client(db, queue, reg)
    job_id = await queue.dispatch("watched", None)
    waiter = await queue.push(QueuedJob.new("after", None, after=[job_id]))
    running = asyncio.create_task(drain(queue, reg, PAID))
    await gate.started.wait()
    assert (await api("GET", f"/v1/jobs/{job_id}")).body["state"] == "reserved"

    r = await api("DELETE", f"/v1/jobs/{job_id}")
    assert (r.status, r.body) == (202, {"id": job_id, "cancelled": False, "state": "cancelling"})
    again = await api("DELETE", f"/v1/jobs/{job_id}")
    assert again.status == 202, "a re-sent cancel says the same"
    (row,) = db.query("SELECT cancel_at FROM d1queue_jobs WHERE id = ?", job_id)
    assert row["cancel_at"] == queue.clock(), "marked once"
    assert (await api("GET", f"/v1/jobs/{job_id}")).body["state"] == "cancelling"

    report = await running
    assert gate.seen == ["cancelled, ctx.cancelled=True"], "CancelledError in the handler"
    assert (report.failed, report.completed, report.retried) == (1, 0, 0)
    assert statements(db, WATCH) >= 1, "the watch found the mark"
    view = (await api("GET", f"/v1/jobs/{job_id}")).body
    assert view["state"] == "cancelled" and view["error"].startswith(CANCELLED_ERROR)
    # Counted as a failure by its waiter, which then fails without running.
    (row,) = db.query("SELECT waiting, last_error FROM d1queue_jobs WHERE id = ?", waiter)
    assert (row["waiting"], row["last_error"]) == (-1, f"dependency {job_id} failed")
    queue.clock.advance(3600)  # type: ignore[attr-defined]
    await drain(queue, reg, PAID)
    assert gate.runs == 1, "never run again"
    assert "a waiter ran" not in gate.seen
    assert (await api("GET", f"/v1/jobs/{waiter}")).body["state"] == "failed"
    ended = await api("DELETE", f"/v1/jobs/{job_id}")
    assert (ended.status, ended.body["error"]["code"]) == (409, "ended")
    assert ended.body["error"]["state"] == "cancelled"


async def test_each_watch_is_a_subrequest_of_the_jobs_own_plan() -> None:
    gate = Gate()
    spec = jobs(gate).get("watched")
    assert spec is not None and spec.cancel_watch_s == 1.0
    assert spec.watches == 29, "one a second while it may run (timeout 30 s)"
    assert spec.subrequests == 2 + 29, "declared: its own 2, and its watches"
    plain = jobs(gate).get("plain")
    assert plain is not None and (plain.watches, plain.subrequests) == (0, 0)


@pytest.mark.parametrize("every", [0, 0.5, 30, 31, True, "5"])
def test_a_watch_interval_is_at_least_a_second_and_under_the_timeout(every: Any) -> None:
    async def handler(payload: Any) -> None: ...

    with pytest.raises(ValueError, match="cancel_watch_s"):
        Registry().register("j", handler, timeout_s=30, cancel_watch_s=every)


async def test_a_job_declaring_no_watch_sends_none_and_its_completion_stands(
    db: SqliteD1, clock: Clock
) -> None:
    queue = D1Queue(db, clock=clock, keep_completed=True)
    gate = Gate()
    reg = jobs(gate)
    api = client(db, queue, reg)
    job_id = await queue.dispatch("plain", None)
    running = asyncio.create_task(drain(queue, reg, PAID))
    await gate.started.wait()
    assert (await api("DELETE", f"/v1/jobs/{job_id}")).status == 202
    gate.go.set()
    report = await running
    assert report.completed == 1, "it ended before its drain could know: completion stands"
    assert statements(db, WATCH) == 0, "a job that declares no watch pays for none"
    view = (await api("GET", f"/v1/jobs/{job_id}")).body
    assert view["state"] == "completed" and view["result"] == "done"
    r = await api("DELETE", f"/v1/jobs/{job_id}")
    assert (r.status, r.body["error"]["state"]) == (409, "completed")


async def test_a_marked_job_that_fails_is_not_retried_but_ends_cancelled(
    db: SqliteD1, queue: D1Queue
) -> None:
    gate = Gate()
    reg = jobs(gate)
    api = client(db, queue, reg)
    job_id = await queue.dispatch("plain", "fail")
    running = asyncio.create_task(drain(queue, reg, PAID))
    await gate.started.wait()
    assert (await api("DELETE", f"/v1/jobs/{job_id}")).status == 202
    gate.go.set()
    assert (await running).retried == 1, "its handler asked for a retry"
    (row,) = db.query("SELECT available_at, locked_until FROM d1queue_jobs WHERE id = ?", job_id)
    lease_end = queue.clock() + queue.reservation_s * 1000
    assert (row["available_at"], row["locked_until"]) == (lease_end, lease_end), (
        "due at its lease's end, not after its backoff"
    )
    queue.clock.advance(queue.reservation_s)  # type: ignore[attr-defined]
    report = await drain(queue, reg, PAID)
    assert (report.failed, gate.runs) == (1, 1), "ended at its next claim, without running"
    view = (await api("GET", f"/v1/jobs/{job_id}")).body
    assert view["state"] == "cancelled" and "it broke after the cancel" in view["error"]


async def test_a_job_whose_worker_died_is_ended_cancelled_by_the_next_claim(
    db: SqliteD1, queue: D1Queue, clock: Clock
) -> None:
    """A killed host: the job stays held until its lease lapses. The mark
    survives, and the claim that takes the job over ends it cancelled,
    through lost replies of the cancel, the claim and the settle."""
    gate = Gate()
    reg = jobs(gate)
    api = client(db, queue, reg)
    job_id = await queue.dispatch("plain", None)
    batch_id, (member,) = await queue.batch([QueuedJob.new("plain", None)])
    (held,) = await queue.reserve_batch("default", 1)  # the worker that then dies
    (held_member,) = await queue.reserve_batch("default", 1)
    assert {held.id, held_member.id} == {job_id, member}
    db.lose_reply_when(MARK, times=2)
    for id in (job_id, member):
        r = await api("DELETE", f"/v1/jobs/{id}")
        assert (r.status, r.body["state"]) == (202, "cancelling"), "lost replies re-sent"
    clock.advance(queue.reservation_s + 1)
    db.lose_reply_when("UPDATE d1queue_jobs SET band", times=1)  # the claim
    db.lose_reply_when("INSERT OR REPLACE INTO d1queue_failed_jobs", times=1)  # the settle
    report = await drain(queue, reg, PAID)
    assert gate.runs == 0, "a marked job is never run again"
    assert report.failed == 2 and not report.unsettled
    failed = db.query("SELECT id, error FROM d1queue_failed_jobs")
    assert sorted(f["id"] for f in failed) == sorted([job_id, member]), "each recorded once"
    assert all(is_cancelled(f["error"]) for f in failed)
    assert db.query("SELECT id FROM d1queue_jobs WHERE id IN (?, ?)", job_id, member) == []
    batch = (await api("GET", f"/v1/batches/{batch_id}")).body
    assert (batch["failed"], batch["pending"]) == (1, 0), "its batch counts it failed"
    await drain(queue, reg, PAID)
    assert gate.runs == 0


async def test_a_failing_watch_costs_the_job_nothing(db: SqliteD1, queue: D1Queue) -> None:
    """D1 refusing every watch: the handler runs to its end and its outcome
    stands (a watch is never the handler's refusal)."""
    reg = Registry()
    done: list[int] = []

    @reg.job("slow", timeout_s=10, cancel_watch_s=1)
    async def slow(payload: Any) -> None:
        await asyncio.sleep(1.5)
        done.append(1)

    await queue.dispatch("slow", None)
    db.fail_when(WATCH, times=None)
    report = await drain(queue, reg, PAID)
    assert (report.completed, done) == (1, [1])


async def test_a_cancel_of_an_ended_or_unknown_job_changes_nothing_and_says_so(
    db: SqliteD1, clock: Clock
) -> None:
    queue = D1Queue(db, clock=clock, keep_completed=True)
    reg = Registry()

    @reg.job("ok")
    async def ok(payload: Any) -> int:
        return 7

    @reg.job("bad", max_attempts=1)
    async def bad(payload: Any) -> None:
        raise RuntimeError("no")

    api = client(db, queue, reg)
    done = await queue.dispatch("ok", None)
    failed = await queue.push(QueuedJob.new("bad", None, max_attempts=1))
    report = await drain(queue, reg, PAID)
    assert (report.completed, report.failed) == (1, 1), report
    queued = await queue.dispatch("ok", None)
    before = tables(db)
    for id, state in ((done, "completed"), (failed, "failed")):
        r = await api("DELETE", f"/v1/jobs/{id}")
        assert r.status == 409, r.body
        assert (r.body["error"]["code"], r.body["error"]["state"]) == ("ended", state)
    assert (await api("DELETE", "/v1/jobs/nope")).status == 404
    assert (await api("DELETE", "/v1/jobs/..")).status in (400, 404)
    assert tables(db) == before, "nothing written"
    assert (await api("GET", f"/v1/jobs/{queued}")).body["state"] == "ready"
    r = await api("DELETE", f"/v1/jobs/{queued}")
    assert (r.status, r.body) == (200, {"id": queued, "cancelled": True}), "as before"


async def test_the_mark_is_one_row_written_and_a_plain_settle_pays_nothing(
    db: SqliteD1, queue: D1Queue
) -> None:
    """The job path of a job no cancel touched sends the statements it
    sent before: no watch, no mark; the RETRY it may send reads the one row
    it writes."""
    gate = Gate()
    reg = jobs(gate)
    api = client(db, queue, reg)
    await queue.dispatch("plain", None)
    gate.go.set()
    await drain(queue, reg, PAID)
    assert statements(db, WATCH) == 0 and statements(db, MARK) == 0
    job_id = await queue.dispatch("plain", None)
    await queue.reserve_batch("default", 1)
    before = tables(db)
    assert (await api("DELETE", f"/v1/jobs/{job_id}")).status == 202
    after = tables(db)
    changed = [
        (t, a) for t in before for a in after[t] if a not in before[t]
    ]  # the rows that differ: the job's own, marked
    assert [(t, a["id"], a["cancel_at"]) for t, a in changed] == [
        ("d1queue_jobs", job_id, queue.clock())
    ]
    assert len(after["d1queue_jobs"]) == len(before["d1queue_jobs"])


def test_http_request_watches_within_a_free_plans_room_for_four() -> None:
    from d1queue.core.bounds import MAX_REDIRECTS
    from d1queue.core.costs import round_cost
    from d1queue.features.http_request import CANCEL_WATCH_S, JOB_NAME, register_http_job

    reg = Registry()
    register_http_job(reg)
    spec = reg.get(JOB_NAME)
    assert spec is not None and spec.cancel_watch_s == CANCEL_WATCH_S
    assert spec.subrequests == 1 + MAX_REDIRECTS + spec.watches == 10
    free = Config()
    assert round_cost(4, 0, 1, 1) + 4 * spec.subrequests <= free.budget - free.stats_reserve


async def test_a_queues_listing_says_cancelling_as_the_job_view_does(
    db: SqliteD1, queue: D1Queue
) -> None:
    from d1queue.store import sql

    gate = Gate()
    api = client(db, queue, jobs(gate))
    marked = await queue.dispatch("plain", None)
    other = await queue.dispatch("plain", None)
    await queue.reserve_batch("default", 2)
    assert (await api("DELETE", f"/v1/jobs/{marked}")).status == 202

    def listed(state: str) -> list[str]:
        rows = db.query(
            sql.LIST_QUEUE_JOBS, "default", 10**6, 0, "", "", state, queue.clock(), 51, 1 << 22
        )
        return [r["id"] for r in rows]

    assert listed("cancelling") == [marked]
    assert listed("reserved") == [other]


async def test_a_job_cancelled_while_it_ran_is_counted_and_kept_as_cancelled(
    db: SqliteD1, clock: Clock
) -> None:
    """Its metrics count it cancelled (and observe its run), its attempt in
    the failure's history says cancelled, and its process line too."""
    queue = D1Queue(db, clock=clock, metrics=True)
    gate = Gate()
    reg = jobs(gate)
    api = client(db, queue, reg)
    job_id = await queue.dispatch("watched", None)
    running = asyncio.create_task(drain(queue, reg, PAID))
    await gate.started.wait()
    assert (await api("DELETE", f"/v1/jobs/{job_id}")).status == 202
    await running
    (row,) = db.query(
        "SELECT completed, retried, failed, cancelled, r0 + r1 + r2 + r3 + r4 + r5 + r6 + r7 + "
        "r8 + r9 + r10 + r11 + r12 + r13 + r14 + r15 + r16 + r17 + r18 + r19 + r20 + r21 AS ran "
        "FROM d1queue_metrics WHERE period = 0 AND name = 'watched'"
    )
    assert dict(row) == {"completed": 0, "retried": 0, "failed": 0, "cancelled": 1, "ran": 1}
    view = (await api("GET", f"/v1/jobs/{job_id}")).body
    assert view["state"] == "cancelled"
    assert [r["outcome"] for r in view["runs"]] == ["cancelled"]
