"""What every transition of a job reads and keeps: the binding, the clock,
the registry, the lease, the shard and its set, and the claim batches a
worker holds. D1Queue (queue.py) is this state with one method per
transition; the transitions themselves are push.py, claim.py, settle.py,
inspection.py and maintenance.py, each a set of functions of it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, Self

from ..core.job import QueuedJob, now_ms
from ..core.registry import Registry
from .binding import Binding


class Router(Protocol):
    """Where a push goes when a queue is one of several databases'
    (shardset.ShardSet, which alone decides): the queue of the shard the
    jobs route to, counting into `here`'s meter."""

    def route(
        self, here: QueueState, jobs: Sequence[QueuedJob], *, shard: int | None = None
    ) -> QueueState: ...

    def route_new(
        self, here: QueueState, job: QueuedJob, partition: str | None = None
    ) -> QueueState: ...


BatchKey = tuple[str, str, int]
"""A claim batch's jobs on one queue: (token, queue, lease end), the prefix
of their held key."""


def batch_key(job: QueuedJob) -> BatchKey:
    """Which claim batch's jobs on a queue `job` is one of (QueueState.batches)."""
    return (job.reservation or "", job.queue, job.reserved_until or 0)


class QueueState:
    """A job queue in a D1 database (or anything shaped like a D1 binding),
    as every transition sees it.

    `reservation_s` is how long a claim lasts before another worker's claim may
    take the job over: it must exceed the longest a handler runs, or a
    slow job could be run twice. `clock` returns epoch milliseconds (tests move
    time with it).
    """

    def __init__(
        self,
        db: Any,
        *,
        reservation_s: float = 90,
        max_claim_attempts: int = 5,
        clock: Callable[[], int] = now_ms,
        registry: Registry | None = None,
        keep_completed: bool = False,
        metrics: bool = False,
    ) -> None:
        if not reservation_s > 0:
            raise ValueError(f"reservation_s must be > 0, got {reservation_s!r}")
        if not isinstance(max_claim_attempts, int) or max_claim_attempts < 1:
            raise ValueError(
                f"max_claim_attempts must be an integer >= 1, got {max_claim_attempts!r}"
            )
        self.binding = db if isinstance(db, Binding) else Binding(db)
        self.reservation_s = reservation_s
        self.max_claim_attempts = max_claim_attempts
        self.clock = clock
        self.registry = registry
        """Whose job defaults `dispatch` applies (None: the built-in ones)."""
        self.keep_completed = keep_completed
        """Whether completed jobs are kept (with their results) as history,
        on the queues whose registry does not opt them out; False: deleted
        as they complete (D1QUEUE_KEEP_COMPLETED_S = 0)."""
        self.metrics = metrics
        """Whether settles and cancels count into the job metrics
        (store/metrics.py; D1QUEUE_METRICS): False sends nothing for them."""
        self.shard = 0
        """Which database this queue is, of its `shards`."""
        self.shards: Router | None = None
        """The databases this queue is one of (a ShardSet), which route each
        push to its shard; None: this database alone."""
        self.occupied: dict[str, set[int]] = {}
        """The flow places held per queue with a concurrency limit, as the
        last read of them found (sql.OCCUPIED_SLOTS): which a round may
        give its claims. Shared with this queue's metered twins."""
        self.traceparent: str | None = None
        """The W3C trace context the jobs pushed through this queue join when
        they name none: a handler's ctx.queue carries its job's (the drain
        sets it), so what a run pushes stays in the producer's trace."""
        self.batches: dict[BatchKey, int] = {}
        """Jobs won per claim batch and queue, by (token, queue, lease end),
        until a settle first carries any of them: one carrying all of them
        may acknowledge the completed ones in one statement
        (sql.DELETE_HELD_BATCH). Shared with this queue's metered twins."""

    def derive(self, **changes: Any) -> Self:
        """This queue with some of its attributes replaced (`binding`,
        `reservation_s`, `registry`; `binding=queue.binding.metered(meter)`:
        its D1 calls counted into a job's budget): the one way a queue is
        made from another. The class is kept (a shard's queue keeps
        routing), and so is what the twins share (the binding's usage, the
        claim batches)."""
        # Not copy.copy: its generic protocol is slow in Pyodide, and every
        # job of a drain gets a metered twin.
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.__dict__.update(changes)
        return twin
