"""The one place that calls a D1 binding.

The same driver code meets three kinds of binding: the `workers` SDK's
wrapper, a raw binding seen through Pyodide (JsProxy objects, None sent as
`undefined`, which D1 rejects), and SqliteD1 in CPython tests. The SDK's
wrapper is set aside for the JS binding it wraps, which costs a fraction of
the CPU per statement. Everything above this module sees plain `Result`s.
It also counts what was sent, against the invocation's subrequest meter and
for the benchmarks, and caps D1 calls in flight at the platform's six.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .limits import Meter

Statement = tuple[str, Sequence[Any]]

MAX_IN_FLIGHT = 6
"""D1 allows six simultaneous connections per invocation; more are queued by
the platform, where they still count against the wall-time budget unseen."""


TRANSIENT_ERRORS = (
    "Network connection lost",
    "storage caused object to be reset",
    "reset because its code was updated",
    "Cannot resolve D1 DB due to transient issue",
)
"""D1 errors its docs say to retry ("debug-d1", "retry-queries"). Not retried:
"overloaded", timeouts, memory and CPU resets, which retrying makes worse.
Retrying is safe for every statement d1queue sends: a re-sent claim or settle
is fenced (it changes nothing the second time), and a re-sent insert carries
the same job id."""


def was_resent(exc: BaseException) -> bool:
    """Whether `exc` answered a re-send (see Result.resent): the first send
    may have committed what the re-send then collided with."""
    return bool(getattr(exc, "d1queue_resent", False))


def is_transient(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in TRANSIENT_ERRORS)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for transient D1 errors."""

    tries: int = 5
    base_s: float = 0.1
    cap_s: float = 3.0

    def delay_s(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))


@dataclass
class Result:
    """One statement's outcome, as plain Python."""

    rows: list[dict[str, Any]]
    changes: int = 0
    last_row_id: int | None = None
    rows_read: int = 0
    rows_written: int = 0
    resent: bool = False
    """This answer is to a re-send, after an error that may have come after
    the first send committed: `changes == 0` may mean "already done by us"."""


@dataclass
class Usage:
    """What a binding has been sent so far. `queries` counts round trips (a
    batch is one); `statements` counts every statement, batched or not, since
    D1 does not document which of the two its per-invocation cap counts."""

    queries: int = 0
    statements: int = 0
    rows_read: int = 0
    rows_written: int = 0
    seconds: float = 0.0

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
        if self._raw:
            # A raw binding turns Python None into JS undefined, which D1
            # rejects (D1_TYPE_ERROR); JS null is what it stores as NULL.
            self._null = _pyodide_ffi().jsnull
        self._slots = asyncio.Semaphore(max_in_flight)

    def _prepare(self, sql: str, params: Sequence[Any]) -> Any:
        stmt = self.db.prepare(sql)
        if not params:
            return stmt
        return stmt.bind(*(self._null if v is None else v for v in params))

    def _count(self, statements: Sequence[Statement], results: list[Result], t0: float) -> None:
        u = self.usage
        u.queries += 1
        u.statements += len(statements)
        u.seconds += time.perf_counter() - t0
        for r in results:
            u.rows_read += r.rows_read
            u.rows_written += r.rows_written

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

    async def run(self, sql: str, *params: Any) -> Result:
        """One statement, one round trip."""
        async with self._slots:
            t0 = time.perf_counter()
            raw, resent = await self._send(lambda: self._prepare(sql, params).all())
            result = _result(raw)
            result.resent = resent
            self._count([(sql, params)], [result], t0)
            return result

    async def batch(self, statements: Sequence[Statement]) -> list[Result]:
        """Several statements in one round trip and one transaction: all apply
        or none do."""
        if not statements:
            return []

        def send() -> Any:
            prepared = [self._prepare(sql, params) for sql, params in statements]
            if self._raw:
                # A Python list reaches JS as a proxy, not an Array, and
                # D1's batch() wants an Array.
                return self.db.batch(_pyodide_ffi().to_js(prepared))
            return self.db.batch(prepared)

        async with self._slots:
            t0 = time.perf_counter()
            raw, resent = await self._send(send)
            results = [_result(r) for r in _plain(raw)]
            for r in results:
                r.resent = resent
            self._count(statements, results, t0)
            return results
