"""The measurements, run where the Worker runs: inside Pyodide against the D1
binding the Worker gets (host/host.mjs: the workers SDK over Miniflare's D1),
or under CPython against SqliteD1 (tests/test_counts.py).

Only d1queue's public API is used (D1Queue, drain, Config, Registry, and
`D1Queue.binding.usage`), so the figures follow the library as it changes.
Every function takes the D1 binding and returns plain JSON-able dicts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from d1queue import Config, D1Queue, Fail, Registry, drain
from d1queue.core.flow import Limits
from d1queue.store import sql as sql_module
from d1queue.store.binding import Binding, Result
from d1queue.store.claim import claim_round
from d1queue.store.settle import record_progress
from d1queue.store.sql import (
    CLAIM,
    DELAYED_BAND,
    DONE_BAND,
    GROUP_SHIFT,
    LOCKED_BAND,
    MARK_GROUPED,
    PRUNE_BATCH_PARTS,
    PRUNE_BATCHES,
    PRUNE_DONE,
    PRUNE_DONE_EDGES,
    TOP_PRIORITY,
    WAITING_BAND,
)

from .seed_driver import FAILED, JOBS, SCHEMA, SeedQueue, seed_drain

QUEUE = "bench"
BATCH = 25
RESERVATION_S = 600.0
TIME_BUDGET_S = 300.0
UNCAPPED = 10**6
"""max_jobs for a drain bounded by its query budget alone."""

REGISTRY = Registry()


@REGISTRY.job("bench.noop", timeout_s=30)
async def noop(payload: Any) -> None:
    """The handler every drain runs: nothing, so only the queue is measured."""


@REGISTRY.job("bench.fail", timeout_s=30)
async def fails(payload: Any) -> None:
    raise Fail("bench: failing on purpose")


SEED_HANDLERS = {"bench.noop": noop, "bench.fail": fails}


# -- injected latency, and rows by statement kind ----------------------------------


def _meta(result: Any) -> Any:
    meta = result["meta"] if isinstance(result, Mapping) else getattr(result, "meta", None)
    return meta if meta is not None else {}


def _field(meta: Any, key: str) -> int:
    value = meta.get(key) if isinstance(meta, Mapping) else getattr(meta, key, None)
    return int(value or 0)


class _Statement:
    def __init__(self, db: InstrumentedD1, sql: str, inner: Any) -> None:
        self._db, self.sql, self.inner = db, sql, inner

    def bind(self, *values: Any) -> _Statement:
        return _Statement(self._db, self.sql, self.inner.bind(*values))

    async def all(self) -> Any:
        await self._db.wait()
        return self._db.tally([self.sql], [await self.inner.all()])[0]

    async def run(self) -> Any:
        await self._db.wait()
        return self._db.tally([self.sql], [await self.inner.run()])[0]

    async def first(self, *args: Any) -> Any:
        await self._db.wait()
        return await self.inner.first(*args)


class InstrumentedD1:
    """A D1 binding wrapped at the binding level (what d1queue is handed).

    Every round trip (statement .all()/.run()/.first(), and db.batch()) first
    waits `latency_s`: the network between a Worker and its database, which
    Miniflare on loopback does not have; calls in flight together wait
    together, as real round trips do. And every statement's meta.rows_read /
    rows_written is tallied by the statement's first word (SELECT, UPDATE,
    DELETE, INSERT), to say where the rows go.

    `reuse_prepared`: prepare each SQL text once: runs that only count rows
    reuse them to finish sooner; runs that are timed do not."""

    def __init__(self, inner: Any, latency_s: float = 0.0, *, reuse_prepared: bool = False) -> None:
        self.inner, self.latency_s = inner, latency_s
        self.rows: dict[str, dict[str, int]] = {}
        self.by_sql: dict[str, list[int]] = {}
        """[statements, rows read, rows written] by SQL text."""
        self._prepared: dict[str, Any] | None = {} if reuse_prepared else None

    async def wait(self) -> None:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)

    def tally(self, sqls: list[str], results: Any) -> Any:
        for sql, result in zip(sqls, results, strict=True):
            kind = sql.split(None, 1)[0].upper()
            meta = _meta(result)
            entry = self.rows.setdefault(kind, {"statements": 0, "rows_read": 0, "rows_written": 0})
            entry["statements"] += 1
            entry["rows_read"] += _field(meta, "rows_read")
            entry["rows_written"] += _field(meta, "rows_written")
            by = self.by_sql.setdefault(sql, [0, 0, 0])
            by[0] += 1
            by[1] += _field(meta, "rows_read")
            by[2] += _field(meta, "rows_written")
        return results

    def by_statement(self) -> dict[str, dict[str, int]]:
        """`by_sql` under the statements' names in d1queue.store.sql."""
        out: dict[str, dict[str, int]] = {}
        for text, (n, read, written) in self.by_sql.items():
            entry = out.setdefault(
                statement_name(text), {"statements": 0, "rows_read": 0, "rows_written": 0}
            )
            entry["statements"] += n
            entry["rows_read"] += read
            entry["rows_written"] += written
        return out

    def prepare(self, sql: str) -> _Statement:
        if self._prepared is None:
            return _Statement(self, sql, self.inner.prepare(sql))
        # bind() returns a new statement, so one prepared statement per SQL
        # text serves every call, as it may on D1.
        if sql not in self._prepared:
            self._prepared[sql] = self.inner.prepare(sql)
        return _Statement(self, sql, self._prepared[sql])

    async def batch(self, statements: list[_Statement]) -> Any:
        await self.wait()
        results = await self.inner.batch([s.inner for s in statements])
        return self.tally([s.sql for s in statements], list(results))


