"""D1Queue: a job queue in a D1 database, one method per transition of a
job's life. Each is a few lines handing the queue's state (state.py) to
the module that does it:

    push         push.py        a job, many, a workflow batch, a chain
    claim        claim.py       the round: candidates, flow admission
                                (admission.py), the conditional UPDATEs
    settle       settle.py      outcomes, acknowledgements; a workflow's
                                ends (workflow_ends.py)
    inspection   inspection.py  sizes, a job by id, the drain's survey
    maintenance  maintenance.py clearing, lapsed leases, limits, retries

Optimistic claims by conditional UPDATE (no locks: D1 has none), with
what D1 makes worth having: claims in batches of one SELECT and one
`db.batch`, a fencing token on every lease, failing as one transaction,
and jobs that exhausted their attempts in a crash failed instead of re-run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from ..core.flow import Limits
from ..core.job import QueuedJob
from ..core.outcomes import Mark, Outcome
from ..core.registry import Overrides
from . import claim, inspection, maintenance, push, settle
from .failed import FailedJob
from .inspection import Survey
from .state import QueueState
from .workflows import Workflows


class D1Queue(QueueState):
    """A job queue in a D1 database (or anything shaped like a D1 binding):
    its state (QueueState: the binding, the lease `reservation_s`, the
    `clock`, the registry, the shards) and one method per transition."""

    # -- pushing: push.py ------------------------------------------------

    async def dispatch(
        self,
        name: str,
        payload: Any = None,
        *,
        partition: str | None = None,
        **overrides: Unpack[Overrides],
    ) -> str:
        """Queue job `name` with `payload`; returns the new job's id, or the id
        of the queued job already holding `unique_key`. `overrides` (queue,
        delay_s, max_attempts, priority, unique_key) win over the job's
        declared defaults: with a registry (given to the D1Queue, or by the
        drain to its handlers' `ctx.queue`), those it was registered with;
        without one, or for a name it does not know, the library's. With
        `shards`, the job lands on the shard its queue (or `partition`)
        routes to: a handler's follow-up job lands where its queue lives."""
        return await push.dispatch(self, name, payload, partition, **overrides)

    def new_job(self, name: str, payload: Any = None, **overrides: Unpack[Overrides]) -> QueuedJob:
        """The job `dispatch` pushes, made now: JobSpec.new of `name`'s spec
        (registry.spec_for)."""
        return push.new_job(self, name, payload, **overrides)

    async def push(self, job: QueuedJob) -> str:
        """Store `job`; returns its id, or, when its unique_key is already held
        by a queued job, that job's id and stores nothing."""
        job_id, _ = await push.push(self, job)
        return job_id

    async def push_many(self, jobs: Sequence[QueuedJob]) -> list[tuple[str, bool]]:
        """Store many jobs in one db.batch (one transaction: all or none);
        returns (id, deduplicated) per job, in order."""
        out, _ = await push.push_many(self, jobs)
        return out

    async def batch(
        self,
        jobs: Sequence[QueuedJob],
        *,
        on_success: QueuedJob | None = None,
        on_failure: QueuedJob | None = None,
        on_finish: QueuedJob | None = None,
    ) -> tuple[str, list[str]]:
        """Store `jobs` as one workflow batch, in one db.batch (all or none):
        returns the batch's id and the jobs' ids. Each callback given is
        enqueued once: `on_success` when every job completed, `on_failure`
        at the first that failed for good (or was cancelled), `on_finish`
        when every job ended either way (`queue.batch([...],
        on_success=queue.new_job("report", ...))`)."""
        callbacks = {"on_success": on_success, "on_failure": on_failure, "on_finish": on_finish}
        return await push.push_batch(self, jobs, callbacks.items())

    async def add_to_batch(self, batch_id: str, jobs: Sequence[QueuedJob]) -> list[str]:
        """Add `jobs` to batch `batch_id` while it runs; returns their ids.
        BatchNotRunning, and nothing written, for a batch that finished or
        does not exist."""
        return await push.add_to_batch(self, batch_id, jobs)

    async def chain(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """Push `jobs` to run one after another, each waiting for the one
        before it, in one db.batch; returns their ids."""
        return await push.chain(self, jobs)

    # -- claiming: claim.py ----------------------------------------------

    async def reserve(self, queue: str) -> QueuedJob | None:
        """Claim the next runnable job; None if the queue is empty or every
        candidate was taken. It reads one candidate (the head of each band)
        and reads again only after losing it to another worker, at most
        `max_claim_attempts` times: 5 rows read a job with its
        acknowledgement (tests/runtime/test_counts_runtime.py)."""
        return await claim.reserve(self, queue)

    async def reserve_batch(self, queue: str, n: int) -> list[QueuedJob]:
        """Claim up to `n` runnable jobs, at most `max_claim_attempts` rounds;
        jobs claimed with their attempts spent are failed, never returned."""
        return await claim.reserve_batch(self, queue, n)

    settle_and_claim = claim.settle_and_claim
    """A drain's round: settle its last round's outcomes and claim up to `n`
    jobs of a queue (or several queues' shares) in one or two round trips
    (claim.settle_and_claim, whose first argument is this queue)."""

    # -- settling: settle.py ---------------------------------------------

    async def settle(self, outcomes: Sequence[Outcome]) -> list[bool]:
        """Apply many outcomes in one db.batch (one transaction): for each,
        True if it was written, False if the lease had lapsed and the job
        moved on (nothing changed). Raises if D1 refuses the batch."""
        return await settle.settle(self, outcomes)

    async def settle_outcomes(
        self, outcomes: Sequence[Outcome], *, maybe_sent: bool = False
    ) -> list[Mark]:
        """Settle what a drain holds, whatever D1 does (one batch, else each
        outcome on its own); never raises for a D1 error."""
        return await settle.settle_outcomes(self, outcomes, maybe_sent=maybe_sent)

    async def complete(self, job: QueuedJob) -> bool:
        """The job is done: kept as history where its queue keeps it, else
        deleted (either releases its unique_key). False if the lease had
        lapsed and this worker no longer held the job."""
        (written,) = await settle.settle(self, [Outcome(job, "complete")])
        return written

    async def retry(self, job: QueuedJob, delay_s: float = 0, error: str | None = None) -> bool:
        """Put the job back, runnable after `delay_s`. False if stale."""
        retried = Outcome(job, "retry", delay_s=delay_s, error=error)
        (written,) = await settle.settle(self, [retried])
        return written

    async def fail(self, job: QueuedJob, error: str) -> bool:
        """Move the job to the failed table with `error`, in one transaction:
        never lost, never recorded twice. False if stale."""
        (written,) = await settle.settle(self, [Outcome(job, "fail", error=error)])
        return written

    # -- inspection: inspection.py ---------------------------------------

    async def size(self, queue: str) -> int:
        """Unreserved jobs on `queue`, delayed ones included."""
        return await inspection.size(self, queue)

    async def job(self, id: str) -> QueuedJob | None:
        """The queued job `id`, or None (acknowledged, failed or never queued)."""
        return await inspection.job(self, id)

    async def survey(self, *, every_queue: bool = False) -> Survey:
        """What a drain reads first, in one round trip: the paused queues,
        each queue's flow control and, if `every_queue`, every queue's name."""
        return await inspection.survey(self, every_queue=every_queue)

    async def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        """Failed jobs, newest first: the first page, at most `limit` of them
        and bounds.MAX_PAGE_BYTES of their payloads and errors."""
        return await inspection.failed_jobs(self, limit)

    @property
    def workflows(self) -> Workflows:
        """A workflow's reads (workflows.py): a batch's progress
        (`batch(id)`), the results of the jobs a job waited for
        (`results(ids)`), a job wherever it is in its life."""
        return Workflows(self.binding, self.clock)

    # -- maintenance: maintenance.py -------------------------------------

    async def clear(self, queue: str) -> int:
        """Delete every job on `queue`, reserved or not; returns how many."""
        return await maintenance.clear(self, queue)

    async def reclaim_expired(self) -> int:
        """Free every lease that lapsed; returns how many. Maintenance only:
        a claim takes over a lapsed lease when it meets one."""
        return await maintenance.reclaim_expired(self)

    async def set_limits(self, queue: str, limits: Limits) -> None:
        """Store `queue`'s flow limits, replacing any."""
        await maintenance.set_limits(self, queue, limits)

    async def retry_failed(self, id: str) -> bool:
        """Put failed job `id` back on its queue, keeping its attempts and
        last error, with its registration's max_attempts afresh; False if
        there is no such failed job."""
        return await maintenance.retry_failed(self, id)
