"""A test kit for users: SqliteD1, the D1 binding's API over a real SQLite
database, with d1queue's schema; a job run by name as the drain runs it; a
Kit whose clock moves only when the test says so; what was enqueued and
what failed. docs/testing.md describes it, and the pytest plugin
(pytest_plugin.py) that hands it to tests as fixtures.

Test your own handlers and Worker code with it under plain CPython::

    from d1queue.testing import Kit

    kit = Kit(registry)                   # SQLite with the migrations wrangler applies
    outcome = await kit.run_job("mail.send", {"to": "ada@example.com"})
    assert outcome.action == "complete"
    await kit.dispatch("mail.send", {"to": "ada@example.com"}, delay_s=60)
    kit.advance(60)
    assert (await kit.run_due()).completed == 1

SqliteD1 behaves as D1 does where that matters to a queue: `batch()` is one
transaction; `exec()` runs each line as its own statement; values D1 refuses
(undefined-like objects, ints beyond 2^53, dicts, lists) are refused with D1's
message; every call yields to the event loop first, so coroutines sharing it
interleave as concurrent Workers' queries do. Several SqliteD1 objects on one
file are several Workers sharing one database. `fail_when()` makes chosen
statements fail, for fault tests.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Unpack

from ..core.bounds import MAX_SAFE_INT, json_loads
from ..core.config import Config
from ..core.context import Fetch
from ..core.job import QueuedJob, now_ms, row_to_job
from ..core.limits import PLANS, Meter
from ..core.outcomes import Outcome
from ..core.registry import Overrides, Registry
from ..features.drain import Budget, Drain, DrainReport, drain, leased
from ..store.failed import FailedJob
from ..store.queue import DONE_BAND, D1Queue


def _migrations() -> Path:
    package = Path(__file__).resolve().parents[1]  # d1queue/
    shipped = package / "migrations"  # in the wheel
    return shipped if shipped.is_dir() else package.parents[1] / "migrations"


MIGRATIONS = _migrations()
"""d1queue's migrations: the wheel ships them inside the package
(`d1queue/migrations`); a checkout of this repository has them at its top,
in `migrations/`, where `wrangler d1 migrations apply` finds them."""


class D1Error(Exception):
    """What a failing D1 call raises; the message starts like D1's own
    (`D1_ERROR: …`, `D1_TYPE_ERROR: …`, `D1_EXEC_ERROR: …`)."""


class Row(dict[str, Any]):
    """A result row (or result) allowing `row["x"]` and `row.x`, as the
    `workers` SDK's JsDict does."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _check_value(value: Any) -> Any:
    if value is None or isinstance(value, str | float | bytes):
        return value
    if isinstance(value, bool):
        return int(value)  # D1 stores booleans as 1/0
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INT:
            # In a Worker this int becomes a JS BigInt, which D1 refuses.
            raise D1Error(f"D1_TYPE_ERROR: Type 'bigint' not supported for value '{value}'")
        return value
    kind = "object" if isinstance(value, dict | list | tuple) else type(value).__name__
    raise D1Error(f"D1_TYPE_ERROR: Type '{kind}' not supported for value '{value!r}'")


class Fault:
    """A rule making matching statements raise, `times` times (None: always);
    `after_commit`: the call commits, then raises, as when D1's reply is lost."""

    def __init__(
        self,
        match: Callable[[str], bool],
        message: str,
        times: int | None,
        after_commit: bool = False,
    ) -> None:
        self.match, self.message, self.times = match, message, times
        self.after_commit = after_commit

    def fire(self, sql: str) -> None:
        if self.times == 0 or not self.match(sql):
            return
        if self.times is not None:
            self.times -= 1
        raise D1Error(self.message)


class SqliteStatement:
    """A prepared statement; `bind()` returns a new one, as D1's does."""

    def __init__(self, db: SqliteD1, sql: str, params: tuple[Any, ...] = ()) -> None:
        self._db, self.sql, self.params = db, sql, params

    def bind(self, *values: Any) -> SqliteStatement:
        return SqliteStatement(self._db, self.sql, tuple(_check_value(v) for v in values))

    async def all(self) -> Row:
        await asyncio.sleep(0)
        result = self._db._execute_one(self.sql, self.params)
        self._db._lose_reply([self.sql])
        return result

    run = all  # D1: run() is an alias of all()

    async def first(self, column: str | None = None) -> Any:
        rows = (await self.all())["results"]
        if not rows:
            return None
        return rows[0] if column is None else rows[0][column]

    async def raw(self, columnNames: bool = False) -> list[list[Any]]:
        await asyncio.sleep(0)
        cur = self._db._cursor(self.sql, self.params)
        rows = [list(r) for r in cur.fetchall()]
        if columnNames:
            rows.insert(0, [d[0] for d in cur.description or ()])
        return rows


