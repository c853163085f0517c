"""The drain's per-minute counters: what each run completed, retried and
failed, per queue, for the dashboard's chart and its "done in the last hour
and day" (migrations/0005_stats.sql).

A run writes at most one row: one UPSERT into its minute's slot of a
1,440-row ring, sent once at the end of the drain and budgeted by it like
any other subrequest (worker.py reserves room for it before planning any
round). Counting is best effort: a write D1 refuses is logged and dropped,
never the drain's failure, since these counters decide nothing about a job.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field

from ..core.log import event, get
from . import sql
from .binding import Binding

MINUTE_MS = 60_000
HOUR_MINUTES = 60
DAY_MINUTES = sql.STATS_SLOTS

log = get(__name__)


_ACTION_INDEX = {"complete": 0, "retry": 1, "fail": 2}


@dataclass
class RunCounts:
    """One drain run's outcomes, in total and per queue."""

    completed: int = 0
    retried: int = 0
    failed: int = 0
    by_queue: dict[str, list[int]] = field(default_factory=dict)
    """queue -> [completed, retried, failed]."""

    def add(self, queue: str, action: str) -> None:
        """Count one settled outcome ("complete", "retry" or "fail")."""
        index = _ACTION_INDEX[action]
        counts = self.by_queue.setdefault(queue, [0, 0, 0])
        counts[index] += 1
        if index == 0:
            self.completed += 1
        elif index == 1:
            self.retried += 1
        else:
            self.failed += 1

    @property
    def empty(self) -> bool:
        return not (self.completed or self.retried or self.failed)


async def record(binding: Binding, counts: RunCounts, now_ms: int) -> bool:
    """Add one run's counts to its minute's row: one statement, one row
    written; nothing at all for a run that settled nothing. False (and a log
    line) if D1 refused it."""
    if counts.empty:
        return True
    run = secrets.token_hex(8)  # at run time: Workers refuse randomness at import
    queues = json.dumps(counts.by_queue, separators=(",", ":"), sort_keys=True)
    try:
        await binding.run(
            sql.RECORD_STATS,
            now_ms // MINUTE_MS,
            counts.completed,
            counts.retried,
            counts.failed,
            queues,
            run,
        )
    except Exception as exc:  # counters only: a lost write costs a chart a point
        event(log, "d1queue.stats.lost", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
        return False
    return True


@dataclass
class Minute:
    minute: int
    completed: int
    retried: int
    failed: int


@dataclass
class Done:
    """Jobs a queue completed (and failed) in the last hour and day."""

    hour: int = 0
    day: int = 0
    failed_hour: int = 0
    failed_day: int = 0


def _slot_ranges(now_minute: int) -> tuple[int, int, int, int]:
    """The slots of the last hour as two inclusive ranges (equal when the
    hour does not wrap the ring)."""
    lo = (now_minute - HOUR_MINUTES + 1) % sql.STATS_SLOTS
    hi = now_minute % sql.STATS_SLOTS
    if lo <= hi:
        return lo, hi, lo, hi
    return lo, sql.STATS_SLOTS - 1, 0, hi


async def read(binding: Binding, now_ms: int) -> tuple[list[Minute], dict[str, Done]]:
    """The last hour's minutes (only those with counts) and each queue's
    totals over the last hour and day, in one round trip."""
    now_minute = now_ms // MINUTE_MS
    minutes, totals = await binding.batch(
        [
            (sql.STATS_MINUTES, (*_slot_ranges(now_minute), now_minute - HOUR_MINUTES)),
            (sql.STATS_BY_QUEUE, (now_minute - HOUR_MINUTES, now_minute - DAY_MINUTES)),
        ]
    )
    chart = [
        Minute(int(r["minute"]), int(r["completed"]), int(r["retried"]), int(r["failed"]))
        for r in minutes.rows
    ]
    done: dict[str, Done] = {}
    for r in totals.rows:
        done[str(r["queue"])] = Done(*(int(r[k] or 0) for k in _DONE_COLUMNS))
    return chart, done


_DONE_COLUMNS = ("done_hour", "done_day", "failed_hour", "failed_day")


def per_minute(chart: list[Minute], now_ms: int) -> list[Minute]:
    """The last hour minute by minute, oldest first, idle minutes as zeros."""
    now_minute = now_ms // MINUTE_MS
    seen = {m.minute: m for m in chart}
    return [
        seen.get(m, Minute(m, 0, 0, 0))
        for m in range(now_minute - HOUR_MINUTES + 1, now_minute + 1)
    ]
