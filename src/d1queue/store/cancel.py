"""Cancelling a running job, as the drain holding it sees it: the watch a
handler declares (`cancel_watch_s`) reads the job's mark where its worker
holds it. The mark itself is written by a cancel (admin.py, sql.MARK_CANCEL);
a settle or a later claim of a marked job ends it (sql.RETRY,
outcomes.decided)."""

from __future__ import annotations

from ..core.job import QueuedJob
from . import sql
from .binding import Binding


async def marked(binding: Binding, job: QueuedJob) -> bool:
    """Whether a cancel marked `job`, which this worker holds: one query
    (sql.WATCH_CANCEL), one row read. False when the lease moved on (the row
    is no longer where this worker holds it): its settle will find it stale."""
    found = await binding.run(
        sql.WATCH_CANCEL, job.id, job.reservation, job.queue, job.reserved_until
    )
    return bool(found.rows) and found.rows[0]["cancel_at"] is not None
