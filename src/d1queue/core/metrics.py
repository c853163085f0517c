"""Job metrics' rules: the histogram buckets of wait and run time, the
windows a read covers, percentiles from buckets, and the Prometheus text
exposition of what the store keeps (store/metrics.py).

Wait is how long a job was due before its handler started (started - due,
the `available_at` it was claimed at); run is how long its handler ran
(started -> its outcome decided). Both are observed once per attempt that
ran: completed, retried, failed, and cancelled while it ran; a job
cancelled before it started is counted and not observed.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1000.0,
    2500.0,
    3600.0,
)
"""The histograms' upper bounds (`le`), in seconds: 1 ms to 1 h, log-spaced
1-2.5-5 per decade, then one more bucket for everything longer (+Inf). The
writer, the Prometheus output and docs/operations.md all read this one
tuple; changing it changes the stored columns (migrations/0012_metrics.sql
has one column per bucket)."""

BUCKETS = len(BUCKETS_S) + 1
"""Buckets per histogram: one per bound, and the overflow."""

_BOUNDS_MS = tuple(b * 1000 for b in BUCKETS_S)

OUTCOMES = ("completed", "retried", "failed", "cancelled")
"""The counts kept per queue and job name, in the stored columns' order."""

KIND = {"complete": 0, "retry": 1, "fail": 2, "cancel": 3}
"""An outcome's ending (core/outcomes.py `ending`) -> its index in OUTCOMES."""

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
TOTAL = 0
"""The `period` of the all-time totals row (its `at` is 0); the series rows
carry their bucket's length (MINUTE_MS, HOUR_MS)."""

MINUTES_KEPT_MS = 3 * HOUR_MS
"""How long per-minute rows are kept: a 1 h window reads them, and the
longer windows read them for the hours not yet rolled up into hour rows."""

HOURS_KEPT_MS = 30 * 24 * HOUR_MS
"""How long per-hour rows are kept (30 days)."""

ROLLUP_MARGIN_MS = 2 * MINUTE_MS
"""An hour is rolled up this long after it ends: a settle's rows are keyed
by the Worker's clock when it built the batch, which reaches D1 a moment
later."""

WINDOWS: dict[str, tuple[int, int]] = {
    "1h": (HOUR_MS, MINUTE_MS),
    "24h": (24 * HOUR_MS, HOUR_MS),
    "7d": (7 * 24 * HOUR_MS, HOUR_MS),
}
"""A read's window -> (its length, its chart's step), both in ms."""

QUANTILES = (0.5, 0.95, 0.99)


def bucket(ms: float) -> int:
    """The histogram bucket of a duration in ms (the first whose bound it
    does not exceed; BUCKETS - 1 past the last)."""
    return bisect_left(_BOUNDS_MS, ms)


