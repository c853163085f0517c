"""Charts drawn on the server as SVG: stacked bars (jobs by outcome over
time), lines (p50 and p95 durations over time) and a stacked share bar (a
batch's progress). No script and no inline style (the CSP allows neither):
shapes carry classes the stylesheet colours, and fills that name patterns
defined in the chart itself.

Nothing here relies on colour alone: each outcome has its own pattern
(completed solid, retried striped, failed cross-hatched, cancelled dotted),
p50 and p95 differ in dash and marker shape, and every chart has a legend
in words, axes with their units, time labels, and a <title>/<desc> that say
its numbers to a screen reader. Every text that comes from outside goes
through `h.e`; ids are made from fixed names and an `id` the caller passes
(a fixed word per chart on its page)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from . import html as h

WIDTH, HEIGHT = 720, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 52, 46
"""The chart's size and the margins around its plot, in SVG units: the
y axis's labels on the left, the legend above, the time labels below."""

PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

OUTCOME_LOOK = {
    "completed": ("c", "solid"),
    "retried": ("r", "striped"),
    "failed": ("f", "cross-hatched"),
    "cancelled": ("x", "dotted"),
    "pending": ("p", "empty"),
}
"""An outcome -> (its class, the pattern that tells it without colour)."""

_MARKS = {
    "c": "",
    "r": '<path class="mark" d="M-1,1 l2,-2 M0,6 l6,-6 M5,7 l2,-2"/>',
    "f": '<path class="mark" d="M0,0 L6,6 M6,0 L0,6"/>',
    "x": '<circle class="mark-dot" cx="3" cy="3" r="1.2"/>',
    "p": "",
}


def patterns(id: str, classes: Sequence[str]) -> str:
    """The <defs> of a chart `id`: a pattern per outcome class, named
    `{id}-{cls}`, its colour from the stylesheet (.k-{cls})."""
    defs = "".join(
        f'<pattern id="{id}-{cls}" width="6" height="6" patternUnits="userSpaceOnUse">'
        f'<rect class="k-{cls}" width="6" height="6"/>{_MARKS[cls]}</pattern>'
        for cls in classes
    )
    return f"<defs>{defs}</defs>"


# -- scales and labels ---------------------------------------------------------------


def nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (1 for
    nothing), so the y axis's ticks fall on round numbers."""
    if value <= 0:
        return 1
    power = 10.0 ** math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * power >= value - 1e-12:
            return m * power
    return 10 * power


def count_label(n: float) -> str:
    return f"{n:,.0f}" if n == round(n) else f"{n:,.1f}"


def seconds_label(s: float | None) -> str:
    """A duration with its unit: 0 s, 250 ms, 2.5 s, 3 min, 1.2 h."""
    if s is None:
        return "—"
    if s == 0:
        return "0 s"
    if s < 1:
        ms = s * 1000
        return f"{ms:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"


def time_label(ms: int, step_ms: int) -> str:
    """A step's start on the time axis, in UTC: the time of day for minute
    and hour steps within a day, the date and hour across days."""
    t = datetime.fromtimestamp(ms / 1000, UTC)
    return t.strftime("%H:%M") if step_ms < 3_600_000 else t.strftime("%m-%d %H:%M")


