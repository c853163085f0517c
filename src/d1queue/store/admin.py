"""Operating a queue: stats, pausing, cancelling, and the failed-jobs store.

What people and dashboards ask of the queue, as opposed to what workers do
with it (push.py, claim.py, settle.py). Same driver layer: statements from
sql.py, sent through the D1Queue's binding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from ..core.bounds import check_name, check_stored_name
from ..core.flow import Limits
from ..core.job import QueuedJob
from . import metrics, sql
from .failed import (
    FAILED_CURSOR_RULE,
    FailedJob,
    FailedJobs,
)
from .flow import QueueLimits, effective, read_limits
from .queue import D1Queue
from .rows import row_to_job

CURSOR_RULE = FAILED_CURSOR_RULE
"""failed.FAILED_CURSOR_RULE by its earlier name."""


@dataclass
class QueueStats:
    queue: str
    ready: int = 0
    delayed: int = 0
    reserved: int = 0
    waiting: int = 0
    """Jobs waiting for others (`after`) to complete."""
    failed: int = 0
    oldest_ready_age_s: float | None = None
    paused: bool = False
    limits: dict[str, Any] | None = None
    """Its flow limits in the PUT body's shape (None: none); `reserved` is
    their use: the jobs held now."""


T = TypeVar("T")


class Admin:
    def __init__(self, queue: D1Queue) -> None:
        self.queue = queue
        self.failed = FailedJobs(queue.binding, queue.clock, queue.registry)
        self.binding = queue.binding
        # The failed jobs' operations are the failed store's own, under the
        # names ShardedAdmin spreads over shards: a page newest first with
        # the next page's cursor, a delete, a prune.
        self.failed_page = self.failed.page
        self.delete_failed = self.failed.delete
        self.prune_failed = self.failed.prune

    async def stats(self, name: str | None = None) -> list[QueueStats]:
        """Every queue that has jobs, failures or state (or just `name`), in
        one round trip."""
        now = self.queue.clock()
        if name is None:
            jobs: tuple[str, tuple[Any, ...]] = (sql.JOB_STATS, (now,))
            failed: tuple[str, tuple[Any, ...]] = (sql.FAILED_COUNTS, ())
        else:
            check_stored_name("queue", name)
            jobs = (sql.JOB_STATS_ONE, (now, name))
            failed = (sql.FAILED_COUNT_ONE, (name,))
        results = await self.binding.batch([jobs, failed, (sql.QUEUE_STATES, ())])
        by_name: dict[str, QueueStats] = {}

        def entry(q: Any) -> QueueStats:
            return by_name.setdefault(str(q), QueueStats(queue=str(q)))

        for r in results[0].rows:
            s = entry(r["queue"])
            s.ready, s.delayed = int(r["ready"] or 0), int(r["delayed"] or 0)
            s.reserved = int(r["reserved"] or 0)
            s.waiting = int(r["waiting"] or 0)
            if r["oldest_ready_at"] is not None:
                s.oldest_ready_age_s = max(0, now - int(r["oldest_ready_at"])) / 1000
        for r in results[1].rows:
            if r["queue"] is not None:
                entry(r["queue"]).failed = int(r["failed"])
        stored = {}
        for r in results[2].rows:
            if name is None or r["name"] == name:
                entry(r["name"]).paused = bool(r["paused"])
                stored[r["name"]] = r["limits"]
        if name is not None:
            entry(name)
        for s in by_name.values():
            limits, _ = effective(self.queue, s.queue, stored.get(s.queue))
            s.limits = None if limits.none else limits.as_dict()
        return sorted(by_name.values(), key=lambda s: s.queue)

    async def set_limits(self, name: str, limits: Limits) -> None:
        await self.queue.set_limits(name, limits)

    async def limits(self, name: str) -> QueueLimits:
        return await read_limits(self.queue, name)

    async def set_paused(self, name: str, paused: bool) -> None:
        """A paused queue is not drained; pushes to it are still accepted."""
        check_name("queue", name)
        await self.binding.run(sql.SET_PAUSED, name, int(paused), self.queue.clock())

    async def cancel(self, id: str) -> Literal["cancelled", "cancelling", "missing"]:
        """Cancel job `id`: deleted if no worker holds it ("cancelled"),
        else marked for the drain holding it to end it ("cancelling":
        sql.MARK_CANCEL; also when an earlier send marked it). "missing":
        no live job has the id (it ended, or never existed). One round
        trip, safe to re-send."""
        # A workflow's job is marked ended first (its waiters and batch
        # count the cancel as a failure), in the same transaction.
        cancels = (*sql.END_CANCELLED, *sql.CANCEL_JOBS)
        now = self.queue.clock()
        # Counted first, from the row the deletes then take (a re-send
        # finds it gone and counts nothing): store/metrics.py.
        counted = [metrics.cancelled(id, now)] if self.queue.metrics else []
        # The mark goes after the deletes, which take only a job no worker
        # holds: a job is deleted or marked, never both.
        *deleted, _, found = await self.binding.batch(
            [
                *counted,
                *((cancel, (id,)) for cancel in cancels),
                (sql.MARK_CANCEL, (id, now)),
                (sql.SELECT_JOB, (id,)),
            ]
        )
        deleted = deleted[len(counted) :]
        if any(d.changes for d in deleted):
            return "cancelled"
        if found.rows and found.rows[0]["cancel_at"] is not None:
            return "cancelling"
        # A row left unmarked and undeleted: a job both statements missed
        # (none is both free and held); told as missing, nothing written.
        return "missing"

    async def find(self, id: str) -> QueuedJob | FailedJob | None:
        """Job `id` wherever it is: queued (or running), failed, or None
        (acknowledged, cancelled or never queued)."""
        queued, failed = await self.binding.batch(
            [(sql.SELECT_JOB, (id,)), (sql.SELECT_FAILED, (id,))]
        )
        if queued.rows:
            return row_to_job(queued.rows[0])
        return FailedJob.of(failed.rows[0]) if failed.rows else None
