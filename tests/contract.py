"""The D1Queue contract: behaviour every D1 binding must give the driver.

Plain async functions `case_*(db, clock)` with bare asserts and no pytest, so
the same cases run under CPython against SqliteD1 (tests/test_contract.py)
and inside Pyodide against Miniflare's D1 through the workers SDK
(tests/runtime/test_contract_runtime.py), as one storage suite runs against
every backend. Each case starts from empty tables. Assertions hold however
concurrent calls interleave: real I/O orders them differently every run.
A lost reply (D1 committed, the answer never came) is made by LostReplies,
which wraps whichever binding the driver calls, so those cases run
everywhere too.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Any

from d1queue import BatchNotRunning, D1Queue, Fail, Outcome, QueuedJob, Registry, Retry, drain
from d1queue.core.config import Config
from d1queue.core.flow import Limits, Rate
from d1queue.store import sql
from d1queue.store.claim import claim_round


class Clock:
    """Epoch milliseconds that only move when a case says so."""

    def __init__(self, ms: int = 1_700_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += round(seconds * 1000)


async def fresh(db: Any, clock: Clock, **options: Any) -> D1Queue:
    """A D1Queue (`options` as D1Queue takes them) on empty tables."""
    queue = D1Queue(db, clock=clock, **options)
    await queue.binding.batch(
        [
            ("DELETE FROM d1queue_jobs", ()),
            ("DELETE FROM d1queue_failed_jobs", ()),
            ("DELETE FROM d1queue_flow", ()),
            ("DELETE FROM d1queue_queues", ()),
            ("DELETE FROM d1queue_deps", ()),
            ("DELETE FROM d1queue_batches", ()),
            ("DELETE FROM d1queue_batch_parts", ()),
            ("DELETE FROM d1queue_metrics", ()),
        ]
    )
    return queue


async def batch_state(queue: D1Queue, batch: str) -> dict[str, Any] | None:
    """Batch `batch`'s progress as the API answers it (None: no such batch)."""
    found = await queue.workflows.batch(batch)
    return None if found is None else found.as_dict(ids=True)


async def rows(queue: D1Queue, table: str = "d1queue_jobs") -> list[dict[str, Any]]:
    return (await queue.binding.run(f"SELECT * FROM {table} ORDER BY id")).rows


# -- the seed's behaviours ---------------------------------------------------------


