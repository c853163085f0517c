"""Workflows (results and history, dependencies, batches) in the real Worker:
Pyodide running the upload, Miniflare's D1 with migration 0010's triggers,
counted from OUTSIDE the Worker.

Every job is an `http.request` whose target is the Target below, an HTTP
server in this test process on 127.0.0.1. It records each request's arrival
(the job's handler started: the job runs) and, just before it writes the
answer, the request's end (so before the handler can return and its job be
settled, which is what releases a job waiting for it or counts it for its
batch). A path under /fail/ is answered 400, which fails the job for good.

The workflows are set up by the library itself (D1Queue.push_batch,
push_many with `after`, chain) through the test hook, as the flow test
pushes its grouped jobs: the HTTP API takes no `after` or batch yet. The
hook meets no injected D1 fault; everything the Worker does after the push
does (claims, settles and the triggers they fire, cron runs).

- Smoke (no faults): migration 0010 is applied (its triggers are in the
  schema); a chain runs in order, each job after the one before it was
  answered, and keeps its result; a failing link fails the rest with
  `dependency <id> failed`; a batch fires on_success and on_finish once.
- Chaos: a batch of 500 jobs of which every 10th fails for good (on_failure
  and on_finish; on_success must never fire), a batch of 100 that all
  succeed (on_success and on_finish; never on_failure), and a 3-level
  dependency tree of 300 jobs (100 roots; 100 children each after 1-3 roots;
  100 grandchildren each after 1-3 children, pushed while the drains run),
  drained by cycles of DRAINS cron runs fired at once, 10% of the Worker's
  D1 calls failing (lost before D1, lost after D1 committed, overloaded).
  The host is SIGKILLed mid-run (requests in flight at the target), and a
  new host on the same D1 state finishes.

What is asserted:
- each callback is enqueued exactly once: one completed row of its id
  ("<batch>:on_success" ...), none live or failed; at the target it runs
  once, or again only where a lease lapse explains it (below); the callback
  that must not fire has no row and no arrival; its arrival comes after the
  last member's answer (on_failure: after a failing member's answer);
- the batches' counters: completed + failed == total, pending 0, failed ==
  the jobs sent to /fail/, `fired` the callbacks' bits;
- every job of the tree starts (each of its arrivals) only after an answer
  of each of its dependencies was written (a run of the dependency ended
  before it), and completed (one done row each, no failure);
- nothing lost: every job ran, and no job is left live;
- at least once, not more than explained: two runs of one job never overlap
  at the target, and a job runs again only when its first run was in the
  killed host, its outcome was reported unsettled by a drain, or its lease
  was lapsed by the test (held past STRANDED_S with no request of it at the
  target): each allows one more run.

Leases are lapsed by aging them, as test_chaos_runtime and test_flow_runtime
do (this Worker's leases last over a minute).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from .conftest import Host, start_host
from .test_chaos_runtime import events, scheduled
from .test_flow_runtime import hook

FAULT_RATE = "0.1"
LATENCY_MS = "20"
SEED = 20270415
DRAINS = 8
"""Cron runs fired at once, a cycle."""
MAX_JOBS = 20
"""Jobs one cron run may claim (D1QUEUE_MAX_JOBS): many runs are needed, and
their claims and settles overlap."""
MAX_ATTEMPTS = 20
"""Enough that lapsed leases never fail a job for its attempts."""
HOLD_S = (0.02, 0.25)
"""How long the target holds each request, drawn per job."""
STRANDED_S = 10.0
"""A job held this long with no request of it open at the target is held by
no live handler: its lease may be aged."""
KILL_AT = 350
"""The first host is killed once this many requests reached the target (and
one is in flight)."""
GRANDCHILDREN_AT = 60
"""The tree's third level is pushed once this many requests reached the target."""
QUEUE = "wf"
BATCH_N, OK_BATCH_N, FAIL_EVERY = 500, 100, 10
ROOTS = CHILDREN = GRANDCHILDREN = 100
KINDS = ("on_success", "on_failure", "on_finish")
BITS = {"on_success": 1, "on_failure": 2, "on_finish": 4}


# -- the outside target -----------------------------------------------------------------


@dataclass
class Run:
    key: str
    start: float
    end: float | None = None