def statement_name(text: str) -> str:
    """The name in d1queue.store.sql of the statement `text` (a made one,
    such as a claim under flow limits, by its maker), else its first words."""
    for name, value in vars(sql_module).items():
        if name.isupper() and value == text:
            return name
    if text.startswith("UPDATE OR IGNORE d1queue_jobs"):
        lapsed = "lapsed, " if "last_error" in text else ""
        return f"claim_limited({lapsed}{text.count('SELECT last FROM d1queue_flow')} rates)"
    if "FROM d1queue_jobs WHERE queue = " in text and " UNION ALL " in text:
        guarded = "guarded, " if text.startswith("WITH g(q)") else ""
        return f"select_flow_candidates({guarded}{text.count('UNION ALL') + 1} ranges)"
    return " ".join(text.split()[:4])


# -- the backlog ---------------------------------------------------------------

_SEQ = [0]
"""Jobs seeded so far in this interpreter: ids and available_at keep growing,
so a topped-up backlog stays FIFO behind what is already queued."""

OURS_INSERT = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, band) "
    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1) "
    "SELECT printf('b%012d', ?2 + i), ?3, ?4, printf('{\"i\": %d}', ?2 + i), 0, 3, 0, "
    "?5 + ?2 + i, ?5, 0 FROM c"
)
SEED_INSERT = (
    f"INSERT INTO {JOBS} (id, queue, name, payload, attempts, max_attempts, available_at, "
    "created_at) "
    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1) "
    "SELECT printf('b%012d', ?2 + i), ?3, ?4, printf('{\"i\": %d}', ?2 + i), 0, 3, "
    "?5 + ?2 + i, ?5 FROM c"
)
OURS_COUNT = "SELECT COUNT(*) AS n FROM d1queue_jobs WHERE queue = ?1 AND reserved_at IS NULL"
SEED_COUNT = f"SELECT COUNT(*) AS n FROM {JOBS} WHERE queue = ?1 AND reserved_at IS NULL"
EPOCH_MS = 1_000_000_000_000
"""available_at of the seeded jobs: 2001 plus their sequence number, so every
one is due and their order is their seeding order."""


async def _one(db: Any, sql: str, *params: Any) -> Result:
    """A statement sent outside any measurement (its own, uncounted Binding)."""
    return await Binding(db).run(sql, *params)


async def setup(db: Any) -> dict[str, Any]:
    """The seed's tables beside d1queue's (idempotent)."""
    await Binding(db).batch([(s, ()) for s in SCHEMA])
    return {"ok": True}


async def seed_backlog(db: Any, design: str, n: int, queue: str = QUEUE) -> dict[str, Any]:
    """Add `n` due no-op jobs to `queue` in one INSERT … WITH RECURSIVE."""
    if n <= 0:
        return {"added": 0, "seconds": 0.0}
    t0 = time.perf_counter()
    sql = OURS_INSERT if design == "d1queue" else SEED_INSERT
    result = await _one(db, sql, n, _SEQ[0], queue, "bench.noop", EPOCH_MS)
    _SEQ[0] += n
    return {"added": result.changes, "seconds": time.perf_counter() - t0}


async def backlog(db: Any, design: str, queue: str = QUEUE) -> int:
    result = await _one(db, OURS_COUNT if design == "d1queue" else SEED_COUNT, queue)
    return int(result.rows[0]["n"])


async def top_up(db: Any, design: str, n: int, queue: str = QUEUE) -> dict[str, Any]:
    """Bring `queue` to exactly `n` unreserved jobs (only ever adds)."""
    have = await backlog(db, design, queue)
    added = await seed_backlog(db, design, n - have, queue)
    return {"had": have, **added}


async def clear(db: Any) -> dict[str, Any]:
    """Remove every job the bench made, in both designs' tables, and the
    job metrics' rows."""
    tables = ("d1queue_jobs", "d1queue_failed_jobs", "d1queue_metrics", JOBS, FAILED)
    await Binding(db).batch([(f"DELETE FROM {t}", ()) for t in tables])
    return {"ok": True}


async def drop_seed_tables(db: Any) -> dict[str, Any]:
    await Binding(db).batch([(f"DROP TABLE IF EXISTS {t}", ()) for t in (FAILED, JOBS)])
    return {"ok": True}


# -- one invocation ----------------------------------------------------------


def _usage(binding: Any) -> dict[str, Any]:
    u = binding.usage
    return {
        "queries": u.queries,
        "statements": u.statements,
        "rows_read": u.rows_read,
        "rows_written": u.rows_written,
        "d1_seconds": u.seconds,
    }


async def invocation(
    db: Any,
    design: str,
    *,
    backlog_n: int | None = None,
    query_budget: int = 1000,
    batch_counts_as: str = "query",
    batch_size: int = BATCH,
    latency_ms: float | None = None,
    reuse_prepared: bool = False,
    queue: str = QUEUE,
    by_statement: bool = False,
    metrics: bool = False,
) -> dict[str, Any]:
    """One drain invocation of `design` ("d1queue" or "seed") on `queue`,
    topped up to `backlog_n` jobs first (None: as it is), through an
    InstrumentedD1 waiting `latency_ms` per round trip (and reusing prepared
    statements if asked). Returns what the drain claimed, what its binding
    counted, and the rows by statement kind (and, if asked, by statement:
    InstrumentedD1.by_statement). d1queue counts its job metrics only with
    `metrics` (D1QUEUE_METRICS; off in every figure that predates them, so
    those stay comparable)."""
    if backlog_n is not None:
        await top_up(db, design, backlog_n, queue)
    target = InstrumentedD1(db, (latency_ms or 0) / 1000, reuse_prepared=reuse_prepared)
    t0 = time.perf_counter()
    if design == "d1queue":
        q = D1Queue(target, reservation_s=RESERVATION_S, metrics=metrics)
        # Bounded by the query budget alone: a plan whose caps do not bind
        # and no job cap (the free plan's CPU bound is measured apart).
        config = Config(
            plan="paid",
            max_jobs=UNCAPPED,
            queues=(queue,),
            time_budget_s=TIME_BUDGET_S,
            query_budget=query_budget,
            batch_counts_as=batch_counts_as,  # type: ignore[arg-type]
            batch_size=batch_size,
            reservation_s=RESERVATION_S,
            # The jobs' own cost: the run's counters (one query, at most one
            # row a run, whatever it drains) are counted in tests/test_stats.py.
            stats=False,
        )
        report = await drain(q, REGISTRY, config)
        wall = time.perf_counter() - t0
        out = {
            "claimed": report.claimed,
            "completed": report.completed,
            "failed": report.failed,
            "rounds": report.rounds,
            "stopped": report.stopped,
            **_usage(q.binding),
        }
    else:
        sq = SeedQueue(target, reservation_s=RESERVATION_S)
        seed_report = await seed_drain(
            sq,
            SEED_HANDLERS,
            name=queue,
            query_budget=query_budget,
            batch_counts_as=batch_counts_as,
        )
        wall = time.perf_counter() - t0
        out = {
            "claimed": seed_report.claimed,
            "completed": seed_report.completed,
            "failed": seed_report.failed,
            "rounds": seed_report.claimed,
            "stopped": seed_report.stopped,
            **_usage(sq.binding),
        }
    out["wall_s"] = wall
    out["rows_by_kind"] = target.rows
    if by_statement:
        out["by_statement"] = target.by_statement()
    out["batch_size"] = batch_size if design == "d1queue" else 1
    return out


