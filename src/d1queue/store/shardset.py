"""The D1 side of shards: one D1Queue per shard, and pushes routed to theirs.

`ShardSet` holds a queue per D1 binding of D1QUEUE_SHARDS (shard i is the
i-th). Each is a `ShardQueue`: a D1Queue that knows its shard and sends a
job meant for another shard there. So a handler's `ctx.queue.dispatch`
during a drain of shard 1 of a job whose queue lives on shard 2 lands on
shard 2, with an id saying so, and every push path (the API, RPC, handlers,
schedules) routes the same way: by the job's id when it has one, else by
its queue (shards.Routing).

The shards' bindings share one set of in-flight slots: the platform's six
connections per invocation hold across databases.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..core.job import QueuedJob, new_id, now_ms
from ..core.shards import Routing, mark_id, shard_of_id
from .binding import MAX_IN_FLIGHT
from .queue import D1Queue
from .state import QueueState

T = TypeVar("T")


class ShardError(ValueError):
    """A job cannot go where it was asked to (an id naming a shard this
    Worker does not have, a batch spanning shards)."""


class ShardSet:
    """A queue per shard, in shard order, and how jobs route to them: each
    queue knows its `shard` and holds this set as its `shards` (D1Queue
    consults it on every push), so a push from any shard's queue lands on
    the job's own shard."""

    def __init__(self, queues: Sequence[D1Queue], routing: Routing | None = None) -> None:
        if not queues:
            raise ValueError("a ShardSet needs at least one queue")
        self.routing = routing or Routing(len(queues))
        if self.routing.count != len(queues):
            raise ValueError(f"routing is for {self.routing.count} shards, given {len(queues)}")
        slots = queues[0].binding._slots
        for q in queues[1:]:
            q.binding._slots = slots  # six connections per invocation, all databases
        self.queues = [q.derive(shard=i, shards=self) for i, q in enumerate(queues)]

    @classmethod
    def of(cls, queue: D1Queue) -> ShardSet:
        """The set `queue` belongs to; or one shard, `queue` alone (what an
        unsharded deployment is)."""
        if isinstance(queue.shards, ShardSet):
            return queue.shards
        return cls([queue])

    def place(
        self,
        job: QueuedJob,
        partition: str | None = None,
        clock: Callable[[], int] = now_ms,
        shard: int | None = None,
    ) -> int:
        """Give `job` an id of the shard it routes to, unless it has one
        (`shard`, else its queue's or `partition`'s); returns the id's shard
        (ShardError if this Worker has no such shard)."""
        if not job.id:
            at = self.routing.shard_of(job.queue, partition) if shard is None else shard
            job.id = mark_id(new_id(clock()), at)
        return self._checked(shard_of_id(job.id), job.id)

    def place_new(self, job: QueuedJob, partition: str | None = None) -> int:
        """Mark the id of a job just made (JobSpec.new) for the shard its
        queue (or `partition`) routes to; returns that shard."""
        job.id = mark_id(job.id, self.routing.shard_of(job.queue, partition))
        return self._checked(shard_of_id(job.id), job.id)

    def _checked(self, shard: int, id: str) -> int:
        if shard >= len(self.queues):
            raise ShardError(
                f"job id {id!r} names shard {shard}; this Worker has "
                f"{len(self.queues)} (D1QUEUE_SHARDS)"
            )
        return shard

    def sibling(self, here: QueueState, shard: int) -> D1Queue:
        """Shard `shard`'s queue, counting into `here`'s meter (a job's own
        budget when `here` is a handler's ctx.queue)."""
        other = self.queues[shard]
        if shard == here.shard and isinstance(here, D1Queue):
            return here
        meter = here.binding.meter
        if meter is not None and other.binding.meter is not meter:
            other = other.derive(binding=other.binding.metered(meter))
        return other

    def route(
        self, here: QueueState, jobs: Sequence[QueuedJob], *, shard: int | None = None
    ) -> D1Queue:
        """The one queue `jobs` go to from `here`: each one's id's shard, or,
        without an id, `shard`'s or its queue's (`place`). A push is one
        transaction on one database: ShardError if they route to several."""
        shards = {self.place(job, clock=here.clock, shard=shard) for job in jobs}
        if len(shards) > 1:
            raise ShardError(
                "a batch push is one transaction on one D1 database, but its jobs route "
                f"to shards {sorted(shards)}: push them in separate batches"
            )
        return self.sibling(here, shards.pop() if shards else here.shard)

    def route_new(self, here: QueueState, job: QueuedJob, partition: str | None = None) -> D1Queue:
        """The queue a job just made goes to: its queue's shard (or
        `partition`'s), its id marked so."""
        return self.sibling(here, self.place_new(job, partition))

    def __len__(self) -> int:
        return len(self.queues)

    @property
    def home(self) -> ShardQueue:
        """Shard 0: where a one-database deployment's jobs always were."""
        return self.queues[0]

    def queue(self, shard: int) -> ShardQueue:
        return self.queues[shard]

    def for_id(self, id: str) -> ShardQueue | None:
        """The shard holding job `id` (None: an id of a shard not configured)."""
        shard = shard_of_id(id)
        return self.queues[shard] if shard < len(self.queues) else None

    async def each(self, call: Callable[[ShardQueue], Awaitable[T]]) -> list[T]:
        """`call` on every shard, at most MAX_IN_FLIGHT at once, results in
        shard order. One shard: just the call."""
        if len(self.queues) == 1:
            return [await call(self.queues[0])]
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def one(q: ShardQueue) -> T:
            async with gate:
                return await call(q)

        return list(await asyncio.gather(*(one(q) for q in self.queues)))


ShardQueue = D1Queue
"""A shard's queue is a D1Queue whose `shards` is set: the earlier name of
its class, kept."""


def shard_set(queues: Sequence[D1Queue] | D1Queue | ShardSet, routing: Any = None) -> ShardSet:
    """A ShardSet from whatever a caller holds."""
    if isinstance(queues, ShardSet):
        return queues
    if isinstance(queues, D1Queue):
        return ShardSet.of(queues)
    return ShardSet(queues, routing)


__all__ = ["ShardError", "ShardQueue", "ShardSet", "shard_set"]
