"""The drain: handlers, outcomes, timeouts, budgets and the report."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from d1queue import (
    Backoff,
    Config,
    ConfigError,
    D1Queue,
    Fail,
    JobContext,
    QueuedJob,
    Registry,
    Retry,
    drain,
)
from d1queue.interfaces.testing import SqliteD1

from .conftest import Clock

NO_JITTER = Backoff(base_s=10, factor=2, max_s=100, jitter=False)


class Monotonic:
    """A monotonic clock for the drain's time budget, moved by handlers."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def counting_registry(runs: Counter[Any], **opts: Any) -> Registry:
    reg = Registry()

    @reg.job("count", **opts)
    async def count(payload: Any) -> None:
        runs[payload] += 1

    return reg


async def test_a_drain_runs_every_job_once_and_reports(queue: D1Queue, db: SqliteD1) -> None:
    runs: Counter[Any] = Counter()
    for i in range(60):
        await queue.dispatch("count", i)
    report = await drain(queue, counting_registry(runs), Config(plan="paid", batch_size=25))
    assert runs == Counter(range(60))
    assert (report.claimed, report.completed, report.failed, report.stale) == (60, 60, 0, 0)
    assert report.stopped == "empty"
    # paused queues; round 1: SELECT, then its claim batch reading the next
    # round's candidates; rounds 2 and 3: the previous settle, the claims and
    # the next SELECT in one batch (round 3's finds the queue empty); the
    # last round's settle; the run's counters (stats.py).
    assert report.queries == 1 + 2 + 2 * 1 + 1 + 1
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == 0


async def test_outcomes_ack_retry_fail(queue: D1Queue, clock: Clock) -> None:
    reg = Registry()
    seen: list[tuple[str, int]] = []

    @reg.job("ok")
    async def ok(payload: Any, ctx: JobContext) -> None:
        seen.append(("ok", ctx.attempt))

    @reg.job("flaky", backoff=NO_JITTER)
    async def flaky(payload: Any, ctx: JobContext) -> None:
        seen.append(("flaky", ctx.attempt))
        raise RuntimeError("transient")

    @reg.job("later")
    async def later(payload: Any) -> None:
        raise Retry("not yet", delay_s=7)

    @reg.job("bad")
    async def bad(payload: Any) -> None:
        raise Fail("wrong input")

    for name in ("ok", "flaky", "later", "bad"):
        await queue.dispatch(name, max_attempts=2)
    report = await drain(queue, reg)
    assert (report.completed, report.retried, report.failed) == (1, 2, 1)
    flaky_job = await by_name(queue, "flaky")
    assert flaky_job.available_at == clock() + 10_000, "backoff after attempt 1"
    assert "RuntimeError: transient" in (flaky_job.last_error or "")
    later_job = await by_name(queue, "later")
    assert later_job.available_at == clock() + 7_000
    (failed,) = await queue.failed_jobs()
    assert failed.name == "bad" and "wrong input" in failed.error

    clock.advance(10)
    report = await drain(queue, reg)
    assert (report.retried, report.failed) == (0, 2), "second attempt of two: fail"
    errors = {f.name: f.error for f in await queue.failed_jobs()}
    assert "attempt 2 of 2" in errors["flaky"] and "not yet" in errors["later"]


async def by_name(queue: D1Queue, name: str) -> QueuedJob:
    found = await queue.binding.run("SELECT id FROM d1queue_jobs WHERE name = ?1", name)
    job = await queue.job(found.rows[0]["id"])
    assert job is not None
    return job


async def test_a_handler_that_times_out_is_retried(queue: D1Queue) -> None:
    reg = Registry()
    calls = 0

    @reg.job("slow", timeout_s=0.05, backoff=NO_JITTER)
    async def slow(payload: Any) -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(10)

    job_id = await queue.dispatch("slow")
    report = await drain(queue, reg)
    assert (calls, report.retried) == (1, 1)
    job = await queue.job(job_id)
    assert job is not None and job.reserved_until is None
    assert job.last_error == "timed out after 0.05s"


