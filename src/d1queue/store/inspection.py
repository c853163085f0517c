"""What a queue holds, read without changing it: how many jobs wait, a job
by id, the survey a drain starts with, how many are due (a wake-up's
fan-out), the newest failures."""

from __future__ import annotations

from typing import NamedTuple

from ..core.bounds import check_stored_name
from ..core.flow import Flow, flows_of
from ..core.job import QueuedJob
from . import sql
from .failed import FailedJob, FailedJobs
from .rows import row_to_job
from .state import QueueState


class Survey(NamedTuple):
    """What a drain reads first (`survey`)."""

    paused: set[str]
    """The paused queues."""
    names: list[str]
    """With `every_queue`, every queue holding jobs, by name (else none)."""
    flows: dict[str, Flow]
    """Each queue's flow control (flow.flows_of: its stored limits, else
    those its registry declares, and whether it has groups)."""


async def survey(q: QueueState, *, every_queue: bool = False) -> Survey:
    """The paused queues, each queue's flow control and, if `every_queue`,
    the names of every queue holding jobs (found by a walk of the key:
    about two rows read per queue, whatever it holds), in one round trip."""
    if not every_queue:
        queues = await q.binding.run(sql.QUEUE_FLOWS)
        found: list[str] = []
    else:
        queues, names = await q.binding.batch([(sql.QUEUE_FLOWS, ()), (sql.QUEUE_NAMES, ())])
        found = [str(r["name"]) for r in names.rows]
    paused = {str(r["name"]) for r in queues.rows if r["paused"]}
    declared = q.registry.limits() if q.registry is not None else {}
    rows = [(str(r["name"]), r["limits"], bool(r["grouped"])) for r in queues.rows]
    return Survey(paused, found, flows_of(rows, declared))


async def size(q: QueueState, queue: str) -> int:
    """Unreserved jobs on `queue`, delayed ones included."""
    result = await q.binding.run(sql.COUNT_UNRESERVED, check_stored_name("queue", queue))
    return int(result.rows[0]["n"])


async def due(q: QueueState, queue: str, cap: int) -> int:
    """Jobs on `queue` a claim could take now, counted up to about `cap`
    (one query reading about as many rows): how many more consumers a
    wake-up should bring in (features/wake.py), not an exact figure."""
    result = await q.binding.run(
        sql.COUNT_DUE_CAPPED, check_stored_name("queue", queue), q.clock(), max(1, int(cap))
    )
    return min(int(result.rows[0]["n"]), int(cap))


async def job(q: QueueState, id: str) -> QueuedJob | None:
    """The queued job `id`, or None (acknowledged, failed or never queued)."""
    result = await q.binding.run(sql.SELECT_JOB, id)
    return row_to_job(result.rows[0]) if result.rows else None


async def failed_jobs(q: QueueState, limit: int = 50) -> list[FailedJob]:
    """Failed jobs, newest first (failed.py): the first page, at most
    `limit` of them and bounds.MAX_PAGE_BYTES of their payloads and
    errors."""
    jobs, _ = await FailedJobs(q.binding, q.clock).page(None, max(0, int(limit)))
    return jobs
