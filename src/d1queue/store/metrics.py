"""Job metrics kept in D1 (migrations/0012_metrics.sql): written inside the
settle batch (settle.py places them), read by the API, the RPC and the
Prometheus scrape, rolled up and pruned by the cron (in the batch reading
its due schedules: `maintenance`).

Writing costs no query of its own: the statements ride in the settle batch
that goes to D1 anyway. Per round, one UPSERT before the statements that
settle jobs one by one (sql.METRICS_HELD: it counts the jobs still held
under their token, which those statements then settle), and one after each
statement acknowledging a claim batch's completions at once
(sql.METRICS_ACKED, guarded by its `changes()`); each writes a row per
(queue, name) for the totals and one for the minute. With metrics off
(D1QUEUE_METRICS = off) nothing is sent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.metrics import (
    HOUR_MS,
    HOURS_KEPT_MS,
    MINUTE_MS,
    MINUTES_KEPT_MS,
    ROLLUP_MARGIN_MS,
    WINDOWS,
    Figures,
    observation,
)
from ..core.outcomes import Outcome, ending
from . import sql
from .binding import Binding, Statement


def _entry(outcome: Outcome, now: int) -> list[Any]:
    job = outcome.job
    started = job.started_at or now
    kind, wb, wait, rb, run = observation(ending(outcome), job.available_at, started, job.run_ms)
    return [
        job.queue,
        job.name,
        kind,
        wb,
        wait,
        rb,
        round(run, 3),
        job.id,
        job.reserved_until or 0,
        job.reservation or "",
    ]


def _jobs(outcomes: Sequence[Outcome], now: int) -> str:
    return json.dumps([_entry(o, now) for o in outcomes], separators=(",", ":"))


def held(outcomes: Sequence[Outcome], now: int) -> Statement:
    """The UPSERT counting `outcomes` where their jobs are still held, sent
    before the statements settling them (sql.METRICS_HELD)."""
    return (sql.METRICS_HELD, (_jobs(outcomes, now), now - now % MINUTE_MS))


def acked(outcomes: Sequence[Outcome], now: int) -> Statement:
    """The UPSERT counting a claim batch's completions, sent right after the
    statement acknowledging them, if it changed as many rows (sql.METRICS_ACKED)."""
    return (sql.METRICS_ACKED, (_jobs(outcomes, now), now - now % MINUTE_MS, len(outcomes)))


def cancelled(id: str, now: int) -> Statement:
    """The UPSERT counting a cancel, sent before its deletes (sql.METRICS_CANCELLED)."""
    return (sql.METRICS_CANCELLED, (id, now - now % MINUTE_MS))


def cleared(queue: str, now: int) -> Statement:
    """The UPSERT counting a clear's jobs as cancelled, sent before its
    deletes (sql.METRICS_CLEARED)."""
    return (sql.METRICS_CLEARED, (queue, now - now % MINUTE_MS))


@dataclass
class Window:
    """What GET /v1/metrics reads: all-time totals, the window's figures per
    (queue, name), and its series for charts."""

    totals: dict[tuple[str, str], Figures] = field(default_factory=dict)
    figures: dict[tuple[str, str], Figures] = field(default_factory=dict)
    series: dict[tuple[str, str], dict[int, Figures]] = field(default_factory=dict)
    step_ms: int = MINUTE_MS
    start_ms: int = 0
    end_ms: int = 0


def _key(row: Any) -> tuple[str, str]:
    return (str(row["queue"]), str(row["name"]))


async def read(
    binding: Binding, now: int, window: str = "1h", queue: str = "", name: str = ""
) -> Window:
    """The totals and one window (core/metrics.py WINDOWS) in one round trip.
    A 1 h window reads minute rows; longer ones read hour rows, and minute
    rows for the last hours the cron has not rolled up yet (those starting
    at or after `cut`, two hours before this hour): at most 60, 24 + 180 or
    168 + 180 rows per (queue, name) read, whatever the number of jobs."""
    length, step = WINDOWS[window]
    end = now - now % MINUTE_MS + MINUTE_MS
    start = end - length
    start -= start % step
    statements: list[Statement] = [(sql.METRICS_TOTALS, (queue, name))]
    if step == MINUTE_MS:
        statements.append((sql.METRICS_SERIES, (queue, name, MINUTE_MS, start, end)))
    else:
        cut = max(start, now - now % HOUR_MS - 2 * HOUR_MS)
        statements.append((sql.METRICS_SERIES, (queue, name, HOUR_MS, start, cut)))
        statements.append((sql.METRICS_SERIES, (queue, name, MINUTE_MS, cut, end)))
    totals, *series = await binding.batch(statements)
    out = Window(step_ms=step, start_ms=start, end_ms=end)
    for row in totals.rows:
        out.totals.setdefault(_key(row), Figures()).add_row(row)
    for result in series:
        for row in result.rows:
            key = _key(row)
            at = int(row["at"])
            at -= at % step
            out.figures.setdefault(key, Figures()).add_row(row)
            out.series.setdefault(key, {}).setdefault(at, Figures()).add_row(row)
    return out


def maintenance(now: int, budget: int) -> list[Statement]:
    """A cron run's rollup and prune, statements that ride in the batch
    reading its due schedules (schedules.py; no query of their own): roll
    up the hour after the last one rolled (the cursor, read by the SQL
    itself) once it ended ROLLUP_MARGIN_MS ago, then prune at most
    `budget` minute rows past MINUTES_KEPT_MS (only of hours already rolled
    up) and `budget` hour rows past HOURS_KEPT_MS. In this order: ROLLED
    and PRUNED index their results."""
    latest = now - ROLLUP_MARGIN_MS
    latest -= latest % HOUR_MS
    latest -= HOUR_MS  # the last hour that ended ROLLUP_MARGIN_MS ago
    oldest = now - HOURS_KEPT_MS
    oldest -= oldest % HOUR_MS
    out: list[Statement] = [
        (sql.ROLL_METRICS, (latest, oldest)),
        (sql.ROLL_METRICS_MARK, (latest, oldest, now)),
    ]
    if budget > 0:
        out.append((sql.PRUNE_METRICS, (MINUTE_MS, now - MINUTES_KEPT_MS, budget)))
        out.append((sql.PRUNE_METRICS, (HOUR_MS, now - HOURS_KEPT_MS, budget)))
    return out


ROLLED = 0
"""The index, in `maintenance`'s statements, of the rollup (its changes:
hour rows written)."""
PRUNED = (2, 3)
"""The indices of the prunes (their changes: rows deleted)."""


@dataclass
class Maintained:
    """What one run's rollup and prune did (the cron's report)."""

    rolled: int = 0
    """Hour rows the rollup wrote (one per (queue, name) that ran jobs in
    the hour rolled; 0 when no hour was due)."""
    pruned: int = 0
    """Minute and hour rows deleted past their retention."""


def maintained(results: Sequence[Any]) -> Maintained:
    """`maintenance`'s counts, from the results of its statements in order."""
    return Maintained(
        rolled=results[ROLLED].changes,
        pruned=sum(results[i].changes for i in PRUNED if i < len(results)),
    )


async def maintain(binding: Binding, now: int, budget: int) -> Maintained:
    """`maintenance` in a batch of its own (one round trip), for callers
    outside the cron."""
    return maintained(await binding.batch(maintenance(now, budget)))
