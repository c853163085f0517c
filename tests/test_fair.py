"""Draining several queues: every queue with due work runs, fairly."""

from __future__ import annotations

from typing import Any

from d1queue import Config, D1Queue, Registry, drain
from d1queue.testing import SqliteD1

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