async def job_life(
    db: Any, design: str, n: int, *, fail: bool = False, metrics: bool = False
) -> dict[str, Any]:
    """Push `n` jobs one by one (as callers do), then drain them: the rows
    written by the pushes and by the drain (claim + ack, or claim + fail);
    d1queue's job metrics counted only with `metrics`."""
    name = "bench.fail" if fail else "bench.noop"
    queue = "life-fail" if fail else "life"
    db = InstrumentedD1(db)
    if design == "d1queue":
        q = D1Queue(db, reservation_s=RESERVATION_S, metrics=metrics)
        for i in range(n):
            await q.dispatch(name, {"i": i}, queue=queue)
        pushed = _usage(q.binding)
        config = Config(
            plan="paid",
            max_jobs=UNCAPPED,
            queues=(queue,),
            time_budget_s=TIME_BUDGET_S,
            query_budget=1000,
            batch_size=BATCH,
            reservation_s=RESERVATION_S,
            stats=False,  # a job's life; the run's counters are per run
        )
        report = await drain(q, REGISTRY, config)
        done = report.failed if fail else report.completed
        total = _usage(q.binding)
    else:
        sq = SeedQueue(db, reservation_s=RESERVATION_S)
        for i in range(n):
            await sq.push(name, {"i": i}, queue=queue)
        pushed = _usage(sq.binding)
        seed_report = await seed_drain(sq, SEED_HANDLERS, name=queue, query_budget=10**9)
        done = seed_report.failed if fail else seed_report.completed
        total = _usage(sq.binding)
    return {
        "jobs": n,
        "done": done,
        "push_rows_written": pushed["rows_written"],
        "drain_rows_written": total["rows_written"] - pushed["rows_written"],
        "rows_written": total["rows_written"],
        "push_queries": pushed["queries"],
        "drain_queries": total["queries"] - pushed["queries"],
        "drain_statements": total["statements"] - pushed["statements"],
        "rows_by_kind": db.rows,
    }


async def probe(db: Any, n: int = 20) -> dict[str, Any]:
    """What the D1 binding itself costs here, per call, for the report's notes:
    prepare() and bind() (through the SDK's wrapper), and a bare round trip
    (with the offline host, a dispatchFetch into Miniflare)."""
    t0 = time.perf_counter()
    for _ in range(n):
        stmt = db.prepare(CLAIM_SHAPED)
    t1 = time.perf_counter()
    for _ in range(n):
        stmt.bind(1, 2, "token", "id", 0, "queue", 0, 1)
    t2 = time.perf_counter()
    select = db.prepare("SELECT 1")
    for _ in range(n):
        await select.all()
    t3 = time.perf_counter()
    return {
        "prepare_ms": (t1 - t0) / n * 1000,
        "bind_ms": (t2 - t1) / n * 1000,
        "select1_round_trip_ms": (t3 - t2) / n * 1000,
    }


CLAIM_SHAPED = CLAIM


# -- what the claim reads, whatever the backlog holds --------------------------------

BACKLOG_QUEUE = "backlog"
NOW_MS = 1_900_000_000_000
"""The clock of the backlog scenarios (2030): jobs seeded relative to it."""

_SEED_JOBS = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, priority, band, "
    "available_at, created_at, locked_until, reserved_at, reservation) "
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
    "SELECT printf('%s-%s%07d', ?3, ?2, i), ?3, 'bench.noop', 'null', 3, i % ?4, "
    "COALESCE(?5, i % ?4), ?6 + i, 0, CASE WHEN ?7 THEN ?6 + i ELSE 0 END, ?8, ?9 FROM n"
)


async def seed_jobs(
    db: Any,
    *,
    delayed: int = 0,
    due: int = 0,
    in_flight: int = 0,
    levels: int = 1,
    waiting: int = 0,
    queue: str = BACKLOG_QUEUE,
) -> dict[str, Any]:
    """Replace `queue`'s jobs with: `delayed` jobs pushed to run after NOW_MS,
    `due` jobs ready, `in_flight` jobs held by a live lease (in the locked
    band, as a claim leaves them), `waiting` jobs waiting for others (the
    waiting band, `waiting` 1: a dependency not yet ended); priorities
    spread over `levels` levels."""
    b = Binding(db)
    await b.run("DELETE FROM d1queue_jobs WHERE queue = ?1", queue)
    kinds = (
        # n, id prefix, band (None: the priority), available_at, locked, reserved_at, token
        (delayed, "d", DELAYED_BAND, NOW_MS + 60_000, 0, None, None),
        (due, "r", None, NOW_MS - 100_000, 0, None, None),
        (in_flight, "f", LOCKED_BAND, NOW_MS + 600_000, 1, NOW_MS - 1, "held"),
        (waiting, "w", WAITING_BAND, NOW_MS - 200_000, 0, None, None),
    )
    for n, prefix, band, at, locked, reserved_at, token in kinds:
        if n:
            await b.run(_SEED_JOBS, n, prefix, queue, levels, band, at, locked, reserved_at, token)
    if waiting:
        await b.run(
            f"UPDATE d1queue_jobs SET waiting = 1 WHERE queue = ?1 AND band = {WAITING_BAND}", queue
        )
    return {"ok": True}


