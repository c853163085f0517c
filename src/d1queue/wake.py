"""Cloudflare Queues wake-ups (D1QUEUE_WAKE = "queues"): a push sends a small
message naming its queue, and the Worker's `queue()` consumer drains that
queue in an invocation of its own, so a job starts within about a second
instead of at the next cron tick, and a backlog is drained by several
invocations at once instead of one cron run a minute.

D1 stays the source of truth. A message carries no job, only "look at this
queue": Queues delivers at least once, so a duplicated message only makes a
drain find nothing (the claim protocol already makes concurrent drains
safe), and a lost one (a failed send, a message dropped after its retries)
only leaves the job to the cron, which keeps running as the safety net.

A consumer that stops on a budget with due jobs left sends more wake-ups:
one per `wake_per_jobs` due jobs, at most `wake_max`, in one `sendBatch`
(one subrequest). The ceiling keeps one consumer's fan-out bounded; the
consumer's `max_concurrency` in wrangler.toml bounds how many run at once.

Only the library's side is here (what to send, what a batch asks for, the
fan-out); entry.py hands it the `WAKE` producer binding and the batch.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .bounds import NAME_PATTERN
from .config import Config
from .limits import Meter, SubrequestLimitExceeded
from .queue import D1Queue
from .worker import DrainReport

WAKE_BINDING = "WAKE"
"""The producer binding's name in wrangler.toml's [[queues.producers]]."""

SHARD = 0
"""The D1 database a message names. One today (binding DB); the field is in
every message so that consumers of a sharded deployment (issue 14, part 2)
can read messages sent before it was sharded."""

FOLLOW_UP_RESERVE = 2
"""Subrequests a consumer keeps out of its drain's budget for the fan-out:
the capped count of due jobs (one D1 query) and one sendBatch."""

LEFT_WORK = frozenset({"query_budget", "max_jobs", "time_budget"})
"""Drain stops after which jobs may still be due: only these fan out."""

MAX_SEND_BATCH = 100
"""Messages one sendBatch may carry (Queues limits)."""


def wake_body(queue: str, shard: int = SHARD) -> dict[str, Any]:
    """The message a push sends: which queue, on which shard. Small (well
    under a 64 KB billing unit) and holding no job data."""
    return {"shard": shard, "queue": queue}


def parse_wake(body: Any) -> str | None:
    """The queue a message asks to drain, or None if it is not a wake-up this
    Worker can act on (another shape, another shard): such a message is
    acknowledged and logged, never retried, since retrying cannot fix it."""
    if not isinstance(body, dict):
        return None
    queue, shard = body.get("queue"), body.get("shard")
    if not isinstance(queue, str) or not NAME_PATTERN.fullmatch(queue):
        return None
    if isinstance(shard, bool) or shard != SHARD:
        return None
    return queue


def follow_ups(due: int, per_jobs: int, ceiling: int) -> int:
    """Wake messages to send for `due` jobs left: one per `per_jobs`, rounded
    up, at most `ceiling`."""
    if due <= 0:
        return 0
    return min(ceiling, -(-due // per_jobs), MAX_SEND_BATCH)


def _log(event: dict[str, Any]) -> None:
    print(json.dumps({"event": "d1queue.wake", **event}, separators=(",", ":")))


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

    async def wake(self, queue: str, count: int = 1, *, why: str = "push") -> int:
        """Send `count` wake messages for `queue` (one call: send, or
        sendBatch for more than one); returns how many were sent."""
        count = min(count, MAX_SEND_BATCH)
        if count <= 0:
            return 0
        body = wake_body(queue)
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
    ignored: int = 0
    """Messages that were not a wake-up for this Worker (acknowledged)."""
    not_drained: list[str] = field(default_factory=list)
    """Queues named but not in D1QUEUE_QUEUES (acknowledged, not drained)."""
    follow_ups: int = 0
    """Wake messages sent for due jobs left after the drain."""
    retry: bool = False
    """The batch should be delivered again: D1 failed before the drain could
    tell whether jobs were left."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(bodies: Sequence[Any], config: Config) -> WakeReport:
    """What a batch asks for: its distinct queues in the order first named
    (however many messages name each: duplicates fold into one drain)."""
    report = WakeReport(messages=len(bodies))
    for body in bodies:
        queue = parse_wake(body)
        if queue is None:
            report.ignored += 1
        elif not config.drains(queue):
            if queue not in report.not_drained:
                report.not_drained.append(queue)
        elif queue not in report.queues:
            report.queues.append(queue)
    return report


async def consume(
    queue: D1Queue,
    config: Config,
    bodies: Sequence[Any],
    *,
    run_drain: Callable[[Config], Awaitable[DrainReport]],
    waker: Waker | None,
) -> tuple[WakeReport, DrainReport | None]:
    """Handle one delivered batch: drain the queues it names (one drain over
    all of them, within the invocation's limits), then, if the drain stopped
    on a budget, send one more wake-up per `wake_per_jobs` due jobs left on
    each queue (at most `wake_max`). The caller acknowledges every message
    afterwards unless `retry` is set."""
    report = plan(bodies, config)
    if report.ignored:
        _log({"ignored": report.ignored, "note": "not a d1queue wake-up for this Worker"})
    if not report.queues:
        return report, None
    # Room for the fan-out is kept out of the drain's own budget, so a drain
    # that spends its budget can still say that work is left.
    budget = max(3, config.budget - FOLLOW_UP_RESERVE)
    drained = await run_drain(replace(config, queues=tuple(report.queues), query_budget=budget))
    if drained.stopped == "d1_error":
        report.retry = True  # Queues delivers it again later; the cron runs meanwhile
        return report, drained
    if drained.stopped not in LEFT_WORK or waker is None:
        return report, drained
    cap = config.wake_per_jobs * config.wake_max
    for name in report.queues:
        try:
            due = await queue.due(name, cap)
        except Exception as exc:  # no count, no fan-out: the cron is the safety net
            _log({"queue": name, "why": "backlog", "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        n = follow_ups(due, config.wake_per_jobs, config.wake_max)
        report.follow_ups += await waker.wake(name, n, why="backlog")
    return report, drained


__all__ = [
    "FOLLOW_UP_RESERVE",
    "SHARD",
    "WAKE_BINDING",
    "WakeReport",
    "Waker",
    "consume",
    "follow_ups",
    "parse_wake",
    "plan",
    "wake_body",
]
