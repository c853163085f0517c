"""Cloudflare's per-invocation caps: the meters, and a drain that never crosses
them whatever its handlers do. Real SQLite and real HTTP to a local server;
every count is deterministic."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from d1queue import Config, D1Queue, JobContext, QueuedJob, Registry, drain
from d1queue.core.limits import PLANS, Meter, MeteredEnv, SubrequestLimitExceeded
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.binding import Binding, RetryPolicy
from jobs import registry as worker_registry

from .conftest import Clock
from .http_server import Server
from .test_drain import Monotonic
from .test_http_job import LOCAL, urllib_fetch

FREE = PLANS["free"]


def test_a_meter_refuses_before_counting_and_children_count_into_parents() -> None:
    invocation = Meter.for_plan(FREE)
    job = invocation.child(2, label="job 'x'")
    job.spend("fetch")
    job.spend("d1")
    assert (job.used, invocation.used, invocation.used_d1) == (2, 2, 1)
    with pytest.raises(SubrequestLimitExceeded, match="job 'x' may make 2 subrequests"):
        job.spend("fetch")
    assert (job.used, invocation.used) == (2, 2), "a refused subrequest is not counted"
    assert job.refused is not None
    for _ in range(48):
        invocation.spend("d1")
    assert invocation.left() == 0
    with pytest.raises(SubrequestLimitExceeded, match="may make 50 subrequests"):
        invocation.child(5, label="another").spend("d1")


def test_paid_caps_d1_queries_at_1000_within_10000_subrequests() -> None:
    meter = Meter.for_plan(PLANS["paid"])
    for _ in range(1000):
        meter.spend("d1")
    with pytest.raises(SubrequestLimitExceeded, match="1000 D1 queries"):
        meter.spend("d1")
    meter.spend("fetch")  # other subrequests still go
    assert (meter.used, meter.used_d1) == (1001, 1000)


async def test_a_metered_env_counts_d1_runs_and_batches_not_prepares(db: SqliteD1) -> None:
    meter = Meter(10)
    env = MeteredEnv(SimpleNamespace(DB=db, NAME="plain var"), meter)
    assert env.NAME == "plain var"
    stmt = env.DB.prepare("SELECT ? AS v").bind(1)
    assert meter.used == 0, "prepare and bind send nothing"
    assert (await stmt.all())["results"] == [{"v": 1}]
    await env.DB.batch([env.DB.prepare("SELECT 1"), env.DB.prepare("SELECT 2")])
    assert (meter.used, meter.used_d1) == (2, 2), "one run, one batch"


async def test_transient_retries_are_subrequests_and_stop_at_the_cap(db: SqliteD1) -> None:
    db.fail_when(lambda sql: "SELECT" in sql, "D1_ERROR: Network connection lost.", times=2)
    meter = Meter(10)
    binding = Binding(db, meter=meter, retry=RetryPolicy(tries=5, base_s=0, cap_s=0))
    await binding.run("SELECT 1")
    assert meter.used == 3, "two failed sends and the one that went through"

    db.fail_when(lambda sql: "SELECT" in sql, "D1_ERROR: Network connection lost.", times=5)
    short = Binding(db, meter=Meter(2), retry=RetryPolicy(tries=5, base_s=0, cap_s=0))
    with pytest.raises(Exception, match="Network connection lost"):
        await short.run("SELECT 1")
    assert short.meter is not None and short.meter.used == 2, "no retry past the cap"


def io_registry(runs: Counter[int], server: Server, *, extra_fetches: int = 0) -> Registry:
    """One job that makes one D1 query and one fetch, as it declares."""
    reg = Registry()

    @reg.job("io", subrequests=2, timeout_s=10)
    async def io(payload: Any, ctx: JobContext) -> None:
        await ctx.env.DB.prepare("SELECT ? AS i").bind(payload).all()
        for _ in range(1 + extra_fetches):
            await ctx.fetch(f"{server.url}/io/{payload}")
        runs[payload] += 1

    return reg


async def test_200_io_jobs_drain_over_free_plan_runs_without_crossing_a_cap(
    db: SqliteD1, server: Server, clock: Clock
) -> None:
    runs: Counter[int] = Counter()
    reg = io_registry(runs, server)
    queue = D1Queue(db, clock=clock)
    await queue.push_many([QueuedJob.new("io", i, at_ms=clock()) for i in range(200)])
    env = SimpleNamespace(DB=db)
    spent, cron_runs = [], 0
    config = replace(LOCAL, max_jobs=1000)  # the CPU cap apart: subrequests bind here
    while await queue.size("default"):
        cron_runs += 1
        meter = Meter.for_plan(FREE)  # each cron run is a new invocation
        report = await drain(
            D1Queue(Binding(db, meter=meter), clock=clock),
            reg,
            config,
            env=env,
            fetch=urllib_fetch,
        )
        assert (report.failed, report.retried, report.stale) == (0, 0, 0)
        spent.append(meter.used)
        assert cron_runs < 50, spent
    assert runs == Counter(range(200)), "every job ran exactly once"
    assert max(spent) <= FREE.subrequests - 5, spent
    assert len(server.seen) == 200
    # A run: reclaim (1), the candidate SELECT (1), then as many jobs as fit
    # in the 42 left with the claim, the settle and the run's counters (3)
    # paid: 20 jobs of 2 subrequests; their settle, then the counters' one
    # statement (stats.py), end the run: 1 + 1 + 1 + 40 + 1 + 1 = 45.
    assert spent == [45] * 10, spent


async def test_a_handler_past_its_declared_budget_is_retried_and_others_finish(
    queue: D1Queue, db: SqliteD1, server: Server
) -> None:
    runs: Counter[int] = Counter()
    greedy = io_registry(runs, server, extra_fetches=1)
    await queue.dispatch("io", 1)
    meter = Meter.for_plan(FREE)
    report = await drain(
        queue.derive(binding=queue.binding.metered(meter)),
        greedy,
        LOCAL,
        env=SimpleNamespace(DB=db),
        fetch=urllib_fetch,
    )
    assert (report.retried, report.completed) == (1, 0)
    assert len(server.seen) == 1, "the fetch past the budget was never sent"
    job = (await queue.binding.run("SELECT last_error FROM d1queue_jobs")).rows[0]
    assert "SubrequestLimitExceeded" in job["last_error"]
    assert "declared subrequests=2" in job["last_error"]
    assert "register it with a larger subrequests=" in job["last_error"]


async def test_a_handler_that_swallows_the_refusal_is_still_retried(
    queue: D1Queue, server: Server
) -> None:
    reg = Registry()

    @reg.job("sly", subrequests=0)
    async def sly(payload: Any, ctx: JobContext) -> None:
        with contextlib.suppress(SubrequestLimitExceeded):
            await ctx.fetch(server.url)

    await queue.dispatch("sly", None)
    report = await drain(queue, reg, LOCAL, fetch=urllib_fetch)
    assert (report.retried, report.completed) == (1, 0)
    assert server.seen == []


async def test_a_job_declaring_more_than_any_run_can_give_fails_clearly(
    queue: D1Queue,
) -> None:
    reg = Registry()

    @reg.job("huge", subrequests=100)
    async def huge(payload: Any) -> None:
        raise AssertionError("never run")

    await queue.dispatch("huge", None)
    report = await drain(queue, reg, Config())
    assert report.failed == 1
    (failed,) = await queue.failed_jobs()
    assert "declares 100 subrequests per attempt" in failed.error
    assert "at most 42" in failed.error


async def test_the_free_plan_job_cap_bounds_a_run(queue: D1Queue) -> None:
    runs: Counter[int] = Counter()
    reg = Registry()

    @reg.job("n")
    async def n(payload: int) -> None:
        runs[payload] += 1

    for i in range(25):
        await queue.dispatch("n", i)
    report = await drain(queue, reg, Config())
    assert (report.claimed, report.stopped) == (Config().max_jobs, "max_jobs") == (5, "max_jobs")
    assert sum(runs.values()) == 5


async def test_a_drain_with_a_window_leaves_jobs_too_long_for_it(queue: D1Queue) -> None:
    reg = Registry()
    ran: list[str] = []

    @reg.job("quick", timeout_s=5)
    async def quick(payload: Any) -> None:
        ran.append("quick")

    @reg.job("slow", timeout_s=65)
    async def slow(payload: Any) -> None:
        ran.append("slow")

    await queue.dispatch("slow", None)
    await queue.dispatch("quick", None)
    report = await drain(queue, reg, Config(plan="paid", reservation_s=120), window_s=30)
    assert ran == ["quick"]
    assert report.stopped == "window"
    (left,) = (await queue.binding.run("SELECT name, attempts FROM d1queue_jobs")).rows
    assert left == {"name": "slow", "attempts": 0}, "never claimed: the cron runs it"


async def test_a_window_counts_the_wait_for_a_slot(queue: D1Queue) -> None:
    reg = Registry()

    clock = Monotonic()

    @reg.job("ten", timeout_s=10)
    async def ten(payload: Any) -> None:
        clock.t += 5  # each job takes 5 s of the drain's time

    for i in range(7):
        await queue.dispatch("ten", i)
    # Two slots: jobs would end by 10, 10, 20, 20 s at the latest; a fifth
    # by 30 s, past the 30 s window less the settle margin. The four take 20 s
    # in all, after which no 10 s job fits.
    report = await drain(
        queue, reg, Config(concurrency=2, batch_size=7), window_s=30, monotonic=clock
    )
    assert report.claimed == 4
    assert await queue.size("default") == 3


async def test_the_workers_example_jobs_stay_inside_a_free_invocation(
    db: SqliteD1, server: Server
) -> None:
    """example.add dispatches a follow-up job: one D1 query it declares, so
    200 of them in one run stay inside the budget the run was given."""
    queue = D1Queue(db)
    for i in range(200):
        await queue.dispatch("example.add", {"a": i, "b": 1})
    meter = Meter.for_plan(FREE)
    report = await drain(
        queue.derive(binding=queue.binding.metered(meter)), worker_registry, Config(max_jobs=1000)
    )
    assert report.claimed > 0 and report.failed == report.retried == 0
    assert report.subrequests == meter.used <= 45