def observation(
    action: str, due_ms: int, started_ms: int, ran_ms: float
) -> tuple[int, int, float, int, float]:
    """One attempt as the writer binds it: (outcome index, wait bucket, wait
    ms, run bucket, run ms). A clock that ran backwards counts as 0."""
    wait = max(0, started_ms - due_ms)
    run = max(0.0, ran_ms)
    return KIND[action], bucket(wait), wait, bucket(run), run


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile in seconds, interpolated linearly inside the bucket
    holding it (as Prometheus's histogram_quantile does); the last finite
    bound when it falls in the overflow; None with no observations."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(BUCKETS_S):
                return BUCKETS_S[-1]
            lo = BUCKETS_S[i - 1] if i else 0.0
            return lo + (BUCKETS_S[i] - lo) * (rank - seen) / n
        seen += n
    return BUCKETS_S[-1]


@dataclass
class Histogram:
    """Counts per bucket and the sum of what was observed (seconds)."""

    counts: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    sum_s: float = 0.0

    def add(self, counts: Iterable[int], sum_ms: float) -> None:
        self.counts = [a + int(b or 0) for a, b in zip(self.counts, counts, strict=True)]
        self.sum_s += (sum_ms or 0) / 1000

    @property
    def count(self) -> int:
        return sum(self.counts)

    def summary(self) -> dict[str, Any]:
        """count, sum and p50/p95/p99 in seconds (None with nothing observed)."""
        out: dict[str, Any] = {"count": self.count, "sum_s": round(self.sum_s, 6)}
        for q in QUANTILES:
            value = quantile(self.counts, q)
            out[f"p{round(q * 100)}_s"] = None if value is None else round(value, 6)
        return out


@dataclass
class Figures:
    """One (queue, name)'s counts and histograms over some span."""

    counts: list[int] = field(default_factory=lambda: [0] * len(OUTCOMES))
    wait: Histogram = field(default_factory=Histogram)
    run: Histogram = field(default_factory=Histogram)

    def merge(self, other: Figures) -> None:
        """Add `other`'s counts and histograms (another shard's, name's or step's)."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.wait.add(other.wait.counts, other.wait.sum_s * 1000)
        self.run.add(other.run.counts, other.run.sum_s * 1000)

    def add_row(self, row: Mapping[str, Any]) -> None:
        """Add a stored row (sql.METRICS_COLUMNS)."""
        self.counts = [a + int(row[k] or 0) for a, k in zip(self.counts, OUTCOMES, strict=True)]
        self.wait.add((row[f"w{i}"] for i in range(BUCKETS)), row["wait_ms"])
        self.run.add((row[f"r{i}"] for i in range(BUCKETS)), row["run_ms"])


POINT_BLOBS = ("queue", "name", "outcome")
"""An Analytics Engine data point's blobs, in order (blob1..blob3); its one
index is the queue (the dataset's sampling key)."""

POINT_DOUBLES = ("jobs", "wait_ms_sum", "wait_ms_max", "run_ms_sum", "run_ms_max")
"""An Analytics Engine data point's doubles, in order (double1..double5)."""

OTHER = "(other)"
"""The queue and name of the points that fold the rest of a drain's
(queue, name, outcome) tallies when there are more than the points allowed."""


class Tally:
    """A drain's settled attempts per (queue, name, outcome): how many, and
    the sum and maximum of their wait and run, in ms. It becomes one
    Analytics Engine data point per key (`points`), whatever the number of
    jobs."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], list[float]] = {}

    def add(self, queue: str, name: str, outcome: str, wait_ms: float, run_ms: float) -> None:
        row = self.rows.get((queue, name, outcome))
        if row is None:
            self.rows[(queue, name, outcome)] = [1, wait_ms, wait_ms, run_ms, run_ms]
            return
        row[0] += 1
        row[1] += wait_ms
        row[2] = max(row[2], wait_ms)
        row[3] += run_ms
        row[4] = max(row[4], run_ms)

    def __len__(self) -> int:
        return len(self.rows)

    def points(self, room: int) -> list[dict[str, Any]]:
        """The data points to write, at most `room` (the invocation's points
        left): one per key, the busiest first; when there are more keys than
        room, the least busy are folded into one (OTHER, OTHER, outcome)
        point per outcome, so every job is still counted once."""
        if room <= 0 or not self.rows:
            return []
        ranked = sorted(self.rows.items(), key=lambda kv: (-kv[1][0], kv[0]))
        keep = len(ranked)
        if keep > room:
            # Keep the busiest k with k + (outcomes among the rest) <= room:
            # the rest become one folded point per outcome they hold.
            after: set[str] = set()
            fit = [0] * (keep + 1)  # fit[k]: outcomes among ranked[k:]
            for k in range(keep - 1, -1, -1):
                after.add(ranked[k][0][2])
                fit[k] = len(after)
            keep = max((k for k in range(room + 1) if k + fit[k] <= room), default=0)
        kept, rest = ranked[:keep], ranked[keep:]
        folded: dict[tuple[str, str, str], list[float]] = {}
        for (_, _, outcome), row in rest:
            into = folded.setdefault((OTHER, OTHER, outcome), [0, 0.0, 0.0, 0.0, 0.0])
            into[0] += row[0]
            into[1] += row[1]
            into[2] = max(into[2], row[2])
            into[3] += row[3]
            into[4] = max(into[4], row[4])
        chosen = (kept + sorted(folded.items(), key=lambda kv: -kv[1][0]))[:room]
        return [
            {"blobs": list(key), "doubles": [float(v) for v in row], "indexes": [key[0]]}
            for key, row in chosen
        ]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _le(bound: float) -> str:
    return repr(float(bound))


def _number(value: float) -> str:
    if value == math.floor(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def prometheus(
    totals: Mapping[tuple[str, str], Figures],
    states: Mapping[str, Mapping[str, int]],
    *,
    openmetrics: bool = False,
) -> str:
    """The Prometheus text exposition (version 0.0.4; OpenMetrics 1.0 with
    `openmetrics`) of the all-time totals per (queue, name) and the jobs per
    queue by state now:

    - d1queue_jobs_total{queue,name,outcome} (counter)
    - d1queue_job_wait_seconds{queue,name} and d1queue_job_run_seconds
      (histograms: cumulative _bucket{le}, _sum, _count)
    - d1queue_queue_jobs{queue,state} (gauge)
    """
    lines: list[str] = []
    keys = sorted(totals)
    counter = "d1queue_jobs" if openmetrics else "d1queue_jobs_total"
    lines.append(f"# HELP {counter} Jobs settled, by queue, job name and outcome.")
    lines.append(f"# TYPE {counter} counter")
    for queue, name in keys:
        f = totals[(queue, name)]
        for outcome, n in zip(OUTCOMES, f.counts, strict=True):
            labels = f'queue="{_label(queue)}",name="{_label(name)}",outcome="{outcome}"'
            lines.append(f"d1queue_jobs_total{{{labels}}} {n}")
    for metric, what, pick in (
        ("d1queue_job_wait_seconds", "How long jobs were due before they started.", "wait"),
        ("d1queue_job_run_seconds", "How long jobs' handlers ran.", "run"),
    ):
        lines.append(f"# HELP {metric} {what}")
        lines.append(f"# TYPE {metric} histogram")
        for queue, name in keys:
            h: Histogram = getattr(totals[(queue, name)], pick)
            labels = f'queue="{_label(queue)}",name="{_label(name)}"'
            cumulative = 0
            for bound, n in zip((*BUCKETS_S, math.inf), h.counts, strict=True):
                cumulative += n
                le = "+Inf" if bound == math.inf else _le(bound)
                lines.append(f'{metric}_bucket{{{labels},le="{le}"}} {cumulative}')
            lines.append(f"{metric}_sum{{{labels}}} {_number(round(h.sum_s, 6))}")
            lines.append(f"{metric}_count{{{labels}}} {cumulative}")
    lines.append("# HELP d1queue_queue_jobs Jobs on each queue now, by state.")
    lines.append("# TYPE d1queue_queue_jobs gauge")
    for queue in sorted(states):
        for state, n in sorted(states[queue].items()):
            labels = f'queue="{_label(queue)}",state="{_label(state)}"'
            lines.append(f"d1queue_queue_jobs{{{labels}}} {n}")
    if openmetrics:
        lines.append("# EOF")
    return "\n".join(lines) + "\n"


def wants_prometheus(accept: str) -> str | None:
    """Which text format an Accept header asks for: "openmetrics" when it
    names application/openmetrics-text, "text" for text/plain, None (JSON)
    otherwise or when it prefers JSON. A type with q=0 is refused."""
    best: tuple[float, str] | None = None
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for p in params:
            if p.lower().startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        media = media.lower()
        kind = {
            "application/openmetrics-text": "openmetrics",
            "text/plain": "text",
            "application/json": "json",
        }.get(media)
        if kind is None or q <= 0:
            continue
        if best is None or q > best[0]:
            best = (q, kind)
    if best is None or best[1] == "json":
        return None
    return best[1]
