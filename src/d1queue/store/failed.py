"""The failed-jobs store: the rows of d1queue_failed_jobs, their page cursor,
and every read and write of them but the one that fails a job (the settle,
settle.py, which moves a job here in the batch that deletes it).

One shard's store; aggregate.py and the dashboard's store compose it over
shards, merging pages with shards.merge_pages.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.bounds import MAX_PAGE_BYTES, MAX_SAFE_INT, NAME_ALPHABET, check_stored_name
from ..core.job import DEFAULT_MAX_ATTEMPTS
from ..core.log import event, get
from ..core.registry import Registry
from ..core.telemetry import messaging
from . import sql
from .binding import Binding
from .rows import stored_runs

log = get(__name__)


@dataclass
class FailedJob:
    """A row of d1queue_failed_jobs. `payload` is the stored JSON text: it may
    be the very thing that made the job fail."""

    id: str
    queue: str
    name: str
    payload: str
    error: str
    attempts: int
    max_attempts: int
    priority: int
    created_at: int
    failed_at: int
    group: str | None = None
    batch: str | None = None
    """The workflow batch it was a job of (None: none)."""
    after: str | None = None
    """The ids it waited for, as stored (a JSON array; None: none)."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """Its attempt history, oldest first, its failing attempt last
    (core/history.py)."""

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> FailedJob:
        """A d1queue_failed_jobs row (its `grp` column is `group`)."""
        fields = dict(row)
        fields["group"] = fields.pop("grp", None)
        fields.pop("fits", None)  # a listing's (sql.bytes_bounded)
        # A whole row's (SELECT *): kept for the job a retry makes, not shown.
        fields.pop("traceparent", None)
        fields["runs"] = stored_runs(fields.get("runs"))
        return cls(**fields)

    def __getitem__(self, key: str) -> Any:
        """Also readable as a row (`failed["error"]`)."""
        return getattr(self, key)


FAILED_CURSOR_RULE = rf"[0-9]{{1,15}}:{NAME_ALPHABET}{{0,128}}"
"""A page cursor of failed jobs is a position, `<failed_at>:<id>` (ids are
of ID_RULE's shape, colons included), not an opaque token: any value of
this shape is a valid place to continue from, newest first. The API, the
dashboard and the OpenAPI document read it from here."""
_FAILED_CURSOR = re.compile(rf"([0-9]{{1,15}}):({NAME_ALPHABET}{{0,128}})")


def encode_cursor(failed_at: int, id: str) -> str:
    """The cursor after a failed job at `failed_at` with `id`."""
    return f"{failed_at}:{id}"


def decode_cursor(cursor: str) -> tuple[int, str]:
    """(failed_at, id) of a cursor; ValueError for anything not of
    FAILED_CURSOR_RULE's shape."""
    m = _FAILED_CURSOR.fullmatch(cursor)
    if m is None:
        raise ValueError(f"a cursor is <failed_at>:<id>, as next_cursor gives it: {cursor!r}")
    return int(m.group(1)), m.group(2)


def allowances(registry: Registry | None) -> str:
    """The fresh attempts a retried failure gets, by job name, as the JSON
    object sql.RETRY_FAILED_INSERT reads: each registered job's
    max_attempts. A name it does not hold gets DEFAULT_MAX_ATTEMPTS, the
    library's default (registry.spec_for)."""
    specs = {n: registry.get(n) for n in registry.names()} if registry is not None else {}
    return json.dumps(
        {n: s.max_attempts for n, s in specs.items() if s is not None}, separators=(",", ":")
    )


class FailedJobs:
    """One D1 database's failed jobs. `registry`: whose max_attempts a
    retried job gets afresh (None: the library's default for every name)."""

    def __init__(
        self, binding: Binding, clock: Callable[[], int], registry: Registry | None = None
    ) -> None:
        self.binding, self.clock, self.registry = binding, clock, registry

    def _retry(self, now: int, id: str) -> list[tuple[str, tuple[Any, ...]]]:
        """The statements putting failed job `id` back on its queue."""
        given = allowances(self.registry)
        return [
            (sql.RETRY_FAILED_INSERT, (now, id, given, DEFAULT_MAX_ATTEMPTS)),
            (sql.RETRY_FAILED_DELETE, (id,)),
        ]

    async def get(self, id: str) -> FailedJob | None:
        result = await self.binding.run(sql.SELECT_FAILED, id)
        return FailedJob.of(result.rows[0]) if result.rows else None

    async def page(
        self,
        queue: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> tuple[list[FailedJob], str | None]:
        """A page of failed jobs, newest first, and the cursor of the next page
        (None on the last): at most `limit` jobs and `max_bytes` of their
        payloads and errors (one job at least). Keyset paging: stable while
        failures are added."""
        at, id = decode_cursor(cursor) if cursor is not None else (MAX_SAFE_INT, "")
        args: tuple[Any, ...] = (at, id, limit + 1, max_bytes)
        if queue is None:
            result = await self.binding.run(sql.LIST_FAILED_PAGE, *args)
        else:
            check_stored_name("queue", queue)
            result = await self.binding.run(sql.LIST_FAILED_PAGE_IN_QUEUE, *args, queue)
        rows, more = sql.bounded_page(result.rows)
        jobs = [FailedJob.of(r) for r in rows]
        return jobs, (encode_cursor(jobs[-1].failed_at, jobs[-1].id) if more and jobs else None)

    async def filtered(
        self,
        limit: int,
        *,
        queue: str = "",
        name: str = "",
        error: str = "",
        since_ms: int = 0,
        before_ms: int = MAX_SAFE_INT,
        cursor: str | None = None,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Up to `limit` failed jobs as rows (and `max_bytes` of their
        payloads and errors, one job at least), newest first, failed in
        [since_ms, before_ms), of one queue and name, whose error contains
        `error` (case-insensitive); and whether there are more. ValueError
        for a malformed cursor."""
        at, after = before_ms, ""
        if cursor:
            failed_at, id = decode_cursor(cursor)
            at, after = min(at, failed_at), id
            if failed_at > before_ms:
                after = ""
        args: list[Any] = [at, after, since_ms, name, error, limit + 1, max_bytes]
        statement = sql.LIST_FAILED_FILTERED
        if queue:
            statement = sql.LIST_FAILED_FILTERED_IN_QUEUE
            args.append(queue)
        result = await self.binding.run(statement, *args)
        rows, more = sql.bounded_page([dict(r) for r in result.rows])
        return rows, more

    async def retry(self, id: str) -> bool:
        """Put failed job `id` back on its queue (sql.RETRY_FAILED_INSERT: it
        keeps its attempts and last error, and gets its registration's
        max_attempts afresh); False if there is no such failed job."""
        inserted, _ = await self.binding.batch(self._retry(self.clock(), id))
        if inserted.changes == 1:
            return True
        # Re-sent after a lost reply, the copy finds the failure gone: if the
        # job is queued again, the first send did it.
        return inserted.resent and bool((await self.binding.run(sql.SELECT_JOB, id)).rows)

    async def retry_many(self, ids: Sequence[str]) -> int:
        """Put failed jobs back on their queues, as `retry` does, in
        one batch (one transaction, one subrequest); how many were put back.
        Should the batch fail as a whole (an id already queued again makes
        its insert conflict), each is retried on its own, so one such job
        does not hold back the others."""
        now = self.clock()
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for id in ids:
            statements += self._retry(now, id)
        try:
            results = await self.binding.batch(statements)
        except Exception:
            done = 0
            for id in ids:
                try:
                    done += bool(await self.retry(id))
                except Exception as exc:  # reported in the count, logged here
                    kind = type(exc).__name__
                    fields = messaging("send", id=id, error_type=kind)
                    event(
                        log,
                        "d1queue.failed.retry_failed",
                        logging.WARNING,
                        error=str(exc),
                        **fields,
                    )
            return done
        return sum(r.changes for r in results[0::2])

    async def delete(self, id: str) -> bool:
        return (await self.binding.run(sql.DELETE_FAILED, id)).changes == 1

    async def delete_many(self, ids: Sequence[str]) -> int:
        """Delete failed jobs, in one batch; how many there were."""
        results = await self.binding.batch([(sql.DELETE_FAILED, (id,)) for id in ids])
        return sum(r.changes for r in results)

    async def prune(self, older_than_s: float) -> int:
        """Delete every failure older than `older_than_s` (by hand: the cron's
        retention prune is bounded, sql.PRUNE_OLDEST_FAILED)."""
        cutoff = max(0, self.clock() - round(older_than_s * 1000))
        return (await self.binding.run(sql.PRUNE_FAILED, cutoff)).changes
