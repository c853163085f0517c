"""The CPython comparison: dispatch + claim + ack of the same N jobs, one
SQLite file each, same machine, same journal mode (WAL, which Huey and
persist-queue switch on themselves; SqliteD1's file is switched to it first).

- d1queue: `D1Queue.dispatch` one job at a time on `SqliteD1(path)`, then
  `drain` (batch 25, no-op handler) until every job is acknowledged;
- Huey 3: `SqliteStorage.enqueue` one at a time, then `dequeue` until empty
  (Huey's dequeue deletes the row: claim and ack are one step, at most once);
- persist-queue: `SQLiteAckQueue.put` one at a time, then `get` + `ack` each
  (at least once, as d1queue).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = {"to": "ada@example.com", "template": "welcome"}


def _d1queue(n: int, directory: Path) -> tuple[float, float]:
    from d1queue import Config, D1Queue, Registry, drain
    from d1queue.interfaces.testing import SqliteD1

    path = directory / "d1queue.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    db = SqliteD1(path)
    db.apply_migrations()  # the package's own migrations
    registry = Registry()

    @registry.job("bench.noop", timeout_s=10)
    async def noop(payload: Any) -> None:
        pass

    async def go() -> tuple[float, float]:
        queue = D1Queue(db)
        t0 = time.perf_counter()
        for _ in range(n):
            await queue.dispatch("bench.noop", PAYLOAD)
        t1 = time.perf_counter()
        done = 0
        while done < n:
            report = await drain(
                queue,
                registry,
                Config(
                    plan="paid", query_budget=1000, batch_size=25, time_budget_s=60, stats=False
                ),
            )
            if report.completed == 0:
                raise RuntimeError(f"d1queue drained {done} of {n} jobs, then nothing")
            done += report.completed
        return t1 - t0, time.perf_counter() - t1

    try:
        return asyncio.run(go())
    finally:
        db.close()


def _huey(n: int, directory: Path) -> tuple[float, float]:
    from huey.storage import SqliteStorage

    storage = SqliteStorage(name="bench", filename=str(directory / "huey.sqlite"))
    data = json.dumps({"name": "bench.noop", "payload": PAYLOAD}).encode()
    t0 = time.perf_counter()
    for _ in range(n):
        storage.enqueue(data)
    t1 = time.perf_counter()
    got = 0
    while storage.dequeue() is not None:
        got += 1
    t2 = time.perf_counter()
    if got != n:
        raise RuntimeError(f"huey dequeued {got} of {n}")
    return t1 - t0, t2 - t1


def _persist_queue(n: int, directory: Path) -> tuple[float, float]:
    from persistqueue import Empty, SQLiteAckQueue

    queue = SQLiteAckQueue(str(directory / "persist-queue"))
    item = {"name": "bench.noop", "payload": PAYLOAD}
    t0 = time.perf_counter()
    for _ in range(n):
        queue.put(item)
    t1 = time.perf_counter()
    got = 0
    while True:
        try:
            job = queue.get(block=False)
        except Empty:
            break
        queue.ack(job)
        got += 1
    t2 = time.perf_counter()
    queue.close()
    if got != n:
        raise RuntimeError(f"persist-queue got {got} of {n}")
    return t1 - t0, t2 - t1


SYSTEMS = {"d1queue": _d1queue, "huey": _huey, "persist-queue": _persist_queue}


def compare(n: int) -> dict[str, Any]:
    """jobs/s per phase and overall, per system."""
    out: dict[str, Any] = {"jobs": n}
    for name, run in SYSTEMS.items():
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as d:
            push_s, consume_s = run(n, Path(d))
        out[name] = {
            "push_s": push_s,
            "claim_ack_s": consume_s,
            "push_per_s": n / push_s,
            "claim_ack_per_s": n / consume_s,
            "jobs_per_s": n / (push_s + consume_s),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(compare(500), indent=2))