async def claim_cost(
    db: Any, n: int = BATCH, queue: str = BACKLOG_QUEUE, *, keep: bool = False
) -> dict[str, Any]:
    """One claim round of up to `n` jobs on `queue` at NOW_MS, then their
    acknowledgements (with `keep`, completions kept as history: a move to
    the done band, else a DELETE): rows read and written by the candidate
    SELECT, the claims and the acks."""
    target = InstrumentedD1(db)
    q = D1Queue(target, reservation_s=RESERVATION_S, clock=lambda: NOW_MS, keep_completed=keep)
    jobs, candidates = await claim_round(q, queue, n)
    claim_rows = {k: dict(v) for k, v in target.rows.items()}
    for job in jobs:
        await q.complete(job)

    def rows(kind: str, key: str, src: dict[str, dict[str, int]]) -> int:
        return src.get(kind, {}).get(key, 0)

    def acks(key: str) -> int:
        return sum(v[key] for v in target.rows.values()) - sum(v[key] for v in claim_rows.values())

    return {
        "claimed": len(jobs),
        "candidates": candidates,
        "select_rows_read": rows("SELECT", "rows_read", claim_rows),
        "claim_rows_read": rows("UPDATE", "rows_read", claim_rows),
        "claim_rows_written": rows("UPDATE", "rows_written", claim_rows),
        "ack_rows_read": acks("rows_read"),
        "ack_rows_written": acks("rows_written"),
    }


async def reserve_cost(db: Any, n: int = BATCH, queue: str = BACKLOG_QUEUE) -> dict[str, Any]:
    """`n` jobs taken one at a time, as the seed's surface does
    (`D1Queue.reserve`, then `acknowledge`), on `queue` at NOW_MS: rows read
    in all, and jobs reserved."""
    target = InstrumentedD1(db)
    q = D1Queue(target, reservation_s=RESERVATION_S, clock=lambda: NOW_MS)
    got = 0
    for _ in range(n):
        job = await q.reserve(queue)
        if job is None:
            break
        got += 1
        await q.complete(job)
    read = sum(v.get("rows_read", 0) for v in target.rows.values())
    return {"reserved": got, "rows_read": read}


async def retry_cost(db: Any, n: int = 20, delay_s: float = 5.0) -> dict[str, Any]:
    """Claim `n` fresh jobs and release each for a retry after `delay_s`:
    rows written per retry (the job moves within the locked band to its
    retry time)."""
    queue = "retry"
    b = Binding(db)
    await b.run("DELETE FROM d1queue_jobs WHERE queue = ?1", queue)
    target = InstrumentedD1(db)
    q = D1Queue(target, reservation_s=RESERVATION_S)
    for i in range(n):
        await q.dispatch("bench.noop", {"i": i}, queue=queue)
    jobs = await q.reserve_batch(queue, n)
    before = dict(target.rows.get("UPDATE", {}))
    for job in jobs:
        await q.retry(job, delay_s, "retry")
    after = target.rows.get("UPDATE", {})
    return {
        "retried": len(jobs),
        "rows_written": after.get("rows_written", 0) - before.get("rows_written", 0),
        "rows_read": after.get("rows_read", 0) - before.get("rows_read", 0),
    }


async def progress_cost(db: Any, n: int = 20) -> dict[str, Any]:
    """Claim `n` fresh jobs and write one progress report to each, as
    `ctx.progress` does (store/settle.py record_progress): rows read and
    written per report. Then release each for a retry, its attempt (with
    that progress) appended to its history by the release itself: rows
    written per retry, as without."""
    queue = "progress"
    b = Binding(db)
    await b.run("DELETE FROM d1queue_jobs WHERE queue = ?1", queue)
    target = InstrumentedD1(db)
    q = D1Queue(target, reservation_s=RESERVATION_S)
    for i in range(n):
        await q.dispatch("bench.noop", {"i": i}, queue=queue)
    jobs = await q.reserve_batch(queue, n)
    before = dict(target.rows.get("UPDATE", {}))
    for job in jobs:
        progress = f'{{"attempt":1,"seq":{1 << 20},"value":0.5,"note":"half","at":0}}'
        await record_progress(q, job, progress, 1 << 20)
    mid = dict(target.rows.get("UPDATE", {}))
    for job in jobs:
        await q.retry(job, 5.0, "retry")
    after = target.rows.get("UPDATE", {})
    await b.run("DELETE FROM d1queue_jobs WHERE queue = ?1", queue)
    return {
        "reports": len(jobs),
        "statements": mid.get("statements", 0) - before.get("statements", 0),
        "rows_read": mid.get("rows_read", 0) - before.get("rows_read", 0),
        "rows_written": mid.get("rows_written", 0) - before.get("rows_written", 0),
        "retry_rows_written": after.get("rows_written", 0) - mid.get("rows_written", 0),
    }


_SEED_DESIGN_JOBS = (
    f"INSERT INTO {JOBS} (id, queue, name, payload, attempts, max_attempts, available_at, "
    "created_at) "
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
    "SELECT printf('%s%07d', ?2, i), ?3, 'bench.noop', 'null', 0, 3, ?4 + i, 0 FROM n"
)


