"""What the metrics page shows (/ui/metrics): for a window (1 h, 24 h or
7 d), every queue or one, every job name or one, read from the stored job
metrics as GET /v1/metrics reads them (Service.metrics_window):

- jobs by outcome over time (stacked bars), and wait and run time, p50 and
  p95, over time (lines), drawn by svg.py;
- the job names' table: each (queue, name)'s jobs ended and per hour, its
  outcomes, failure rate, p50 and p95 wait and run, sortable by any of
  them (server-side, `?sort=`), each row linking to its charts and its jobs.

The page is the tuple of its sections (METRICS) over MetricsShown."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.metrics import OUTCOMES, WINDOWS, Figures
from ...store.metrics import Window
from . import html as h
from .parts import Column, crumbs, empty, filters, search_field, table
from .request import Request
from .svg import Axis, bars, lines, seconds_label

WINDOW_LABELS = {"1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days"}
STEP_WORDS = {60_000: "minute", 3_600_000: "hour"}


@dataclass
class NameRow:
    """One (queue, job name) over the window."""

    queue: str
    name: str
    figures: Figures

    @property
    def completed(self) -> int:
        return self.figures.counts[OUTCOMES.index("completed")]

    @property
    def retried(self) -> int:
        return self.figures.counts[OUTCOMES.index("retried")]

    @property
    def failed(self) -> int:
        return self.figures.counts[OUTCOMES.index("failed")]

    @property
    def cancelled(self) -> int:
        return self.figures.counts[OUTCOMES.index("cancelled")]

    @property
    def ended(self) -> int:
        """Jobs that reached their end by running: completed or failed (a
        retry is an attempt, not an end; a cancel never ran)."""
        return self.completed + self.failed

    @property
    def failure_rate(self) -> float | None:
        """Failed out of ended; None when none ended."""
        return self.failed / self.ended if self.ended else None

    def p(self, which: str, q: str) -> float | None:
        summary: dict[str, Any] = getattr(self.figures, which).summary()
        value = summary[f"p{q}_s"]
        return None if value is None else float(value)


SORTS: dict[str, tuple[str, Callable[[NameRow], Any]]] = {
    "name": ("Job name", lambda r: (r.name, r.queue)),
    "queue": ("Queue", lambda r: (r.queue, r.name)),
    "ended": ("Ended", lambda r: r.ended),
    "failure": ("Failure rate", lambda r: r.failure_rate),
    "wait_p50": ("Wait p50", lambda r: r.p("wait", "50")),
    "wait_p95": ("Wait p95", lambda r: r.p("wait", "95")),
    "run_p50": ("Run p50", lambda r: r.p("run", "50")),
    "run_p95": ("Run p95", lambda r: r.p("run", "95")),
}
"""The table's sort keys (`?sort=key`, `-key` descending) -> (column, value)."""

DEFAULT_SORT = "-ended"


def sort_rows(rows: list[NameRow], sort: str) -> list[NameRow]:
    """`rows` by `sort`; rows without a value (nothing ran) last either way,
    then by queue and name, so the order is stable."""
    key = SORTS[sort.lstrip("-")][1]
    valued = [r for r in rows if key(r) is not None]
    missing = [r for r in rows if key(r) is None]
    valued.sort(key=lambda r: (r.queue, r.name))
    valued.sort(key=key, reverse=sort.startswith("-"))
    return valued + sorted(missing, key=lambda r: (r.queue, r.name))