def _tick_every(n: int, step_ms: int) -> int:
    """How many steps apart the time labels are: at most eight along the
    axis (a week's 169 hour steps: a label a day), on round times (minutes
    by 5, 10, 15 or 30; hours by 3, 6, 12 or a day)."""
    rounds = (1, 2, 5, 10, 15, 30, 60) if step_ms < 3_600_000 else (1, 2, 3, 6, 12, 24, 48)
    for every in rounds:
        if n / every <= 8:
            return every
    return max(1, n // 6)


@dataclass(frozen=True)
class Axis:
    """The time axis: `steps` buckets of `step_ms` from `start_ms`."""

    start_ms: int
    step_ms: int
    steps: int

    def x(self, i: float) -> float:
        return LEFT + PLOT_W * i / max(self.steps, 1)

    def labels(self, step_word: str) -> str:
        """Ticks and labels along the bottom, and the axis's title."""
        out = []
        every = _tick_every(self.steps, self.step_ms)
        # Labels fall on round times (a multiple of `every` steps since the epoch).
        first = (-(self.start_ms // self.step_ms)) % every
        for i in range(first, self.steps + 1, every):
            x = round(self.x(i), 1)
            at = self.start_ms + i * self.step_ms
            out.append(
                f'<line class="tick" x1="{x}" y1="{TOP + PLOT_H}" x2="{x}" '
                f'y2="{TOP + PLOT_H + 4}"/><text class="tl" x="{x}" y="{TOP + PLOT_H + 16}" '
                f'text-anchor="middle">{h.e(time_label(at, self.step_ms))}</text>'
            )
        out.append(
            f'<text class="at" x="{LEFT + PLOT_W / 2}" y="{HEIGHT - 6}" text-anchor="middle">'
            f"Time (UTC), one {h.e(step_word)} a step</text>"
        )
        return "".join(out)


def _y_axis(top: float, title: str, label: Callable[[float], str]) -> str:
    """Grid lines and labels at 0, ¼, ½, ¾ and all of `top`, and the title."""
    out = []
    for k in range(5):
        value = top * k / 4
        y = round(TOP + PLOT_H - PLOT_H * k / 4, 1)
        text = label(value)
        out.append(
            f'<line class="{"axis" if k == 0 else "grid"}" x1="{LEFT}" y1="{y}" '
            f'x2="{LEFT + PLOT_W}" y2="{y}"/>'
            f'<text class="tl" x="{LEFT - 6}" y="{y + 4}" text-anchor="end">{h.e(text)}</text>'
        )
    out.append(
        f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + PLOT_H}"/>'
        f'<text class="at" transform="rotate(-90)" x="{-(TOP + PLOT_H / 2)}" y="14" '
        f'text-anchor="middle">{h.e(title)}</text>'
    )
    return "".join(out)


def _frame(id: str, title: str, desc: str, body: str) -> str:
    return (
        f'<svg class="chart" id="{h.e(id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{h.e(id)}-t {h.e(id)}-d"><title id="{h.e(id)}-t">{h.e(title)}'
        f'</title><desc id="{h.e(id)}-d">{h.e(desc)}</desc>{body}</svg>'
    )


KEY_ROW = 18
"""The height of a row of the legend above the plot (two rows fit)."""


def _legend(entries: Sequence[tuple[str, str, str]]) -> str:
    """The legend above the plot: each (label, fill, line class) in turn,
    wrapping to a second row where the first is full."""
    out, x, row = [], float(LEFT), 0
    for label, fill, line in entries:
        wide = (30 if line else 22) + 6.5 * len(label) + 14
        if x + wide > WIDTH and x > LEFT:
            x, row = float(LEFT), row + 1
        out.append(_key(x, row * KEY_ROW, label, fill=fill, line=line))
        x += wide
    return "".join(out)


def _key(x: float, dy: float, label: str, *, fill: str = "", line: str = "") -> str:
    """One entry of a legend drawn above the plot: a swatch (`fill`, or the
    `line` class with its marker), then its words. The swatch has no outcome
    class: counting a chart's bars by class counts bars only."""
    if line:
        swatch = (
            f'<line class="{line}" x1="{x}" y1="{14 + dy}" x2="{x + 22}" y2="{14 + dy}"/>'
            + _marker(line, x + 11, 14 + dy)
        )
        width = 26
    else:
        swatch = f'<rect class="key" x="{x}" y="{8 + dy}" width="14" height="12" fill="{fill}"/>'
        width = 18
    return f'{swatch}<text class="kl" x="{x + width}" y="{18 + dy}">{h.e(label)}</text>'


def _marker(cls: str, x: float, y: float) -> str:
    """p50 as a circle, p95 as a square: told apart without colour."""
    if cls == "p50":
        return f'<circle class="pt p50" cx="{round(x, 1)}" cy="{round(y, 1)}" r="3"/>'
    return (
        f'<rect class="pt p95" x="{round(x - 3, 1)}" y="{round(y - 3, 1)}" width="6" height="6"/>'
    )


# -- stacked bars --------------------------------------------------------------------


def bars(
    id: str,
    title: str,
    axis: Axis,
    series: Sequence[tuple[str, Sequence[int]]],
    *,
    step_word: str,
) -> str:
    """Jobs by outcome per step, stacked (first series at the bottom):
    `series` is (outcome, a count per step) with outcomes OUTCOME_LOOK names."""
    classes = [OUTCOME_LOOK[name][0] for name, _ in series]
    per_step = [sum(values[i] for _, values in series) for i in range(axis.steps)]
    top = 4 * max(1.0, nice_top(max(per_step, default=0) / 4))  # whole jobs a tick
    width = PLOT_W / max(axis.steps, 1)
    gap = 1 if width > 3 else 0
    rects = []
    for i in range(axis.steps):
        y = float(TOP + PLOT_H)
        when = time_label(axis.start_ms + i * axis.step_ms, axis.step_ms)
        for (name, values), cls in zip(series, classes, strict=True):
            n = values[i]
            if not n:
                continue
            tall = max(1.0, n / top * PLOT_H)
            y -= tall
            rects.append(
                f'<rect class="{cls}" x="{round(axis.x(i) + gap / 2, 2)}" y="{round(y, 2)}" '
                f'width="{round(max(width - gap, 0.5), 2)}" height="{round(tall, 2)}" '
                f'fill="url(#{id}-{cls})"><title>{h.e(when)}: {n} {h.e(name)}</title></rect>'
            )
    totals = {name: sum(values) for name, values in series}
    desc = (
        ", ".join(f"{n} {name}" for name, n in totals.items())
        + f"; at most {max(per_step, default=0)} in one {step_word}"
    )
    keys = _legend(
        [
            (f"{name} ({OUTCOME_LOOK[name][1]}): {totals[name]}", f"url(#{id}-{cls})", "")
            for (name, _), cls in zip(series, classes, strict=True)
        ]
    )
    body = (
        patterns(id, classes)
        + _y_axis(top, f"Jobs per {step_word}", count_label)
        + axis.labels(step_word)
        + "".join(rects)
        + keys
    )
    return _frame(id, title, desc, body)


# -- lines ---------------------------------------------------------------------------


def lines(
    id: str,
    title: str,
    axis: Axis,
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    *,
    step_word: str,
) -> str:
    """Durations per step: `series` is (class p50 or p95, label, seconds per
    step or None where nothing ran), a line each, broken where none ran,
    a marker at each step that has a value."""
    values = [v for _, _, vs in series for v in vs if v is not None]
    top = 4 * nice_top(max(values, default=0) / 4)
    drawn: list[str] = []
    for cls, _label, vs in series:
        run: list[str] = []
        runs: list[list[str]] = [run]
        marks = []
        for i, v in enumerate(vs):
            if v is None:
                run = []
                runs.append(run)
                continue
            x, y = axis.x(i + 0.5), TOP + PLOT_H - v / top * PLOT_H
            run.append(f"{round(x, 1)},{round(y, 1)}")
            marks.append(_marker(cls, x, y))
        drawn.extend(
            f'<polyline class="{cls}" points="{" ".join(r)}"/>' for r in runs if len(r) > 1
        )
        drawn.extend(marks)
    summary = []
    for _, label, vs in series:
        seen = [v for v in vs if v is not None]
        summary.append(
            f"{label}: highest {seconds_label(max(seen))}" if seen else f"{label}: no jobs ran"
        )
    keys = _legend([(label, "", cls) for cls, label, _ in series])
    body = (
        _y_axis(top, "Seconds (p50, p95)", seconds_label)
        + axis.labels(step_word)
        + "".join(drawn)
        + keys
    )
    return _frame(id, title, "; ".join(summary), body)


# -- a share bar ---------------------------------------------------------------------


def share_bar(id: str, parts: Sequence[tuple[str, int]], total: int, *, legend: bool = True) -> str:
    """One bar split into `parts` (outcome, count) out of `total`, each with
    its pattern, what is left of `total` as the empty track; a legend in
    words follows it (a batch's progress) unless `legend` is False (a list's
    row, which says the counts in words beside it)."""
    classes = [OUTCOME_LOOK[name][0] for name, _ in parts]
    x, rects = 0.0, []
    for (_name, n), cls in zip(parts, classes, strict=True):
        if not n or total <= 0:
            continue
        w = 100 * n / total
        rects.append(
            f'<rect class="{cls}" x="{round(x, 3)}%" y="0" width="{round(w, 3)}%" height="100%" '
            f'fill="url(#{id}-{cls})"/>'
        )
        x += w
    # Sized in percent with no viewBox: the bar stretches to its width
    # while its patterns keep their shape (a stretched viewBox would skew them).
    bar = (
        f'<svg class="share" aria-hidden="true" focusable="false">{patterns(id, classes)}'
        f'<rect class="track" width="100%" height="100%"/>{"".join(rects)}</svg>'
    )
    if not legend:
        return bar
    left = max(total - sum(n for _, n in parts), 0)
    keys = "".join(
        f'<li><svg class="swatch" viewBox="0 0 12 12" aria-hidden="true" focusable="false">'
        f'<rect class="{cls}" width="12" height="12" fill="url(#{id}-{cls})"/></svg>'
        f"{n} {h.e(name)} ({h.e(OUTCOME_LOOK[name][1])})</li>"
        for (name, n), cls in zip(parts, classes, strict=True)
    ) + (
        '<li><svg class="swatch" viewBox="0 0 12 12" aria-hidden="true" focusable="false">'
        f'<rect class="track" width="12" height="12"/></svg>{left} not ended (empty)</li>'
    )
    return f'{bar}<ul class="legend">{keys}</ul>'