async def test_unknown_names_and_bad_payloads_fail_without_stopping_the_drain(
    queue: D1Queue, db: SqliteD1
) -> None:
    runs: Counter[Any] = Counter()
    await queue.dispatch("nobody.registered.this")
    bad = await queue.dispatch("count", 1)
    db.query("UPDATE d1queue_jobs SET payload = '{not json' WHERE id = ?", bad)
    await queue.dispatch("count", 2)
    report = await drain(queue, counting_registry(runs))
    assert runs == Counter([2])
    assert (report.completed, report.failed) == (1, 2)
    errors = sorted(f.error for f in await queue.failed_jobs())
    assert "no handler is registered for job name 'nobody.registered.this'" in errors[0]
    assert errors[1].startswith("undecodable payload")


@pytest.mark.parametrize("counts_as", ["query", "statements"])
async def test_the_drain_stops_at_its_query_budget_losing_nothing(
    queue: D1Queue, db: SqliteD1, counts_as: str
) -> None:
    runs: Counter[Any] = Counter()
    for i in range(200):
        await queue.dispatch("count", i)
    reg = counting_registry(runs)
    config = Config(plan="paid", query_budget=20, batch_size=10, batch_counts_as=counts_as)  # type: ignore[arg-type]
    report = await drain(queue, reg, config)
    assert report.stopped == "query_budget"
    spent = report.queries if counts_as == "query" else report.statements
    assert spent <= 20
    assert report.completed == report.claimed == sum(runs.values()) > 0
    assert max(runs.values()) == 1
    left = db.query("SELECT COUNT(*) AS n, MAX(reserved_at) AS r FROM d1queue_jobs")[0]
    assert left["n"] == 200 - report.completed and left["r"] is None, "nothing left claimed"
    # Later drains finish the rest, each job once.
    while (await drain(queue, reg, config)).claimed:
        pass
    assert runs == Counter(range(200))


async def test_the_drain_stops_at_its_time_budget_losing_nothing(
    queue: D1Queue, db: SqliteD1
) -> None:
    mono = Monotonic()
    runs: Counter[Any] = Counter()
    reg = Registry()

    @reg.job("tick", timeout_s=5)
    async def tick(payload: Any) -> None:
        runs[payload] += 1
        mono.t += 1.0  # each job "takes" a second of the budget

    for i in range(50):
        await queue.dispatch("tick", i)
    config = Config(plan="paid", time_budget_s=12, batch_size=5, query_budget=1000)
    report = await drain(queue, reg, config, monotonic=mono)
    assert report.stopped == "time_budget"
    assert report.claimed == 15, "three rounds of five started before 12 s had passed"
    assert report.completed == 15 and max(runs.values()) == 1
    assert (
        db.query("SELECT COUNT(*) AS n FROM d1queue_jobs WHERE reserved_at IS NULL")[0]["n"] == 35
    )


async def test_several_queues_are_drained(queue: D1Queue) -> None:
    runs: Counter[Any] = Counter()
    for q in ("a", "b", "c"):
        for i in range(3):
            await queue.dispatch("count", f"{q}{i}", queue=q)
    report = await drain(queue, counting_registry(runs), Config(plan="paid", queues=("a", "b")))
    assert report.completed == 6 and set(runs) == {"a0", "a1", "a2", "b0", "b1", "b2"}
    assert await queue.size("c") == 3


async def test_a_stale_settle_is_counted_not_applied(queue: D1Queue, clock: Clock) -> None:
    """A handler that outlives its lease (the lease was reclaimed and the job
    re-claimed meanwhile) must not clobber the new holder."""
    other = D1Queue(queue.binding, clock=clock)
    reg = Registry()

    @reg.job("long")
    async def long(payload: Any) -> None:
        clock.advance(queue.reservation_s + 1)
        await other.reclaim_expired()
        assert await other.reserve("default") is not None

    await queue.dispatch("long")
    report = await drain(queue, reg, Config(reservation_s=90))
    assert report.stale == 1 and report.completed == 0
    (row,) = (await queue.binding.run("SELECT reservation FROM d1queue_jobs")).rows
    assert row["reservation"] is not None, "still held by the second worker"