@dataclass
class MetricsShown:
    """What the metrics page shows (Pages.metrics_page reads it)."""

    request: Request
    window: str
    queue: str
    name: str
    sort: str
    read: Window

    def link(self, **changed: str) -> str:
        """This page with some of its parameters changed (markup-escaped)."""
        params = {"window": self.window, "queue": self.queue, "name": self.name}
        params["sort"] = self.sort if self.sort != DEFAULT_SORT else ""
        params.update(changed)
        if params.get("window") == "1h":
            params["window"] = ""
        return h.e("/ui/metrics" + h.qs(params))

    def rows(self) -> list[NameRow]:
        keys = set(self.read.figures) | set(self.read.totals)
        return [NameRow(q, n, self.read.figures.get((q, n), Figures())) for q, n in keys]

    @property
    def axis(self) -> Axis:
        r = self.read
        return Axis(r.start_ms, r.step_ms, math.ceil((r.end_ms - r.start_ms) / r.step_ms))

    def steps(self) -> list[Figures | None]:
        """The selection's figures per step, every name merged; None where
        nothing was recorded."""
        axis = self.axis
        merged: dict[int, Figures] = {}
        for points in self.read.series.values():
            for at, f in points.items():
                merged.setdefault(at, Figures()).merge(f)
        return [merged.get(axis.start_ms + i * axis.step_ms) for i in range(axis.steps)]


def _what(shown: MetricsShown) -> str:
    if shown.name and shown.queue:
        return f"job {shown.name} on queue {shown.queue}"
    if shown.name:
        return f"job {shown.name}, every queue"
    if shown.queue:
        return f"queue {shown.queue}, every job name"
    return "every queue and job name"


def metrics_heading(shown: MetricsShown) -> str:
    trail = [("/ui", "Overview")]
    if shown.queue:
        trail.append((f"/ui/queues/{h.q(shown.queue)}", f"Queue {shown.queue}"))
    here = f"Metrics of {shown.name}" if shown.name else "Metrics"
    windows = "".join(
        f'<a href="{shown.link(window=w)}"'
        f"{' aria-current=page' if w == shown.window else ''}>{label}</a>"
        for w, label in WINDOW_LABELS.items()
    )
    return (
        crumbs(trail, here)
        + f"<h1>{h.e(here)}</h1>"
        + f'<p class="muted">{h.e(WINDOW_LABELS[shown.window])}, {h.e(_what(shown))}. '
        "From the job metrics each drain records (D1QUEUE_METRICS); times in UTC.</p>"
        + f'<nav class="windows" aria-label="Window">{windows}</nav>'
    )


def metrics_filters(shown: MetricsShown) -> str:
    fields = [
        search_field("queue", "Queue", shown.queue, "any queue"),
        search_field("name", "Job name", shown.name, "any name"),
        h.hidden("window", shown.window) if shown.window != "1h" else "",
    ]
    return filters("/ui/metrics", "Choose what the charts show", fields)


def metrics_charts(shown: MetricsShown) -> str:
    steps = shown.steps()
    if not any(steps):
        return (
            '<section id="charts" aria-label="Charts">'
            + empty(
                f"<strong>No jobs recorded for {h.e(_what(shown))} in this window.</strong> "
                "The charts fill in as drains settle jobs (metrics are on unless "
                "D1QUEUE_METRICS is off)."
            )
            + "</section>"
        )
    axis = shown.axis
    word = STEP_WORDS.get(axis.step_ms, "step")
    counts = [
        (outcome, [f.counts[i] if f else 0 for f in steps]) for i, outcome in enumerate(OUTCOMES)
    ]
    parts = [
        "<h2>Jobs by outcome</h2>",
        bars("chart-outcomes", f"Jobs by outcome, {_what(shown)}", axis, counts, step_word=word),
    ]
    for which, title in (("wait", "Wait time (due to started)"), ("run", "Run time")):
        per = [getattr(f, which).summary() if f else None for f in steps]
        series = [
            (f"p{q}", f"p{q} {which}", [s[f"p{q}_s"] if s else None for s in per])
            for q in ("50", "95")
        ]
        parts.append(f"<h2>{title}, p50 and p95</h2>")
        parts.append(
            lines(f"chart-{which}", f"{title} of {_what(shown)}", axis, series, step_word=word)
        )
    return f'<section id="charts" aria-label="Charts">{"".join(parts)}</section>'


