"""Operating a sharded queue as one: what admin.py and the schedules' API do
on one database, over every shard (shardset.py).

- By id (a job, a failed job): straight to the shard the id names, one
  query as before; an id naming a shard this Worker lacks is not found.
- Stats: every shard's in one round trip each (at most six in flight),
  added up per queue.
- Lists (failed jobs, schedules): each shard's page after the same keyset
  cursor, merged in the list's order. The cursor is a position in that
  order, `(failed_at, id)` or a schedule id, not a shard's: a page costs one
  query per shard and the next page starts where this one ended, on every
  shard at once.
- Pausing a queue writes every shard (idempotent): a queue may hold jobs on
  several (partition keys, shards added later), and a drain reads only its
  own shard's states.

With one shard every call is the one admin.py or schedules.py makes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from ..core.bounds import page_bytes
from ..core.flow import Limits
from ..core.job import QueuedJob
from ..core.registry import Registry, spec_for
from ..core.shards import mark_id, merge_pages
from .admin import Admin, QueueStats
from .failed import FailedJob, decode_cursor, encode_cursor
from .flow import BUSIEST_GROUPS, QueueLimits
from .schedules import Schedule, ScheduleDef, Schedules
from .shardset import ShardQueue, ShardSet

T = TypeVar("T")


def merge_stats(per_shard: list[list[QueueStats]]) -> list[QueueStats]:
    """Each queue's counts added over shards; its oldest ready job the oldest
    anywhere; paused if any shard says so (a pause that reached only some)."""
    merged: dict[str, QueueStats] = {}
    for stats in per_shard:
        for s in stats:
            m = merged.get(s.queue)
            if m is None:
                merged[s.queue] = QueueStats(**s.__dict__)
                continue
            m.ready += s.ready
            m.delayed += s.delayed
            m.reserved += s.reserved
            m.waiting += s.waiting
            m.failed += s.failed
            m.paused = m.paused or s.paused
            m.limits = m.limits or s.limits
            ages = [a for a in (m.oldest_ready_age_s, s.oldest_ready_age_s) if a is not None]
            m.oldest_ready_age_s = max(ages) if ages else None
    return sorted(merged.values(), key=lambda s: s.queue)


class ShardedAdmin:
    """Admin's operations over every shard (same names, same answers)."""

    def __init__(self, shards: ShardSet) -> None:
        self.shards = shards
        self.admins = [Admin(q) for q in shards.queues]

    async def _each(self, call: Callable[[Admin], Awaitable[T]]) -> list[T]:
        return await self.shards.each(lambda q: call(self.admins[q.shard]))

    def _by_id(self, id: str) -> Admin | None:
        queue = self.shards.for_id(id)
        return None if queue is None else self.admins[queue.shard]

    async def stats(self, name: str | None = None) -> list[QueueStats]:
        per_shard = await self._each(lambda a: a.stats(name))
        return merge_stats(per_shard)

    async def set_paused(self, name: str, paused: bool) -> None:
        await self._each(lambda a: a.set_paused(name, paused))

    async def cancel(self, id: str) -> Literal["cancelled", "cancelling", "missing"]:
        admin = self._by_id(id)
        return "missing" if admin is None else await admin.cancel(id)

    async def find(self, id: str) -> QueuedJob | FailedJob | None:
        admin = self._by_id(id)
        return None if admin is None else await admin.find(id)

    async def failed_page(
        self, queue: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[FailedJob], str | None]:
        """Newest first over every shard: each shard's page after `cursor`,
        merged by (failed_at, id) descending."""
        if cursor is not None:
            decode_cursor(cursor)  # ValueError before any query
        share = page_bytes(len(self.shards))
        pages = await self._each(lambda a: a.failed_page(queue, limit, cursor, share))
        jobs, more = merge_pages(_has_more(pages), _failed_key, limit, reverse=True)
        return jobs, (encode_cursor(jobs[-1].failed_at, jobs[-1].id) if more and jobs else None)

    async def delete_failed(self, id: str) -> bool:
        admin = self._by_id(id)
        return admin is not None and await admin.delete_failed(id)

    async def prune_failed(self, older_than_s: float) -> int:
        return sum(await self._each(lambda a: a.prune_failed(older_than_s)))

    async def set_limits(self, name: str, limits: Limits) -> None:
        """On every shard: each database enforces them over its own claims
        (docs/flow-control.md, "Shards")."""
        await self._each(lambda a: a.set_limits(name, limits))

    async def limits(self, name: str) -> QueueLimits:
        """The queue's limits (its home shard's, which every shard is given)
        and its jobs held now on every shard, added up."""
        per_shard = await self._each(lambda a: a.limits(name))
        out = per_shard[0]
        by_group: Counter[str] = Counter()
        for shard in per_shard:
            by_group.update(shard.running_by_group)
        out.running = sum(shard.running for shard in per_shard)
        out.running_by_group = dict(by_group.most_common(BUSIEST_GROUPS))
        return out

    async def clear(self, queue: str) -> int:
        """Delete every job on `queue`, on every shard; how many."""
        return sum(await self.shards.each(lambda q: q.clear(queue)))

    async def retry_failed(self, id: str) -> bool:
        queue = self.shards.for_id(id)
        return queue is not None and await queue.retry_failed(id)


