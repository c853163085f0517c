"""Workers Analytics Engine, optional: with an `analytics_engine_datasets`
binding named ANALYTICS_BINDING, each drain writes what it settled as one
data point per (queue, job name, outcome): how many, and the sum and the
maximum of their wait and run (core/metrics.py `Tally`, POINT_BLOBS and
POINT_DOUBLES), so a drain of a thousand `mail.send` jobs writes one point,
not a thousand.

Analytics Engine takes at most 250 points an invocation (ANALYTICS_POINTS),
however many drains the invocation runs (a cron run drains every shard), so
the points are counted on the invocation's `Points` and a drain with more
keys than are left folds the least busy into one point per outcome. A write
is not a subrequest and sends nothing the drain waits for; a binding that
throws loses those points and never the jobs' outcomes, which D1 already
holds. The points count what the drain settled, a lost-reply re-send once
(its mark is "resent"), a job another worker took over not at all.

Reading them back is the SQL API's (docs/operations.md: Analytics Engine).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..core.config import ANALYTICS_BINDING
from ..core.log import event
from ..core.metrics import Tally

ANALYTICS_POINTS = 250
"""Data points Analytics Engine accepts from one invocation
(developers.cloudflare.com/analytics/analytics-engine/limits)."""

log = logging.getLogger("d1queue.analytics")


class Points:
    """One invocation's Analytics Engine dataset and the points it may still
    write. `write` is the binding's writeDataPoint (the Worker glue turns the
    point into a JS object)."""

    __slots__ = ("left", "lost", "write", "written")

    def __init__(self, write: Callable[[dict[str, Any]], Any], left: int = ANALYTICS_POINTS):
        self.write = write
        self.left = left
        self.written = 0
        self.lost = 0

    def send(self, tally: Tally) -> int:
        """Write `tally` as at most `left` points; returns how many were
        written. Never raises: metrics must not cost a drain its report."""
        points = tally.points(self.left)
        sent = 0
        for point in points:
            try:
                self.write(point)
            except Exception as exc:  # the binding refused: these points are lost
                self.lost += len(points) - sent
                event(log, "d1queue.analytics_failed", logging.WARNING, error=repr(exc))
                break
            sent += 1
        self.left -= sent
        self.written += sent
        return sent


__all__ = ["ANALYTICS_BINDING", "ANALYTICS_POINTS", "Points"]
