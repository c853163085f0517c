"""D1's API over a real SQLite database (SqliteD1), with d1queue's schema
applied as wrangler applies it: the binding the CPython suite and the test
kit (interfaces/testing.py) run on, and its synchronous reads of what a
database holds, for a test's assertions.

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
from pathlib import Path
from typing import Any

from ..core.bounds import MAX_SAFE_INT, json_loads
from ..core.job import QueuedJob
from .failed import FailedJob
from .rows import row_to_job
from .sql import DONE_BAND, LIVE


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
        return self._fault(match, message, times, after_commit=False)

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
        return self._fault(match, message, times, after_commit=True)

    def _fault(
        self,
        match: str | Callable[[str], bool],
        message: str,
        times: int | None,
        after_commit: bool,
    ) -> Fault:
        pred = (lambda s: match in s) if isinstance(match, str) else match
        fault = Fault(pred, message, times, after_commit)
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


# What a database holds, read for a test's assertions: every row of a table
# (a scan, which no statement sql.py sends may be), through SqliteD1.query
# alone, never sent to D1.
_EVERY_QUEUED_JOB = f"SELECT * FROM d1queue_jobs WHERE {LIVE} ORDER BY created_at, id"
_EVERY_COMPLETED_JOB = (
    f"SELECT * FROM d1queue_jobs WHERE band = {DONE_BAND} ORDER BY available_at, id"
)
_EVERY_FAILED_JOB = "SELECT * FROM d1queue_failed_jobs ORDER BY failed_at, id"


def queued_jobs(db: SqliteD1) -> list[QueuedJob]:
    """The jobs `db` holds waiting or running, oldest first."""
    return [row_to_job(r) for r in db.query(_EVERY_QUEUED_JOB)]


def completed_jobs(db: SqliteD1) -> list[Any]:
    """The completed jobs `db` keeps, oldest completion first, each with
    `result`: its handler's return value (None when it returned nothing)."""
    out = []
    for r in db.query(_EVERY_COMPLETED_JOB):
        job = row_to_job(r)
        job.result = json_loads(r["result"]) if r["result"] is not None else None  # type: ignore[attr-defined]
        out.append(job)
    return out


def failed_jobs(db: SqliteD1) -> list[FailedJob]:
    """The failed jobs `db` holds, oldest failure first; each `payload` is
    the stored JSON text."""
    return [FailedJob.of(r) for r in db.query(_EVERY_FAILED_JOB)]
