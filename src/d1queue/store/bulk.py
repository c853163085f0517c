"""The dashboard's bulk actions and their audit log (migrations/0015_audit.sql).

A bulk action is a run: cancel or run now on live jobs, retry or delete on
failed ones, push again (retry) or delete on completed ones, over a
selection of ids or over everything a search matches (store/dashboard.py
SEARCH_SOURCES, its filters). Its record on the home shard says who, what,
when, the filter, the count its confirmation stated and how many it did.

It acts in steps. A step acts on one shard: at most a search page of jobs
(dashboard.PAGE), found by one search read (at most bounds.SEARCH_ROWS rows)
from where the last step stopped, written in one batch (one transaction,
one subrequest) that first takes the step on that shard (sql.AUDIT_TAKE_STEP:
from an earlier step only, under the request's nonce) and whose every
write checks the nonce. A step sent again (a lost reply, a second click)
finds it taken and does nothing twice: it answers the run as the first
send left it. The same batch re-sent by the binding (same nonce) finds
its lease dropped (sql.AUDIT_DROP_LEASE) and writes nothing either. On a
shard other than the home one the step is then recorded on the home
shard from that shard's guard row, over the step before only.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from ..core.bounds import AUDIT_KEEP_S, AUDIT_PRUNE, BULK_COUNT_ROWS, MAX_SAFE_INT, SEARCH_ROWS
from ..core.job import DEFAULT_MAX_ATTEMPTS
from ..core.metrics import MINUTE_MS
from . import sql
from .binding import Statement
from .dashboard import FIRST, PAGE, SearchFilters, Store, _search_part, _shard_search
from .failed import allowances

ACTIONS = {
    "live": ("cancel", "run"),
    "failed": ("retry", "delete"),
    "completed": ("retry", "delete"),
}
"""The bulk actions on each kind of job (SEARCH_SOURCES)."""

COUNTS = {
    "live": sql.BULK_COUNT_LIVE,
    "completed": sql.BULK_COUNT_COMPLETED,
    "failed": sql.BULK_COUNT_FAILED,
}

RUN_ID = re.compile(r"[0-9a-f]{32}")
"""A run's id: made by its confirmation page (new_run_id), sent back by
every step's form."""

AUDIT_PAGE = 50
"""Records an Audit page lists."""

_AUDIT_CURSOR = re.compile(r"([0-9]{1,15}):([0-9a-f]{32})")


def new_run_id() -> str:
    return secrets.token_hex(16)


@dataclass
class Run:
    """A run's record (a d1queue_audit row of the home shard)."""

    id: str
    at: int
    who: str
    action: str
    source: str
    filter: str
    selected: list[str] | None
    matched: int
    capped: bool
    step: int
    shard: int
    cursor: str
    finished: bool
    done: int
    updated_at: int

    @classmethod
    def of(cls, row: Any) -> Run:
        selected = row["selected"]
        return cls(
            id=str(row["id"]),
            at=int(row["at"]),
            who=str(row["who"]),
            action=str(row["action"]),
            source=str(row["source"]),
            filter=str(row["filter"]),
            selected=None if selected is None else [str(i) for i in json.loads(selected)],
            matched=int(row["matched"]),
            capped=bool(row["capped"]),
            step=int(row["step"]),
            shard=int(row["shard"]),
            cursor=str(row["cursor"]),
            finished=bool(row["finished"]),
            done=int(row["done"]),
            updated_at=int(row["updated_at"]),
        )


@dataclass
class Count:
    """What a filter matches, as its confirmation states it: `matched` in
    the `scanned` rows read; `capped`: some shard read its cap with rows
    left, so `matched` is a floor."""

    matched: int
    scanned: int
    capped: bool


