"""`make bench-shards`: throughput past one invocation and one D1 database.

Jobs/s through the offline host with D1 latency injected (10 ms by default,
`--d1-latency-ms` of host/host.mjs), for 1, 2 and 4 shards (D1 databases,
tools/shards_config.py) and 1, 4 and 16 concurrent consumer invocations
(wake-ups on: the consumer's `max_concurrency`, and `D1QUEUE_WAKE_MAX` as
the fan-out ceiling), beside the cron-only baseline (one cron run a minute),
with D1 queries per job (every invocation's: pushes, consumers, crons).

    .venv/bin/python bench/throughput.py [--quick] [--jobs N] [--latency-ms 10]

The Worker runs on the free plan's settings by default (5 jobs per run, 45
subrequests) so that the backlog needs many invocations; `--plan paid` runs
the paid plan's (995 subrequests a run). Each consumer left with work sends
one more wake-up per 5 due jobs. Prints one table, writes
.bench/throughput.json. The host's own round trip to Miniflare (~6 ms) comes
on top of the injected latency, and both share this machine's cores with
Miniflare's D1: figures compare configurations, they do not predict
production's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "src"))

from tests.runtime.conftest import Host, start_host  # noqa: E402
from tools.shards_config import shards_toml  # noqa: E402

from bench.run import log  # noqa: E402  (sets PATH for Node 22 too)

CRON_PERIOD_S = 60
QUEUES = [f"q{i}" for i in range(8)]
"""Queues pushed to: hashed over the shards (CRC-32), so each shard gets some."""
TIMEOUT_S = 600.0


def config(shards: int, consumers: int | None) -> Path:
    """A config with `shards` databases; wake-ups on with `consumers`
    concurrent consumers, or off (None: the cron-only baseline)."""
    text = shards_toml((ROOT / "wrangler.toml").read_text(), shards, wake=consumers is not None)
    if consumers is not None:
        text = text.replace("max_concurrency = 16", f"max_concurrency = {consumers}")
    path = ROOT / f"wrangler.shards-bench-{shards}-{consumers or 0}.toml"
    path.write_text(text)
    return path


def invocations(host: Host, since: int) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in host.output()[since:]
        if line.startswith("{") and '"d1queue.invocation"' in line
    ]


def push_all(host: Host, jobs: int, tag: str) -> set[str]:
    """`jobs` echo jobs in batches of up to 50, spread over QUEUES."""
    marks: set[str] = set()
    per_queue = max(1, jobs // len(QUEUES))
    for q in QUEUES:
        left = per_queue
        while left > 0:
            n = min(50, left)
            batch = [
                {"name": "example.echo", "payload": {"w": f"{tag}-{q}-{left - i}"}}
                for i in range(n)
            ]
            marks |= {j["payload"]["w"] for j in batch}
            reply = host.api("POST", f"/v1/queues/{q}/jobs/batch", {"jobs": batch})
            if reply.status != 201:
                raise RuntimeError(f"push answered {reply.status}: {reply.text}")
            left -= n
    return marks


def ran(host: Host, since: int, marks: set[str]) -> int:
    lines = host.output()[since:]
    return sum(1 for m in marks if any(f"'w': '{m}'" in line for line in lines))


def done(host: Host, since: int, marks: set[str]) -> bool:
    text = "\n".join(host.output()[since:])
    return all(f"'w': '{m}'" in text for m in marks)


def measure(
    shards: int, consumers: int | None, jobs: int, latency_ms: int, plan: str = "free"
) -> dict[str, Any]:
    """One configuration: push, then wait until every job ran (wake-ups), or
    run crons back to back until it did (baseline)."""
    what = f"{shards} shard(s), " + (f"{consumers} consumer(s)" if consumers else "cron only")
    log(f"throughput: {what}, {jobs} jobs, {latency_ms} ms D1 latency")
    args = ["--config", str(config(shards, consumers)), "--cpu", "warn"]
    args += ["--d1-latency-ms", str(latency_ms), "--var", f"D1QUEUE_PLAN={plan}"]
    args += ["--var", "D1QUEUE_WAKE_PER_JOBS=5", "--plan", plan]
    if consumers:
        args += ["--var", f"D1QUEUE_WAKE_MAX={consumers}"]
    host = start_host(*args)
    try:
        since = len(host.output())
        t0 = time.monotonic()
        marks = push_all(host, jobs, f"s{shards}c{consumers or 0}")
        pushed_s = time.monotonic() - t0
        crons = 0
        deadline = t0 + TIMEOUT_S
        while not done(host, since, marks):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {ran(host, since, marks)}/{jobs} ran in {TIMEOUT_S}s")
            if consumers is None:
                host.scheduled()
                crons += 1
            else:
                time.sleep(0.05)
        wall = time.monotonic() - t0
        calls = invocations(host, since)
        queries = sum(int(c.get("d1_queries", 0)) for c in calls)
        kinds: dict[str, int] = {}
        for c in calls:
            kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
        out: dict[str, Any] = {
            "shards": shards,
            "consumers": consumers,
            "jobs": len(marks),
            "wall_s": round(wall, 2),
            "push_s": round(pushed_s, 2),
            "jobs_per_s": round(len(marks) / wall, 1),
            "d1_queries_per_job": round(queries / len(marks), 3),
            "invocations": kinds,
        }
        if consumers is None:
            out["crons"] = crons
            out["jobs_per_cron"] = round(len(marks) / max(1, crons), 2)
            # At the shipped one cron run a minute:
            out["jobs_per_s"] = round(len(marks) / max(1, crons) / CRON_PERIOD_S, 3)
            out["back_to_back_jobs_per_s"] = round(len(marks) / wall, 1)
        log(f"  {out}")
        return out
    finally:
        host.stop()


def render(rows: list[dict[str, Any]]) -> str:
    head = "| shards | consumers | jobs/s | D1 queries/job | wall s | invocations |"
    lines = [head, "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        consumers = r["consumers"] if r["consumers"] else "cron only (1 run/min)"
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["invocations"].items()))
        lines.append(
            f"| {r['shards']} | {consumers} | {r['jobs_per_s']} | {r['d1_queries_per_job']} "
            f"| {r['wall_s']} | {kinds} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 2 shards, 1 and 4 consumers")
    parser.add_argument("--jobs", type=int, default=0, help="jobs per configuration")
    parser.add_argument("--latency-ms", type=int, default=10)
    parser.add_argument("--plan", choices=("free", "paid"), default="free")
    parser.add_argument("--out", default=str(ROOT / ".bench" / "throughput.json"))
    args = parser.parse_args()
    jobs = args.jobs or (80 if args.quick else 400)
    shard_counts = (1, 2) if args.quick else (1, 2, 4)
    consumer_counts = (1, 4) if args.quick else (1, 4, 16)
    from bench import host as bench_host

    bench_host.allow_long_calls()
    rows = [measure(1, None, jobs, args.latency_ms, args.plan)]
    for shards in shard_counts:
        for consumers in consumer_counts:
            rows.append(measure(shards, consumers, jobs, args.latency_ms, args.plan))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"latency_ms": args.latency_ms, "plan": args.plan, "rows": rows}
    out.write_text(json.dumps(result, indent=2))
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
