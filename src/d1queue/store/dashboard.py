"""What the dashboard reads and does beyond the API's operations (service.py):
a queue's jobs page by page, failed jobs filtered, "run now", the sessions
signed out (session.py), and the workflow views: a job
wherever it is in its life with its dependencies and dependents, a queue's
completed jobs, a batch's progress (workflows.py), the batches index, the
search, capped in rows read (`search`), which the bulk actions (bulk.py)
act on, and the jobs running now across queues, capped the same way
(`running`). Same layer as admin.py:
statements from sql.py, sent through the queue's binding, each page a
bounded number of round trips.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

from ..core.bounds import (
    MAX_PAGE_BYTES,
    PRIORITY_RANGE,
    RUNNING_ROWS,
    SEARCH_ROWS,
    SIGNOUT_PRUNE,
    STORED_ID_RULE,
    STORED_NAME_RULE,
    page_bytes,
)
from ..core.log import get
from ..core.shards import mark_id, merge_pages
from . import sql
from . import stats as counters
from .admin import Admin
from .failed import FailedJob, encode_cursor
from .queue import D1Queue
from .shardset import ShardSet
from .workflows import COMPLETED_CURSOR_RULE, BatchState, JobView, Workflows

STATES = ("waiting", "ready", "delayed", "reserved", "cancelling")

SEARCH_SOURCES = {
    "live": (sql.SEARCH_LIVE, sql.SEARCH_LIVE_SPAN),
    "completed": (sql.SEARCH_COMPLETED, sql.SEARCH_COMPLETED_SPAN),
    "failed": (sql.SEARCH_FAILED, sql.SEARCH_FAILED_SPAN),
}
"""Where a search reads (one a page): queued jobs (but those held by a
worker or waiting out a retry), completed jobs kept, failed jobs."""

FIRST = "~"
"""The search's cursor before its first page: sorts after every id."""


class SearchFilters(TypedDict, total=False):
    queue: str
    name: str
    state: str
    group: str
    batch: str
    text: str


@dataclass
class SearchPage:
    """A page of a search: its matches (newest id first), the cursor of the
    next page (None: nothing is left to read), how many rows it read, and
    whether it stopped at its cap of rows read with rows left to read."""

    rows: list[dict[str, Any]]
    next_cursor: str | None
    scanned: int
    stopped_early: bool


def _search_part(
    hits: list[dict[str, Any]], span: dict[str, Any], cap: int
) -> tuple[list[dict[str, Any]], str | None, int, bool]:
    """One shard's answer: its matches, where its read may resume (the
    PAGE-th match when it has more, else the last row read when it read
    its cap; None when it read to the end), rows read, stopped at the cap."""
    scanned = int(span["scanned"] or 0)
    if len(hits) > PAGE:
        return hits[:PAGE], str(hits[PAGE - 1]["id"]), scanned, False
    if scanned >= cap:
        return hits, str(span["last"]), scanned, True
    return hits, None, scanned, False


RunningKey = tuple[str, int, str]
"""A running job's place in the locked band's order: (queue, lease end, id)."""

RUNNING_START: RunningKey = ("", 0, "")
"""The cursor before the first page of running jobs: before every queue."""

_RUNNING_CURSOR = re.compile("(" + STORED_NAME_RULE + r")~([0-9]{1,16})~(" + STORED_ID_RULE + ")")


def running_cursor(key: RunningKey) -> str:
    """A running-jobs page's cursor as a URL carries it: `queue~lease end~id`
    (`~` is in no name or id)."""
    return f"{key[0]}~{key[1]}~{key[2]}"


def read_running_cursor(text: str) -> RunningKey:
    """The key a cursor names; ValueError for text running_cursor did not make."""
    m = _RUNNING_CURSOR.fullmatch(text)
    if m is None:
        raise ValueError("the page cursor is not one this dashboard made")
    return (m.group(1), int(m.group(2)), m.group(3))


def _running_key(row: dict[str, Any]) -> RunningKey:
    return (str(row["queue"]), int(row["available_at"]), str(row["id"]))


