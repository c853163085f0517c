"""Draining several queues: every queue with due work runs, fairly."""

from __future__ import annotations

from typing import Any

from d1queue import Config, D1Queue, Registry, drain
from d1queue.interfaces.testing import SqliteD1

from .contract import Clock


def registry(db: SqliteD1, started: list[tuple[int, str]]) -> Registry:
    """A job that records what it was and how many statements the drain had
    sent when it started: jobs of one round share that count, and a later
    round's count is higher."""
    reg = Registry()

    @reg.job("work", timeout_s=5)
    async def work(payload: Any) -> None:
        started.append((len(db.statements), payload))

    return reg


async def flood(db: SqliteD1, queue: str, n: int, clock: Clock) -> None:
    """`n` due jobs on `queue` in one INSERT (as many pushes would make)."""
    db._conn.execute(
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1) "
        "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, priority, band, "
        "available_at, created_at) "
        "SELECT printf('busy%06d', i), ?2, 'work', '\"busy\"', 3, 0, 0, ?3 - 100000 + i, 0 FROM c",
        (n, queue, clock()),
    )


async def test_a_quiet_queue_starts_in_the_first_round(db: SqliteD1) -> None:
    clock = Clock()
    queue = D1Queue(db, clock=clock)
    await flood(db, "busy", 10_000, clock)
    await queue.dispatch("work", "quiet", queue="quiet")
    started: list[tuple[int, str]] = []
    report = await drain(
        queue, registry(db, started), Config(queues=("busy", "quiet"), max_jobs=50)
    )
    assert report.claimed == 50 and report.rounds >= 2
    first_round = min(at for at, _ in started)
    assert (first_round, "quiet") in started, "the quiet queue's job ran in round one"
    assert sum(p == "busy" for _, p in started) == 49


async def test_by_default_every_queue_with_jobs_is_drained(db: SqliteD1) -> None:
    """A job pushed to a queue of its own name runs with the default
    configuration: no list to keep in step with the queues callers use."""
    clock = Clock()
    queue = D1Queue(db, clock=clock)
    started: list[tuple[int, str]] = []
    for name in ("acc-7f3a", "default", "zz.mail"):
        await queue.dispatch("work", name, queue=name)
    await queue.dispatch("work", "later", queue="later", delay_s=60)
    report = await drain(queue, registry(db, started), Config())
    assert sorted(p for _, p in started) == ["acc-7f3a", "default", "zz.mail"]
    assert report.stopped == "empty" and report.claimed == 3


async def test_a_list_ending_in_star_drains_the_rest_and_skips_paused(db: SqliteD1) -> None:
    from d1queue.store.admin import Admin

    clock = Clock()
    queue = D1Queue(db, clock=clock)
    started: list[tuple[int, str]] = []
    for name in ("a", "b", "c", "held"):
        await queue.dispatch("work", name, queue=name)
    await Admin(queue).set_paused("held", True)
    only_b = await drain(queue, registry(db, started), Config(queues=("b",)))
    assert [p for _, p in started] == ["b"] and only_b.claimed == 1
    rest = await drain(queue, registry(db, started), Config(queues=("c", "*")))
    assert [p for _, p in started] == ["b", "c", "a"], "listed first, then the rest by name"
    assert rest.paused == ["held"]
