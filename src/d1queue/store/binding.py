"""The one place that calls a D1 binding.

The same driver code meets three kinds of binding: the `workers` SDK's
wrapper, a raw binding seen through Pyodide (JsProxy objects, None sent as
`undefined`, which D1 rejects), and SqliteD1 in CPython tests. The SDK's
wrapper is set aside for the JS binding it wraps, which costs a fraction of
the CPU per statement. Everything above this module sees plain `Result`s.
It also counts what was sent, against the invocation's subrequest meter and
for the benchmarks, and caps D1 calls in flight at the platform's six.

On a JS binding every crossing between Python and JavaScript costs CPU (the
free plan allows 10 ms per invocation), so the hot path crosses a constant
number of times per batch rather than per statement or per value: a SQL text
is prepared once per Binding (D1's `bind()` returns a new statement and
leaves the prepared one as it was: workerd d1-api.ts), a batch's parameters
cross as one JSON text that `JSON.parse` turns into JS values (JSON null is
the SQL NULL a raw binding needs) and are bound by one `Array.map` per run
of statements sharing a SQL text, and the results come back as one JSON
text (D1 itself sent them as JSON, so nothing is lost) for `json.loads`.
A batch's `meta` crosses without the parts nobody reads (a JSON.stringify
allowlist): most of a settle or claim batch's text was `meta` the driver
never looked at. Rows cross on their own, as lists of values where the
caller knows the columns (`positional`): no column names to carry and hash.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ..core.bounds import MAX_SAFE_INT, json_loads
from ..core.d1_faults import is_transient
from ..core.limits import Meter, Slots
from .sql import name_of

Statement = tuple[str, Sequence[Any]]

MAX_IN_FLIGHT = 6
"""D1 allows six simultaneous connections per invocation; more are queued by
the platform, where they still count against the wall-time budget unseen."""


def was_resent(exc: BaseException) -> bool:
    """Whether `exc` answered a re-send (see Result.resent): the first send
    may have committed what the re-send then collided with."""
    return bool(getattr(exc, "d1queue_resent", False))


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for transient D1 errors."""

    tries: int = 5
    base_s: float = 0.1
    cap_s: float = 3.0

    def delay_s(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))


@dataclass(slots=True)
class Result:
    """One statement's outcome, as plain Python."""

    rows: list[Any]
    """Dicts by column name; lists of values in column order for a
    `positional` read."""
    changes: int = 0
    last_row_id: int | None = None
    rows_read: int = 0
    rows_written: int = 0
    resent: bool = False
    """This answer is to a re-send, after an error that may have come after
    the first send committed: `changes == 0` may mean "already done by us"."""


_rows_read = attrgetter("rows_read")
_rows_written = attrgetter("rows_written")


@dataclass(frozen=True, slots=True)
class Call:
    """One round trip as a trace keeps it: its statements' names (sql.py's,
    in order), the seconds it took, retries included, and D1's row counts."""

    names: tuple[str, ...]
    seconds: float
    rows_read: int
    rows_written: int


@dataclass
class Usage:
    """What a binding has been sent so far. `queries` counts round trips (a
    batch is one); `statements` counts every statement, batched or not, since
    D1 does not document which of the two its per-invocation cap counts.
    `by_name` counts statements by their name in sql.py; `trace`, once set
    to a list, gets a Call per round trip (None: nothing kept)."""

    queries: int = 0
    statements: int = 0
    rows_read: int = 0
    rows_written: int = 0
    seconds: float = 0.0
    by_name: Counter[str] = field(default_factory=Counter)
    trace: list[Call] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "queries": self.queries,
            "statements": self.statements,
            "rows_read": self.rows_read,
            "rows_written": self.rows_written,
        }


@functools.cache
def _pyodide_ffi() -> Any:
    """pyodide.ffi inside Pyodide; None under CPython, where it does not exist."""
    if sys.platform == "emscripten":
        return importlib.import_module("pyodide.ffi")
    return None


def _is_js(value: Any) -> bool:
    ffi = _pyodide_ffi()
    return ffi is not None and isinstance(value, ffi.JsProxy)


