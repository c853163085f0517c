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
from typing import Any, TypeVar, Unpack

from ..core.job import QueuedJob, new_id
from ..core.registry import Overrides
from ..core.shards import Routing, mark_id, shard_of_id
from .binding import MAX_IN_FLIGHT, Result, Statement
from .queue import D1Queue

T = TypeVar("T")


class ShardError(ValueError):
    """A job cannot go where it was asked to (an id naming a shard this
    Worker does not have, a batch spanning shards)."""


class ShardQueue(D1Queue):
    """A D1Queue on shard `shard` of `shards`, routing pushes of other
    shards' jobs to them."""

    shard: int
    shards: ShardSet

    @classmethod
    def wrap(cls, queue: D1Queue, shard: int, shards: ShardSet) -> ShardQueue:
        """`queue` (its binding, lease, clock, registry) as shard `shard`."""
        twin = object.__new__(cls)
        twin.__dict__.update(queue.__dict__)
        twin.shard, twin.shards = shard, shards
        return twin

    def place(self, job: QueuedJob, partition: str | None = None) -> int:
        """Give `job` an id of the shard it routes to, unless it has one;
        returns the id's shard (ShardError if this Worker has no such shard)."""
        if not job.id:
            shard = self.shards.routing.shard_of(job.queue, partition)
            job.id = mark_id(new_id(self.clock()), shard)
        shard = shard_of_id(job.id)
        if shard >= len(self.shards):
            raise ShardError(
                f"job id {job.id!r} names shard {shard}; this Worker has "
                f"{len(self.shards)} (D1QUEUE_SHARDS)"
            )
        return shard

    def sibling(self, shard: int) -> ShardQueue:
        """Shard `shard`'s queue, counting into this queue's meter (a job's
        own budget when this is a handler's ctx.queue)."""
        if shard == self.shard:
            return self
        other = self.shards.queue(shard)
        meter = self.binding.meter
        if meter is not None and other.binding.meter is not meter:
            other = other.metered(meter)
        return other

    async def dispatch(
        self,
        name: str,
        payload: Any = None,
        *,
        partition: str | None = None,
        **overrides: Unpack[Overrides],
    ) -> str:
        """D1Queue.dispatch, to the shard the job's queue (or `partition`)
        routes to: a handler's follow-up job lands where its queue lives."""
        job = self.new_job(name, payload, **overrides)
        job.id = mark_id(job.id, self.shards.routing.shard_of(job.queue, partition))
        return await self.push(job)

    async def _push(self, job: QueuedJob, reads: Sequence[Statement]) -> tuple[str, list[Result]]:
        """Every push of one job lands on the shard its id names (an id is
        made for its queue's shard when it has none; an id without a marker
        is shard 0's)."""
        target = self.sibling(self.place(job))
        if target is not self:
            return await target._push(job, reads)
        return await super()._push(job, reads)

    async def _push_many(
        self, jobs: Sequence[QueuedJob], reads: Sequence[Statement]
    ) -> tuple[list[tuple[str, bool]], list[Result]]:
        """One transaction on one shard: every job must route to the same one."""
        shards = {self.place(job) for job in jobs}
        if len(shards) > 1:
            raise ShardError(
                "a batch push is one transaction on one D1 database, but its jobs route "
                f"to shards {sorted(shards)}: push them in separate batches"
            )
        target = self.sibling(shards.pop()) if shards else self
        if target is not self:
            return await target._push_many(jobs, reads)
        return await super()._push_many(jobs, reads)


class ShardSet:
    """A ShardQueue per shard, in shard order, and how jobs route to them."""

    def __init__(self, queues: Sequence[D1Queue], routing: Routing | None = None) -> None:
        if not queues:
            raise ValueError("a ShardSet needs at least one queue")
        self.routing = routing or Routing(len(queues))
        if self.routing.count != len(queues):
            raise ValueError(f"routing is for {self.routing.count} shards, given {len(queues)}")
        slots = queues[0].binding._slots
        for q in queues[1:]:
            q.binding._slots = slots  # six connections per invocation, all databases
        self.queues = [ShardQueue.wrap(q, i, self) for i, q in enumerate(queues)]

    @classmethod
    def of(cls, queue: D1Queue) -> ShardSet:
        """One shard: `queue` (what an unsharded deployment is)."""
        if isinstance(queue, ShardQueue):
            return queue.shards
        return cls([queue])

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


def shard_set(queues: Sequence[D1Queue] | D1Queue | ShardSet, routing: Any = None) -> ShardSet:
    """A ShardSet from whatever a caller holds."""
    if isinstance(queues, ShardSet):
        return queues
    if isinstance(queues, D1Queue):
        return ShardSet.of(queues)
    return ShardSet(queues, routing)


__all__ = ["ShardError", "ShardQueue", "ShardSet", "shard_set"]