async def case_a_queued_job_round_trips_through_a_row(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    payload = {"to": "a@b.c", "n": [1, 2.5, None, True], "s": "ünïcode"}
    job_id = await queue.push(QueuedJob.new("t.ping", payload, queue="mail", at_ms=clock()))
    back = await queue.job(job_id)
    assert back is not None
    assert (back.queue, back.name, back.payload, back.max_attempts) == (
        "mail",
        "t.ping",
        payload,
        3,
    )
    assert back.reservation is None and back.unique_key is None
    assert back.available_at == back.created_at == clock()


async def case_reserving_takes_only_free_available_jobs(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    held = await queue.dispatch("t")
    got = await queue.reserve("default")
    assert got is not None and got.id == held and got.attempts == 1
    await queue.dispatch("t", delay_s=60)
    await queue.dispatch("t", queue="other")
    assert await queue.reserve("default") is None, "reserved, delayed or elsewhere"
    clock.advance(60)
    assert await queue.reserve("default") is not None, "the delay has passed"


async def case_acknowledge_release_fail(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    for i in range(3):
        await queue.dispatch("t", i)
    a, b, c = await queue.reserve_batch("default", 3)
    assert await queue.complete(a) is True
    assert await queue.retry(b, 30, "try later") is True
    assert await queue.fail(c, "exploded") is True
    (left,) = await rows(queue)
    assert left["id"] == b.id and left["reserved_at"] is None
    # The token stays until the next claim, so a re-sent release still matches.
    assert left["reservation"] == b.reservation
    # A retry waits in the locked band, keyed by its retry time.
    assert left["locked_until"] == clock() + 30_000 and left["last_error"] == "try later"
    assert left["available_at"] == clock() + 30_000 and left["band"] == sql.LOCKED_BAND
    assert (await queue.job(b.id)).available_at == clock() + 30_000  # type: ignore[union-attr]
    assert await queue.reserve("default") is None, "not before its retry time"
    clock.advance(30)
    again = await queue.reserve("default")
    assert again is not None and again.id == b.id and again.attempts == 2
    (failed,) = await queue.failed_jobs()
    assert (failed.id, failed.error, failed.attempts, failed.payload) == (c.id, "exploded", 1, "2")


async def case_size_counts_only_unreserved_jobs(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    for _ in range(7):
        await queue.dispatch("t")
    await queue.dispatch("t", delay_s=60)
    assert await queue.size("default") == 8
    await queue.reserve("default")
    assert await queue.size("default") == 7
    assert await queue.clear("default") == 8, "reserved jobs too"
    assert await queue.size("default") == 0


async def case_reclaim_frees_lapsed_leases_only(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    await queue.dispatch("t")
    await queue.dispatch("t")
    assert await queue.reserve("default") is not None
    clock.advance(queue.reservation_s - 1)
    assert await queue.reclaim_expired() == 0
    assert await queue.reserve("default") is not None
    clock.advance(2)
    assert await queue.reclaim_expired() == 1
    again = await queue.reserve("default")
    assert again is not None and again.attempts == 2
    assert "lease expired" in (again.last_error or "")


# -- beyond the seed ------------------------------------------------------------------


async def case_a_claim_takes_over_a_lapsed_lease(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    await queue.dispatch("t")
    first = await queue.reserve("default")
    assert first is not None
    clock.advance(queue.reservation_s - 1)
    assert await queue.reserve("default") is None, "still held"
    clock.advance(2)
    won, _ = await claim_round(queue, "default", 5)
    assert [j.id for j in won] == [first.id] and won[0].attempts == 2
    assert won[0].held, "counted as reclaimed"
    assert "lease expired" in (won[0].last_error or "")
    assert await queue.complete(first) is False, "the first holder is fenced off"
    assert await queue.complete(won[0]) is True


async def case_a_long_retry_moves_out_of_the_way(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    await queue.dispatch("t")
    job = await queue.reserve("default")
    assert job is not None
    wait_s = queue.reservation_s * 10
    assert await queue.retry(job, wait_s, "later") is True
    (row,) = await rows(queue)
    at = clock() + round(wait_s * 1000)
    assert (row["band"], row["available_at"], row["locked_until"]) == (sql.LOCKED_BAND, at, at)
    assert await queue.retry(job, wait_s, "later") is True, "a re-sent release still matches"
    clock.advance(wait_s - 1)
    assert await queue.reserve("default") is None
    clock.advance(1)
    again = await queue.reserve("default")
    assert again is not None and again.id == job.id and again.last_error == "later"


async def case_due_jobs_run_by_priority_whether_pushed_now_or_delayed(
    db: Any, clock: Clock
) -> None:
    queue = await fresh(db, clock)
    low = await queue.dispatch("t", priority=-5)
    late_high = await queue.dispatch("t", delay_s=10, priority=7)
    mid = await queue.dispatch("t")
    late_mid = await queue.dispatch("t", delay_s=5)
    high = await queue.dispatch("t", priority=7)
    never = await queue.dispatch("t", delay_s=3600, priority=100)
    clock.advance(20)
    order = [j.id for j in await queue.reserve_batch("default", 10)]
    assert order == [high, late_high, mid, late_mid, low], "priority, then the longest due"
    assert never not in order


async def case_racing_workers_never_both_win_a_job(db: Any, clock: Clock) -> None:
    await fresh(db, clock)
    a, b = D1Queue(db, clock=clock), D1Queue(db, clock=clock)
    ids = {await a.dispatch("t", i) for i in range(30)}
    seen: list[str] = []
    while True:
        ra, rb = await asyncio.gather(a.reserve_batch("default", 7), b.reserve_batch("default", 7))
        if not ra and not rb:
            break
        assert not {j.id for j in ra} & {j.id for j in rb}
        seen += [j.id for j in ra + rb]
    assert sorted(seen) == sorted(ids), "every job claimed exactly once"


async def case_a_stale_holder_changes_nothing(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    await queue.dispatch("t", {"n": 1})
    first = await queue.reserve("default")
    assert first is not None
    clock.advance(queue.reservation_s + 1)
    assert await queue.reclaim_expired() == 1
    second = await queue.reserve("default")
    assert second is not None and second.id == first.id
    before = await rows(queue)
    assert await queue.complete(first) is False
    assert await queue.retry(first, 60, "late") is False
    assert await queue.fail(first, "late") is False
    assert await rows(queue) == before, "the new holder's claim is untouched"
    assert await rows(queue, "d1queue_failed_jobs") == []
    assert await queue.complete(second) is True


async def case_exhausted_after_crash_is_failed_not_rerun(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    await queue.dispatch("dies", max_attempts=2)
    for _ in range(2):
        assert await queue.reserve("default") is not None
        clock.advance(queue.reservation_s + 1)
        assert await queue.reclaim_expired() == 1
    ok = await queue.dispatch("fine")
    assert [j.id for j in await queue.reserve_batch("default", 5)] == [ok]
    (failed,) = await queue.failed_jobs()
    assert failed.name == "dies" and "attempted too many times" in failed.error
    assert (failed.attempts, failed.max_attempts) == (3, 2)


async def case_unique_keys_dedupe_until_the_job_ends(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    first = await queue.dispatch("mail", {"v": 1}, unique_key="user:1")
    assert await queue.dispatch("mail", {"v": 2}, unique_key="user:1") == first
    assert await queue.dispatch("mail", unique_key="user:2") != first
    job = await queue.reserve("default")
    assert job is not None and job.id == first
    await queue.retry(job)
    assert await queue.dispatch("mail", unique_key="user:1") == first, "held across a release"
    job = await queue.reserve("default")
    assert job is not None and job.id == first
    await queue.complete(job)
    after_ack = await queue.dispatch("mail", unique_key="user:1")
    assert after_ack != first, "released on acknowledge"
    while (job := await queue.reserve("default")) is not None:
        await queue.fail(job, "no")
    assert await queue.dispatch("mail", unique_key="user:1") != after_ack, "released on fail"


async def case_retry_failed_requeues_once_without_the_lock(db: Any, clock: Clock) -> None:
    """A retried failure keeps its attempts and last error, and gets its
    registration's max_attempts afresh (sql.RETRY_FAILED_INSERT)."""
    reg = Registry()

    @reg.job("mail", max_attempts=4)
    async def mail(payload: Any) -> None:
        pass

    queue = await fresh(db, clock)
    queue.registry = reg
    job_id = await queue.dispatch("mail", {"to": "x"}, unique_key="k", priority=3, max_attempts=2)
    job = await queue.reserve("default")
    assert job is not None
    await queue.fail(job, "smtp down")
    fresh_id = await queue.dispatch("mail", {"to": "y"}, unique_key="k")
    assert await queue.retry_failed(job_id) is True
    again = await queue.job(job_id)
    assert again is not None
    assert (again.attempts, again.max_attempts, again.unique_key) == (1, 1 + 4, None)
    assert (again.payload, again.priority, again.last_error) == ({"to": "x"}, 3, "smtp down")
    assert await queue.job(fresh_id) is not None
    assert await queue.retry_failed(job_id) is False
    assert await queue.failed_jobs() == []
    claimed = await queue.reserve("default")
    assert claimed is not None and claimed.id == job_id
    assert (claimed.attempts, claimed.max_attempts) == (2, 5), "attempt 2 of 5"
    # Without a registration: the library's default attempts afresh.
    bare = D1Queue(db, clock=clock)
    other = await bare.dispatch("nobody.home", None, max_attempts=1)
    job = await bare.reserve("default")
    while job is not None and job.id != other:
        job = await bare.reserve("default")
    assert job is not None
    await bare.fail(job, "no handler")
    assert await bare.retry_failed(other) is True
    back = await bare.job(other)
    assert back is not None
    assert (back.attempts, back.max_attempts, back.last_error) == (1, 1 + 3, "no handler")


async def case_priority_then_fifo_then_delay(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    low1 = await queue.dispatch("t", "low1")
    later = await queue.dispatch("t", "later", delay_s=5, priority=9)
    high1 = await queue.dispatch("t", "high1", priority=5)
    low2 = await queue.dispatch("t", "low2")
    high2 = await queue.dispatch("t", "high2", priority=5)
    clock.advance(1)
    low3 = await queue.dispatch("t", "low3")
    got = [j.id for j in await queue.reserve_batch("default", 10)]
    assert got == [high1, high2, low1, low2, low3]
    clock.advance(5)
    assert [j.id for j in await queue.reserve_batch("default", 10)] == [later]


async def case_failed_jobs_newest_first(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    for i in range(3):
        await queue.dispatch("t", i)
    for i in range(3):
        job = await queue.reserve("default")
        assert job is not None
        clock.advance(1)
        await queue.fail(job, f"e{i}")
    assert [f.error for f in await queue.failed_jobs()] == ["e2", "e1", "e0"]
    assert [f.error for f in await queue.failed_jobs(limit=1)] == ["e2"]


async def case_drains_run_each_job_once(db: Any, clock: Clock) -> None:
    await fresh(db, clock)
    runs: Counter[Any] = Counter()
    reg = Registry()

    @reg.job("count")
    async def count(payload: Any) -> None:
        runs[payload] += 1

    @reg.job("refuse")
    async def refuse(payload: Any) -> None:
        raise Fail("bad input")

    a, b = D1Queue(db, clock=clock), D1Queue(db, clock=clock)
    for i in range(40):
        await a.dispatch("count", i)
    await a.dispatch("refuse")
    await a.dispatch("nobody.home")
    config = Config(plan="paid", batch_size=8)
    ra, rb = await asyncio.gather(drain(a, reg, config), drain(b, reg, config))
    assert runs == Counter(range(40)), "each job ran exactly once"
    assert ra.completed + rb.completed == 40 and ra.failed + rb.failed == 2
    assert ra.stale + rb.stale == 0
    assert await rows(a) == []
    errors = sorted(f.error for f in await a.failed_jobs())
    assert "bad input" in errors[0] and "no handler is registered" in errors[1]


# -- acknowledging a claim batch at once -------------------------------------------


async def case_a_claim_batch_is_acknowledged_in_one_statement(db: Any, clock: Clock) -> None:
    """A settle carrying every job a claim batch won: the completed ones go in
    one DELETE; a retry whose time is the lease's end, and a failure, are
    left to their own statements."""
    queue = await fresh(db, clock)
    for i in range(5):
        await queue.dispatch("t", i)
    won, _ = await claim_round(queue, "default", 5)
    assert len(won) == 5 and len({j.reservation for j in won}) == 1, "one token a batch"
    a, b, c, d, e = won
    outcomes = [
        Outcome(a, "complete"),
        Outcome(b, "retry", delay_s=queue.reservation_s, error="again"),  # keyed as the lease
        Outcome(c, "fail", error="exploded"),
        Outcome(d, "complete"),
        Outcome(e, "complete"),
    ]
    before = queue.binding.usage.statements
    assert await queue.settle(outcomes) == [True] * 5
    # The retry, the failure's copy and delete, and one DELETE for the rest.
    assert queue.binding.usage.statements - before == 4
    (left,) = await rows(queue)
    assert (left["id"], left["reserved_at"], left["last_error"]) == (b.id, None, "again")
    (failed,) = await queue.failed_jobs()
    assert failed.id == c.id


async def case_part_of_a_claim_batch_is_acknowledged_job_by_job(db: Any, clock: Clock) -> None:
    """A settle carrying only some of a batch's jobs leaves the others held:
    each completed job is deleted by its own key."""
    queue = await fresh(db, clock)
    for i in range(3):
        await queue.dispatch("t", i)
    a, b, c = (await claim_round(queue, "default", 3))[0]
    assert await queue.settle([Outcome(a, "complete"), Outcome(b, "complete")]) == [True, True]
    (left,) = await rows(queue)
    assert left["id"] == c.id and left["reservation"] == c.reservation
    assert await queue.complete(c) is True
    assert await rows(queue) == []


async def case_a_batch_ack_counts_the_jobs_that_moved_on(db: Any, clock: Clock) -> None:
    """One job of a batch overran its lease and another worker took it over:
    the batch's acknowledgement deletes the others, and only them, and one
    outcome is stale."""
    queue = await fresh(db, clock)
    for i in range(3):
        await queue.dispatch("t", i)
    won, _ = await claim_round(queue, "default", 3)
    clock.advance(queue.reservation_s + 1)
    other = D1Queue(db, clock=clock)
    taken, _ = await claim_round(other, "default", 1)
    assert len(taken) == 1 and taken[0].held
    marks = await queue.settle([Outcome(j, "complete") for j in won])
    assert sorted(marks) == [False, True, True]
    (left,) = await rows(queue)
    assert left["id"] == taken[0].id and left["reservation"] == taken[0].reservation
    assert await other.complete(taken[0]) is True


# -- flow control -------------------------------------------------------------------


class Recorder:
    """What the handlers themselves saw: how many of the queue's jobs, and of
    each group's, ran at once, and when each started (the case's clock)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.starts: list[tuple[int, str, Any]] = []
        self.runs: Counter[Any] = Counter()

    async def run(self, group: str, payload: Any) -> None:
        self.starts.append((self.clock(), group, payload))
        self.runs[payload] += 1
        for key in ("*", group):
            self.now[key] += 1
            self.most[key] = max(self.most[key], self.now[key])
        await asyncio.sleep(0.002)  # the other drains claim meanwhile
        for key in ("*", group):
            self.now[key] -= 1


def recorded(recorder: Recorder) -> Registry:
    reg = Registry()

    @reg.job("flow.work", queue="lim", group=lambda p: p["g"], timeout_s=5)
    async def work(payload: Any) -> None:
        await recorder.run(payload["g"], payload["i"])

    return reg


async def case_limits_hold_across_overlapping_drains(db: Any, clock: Clock) -> None:
    """concurrency 3 and group_concurrency 1 over 4 groups, 6 drains at once,
    again and again until every job ran: never more than 3 running, never 2
    of one group, every job once."""
    queue = await fresh(db, clock)
    await queue.set_limits("lim", Limits(concurrency=3, group_concurrency=1))
    rec = Recorder(clock)
    reg = recorded(rec)
    queue = D1Queue(db, clock=clock, registry=reg)
    for i in range(24):
        await queue.dispatch("flow.work", {"g": "abcd"[i % 4], "i": i})
    config = Config(plan="paid", batch_size=4, concurrency=4, queues=("lim",))
    limited = 0
    for _ in range(40):
        if sum(rec.runs.values()) >= 24:
            break
        reports = await asyncio.gather(*(drain(queue, reg, config) for _ in range(6)))
        limited += sum(r.limited for r in reports)
    assert rec.runs == Counter(range(24)), rec.runs
    assert rec.most["*"] <= 3, rec.most
    assert all(rec.most[g] <= 1 for g in "abcd"), rec.most
    assert rec.most["*"] >= 2, "more than one group ran at once"
    assert limited > 0, "some drain met the limit"
    assert await rows(queue) == []


async def case_a_dead_workers_place_frees_when_its_lease_lapses(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    await queue.set_limits("lim", Limits(concurrency=1))
    rec = Recorder(clock)
    reg = recorded(rec)
    queue = D1Queue(db, clock=clock, registry=reg, reservation_s=60)
    for i in range(2):
        await queue.dispatch("flow.work", {"g": "a", "i": i})
    _, _, flows = await queue.survey()
    dead = await queue.settle_and_claim((), "lim", 1, flows=flows)
    assert len(dead.jobs) == 1  # claimed, and its worker dies: never settled
    config = Config(plan="paid", queues=("lim",))
    report = await drain(queue, reg, config)
    assert report.claimed == 0 and report.limited >= 1 and not rec.runs
    clock.advance(61)  # the lease lapses: the place is free, the job reclaimable
    for _ in range(3):
        await drain(queue, reg, config)
    assert rec.runs == Counter({0: 1, 1: 1}), rec.runs


async def case_a_claim_its_group_refuses_spends_nothing_of_the_queues_rate(
    db: Any, clock: Clock
) -> None:
    """group_concurrency 1 and rate 2 per 10 s: a claim refused because its
    group is busy takes no place in the queue's window, so another group's
    job still starts in it."""
    queue = await fresh(db, clock)
    await queue.set_limits("lim", Limits(group_concurrency=1, rate=Rate(2, 10)))
    for name in ("a1", "a2"):
        await queue.push(QueuedJob.new("w", name, queue="lim", group="a", at_ms=clock()))
    _, _, flows = await queue.survey()
    first = await queue.settle_and_claim((), "lim", 1, flows=flows)
    assert [j.payload for j in first.jobs] == ["a1"]
    refused = await queue.settle_and_claim((), "lim", 1, flows=flows)
    assert refused.jobs == [] and refused.limited == 1, "a2 waits for a1's group"
    await queue.push(QueuedJob.new("w", "b1", queue="lim", group="b", at_ms=clock()))
    other = await queue.settle_and_claim((), "lim", 2, flows=flows)
    assert [j.payload for j in other.jobs] == ["b1"], "one start of the window is left"


async def case_a_rate_is_a_sliding_window(db: Any, clock: Clock) -> None:
    """rate 2 per 10 s: drains every 3 s for a minute; no 10 s window (and
    its guard) holds more than 2 starts."""
    queue = await fresh(db, clock)
    await queue.set_limits("lim", Limits(rate=Rate(2, 10)))
    rec = Recorder(clock)
    reg = recorded(rec)
    queue = D1Queue(db, clock=clock, registry=reg)
    for i in range(10):
        await queue.dispatch("flow.work", {"g": "ab"[i % 2], "i": i})
    config = Config(plan="paid", queues=("lim",), batch_size=10, concurrency=10)
    for _ in range(20):
        await asyncio.gather(drain(queue, reg, config), drain(queue, reg, config))
        clock.advance(3)
    times = sorted(t for t, _, _ in rec.starts)
    assert len(times) >= 6, times
    window = 10_000 + 1_000  # period_s and flow.RATE_GUARD_MS
    assert all(b - a >= window for a, b in zip(times, times[2:], strict=False)), times


async def case_a_job_run_again_counts_again_against_the_rate(db: Any, clock: Clock) -> None:
    """rate 3 per 10 s: a job retried a second after its first start starts
    again inside the window, a start of its own (not the re-send of its
    first claim, which a lost reply makes); two more jobs pushed then share
    the one start left, the other waits for the window to move on."""
    queue = await fresh(db, clock)
    await queue.set_limits("lim", Limits(rate=Rate(3, 10)))
    starts: list[tuple[int, str, int]] = []
    reg = Registry()

    @reg.job("again", queue="lim")
    async def again(payload: Any, ctx: Any) -> None:
        starts.append((clock(), payload, ctx.attempt))
        if payload == "a" and ctx.attempt == 1:
            raise Retry("once more", delay_s=1)

    queue = D1Queue(db, clock=clock, registry=reg)
    config = Config(plan="paid", queues=("lim",))
    await queue.dispatch("again", "a")
    await drain(queue, reg, config)
    clock.advance(1)
    await drain(queue, reg, config)
    assert [(p, n) for _, p, n in starts] == [("a", 1), ("a", 2)], starts
    await queue.dispatch("again", "b")
    await queue.dispatch("again", "c")
    for _ in range(15):
        clock.advance(1)
        await drain(queue, reg, config)
    assert sorted((p, n) for _, p, n in starts) == [("a", 1), ("a", 2), ("b", 1), ("c", 1)]
    times = sorted(t for t, _, _ in starts)
    window = 10_000 + 1_000  # period_s and flow.RATE_GUARD_MS
    assert all(d - a >= window for a, d in zip(times, times[3:], strict=False)), times


async def case_a_group_rate_holds_per_group(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    await queue.set_limits("lim", Limits(group_rate=Rate(1, 5)))
    rec = Recorder(clock)
    reg = recorded(rec)
    queue = D1Queue(db, clock=clock, registry=reg)
    for i in range(9):
        await queue.dispatch("flow.work", {"g": "abc"[i % 3], "i": i})
    config = Config(plan="paid", queues=("lim",), batch_size=10, concurrency=10)
    for _ in range(12):
        await asyncio.gather(drain(queue, reg, config), drain(queue, reg, config))
        clock.advance(2)
    assert rec.runs == Counter(range(9)), rec.runs
    for g in "abc":
        times = sorted(t for t, group, _ in rec.starts if group == g)
        assert all(b - a >= 6_000 for a, b in itertools.pairwise(times)), (g, times)
    first = [group for _, group, _ in sorted(rec.starts)[:3]]
    assert sorted(first) == ["a", "b", "c"], "every group started in the first round"


async def case_groups_take_turns(db: Any, clock: Clock) -> None:
    """A group with many due jobs does not hold back another group's one,
    nor the jobs with no group, by more than one round."""
    queue = await fresh(db, clock)
    started: list[Any] = []
    reg = Registry()

    @reg.job("turns", queue="fair")
    async def turns(payload: Any) -> None:
        started.append(payload)

    queue = D1Queue(db, clock=clock, registry=reg)
    await queue.push_many(
        [QueuedJob.new("turns", f"big{i}", queue="fair", group="big") for i in range(60)]
    )
    await queue.dispatch("turns", "small", group="small")
    await queue.dispatch("turns", "plain")
    await drain(queue, reg, Config(queues=("fair",), batch_size=4, max_jobs=4))
    assert "small" in started and "plain" in started, started
    job = await queue.job(await queue.push(QueuedJob.new("turns", "x", queue="fair")))
    assert job is not None and job.group is None


async def case_debounce_replaces_the_queued_job(db: Any, clock: Clock) -> None:
    queue = await fresh(db, clock)
    first = QueuedJob.new("d", 1, unique_key="k", debounce_s=5, at_ms=clock())
    id1 = await queue.push(first)
    clock.advance(2)
    second = QueuedJob.new("d", 2, unique_key="k", debounce_s=5, at_ms=clock())
    assert await queue.push(second) == id1 and second.debounced
    job = await queue.job(id1)
    assert job is not None and job.payload == 2 and job.available_at == clock() + 5_000
    assert await queue.reserve("default") is None, "not due before the last push + 5 s"
    clock.advance(5)
    running = await queue.reserve("default")
    assert running is not None and running.id == id1 and running.payload == 2
    third = QueuedJob.new("d", 3, unique_key="k", debounce_s=5, at_ms=clock())
    id3 = await queue.push(third)
    assert id3 != id1 and not third.debounced, "a started job is not debounced"
    assert await queue.complete(running)
    plain = QueuedJob.new("d", 4, unique_key="k", at_ms=clock())
    assert await queue.push(plain) == id3, "unique still holds the queued one"


# -- workflows: dependencies, batches, callbacks ---------------------------------------


class LostReplies:
    """The D1 binding under `queue`'s driver, set to lose replies: `lose(n)`
    makes the next n batch() calls run on D1 (committed) and then raise D1's
    "Network connection lost", as a connection dropped on the way back does,
    so the driver sends the same batch again (a transient error). Works on
    every binding the contract runs on: it wraps what the driver calls."""

    def __init__(self, queue: D1Queue) -> None:
        self.db = queue.binding.db
        self.armed = 0
        self.every_first_send = False
        self.lost = 0
        self._calls = 0
        queue.binding.db = self

    def lose(self, n: int = 1) -> None:
        self.armed = n

    def prepare(self, text: str) -> Any:
        return self.db.prepare(text)

    async def batch(self, statements: Any) -> Any:
        results = await self.db.batch(statements)
        self._calls += 1
        # Alternate calls: the first send of each batch, its re-send answered
        # (the driver's calls run one after another here).
        lose = self.every_first_send and self._calls % 2 == 1
        if self.armed > 0 or lose:
            self.armed = max(0, self.armed - 1)
            self.lost += 1
            raise RuntimeError("D1_ERROR: Network connection lost.")
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def at_d1s_time(clock: Clock) -> None:
    """Move the case's clock past D1's own time (an hour on, for the lag of
    the Worker's clock): a batch's callback is enqueued by the schema's
    trigger, due at the time D1 reads, and a drain claims it once the
    driver's clock has reached that."""
    clock.ms = max(clock.ms, round(time.time() * 1000) + 3_600_000)


def steps(ran: list[Any], results: dict[str, Any] | None = None) -> Registry:
    """`step` records its payload's id, fails for good when told to (`fail`),
    asks for one retry 5 s on when told to (`retry`), records what
    ctx.results() read (into `results`) and returns {"done": id}. `cb`, a
    batch's callback, records its kind and the batch's counts it read."""
    reg = Registry()

    @reg.job("step", subrequests=2)
    async def step(payload: Any, ctx: Any) -> Any:
        ran.append(payload["id"])
        if results is not None:
            results[payload["id"]] = await ctx.results()
        if payload.get("fail"):
            raise Fail("told to fail")
        if payload.get("retry") and ctx.attempt == 1:
            raise Retry("not yet", delay_s=5)
        return {"done": payload["id"]}

    @reg.job("cb", subrequests=2)
    async def cb(payload: Any, ctx: Any) -> None:
        state = await ctx.batch()
        ran.append((payload, state["state"], state["completed"], state["failed"]))

    return reg


async def drain_all(queue: D1Queue, reg: Registry, *, drains: int = 1) -> int:
    """Drain (`drains` at once) until a round claims nothing; returns how many
    jobs were claimed."""
    config = Config(plan="paid", batch_size=5)
    claimed = 0
    for _ in range(30):
        reports = await asyncio.gather(*(drain(queue, reg, config) for _ in range(drains)))
        round_claimed = sum(r.claimed for r in reports)
        if round_claimed == 0:
            return claimed
        claimed += round_claimed
    raise AssertionError("jobs were still claimed after 30 rounds")


async def counts(queue: D1Queue, batch: str) -> tuple[int, int, int, int, str]:
    """Batch `batch`'s (total, pending, completed, failed, state)."""
    state = await batch_state(queue, batch)
    assert state is not None, batch
    return (state["total"], state["pending"], state["completed"], state["failed"], state["state"])


def callbacks(ran: list[Any]) -> Counter[str]:
    return Counter(r[0] for r in ran if isinstance(r, tuple))


def with_callbacks(queue: D1Queue) -> dict[str, QueuedJob]:
    return {kind: queue.new_job("cb", kind) for kind in ("success", "failure", "finish")}


def on(callbacks: dict[str, QueuedJob]) -> dict[str, QueuedJob]:
    return {f"on_{kind}": job for kind, job in callbacks.items()}


async def case_a_dependent_is_claimable_once_all_it_waits_for_completed(
    db: Any, clock: Clock
) -> None:
    """A job pushed `after` two others is not claimable while either is
    queued, held or put back by a retry; the settle completing the last of
    them releases it, and their results are there for it to read."""
    queue = await fresh(db, clock, keep_completed=True)
    a = await queue.dispatch("t", "a")
    b = await queue.dispatch("t", "b")
    c = await queue.dispatch("t", "c", after=[a, b])
    held = {j.id: j for j in await queue.reserve_batch("default", 10)}
    assert sorted(held) == sorted([a, b]), "the waiting job is not claimed"
    assert await queue.settle([Outcome(held[a], "complete", result='{"from":"a"}')]) == [True]
    assert await queue.reserve("default") is None, "b is held: c still waits"
    assert await queue.settle([Outcome(held[b], "retry", error="again")]) == [True]
    again = await queue.reserve("default")
    assert again is not None and again.id == b, "a retry releases nothing"
    assert await queue.reserve("default") is None
    assert await queue.settle([Outcome(again, "complete", result='{"from":"b"}')]) == [True]
    released = await queue.reserve_batch("default", 10)
    assert [j.id for j in released] == [c], "released by the last completion, once"
    (job,) = released
    assert job.after == [a, b] and job.attempts == 1
    results = await queue.workflows.results(job.after)
    assert results == {a: {"from": "a"}, b: {"from": "b"}}
    assert await queue.settle([Outcome(job, "complete")]) == [True]
    assert await queue.reserve("default") is None


async def case_a_resent_completion_counts_once_for_its_waiters(db: Any, clock: Clock) -> None:
    """The reply to the settle completing one of two jobs a third waits for
    is lost and the driver sends it again; then the worker sends it once
    more. The third still waits for the other (counted down twice, it would
    be released early), and is released when that one completes."""
    for keep in (False, True):
        queue = await fresh(db, clock, keep_completed=keep)
        replies = LostReplies(queue)
        a = await queue.dispatch("t", "a")
        b = await queue.dispatch("t", "b")
        c = await queue.dispatch("t", "c", after=[a, b])
        held = {j.id: j for j in await queue.reserve_batch("default", 10)}
        assert sorted(held) == sorted([a, b]), keep
        replies.lose(1)
        assert await queue.settle([Outcome(held[a], "complete")]) == [True], "the first landed"
        assert replies.lost == 1
        assert await queue.settle([Outcome(held[a], "complete")]) == [False], "nothing to do"
        assert await queue.reserve("default") is None, ("counted once: c waits for b", keep)
        assert await queue.settle([Outcome(held[b], "complete")]) == [True]
        assert [j.id for j in await queue.reserve_batch("default", 10)] == [c], keep


async def case_a_handler_reads_the_results_of_the_jobs_it_waited_for(db: Any, clock: Clock) -> None:
    """Through drains: the job waiting for two others runs after both, once,
    and reads their return values from ctx.results(); its own is kept."""
    ran: list[Any] = []
    seen: dict[str, Any] = {}
    reg = steps(ran, seen)
    queue = await fresh(db, clock, keep_completed=True, registry=reg)
    a = await queue.dispatch("step", {"id": "a"})
    b = await queue.dispatch("step", {"id": "b"})
    c = await queue.dispatch("step", {"id": "c"}, after=[a, b])
    await drain_all(queue, reg, drains=2)
    assert sorted(ran[:2]) == ["a", "b"] and ran[2:] == ["c"], ran
    assert seen["c"] == {a: {"done": "a"}, b: {"done": "b"}}
    assert await queue.workflows.results([c]) == {c: {"done": "c"}}


async def case_a_failed_dependency_fails_its_waiters_unless_they_ignore_it(
    db: Any, clock: Clock
) -> None:
    """A dependency that fails for good fails the jobs waiting for it
    (`dependency <id> failed`), level by level, none of them run; one that
    is retried fails nothing and releases nothing; a waiter with
    ignore_failed runs once every job it names ended, and reads the results
    of those that completed."""
    ran: list[Any] = []
    seen: dict[str, Any] = {}
    reg = steps(ran, seen)
    queue = await fresh(db, clock, keep_completed=True, registry=reg)
    bad = await queue.dispatch("step", {"id": "bad", "fail": True})
    ok = await queue.dispatch("step", {"id": "ok"})
    flaky = await queue.dispatch("step", {"id": "flaky", "retry": True})
    child = await queue.dispatch("step", {"id": "child"}, after=[bad, ok])
    grandchild = await queue.dispatch("step", {"id": "grandchild"}, after=[child])
    anyway = await queue.dispatch(
        "step", {"id": "anyway"}, after=[bad, ok, flaky], ignore_failed=True
    )
    later = await queue.dispatch("step", {"id": "later"}, after=[flaky])
    await drain_all(queue, reg)
    assert sorted(ran) == ["bad", "flaky", "ok"], ran
    failed = {f.id: f.error for f in await queue.failed_jobs()}
    assert sorted(failed) == sorted([bad, child, grandchild]), failed
    assert "told to fail" in failed[bad]
    assert failed[child] == f"dependency {bad} failed"
    assert failed[grandchild] == f"dependency {child} failed"
    assert await queue.reserve("default") is None, "flaky's retry is not due, the rest wait"
    clock.advance(5)
    await drain_all(queue, reg)
    assert ran[3] == "flaky" and sorted(ran[4:]) == ["anyway", "later"], ran
    assert seen["anyway"] == {ok: {"done": "ok"}, flaky: {"done": "flaky"}}
    assert seen["later"] == {flaky: {"done": "flaky"}}
    assert sorted(f.id for f in await queue.failed_jobs()) == sorted(failed)
    assert (await queue.workflows.results([anyway, later])).keys() == {anyway, later}


async def case_a_batchs_counters_follow_its_jobs_through_a_retry(db: Any, clock: Clock) -> None:
    """(total, pending, completed, failed, state) after each settle: a retry
    leaves its job pending, a job added while the batch runs counts in total
    and pending, on_failure comes at the first failure and on_finish when
    none is pending; a finished batch takes no more jobs."""
    queue = await fresh(db, clock)
    cbs = with_callbacks(queue)
    batch, ids = await queue.batch([queue.new_job("t", i) for i in range(3)], **on(cbs))
    assert await counts(queue, batch) == (3, 3, 0, 0, "running")
    held = {j.id: j for j in await queue.reserve_batch("default", 10) if j.name == "t"}
    assert sorted(held) == sorted(ids)
    x, y, z = (held[i] for i in ids)
    marks = await queue.settle([Outcome(x, "complete"), Outcome(y, "retry", error="again")])
    assert marks == [True, True]
    assert await counts(queue, batch) == (3, 2, 1, 0, "running"), "a retried job is pending"
    (added,) = await queue.add_to_batch(batch, [queue.new_job("t", "added")])
    assert await counts(queue, batch) == (4, 3, 1, 0, "running")
    state = await batch_state(queue, batch)
    assert state is not None and sorted(state["ids"]) == sorted([*ids, added])
    assert await queue.settle([Outcome(z, "fail", error="no")]) == [True]
    assert await counts(queue, batch) == (4, 2, 1, 1, "running")
    assert await queue.job(f"{batch}:on_failure") is not None, "at the first failure"
    assert await queue.job(f"{batch}:on_finish") is None, "two are pending"
    rest = {j.id: j for j in await queue.reserve_batch("default", 10) if j.name == "t"}
    assert sorted(rest) == sorted([y.id, added]) and rest[y.id].attempts == 2
    assert await queue.settle([Outcome(j, "complete") for j in rest.values()]) == [True, True]
    assert await counts(queue, batch) == (4, 0, 3, 1, "failed")
    state = await batch_state(queue, batch)
    assert state is not None and state["finished_at"] is not None
    assert await queue.job(f"{batch}:on_finish") is not None
    assert await queue.job(f"{batch}:on_success") is None, "one failed"
    try:
        await queue.add_to_batch(batch, [queue.new_job("t", "late")])
    except BatchNotRunning:
        pass
    else:
        raise AssertionError("a finished batch took a job")
    assert await counts(queue, batch) == (4, 0, 3, 1, "failed")
    assert [j.payload for j in await queue.reserve_batch("default", 10) if j.name == "t"] == []


async def case_a_batchs_counters_after_drains_with_a_retry_between(db: Any, clock: Clock) -> None:
    """Through drains: a batch's job asks for a retry, another fails for
    good; the counters after each drain, and the callbacks' runs (each once,
    after the batch ended, reading its final counts)."""
    ran: list[Any] = []
    reg = steps(ran)
    queue = await fresh(db, clock, registry=reg)
    at_d1s_time(clock)
    members = [{"id": "ok"}, {"id": "flaky", "retry": True}, {"id": "bad", "fail": True}]
    batch, _ = await queue.batch(
        [queue.new_job("step", p) for p in members], **on(with_callbacks(queue))
    )
    await drain_all(queue, reg)
    assert await counts(queue, batch) == (3, 1, 1, 1, "running")
    assert callbacks(ran) == Counter({"failure": 1}), ran
    clock.advance(5)
    await drain_all(queue, reg)
    assert await counts(queue, batch) == (3, 0, 2, 1, "failed")
    assert sorted(r for r in ran if isinstance(r, str)) == ["bad", "flaky", "flaky", "ok"]
    assert callbacks(ran) == Counter({"failure": 1, "finish": 1}), ran
    assert ("finish", "failed", 2, 1) in ran


async def case_a_batchs_callbacks_run_once_when_the_last_settle_is_resent(
    db: Any, clock: Clock
) -> None:
    """The reply to the settle completing a batch's last job is lost and the
    driver sends it again; the worker sends it once more, before and after
    the callbacks ran. The counters count each job once, and each callback
    runs once."""
    for keep in (False, True):
        ran: list[Any] = []
        reg = steps(ran)
        queue = await fresh(db, clock, keep_completed=keep, registry=reg)
        at_d1s_time(clock)
        replies = LostReplies(queue)
        batch, ids = await queue.batch(
            [queue.new_job("step", {"id": i}) for i in "ab"], **on(with_callbacks(queue))
        )
        held = {j.id: j for j in await queue.reserve_batch("default", 2)}
        first, last = (held[i] for i in ids)
        assert await queue.settle([Outcome(first, "complete")]) == [True]
        replies.lose(1)
        assert await queue.settle([Outcome(last, "complete")]) == [True], "the first landed"
        assert replies.lost == 1
        assert await queue.settle([Outcome(last, "complete")]) == [False], "nothing to do"
        assert await counts(queue, batch) == (2, 0, 2, 0, "succeeded"), keep
        await drain_all(queue, reg)
        assert callbacks(ran) == Counter({"success": 1, "finish": 1}), (keep, ran)
        assert await queue.settle([Outcome(last, "complete")]) == [False]
        assert await drain_all(queue, reg) == 0
        assert callbacks(ran) == Counter({"success": 1, "finish": 1}), (keep, ran)
        assert await counts(queue, batch) == (2, 0, 2, 0, "succeeded"), keep


async def case_a_batch_drained_while_every_reply_is_lost_once_fires_once(
    db: Any, clock: Clock
) -> None:
    """Drains whose every D1 batch (claims, settles, the follow-ups) loses its
    first reply and is sent again: each job of the batch runs once, the
    counters are right, each callback runs once."""
    ran: list[Any] = []
    reg = steps(ran)
    queue = await fresh(db, clock, keep_completed=True, registry=reg)
    at_d1s_time(clock)
    members = [{"id": f"m{i}", "fail": i == 3} for i in range(6)]
    batch, _ = await queue.batch(
        [queue.new_job("step", p) for p in members], **on(with_callbacks(queue))
    )
    replies = LostReplies(queue)
    replies.every_first_send = True
    await drain_all(queue, reg)
    replies.every_first_send = False
    assert replies.lost > 0
    assert sorted(r for r in ran if isinstance(r, str)) == [f"m{i}" for i in range(6)], ran
    assert await counts(queue, batch) == (6, 0, 5, 1, "failed")
    assert callbacks(ran) == Counter({"failure": 1, "finish": 1}), ran


async def case_jobs_ending_a_batch_together_fire_each_callback_once(db: Any, clock: Clock) -> None:
    """A batch's last two jobs end together: in one settle (their claim
    batch's acknowledgement), in two workers' settles sent at once, or both
    failing in one settle. Each callback due runs once, the others never."""
    for keep in (False, True):
        for how in ("one settle", "two workers at once", "two failures"):
            ran: list[Any] = []
            reg = steps(ran)
            queue = await fresh(db, clock, keep_completed=keep, registry=reg)
            at_d1s_time(clock)
            batch, ids = await queue.batch(
                [queue.new_job("step", {"id": i}) for i in "ab"], **on(with_callbacks(queue))
            )
            if how == "two workers at once":
                other = D1Queue(db, clock=clock, keep_completed=keep, registry=reg)
                (mine,), _ = await claim_round(queue, "default", 1)
                (theirs,), _ = await claim_round(other, "default", 1)
                assert sorted([mine.id, theirs.id]) == sorted(ids)
                marks = await asyncio.gather(
                    queue.settle([Outcome(mine, "complete")]),
                    other.settle([Outcome(theirs, "complete")]),
                )
                assert marks == [[True], [True]]
            else:
                won, _ = await claim_round(queue, "default", 2)
                assert sorted(j.id for j in won) == sorted(ids)
                action = "fail" if how == "two failures" else "complete"
                outcomes = [
                    Outcome(j, action, error="no" if action == "fail" else None) for j in won
                ]
                assert await queue.settle(outcomes) == [True, True]
            await drain_all(queue, reg)
            if how == "two failures":
                assert await counts(queue, batch) == (2, 0, 0, 2, "failed"), (keep, how)
                want = Counter({"failure": 1, "finish": 1})
            else:
                assert await counts(queue, batch) == (2, 0, 2, 0, "succeeded"), (keep, how)
                want = Counter({"success": 1, "finish": 1})
            assert callbacks(ran) == want, (keep, how, ran)


async def case_overlapping_drains_fire_a_batchs_callbacks_once(db: Any, clock: Clock) -> None:
    """Four drains at once over a batch of 40 jobs, two of them failing: each
    job runs once, and each callback due runs once, after the last job."""
    ran: list[Any] = []
    reg = steps(ran)
    queue = await fresh(db, clock, registry=reg)
    at_d1s_time(clock)
    members = [{"id": f"m{i:02}", "fail": i in (7, 30)} for i in range(40)]
    batch, _ = await queue.batch(
        [queue.new_job("step", p) for p in members], **on(with_callbacks(queue))
    )
    await drain_all(queue, reg, drains=4)
    assert sorted(r for r in ran if isinstance(r, str)) == [p["id"] for p in members]
    assert await counts(queue, batch) == (40, 0, 38, 2, "failed")
    assert callbacks(ran) == Counter({"failure": 1, "finish": 1}), ran
    finish = next(i for i, r in enumerate(ran) if isinstance(r, tuple) and r[0] == "finish")
    assert all(isinstance(r, tuple) for r in ran[finish:]), "after every job of the batch"
    assert ran[finish] == ("finish", "failed", 38, 2)


async def case_a_resent_batch_push_or_addition_counts_its_jobs_once(db: Any, clock: Clock) -> None:
    """The replies to a batch's push and to an addition to it are lost, and
    the driver sends each again: the batch holds each job once, and ends
    when they complete."""
    queue = await fresh(db, clock)
    replies = LostReplies(queue)
    replies.lose(1)
    finish = queue.new_job("cb", "finish")
    batch, ids = await queue.batch([queue.new_job("t", i) for i in range(3)], on_finish=finish)
    assert replies.lost == 1 and len(set(ids)) == 3
    assert await counts(queue, batch) == (3, 3, 0, 0, "running")
    replies.lose(1)
    added = await queue.add_to_batch(batch, [queue.new_job("t", x) for x in "xy"])
    assert replies.lost == 2
    assert await counts(queue, batch) == (5, 5, 0, 0, "running")
    state = await batch_state(queue, batch)
    assert state is not None and sorted(state["ids"]) == sorted([*ids, *added])
    held = [j for j in await queue.reserve_batch("default", 10) if j.name == "t"]
    assert sorted(j.id for j in held) == sorted([*ids, *added]), "each job stored once"
    assert await queue.settle([Outcome(j, "complete") for j in held]) == [True] * 5
    assert await counts(queue, batch) == (5, 0, 5, 0, "succeeded")
    assert await queue.job(f"{batch}:on_finish") is not None


async def case_a_chain_runs_in_order_and_a_failed_link_fails_the_rest(
    db: Any, clock: Clock
) -> None:
    """A chain's jobs each wait for the one before: overlapping drains run
    them one after another; a link that fails fails the links after it,
    which never run."""
    ran: list[Any] = []
    reg = steps(ran)
    queue = await fresh(db, clock, registry=reg)
    ids = await queue.chain([queue.new_job("step", {"id": x}) for x in "abcd"])
    afters = [(await queue.job(i)).after for i in ids]  # type: ignore[union-attr]
    assert afters == [None, ids[:1], ids[1:2], ids[2:3]], afters
    assert [j.id for j in await queue.reserve_batch("default", 10)] == ids[:1]
    clock.advance(queue.reservation_s + 1)  # that claim's lease lapses: the drains take it
    await drain_all(queue, reg, drains=3)
    assert ran == list("abcd"), ran
    assert await queue.failed_jobs() == []
    links = [{"id": "w"}, {"id": "x", "fail": True}, {"id": "y"}, {"id": "z"}]
    _, x, y, z = await queue.chain([queue.new_job("step", p) for p in links])
    await drain_all(queue, reg, drains=3)
    assert ran[4:] == ["w", "x"], ran
    failed = {f.id: f.error for f in await queue.failed_jobs()}
    assert failed.keys() == {x, y, z}, failed
    assert (failed[y], failed[z]) == (f"dependency {x} failed", f"dependency {y} failed")


# -- job metrics ------------------------------------------------------------------------


async def metric_counts(queue: D1Queue) -> dict[str, tuple[int, int, int, int]]:
    """The all-time totals per job name: (completed, retried, failed, cancelled)."""
    found = await queue.binding.run(
        "SELECT name, completed, retried, failed, cancelled FROM d1queue_metrics "
        f"WHERE period = {sql.METRIC_TOTAL}"
    )
    return {
        r["name"]: (r["completed"], r["retried"], r["failed"], r["cancelled"]) for r in found.rows
    }


async def case_changes_in_a_batch_is_the_row_count_of_the_statement_before(
    db: Any, clock: Clock
) -> None:
    """What the metrics' acknowledgement guard (sql.METRICS_ACKED) stands on:
    inside one db.batch, SQLite's changes() is the rows the last INSERT,
    UPDATE or DELETE before it changed (a SELECT between leaves it), and
    not the rows its triggers changed."""
    queue = await fresh(db, clock)
    keys = "SELECT 1 FROM d1queue_meta WHERE key LIKE 'contract_changes_%'"
    seen = (
        "INSERT INTO d1queue_meta (key, value, updated_at) "
        "SELECT 'contract_changes_' || ?1, CAST(changes() AS TEXT), 0"
    )
    results = await queue.binding.batch(
        [
            (
                "INSERT INTO d1queue_meta (key, value, updated_at) VALUES "
                "('contract_changes_a', 'x', 0), ('contract_changes_b', 'x', 0), "
                "('contract_changes_c', 'x', 0)",
                (),
            ),
            (seen, ("after_insert",)),
            (
                "UPDATE d1queue_meta SET value = 'y' WHERE key IN "
                "('contract_changes_a', 'contract_changes_b')",
                (),
            ),
            (seen, ("after_update",)),
            (keys, ()),
            ("DELETE FROM d1queue_meta WHERE key = 'contract_changes_none'", ()),
            (seen + " WHERE changes() = 0", ("after_nothing",)),
        ]
    )
    assert [r.changes for r in results[:4]] == [3, 1, 2, 1]
    found = await queue.binding.run(
        "SELECT key, value FROM d1queue_meta WHERE key LIKE 'contract_changes_after%'"
    )
    got = {r["key"].removeprefix("contract_changes_"): r["value"] for r in found.rows}
    assert got == {"after_insert": "3", "after_update": "2", "after_nothing": "0"}, got
    await queue.binding.run("DELETE FROM d1queue_meta WHERE key LIKE 'contract_changes_%'")


async def case_a_claim_batchs_acknowledgement_is_counted_once_even_resent(
    db: Any, clock: Clock
) -> None:
    """A claim batch's completions acknowledged by one statement, with and
    without history (COMPLETE_HELD_BATCH fires the schema's triggers for a
    batch's jobs, DELETE_HELD_BATCH_PLAIN none), are counted once by the
    guarded UPSERT after it; the same settle re-sent after a lost reply
    counts nothing more."""
    for keep in (False, True):
        queue = await fresh(db, clock, metrics=True, keep_completed=keep)
        at_d1s_time(clock)
        replies = LostReplies(queue)
        if keep:  # a batch's jobs: their acknowledgement fires the triggers
            await queue.batch([queue.new_job("t", i) for i in range(3)])
        else:
            for i in range(3):
                await queue.dispatch("t", i)
        won, _ = await claim_round(queue, "default", 3)
        assert len(won) == 3
        before = dict(queue.binding.usage.by_name)
        assert await queue.settle([Outcome(j, "complete") for j in won]) == [True] * 3
        used = {k: v - before.get(k, 0) for k, v in queue.binding.usage.by_name.items()}
        ack = "COMPLETE_HELD_BATCH" if keep else "DELETE_HELD_BATCH_PLAIN"
        assert used.get(ack) == 1 and used.get("METRICS_ACKED") == 1, used
        assert await metric_counts(queue) == {"t": (3, 0, 0, 0)}, keep
        for i in range(3):
            await queue.dispatch("t", i)
        won, _ = await claim_round(queue, "default", 3)
        replies.lose(1)
        assert await queue.settle([Outcome(j, "complete") for j in won]) == [True] * 3
        assert replies.lost == 1
        assert await metric_counts(queue) == {"t": (6, 0, 0, 0)}, keep


async def case_an_acknowledgement_that_falls_short_counts_none_of_its_jobs(
    db: Any, clock: Clock
) -> None:
    """One job of a claim batch overran its lease and another worker took it:
    the batch's acknowledgement changes 2 rows, not 3, and its guard counts
    none of them (which jobs landed is not known to the statement); the
    other worker's completion counts its one."""
    queue = await fresh(db, clock, metrics=True)
    for i in range(3):
        await queue.dispatch("t", i)
    won, _ = await claim_round(queue, "default", 3)
    clock.advance(queue.reservation_s + 1)
    other = D1Queue(db, clock=clock, metrics=True)
    taken, _ = await claim_round(other, "default", 1)
    assert len(taken) == 1
    assert sorted(await queue.settle([Outcome(j, "complete") for j in won])) == [False, True, True]
    assert await metric_counts(queue) == {}
    assert await other.complete(taken[0]) is True
    assert await metric_counts(queue) == {"t": (1, 0, 0, 0)}


async def case_outcomes_settled_one_by_one_are_counted_once_even_resent(
    db: Any, clock: Clock
) -> None:
    """A retry, a failure and a completion that each take their own
    statements are counted by the UPSERT before them, from the jobs still
    held under their token; the settle re-sent after a lost reply finds
    them settled and counts nothing more, and a stale holder counts nothing."""
    queue = await fresh(db, clock, metrics=True)
    replies = LostReplies(queue)
    for name in ("r", "f", "c"):
        await queue.dispatch(name, None)
    won = {j.name: j for j in (await claim_round(queue, "default", 3))[0]}
    outcomes = [
        Outcome(won["r"], "retry", delay_s=600, error="again"),
        Outcome(won["f"], "fail", error="no"),
    ]
    replies.lose(1)
    assert await queue.settle(outcomes) == [True, True]
    assert replies.lost == 1
    assert await queue.settle([Outcome(won["c"], "complete")]) == [True]
    assert await metric_counts(queue) == {
        "r": (0, 1, 0, 0),
        "f": (0, 0, 1, 0),
        "c": (1, 0, 0, 0),
    }
    assert await queue.settle([Outcome(won["c"], "complete")]) == [False], "stale"
    assert (await metric_counts(queue))["c"] == (1, 0, 0, 0)


CASES = {name: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}
