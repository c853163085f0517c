"""The overview's chart: the last hour's outcomes minute by minute, drawn
by svg.py as stacked bars with axes, units, time labels and a legend (no
script, no inline style: the CSP allows neither), its numbers in words for
screen readers. Read from the per-minute counters (store/stats.py)."""

from __future__ import annotations

from ...store import stats as counters
from .parts import empty
from .svg import Axis, bars

MINUTE_MS = 60_000

SERIES = ("completed", "retried", "failed")
"""The bars stacked in a minute, bottom first (the counters' names)."""


def chart(minutes: list[counters.Minute], now_ms: int) -> str:
    """The last hour as a bar chart, or what to expect when nothing ran."""
    series = counters.per_minute(minutes, now_ms)
    if not any(m.completed or m.retried or m.failed for m in series):
        return empty(
            "<strong>No jobs ran in the last hour.</strong> The chart fills in as cron runs "
            "drain jobs (each run records its counts)."
        )
    axis = Axis(series[0].minute * MINUTE_MS, MINUTE_MS, len(series))
    counts = [(name, [getattr(m, name) for m in series]) for name in SERIES]
    return bars("chart-hour", "Jobs by outcome, the last hour", axis, counts, step_word="minute")
