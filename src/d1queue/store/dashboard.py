"""What the dashboard reads and does beyond the API's operations (service.py):
a queue's jobs page by page, failed jobs filtered, "run now", bulk retry or
delete, and the sessions signed out (session.py). Same layer as admin.py:
statements from sql.py, sent through the queue's binding, each page a
bounded number of round trips.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

from ..core.bounds import ID_RULE, PRIORITY_RANGE, SIGNOUT_PRUNE
from ..core.log import get
from ..core.shards import merge_pages
from . import sql
from . import stats as counters
from .admin import Admin
from .failed import FailedJob, encode_cursor
from .queue import D1Queue
from .shardset import ShardSet

STATES = ("ready", "delayed", "reserved")
PAGE = 50
"""Rows per page. Also the most jobs one bulk action takes: a retry is two
statements a job, so 50 fit one batch (one subrequest) with room to spare."""

_JOB_CURSOR = re.compile(r"(-?[0-9]{1,5}):([0-9]{1,15}):(" + ID_RULE + ")")

log = get(__name__)


@dataclass
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None


def claim_cursor(row: dict[str, Any]) -> str:
    """The cursor after a job's row, in claim order (_JOB_CURSOR)."""
    return f"{row['band']}:{row['available_at']}:{row['id']}"


def failed_cursor(row: dict[str, Any]) -> str:
    """The cursor after a failed job's row, newest first (admin.encode_cursor)."""
    return encode_cursor(row["failed_at"], row["id"])


def first_page(
    rows: list[dict[str, Any]], more: bool, cursor: Callable[[dict[str, Any]], str]
) -> Page:
    """The first PAGE of `rows` (in the list's order), with the cursor after
    its last row if there are more: one shape for a shard's page and for the
    pages of every shard merged."""
    rows = rows[:PAGE]
    return Page(rows, cursor(rows[-1]) if more and rows else None)


def merged(
    pages: list[Page],
    key: Callable[[dict[str, Any]], Any],
    cursor: Callable[[dict[str, Any]], str],
    reverse: bool = False,
) -> Page:
    """The shards' pages as one (shards.merge_pages), in the list's order;
    one shard's page as it is."""
    if len(pages) == 1:
        return pages[0]
    rows, more = merge_pages(
        [(p.rows, p.next_cursor is not None) for p in pages], key, PAGE, reverse
    )
    return first_page(rows, more, cursor)


def _claim_key(row: dict[str, Any]) -> tuple[int, int, str]:
    """Claim order: band (highest first), then time, then id."""
    return (-int(row["band"]), int(row["available_at"]), str(row["id"]))


def _failed_key(row: dict[str, Any]) -> tuple[int, str]:
    """Failed jobs' order, read reversed: newest first."""
    return (int(row["failed_at"]), str(row["id"]))


class FailedFilters(TypedDict, total=False):
    """ShardStore.failed's keywords, which Store.failed passes to each shard."""

    queue: str
    name: str
    error: str
    since_ms: int
    before_ms: int
    cursor: str | None


class ShardStore:
    """The dashboard's reads and writes on one D1 database."""

    def __init__(self, queue: D1Queue) -> None:
        self.queue = queue
        self.binding = queue.binding
        self.admin = Admin(queue)
        self.failed_jobs = self.admin.failed

    async def queue_jobs(
        self, queue: str, *, state: str = "", name: str = "", cursor: str | None = None
    ) -> Page:
        """A page of `queue`'s jobs in claim order, optionally one state and
        one job name. ValueError for a cursor not made by this function."""
        band, at, after = PRIORITY_RANGE[1] + 1, 0, ""
        if cursor:
            m = _JOB_CURSOR.fullmatch(cursor)
            if m is None:
                raise ValueError("the page cursor is not one this dashboard made")
            band, at, after = int(m.group(1)), int(m.group(2)), m.group(3)
        now = self.queue.clock()
        result = await self.binding.run(
            sql.LIST_QUEUE_JOBS, queue, band, at, after, name, state, now, PAGE + 1
        )
        rows = [dict(r) for r in result.rows]
        return first_page(rows, len(rows) > PAGE, claim_cursor)

    async def failed(self, **filters: Unpack[FailedFilters]) -> Page:
        """A page of failed jobs, newest first, filtered (FailedJobs.filtered).
        ValueError for a malformed cursor."""
        rows, more = await self.failed_jobs.filtered(PAGE, **filters)
        return first_page(rows, more, failed_cursor)

    async def run_now(self, id: str) -> Literal["done", "ready", "reserved", "missing"]:
        """Make a waiting job due now. One round trip: the update and the
        job's row as it is after it, in one batch."""
        now = self.queue.clock()
        *updated, found = await self.binding.batch(
            [*((run, (now, id)) for run in sql.RUN_NOW), (sql.SELECT_JOB, (id,))]
        )
        if any(u.changes for u in updated):
            return "done"
        if not found.rows:
            return "missing"
        return "reserved" if found.rows[0]["reserved_at"] is not None else "ready"

    async def retry_many(self, ids: list[str]) -> int:
        """FailedJobs.retry_many: one batch, each alone should it fail."""
        return await self.failed_jobs.retry_many(ids)

    async def delete_many(self, ids: list[str]) -> int:
        return await self.failed_jobs.delete_many(ids)

    async def failed_job(self, id: str) -> FailedJob | None:
        return await self.failed_jobs.get(id)

    async def signed_out(self, nonces: list[str]) -> set[str]:
        """Which of these session nonces were signed out: one query, a
        primary-key seek a nonce."""
        result = await self.binding.run(sql.SIGNED_OUT, json.dumps(nonces))
        return {str(r["nonce"]) for r in result.rows}

    async def sign_out(self, nonce: str, expires_ms: int, now_ms: int) -> None:
        """Record a session as signed out until it would have expired, and
        delete at most SIGNOUT_PRUNE expired sign-outs: one batch, safe to
        re-send (the insert ignores its own row, the delete finds nothing)."""
        await self.binding.batch(
            [
                (sql.SIGN_OUT, (nonce, expires_ms)),
                (sql.PRUNE_SIGNOUTS, (now_ms, SIGNOUT_PRUNE)),
            ]
        )


