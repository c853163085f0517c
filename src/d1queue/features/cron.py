"""The cron run over every shard: each shard's due schedules, then a drain of
that shard, shards in turn, within the one invocation's budgets.

In turn, not at once: the invocation's caps are shared (50 subrequests on
the free plan, a count of jobs as its CPU bound, six connections), and a
drain already keeps up to six D1 calls in flight on its own. Each shard's
drain gets an equal share of D1QUEUE_QUERY_BUDGET and D1QUEUE_MAX_JOBS, plus
what the shards before it left unspent, so the drains' budgets add up to
the configured ones and an idle shard gives its share to a busy one. Each
run starts at a different shard (minute mod shards): a shard late in the
turn, which a slow or busy run may leave with little, is a different one
each minute. The schedules of the run's first shard cost at most 2 queries
from the plan's reserve, as on one database; the other shards' come out of
their drain's share.

Each shard's first schedules query also prunes failed jobs older than
D1QUEUE_KEEP_FAILED_S, at most Config.prune_failed a run shared over the
shards, completed history past D1QUEUE_KEEP_COMPLETED_S likewise, and the
flow-control rows that hold nothing among the next Config.prune_flow,
and rolls up and prunes the job metrics (Config.prune_metrics): retention
costs rows, never a query of the budget.

With one shard this is exactly the cron of one database: its schedules,
then a drain with the configured budgets.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields, replace

from ..core.config import KEEP_COMPLETED_S, Config
from ..core.costs import least_run
from ..core.registry import Registry
from ..core.shards import Shares, rotation, split
from ..store.aggregate import schedules_on
from ..store.schedules import ScheduleReport
from ..store.shardset import ShardQueue, ShardSet
from .drain import DrainReport

RunDrain = Callable[[ShardQueue, Config], Awaitable[DrainReport]]
"""How the Worker drains one shard's queue with a configuration (the glue,
interfaces/cloudflare.py, adds its env, fetch and logging)."""


@dataclass
class ShardRun:
    """One shard's part of a cron run."""

    shard: int
    schedules: ScheduleReport
    drained: DrainReport
    budget: int = 0
    """Subrequests its drain was given (its share and what earlier left)."""
    max_jobs: int = 0


async def cron(
    shards: ShardSet,
    registry: Registry,
    config: Config,
    *,
    now: int,
    grace_ms: int,
    due_limit: int,
    run_drain: RunDrain,
    monotonic: Callable[[], float] = time.monotonic,
) -> list[ShardRun]:
    """Every shard's schedules and drain, in turn from shard `minute mod n`."""
    config.check_shares()
    n = len(shards)
    start = monotonic()
    shares = Shares.of(config.budget, config.job_cap, n)
    due_limits = [max(1, d) for d in split(due_limit, n)]
    prune_limits = [max(1, p) if config.prune_failed else 0 for p in split(config.prune_failed, n)]
    prune_before = now - config.keep_failed_s * 1000
    completed_limits = [max(1, p) for p in split(config.prune_completed, n)]
    flow_limits = [max(1, p) for p in split(config.prune_flow, n)]
    metrics_limits = [
        max(1, p) if config.prune_metrics else 0 for p in split(config.prune_metrics, n)
    ]
    # Kept history past its retention; with none kept (0), whatever an
    # earlier setting kept is pruned as it comes.
    completed_before = now - config.keep_completed_s * 1000
    # A finished batch's row is what its callbacks' ctx.batch() and GET
    # /v1/batches read: kept a day at least, whatever jobs are kept.
    batches_before = now - max(config.keep_completed_s, KEEP_COMPLETED_S) * 1000
    runs = []
    for turn, shard in enumerate(rotation(n, (now // 60_000) % n)):
        queue = shards.queue(shard)
        schedules = await schedules_on(queue, registry).run(
            now=now,
            grace_ms=grace_ms,
            limit=due_limits[turn],
            prune_before=prune_before,
            prune_limit=prune_limits[turn],
            prune_completed_before=completed_before,
            prune_completed_limit=completed_limits[turn],
            prune_batches_before=batches_before,
            prune_flow_limit=flow_limits[turn],
            prune_metrics_limit=metrics_limits[turn],
        )
        if n == 1:
            runs.append(ShardRun(shard, schedules, await run_drain(queue, config)))
            break
        # The first shard's schedules come out of the plan's reserve, as on one database.
        budget, jobs = shares.turn(turn, spent=schedules.queries if turn else 0)
        left_s = config.time_budget_s - (monotonic() - start)
        drained = DrainReport()
        if budget < least_run(config.stats_reserve):
            drained.stopped = "query_budget"
        elif jobs < 1:
            drained.stopped = "max_jobs"
        elif left_s <= 0:
            drained.stopped = "time_budget"
        else:
            share = replace(config, query_budget=budget, max_jobs=jobs, time_budget_s=left_s)
            drained = await run_drain(queue, share)
        shares.used(budget, jobs, drained.subrequests, drained.claimed)
        runs.append(ShardRun(shard, schedules, drained, budget=budget, max_jobs=jobs))
    return runs


_SUMMED = [f.name for f in fields(DrainReport) if f.type in ("int", "float")]


def combine(reports: Sequence[DrainReport]) -> DrainReport:
    """Several shards' drains as one report: counts added, lists joined; it
    stopped as the first that did not run out of work did (else "empty")."""
    if len(reports) == 1:
        return reports[0]
    total = DrainReport()
    for r in reports:
        for name in _SUMMED:
            setattr(total, name, getattr(total, name) + getattr(r, name))
        total.unsettled += r.unsettled
        total.paused += [p for p in r.paused if p not in total.paused]
        total.error = total.error or r.error
    total.elapsed_s = round(total.elapsed_s, 3)
    total.stopped = next((r.stopped for r in reports if r.stopped != "empty"), "empty")
    return total


__all__ = ["RunDrain", "ShardRun", "combine", "cron"]