@dataclass
class RunningPage:
    """A page of the jobs running now (held by a worker, or marked
    cancelling), in (queue, lease end, id) order: the cursor of the next
    page (None: the band was read to its end), how many rows of the locked
    band it read, and whether it stopped at its cap with rows left."""

    rows: list[dict[str, Any]]
    next_cursor: str | None
    scanned: int
    stopped_early: bool


PAGE = 50
"""Rows per page. Also the most jobs one bulk action takes: a retry is two
statements a job, so 50 fit one batch (one subrequest) with room to spare."""

_JOB_CURSOR = re.compile(r"(-?[0-9]{1,5}):([0-9]{1,15}):(" + STORED_ID_RULE + ")")
_COMPLETED_CURSOR = re.compile(COMPLETED_CURSOR_RULE)

LINKS = 100
"""A job page's dependents listed (its `after` is at most bounds.MAX_AFTER)."""
BATCH_PAGE = sql.STATES_CHUNK
"""A batch's jobs listed a page, each with its state: one JOB_STATES."""
CALLBACKS = (("on_success", 1), ("on_failure", 2), ("on_finish", 4))
"""A batch's callbacks, and the bit of d1queue_batches.fired saying it was
enqueued; the callback job's id is `<batch>:<kind>`."""

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


def completed_cursor(row: dict[str, Any]) -> str:
    """The cursor after a completed job's row, newest first (Workflows.completed)."""
    return f"{row['completed_at']}:{row['id']}"


def _completed_key(row: dict[str, Any]) -> tuple[int, str]:
    """Completed jobs' order, read reversed: newest first."""
    return (int(row["completed_at"]), str(row["id"]))


def job_fields(view: JobView) -> dict[str, Any]:
    """A live or completed job as the dashboard shows it: every field its
    page shows; a list of completed jobs shows some (COMPLETED_FIELDS)."""
    job = view.job
    return {
        "id": job.id,
        "queue": job.queue,
        "name": job.name,
        "group": job.group,
        "state": view.state,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "created_at": job.created_at,
        "available_at": job.available_at,
        "reserved_until": job.reserved_until if view.state == "reserved" else None,
        "unique_key": job.unique_key,
        "last_error": job.last_error,
        "payload": job.payload,
        "completed_at": view.completed_at,
        "result": view.result,
        "after": list(job.after or []),
        "ignore_failed": view.ignore_failed,
        "batch": job.batch,
        "runs": view.runs,
        "progress": view.progress,
        "started_at": view.started_at,
        "traceparent": job.traceparent,
    }


COMPLETED_FIELDS = ("id", "name", "attempts", "max_attempts", "completed_at", "result", "batch")
"""What a list of completed jobs shows of each."""


def _completed_row(view: JobView) -> dict[str, Any]:
    fields = job_fields(view)
    return {k: fields[k] for k in COMPLETED_FIELDS}


@dataclass
class Links:
    """A job's place in its workflow: the state of each job it waits for
    (`after`) and of each job waiting for it, as far as they are kept (an id
    missing from `states` is gone: cancelled, pruned, never inserted)."""

    dependents: list[str]
    more_dependents: bool
    states: dict[str, str]


@dataclass
class BatchPage:
    """A batch's progress, one page of its jobs' ids with their states, and
    its callbacks: (kind, job id, enqueued yet)."""

    batch: BatchState
    page: int
    pages: int
    ids: list[str]
    callbacks: list[tuple[str, str, bool]]
    states: dict[str, str]


def batch_row(r: Any) -> dict[str, Any]:
    """A row of the batches index: BatchState's counters and state, and
    each callback it was given with whether it was enqueued (fired's bit)."""
    batch = BatchState.of(r)
    fired = int(r["fired"])
    return {
        **batch.as_dict(),
        "callbacks": [(kind, bool(fired & bit)) for kind, bit in CALLBACKS if r[f"has_{kind}"]],
    }


def batch_cursor(row: dict[str, Any]) -> str:
    """The cursor after a batch of the index: its id without the shard's
    mark (a job.new_id, in creation order on every shard)."""
    return _BATCH_ID.sub("", str(row["id"]))


def _batch_key(row: dict[str, Any]) -> str:
    """The batches index's order, read reversed: newest first."""
    return batch_cursor(row)