class SqliteD1:
    """A D1Database over sqlite3. `path` ":memory:" is private to this object;
    a file path can be shared by several objects, like one D1 by many Workers."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        # Autocommit (isolation_level=None): each statement is its own
        # transaction, as on D1, and batch() opens one explicitly.
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA busy_timeout = 5000")
        self._faults: list[Fault] = []
        self.statements: list[str] = []
        """Every statement run, in order: what a test can assert about."""
        self.vm_steps = 0
        """SQLite VM instructions run since `count_vm_steps()`: a deterministic
        measure of the work a statement did, for tests of how it scales."""

    def count_vm_steps(self, on: bool = True) -> None:
        """Count every SQLite VM instruction into `vm_steps` (from 0), or stop.
        Slow (a Python call per instruction): for tests, not benches."""
        self.vm_steps = 0

        def step() -> int:
            self.vm_steps += 1
            return 0

        self._conn.set_progress_handler(step if on else None, 1)

    # -- D1's API ---------------------------------------------------------

    def prepare(self, sql: str) -> SqliteStatement:
        return SqliteStatement(self, sql)

    async def batch(self, statements: Sequence[SqliteStatement]) -> list[Row]:
        await asyncio.sleep(0)
        if not isinstance(statements, list | tuple):
            raise D1Error("D1_ERROR: batch() expects an array of prepared statements")
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            results = [self._execute_one(s.sql, s.params) for s in statements]
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        self._lose_reply([s.sql for s in statements])
        return results

    async def exec(self, sql: str) -> Row:
        """As D1: each line is one statement, so a statement spread over
        several lines fails."""
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        count = 0
        for line in sql.split("\n"):
            if line.strip():
                self._execute_one(line, (), exec_=True)
                count += 1
        return Row(count=count, duration=(time.perf_counter() - t0) * 1000)

    # -- test helpers --------------------------------------------------------

    def fail_when(
        self,
        match: str | Callable[[str], bool],
        message: str = "D1_ERROR: injected fault",
        *,
        times: int | None = 1,
    ) -> Fault:
        """Make statements whose SQL contains `match` (or for which it returns
        True) raise D1Error(message), the next `times` times (None: always).
        Inside a batch the whole batch rolls back, as on D1."""
        pred = (lambda s: match in s) if isinstance(match, str) else match
        fault = Fault(pred, message, times)
        self._faults.append(fault)
        return fault

    def lose_reply_when(
        self,
        match: str | Callable[[str], bool],
        message: str = "D1_ERROR: Network connection lost.",
        *,
        times: int | None = 1,
    ) -> Fault:
        """Make calls (a statement or a batch) holding a statement whose SQL
        contains `match` commit and then raise D1Error(message), the next
        `times` times: the write landed but its reply was lost."""
        pred = (lambda s: match in s) if isinstance(match, str) else match
        fault = Fault(pred, message, times, after_commit=True)
        self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        self._faults.clear()

    def apply_migrations(self, directory: str | Path = MIGRATIONS) -> list[str]:
        """Apply the `*.sql` files of `directory` not yet applied, in name
        order, recording them in `d1_migrations` as wrangler does; returns the
        names applied."""
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS d1_migrations (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "name TEXT UNIQUE, applied_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP NOT NULL)"
        )
        done = {r[0] for r in self._conn.execute("SELECT name FROM d1_migrations")}
        applied = []
        for path in sorted(Path(directory).glob("*.sql")):
            if path.name in done:
                continue
            self._conn.executescript(
                f"BEGIN;\n{path.read_text()}\n;INSERT INTO d1_migrations (name) VALUES "
                f"('{path.name}');\nCOMMIT;"
            )
            applied.append(path.name)
        return applied

    def query(self, sql: str, *params: Any) -> list[Row]:
        """Synchronous read for test assertions (not part of D1's API)."""
        return [Row(r) for r in self._conn.execute(sql, params).fetchall()]

    def close(self) -> None:
        self._conn.close()

    # -- internals ------------------------------------------------------------

    def _cursor(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        self.statements.append(sql)
        for fault in self._faults:
            if not fault.after_commit:
                fault.fire(sql)
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise D1Error(f"D1_ERROR: {exc}: SQLITE_ERROR") from exc

    def _lose_reply(self, sqls: Sequence[str]) -> None:
        for fault in self._faults:
            if fault.after_commit:
                for sql in sqls:
                    fault.fire(sql)

    def _execute_one(self, sql: str, params: tuple[Any, ...], exec_: bool = False) -> Row:
        t0 = time.perf_counter()
        before = self._conn.total_changes
        try:
            cur = self._cursor(sql, params)
        except D1Error as exc:
            if exec_:
                raise D1Error(f"D1_EXEC_ERROR: Error in line: {sql}: {exc}") from exc
            raise
        rows = [Row(r) for r in cur.fetchall()]
        changed = self._conn.total_changes - before
        is_write = re.match(r"\s*(INSERT|UPDATE|DELETE|REPLACE)\b", sql, re.I) is not None
        meta = Row(
            changes=changed if is_write else 0,
            last_row_id=cur.lastrowid or 0,
            changed_db=changed > 0,
            duration=(time.perf_counter() - t0) * 1000,
            size_after=0,
        )
        return Row(success=True, meta=meta, results=rows)


def database(path: str | Path = ":memory:") -> SqliteD1:
    """A SqliteD1 with d1queue's schema applied, as wrangler applies it."""
    db = SqliteD1(path)
    db.apply_migrations(MIGRATIONS)
    return db


async def run_job(
    registry: Registry,
    name: str,
    payload: Any = None,
    *,
    db: SqliteD1 | None = None,
    env: Any = None,
    fetch: Fetch | None = None,
    attempt: int = 1,
    config: Config | None = None,
    clock: Callable[[], int] = now_ms,
) -> Outcome:
    """Run job `name`'s attempt number `attempt` once, as a drain on
    `config` (default Config()) would, and return the outcome without
    storing it: `action` is "complete", "retry" (after `delay_s`: the
    handler's Retry delay, else the job's backoff) or "fail", with the
    `error`. Follow-up jobs the handler dispatches go to `db` (default: a
    fresh database), where `enqueued` finds them.

    It is the drain's own per-job step (`Drain.run_job`), not a copy of it:
    the job's ctx is the drain's DrainContext, metered by the subrequests the
    job declares (one call more is refused with SubrequestLimitExceeded and
    the attempt retried), its fetch under `config`'s outbound rules
    (http_allow, http_services) whatever `fetch` is given; the timeout, Retry,
    Fail and the last attempt failing are the drain's `_call` and the rules
    of core/outcomes.py. The payload is read back from its JSON, as a
    claim reads it, and a lease too short for the registry's longest timeout
    is refused as `drain` refuses it."""
    config = config or Config()
    if registry.get(name) is None:
        raise KeyError(f"no job is registered under the name {name!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt!r}")
    queue = leased(
        D1Queue(db if db is not None else database(), registry=registry, clock=clock),
        registry,
        config,
    )
    job = queue.new_job(name, payload)  # the job's declared defaults, validated as dispatch does
    # A handler never sees the caller's object: a claim decodes the stored
    # JSON, so a tuple arrives as a list and a shared dict is not shared.
    job.payload = json_loads(job.payload_json())
    job.attempts = attempt  # a claim counts the attempt before the handler runs
    state = Drain(
        queue,
        registry,
        Budget.of(config, queue.reservation_s),
        Meter.for_plan(PLANS[config.plan]),
        env=env,
        fetch=fetch,
        outbound=config.outbound,
    )
    return await state.run_job(job)


def enqueued(db: SqliteD1, name: str | None = None, queue: str | None = None) -> list[QueuedJob]:
    """The jobs queued in `db` (those of job `name`, on `queue`, if given),
    oldest first: what a test asserts was dispatched."""
    rows = db.query(f"SELECT * FROM d1queue_jobs WHERE band > {DONE_BAND} ORDER BY created_at, id")
    jobs = [row_to_job(r) for r in rows]
    return [j for j in jobs if (name is None or j.name == name) and (queue in (None, j.queue))]


def completed(db: SqliteD1, name: str | None = None, queue: str | None = None) -> list[Any]:
    """The completed jobs kept in `db` (those of job `name`, on `queue`, if
    given), oldest completion first, each with `result`: its handler's return
    value (None when it returned nothing)."""
    rows = db.query(
        f"SELECT * FROM d1queue_jobs WHERE band = {DONE_BAND} ORDER BY available_at, id"
    )
    out = []
    for r in rows:
        job = row_to_job(r)
        job.result = json_loads(r["result"]) if r["result"] is not None else None  # type: ignore[attr-defined]
        out.append(job)
    return [j for j in out if (name is None or j.name == name) and (queue in (None, j.queue))]


def failed(db: SqliteD1, name: str | None = None, queue: str | None = None) -> list[FailedJob]:
    """The failed jobs in `db` (those of job `name`, on `queue`, if given),
    oldest failure first; each `payload` is the stored JSON text."""
    rows = db.query("SELECT * FROM d1queue_failed_jobs ORDER BY failed_at, id")
    jobs = [FailedJob.of(r) for r in rows]
    return [j for j in jobs if (name is None or j.name == name) and (queue in (None, j.queue))]


class Clock:
    """Epoch milliseconds, as `D1Queue(clock=...)` reads them, that move only
    when a test says so: from the wall clock's time when made (or `ms`)."""

    def __init__(self, ms: int | None = None) -> None:
        self.ms = now_ms() if ms is None else ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        """Move on `seconds` (not back: a claim's lease and a job's delay are
        measured forward, and a clock going back would resurrect neither)."""
        if not seconds >= 0:  # NaN too
            raise ValueError(f"the clock moves forward only, got {seconds!r}")
        self.ms += round(seconds * 1000)


RUN_DUE_LIMIT = 100
"""The most drains `Kit.run_due` runs at one clock time: a job that always
queues another due at once would otherwise keep it draining for ever."""


class Kit:
    """A registry's jobs on a database and a clock of their own: queue jobs,
    run them by name or drain what is due, move the clock to see a retry's
    backoff or a delayed job come due, without sleeping.

    Every drain and job run uses `config` (default Config(): the free plan's
    caps, every queue), `env` and `fetch` (ctx.env and the Worker's fetch
    behind ctx.fetch; the outbound rules of `config` apply to it)."""

    def __init__(
        self,
        registry: Registry,
        *,
        db: SqliteD1 | None = None,
        clock: Clock | None = None,
        config: Config | None = None,
        env: Any = None,
        fetch: Fetch | None = None,
    ) -> None:
        self.registry = registry
        self.db = db if db is not None else database()
        self.clock = clock if clock is not None else Clock()
        self.config = config or Config()
        self.env = env
        self.fetch = fetch
        self.queue = D1Queue(
            self.db,
            registry=registry,
            clock=self.clock,
            keep_completed=self.config.keep_completed_s > 0,
        )
        """The D1Queue on this kit's database and clock."""

    async def dispatch(self, name: str, payload: Any = None, **overrides: Unpack[Overrides]) -> str:
        """Queue a job now (by the kit's clock): `D1Queue.dispatch`."""
        return await self.queue.dispatch(name, payload, **overrides)

    async def run_job(self, name: str, payload: Any = None, *, attempt: int = 1) -> Outcome:
        """`run_job` on this kit's database, clock, config, env and fetch:
        the outcome of one attempt, not stored; its follow-ups are queued."""
        return await run_job(
            self.registry,
            name,
            payload,
            db=self.db,
            env=self.env,
            fetch=self.fetch,
            attempt=attempt,
            config=self.config,
            clock=self.clock,
        )

    def advance(self, seconds: float) -> None:
        """Move the clock on `seconds`."""
        self.clock.advance(seconds)

    def advance_to_next(self) -> float:
        """Move the clock to when the next queued job comes due (a backoff's
        jitter makes it hard to know); the seconds it moved, 0 when a job is
        due already or none is queued."""
        times = [j.available_at for j in self.enqueued()]
        step = max(0, min(times, default=0) - self.clock.ms)
        self.clock.ms += step
        return step / 1000

    async def run_due(self) -> DrainReport:
        """Drain what is due at the clock's time, through `drain`, as
        successive cron runs would, until one claims nothing: the follow-ups
        they queue included, a retry's next attempt once its delay has
        passed on the clock. The reports summed. RuntimeError if jobs are
        still being claimed after RUN_DUE_LIMIT drains."""
        reports: list[DrainReport] = []
        for _ in range(RUN_DUE_LIMIT):
            report = await drain(
                self.queue, self.registry, self.config, env=self.env, fetch=self.fetch
            )
            reports.append(report)
            if report.claimed == 0:
                return _summed(reports)
        raise RuntimeError(
            f"jobs were still due after {RUN_DUE_LIMIT} drains at one clock time: "
            "does a job queue another, due at once, every time it runs?"
        )

    def enqueued(self, name: str | None = None, queue: str | None = None) -> list[QueuedJob]:
        """The jobs queued (due or not), oldest first: `enqueued`."""
        return enqueued(self.db, name, queue)

    def completed(self, name: str | None = None, queue: str | None = None) -> list[Any]:
        """The completed jobs kept, oldest first, each with its `result`."""
        return completed(self.db, name, queue)

    def failed(self, name: str | None = None, queue: str | None = None) -> list[FailedJob]:
        """The failed jobs, oldest failure first: `failed`."""
        return failed(self.db, name, queue)


def _summed(reports: list[DrainReport]) -> DrainReport:
    """Several drains' reports as one: counts added, lists joined; the last
    run's `stopped` and `paused`, the first `error`."""
    total = DrainReport()
    for report in reports:
        for f in fields(DrainReport):
            value = getattr(report, f.name)
            if isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                setattr(total, f.name, getattr(total, f.name) + value)
        total.unsettled += report.unsettled
        total.error = total.error or report.error
    total.elapsed_s = round(total.elapsed_s, 3)
    total.stopped, total.paused = reports[-1].stopped, reports[-1].paused
    return total