class Store:
    """What the dashboard reads and does, over every shard: pages merged in
    their order from each shard's page after the same cursor (a position in
    that order, not a shard's: one query per shard a page), actions by id
    sent to the id's shard, the per-minute counters added up."""

    def __init__(self, queue: D1Queue, shards: ShardSet | None = None) -> None:
        self.shards = shards or ShardSet.of(queue)
        self.queue = self.shards.home
        self.stores = [ShardStore(q) for q in self.shards.queues]

    def _for(self, id: str) -> ShardStore | None:
        queue = self.shards.for_id(id)
        return None if queue is None else self.stores[queue.shard]

    async def queue_jobs(
        self, queue: str, *, state: str = "", name: str = "", cursor: str | None = None
    ) -> Page:
        """A page of `queue`'s jobs in claim order (band, then time, then id),
        over every shard."""
        pages = await self.shards.each(
            lambda q: self.stores[q.shard].queue_jobs(queue, state=state, name=name, cursor=cursor)
        )
        return merged(pages, _claim_key, claim_cursor)

    async def failed(self, **filters: Unpack[FailedFilters]) -> Page:
        """A page of failed jobs over every shard, newest first (the filters
        are ShardStore.failed's)."""
        pages = await self.shards.each(lambda q: self.stores[q.shard].failed(**filters))
        return merged(pages, _failed_key, failed_cursor, reverse=True)

    async def run_now(self, id: str) -> Literal["done", "ready", "reserved", "missing"]:
        store = self._for(id)
        return "missing" if store is None else await store.run_now(id)

    def _by_shard(self, ids: list[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = defaultdict(list)
        for id in ids:
            queue = self.shards.for_id(id)
            if queue is not None:
                groups[queue.shard].append(id)
        return groups

    async def retry_many(self, ids: list[str]) -> int:
        """Each shard's failed jobs put back in one batch on that shard."""
        groups = self._by_shard(ids)
        return sum([await self.stores[k].retry_many(group) for k, group in groups.items()])

    async def delete_many(self, ids: list[str]) -> int:
        groups = self._by_shard(ids)
        return sum([await self.stores[k].delete_many(group) for k, group in groups.items()])

    async def failed_job(self, id: str) -> FailedJob | None:
        store = self._for(id)
        return None if store is None else await store.failed_job(id)

    # Sessions signed out live on the home shard (shard 0), whatever the
    # number of shards: one place to write at sign-out and to read per request.

    async def signed_out(self, nonces: list[str]) -> set[str]:
        return await self.stores[self.queue.shard].signed_out(nonces)

    async def sign_out(self, nonce: str, expires_ms: int, now_ms: int) -> None:
        await self.stores[self.queue.shard].sign_out(nonce, expires_ms, now_ms)

    async def counters(self, now_ms: int) -> tuple[list[counters.Minute], dict[str, counters.Done]]:
        """The per-minute counters, added up over shards (each drain records
        on its own shard)."""
        reads = await self.shards.each(lambda q: counters.read(q.binding, now_ms))
        minutes: dict[int, counters.Minute] = {}
        done: dict[str, counters.Done] = {}
        for chart, totals in reads:
            for m in chart:
                seen = minutes.setdefault(m.minute, counters.Minute(m.minute, 0, 0, 0))
                seen.completed += m.completed
                seen.retried += m.retried
                seen.failed += m.failed
            for queue, d in totals.items():
                t = done.setdefault(queue, counters.Done())
                t.hour += d.hour
                t.day += d.day
                t.failed_hour += d.failed_hour
                t.failed_day += d.failed_day
        return sorted(minutes.values(), key=lambda m: m.minute), done
