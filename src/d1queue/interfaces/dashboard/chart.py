"""The overview's chart: the last hour's outcomes minute by minute, as an
SVG bar chart (no script, no inline style: the CSP allows neither), with
its numbers in words for screen readers. Read from the per-minute counters
(store/stats.py)."""

from __future__ import annotations

from ...store import stats as counters
from . import html as h
from .parts import empty

WIDTH, HEIGHT, BAR = 600, 120, 10
"""The chart's size and a minute's bar's width, in SVG units."""

SERIES = (("c", "completed"), ("r", "retried"), ("f", "failed"))
"""The bars stacked in a minute, bottom first: (class, counter)."""


def _bars(series: list[counters.Minute], top: int) -> str:
    """Each minute's outcomes stacked, scaled so the busiest is `top`."""
    bars = []
    for i, m in enumerate(series):
        x = i * BAR
        y = HEIGHT
        for cls, name in SERIES:
            n = getattr(m, name)
            if not n:
                continue
            tall = max(1, round(n / top * (HEIGHT - 4)))
            y -= tall
            bars.append(
                f'<rect class="{cls}" x="{x + 1}" y="{y}" width="{BAR - 2}" height="{tall}"/>'
            )
    return "".join(bars)


def chart(minutes: list[counters.Minute], now_ms: int) -> str:
    """The last hour as a bar chart, or what to expect when nothing ran."""
    series = counters.per_minute(minutes, now_ms)
    completed = sum(m.completed for m in series)
    retried = sum(m.retried for m in series)
    failed = sum(m.failed for m in series)
    summary = f"{completed} completed, {retried} retried, {failed} failed in the last hour"
    if not completed and not retried and not failed:
        return empty(
            "<strong>No jobs ran in the last hour.</strong> The chart fills in as cron runs "
            "drain jobs (each run records its counts)."
        )
    top = max(m.completed + m.retried + m.failed for m in series) or 1
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT + 1}" role="img" '
        'aria-labelledby="chart-t"><title id="chart-t">'
        f"{h.e(summary)} (peak {top} a minute)</title>"
        f'<line class="axis" x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}"/>'
        f"{_bars(series, top)}</svg>"
        '<ul class="legend"><li><span class="sw c"></span>completed</li>'
        '<li><span class="sw r"></span>retried</li><li><span class="sw f"></span>failed</li>'
        f"<li>{h.e(summary)}; peak {top} a minute; oldest minute on the left</li></ul>"
    )
