"""A queue's flow limits as stored, and what they hold now: the reads and
writes of the limits API, the stats and the dashboard (the claims' own
statements are the claim's, in admission.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.bounds import check_stored_name
from ..core.flow import NO_LIMITS, Limits
from . import sql
from .queue import D1Queue

BUSIEST_GROUPS = 10
"""Groups `running_by_group` names, the busiest first."""


@dataclass
class QueueLimits:
    """A queue's limits and their use now (GET /v1/queues/{queue}/limits)."""

    queue: str
    limits: Limits = NO_LIMITS
    source: str = "none"
    """Where they come from: "api" (stored), "code" (declared at
    registration or with Registry.limit) or "none"."""
    running: int = 0
    """The queue's jobs held by workers now."""
    running_by_group: dict[str, int] = field(default_factory=dict)
    """The busiest groups' jobs held now ("" for jobs with no group)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "limits": self.limits.as_dict(),
            "source": self.source,
            "running": self.running,
            "running_by_group": self.running_by_group,
        }


def effective(queue: D1Queue, name: str, stored: object) -> tuple[Limits, str]:
    """The limits a queue's drains apply: those stored over the API, else
    those its registry declares, else none; and which of the three."""
    limits = Limits.from_json(stored)
    if limits is not None:
        return limits, "api"
    declared = queue.registry.limits().get(name) if queue.registry is not None else None
    if declared is not None:
        return declared, "code"
    return NO_LIMITS, "none"


async def read_limits(queue: D1Queue, name: str, groups: int = BUSIEST_GROUPS) -> QueueLimits:
    """`name`'s limits and use, in one round trip: its row, and its jobs held
    now (a read of its locked band: the jobs in flight and the retries
    waiting there)."""
    check_stored_name("queue", name)
    now = queue.clock()
    row, running, by_group = await queue.binding.batch(
        [
            (sql.SELECT_LIMITS, (name,)),
            (sql.RUNNING, (name, now)),
            (sql.RUNNING_BY_GROUP, (name, now, groups)),
        ]
    )
    stored = row.rows[0]["limits"] if row.rows else None
    limits, source = effective(queue, name, stored)
    return QueueLimits(
        name,
        limits,
        source,
        int(running.rows[0]["n"]) if running.rows else 0,
        {str(r["grp"]): int(r["n"]) for r in by_group.rows},
    )