def _field(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _plain(value: Any) -> Any:
    """A JS value (JsProxy) converted to Python; anything else unchanged."""
    to_py = getattr(value, "to_py", None) if _is_js(value) else None
    return to_py() if to_py is not None else value


def _null_to_none(row: dict[str, Any]) -> dict[str, Any]:
    """Pyodide converts JS null to `jsnull`, not None; SQL NULL should read
    as None whichever binding returned it."""
    ffi = _pyodide_ffi()
    null = getattr(ffi, "jsnull", None) if ffi is not None else None
    if null is None:
        return row
    return {k: (None if v is null else v) for k, v in row.items()}


_WRITE_VERBS = ("INSERT", "UPDATE", "DELETE", "REPLACE")


@functools.lru_cache(maxsize=256)
def returns_no_rows(sql: str) -> bool:
    """Whether `sql` is a write that cannot return rows (no RETURNING): its
    result is `meta` and an empty `results`, whatever it matched."""
    head = sql.lstrip().upper()
    return head.startswith(_WRITE_VERBS) and "RETURNING" not in head


def _reading(statements: Sequence[Statement]) -> list[int]:
    """The positions of the statements that may return rows."""
    out = []
    last = None
    reads = False
    for i, (sql, _) in enumerate(statements):
        if sql is not last:
            last = sql
            reads = not returns_no_rows(sql)
        if reads:
            out.append(i)
    return out


META_KEYS = ("meta", "changes", "last_row_id", "rows_read", "rows_written")
"""What the driver reads of a statement's result besides its rows:
JSON.stringify's allowlist for a batch's results (an allowlist applies at
every depth, so rows, where a statement has them, cross on their own)."""


def _result(raw: Any) -> Result:
    raw = _plain(raw)
    meta = _plain(_field(raw, "meta")) or {}
    rows = [_null_to_none(dict(_plain(r))) for r in (_plain(_field(raw, "results")) or [])]
    return Result(
        rows=rows,
        changes=int(_field(meta, "changes") or 0),
        last_row_id=_field(meta, "last_row_id"),
        rows_read=int(_field(meta, "rows_read") or 0),
        rows_written=int(_field(meta, "rows_written") or 0),
    )


def _decode(raw: Mapping[str, Any]) -> Result:
    """One statement's result, already plain Python (parsed from JSON)."""
    meta = raw.get("meta") or {}
    return Result(
        raw.get("results") or [],
        int(meta.get("changes") or 0),
        meta.get("last_row_id"),
        int(meta.get("rows_read") or 0),
        int(meta.get("rows_written") or 0),
    )


def _decode_metas(parsed: list[Any]) -> list[Result]:
    """Results from `[{"meta": {...}}, ...]` (the META_KEYS allowlist's text,
    parsed), rows left empty: one comprehension, not a call per statement.
    A result missing a key (a binding reporting no rows_read, say) takes
    `_decode`, which makes the same Result from whatever it has."""
    try:
        return [
            Result(
                [],
                m["changes"] or 0,
                m.get("last_row_id"),
                m["rows_read"] or 0,
                m["rows_written"] or 0,
            )
            for m in [r["meta"] for r in parsed]
        ]
    except (KeyError, TypeError):
        return [_decode(r) for r in parsed]


def _blobs_to_bytes(results: list[dict[str, Any]]) -> None:
    """D1 returns a BLOB as an array of byte values; SQLite has no array
    type, so every list in a row is a BLOB, read as bytes as SqliteD1 (and
    sqlite3) does."""
    for result in results:
        for row in result.get("results") or ():
            for key, value in row.items():
                if type(value) is list:
                    row[key] = bytes(value)


_dumps = json.JSONEncoder(separators=(",", ":")).encode
"""Compact json.dumps, its encoder made once (json.dumps builds one per call
when given separators)."""


def _json_params(params: Sequence[Any]) -> list[Any] | None:
    """`params` as JSON-ready values that JSON.parse turns into exactly what a
    per-value conversion would bind, or None when one needs that conversion:
    an int past MAX_SAFE_INT (Pyodide sends it as a BigInt, which D1 refuses
    with its own D1_TYPE_ERROR, and JSON would round it silently), NaN or
    infinity, or any type D1 does not take. bytes become D1's own blob form,
    an array of byte values."""
    out = list(params)
    for i, v in enumerate(out):
        t = type(v)
        if t is str or v is None or t is bool:
            continue
        if t is int:
            if -MAX_SAFE_INT <= v <= MAX_SAFE_INT:
                continue
            return None
        if t is float:
            if v - v == 0.0:  # finite: NaN and infinities give NaN here
                continue
            return None
        if t is bytes or t is bytearray:
            out[i] = list(v)
            continue
        return None
    return out


_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})
"""Value types JSON carries to JS as a per-value conversion would bind them,
ints only once their digits are known to be few (_has_long_number)."""