def _failed_key(job: FailedJob) -> tuple[int, str]:
    return (job.failed_at, job.id)


def _schedule_key(schedule: Schedule) -> str:
    return schedule.id


def _has_more(pages: list[tuple[list[T], str | None]]) -> list[tuple[list[T], bool]]:
    """Each shard's (rows, next cursor) as merge_pages reads it."""
    return [(rows, nxt is not None) for rows, nxt in pages]


class ShardedSchedules:
    """The schedules' API over shards. A schedule lives on the shard its
    queue maps to (its job's registered queue when it names none), so the
    cron's compare-and-set and the slot's job insert stay one batch on one
    database, and its jobs land where the queue's other jobs are. Reads by
    id ask every shard (one query each): schedule ids carry no shard, as
    callers choose them."""

    def __init__(self, shards: ShardSet, registry: Registry) -> None:
        self.shards, self.registry = shards, registry
        self.stores = [schedules_on(q, registry) for q in shards.queues]

    def shard_of(self, d: ScheduleDef) -> int:
        return self.shards.routing.shard_of(schedule_queue(self.registry, d))

    async def _each(self, call: Callable[[Schedules], Awaitable[T]]) -> list[T]:
        return await self.shards.each(lambda q: call(self.stores[q.shard]))

    async def put(self, d: ScheduleDef) -> tuple[bool, Schedule | None]:
        """Create or replace `d` on its shard, and delete an API schedule of
        the same id on any other (its queue moved): one query per shard."""
        home = self.shard_of(d)
        created, row = await self.stores[home].put(d)
        if len(self.shards) == 1 or (row is not None and row.source == "code"):
            return created, row
        others = [s for i, s in enumerate(self.stores) if i != home]
        moved = [await s.delete(d.id) for s in others]
        return created and "deleted" not in moved, row

    async def get(self, id: str) -> Schedule | None:
        return next((r for r in await self._each(lambda s: s.get(id)) if r is not None), None)

    async def page(self, limit: int, cursor: str | None) -> tuple[list[Schedule], str | None]:
        """Schedules by id over every shard, `limit` at a time after `cursor`."""
        share = page_bytes(len(self.shards))
        pages = await self._each(lambda s: s.page(limit, cursor, share))
        rows, more = merge_pages(_has_more(pages), _schedule_key, limit)
        return rows, (rows[-1].id if more and rows else None)

    async def located(self, id: str) -> tuple[int, Schedule] | None:
        """Schedule `id` and the shard holding it (one query per shard)."""
        rows = await self._each(lambda s: s.get(id))
        return next(((k, r) for k, r in enumerate(rows) if r is not None), None)

    async def runs(self, ids: list[str]) -> dict[str, list[list[Any]]]:
        """The last runs of each of `ids` (Schedules.runs), over every shard."""
        out: dict[str, list[list[Any]]] = {}
        for found in await self._each(lambda s: s.runs(ids)):
            out.update(found)
        return out

    async def run_now(self, shard: int, row: Schedule, nonce: str) -> tuple[str, bool, str]:
        """Schedule `row` (on `shard`) pushed once now (Schedules.run_now),
        its job's id `nonce` (a job.new_id) marked as the shard's: (job id,
        pushed by this call, queue)."""
        job_id = mark_id(nonce, shard)
        pushed, queue = await self.stores[shard].run_now(row, job_id)
        return job_id, pushed, queue

    async def delete(self, id: str) -> Literal["deleted", "missing", "code"]:
        outcomes = await self._each(lambda s: s.delete(id))
        for outcome in ("code", "deleted"):
            if outcome in outcomes:
                return outcome
        return "missing"

    async def set_paused(self, id: str, paused: bool) -> Schedule | None:
        rows = await self._each(lambda s: s.set_paused(id, paused))
        return next((r for r in rows if r is not None), None)


def schedule_queue(registry: Registry, d: ScheduleDef) -> str:
    """The queue schedule `d`'s jobs go to: its own, else its job's."""
    return spec_for(registry, d.name).stored(queue=d.queue).queue


def schedules_on(queue: ShardQueue, registry: Registry) -> Schedules:
    """The schedules stored on `queue`'s shard: the code-declared ones whose
    queue maps there are synced there, and slot jobs get ids of the shard."""
    routing = ShardSet.of(queue).routing

    def here(d: ScheduleDef) -> bool:
        return routing.shard_of(schedule_queue(registry, d)) == queue.shard

    return Schedules(queue, registry, shard=queue.shard, declared=here)


__all__ = ["ShardedAdmin", "ShardedSchedules", "merge_stats", "schedules_on"]
