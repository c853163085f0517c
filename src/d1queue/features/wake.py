"""Cloudflare Queues wake-ups (D1QUEUE_WAKE = "queues"): a push sends a small
message naming its queue, and the Worker's `queue()` consumer drains that
queue in an invocation of its own, so a job starts at once instead of at
the next cron tick, and a backlog is drained by several
invocations at once instead of one cron run a minute.

D1 stays the source of truth. A message carries no job, only "look at this
queue on this shard" (the D1 database the push wrote to, shards.py): Queues
delivers at least once, so a duplicated message only makes a drain find
nothing (the claim protocol already makes concurrent drains safe), and a
lost one (a failed send, a message dropped after its retries)
only leaves the job to the cron, which keeps running as the safety net.

A consumer that stops on a budget with due jobs left sends more wake-ups,
damped so that consumers never multiply:
- woken by a push, it fans out: one message per `wake_per_jobs` due jobs, at
  most `wake_max`, in one `sendBatch` (one subrequest), if it takes the
  queue's fan-out lease (no fan-out on it in the last FAN_OUT_WINDOW_S, a
  compare-and-set in D1); otherwise it relays;
- woken only by such follow-ups, it relays: one message, which carries the
  chain on (its "hop" counts the links).
So a minute's fan-out starts at most `wake_max` chains, however many pushes
came in it, and a chain ends at the first consumer that finds the queue
drained. Were every consumer to fan out, the messages would multiply by up
to `wake_max` a generation (and by the pushes), most of them finding nothing
once the backlog is gone. The consumer's `max_concurrency` in
wrangler.toml bounds how many run at once.

Only the library's side is here (what to send, what a batch asks for, the
fan-out); the Worker glue (interfaces/cloudflare.py) hands it the `WAKE`
producer binding and the batch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..core.bounds import is_stored_name
from ..core.config import Config
from ..core.costs import least_run
from ..core.limits import Meter, SubrequestLimitExceeded
from ..core.log import event, get
from ..core.shards import Shares
from ..store.inspection import due as count_due
from ..store.maintenance import take_fan_out
from ..store.queue import D1Queue
from ..store.shardset import ShardQueue, ShardSet, shard_set
from .cron import combine
from .drain import DrainReport

WAKE_BINDING = "WAKE"
"""The producer binding's name in wrangler.toml's [[queues.producers]]."""

SHARD = 0
"""The shard a message names by default: shard 0, binding DB, the only one
of a deployment with one D1 database. A push names the shard it wrote to,
and the consumer drains that shard only (shards.py)."""

FOLLOW_UP_RESERVE = 3
"""Subrequests a consumer keeps out of its drain's budget for the fan-out:
the capped count of due jobs (one D1 query), the fan-out lease (one) and one
sendBatch."""

FOLLOW_UP_CPU_JOBS = 2
"""Jobs' worth of CPU a consumer on the free plan keeps for its fan-out: the
due count, the lease and the send cost about as much as two jobs in the
offline host, and the free plan's job cap (config.MAX_JOBS) is what fits in
its 10 ms of CPU with nothing else to do."""

log = get(__name__)


def consumer_jobs(config: Config) -> int:
    """Jobs one consumer invocation may claim: the run's cap, less
    FOLLOW_UP_CPU_JOBS on the free plan (at least one)."""
    if config.plan == "free":
        return max(1, config.job_cap - FOLLOW_UP_CPU_JOBS)
    return config.job_cap


FAN_OUT_WINDOW_S = 60.0
"""A queue fans out at most once in this long (D1QUEUE's cron ticks each
minute too); the chains a fan-out starts carry on while the backlog lasts."""

LEFT_WORK = frozenset({"query_budget", "max_jobs", "time_budget"})
"""Drain stops after which jobs may still be due: only these fan out."""

MAX_SEND_BATCH = 100
"""Messages one sendBatch may carry (Queues limits)."""


def wake_body(queue: str, shard: int = SHARD, hop: int = 0) -> dict[str, Any]:
    """The message a push sends: which queue, on which shard. Small (well
    under a 64 KB billing unit) and holding no job data. A consumer's
    follow-up also says how many consumers led to it (`hop` >= 1)."""
    if hop > 0:
        return {"shard": shard, "queue": queue, "hop": hop}
    return {"shard": shard, "queue": queue}


def hop_of(body: Any) -> int:
    """A wake-up's hop: 0 for a push's (or anything unreadable, which then
    counts as a push: the safe side is to fan out)."""
    hop = body.get("hop") if isinstance(body, dict) else None
    if isinstance(hop, bool) or not isinstance(hop, int) or hop < 0:
        return 0
    return hop


def parse_wake(body: Any, shards: int = 1) -> tuple[int, str] | None:
    """The shard and queue a message asks to drain, or None if it is not a
    wake-up this Worker can act on (another shape, a shard it does not have
    among its `shards`): such a message is acknowledged and logged, never
    retried, since retrying cannot fix it."""
    if not isinstance(body, dict):
        return None
    queue, shard = body.get("queue"), body.get("shard")
    if not is_stored_name(queue):
        return None
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < shards:
        return None
    return shard, queue


def follow_ups(due: int, per_jobs: int, ceiling: int, *, relay: bool = False) -> int:
    """Wake messages to send for `due` jobs left: one per `per_jobs`, rounded
    up, at most `ceiling`; a relay (a consumer woken by follow-ups only)
    sends one, carrying its chain on."""
    if due <= 0:
        return 0
    if relay:
        return 1
    return min(ceiling, -(-due // per_jobs), MAX_SEND_BATCH)


def _log(fields: dict[str, Any]) -> None:
    event(log, "d1queue.wake", **fields)


class Waker:
    """Sends wake messages through a Queues producer binding (`send`,
    `sendBatch`), counting each call as one subrequest of the invocation.

    Never raises: the push already wrote its job to D1, so a failed send
    (the binding erred, or the invocation has no subrequest left) is logged
    and the cron runs the job instead."""

    def __init__(
        self,
        producer: Any,
        meter: Meter | None = None,
        log: Callable[[dict[str, Any]], None] = _log,
    ) -> None:
        self.producer, self.meter, self.log = producer, meter, log
        self.sent = 0
        self.failed = 0

    async def wake(
        self,
        queue: str,
        count: int = 1,
        *,
        why: str = "push",
        shard: int = SHARD,
        hop: int = 0,
    ) -> int:
        """Send `count` wake messages for `queue` on `shard` (one call: send,
        or sendBatch for more than one); returns how many were sent."""
        count = min(count, MAX_SEND_BATCH)
        if count <= 0:
            return 0
        body = wake_body(queue, shard, hop)
        try:
            if self.meter is not None:
                self.meter.spend("binding")  # refused before it is sent, past the cap
            if count == 1:
                await self.producer.send(body)
            else:
                await self.producer.sendBatch([{"body": body} for _ in range(count)])
        except (SubrequestLimitExceeded, Exception) as exc:
            self.failed += count
            self.log(
                {
                    "queue": queue,
                    "why": why,
                    "sent": 0,
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                    "note": "the job is in D1; the cron (or a later wake-up) runs it",
                }
            )
            return 0
        self.sent += count
        return count


@dataclass
class WakeReport:
    """What one consumer invocation did with its batch."""

    messages: int = 0
    queues: list[str] = field(default_factory=list)
    """The distinct queues the batch named that this Worker drains."""
    shards: dict[int, list[str]] = field(default_factory=dict)
    """Those queues by the shard named: one drain per shard."""
    ignored: int = 0
    """Messages that were not a wake-up for this Worker (acknowledged)."""
    not_drained: list[str] = field(default_factory=list)
    """Queues named but not in D1QUEUE_QUEUES (acknowledged, not drained)."""
    hops: dict[str, int] = field(default_factory=dict)
    """The least hop among the messages naming each "<shard>:<queue>": 0
    means a push woke it (it may fan out), more that only follow-ups did
    (it relays)."""
    follow_ups: int = 0
    """Wake messages sent for due jobs left after the drain."""
    fan_outs: int = 0
    """Fan-out leases taken (at most one per queue a FAN_OUT_WINDOW_S)."""
    retry: bool = False
    """The batch should be delivered again: D1 failed before the drain could
    tell whether jobs were left."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(bodies: Sequence[Any], config: Config) -> WakeReport:
    """What a batch asks for: its distinct queues per shard in the order
    first named (however many messages name each: duplicates fold into one
    drain of each shard)."""
    report = WakeReport(messages=len(bodies))
    for body in bodies:
        found = parse_wake(body, len(config.shards))
        if found is None:
            report.ignored += 1
            continue
        shard, queue = found
        if not config.drains(queue):
            if queue not in report.not_drained:
                report.not_drained.append(queue)
            continue
        named = report.shards.setdefault(shard, [])
        if queue not in named:
            named.append(queue)
        key, hop = f"{shard}:{queue}", hop_of(body)
        report.hops[key] = min(hop, report.hops.get(key, hop))
        if queue not in report.queues:
            report.queues.append(queue)
    return report