async def seed_design_claim_cost(
    db: Any, *, delayed: int, due: int, n: int = BATCH, queue: str = BACKLOG_QUEUE
) -> dict[str, Any]:
    """The seed's design on the same backlog: `delayed` jobs an hour off and
    `due` ready ones, then up to `n` jobs reserved and acknowledged one at a
    time, as its driver does; rows read by kind."""
    b = Binding(db)
    await b.run(f"DELETE FROM {JOBS} WHERE queue = ?1", queue)
    now = int(time.time() * 1000)
    for count, prefix, at in ((delayed, "d", now + 3_600_000), (due, "r", now - 100_000)):
        if count:
            await b.run(_SEED_DESIGN_JOBS, count, prefix, queue, at)
    target = InstrumentedD1(db)
    sq = SeedQueue(target, reservation_s=RESERVATION_S)
    claimed = 0
    select_reads = 0
    for _ in range(n):
        before = target.rows.get("SELECT", {}).get("rows_read", 0)
        job = await sq.reserve(queue)
        select_reads += target.rows.get("SELECT", {}).get("rows_read", 0) - before
        if job is None:
            break
        await sq.acknowledge(job)
        claimed += 1
    rows = target.rows
    await b.run(f"DELETE FROM {JOBS} WHERE queue = ?1", queue)
    return {
        "claimed": claimed,
        "select_rows_read": select_reads,
        "claim_rows_read": rows.get("UPDATE", {}).get("rows_read", 0),
        "ack_rows_read": rows.get("DELETE", {}).get("rows_read", 0),
    }


async def seed_design_retry_cost(db: Any, n: int = 20, delay_s: float = 5.0) -> dict[str, Any]:
    """The seed's release of `n` claimed jobs for a retry: rows written."""
    queue = "retry"
    target = InstrumentedD1(db)
    sq = SeedQueue(target, reservation_s=RESERVATION_S)
    for i in range(n):
        await sq.push("bench.noop", {"i": i}, queue=queue)
    jobs = [j for j in [await sq.reserve(queue) for _ in range(n)] if j is not None]
    before = dict(target.rows.get("UPDATE", {}))
    for job in jobs:
        await sq.release(job, delay_s)
    after = target.rows.get("UPDATE", {})
    await Binding(db).run(f"DELETE FROM {JOBS} WHERE queue = ?1", queue)
    return {
        "retried": len(jobs),
        "rows_written": after.get("rows_written", 0) - before.get("rows_written", 0),
    }


async def queue_walk_cost(db: Any, queues: int, jobs_per_queue: int) -> dict[str, Any]:
    """Fill `queues` queues with `jobs_per_queue` delayed jobs each, then find
    the queues as a drain on "*" does: rows read by that one statement."""
    b = Binding(db)
    await b.run("DELETE FROM d1queue_jobs WHERE queue LIKE 'walk-%'")
    for i in range(queues):
        await seed_jobs(db, delayed=jobs_per_queue, queue=f"walk-{i:03d}")
    target = InstrumentedD1(db)
    q = D1Queue(target)
    names = (await q.survey(every_queue=True)).names
    rows = target.rows.get("SELECT", {}).get("rows_read", 0)
    await b.run("DELETE FROM d1queue_jobs WHERE queue LIKE 'walk-%'")
    return {"queues": len([n for n in names if n.startswith("walk-")]), "rows_read": rows}


# -- schedules: what a cron run's evaluation costs ----------------------------------


async def schedule_cost(db: Any, schedules: int, due: int) -> dict[str, Any]:
    """`schedules` API schedules of a no-op job, `due` of them due now and the
    rest an hour off, then one evaluation as the cron runs it: its queries,
    rows read and rows written, and how many slots it enqueued."""
    from d1queue.store.schedules import Schedules

    b = Binding(db)
    await b.batch(
        [
            ("DELETE FROM d1queue_schedules WHERE id LIKE 'bench.s%'", ()),
            ("DELETE FROM d1queue_jobs WHERE queue = 'sched'", ()),
        ]
    )
    minute = NOW_MS - NOW_MS % 60_000
    await b.run(
        "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?1) "
        "INSERT INTO d1queue_schedules (id, cron, tz, name, payload, queue, source, version, "
        "next_run_at, created_at, updated_at) SELECT printf('bench.s%05d', i), '* * * * *', "
        "'UTC', 'bench.noop', 'null', 'sched', 'api', 'v', "
        "CASE WHEN i <= ?2 THEN ?3 ELSE ?3 + 3600000 END, 0, 0 FROM k",
        schedules,
        due,
        minute,
    )
    # A first run syncs this registry's (empty) code-declared set, once.
    await Schedules(D1Queue(db), REGISTRY).run(now=minute - 120_000)
    target = InstrumentedD1(db)
    q = D1Queue(target, clock=lambda: minute + 1_000)
    report = await Schedules(q, REGISTRY).run(now=minute + 1_000)
    await b.batch(
        [
            ("DELETE FROM d1queue_schedules WHERE id LIKE 'bench.s%'", ()),
            ("DELETE FROM d1queue_jobs WHERE queue = 'sched'", ()),
        ]
    )
    return {
        "schedules": schedules,
        "due": due,
        "enqueued": report.enqueued,
        "queries": report.queries,
        "rows_read": report.rows_read,
        "rows_written": report.rows_written,
        "error": report.error,
    }


# -- the JSON depth check on bodies at the size limit ---------------------------------