_DIGITS_AS_NINES = str.maketrans("0123456789", "9" * 10)
_LONG_RUN = "9" * 16


def _has_long_number(text: str) -> bool:
    """Whether `text` (ASCII JSON) has sixteen digits in a row: maybe an int
    past MAX_SAFE_INT (16 digits), which JSON.parse would round. Every int of
    15 digits or fewer is within ±MAX_SAFE_INT; a match (also one inside a
    string) only sends the batch down the checked path. str.translate and
    `in` rather than a regex: `\\d{16}` took ~150 µs on a claim batch's text
    in CPython, this ~9 µs."""
    return _LONG_RUN in text.translate(_DIGITS_AS_NINES)


_dumps_strict = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""Compact, and refusing NaN and infinities (which JSON cannot carry)."""


def _plain_runs(statements: Sequence[Statement]) -> tuple[list[str], list[list[Any]]] | None:
    """The batch as runs of one SQL text (the texts, and each run's lists of
    values) when every value is a str, int, float, bool or None of exactly
    that type, else None. The types are gathered by C (set.update over map),
    not a Python loop per value: a settle or claim batch has ~125 values and
    this is a per-round cost."""
    types: set[type] = set()
    sqls: list[str] = []
    groups: list[list[Any]] = []
    last = None
    for sql, params in statements:
        types.update(map(type, params))
        if sql == last:
            groups[-1].append(params)
        else:
            sqls.append(sql)
            groups.append([params])
            last = sql
    if not types <= _PLAIN_TYPES:
        return None
    return sqls, groups


class Binding:
    """A D1 binding behind a small, counted, plain-Python interface."""

    def __init__(
        self,
        db: Any,
        *,
        max_in_flight: int = MAX_IN_FLIGHT,
        retry: RetryPolicy = RetryPolicy(),
        meter: Meter | None = None,
    ) -> None:
        underneath = getattr(db, "_binding", None)
        if not _is_js(db) and _is_js(underneath):
            # The workers SDK's wrapper converts every value and result through
            # Python (0.37-0.58 ms of CPU per statement, measured in Pyodide;
            # the free plan allows 10 ms per invocation). The JS binding under
            # it does the same work for ~0.01 ms once None is sent as null and
            # a batch as a JS Array, which this class does for raw bindings.
            db = underneath
        self.db = db
        self.retry = retry
        self.meter = meter
        """Counts every send, retries included, against the invocation's
        subrequest caps (None: unmetered, as in tests and tools)."""
        self.retried = 0
        """How many sends were repeated after a transient error."""
        self.usage = Usage()
        self._raw = _is_js(db)
        self._null: Any = None
        self._prepared: dict[str, Any] = {}
        """SQL text -> the JS statement prepared from it, reused for every
        bind (bind() copies; the prepared statement never changes)."""
        self._binders: dict[str, Any] = {}
        """SQL text -> a JS function binding an array of values to it."""
        if self._raw:
            # A raw binding turns Python None into JS undefined, which D1
            # rejects (D1_TYPE_ERROR); JS null is what it stores as NULL.
            ffi = _pyodide_ffi()
            self._null = ffi.jsnull
            js = importlib.import_module("js")
            self._to_js = ffi.to_js
            self._parse = js.JSON.parse
            self._stringify = js.JSON.stringify
            self._apply = js.Function.prototype.apply
            # Array methods as plain functions: one crossing a call instead of
            # an attribute lookup on the proxy and then the call.
            call = js.Function.prototype.call
            self._map = call.bind(js.Array.prototype.map)
            self._concat = call.bind(js.Array.prototype.concat)
            self._meta_keys = self._to_js(list(META_KEYS))
            self._values = js.Object.values
        self._slots = Slots(max_in_flight)

    def _prepare(self, sql: str, params: Sequence[Any]) -> Any:
        if not self._raw:
            stmt = self.db.prepare(sql)
            return stmt.bind(*params) if params else stmt
        stmt = self._statement(sql)
        if not params:
            return stmt
        return stmt.bind(*(self._js_value(v) for v in params))

    def _js_value(self, value: Any) -> Any:
        """One value for a raw binding's bind(): None as JS null (not
        undefined, which D1 refuses), bytes as a Uint8Array (a PyProxy of
        bytes is no type D1 takes); the rest as Pyodide converts it."""
        if value is None:
            return self._null
        if isinstance(value, bytes | bytearray | memoryview):
            return self._to_js(bytes(value))
        return value

    def _statement(self, sql: str) -> Any:
        stmt = self._prepared.get(sql)
        if stmt is None:
            stmt = self._prepared[sql] = self.db.prepare(sql)
        return stmt

    def _binder(self, sql: str) -> Any:
        """`Function.prototype.apply.bind(stmt.bind, stmt)`: called by
        Array.map with (values, index, array), it returns
        stmt.bind(...values); `apply` reads only its first two arguments.
        Built from JS built-ins: Workers refuse code made from strings."""
        binder = self._binders.get(sql)
        if binder is None:
            stmt = self._statement(sql)
            binder = self._binders[sql] = self._apply.bind(stmt.bind, stmt)
        return binder

    def _js_batch(self, statements: Sequence[Statement]) -> Any:
        """A JS Array of bound statements for a raw binding, in order: one
        JSON.parse for every value, one map per run of statements sharing a
        SQL text, one concat."""
        runs = _plain_runs(statements)
        if runs is not None:
            sqls, groups = runs
            one = len(sqls) == 1
            try:
                text = _dumps_strict(groups[0] if one else groups)
            except (TypeError, ValueError):  # NaN or infinity: the checked path says
                text = ""
            if text and not _has_long_number(text):
                if one:
                    return self._map(self._parse(text), self._binder(sqls[0]))
                arrays = self._parse(text)
                return self._concat(
                    *[self._map(arrays[i], self._binder(q)) for i, q in enumerate(sqls)]
                )
        return self._js_batch_checked(statements)

    def _js_batch_checked(self, statements: Sequence[Statement]) -> Any:
        """_js_batch with every value checked (and bytes converted) one by
        one, for batches `_plain_runs` cannot vouch for."""
        runs: list[tuple[str, list[list[Any]]]] = []
        for sql, params in statements:
            values = _json_params(params)
            if values is None:  # a value JSON cannot carry as it is
                return self._to_js([self._prepare(q, p) for q, p in statements])
            if runs and runs[-1][0] == sql:
                runs[-1][1].append(values)
            else:
                runs.append((sql, [values]))
        try:
            text = _dumps([values for _, values in runs])
        except (TypeError, ValueError):  # e.g. a str subclass json cannot encode
            return self._to_js([self._prepare(q, p) for q, p in statements])
        arrays = self._parse(text)
        if len(runs) == 1:
            return self._map(arrays[0], self._binder(runs[0][0]))
        return self._concat(
            *[self._map(arrays[i], self._binder(sql)) for i, (sql, _) in enumerate(runs)]
        )

    def _js_results(self, raw: Any) -> Any:
        """A JS result (or Array of them) as plain Python, in one crossing."""
        text: str = self._stringify(raw)
        plain = json_loads(text)
        if text.count('":[') != text.count('"results":['):  # some cell is a BLOB
            _blobs_to_bytes(plain if isinstance(plain, list) else [plain])
        return plain

    def _js_rows(self, rows: Any, positional: bool) -> list[Any]:
        """One statement's JS rows as Python in one stringify: dicts, or with
        `positional` lists of their values in column order (`Object.values`
        mapped in JS: no column names to carry across, parse and hash)."""
        if not positional:
            text: str = self._stringify(rows)
            dicts: list[dict[str, Any]] = json_loads(text)
            if '":[' in text:  # some cell is a BLOB
                _blobs_to_bytes([{"results": dicts}])
            return dicts
        text = self._stringify(self._map(rows, self._values))
        out: list[Any] = json_loads(text)
        if text.count("[") != len(out) + 1:  # some cell is a BLOB, or a '[' in a text
            for row in out:
                for i, value in enumerate(row):
                    if type(value) is list:
                        row[i] = bytes(value)
        return out

    def _js_batch_results(
        self, raw: Any, statements: Sequence[Statement], positional: bool
    ) -> list[Result]:
        """A batch's JS results as Results. A batch of reads (dict rows) crosses
        whole in one stringify. Otherwise every statement's `meta` crosses in
        one stringify with the META_KEYS allowlist (most of a write's result
        is `meta` nobody reads), and each statement that returns rows sends
        its rows on their own (`_js_rows`)."""
        reads = _reading(statements)
        if len(reads) == len(statements) and not positional:
            return [_decode(r) for r in self._js_results(raw)]
        results = _decode_metas(json_loads(self._stringify(raw, self._meta_keys)))
        for i in reads:
            results[i].rows = self._js_rows(raw[i].results, positional)
        return results

    def _count(self, statements: Sequence[Statement], results: list[Result], t0: float) -> None:
        u = self.usage
        seconds = time.perf_counter() - t0
        read, written = sum(map(_rows_read, results)), sum(map(_rows_written, results))
        names = [name_of(text) for text, _ in statements]
        u.queries += 1
        u.statements += len(statements)
        u.seconds += seconds
        u.rows_read += read
        u.rows_written += written
        u.by_name.update(names)
        if u.trace is not None:
            u.trace.append(Call(tuple(names), seconds, read, written))

    async def _send(self, send: Any) -> tuple[Any, bool]:
        """Await `send()`, again after a transient D1 error (bounded). Every
        send is a subrequest: a retry the invocation's caps cannot afford is
        not made, and the error stands. Returns the answer and whether it
        answers a re-send."""
        for attempt in range(self.retry.tries):
            if self.meter is not None:
                self.meter.spend("d1")
            try:
                return await send(), attempt > 0
            except Exception as exc:
                if attempt > 0:
                    with contextlib.suppress(AttributeError, TypeError):
                        exc.d1queue_resent = True  # type: ignore[attr-defined]
                if attempt + 1 == self.retry.tries or not is_transient(exc):
                    raise
                if self.meter is not None and self.meter.left() < 1:
                    raise
                self.retried += 1
                await asyncio.sleep(self.retry.delay_s(attempt))
        raise AssertionError("unreachable")

    def metered(self, meter: Meter) -> Binding:
        """This binding, counting into `meter` (a job's own budget): the same
        database, usage and in-flight slots, so the platform's limit of six
        connections holds across the drain and its handlers."""
        twin = object.__new__(Binding)
        twin.__dict__.update(self.__dict__)
        twin.meter = meter
        return twin

    async def run(self, sql: str, *params: Any, positional: bool = False) -> Result:
        """One statement, one round trip. With `positional`, rows are lists of
        their values in the statement's column order, not dicts: for callers
        that know the columns (cheaper to carry over from JS and to read)."""
        slots = self._slots
        if not slots.take_now():
            await slots.take()
        try:
            t0 = time.perf_counter()
            raw, resent = await self._send(lambda: self._prepare(sql, params).all())
            if not self._raw:
                result = _result(raw)
                if positional:
                    result.rows = [list(row.values()) for row in result.rows]
            elif positional:
                (result,) = _decode_metas([json_loads(self._stringify(raw, self._meta_keys))])
                result.rows = self._js_rows(raw.results, True)
            else:
                result = _decode(self._js_results(raw))
            result.resent = resent
            self._count([(sql, params)], [result], t0)
            return result
        finally:
            slots.give()

    async def batch(
        self, statements: Sequence[Statement], *, positional: bool = False
    ) -> list[Result]:
        """Several statements in one round trip and one transaction: all apply
        or none do. `positional`: rows as lists of values (see run)."""
        if not statements:
            return []

        def send() -> Any:
            if self._raw:
                # A JS Array: D1's batch() wants one, not a list's proxy.
                return self.db.batch(self._js_batch(statements))
            return self.db.batch([self._prepare(sql, params) for sql, params in statements])

        slots = self._slots
        if not slots.take_now():
            await slots.take()
        try:
            t0 = time.perf_counter()
            raw, resent = await self._send(send)
            if self._raw:
                results = self._js_batch_results(raw, statements, positional)
            else:
                results = [_result(r) for r in _plain(raw)]
                if positional:
                    for r in results:
                        r.rows = [list(row.values()) for row in r.rows]
            if resent:
                for r in results:
                    r.resent = True
            self._count(statements, results, t0)
            return results
        finally:
            slots.give()