def _rate(r: NameRow) -> str:
    rate = r.failure_rate
    return '<span class="muted">—</span>' if rate is None else f"{rate * 100:.1f} %"


def _seconds(value: float | None) -> str:
    return h.e(seconds_label(value)) if value is not None else '<span class="muted">—</span>'


def _header(shown: MetricsShown, key: str) -> str:
    """A sortable column's header: a link sorting by it (descending first
    for numbers, ascending for names; again to reverse), with its order."""
    label = SORTS[key][0]
    now = shown.sort.lstrip("-") == key
    down = shown.sort.startswith("-")
    first = key if key in ("name", "queue") else f"-{key}"
    target = (key if down else f"-{key}") if now else first
    arrow = (" ▼" if down else " ▲") if now else ""
    state = (" (sorted descending)" if down else " (sorted ascending)") if now else ""
    return (
        f'<a class="sort" href="{shown.link(sort=target)}">{h.e(label)}{arrow}'
        f'<span class="visually-hidden">{state}</span></a>'
    )


def per_hour(n: int, hours: float) -> str:
    """Jobs an hour over the window, to a tenth ("< 0.1" for a few in days)."""
    rate = n / hours
    return "0" if not n else "&lt; 0.1" if rate < 0.1 else f"{rate:,.1f}"


def name_columns(shown: MetricsShown) -> list[Column[NameRow]]:
    hours = WINDOWS[shown.window][0] / 3_600_000

    def chart_link(r: NameRow) -> str:
        href = shown.link(queue=r.queue, name=r.name)
        return (
            f'<a href="{href}" title="Charts of {h.e(r.name)} on {h.e(r.queue)}">{h.e(r.name)}</a>'
        )

    def jobs_link(r: NameRow) -> str:
        href = h.e(f"/ui/queues/{h.q(r.queue)}" + h.qs({"name": r.name}))
        return f'<a href="{href}">Jobs<span class="visually-hidden"> of {h.e(r.name)}</span></a>'

    return [
        Column(_header(shown, "name"), chart_link, row_header=True),
        Column(
            _header(shown, "queue"),
            lambda r: f'<a href="/ui/queues/{h.q(r.queue)}">{h.e(r.queue)}</a>',
        ),
        Column(_header(shown, "ended"), lambda r: r.ended, "num"),
        Column("Per hour", lambda r: per_hour(r.ended, hours), "num hide-narrow"),
        Column("Completed", lambda r: r.completed, "num hide-narrow"),
        Column("Retried", lambda r: r.retried, "num hide-narrow"),
        Column("Failed", lambda r: r.failed, "num"),
        Column(_header(shown, "failure"), _rate, "num"),
        Column(_header(shown, "wait_p50"), lambda r: _seconds(r.p("wait", "50")), "num"),
        Column(_header(shown, "wait_p95"), lambda r: _seconds(r.p("wait", "95")), "num"),
        Column(_header(shown, "run_p50"), lambda r: _seconds(r.p("run", "50")), "num"),
        Column(_header(shown, "run_p95"), lambda r: _seconds(r.p("run", "95")), "num"),
        Column("Jobs", jobs_link),
    ]


def metrics_names(shown: MetricsShown) -> str:
    rows = sort_rows(shown.rows(), shown.sort)
    if not rows:
        listing = empty("<strong>No job names recorded yet</strong> for this selection.")
    else:
        listing = table(
            f"Job names, {h.e(WINDOW_LABELS[shown.window].lower())}",
            name_columns(shown),
            rows,
            caption_shown=True,
        )
    return (
        '<section id="names" aria-labelledby="names-h"><h2 id="names-h">Job names</h2>'
        '<p class="muted">Ended: completed or failed. Failure rate: failed out of ended. '
        "Wait: from due to started; run: the handler's time. p50 and p95 from each "
        f"attempt that ran.</p>{listing}</section>"
    )


METRICS = (metrics_heading, metrics_filters, metrics_charts, metrics_names)
