"""Writes outside a job's life: clearing a queue, freeing lapsed leases,
setting a queue's flow limits, a wake-up's fan-out lease, queueing a
failed job again."""

from __future__ import annotations

from ..core.bounds import check_name, check_stored_name
from ..core.flow import Limits
from . import metrics, sql
from .failed import FailedJobs
from .state import QueueState


async def clear(q: QueueState, queue: str) -> int:
    """Delete every job on `queue`, reserved or not (its completed jobs
    stay until pruned; its workflow jobs end as failed for their waiters
    and batches); returns how many."""
    check_stored_name("queue", queue)
    # Counted as cancelled first (store/metrics.py), from the rows the
    # deletes then take. A workflow's jobs are marked ended first: a clear
    # fails them for their waiters and batches, in the same transaction.
    counted = [metrics.cleared(queue, q.clock())] if q.metrics else []
    *_, result = await q.binding.batch(
        [*counted, *((e, (queue,)) for e in sql.END_CLEARED), (sql.CLEAR_QUEUE, (queue,))]
    )
    return result.changes


async def reclaim_expired(q: QueueState) -> int:
    """Free every lease that lapsed (its worker died or overran); returns
    how many. Maintenance only, as it reads every job: the drain never
    needs it, since a claim takes over a lapsed lease when it meets one."""
    result = await q.binding.run(sql.RECLAIM_EXPIRED, q.clock())
    return result.changes


async def set_limits(q: QueueState, queue: str, limits: Limits) -> None:
    """Store `queue`'s flow limits, replacing any: they hold from the next
    claim batch of every drain, on a queue with no jobs yet too. One row
    written; sending it again writes the same."""
    check_name("queue", queue)
    await q.binding.run(sql.SET_LIMITS, queue, q.clock(), limits.to_json())


async def take_fan_out(q: QueueState, queue: str, window_s: float) -> bool:
    """Whether this caller may fan out on `queue` now: True for the one
    that takes the lease, if no fan-out took it in the last `window_s`
    (one query; a row written only when taken)."""
    now = q.clock()
    result = await q.binding.run(
        sql.TAKE_FAN_OUT, check_stored_name("queue", queue), now, now - int(window_s * 1000)
    )
    return result.changes == 1


async def retry_failed(q: QueueState, id: str) -> bool:
    """Put failed job `id` back on its queue, keeping its attempts and
    last error, with its registration's max_attempts afresh; False if
    there is no such failed job (failed.py)."""
    return await FailedJobs(q.binding, q.clock, q.registry).retry(id)