class Target(ThreadingHTTPServer):
    """The jobs' target: every request's arrival and end, by the job's key."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.runs: list[Run] = []
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def payload(self, key: str, hold_s: float, *, fail: bool = False) -> dict[str, Any]:
        """An http.request payload aimed here, for job `key`."""
        return {
            "url": f"http://127.0.0.1:{self.server_address[1]}/{'fail' if fail else 'ok'}/{key}",
            "method": "POST",
            "body": {"key": key, "hold_s": hold_s},
            "timeout_s": 30,
        }

    def arrive(self, key: str) -> Run:
        with self.lock:
            run = Run(key, time.monotonic())
            self.runs.append(run)
            return run

    def leave(self, run: Run) -> None:
        with self.lock:
            run.end = time.monotonic()

    def all(self) -> list[Run]:
        with self.lock:
            return list(self.runs)

    def by_key(self) -> dict[str, list[Run]]:
        out: dict[str, list[Run]] = {}
        for r in self.all():
            out.setdefault(r.key, []).append(r)
        return out

    def open_keys(self) -> set[str]:
        return {r.key for r in self.all() if r.end is None}

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Target

    def do_POST(self) -> None:
        _, verdict, key = self.path.split("/", 2)
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        assert body["key"] == key, body
        run = self.server.arrive(key)
        try:
            time.sleep(float(body["hold_s"]))
        finally:
            self.server.leave(run)  # before the answer: before the job can be settled
        status, text = (200, b"ok") if verdict == "ok" else (400, b"no")
        try:
            self.send_response(status)
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        except OSError:
            pass  # the host was killed: nobody reads the answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    yield t
    t.stop()


# -- the Worker's side ------------------------------------------------------------------


def push_batches(host: Host, batches: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """D1Queue.push_batch per batch {label, jobs: [payload], callbacks: {kind:
    payload}}: returns {label: {id, ids}}."""
    out: dict[str, dict[str, Any]] = hook(
        host,
        """
        from d1queue import D1Queue

        async def main(env):
            q = D1Queue(env.DB)

            def make(payload):
                return q.new_job("http.request", payload, queue=VALUES["queue"],
                                 max_attempts=VALUES["max_attempts"])

            out = {}
            for b in VALUES["batches"]:
                callbacks = {k: make(p) for k, p in b["callbacks"].items()}
                batch_id, ids = await q.batch([make(p) for p in b["jobs"]], **callbacks)
                out[b["label"]] = {"id": batch_id, "ids": ids}
            return out
        """,
        queue=QUEUE,
        max_attempts=MAX_ATTEMPTS,
        batches=batches,
    )
    return out


def push_after(host: Host, jobs: list[dict[str, Any]], chunk: int = 25) -> list[str]:
    """Push jobs {payload, after: [ids] | None} with push_many, `chunk` a
    db.batch, in order; returns their ids."""
    ids: list[str] = hook(
        host,
        """
        from d1queue import D1Queue

        async def main(env):
            q = D1Queue(env.DB)
            made = [
                q.new_job("http.request", j["payload"], queue=VALUES["queue"],
                          max_attempts=VALUES["max_attempts"], after=j["after"])
                for j in VALUES["jobs"]
            ]
            out = []
            for i in range(0, len(made), VALUES["chunk"]):
                out += [job_id for job_id, _ in await q.push_many(made[i : i + VALUES["chunk"]])]
            return out
        """,
        queue=QUEUE,
        max_attempts=MAX_ATTEMPTS,
        jobs=jobs,
        chunk=chunk,
    )
    assert len(set(ids)) == len(jobs)
    return ids


def state(host: Host) -> dict[str, int]:
    """d1queue_jobs by state: live (not completed), held, completed (kept);
    and the failed jobs."""
    out: dict[str, int] = hook(
        host,
        """
        async def main(env):
            out = {}
            for name, sql in [
                ("live", "SELECT COUNT(*) AS n FROM d1queue_jobs WHERE band > -1004"),
                ("held", "SELECT COUNT(*) AS n FROM d1queue_jobs WHERE reserved_at IS NOT NULL"),
                ("done", "SELECT COUNT(*) AS n FROM d1queue_jobs WHERE band = -1004"),
                ("failed", "SELECT COUNT(*) AS n FROM d1queue_failed_jobs"),
            ]:
                out[name] = (await env.DB.prepare(sql).first())["n"]
            return out
        """,
    )
    return out


def rows_by_id(host: Host, ids: list[str]) -> dict[str, dict[str, Any]]:
    """For each id: its done rows (count, last result), live rows, failed rows
    (count, last error)."""
    out: dict[str, dict[str, Any]] = hook(
        host,
        """
        from d1queue.store.binding import Binding

        async def main(env):
            b = Binding(env.DB)
            out = {i: {"done": 0, "live": 0, "failed": 0, "result": None, "error": None}
                   for i in VALUES["ids"]}
            ids = json.dumps(VALUES["ids"])
            rows = (await b.run(
                "SELECT id, band, result FROM d1queue_jobs "
                "WHERE id IN (SELECT value FROM json_each(?1))", ids)).rows
            for r in rows:
                o = out[r["id"]]
                if r["band"] == -1004:
                    o["done"] += 1
                    o["result"] = r["result"]
                else:
                    o["live"] += 1
            rows = (await b.run(
                "SELECT id, error FROM d1queue_failed_jobs "
                "WHERE id IN (SELECT value FROM json_each(?1))", ids)).rows
            for r in rows:
                out[r["id"]]["failed"] += 1
                out[r["id"]]["error"] = r["error"]
            return out
        """,
        ids=ids,
    )
    return out


def batch_rows(host: Host, batch_ids: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = hook(
        host,
        """
        from d1queue.store.binding import Binding

        async def main(env):
            r = await Binding(env.DB).run(
                "SELECT id, total, pending, completed, failed, fired, finished_at "
                "FROM d1queue_batches WHERE id IN (SELECT value FROM json_each(?1))",
                json.dumps(VALUES["ids"]))
            return {row["id"]: row for row in r.rows}
        """,
        ids=batch_ids,
    )
    return out


def lapse(host: Host, *, held_s: float, spare: set[str]) -> list[str]:
    """Lapse the leases held at least `held_s` (but those of `spare`), as
    waiting for their ends would, and bring retry waits due now. Call it
    only for leases no live drain holds. Returns the ids lapsed."""
    lapsed: list[str] = hook(
        host,
        """
        import time
        from d1queue.store.binding import Binding

        async def main(env):
            b = Binding(env.DB)
            now = int(time.time() * 1000)
            rows = (await b.run(
                "SELECT id, reservation FROM d1queue_jobs WHERE band = -1002 "
                "AND reserved_at IS NOT NULL AND reserved_at <= ?1",
                now - int(VALUES["held_s"] * 1000))).rows
            out = []
            for r in rows:
                if r["id"] in VALUES["spare"]:
                    continue
                done = await b.run(
                    "UPDATE d1queue_jobs SET available_at = ?1, locked_until = ?1 "
                    "WHERE id = ?2 AND reservation = ?3 AND reserved_at IS NOT NULL",
                    now - 1, r["id"], r["reservation"])
                if done.changes == 1:
                    out.append(r["id"])
            await b.run(
                "UPDATE d1queue_jobs SET available_at = ?1, locked_until = ?1 "
                "WHERE band = -1002 AND reserved_at IS NULL AND available_at > ?1", now - 1)
            return out
        """,
        held_s=held_s,
        spare=sorted(spare),
    )
    return lapsed


def host_args(seed: int, *, faults: bool = True) -> tuple[str, ...]:
    fault_args = ("--d1-fault", FAULT_RATE, "--d1-latency-ms", LATENCY_MS) if faults else ()
    return (
        "--plan",
        "paid",
        "--cpu",
        "warn",
        "--var",
        "D1QUEUE_PLAN=paid",
        "--var",
        f"D1QUEUE_MAX_JOBS={MAX_JOBS}",
        *fault_args,
        "--d1-seed",
        str(seed),
    )


def cycle(host: Host, answers: Counter[str]) -> None:
    threads = [threading.Thread(target=scheduled, args=(host, answers)) for _ in range(DRAINS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def drain_until_done(
    host: Host, target: Target, key_of: dict[str, str], *, deadline_s: float = 150
) -> tuple[int, list[str], Counter[str]]:
    """Cycles until no job is live. A cycle that leaves the tables as they
    were with jobs held lapses the leases held past STRANDED_S whose job has
    no request open at the target. Returns (cycles, lapsed ids, answers)."""
    answers: Counter[str] = Counter()
    lapsed: list[str] = []
    deadline = time.monotonic() + deadline_s
    left = state(host)
    cycles = 0
    while left["live"]:
        assert time.monotonic() < deadline, f"not drained: {left}, lapsed {lapsed}"
        cycle(host, answers)
        cycles += 1
        now = state(host)
        if now == left:
            busy = target.open_keys()
            spare = {i for i, k in key_of.items() if k in busy}
            lapsed += lapse(host, held_s=STRANDED_S, spare=spare)
        left = now
    return cycles, lapsed, answers


def answered_before(runs: list[Run], t: float) -> bool:
    """Whether one of `runs` was answered before moment t."""
    return any(r.end is not None and r.end < t for r in runs)


# -- smoke: the workflows in the real runtime, no faults --------------------------------


def test_migration_0010_is_applied(clean_host: Host) -> None:
    names = hook(
        clean_host,
        """
        async def main(env):
            r = await env.DB.prepare(
                "SELECT type, name FROM sqlite_master WHERE name LIKE 'd1queue_%' "
                "AND type IN ('table', 'trigger')").all()
            return sorted(f"{x['type']} {x['name']}" for x in r["results"])
        """,
    )
    for wanted in (
        "trigger d1queue_jobs_join",
        "trigger d1queue_jobs_ended",
        "table d1queue_deps",
        "table d1queue_batches",
        "table d1queue_batch_parts",
    ):
        assert wanted in names, names


def drain_quietly(host: Host, rounds: int = 30) -> None:
    """Cron runs, one at a time, until no job is live (no faults here)."""
    for _ in range(rounds):
        host.scheduled()
        host.idle()
        if not state(host)["live"]:
            return
    raise AssertionError(f"not drained: {state(host)}")


def push_chain(host: Host, payloads: list[dict[str, Any]]) -> list[str]:
    """`http.request` jobs with `payloads`, pushed as a chain (D1Queue.chain)
    from inside the Worker; their ids."""
    ids: list[str] = hook(
        host,
        """
        from d1queue import D1Queue

        async def main(env):
            q = D1Queue(env.DB)
            return await q.chain([q.new_job("http.request", p, queue=VALUES["queue"])
                                  for p in VALUES["payloads"]])
        """,
        queue=QUEUE,
        payloads=payloads,
    )
    return ids


def test_a_chain_runs_in_order_and_keeps_results(clean_host: Host, target: Target) -> None:
    host = clean_host
    keys = [f"chain/{i}" for i in range(5)]
    ids = push_chain(host, [target.payload(k, 0.05) for k in keys])
    waiting = rows_by_id(host, ids)
    assert all(w["live"] == 1 for w in waiting.values())
    drain_quietly(host)
    runs = target.by_key()
    assert [len(runs.get(k, [])) for k in keys] == [1] * 5, runs
    for before, after in pairwise(keys):
        assert runs[before][0].end is not None
        assert runs[before][0].end < runs[after][0].start, (before, after)
    rows = rows_by_id(host, ids)
    for i in ids:
        assert rows[i]["done"] == 1 and rows[i]["live"] == rows[i]["failed"] == 0, rows[i]
        assert json.loads(rows[i]["result"]) == {"status": 200, "body": "ok"}


def test_a_failed_link_fails_the_rest_of_its_chain(clean_host: Host, target: Target) -> None:
    host = clean_host
    payloads = [
        target.payload("fchain/0", 0.01),
        target.payload("fchain/1", 0.01, fail=True),
        target.payload("fchain/2", 0.01),
        target.payload("fchain/3", 0.01),
    ]
    ids = push_chain(host, payloads)
    drain_quietly(host)
    runs = target.by_key()
    assert sorted(runs) == ["fchain/0", "fchain/1"], runs
    rows = rows_by_id(host, ids)
    assert rows[ids[0]]["done"] == 1
    assert rows[ids[1]]["failed"] == 1 and "answered 400" in rows[ids[1]]["error"]
    assert rows[ids[2]]["failed"] == 1
    assert rows[ids[2]]["error"] == f"dependency {ids[1]} failed"
    assert rows[ids[3]]["error"] == f"dependency {ids[2]} failed"


def test_a_batch_fires_its_callbacks_once(clean_host: Host, target: Target) -> None:
    host = clean_host
    made = push_batches(
        host,
        [
            {
                "label": "small",
                "jobs": [target.payload(f"small/{i}", 0.01) for i in range(5)],
                "callbacks": {
                    k: target.payload(f"cb/small/{k}", 0.01) for k in ("on_success", "on_finish")
                },
            }
        ],
    )
    batch_id = made["small"]["id"]
    drain_quietly(host)
    runs = target.by_key()
    assert {k: len(v) for k, v in runs.items() if k.startswith("cb/")} == {
        "cb/small/on_success": 1,
        "cb/small/on_finish": 1,
    }
    last = max(r.end or 0.0 for k, v in runs.items() if k.startswith("small/") for r in v)
    assert runs["cb/small/on_success"][0].start > last
    row = batch_rows(host, [batch_id])[batch_id]
    assert {k: row[k] for k in ("total", "pending", "completed", "failed", "fired")} == {
        "total": 5,
        "pending": 0,
        "completed": 5,
        "failed": 0,
        "fired": 5,
    }
    assert row["finished_at"] is not None


# -- chaos ------------------------------------------------------------------------------


@dataclass
class Plan:
    """What was pushed: the keys' job ids and the tree's edges (by key)."""

    batches: dict[str, dict[str, Any]]
    key_of: dict[str, str]
    deps: dict[str, list[str]]
    failing: set[str]


def tree_level(
    target: Target, rng: random.Random, level: int, n: int, parents: list[str] | None
) -> tuple[list[str], list[dict[str, Any]], dict[str, list[int]]]:
    keys = [f"t{level}/{i}" for i in range(n)]
    picks = {k: rng.sample(range(len(parents)), rng.randint(1, 3)) if parents else [] for k in keys}
    jobs = [
        {
            "payload": target.payload(k, round(rng.uniform(*HOLD_S), 3)),
            "after": [parents[p] for p in picks[k]] if parents else None,
        }
        for k in keys
    ]
    return keys, jobs, picks


def run_chaos(tmp: Path, target: Target) -> dict[str, Any]:
    rng = random.Random(SEED)
    state_dir = tmp / "state"
    first = start_host(*host_args(SEED), persist_to=state_dir, own_group=True)
    stop = threading.Event()
    answers1: Counter[str] = Counter()
    key_of: dict[str, str] = {}
    deps: dict[str, list[str]] = {}
    failing = {f"big/{i}" for i in range(0, BATCH_N, FAIL_EVERY)}
    try:
        batches = push_batches(
            first,
            [
                {
                    "label": "big",
                    "jobs": [
                        target.payload(
                            f"big/{i}", round(rng.uniform(*HOLD_S), 3), fail=f"big/{i}" in failing
                        )
                        for i in range(BATCH_N)
                    ],
                    "callbacks": {k: target.payload(f"cb/big/{k}", 0.05) for k in KINDS},
                },
                {
                    "label": "ok",
                    "jobs": [
                        target.payload(f"ok/{i}", round(rng.uniform(*HOLD_S), 3))
                        for i in range(OK_BATCH_N)
                    ],
                    "callbacks": {k: target.payload(f"cb/ok/{k}", 0.05) for k in KINDS},
                },
            ],
        )
        for label, n in (("big", BATCH_N), ("ok", OK_BATCH_N)):
            ids = batches[label]["ids"]
            assert len(ids) == n
            key_of.update({job_id: f"{label}/{i}" for i, job_id in enumerate(ids)})
            for kind in KINDS:
                key_of[f"{batches[label]['id']}:{kind}"] = f"cb/{label}/{kind}"
        levels: list[list[str]] = []
        for level, n in ((0, ROOTS), (1, CHILDREN)):
            parents = [ids_ for ids_ in levels[-1]] if levels else None
            keys, jobs, _ = tree_level(target, rng, level, n, parents)
            ids = push_after(first, jobs)
            key_of.update(zip(ids, keys, strict=True))
            levels.append(ids)
            for k, j in zip(keys, jobs, strict=True):
                deps[k] = [key_of[d] for d in j["after"] or ()]
        since = len(first.output())

        def cycles() -> None:
            while not stop.is_set():
                cycle(first, answers1)

        driver = threading.Thread(target=cycles)
        driver.start()
        try:
            deadline = time.monotonic() + 90
            while len(target.all()) < GRANDCHILDREN_AT:
                assert time.monotonic() < deadline, "the drains made no progress"
                time.sleep(0.01)
            # The third level, while the drains run: some of its
            # dependencies are queued, some held, some completed already.
            keys, jobs, _ = tree_level(target, rng, 2, GRANDCHILDREN, levels[-1])
            ids = push_after(first, jobs)
            key_of.update(zip(ids, keys, strict=True))
            for k, j in zip(keys, jobs, strict=True):
                deps[k] = [key_of[d] for d in j["after"]]
            while True:  # progress, and a request in flight for a while more
                assert time.monotonic() < deadline, "the drains made no progress"
                runs = target.all()
                if len(runs) >= KILL_AT and any(r.end is None for r in runs):
                    break
                time.sleep(0.005)
            faults1 = first.faults()
            stop.set()
            first.kill()
            killed_at = time.monotonic()
        finally:
            stop.set()
            driver.join()
        lines1 = first.output()[since:]
    finally:
        first.stop()
    cut = [r for r in target.all() if r.start < killed_at and (r.end or 1e18) > killed_at]
    ran_before_kill = {r.key for r in target.all() if r.start < killed_at}

    second = start_host(*host_args(SEED + 1), persist_to=state_dir)
    try:
        at_restart = state(second)
        held_at_kill = lapse(second, held_s=0, spare=set())
        since2 = len(second.output())
        cycles2, lapsed, answers2 = drain_until_done(second, target, key_of)
        second.idle()
        end = state(second)
        faults2 = second.faults()
        lines2 = second.output()[since2:]
        rows = rows_by_id(second, sorted(key_of))
        brows = batch_rows(second, [b["id"] for b in batches.values()])
    finally:
        second.stop()
    reports = events(lines1, "d1queue.drain") + events(lines2, "d1queue.drain")
    unsettled = Counter(key_of[j] for r in reports for j in r.get("unsettled", ()))
    return {
        "batches": batches,
        "plan": Plan(batches, key_of, deps, failing),
        "killed_at": killed_at,
        "cut": cut,
        "ran_before_kill": ran_before_kill,
        "held_at_kill": held_at_kill,
        "at_restart": at_restart,
        "lapsed": Counter(key_of[i] for i in lapsed),
        "unsettled": unsettled,
        "end": end,
        "rows": {key_of[i]: r for i, r in rows.items()},
        "batch_rows": brows,
        "faults": Counter(faults1) + Counter(faults2),
        "answers": (answers1, answers2),
        "cycles2": cycles2,
        "reports": reports,
    }


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], Target]]:
    target = Target()
    try:
        yield run_chaos(tmp_path_factory.mktemp("wf-chaos"), target), target
    finally:
        target.stop()


def allowed_reruns(out: dict[str, Any], key: str) -> int:
    """Runs of `key` beyond its first that a lapse explains: a first run in
    the killed host (its lease lapsed at the restart), an unsettled outcome,
    a lease the test lapsed."""
    killed = key in out["ran_before_kill"]
    return int(killed) + out["unsettled"][key] + out["lapsed"][key]


def test_chaos_nothing_lost_and_reruns_explained(
    chaos: tuple[dict[str, Any], Target],
) -> None:
    out, target = chaos
    plan: Plan = out["plan"]
    runs = target.by_key()
    fired = {"cb/big/on_failure", "cb/big/on_finish", "cb/ok/on_success", "cb/ok/on_finish"}
    expected = {k for k in plan.key_of.values() if not k.startswith("cb/")} | fired
    reports = out["reports"]
    kinds = {k: out["faults"][k] for k in ("lost_before", "lost_after", "overloaded")}
    reruns = {k: len(v) - 1 for k, v in runs.items() if len(v) > 1}
    print(
        f"\nworkflows chaos: {len(expected)} jobs ({BATCH_N} + {OK_BATCH_N} in batches, "
        f"{ROOTS + CHILDREN + GRANDCHILDREN} in the tree, 4 callbacks); killed with "
        f"{len(out['cut'])} requests in flight, {len(out['held_at_kill'])} jobs held, "
        f"{out['at_restart']['live']} live at the restart; the new host: {out['cycles2']} "
        f"cycles of {DRAINS} cron runs; D1 faults {kinds} in "
        f"{out['faults']['calls']} calls; drain reports {len(reports)}, resent "
        f"{sum(r.get('resent', 0) for r in reports)}, stale "
        f"{sum(r.get('stale', 0) for r in reports)}, unsettled "
        f"{sum(out['unsettled'].values())}; leases lapsed by the test "
        f"{sum(out['lapsed'].values())}; re-runs {sum(reruns.values())}; cron answers "
        f"{dict(out['answers'][0])} then {dict(out['answers'][1])}; end {out['end']}"
    )
    assert set(runs) == expected, (sorted(expected - set(runs)), sorted(set(runs) - expected))
    assert out["end"]["live"] == 0 and out["end"]["held"] == 0
    assert out["end"]["failed"] == len(plan.failing)
    unexplained = {k: n for k, n in reruns.items() if n > allowed_reruns(out, k)}
    assert unexplained == {}, unexplained
    for key, rs in runs.items():  # a job never runs twice at once
        spans = sorted((r.start, r.end or 1e18) for r in rs)
        for a, b in pairwise(spans):
            assert a[1] <= b[0], f"{key} ran twice at once"
    assert all(kinds.values()), f"the run met every kind of D1 fault: {kinds}"
    assert out["answers"][0]["cut"] + out["answers"][0]["refused"] >= 1, "killed under a run"
    assert out["cut"], "killed while a handler held a request"


def test_chaos_each_callback_fires_exactly_once(chaos: tuple[dict[str, Any], Target]) -> None:
    out, target = chaos
    plan: Plan = out["plan"]
    runs = target.by_key()
    rows = out["rows"]
    for label, n, failed, wanted in (
        ("big", BATCH_N, len(plan.failing), {"on_failure", "on_finish"}),
        ("ok", OK_BATCH_N, 0, {"on_success", "on_finish"}),
    ):
        batch_id = plan.batches[label]["id"]
        row = out["batch_rows"][batch_id]
        assert row["total"] == n and row["pending"] == 0, row
        assert row["completed"] + row["failed"] == row["total"], row
        assert row["failed"] == failed, row
        assert row["fired"] == sum(BITS[k] for k in wanted), row
        assert row["finished_at"] is not None
        members = [k for k in plan.key_of.values() if k.startswith(f"{label}/")]
        for kind in KINDS:
            key = f"cb/{label}/{kind}"
            r = rows[key]
            if kind not in wanted:
                assert r == {**r, "done": 0, "live": 0, "failed": 0}, (key, r)
                assert key not in runs, f"{key} ran"
                continue
            # Enqueued once: one completed row of its id, nothing else.
            assert (r["done"], r["live"], r["failed"]) == (1, 0, 0), (key, r)
            assert 1 <= len(runs[key]) <= 1 + allowed_reruns(out, key), (key, len(runs[key]))
            start = runs[key][0].start
            if kind == "on_failure":
                assert any(answered_before(runs[m], start) for m in members if m in plan.failing)
            else:
                late = [m for m in members if not answered_before(runs[m], start)]
                assert late == [], f"{key} ran before {late} were answered"
        for m in members:
            want = (0, 1) if m in plan.failing else (1, 0)
            assert (rows[m]["done"], rows[m]["failed"]) == want, (m, rows[m])


def test_chaos_tree_runs_each_job_after_its_dependencies(
    chaos: tuple[dict[str, Any], Target],
) -> None:
    out, target = chaos
    plan: Plan = out["plan"]
    runs = target.by_key()
    assert len(plan.deps) == ROOTS + CHILDREN + GRANDCHILDREN
    early = []
    for key, ds in plan.deps.items():
        row = out["rows"][key]
        assert (row["done"], row["live"], row["failed"]) == (1, 0, 0), (key, row)
        assert json.loads(row["result"]) == {"status": 200, "body": "ok"}
        for run in runs[key]:
            early += [(key, d) for d in ds if not answered_before(runs[d], run.start)]
    assert early == [], f"ran before a dependency was answered: {early[:10]}"
    assert sum(len(ds) > 1 for ds in plan.deps.values()) > (CHILDREN + GRANDCHILDREN) / 2
