"""D1Queue beyond the seed: batched claims under contention, fencing tokens,
atomic failure, exhausted attempts, uniqueness, retrying failures, ordering."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from d1queue import D1Queue, DuplicateJobId, QueuedJob
from d1queue.testing import D1Error, SqliteD1

from .conftest import Clock


def rows(db: SqliteD1, table: str = "d1queue_jobs") -> list[dict]:
    return [dict(r) for r in db.query(f"SELECT * FROM {table} ORDER BY rowid")]


# -- contention -----------------------------------------------------------


async def test_two_workers_racing_for_a_batch_never_both_win_a_job(
    shared_file: Path, clock: Clock
) -> None:
    a = D1Queue(SqliteD1(shared_file), clock=clock)
    b = D1Queue(SqliteD1(shared_file), clock=clock)
    ids = {await a.dispatch("x", i) for i in range(40)}
    # Each SqliteD1 call yields to the loop first, so the two workers' SELECTs
    # and claim batches interleave: both read the same candidates.
    (got_a, _), (got_b, _) = await asyncio.gather(
        a.claim_round("default", 10), b.claim_round("default", 10)
    )
    assert len(got_a) + len(got_b) == 10, "the loser's claims change nothing"
    assert not {j.id for j in got_a} & {j.id for j in got_b}
    # Over many interleaved rounds every job is claimed exactly once.
    seen = [j.id for j in got_a + got_b]
    while True:
        ra, rb = await asyncio.gather(a.reserve_batch("default", 7), b.reserve_batch("default", 7))
        if not ra and not rb:
            break
        seen += [j.id for j in ra + rb]
    assert sorted(seen) == sorted(ids)


async def test_reserve_batch_replaces_candidates_lost_to_a_race(
    shared_file: Path, clock: Clock
) -> None:
    a = D1Queue(SqliteD1(shared_file), clock=clock)
    b = D1Queue(SqliteD1(shared_file), clock=clock)
    for i in range(10):
        await a.dispatch("x", i)
    got_a, got_b = await asyncio.gather(
        a.reserve_batch("default", 4), b.reserve_batch("default", 4)
    )
    assert len(got_a) == 4 and len(got_b) == 4, "lost candidates are re-read, not given up"
    assert not {j.id for j in got_a} & {j.id for j in got_b}


async def test_claim_rounds_are_bounded_under_contention(db: SqliteD1, clock: Clock) -> None:
    q = D1Queue(db, clock=clock, max_claim_attempts=3)
    await q.dispatch("x")
    # Every claim UPDATE loses (as if another worker always won it first).
    original = db.prepare

    def losing(sql: str):  # type: ignore[no-untyped-def]
        if sql.startswith("UPDATE d1queue_jobs SET attempts"):
            sql = sql.replace("WHERE id = ?4", "WHERE 0 AND id = ?4")
        return original(sql)

    db.prepare = losing  # type: ignore[method-assign]
    assert await q.reserve_batch("default", 1) == []
    assert sum(s.startswith("SELECT") for s in db.statements) == 3


async def test_a_claim_only_takes_the_row_as_it_was_read(db: SqliteD1, queue: D1Queue) -> None:
    """A row claimed and released since it was read is not claimed on stale data."""
    await queue.dispatch("x")
    stale = (await queue.binding.run("SELECT id, attempts FROM d1queue_jobs")).rows[0]
    job = await queue.reserve("default")
    assert job is not None and await queue.release(job)
    from d1queue import sql

    late = await db.prepare(sql.CLAIM).bind(1, 2, "tok", stale["id"], stale["attempts"]).run()
    assert late["meta"]["changes"] == 0


# -- fencing ----------------------------------------------------------------


async def test_a_stale_holder_changes_nothing(db: SqliteD1, queue: D1Queue, clock: Clock) -> None:
    await queue.dispatch("x", {"n": 1})
    first = await queue.reserve("default")
    assert first is not None
    clock.advance(queue.reservation_s + 1)
    assert await queue.reclaim_expired() == 1
    second = await queue.reserve("default")
    assert second is not None and second.id == first.id
    assert second.reservation != first.reservation
    before = rows(db)

    assert await queue.acknowledge(first) is False
    assert await queue.release(first, 60, "late") is False
    assert await queue.fail(first, "late") is False
    assert rows(db) == before, "the new holder's claim is untouched"
    assert rows(db, "d1queue_failed_jobs") == []
    assert await queue.acknowledge(second) is True


async def test_a_job_without_a_reservation_cannot_be_settled(queue: D1Queue) -> None:
    job_id = await queue.dispatch("x")
    unreserved = await queue.job(job_id)
    assert unreserved is not None
    assert await queue.acknowledge(unreserved) is False
    assert await queue.job(job_id) is not None


# -- failing atomically -----------------------------------------------------


@pytest.mark.parametrize("where", ["INSERT OR REPLACE INTO d1queue_failed_jobs", "DELETE FROM"])
async def test_fail_is_atomic_when_a_fault_hits_inside_its_batch(
    db: SqliteD1, queue: D1Queue, where: str
) -> None:
    await queue.dispatch("x")
    job = await queue.reserve("default")
    assert job is not None
    before = rows(db)
    db.fail_when(where)
    with pytest.raises(D1Error):
        await queue.fail(job, "boom")
    assert rows(db) == before, "the job is still there, still reserved"
    assert rows(db, "d1queue_failed_jobs") == []
    assert await queue.fail(job, "boom") is True, "and failing it again works"
    assert len(rows(db, "d1queue_failed_jobs")) == 1
    assert rows(db) == []


async def test_a_settle_batch_is_all_or_nothing(db: SqliteD1, queue: D1Queue) -> None:
    from d1queue import Outcome

    for i in range(3):
        await queue.dispatch("x", i)
    jobs = await queue.reserve_batch("default", 3)
    before = rows(db)
    db.fail_when("INSERT OR REPLACE INTO d1queue_failed_jobs")
    outcomes = [Outcome(jobs[0], "ack"), Outcome(jobs[1], "release"), Outcome(jobs[2], "fail")]
    with pytest.raises(D1Error):
        await queue.settle(outcomes)
    assert rows(db) == before
    assert await queue.settle(outcomes) == [True, True, True]
    assert [r["id"] for r in rows(db)] == [jobs[1].id]


# -- attempts ------------------------------------------------------------------


async def test_a_job_whose_worker_died_on_its_last_attempt_is_failed_not_rerun(
    db: SqliteD1, queue: D1Queue, clock: Clock
) -> None:
    await queue.dispatch("x", max_attempts=2)
    for _ in range(2):  # two attempts, each worker dying mid-job
        assert await queue.reserve("default") is not None
        clock.advance(queue.reservation_s + 1)
        assert await queue.reclaim_expired() == 1
    assert await queue.reserve("default") is None, "never handed out a third time"
    (failed,) = await queue.failed_jobs()
    assert "attempted too many times" in failed.error
    assert failed.attempts == 3 and failed.max_attempts == 2
    assert rows(db) == []


async def test_reserve_batch_fails_exhausted_jobs_and_returns_the_rest(
    queue: D1Queue, clock: Clock
) -> None:
    await queue.dispatch("dies", max_attempts=1)
    assert await queue.reserve("default") is not None
    clock.advance(queue.reservation_s + 1)
    await queue.reclaim_expired()
    ok = await queue.dispatch("fine")
    got = await queue.reserve_batch("default", 5)
    assert [j.id for j in got] == [ok]
    assert [f.name for f in await queue.failed_jobs()] == ["dies"]


# -- uniqueness ------------------------------------------------------------------


async def test_a_unique_key_dedupes_while_the_job_is_queued(db: SqliteD1, queue: D1Queue) -> None:
    first = await queue.dispatch("mail", {"v": 1}, unique_key="user:1")
    again = await queue.dispatch("mail", {"v": 2}, unique_key="user:1")
    assert again == first
    assert len(rows(db)) == 1 and rows(db)[0]["payload"] == '{"v":1}'
    other = await queue.dispatch("mail", {"v": 3}, unique_key="user:2")
    assert other != first


@pytest.mark.parametrize("ending", ["ack", "fail"])
async def test_the_unique_lock_is_released_when_the_job_ends(queue: D1Queue, ending: str) -> None:
    first = await queue.dispatch("mail", unique_key="k")
    job = await queue.reserve("default")
    assert job is not None and job.id == first
    assert await queue.dispatch("mail", unique_key="k") == first, "still held while running"
    if ending == "ack":
        await queue.acknowledge(job)
    else:
        await queue.fail(job, "no")
    assert await queue.dispatch("mail", unique_key="k") != first


async def test_a_unique_key_survives_a_release(queue: D1Queue) -> None:
    first = await queue.dispatch("mail", unique_key="k")
    job = await queue.reserve("default")
    assert job is not None
    await queue.release(job, 10)
    assert await queue.dispatch("mail", unique_key="k") == first


async def test_pushing_a_duplicate_id_is_an_error(queue: D1Queue) -> None:
    job = QueuedJob.new("x")
    await queue.push(job)
    with pytest.raises(DuplicateJobId):
        await queue.push(job)


# -- the failed-jobs store -----------------------------------------------------------


async def test_retry_failed_requeues_with_one_attempt_and_no_lock(
    db: SqliteD1, queue: D1Queue, clock: Clock
) -> None:
    job_id = await queue.dispatch("mail", {"to": "x"}, unique_key="k", priority=3)
    job = await queue.reserve("default")
    assert job is not None
    await queue.fail(job, "smtp down")
    clock.advance(5)
    # A fresh dispatch with the key takes the lock in between...
    fresh = await queue.dispatch("mail", {"to": "y"}, unique_key="k")
    # ...and the retry is still accepted, without the lock.
    assert await queue.retry_failed(job_id) is True
    assert rows(db, "d1queue_failed_jobs") == []
    again = await queue.job(job_id)
    assert again is not None
    assert (again.attempts, again.max_attempts, again.unique_key) == (0, 1, None)
    assert (again.payload, again.priority, again.last_error) == ({"to": "x"}, 3, "smtp down")
    assert again.available_at == clock()
    assert await queue.job(fresh) is not None
    assert await queue.retry_failed(job_id) is False, "already retried"
    assert await queue.retry_failed("nope") is False


async def test_failed_jobs_are_listed_newest_first(queue: D1Queue, clock: Clock) -> None:
    for i in range(3):
        await queue.dispatch("x", i)
    for i in range(3):
        job = await queue.reserve("default")
        assert job is not None
        clock.advance(1)
        await queue.fail(job, f"e{i}")
    assert [f.error for f in await queue.failed_jobs()] == ["e2", "e1", "e0"]
    assert [f.error for f in await queue.failed_jobs(limit=1)] == ["e2"]


# -- ordering ------------------------------------------------------------------------


async def test_higher_priority_first_then_fifo_then_delays(queue: D1Queue, clock: Clock) -> None:
    low1 = await queue.dispatch("x", "low1")
    later = await queue.dispatch("x", "later", delay_s=5, priority=9)
    high1 = await queue.dispatch("x", "high1", priority=5)
    low2 = await queue.dispatch("x", "low2")
    high2 = await queue.dispatch("x", "high2", priority=5)
    clock.advance(1)
    low3 = await queue.dispatch("x", "low3")
    got = [j.id for j in await queue.reserve_batch("default", 10)]
    assert got == [high1, high2, low1, low2, low3], "same millisecond: insertion order"
    clock.advance(5)
    assert [j.id for j in await queue.reserve_batch("default", 10)] == [later]


async def test_clear_and_size_are_per_queue(queue: D1Queue) -> None:
    for _ in range(3):
        await queue.dispatch("x", queue="a")
    await queue.dispatch("x", queue="b")
    await queue.reserve("a")
    assert await queue.clear("a") == 3, "reserved jobs too"
    assert (await queue.size("a"), await queue.size("b")) == (0, 1)


# -- input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "bad name"},
        {"name": ""},
        {"name": "x" * 65},
        {"queue": "a/b"},
        {"max_attempts": 0},
        {"delay_s": -1},
        {"priority": 2**60},
        {"priority": 1.5},
        {"payload": {"x": float("nan")}},
        {"payload": {1, 2}},
        {"unique_key": ""},
    ],
)
async def test_bad_input_is_refused_and_writes_nothing(
    db: SqliteD1, queue: D1Queue, kwargs: dict
) -> None:
    args = {"name": "x", "payload": None, **kwargs}
    name, payload = args.pop("name"), args.pop("payload")
    with pytest.raises(ValueError):
        await queue.dispatch(name, payload, **args)
    assert rows(db) == []