class Bulk:
    """Bulk actions over the dashboard's Store (every shard)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.home = store.stores[store.queue.shard]

    async def count(self, source: str, filters: SearchFilters, cap: int = BULK_COUNT_ROWS) -> Count:
        """How many of `source`'s jobs `filters` match: one query a shard,
        reading at most `cap` rows each (sql.BULK_COUNT_LIVE)."""
        f = filters

        async def one(q: Any) -> Any:
            store = self.store.stores[q.shard]
            args = (
                FIRST,
                cap,
                f.get("queue", ""),
                f.get("name", ""),
                f.get("state", ""),
                f.get("group", ""),
                f.get("batch", ""),
                f.get("text", ""),
                store.queue.clock(),
            )
            return (await store.binding.run(COUNTS[source], *args)).rows[0]

        rows = await self.store.shards.each(one)
        return Count(
            matched=sum(int(r["matched"]) for r in rows),
            scanned=sum(int(r["scanned"]) for r in rows),
            capped=any(int(r["scanned"]) >= cap for r in rows),
        )

    async def start(
        self,
        id: str,
        *,
        who: str,
        action: str,
        source: str,
        filter: str,
        selected: list[str] | None,
        count: Count,
        now: int,
    ) -> Run:
        """Write a run's record (or find it: the confirmation re-sent) and
        prune at most AUDIT_PRUNE records past AUDIT_KEEP_S: one batch on
        the home shard."""
        chosen = None if selected is None else json.dumps(selected)
        *_, found = await self.home.binding.batch(
            [
                (
                    sql.AUDIT_START,
                    (
                        id,
                        now,
                        who,
                        action,
                        source,
                        filter,
                        chosen,
                        count.matched,
                        int(count.capped),
                    ),
                ),
                (sql.PRUNE_AUDIT, (now - AUDIT_KEEP_S * 1000, AUDIT_PRUNE)),
                (sql.AUDIT_RUN, (id,)),
            ]
        )
        return Run.of(found.rows[0])

    async def get(self, id: str) -> Run | None:
        found = await self.home.binding.run(sql.AUDIT_RUN, id)
        return Run.of(found.rows[0]) if found.rows else None

    def _shard_of(self, id: str) -> int | None:
        queue = self.store.shards.for_id(id)
        return None if queue is None else queue.shard

    def _writes(self, run: Run, shard: int, id: str, nonce: str, now: int) -> list[Statement]:
        """One job's statements of a step, each counted one followed by
        sql.AUDIT_COUNT."""
        lease = (run.id, nonce)
        count: Statement = (sql.AUDIT_COUNT, lease)
        store = self.store.stores[shard]
        if run.source == "live" and run.action == "run":
            return [(sql.BULK_RUN_NOW, (now, id, *lease)), count]
        if run.source == "live":
            counted: list[Statement] = (
                [(sql.BULK_METRICS_CANCELLED, (id, now - now % MINUTE_MS, *lease))]
                if store.queue.metrics
                else []
            )
            return [
                *counted,
                (sql.BULK_END_CANCELLED, (id, *lease)),
                (sql.BULK_CANCEL, (id, *lease)),
                count,
            ]
        if run.source == "failed" and run.action == "retry":
            given = allowances(store.failed_jobs.registry)
            return [
                (sql.BULK_RETRY_FAILED, (now, id, given, DEFAULT_MAX_ATTEMPTS, *lease)),
                (sql.BULK_RETRY_FAILED_DELETE, (id, *lease)),
                count,
            ]
        if run.source == "failed":
            return [(sql.BULK_DELETE_FAILED, (id, *lease)), count]
        if run.action == "retry":
            return [(sql.BULK_PUSH_AGAIN, (now, id, *lease)), count]
        return [
            (sql.BULK_DELETE_DONE_EDGES, (id, *lease)),
            (sql.BULK_DELETE_DONE, (id, *lease)),
            count,
        ]

    async def step(
        self, run: Run, n: int, filters: SearchFilters, now: int, nonce: str | None = None
    ) -> Run:
        """Take step `n` of `run` (read just before: its step n - 1 taken),
        at most PAGE jobs of one shard. A step already taken (or a run
        finished) is answered as the record says, nothing done."""
        if run.finished or run.step >= n:
            return run
        nonce = nonce or secrets.token_hex(16)
        k, shards = run.shard, len(self.store.stores)
        store = self.store.stores[k]
        if run.selected is not None:
            ids = [i for i in run.selected if self._shard_of(i) == k]
            later = sorted(
                {s for i in run.selected if (s := self._shard_of(i)) is not None and s > k}
            )
            after = (later[0], FIRST, 0) if later else (k, FIRST, 1)
        else:
            hits, span = await _shard_search(store, run.source, filters, run.cursor, SEARCH_ROWS)
            found, resume, _, _ = _search_part(hits, span, SEARCH_ROWS)
            ids = [str(h["id"]) for h in found[:PAGE]]
            if resume is not None:
                after = (k, resume, 0)
            elif k + 1 < shards:
                after = (k + 1, FIRST, 0)
            else:
                after = (k, FIRST, 1)
        home = k == self.home.queue.shard
        statements: list[Statement] = [
            (sql.AUDIT_DROP_LEASE, (run.id, n)),
            (sql.AUDIT_TAKE_STEP, (run.id, now, n, nonce, *after)),
        ]
        if not home:
            statements.append((sql.PRUNE_AUDIT, (now - AUDIT_KEEP_S * 1000, AUDIT_PRUNE)))
        for id in ids:
            statements += self._writes(run, k, id, nonce, now)
        if home:
            statements.append((sql.AUDIT_TOTAL, (run.id, nonce, run.done)))
        statements.append((sql.AUDIT_RUN, (run.id,)))
        *_, found_row = await store.binding.batch(statements)
        row = found_row.rows[0]
        if home:
            return Run.of(row)
        # The guard row says what the step that took it did (this request,
        # or an earlier send of it whose record below was lost).
        *_, record = await self.home.binding.batch(
            [
                (
                    sql.AUDIT_RECORD_STEP,
                    (
                        run.id,
                        n,
                        run.done + int(row["step_done"]),
                        int(row["shard"]),
                        str(row["cursor"]),
                        int(row["finished"]),
                        now,
                    ),
                ),
                (sql.AUDIT_RUN, (run.id,)),
            ]
        )
        return Run.of(record.rows[0])

    async def audit(self, cursor: str | None = None) -> tuple[list[Run], str | None]:
        """A page of records, newest first, and the next page's cursor.
        ValueError for a cursor not made here."""
        at, after = MAX_SAFE_INT, "g"
        if cursor:
            m = _AUDIT_CURSOR.fullmatch(cursor)
            if m is None:
                raise ValueError("the page cursor is not one this dashboard made")
            at, after = int(m.group(1)), m.group(2)
        found = await self.home.binding.run(sql.AUDIT_PAGE, at, after, AUDIT_PAGE + 1)
        runs = [Run.of(r) for r in found.rows]
        more = len(runs) > AUDIT_PAGE
        runs = runs[:AUDIT_PAGE]
        return runs, (f"{runs[-1].at}:{runs[-1].id}" if more and runs else None)