async def test_the_configured_lease_is_the_one_claims_get(queue: D1Queue, clock: Clock) -> None:
    reg = Registry()
    leases: list[int] = []

    @reg.job("long", timeout_s=200)
    async def long(payload: Any, ctx: JobContext) -> None:
        leases.append((ctx.job.reserved_until or 0) - clock())

    await queue.dispatch("long", None)
    report = await drain(queue, reg, Config(reservation_s=300))
    assert report.completed == 1 and leases == [300_000]


async def test_the_lease_must_cover_the_longest_job(db: SqliteD1) -> None:
    reg = Registry()

    @reg.job("x", timeout_s=89)
    async def x(payload: Any) -> None: ...

    with pytest.raises(ConfigError, match="must cover the longest job timeout"):
        await drain(D1Queue(db, reservation_s=90), reg, Config())


async def test_a_round_claims_only_what_can_finish_inside_the_lease(
    queue: D1Queue, clock: Clock
) -> None:
    """Batch 25 and 10 slots: jobs that may run 30 s end by 30, 60 and 90 s
    at the latest, the third ten waiting 60 s for a slot; with a 90 s lease
    and time to settle, a round claims 20. (With the defaults and
    http.request's 65 s, 10.)"""
    mono = Monotonic()
    reg = Registry()
    held: list[int] = []

    @reg.job("slow", timeout_s=30)
    async def slow(payload: Any, ctx: JobContext) -> None:
        held.append(ctx.job.reserved_until or 0)

    for i in range(25):
        await queue.dispatch("slow", i)
    report = await drain(queue, reg, Config(plan="paid", batch_size=25), monotonic=mono)
    assert report.claimed == 25 and report.rounds == 2
    assert (await queue.binding.run("SELECT COUNT(*) AS n FROM d1queue_jobs")).rows[0]["n"] == 0


async def test_two_drains_at_once_never_run_a_job_twice(shared_file: Any, clock: Clock) -> None:
    runs: Counter[Any] = Counter()
    reg = Registry()

    @reg.job("count")
    async def count(payload: Any) -> None:
        runs[payload] += 1
        await asyncio.sleep(0)

    a = D1Queue(SqliteD1(shared_file), clock=clock)
    b = D1Queue(SqliteD1(shared_file), clock=clock)
    for i in range(100):
        await a.dispatch("count", i)
    ra, rb = await asyncio.gather(
        drain(a, reg, Config(plan="paid", batch_size=10)),
        drain(b, reg, Config(plan="paid", batch_size=10)),
    )
    assert runs == Counter(range(100))
    assert ra.completed + rb.completed == 100 and ra.completed and rb.completed


def test_backoff_grows_caps_and_jitters() -> None:
    b = Backoff(base_s=1, factor=2, max_s=10, jitter=False)
    assert [b.delay_s(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert b.delay_s(10_000) == 10
    j = Backoff(base_s=8, factor=1, max_s=8)
    delays = {j.delay_s(1) for _ in range(50)}
    assert all(4 <= d <= 8 for d in delays) and len(delays) > 1


async def test_settings_can_be_given_as_keywords(queue: D1Queue) -> None:
    runs: Counter[Any] = Counter()
    for q in ("a", "b"):
        await queue.dispatch("count", q, queue=q)
    report = await drain(queue, counting_registry(runs), queues=["b"], batch_size=5)
    assert runs == Counter(["b"]) and report.completed == 1
    report = await drain(queue, counting_registry(runs), queues="a")
    assert runs == Counter(["a", "b"]) and report.completed == 1
    with pytest.raises(ConfigError):
        await drain(queue, counting_registry(runs), batch_size=0)
    with pytest.raises(TypeError):
        await drain(queue, counting_registry(runs), batch_sise=5)


def test_the_report_keeps_its_earlier_name_for_completed() -> None:
    from d1queue import DrainReport

    report = DrainReport(completed=3)
    assert report.succeeded == 3 == report.completed
