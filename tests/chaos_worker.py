"""One worker process of the chaos test (tests/test_chaos.py).

`python -m tests.chaos_worker DB LEDGER SEED` runs two drain loops on the
shared SQLite file DB, each through its own connection with D1's faults
injected: calls failing before they commit, replies lost after they commit,
"overloaded" errors that are not retried. Now and then it cancels one of its
drains mid-round and starts another. It writes to LEDGER, one line per event,
unbuffered (the test kills these processes): `start|done <payload> <drain>`
around each handler run, `cancel <drain>` for a cancelled drain. It exits once
the queue holds no job.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from typing import Any

from d1queue import Backoff, Config, D1Queue, JobContext, Registry, drain
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.binding import Binding, RetryPolicy

RESERVATION_S = 12.0
"""Short, so the jobs of killed and cancelled drains come back quickly, yet
long enough that a live drain never overruns it: SqliteD1 is synchronous, and
a call waiting for another process's write lock (up to its 5 s busy timeout)
stalls this whole process."""
TIMEOUT_S = 4.0
TRANSIENT = 0.006
"""Per statement: "Network connection lost." before the call commits."""
LOST_REPLY = 0.003
"""Per statement: the call commits, then "Network connection lost."."""
OVERLOADED = 0.002
"""Per statement: "D1 DB is overloaded", which the binding does not retry."""
FLAKY = 0.03
"""Handler attempts that raise (and are retried)."""
CANCEL_EVERY_S = (0.3, 1.0)


class Ledger:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())  # one write: survives a kill


def faulty_db(path: str, rng: random.Random) -> SqliteD1:
    db = SqliteD1(path)
    db.fail_when(
        lambda _: rng.random() < TRANSIENT, "D1_ERROR: Network connection lost.", times=None
    )
    db.fail_when(
        lambda _: rng.random() < OVERLOADED,
        "D1_ERROR: D1 DB is overloaded. Too many requests queued.",
        times=None,
    )
    db.lose_reply_when(lambda _: rng.random() < LOST_REPLY, times=None)
    return db


def registry(ledger: Ledger, rng: random.Random) -> Registry:
    reg = Registry()

    @reg.job("chaos", timeout_s=TIMEOUT_S, backoff=Backoff(base_s=0.05, max_s=0.2), subrequests=1)
    async def chaos(payload: Any, ctx: JobContext) -> None:
        drain_id = ctx.env["drain"]
        ledger.write(f"start {payload} {drain_id}")
        # Its attempt's progress and log line, written under the same faults.
        ctx.log.info("attempt %d", ctx.attempt)
        await ctx.progress(ctx.attempt)
        await asyncio.sleep(rng.random() * 0.01)
        if rng.random() < FLAKY:
            raise RuntimeError("flaky")
        ledger.write(f"done {payload} {drain_id}")

    return reg


async def drain_loop(db_path: str, ledger: Ledger, rng: random.Random, drain_id: str) -> None:
    reg = registry(ledger, rng)
    binding = Binding(faulty_db(db_path, rng), retry=RetryPolicy(tries=5, base_s=0.01, cap_s=0.05))
    queue = D1Queue(binding, reservation_s=RESERVATION_S)
    config = Config(plan="paid", batch_size=10, concurrency=5, time_budget_s=1.0, max_jobs=200)
    while True:
        report = await drain(queue, reg, config, env={"drain": drain_id})
        if report.unsettled:
            ledger.write(f"unsettled {drain_id} {' '.join(report.unsettled)}")
        if report.stale:
            ledger.write(f"stale {drain_id} {report.stale} {report.elapsed_s} {report.stopped}")
        if report.claimed == 0:
            await asyncio.sleep(0.05)


def left(db_path: str) -> int:
    db = SqliteD1(db_path)
    try:
        return int(db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"])
    finally:
        db.close()


async def main(db_path: str, ledger_path: str, seed: int) -> None:
    rng = random.Random(seed)
    ledger = Ledger(ledger_path)
    pid = os.getpid()
    made = 0

    def start() -> tuple[str, asyncio.Task[None]]:
        nonlocal made
        made += 1
        drain_id = f"{pid}.{made}"
        return drain_id, asyncio.create_task(drain_loop(db_path, ledger, rng, drain_id))

    drains = [start(), start()]
    next_cancel = asyncio.get_running_loop().time() + rng.uniform(*CANCEL_EVERY_S)
    while left(db_path):
        await asyncio.sleep(0.05)
        for _, task in drains:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError("a drain raised") from task.exception()
        if asyncio.get_running_loop().time() >= next_cancel:
            victim = rng.randrange(len(drains))
            drain_id, task = drains[victim]
            ledger.write(f"cancel {drain_id}")
            task.cancel()
            drains[victim] = start()
            next_cancel += rng.uniform(*CANCEL_EVERY_S)
    for _, task in drains:
        task.cancel()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