async def _take_fan_out(queue: D1Queue, shard: int, name: str) -> bool:
    """The fan-out lease, or False if another consumer has it (or D1 failed:
    relaying one message is the safe side)."""
    try:
        return await take_fan_out(queue, name, FAN_OUT_WINDOW_S)
    except Exception as exc:
        _log({"shard": shard, "queue": name, "why": "fan-out", "error": f"{exc}"[:500]})
        return False


async def consume(
    shards: ShardSet | D1Queue,
    config: Config,
    bodies: Sequence[Any],
    *,
    run_drain: Callable[[ShardQueue, Config], Awaitable[DrainReport]],
    waker: Waker | None,
) -> tuple[WakeReport, DrainReport | None]:
    """Handle one delivered batch: drain the queues it names, one drain per
    shard named (in turn, each with an equal share of the invocation's
    budget and job cap), then, where a drain stopped on a budget, send one
    more wake-up per `wake_per_jobs` due jobs left on each of its queues (at
    most `wake_max`; one if only follow-ups woke it) naming the same shard.
    The caller acknowledges every message afterwards unless `retry` is set.
    The drains' reports come back as one (crons.combine)."""
    shards = shard_set(shards)
    report = plan(bodies, config)
    if report.ignored:
        _log({"ignored": report.ignored, "note": "not a d1queue wake-up for this Worker"})
    if not report.shards:
        return report, None
    named = list(report.shards.items())
    # Room for the fan-out is kept out of the drains' own budgets, so a drain
    # that spends its budget can still say that work is left.
    spendable = config.budget - FOLLOW_UP_RESERVE * len(named)
    shares = Shares.of(spendable, consumer_jobs(config), len(named))
    least = least_run(config.stats_reserve)  # one round and the run's counters
    reports = []
    for turn, (shard, queues) in enumerate(named):
        budget, jobs = shares.turn(turn)
        if jobs < 1 or budget < least:
            # No room for a round here: its share goes to the next shard named,
            # and the cron drains this one's queues.
            shares.used(budget, jobs, 0, 0)
            continue
        queue = shards.queue(shard)
        share = replace(config, queues=tuple(queues), query_budget=budget, max_jobs=jobs)
        drained = await run_drain(queue, share)
        shares.used(budget, jobs, drained.subrequests, drained.claimed)
        reports.append(drained)
        if drained.stopped == "d1_error":
            report.retry = True  # Queues delivers it again later; the cron runs meanwhile
            continue
        if drained.stopped not in LEFT_WORK or waker is None:
            continue
        cap = config.wake_per_jobs * config.wake_max
        for name in queues:
            try:
                due = await count_due(queue, name, cap)
            except Exception as exc:  # no count, no fan-out: the cron is the safety net
                _log(
                    {
                        "shard": shard,
                        "queue": name,
                        "why": "backlog",
                        "error": f"{type(exc).__name__}: {exc}"[:500],
                    }
                )
                continue
            # A push's consumer fans out if it takes the lease; a follow-up's
            # relays (module doc).
            hop = report.hops[f"{shard}:{name}"]
            n = follow_ups(due, config.wake_per_jobs, config.wake_max, relay=hop > 0)
            if n > 1 and not await _take_fan_out(queue, shard, name):
                n = 1  # another consumer has the lease: relay
            report.fan_outs += n > 1
            report.follow_ups += await waker.wake(name, n, why="backlog", shard=shard, hop=hop + 1)
    return report, (combine(reports) if reports else None)


__all__ = [
    "FAN_OUT_WINDOW_S",
    "FOLLOW_UP_CPU_JOBS",
    "FOLLOW_UP_RESERVE",
    "SHARD",
    "WAKE_BINDING",
    "WakeReport",
    "Waker",
    "consume",
    "consumer_jobs",
    "follow_ups",
    "hop_of",
    "parse_wake",
    "plan",
    "wake_body",
]
