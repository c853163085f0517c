"""The seed's design, as the baseline every figure is compared with.

A faithful port of rainier-queue 2.0.0's `DatabaseQueue`
(/work/shared/seed/000_a36f10c60c30a0dd.txt) to plain SQL on a D1 binding:

- its schema: the `rainier_jobs` columns with plain indexes on `(queue)` and
  `(queue, reserved_at)` (here `seed_jobs`, in the same D1 as d1queue's
  tables), and `rainier_failed_jobs` with an index on `(queue)`;
- `reserve`: SELECT up to 5 candidates (`queue = ? AND reserved_at IS NULL AND
  available_at <= ?` ORDER BY available_at), then one
  `UPDATE … WHERE id = ? AND reserved_at IS NULL` per candidate, one round
  trip each, until one changes a row;
- `acknowledge`: DELETE by id; `fail`: INSERT the failed row, then DELETE by
  id (two round trips, no transaction); `release`: UPDATE by id;
- `reclaim_expired`: SELECT up to 100 lapsed rows (no index serves it), then
  one UPDATE per row.

The seed has no drain of its own (its worker loop is not in the driver); the
baseline invocation here is what a cron-driven Worker would do with it:
reclaim, then reserve → run → acknowledge, one job at a time, stopping when
the next job's three queries would not fit in the budget.

Timestamps are integer epoch milliseconds, as in d1queue (the seed's ORM
stores `DateTime<Utc>`; the representation changes no row counts). Every call
goes through d1queue's `Binding`, so both designs are counted the same way.
Runs under CPython (SqliteD1) and inside Pyodide (the Worker's D1).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from d1queue.store.binding import Binding

JOBS = "seed_jobs"
FAILED = "seed_failed_jobs"

SCHEMA = [
    f"CREATE TABLE IF NOT EXISTS {JOBS} ("
    "id TEXT PRIMARY KEY NOT NULL, queue TEXT NOT NULL, name TEXT NOT NULL, "
    "payload TEXT NOT NULL, attempts INTEGER NOT NULL, max_attempts INTEGER NOT NULL, "
    "available_at INTEGER NOT NULL, reserved_at INTEGER, reserved_until INTEGER, "
    "created_at INTEGER NOT NULL, unique_key TEXT)",
    # #[orm(index)] on `queue`, and #[orm(index = "queue, reserved_at")].
    f"CREATE INDEX IF NOT EXISTS {JOBS}_queue ON {JOBS} (queue)",
    f"CREATE INDEX IF NOT EXISTS {JOBS}_queue_reserved_at ON {JOBS} (queue, reserved_at)",
    f"CREATE TABLE IF NOT EXISTS {FAILED} ("
    "id TEXT PRIMARY KEY NOT NULL, queue TEXT NOT NULL, name TEXT NOT NULL, "
    "payload TEXT NOT NULL, error TEXT NOT NULL, failed_at INTEGER NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS {FAILED}_queue ON {FAILED} (queue)",
]

COLUMNS = (
    "id, queue, name, payload, attempts, max_attempts, available_at, reserved_at, "
    "reserved_until, created_at, unique_key"
)
PUSH = f"INSERT INTO {JOBS} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)"
CANDIDATES = (
    f"SELECT {COLUMNS} FROM {JOBS} WHERE queue = ? AND reserved_at IS NULL "
    "AND available_at <= ? ORDER BY available_at LIMIT ?"
)
CLAIM = (
    f"UPDATE {JOBS} SET attempts = ?, reserved_at = ?, reserved_until = ? "
    "WHERE id = ? AND reserved_at IS NULL"
)
DELETE = f"DELETE FROM {JOBS} WHERE id = ?"
RELEASE = (
    f"UPDATE {JOBS} SET reserved_at = NULL, reserved_until = NULL, available_at = ? WHERE id = ?"
)
FAIL_INSERT = (
    f"INSERT INTO {FAILED} (id, queue, name, payload, error, failed_at) VALUES (?, ?, ?, ?, ?, ?)"
)
STALE = (
    f"SELECT {COLUMNS} FROM {JOBS} WHERE reserved_at IS NOT NULL AND reserved_until < ? LIMIT 100"
)
# The ORM's update(): every column of the row, by primary key.
UPDATE_ROW = (
    f"UPDATE {JOBS} SET queue = ?, name = ?, payload = ?, attempts = ?, max_attempts = ?, "
    "available_at = ?, reserved_at = ?, reserved_until = ?, created_at = ?, unique_key = ? "
    "WHERE id = ?"
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class SeedQueue:
    """The seed's DatabaseQueue over a D1 binding (or a counted Binding)."""

    def __init__(self, db: Any, *, reservation_s: float = 90, max_claim_attempts: int = 5):
        self.binding = db if isinstance(db, Binding) else Binding(db)
        self.reservation_ms = round(reservation_s * 1000)
        self.max_claim_attempts = max_claim_attempts

    async def create_tables(self) -> None:
        await self.binding.batch([(s, ()) for s in SCHEMA])

    async def push(
        self, name: str, payload: Any, *, queue: str = "default", max_attempts: int = 3
    ) -> str:
        now = now_ms()
        job_id = os.urandom(16).hex()
        await self.binding.run(
            PUSH, job_id, queue, name, json.dumps(payload), 0, max_attempts, now, now, None
        )
        return job_id

    async def reserve(self, queue: str) -> dict[str, Any] | None:
        now = now_ms()
        found = await self.binding.run(CANDIDATES, queue, now, self.max_claim_attempts)
        for row in found.rows:
            attempts = int(row["attempts"]) + 1
            claimed = await self.binding.run(
                CLAIM, attempts, now, now + self.reservation_ms, row["id"]
            )
            if claimed.changes == 1:
                return {**row, "attempts": attempts}
        return None

    async def acknowledge(self, job: dict[str, Any]) -> None:
        await self.binding.run(DELETE, job["id"])

    async def release(self, job: dict[str, Any], delay_s: float = 0) -> None:
        await self.binding.run(RELEASE, now_ms() + round(delay_s * 1000), job["id"])

    async def fail(self, job: dict[str, Any], error: str) -> None:
        await self.binding.run(
            FAIL_INSERT, job["id"], job["queue"], job["name"], job["payload"], error, now_ms()
        )
        await self.binding.run(DELETE, job["id"])

    async def reclaim_expired(self) -> int:
        stale = await self.binding.run(STALE, now_ms())
        reclaimed = 0
        for row in stale.rows:
            result = await self.binding.run(
                UPDATE_ROW,
                row["queue"],
                row["name"],
                row["payload"],
                row["attempts"],
                row["max_attempts"],
                row["available_at"],
                None,
                None,
                row["created_at"],
                row["unique_key"],
                row["id"],
            )
            reclaimed += result.changes
        return reclaimed