def depth_bodies(size: int) -> dict[str, str]:
    """Request bodies of exactly `size` characters: a normal job (objects,
    arrays, strings with quotes and brackets in them) and shapes on which a
    depth check that scans string by string, or bracket by bracket, works
    hardest."""
    import json

    def fill(head: str, unit: str) -> str:
        text = head + unit * ((size - len(head)) // len(unit))
        return text + unit[: size - len(text)]

    item = {
        "id": 0,
        "title": 'a "quoted" word, [brackets] and {braces} in a string',
        "tags": ["alpha", "beta"],
        "score": 1.5,
        "meta": {"ok": True, "parent": None},
    }
    items: list[str] = []
    length = 0
    while length < size - 512:
        entry = json.dumps({**item, "id": len(items)})
        items.append(entry)
        length += len(entry) + 2
    head = '{"name": "bench.noop", "payload": {"items": [' + ", ".join(items) + '], "pad": "'
    normal = head + " " * (size - len(head) - 3) + '"}}'
    job = '{"name": "bench.noop", "payload": '
    return {
        "normal job": normal,
        "unclosed string of escaped quotes": fill(job + '"', '\\"'),
        "escaped backslashes in a string": fill(job + '"', "\\\\"),
        "quotes": '"' * size,
        "quote-backslash-quote": fill("", '"\\"'),
        "deep brackets": "[" * size,
        "bracket-quote pairs": "[" + '"[' * ((size - 1) // 2) + '"' * ((size - 1) % 2),
        "brackets in one string": '"' + "[" * (size - 2) + '"',
    }


async def depth_check(db: Any, size: int, repeats: int = 5) -> dict[str, Any]:
    """bounds.json_depth on each of depth_bodies(size): the least time of
    `repeats` runs, in ms, and the depth it found; and json.loads of the
    normal job, for scale. CPython's clock is the thread's CPU; Pyodide has
    none Python can read (its process_time is the wall clock), so there it
    is the wall time of a call that does no I/O, on the Worker's one thread."""
    import json

    from d1queue.core.bounds import json_depth

    clock = getattr(time, "thread_time", time.perf_counter)

    def least_ms(fn: Any, arg: str) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = clock()
            fn(arg)
            best = min(best, clock() - t0)
        return round(best * 1000, 3)

    bodies = depth_bodies(size)
    assert all(len(b) == size for b in bodies.values())
    out: dict[str, Any] = {
        "size": size,
        "repeats": repeats,
        "clock": clock.__name__,
        "check_ms": {k: least_ms(json_depth, b) for k, b in bodies.items()},
        "depth": {k: json_depth(b) for k, b in bodies.items()},
        "parse_normal_ms": least_ms(json.loads, bodies["normal job"]),
    }
    return out


# -- flow control: limits, fair groups, a limited round --------------------------------

FLOW_QUEUE = "flow"
"""The queue of the flow-control scenarios."""

_SEED_FLOW_JOBS = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, priority, band, "
    "available_at, created_at, grp) "
    "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1) "
    "SELECT printf('f%012d', ?2 + i), ?3, 'bench.noop', 'null', 3, 0, "
    f"CASE WHEN ?4 > 0 THEN {GROUP_SHIFT} ELSE 0 END, ?5 + CASE WHEN ?4 > 0 "
    "THEN i / CAST(?4 AS INTEGER) ELSE i END, ?5, "
    "CASE WHEN ?4 > 0 THEN printf('g%05d', i % CAST(?4 AS INTEGER)) END FROM n"
)
"""`?1` due jobs of priority 0 on queue `?3`, ids from `?2`: in `?4` groups
(0: none) as pushes of the groups' jobs in turn leave them (INSERT_FLOW_JOB:
in the grouped band, keyed by fair tag: the groups' first jobs at `?5`,
their second ones a step later, and so on), or plain ones in push order.
(The CASTs: D1 binds a number as REAL, and i / 10.0 is no tag.)"""

_SEED_FLOW_TAGS = (
    "INSERT INTO d1queue_flow (queue, grp, tag) SELECT queue, grp, MAX(available_at) "
    f"FROM d1queue_jobs WHERE queue = ?1 AND band > {TOP_PRIORITY} GROUP BY grp "
    "ON CONFLICT (queue, grp) DO UPDATE SET tag = excluded.tag"
)
"""Each group's last tag, as the pushes' BUMP_TAG leave it."""


def _flow_config(queue: str, query_budget: int = 1000) -> Config:
    return Config(
        plan="paid",
        max_jobs=UNCAPPED,
        queues=(queue,),
        time_budget_s=TIME_BUDGET_S,
        query_budget=query_budget,
        batch_size=BATCH,
        reservation_s=RESERVATION_S,
        stats=False,
    )


async def flow_reset(db: Any, queue: str = FLOW_QUEUE) -> dict[str, Any]:
    """`queue` with no job, no flow row, no limits and no mark."""
    await Binding(db).batch(
        [
            ("DELETE FROM d1queue_jobs WHERE queue = ?1", (queue,)),
            ("DELETE FROM d1queue_flow WHERE queue = ?1", (queue,)),
            ("DELETE FROM d1queue_queues WHERE name = ?1", (queue,)),
        ]
    )
    return {"ok": True}


async def flow_seed(
    db: Any,
    n: int,
    groups: int = 0,
    limits: dict[str, Any] | None = None,
    queue: str = FLOW_QUEUE,
) -> dict[str, Any]:
    """`queue` afresh with `n` due jobs in `groups` groups (0: no group),
    as pushes leave them (the groups' tags, the queue marked grouped), and
    `limits` (a PUT body) stored for it, if given."""
    await flow_reset(db, queue)
    b = Binding(db)
    if n:
        await b.run(_SEED_FLOW_JOBS, n, _SEQ[0], queue, groups, NOW_MS - 600_000)
        _SEQ[0] += n
    if groups:
        await b.batch([(_SEED_FLOW_TAGS, (queue,)), (MARK_GROUPED, (queue, NOW_MS))])
    if limits is not None:
        await D1Queue(db).set_limits(queue, Limits.parse(limits))
    return {"ok": True}


async def flow_drain(
    db: Any,
    n: int,
    groups: int = 0,
    limits: dict[str, Any] | None = None,
    query_budget: int = 100,
) -> dict[str, Any]:
    """One drain invocation of FLOW_QUEUE, seeded afresh by `flow_seed`,
    bounded by `query_budget`: `invocation`'s figures, by statement too."""
    await flow_seed(db, n, groups, limits)
    out = await invocation(
        db,
        "d1queue",
        query_budget=query_budget,
        queue=FLOW_QUEUE,
        reuse_prepared=True,  # counted, not timed
        by_statement=True,
    )
    await flow_reset(db)
    return out


async def flow_life(
    db: Any,
    n: int,
    groups: int = 0,
    limits: dict[str, Any] | None = None,
    queue: str = "flow-life",
) -> dict[str, Any]:
    """`n` jobs dispatched one at a time to `queue` (the i-th in group
    i mod `groups`; none with 0), `limits` stored first if given, then
    drained: rows read and written by the pushes and by the drain."""
    await flow_reset(db, queue)
    if limits is not None:
        await D1Queue(db).set_limits(queue, Limits.parse(limits))
    target = InstrumentedD1(db)
    q = D1Queue(target, reservation_s=RESERVATION_S)
    for i in range(n):
        group = f"g{i % groups:05d}" if groups else None
        await q.dispatch("bench.noop", {"i": i}, queue=queue, group=group)
    pushed = _usage(q.binding)
    push_statements = target.by_statement()
    report = await drain(q, REGISTRY, _flow_config(queue))
    total = _usage(q.binding)
    await flow_reset(db, queue)
    return {
        "jobs": n,
        "groups": groups,
        "done": report.completed,
        "rounds": report.rounds,
        "push_queries": pushed["queries"],
        "push_rows_read": pushed["rows_read"],
        "push_rows_written": pushed["rows_written"],
        "push_by_statement": push_statements,
        "drain_queries": total["queries"] - pushed["queries"],
        "drain_rows_read": total["rows_read"] - pushed["rows_read"],
        "drain_rows_written": total["rows_written"] - pushed["rows_written"],
        "rows_written": total["rows_written"],
        "by_statement": target.by_statement(),
    }


async def limited_round(
    db: Any, backlog: int, concurrency: int = 10, queue: str = FLOW_QUEUE
) -> dict[str, Any]:
    """A drain that finds `queue` at its limit: `concurrency` jobs claimed
    by another drain (held, their leases running), `backlog` jobs queued
    behind them. The drain's queries and rows read, by statement."""
    await flow_seed(db, concurrency, 0, {"concurrency": concurrency}, queue)
    other = D1Queue(db, reservation_s=RESERVATION_S)
    flows = (await other.survey()).flows
    held = await other.settle_and_claim((), queue, concurrency, flows=flows)
    if len(held.jobs) != concurrency:
        raise RuntimeError(f"the other drain holds {len(held.jobs)} of {concurrency}")
    if backlog:
        await Binding(db).run(_SEED_FLOW_JOBS, backlog, _SEQ[0], queue, 0, NOW_MS - 600_000)
        _SEQ[0] += backlog
    target = InstrumentedD1(db)
    q = D1Queue(target, reservation_s=RESERVATION_S)
    report = await drain(q, REGISTRY, _flow_config(queue))
    out = {
        "backlog": backlog,
        "held": concurrency,
        "claimed": report.claimed,
        "limited": report.limited,
        "stopped": report.stopped,
        **_usage(q.binding),
        "by_statement": target.by_statement(),
    }
    await flow_reset(db, queue)
    return out


# -- workflows: history, dependencies, batches (migrations/0010_workflows.sql) ------

WF_QUEUE = "wf"
WF_UNKEPT = "wf-unkept"
"""A queue the registry opts out of history (registry.history(q, keep=False))."""
REGISTRY.history(WF_UNKEPT, keep=False)
DAY_MS = 86_400_000


async def wf_reset(db: Any) -> dict[str, Any]:
    """No job, edge, batch or failure left anywhere (the workflow lines own
    the database while they run)."""
    await Binding(db).batch(
        [
            (f"DELETE FROM {t}", ())
            for t in (
                "d1queue_jobs",
                "d1queue_failed_jobs",
                "d1queue_deps",
                "d1queue_batch_parts",
                "d1queue_batches",
            )
        ]
    )
    return {"ok": True}


def _wf_config(queue: str, max_jobs: int = UNCAPPED) -> Config:
    return Config(
        plan="paid",
        max_jobs=max_jobs,
        queues=(queue,),
        time_budget_s=TIME_BUDGET_S,
        query_budget=1000,
        batch_size=BATCH,
        reservation_s=RESERVATION_S,
        stats=False,
    )


async def _prune(db: Any, cutoff: int, limit: int) -> dict[str, Any]:
    """The cron's prune of history (the four statements, one db.batch) of
    what completed before `cutoff`, at most `limit` each: rows read and
    written by statement."""
    target = InstrumentedD1(db)
    b = Binding(target)
    args = (cutoff, limit)
    results = await b.batch(
        [
            (PRUNE_DONE_EDGES, args),
            (PRUNE_DONE, args),
            (PRUNE_BATCH_PARTS, args),
            (PRUNE_BATCHES, args),
        ]
    )
    return {
        "deleted": results[1].changes,
        **_usage(b),
        "by_statement": target.by_statement(),
    }


async def wf_life(db: Any, n: int, history: str) -> dict[str, Any]:
    """`n` jobs pushed one by one then drained, with `history` "off" (the
    queue built with keep_completed False: D1QUEUE_KEEP_COMPLETED_S = 0),
    "opted_out" (keep_completed, the registry opts the queue out) or "kept";
    then the prune of what it kept, once expired. Rows written by the
    pushes, the drain and the prune."""
    await wf_reset(db)
    queue = WF_UNKEPT if history == "opted_out" else WF_QUEUE
    target = InstrumentedD1(db)
    q = D1Queue(target, reservation_s=RESERVATION_S, keep_completed=history != "off")
    for i in range(n):
        await q.dispatch("bench.noop", {"i": i}, queue=queue)
    pushed = _usage(q.binding)
    report = await drain(q, REGISTRY, _wf_config(queue))
    total = _usage(q.binding)
    kept = await Binding(db).run(f"SELECT COUNT(*) AS n FROM d1queue_jobs WHERE band = {DONE_BAND}")
    prune = await _prune(db, cutoff=q.clock() + DAY_MS, limit=n)
    return {
        "jobs": n,
        "done": report.completed,
        "kept": int(kept.rows[0]["n"]),
        "push_rows_written": pushed["rows_written"],
        "drain_rows_written": total["rows_written"] - pushed["rows_written"],
        "drain_rows_read": total["rows_read"] - pushed["rows_read"],
        "rows_written": total["rows_written"],
        "prune_deleted": prune["deleted"],
        "prune_rows_written": prune["rows_written"],
        "prune_rows_read": prune["rows_read"],
        "by_statement": target.by_statement(),
    }


async def wf_dependents(db: Any, k: int, *, keep: bool = True) -> dict[str, Any]:
    """A job with `k` dependents (each waiting for it alone) completes: the
    rows its settle reads and writes (the triggers' included), and how many
    dependents it released."""
    await wf_reset(db)
    q = D1Queue(db, reservation_s=RESERVATION_S, keep_completed=keep)
    dep = q.new_job("bench.noop", None, queue=WF_QUEUE)
    await q.push(dep)
    waiters = [q.new_job("bench.noop", None, queue=WF_QUEUE, after=[dep.id]) for _ in range(k)]
    for i in range(0, k, 25):
        await q.push_many(waiters[i : i + 25])
    job = await q.reserve(WF_QUEUE)
    if job is None or job.id != dep.id:
        raise RuntimeError(f"reserved {job and job.id}, not the dependency {dep.id}")
    target = InstrumentedD1(db)
    mq = q.derive(binding=Binding(target))
    landed = await mq.complete(job)
    released = await Binding(db).run(
        f"SELECT COUNT(*) AS n FROM d1queue_jobs WHERE queue = ?1 AND band > {LOCKED_BAND} "
        "AND waiting = 0",
        WF_QUEUE,
    )
    return {
        "dependents": k,
        "landed": landed,
        "released": int(released.rows[0]["n"]),
        **_usage(mq.binding),
        "by_statement": target.by_statement(),
    }


async def wf_waiting_claim(db: Any, waiting: int, *, keep: bool = True) -> dict[str, Any]:
    """One claim round of 25 and their settles on a queue of 1,000 ready jobs
    and `waiting` jobs waiting for others (claim_cost, with history kept)."""
    await wf_reset(db)
    await seed_jobs(db, due=1000, waiting=waiting)
    out = await claim_cost(db, keep=keep)
    await seed_jobs(db)
    return out


async def wf_batch_last(db: Any, size: int) -> dict[str, Any]:
    """A batch of `size` jobs with on_success and on_finish: all but one
    drained, then the last one's settle, which finishes the batch and
    enqueues both callbacks: its rows read and written."""
    await wf_reset(db)
    q = D1Queue(db, reservation_s=RESERVATION_S, keep_completed=True)
    jobs = [q.new_job("bench.noop", {"i": i}, queue=WF_QUEUE) for i in range(size)]
    batch_id, _ = await q.batch(
        jobs,
        on_success=q.new_job("bench.noop", None, queue=WF_QUEUE),
        on_finish=q.new_job("bench.noop", None, queue=WF_QUEUE),
    )
    report = await drain(q, REGISTRY, _wf_config(WF_QUEUE, max_jobs=size - 1))
    job = await q.reserve(WF_QUEUE)
    if report.completed != size - 1 or job is None or job.batch != batch_id:
        raise RuntimeError(f"drained {report.completed} of {size}; then {job}")
    target = InstrumentedD1(db)
    mq = q.derive(binding=Binding(target))
    await mq.complete(job)
    batch = await q.workflows.batch(batch_id)
    callbacks = await Binding(db).run(
        "SELECT COUNT(*) AS n FROM d1queue_jobs WHERE id IN (?1, ?2)",
        f"{batch_id}:on_success",
        f"{batch_id}:on_finish",
    )
    return {
        "size": size,
        "state": batch and batch.state,
        "callbacks": int(callbacks.rows[0]["n"]),
        **_usage(mq.binding),
        "by_statement": target.by_statement(),
    }


async def wf_prune(db: Any, expired: int, young: int, limit: int = 2_000) -> dict[str, Any]:
    """History of `young` jobs completed an hour ago and `expired` two days
    ago (kept one day), over two queues; 1,000 ready jobs beside: one prune
    of at most `limit`, its rows read and written by statement."""
    await wf_reset(db)
    b = Binding(db)
    for queue, n, at in (
        (WF_QUEUE, young // 2, NOW_MS - 3_600_000),
        (BACKLOG_QUEUE, young - young // 2, NOW_MS - 3_600_000),
        (WF_QUEUE, expired // 2, NOW_MS - 2 * DAY_MS),
        (BACKLOG_QUEUE, expired - expired // 2, NOW_MS - 2 * DAY_MS),
    ):
        if n:
            prefix = f"x{at}"
            await b.run(_SEED_JOBS, n, prefix, queue, 1, DONE_BAND, at, 0, None, None)
    await b.run(_SEED_JOBS, 1000, "r", WF_QUEUE, 1, None, NOW_MS - 100_000, 0, None, None)
    out = await _prune(db, cutoff=NOW_MS - DAY_MS, limit=limit)
    left = await b.run(f"SELECT COUNT(*) AS n FROM d1queue_jobs WHERE band = {DONE_BAND}")
    await wf_reset(db)
    return {"expired": expired, "young": young, "left": int(left.rows[0]["n"]), **out}
