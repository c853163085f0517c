"""D1Queue on SqliteD1 specifically: exact interleavings, injected faults and
the statements sent. Behaviour every binding must share is in contract.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from d1queue import D1Queue, DuplicateJobId, QueuedJob
from d1queue.interfaces.testing import D1Error, SqliteD1
from d1queue.store.claim import claim_round

from .conftest import Clock


def rows(db: SqliteD1, table: str = "d1queue_jobs") -> list[dict]:
    return [dict(r) for r in db.query(f"SELECT * FROM {table} ORDER BY id")]


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
        claim_round(a, "default", 10), claim_round(b, "default", 10)
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
        if sql.startswith("UPDATE d1queue_jobs SET band"):
            sql = sql.replace("WHERE queue = ?6", "WHERE 0 AND queue = ?6")
        return original(sql)

    db.prepare = losing  # type: ignore[method-assign]
    assert await q.reserve_batch("default", 1) == []
    assert sum(s.startswith("SELECT") for s in db.statements) == 3


async def test_a_claim_only_takes_the_row_as_it_was_read(db: SqliteD1, queue: D1Queue) -> None:
    """A row claimed and released since it was read is not claimed on stale data."""
    await queue.dispatch("x")
    read = "SELECT id, attempts, queue, band, available_at FROM d1queue_jobs"
    stale = (await queue.binding.run(read)).rows[0]
    job = await queue.reserve("default")
    assert job is not None and await queue.retry(job)
    from d1queue.store import sql

    late = await db.prepare(sql.CLAIM).bind(1, 2, "tok", *stale.values()).run()
    assert late["meta"]["changes"] == 0


# -- fencing ----------------------------------------------------------------


async def test_a_job_without_a_reservation_cannot_be_settled(queue: D1Queue) -> None:
    job_id = await queue.dispatch("x")
    unreserved = await queue.job(job_id)
    assert unreserved is not None
    assert await queue.complete(unreserved) is False
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
    outcomes = [Outcome(jobs[0], "complete"), Outcome(jobs[1], "retry"), Outcome(jobs[2], "fail")]
    with pytest.raises(D1Error):
        await queue.settle(outcomes)
    assert rows(db) == before
    assert await queue.settle(outcomes) == [True, True, True]
    assert [r["id"] for r in rows(db)] == [jobs[1].id]


async def test_pushing_a_duplicate_id_is_an_error(queue: D1Queue) -> None:
    job = QueuedJob.new("x")
    await queue.push(job)
    with pytest.raises(DuplicateJobId):
        await queue.push(job)


# -- ids and input -------------------------------------------------------------------------


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
