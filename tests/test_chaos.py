"""Chaos: 2,000 jobs drained by 8 drains in 4 processes sharing one SQLite
file, with D1's faults injected on every connection (calls failing before
they commit, replies lost after, "overloaded" errors), drains cancelled
mid-round and processes killed with SIGKILL. Checked from the handlers'
own ledger: no job lost, no completed job run again unless the drain that ran
it was killed or cancelled, no completed job in the failed table. Prints the
figures it checks."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from d1queue import D1Queue, QueuedJob
from d1queue.interfaces.testing import SqliteD1

from .conftest import MIGRATIONS, ROOT

JOBS = 2_000
PROCESSES = 4
KILLS = 6
DEADLINE_S = 240.0


def spawn(db: Path, ledger: Path, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.chaos_worker", str(db), str(ledger), str(seed)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finished(ledgers: list[Path]) -> int:
    return sum(p.read_text().count("done ") for p in ledgers if p.exists())


def test_chaos_loses_nothing_and_reruns_only_what_died(tmp_path: Path) -> None:
    db_path = tmp_path / "d1.sqlite"
    db = SqliteD1(db_path)
    db.apply_migrations(MIGRATIONS)
    jobs = [QueuedJob.new("chaos", i, max_attempts=1 if i % 10 == 0 else 25) for i in range(JOBS)]
    for start in range(0, JOBS, 100):
        asyncio.run(D1Queue(db).push_many(jobs[start : start + 100]))

    rng = random.Random(20261202)
    ledgers = []
    procs: dict[int, subprocess.Popen[bytes]] = {}
    killed: set[int] = set()

    def launch() -> None:
        ledger = tmp_path / f"ledger-{len(ledgers)}.txt"
        ledgers.append(ledger)
        p = spawn(db_path, ledger, rng.randrange(2**31))
        procs[p.pid] = p

    for _ in range(PROCESSES):
        launch()
    deadline = time.monotonic() + DEADLINE_S
    # Kills come with progress, not time, so every run meets them all.
    kill_at = sorted(rng.sample(range(150, JOBS - 300), KILLS))
    kills = 0
    while procs and time.monotonic() < deadline:
        time.sleep(0.1)
        for pid, p in list(procs.items()):
            if p.poll() is not None:
                del procs[pid]
                assert p.returncode == 0 or pid in killed, (
                    p.stderr.read() if p.stderr else b""
                ).decode()
        if kills < KILLS and procs and finished(ledgers) >= kill_at[kills]:
            pid = rng.choice(sorted(procs))
            procs[pid].send_signal(signal.SIGKILL)
            procs[pid].wait()
            killed.add(pid)
            del procs[pid]
            kills += 1
            launch()
    for p in procs.values():
        p.kill()
    assert not procs, f"the workers did not finish within {DEADLINE_S:.0f}s"

    starts: Counter[int] = Counter()
    done: dict[int, list[str]] = defaultdict(list)
    cancelled: set[str] = set()
    unsettled: list[str] = []
    stale: list[str] = []
    for ledger in ledgers:
        if not ledger.exists():
            continue  # started as the queue emptied: it wrote nothing
        for line in ledger.read_text().splitlines():
            kind, *rest = line.split()
            if kind == "start":
                starts[int(rest[0])] += 1
            elif kind == "done":
                done[int(rest[0])].append(rest[1])
            elif kind == "cancel":
                cancelled.add(rest[0])
            elif kind == "stale":
                stale.append(" ".join(rest))
            elif kind == "unsettled":
                unsettled += rest[1:]

    def died(drain_id: str) -> bool:
        return drain_id in cancelled or int(drain_id.split(".")[0]) in killed

    left = db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"]
    failed = {int(r["payload"]) for r in db.query("SELECT payload FROM d1queue_failed_jobs")}
    lost = [i for i in range(JOBS) if not done[i] and i not in failed]
    rerun = {i: ids for i, ids in done.items() if len(ids) > 1}
    # The ledgers are read one after another, not in time order: a re-run is
    # excused when at most one of the drains that finished the job lived on.
    excused = {i for i, ids in rerun.items() if sum(not died(d) for d in ids) <= 1}
    our_fault = sorted(set(rerun) - excused)
    completed_then_failed = sorted(
        i for i in failed if done[i] and not all(died(d) for d in done[i])
    )
    print(
        f"\nchaos: {JOBS} jobs, {len(ledgers)} worker processes ({kills} killed), "
        f"{len(cancelled)} drains cancelled; {sum(starts.values())} handler runs; "
        f"lost {len(lost)}; failed {len(failed)} (of them after succeeding: "
        f"{len(completed_then_failed)}); completed jobs run again: {len(rerun)}, "
        f"{len(excused)} because their drain was killed or cancelled, {len(our_fault)} "
        f"otherwise; stale settles reported: {len(stale)}; unsettled outcomes reported: "
        f"{len(unsettled)}"
    )
    assert left == 0
    assert lost == []
    if our_fault:
        ids = set(rerun[our_fault[0]])
        for ledger in ledgers:
            for line in ledger.read_text().splitlines() if ledger.exists() else []:
                if any(d in line.split() for d in ids) and not line.startswith(("start", "done")):
                    print(ledger.name, line)
    assert our_fault == [], {i: rerun[i] for i in our_fault[:10]}
    assert completed_then_failed == []
    assert unsettled == []
    assert kills == KILLS and cancelled, "the run did meet kills and cancellations"
    # Each failure's history: no attempt recorded twice, however often its
    # settles were re-sent, and each entry with its own progress and line.
    for row in db.query("SELECT runs, attempts FROM d1queue_failed_jobs"):
        runs = json.loads(row["runs"])
        numbers = [r["attempt"] for r in runs]
        assert numbers == sorted(set(numbers)) and numbers[-1] == row["attempts"], numbers
        for r in runs:
            if r.get("error", "").startswith("attempted too many times"):
                continue  # claimed with its attempts spent by a worker that died: not run
            assert r["progress"]["value"] == r["attempt"], r
            assert [x["message"] for x in r["logs"]] == [f"attempt {r['attempt']}"], r