Handler = Callable[[Any], Awaitable[None]]


@dataclass
class SeedReport:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    stopped: str = ""


async def seed_drain(
    queue: SeedQueue,
    handlers: dict[str, Handler],
    *,
    name: str = "default",
    query_budget: int = 45,
    batch_counts_as: str = "query",
    max_jobs: int | None = None,
) -> SeedReport:
    """One invocation with the seed's driver: reclaim, then reserve → run →
    acknowledge (or fail, when the handler raises) one job at a time, while
    the next job's three queries fit in the budget. The seed sends no batch,
    so `batch_counts_as` changes nothing: a query is a statement."""
    usage = queue.binding.usage
    base = usage.queries if batch_counts_as == "query" else usage.statements
    report = SeedReport()

    def spent() -> int:
        return (usage.queries if batch_counts_as == "query" else usage.statements) - base

    await queue.reclaim_expired()
    while True:
        if max_jobs is not None and report.claimed >= max_jobs:
            report.stopped = "max_jobs"
            break
        if query_budget - spent() < 3:
            report.stopped = "query_budget"
            break
        job = await queue.reserve(name)
        if job is None:
            report.stopped = "empty"
            break
        report.claimed += 1
        try:
            await handlers[job["name"]](json.loads(job["payload"]))
        except Exception as exc:
            await queue.fail(job, f"{type(exc).__name__}: {exc}")
            report.failed += 1
        else:
            await queue.acknowledge(job)
            report.completed += 1
    return report