_BATCH_ID = re.compile(r"^s[0-9]+-")
BATCH_CURSOR = re.compile(r"[0-9a-f]{32}")
"""A batches index cursor: a job.new_id (a batch id, unmarked)."""


def _states(rows: list[Any]) -> dict[str, str]:
    """JOB_STATES' rows by id; a live row wins over a completed one of the
    same id (an id pushed again after its job completed)."""
    out: dict[str, str] = {}
    for r in rows:
        out.setdefault(str(r["id"]), str(r["state"]))
    return out


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
    """The dashboard's reads and writes on one D1 database. `page_bytes`:
    the most stored bytes (payloads, results, errors) one of its pages
    carries, its share of bounds.MAX_PAGE_BYTES."""

    def __init__(self, queue: D1Queue, page_bytes: int = MAX_PAGE_BYTES) -> None:
        self.queue = queue
        self.page_bytes = page_bytes
        self.binding = queue.binding
        self.admin = Admin(queue)
        self.failed_jobs = self.admin.failed
        self.workflows = Workflows(self.binding, queue.clock)

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
            sql.LIST_QUEUE_JOBS, queue, band, at, after, name, state, now, PAGE + 1, self.page_bytes
        )
        rows, more = sql.bounded_page([dict(r) for r in result.rows])
        return first_page(rows, more, claim_cursor)

    async def failed(self, **filters: Unpack[FailedFilters]) -> Page:
        """A page of failed jobs, newest first, filtered (FailedJobs.filtered).
        ValueError for a malformed cursor."""
        rows, more = await self.failed_jobs.filtered(PAGE, **filters, max_bytes=self.page_bytes)
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

    async def failed_job(self, id: str) -> FailedJob | None:
        return await self.failed_jobs.get(id)

    async def job(self, id: str) -> JobView | FailedJob | None:
        """Workflows.job: live, completed and kept, or failed."""
        return await self.workflows.job(id)

    async def completed(self, queue: str, cursor: str | None = None) -> Page:
        """A page of `queue`'s completed jobs kept, newest first (one query).
        ValueError for a cursor not of COMPLETED_CURSOR_RULE's shape."""
        if cursor and not _COMPLETED_CURSOR.fullmatch(cursor):
            raise ValueError("the page cursor is not one this dashboard made")
        views, nxt = await self.workflows.completed(queue, PAGE, cursor, self.page_bytes)
        return first_page([_completed_row(v) for v in views], nxt is not None, completed_cursor)

    async def links(self, id: str, after: list[str]) -> Links:
        """Job `id`'s dependents (at most LINKS) and the states of those and
        of `after`: one round trip (sql.DEPENDENT_STATES, JOB_STATES)."""
        now = self.queue.clock()
        statements: list[tuple[str, tuple[Any, ...]]] = [
            (sql.DEPENDENTS, (id, LINKS + 1)),
            (sql.DEPENDENT_STATES, (id, now, LINKS)),
        ]
        for i in range(0, len(after), sql.STATES_CHUNK):
            chunk = json.dumps(after[i : i + sql.STATES_CHUNK])
            statements.append((sql.JOB_STATES, (chunk, now)))
        found, *states = await self.binding.batch(statements)
        waiters = [str(r["waiter"]) for r in found.rows]
        return Links(
            waiters[:LINKS], len(waiters) > LINKS, _states([r for s in states for r in s.rows])
        )

    async def batch(self, id: str, page: int = 1) -> BatchPage | None:
        """Batch `id`'s progress, its jobs' ids of page `page` (from 1, of
        BATCH_PAGE) and its callbacks, with their states: two round trips
        (the batch, then the states). None: no such batch. ValueError for a
        page past the last."""
        found = await self.binding.run(sql.SELECT_BATCH_VIEW, id)
        if not found.rows:
            return None
        r = found.rows[0]
        batch = BatchState.of(r)
        ids = batch.ids
        pages = max(1, -(-len(ids) // BATCH_PAGE))
        if not 1 <= page <= pages:
            raise ValueError(f"the batch's jobs fill {pages} page(s); there is no page {page}")
        shown = ids[(page - 1) * BATCH_PAGE : page * BATCH_PAGE]
        fired = int(r["fired"])
        callbacks = [
            (kind, f"{batch.id}:{kind}", bool(fired & bit))
            for kind, bit in CALLBACKS
            if r[f"has_{kind}"]
        ]
        now = self.queue.clock()
        statements: list[tuple[str, tuple[Any, ...]]] = []
        if shown:
            statements.append((sql.JOB_STATES, (json.dumps(shown), now)))
        if callbacks:
            statements.append((sql.JOB_STATES, (json.dumps([c[1] for c in callbacks]), now)))
        results = await self.binding.batch(statements) if statements else []
        states = _states([row for res in results for row in res.rows])
        return BatchPage(batch, page, pages, shown, callbacks, states)

    async def batches(self, cursor: str) -> Page:
        """A page of this shard's batches, newest first, below `cursor` (an
        unmarked batch id, or FIRST): one query (sql.LIST_BATCHES)."""
        mark = mark_id("", self.queue.shard)
        found = await self.binding.run(sql.LIST_BATCHES, mark + cursor, mark, PAGE + 1)
        rows = [batch_row(r) for r in found.rows]
        return first_page(rows, len(rows) > PAGE, batch_cursor)

    async def running(
        self, after: RunningKey, cap: int
    ) -> tuple[list[dict[str, Any]], RunningKey | None, int]:
        """The jobs held now after `after`, at most PAGE + 1 of them, from at
        most `cap` rows of the locked band (sql.RUNNING_NOW and its span:
        one batch): the held rows in key order, the key of the last row
        read (None: none read), and how many were read."""
        now = self.queue.clock()
        found, span = await self.binding.batch(
            [
                (sql.RUNNING_NOW, (*after, cap, now, PAGE + 1)),
                (sql.RUNNING_SPAN, (*after, cap)),
            ]
        )
        held = sorted((dict(r) for r in found.rows), key=_running_key)
        read = span.rows[0]
        if not read["last"]:
            return held, None, 0
        queue, at, id = str(read["last"]).split("\t")
        return held, (queue, int(at), id), int(read["scanned"])

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


async def _shard_search(
    store: ShardStore, source: str, filters: SearchFilters, cursor: str, cap: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A shard's matches and the span of its read: one batch."""
    f = filters
    matches, span = SEARCH_SOURCES[source]
    found, read = await store.binding.batch(
        [
            (
                matches,
                (
                    cursor,
                    cap,
                    f.get("queue", ""),
                    f.get("name", ""),
                    f.get("state", ""),
                    f.get("group", ""),
                    f.get("batch", ""),
                    f.get("text", ""),
                    store.queue.clock(),
                    PAGE + 1,
                ),
            ),
            (span, (cursor, cap)),
        ]
    )
    return [dict(r) for r in found.rows], dict(read.rows[0])


class Store:
    """What the dashboard reads and does, over every shard: pages merged in
    their order from each shard's page after the same cursor (a position in
    that order, not a shard's: one query per shard a page), actions by id
    sent to the id's shard, the per-minute counters added up."""

    def __init__(self, queue: D1Queue, shards: ShardSet | None = None) -> None:
        self.shards = shards or ShardSet.of(queue)
        self.queue = self.shards.home
        share = page_bytes(len(self.shards))
        self.stores = [ShardStore(q, share) for q in self.shards.queues]

    def _for(self, id: str) -> ShardStore | None:
        queue = self.shards.for_id(id)
        return None if queue is None else self.stores[queue.shard]

    async def search(
        self, source: str, filters: SearchFilters, cursor: str = FIRST, cap: int = SEARCH_ROWS
    ) -> SearchPage:
        """A page of `source`'s jobs (SEARCH_SOURCES) matching `filters`,
        newest id first, after `cursor`: each shard reads at most `cap` rows
        (sql.SEARCH_LIVE and its span: one batch a shard). The page holds the matches at
        or after the highest id where some shard's read stopped, so the next
        page (after that id) misses none, over any number of shards.
        ValueError for a cursor that is not an id."""
        if source not in SEARCH_SOURCES:
            raise ValueError(f"a search reads one of {', '.join(SEARCH_SOURCES)}")
        if cursor != FIRST and not re.fullmatch(STORED_ID_RULE, cursor):
            raise ValueError("the page cursor is not one this dashboard made")
        parts = [
            _search_part(hits, span, cap)
            for hits, span in await self.shards.each(
                lambda q: _shard_search(self.stores[q.shard], source, filters, cursor, cap)
            )
        ]
        resumes = [r for _, r, _, _ in parts if r is not None]
        edge = max(resumes) if resumes else None
        hits = sorted(
            (h for found, _, _, _ in parts for h in found if edge is None or h["id"] >= edge),
            key=lambda h: str(h["id"]),
            reverse=True,
        )
        if len(hits) > PAGE:
            hits, edge = hits[:PAGE], str(hits[PAGE - 1]["id"])
        return SearchPage(
            rows=hits,
            next_cursor=edge,
            scanned=sum(n for _, _, n, _ in parts),
            stopped_early=any(stopped for _, _, _, stopped in parts),
        )

    async def running(self, cursor: str | None = None, cap: int = RUNNING_ROWS) -> RunningPage:
        """A page of the jobs running now over every shard, in (queue, lease
        end, id) order after `cursor`: each shard reads at most `cap` rows of
        its locked band (one batch a shard). As the search's pages: the page
        holds the jobs before the lowest key where some shard's read stopped,
        so the next page (after that key) misses none. ValueError for a
        cursor running_cursor did not make."""
        after = read_running_cursor(cursor) if cursor else RUNNING_START
        parts = await self.shards.each(lambda q: self.stores[q.shard].running(after, cap))
        # Each shard's resume point, and whether its cap (not a full page) set it.
        resumes: list[tuple[RunningKey, bool]] = []
        for held, last, scanned in parts:
            if len(held) > PAGE:
                resumes.append((_running_key(held[PAGE - 1]), False))
            elif scanned >= cap and last is not None:
                resumes.append((last, True))
        edge, stopped = min(resumes) if resumes else (None, False)
        rows = sorted(
            (r for held, _, _ in parts for r in held if edge is None or _running_key(r) <= edge),
            key=_running_key,
        )
        if len(rows) > PAGE:
            rows, edge, stopped = rows[:PAGE], _running_key(rows[PAGE - 1]), False
        return RunningPage(
            rows=rows,
            next_cursor=running_cursor(edge) if edge is not None else None,
            scanned=sum(scanned for _, _, scanned in parts),
            stopped_early=stopped,
        )

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

    async def failed_job(self, id: str) -> FailedJob | None:
        store = self._for(id)
        return None if store is None else await store.failed_job(id)

    # A job's dependencies and dependents are on its shard (a push names in
    # `after` only jobs of the database it writes to), and a batch's jobs and
    # callbacks on the batch's (its id carries the shard's mark).

    async def job(self, id: str) -> JobView | FailedJob | None:
        store = self._for(id)
        return None if store is None else await store.job(id)

    async def links(self, id: str, after: list[str]) -> Links:
        store = self._for(id)
        if store is None:
            return Links([], False, {})
        return await store.links(id, after)

    async def batch(self, id: str, page: int = 1) -> BatchPage | None:
        store = self._for(id)
        return None if store is None else await store.batch(id, page)

    async def batches(self, cursor: str | None = None) -> Page:
        """A page of the batches over every shard, newest first, after
        `cursor` (batch_cursor's): one query a shard. ValueError for a
        cursor that is not one."""
        if cursor and not BATCH_CURSOR.fullmatch(cursor):
            raise ValueError("the page cursor is not one this dashboard made")
        pages = await self.shards.each(lambda q: self.stores[q.shard].batches(cursor or FIRST))
        return merged(pages, _batch_key, batch_cursor, reverse=True)

    async def completed(self, queue: str, cursor: str | None = None) -> Page:
        """A page of `queue`'s completed jobs over every shard, newest first."""
        pages = await self.shards.each(lambda q: self.stores[q.shard].completed(queue, cursor))
        return merged(pages, _completed_key, completed_cursor, reverse=True)

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
