"""Jobs: the queued row as Python sees it, the registry of handlers, and the
small policy objects a handler's outcome is decided with."""

from __future__ import annotations

import inspect
import json
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .bounds import (
    MAX_DELAY_S,
    MAX_JSON_DEPTH,
    MAX_SAFE_INT,
    MAX_UNIQUE_KEY,
    NAME_PATTERN,
    NAME_RULE,
    PRIORITY_RANGE,
    json_depth,
    value_depth,
)
from .limits import PLANS, Meter

MAX_JOB_SUBREQUESTS = PLANS["paid"].subrequests
"""No attempt can make more subrequests than a whole paid invocation."""


def now_ms() -> int:
    """Wall-clock epoch milliseconds: the one timestamp format in the tables."""
    return time.time_ns() // 1_000_000


_last_id = (0, 0)
"""The last id this process made, as (ms, random): the state of a generator,
not configuration."""


def new_id(at_ms: int | None = None) -> str:
    """A 32-hex-digit id that sorts by creation time (48-bit ms, 80 random
    bits), monotonic within a process (ids made in the same millisecond count
    up), so ids break ties in FIFO order: jobs pushed in one millisecond run
    in the order they were pushed."""
    global _last_id
    ms = now_ms() if at_ms is None else at_ms
    rand = int.from_bytes(os.urandom(10), "big")
    if ms <= _last_id[0]:
        ms, rand = _last_id[0], _last_id[1] + 1
    _last_id = (ms, rand)
    return f"{ms:012x}{rand:020x}"


def check_name(kind: str, value: object) -> str:
    """Raise ValueError unless `value` is a well-formed queue or job name."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ValueError(f"{kind} must match {NAME_RULE}, got {value!r}")
    return value


@dataclass
class QueuedJob:
    """One job on a queue: the seed's fields plus priority, the lease's fencing
    token and the last error. `payload` is the decoded JSON value."""

    name: str
    payload: Any = None
    queue: str = "default"
    id: str = ""
    attempts: int = 0
    max_attempts: int = 3
    priority: int = 0
    available_at: int = 0
    created_at: int = 0
    unique_key: str | None = None
    reservation: str | None = None
    reserved_until: int | None = None
    last_error: str | None = None
    payload_error: str | None = field(default=None, compare=False)
    """Why the stored payload could not be decoded, if it could not: such a job
    is failed by the drain rather than run with a wrong payload."""

    @classmethod
    def new(
        cls,
        name: str,
        payload: Any = None,
        *,
        queue: str = "default",
        delay_s: float = 0,
        max_attempts: int = 3,
        priority: int = 0,
        unique_key: str | None = None,
        at_ms: int | None = None,
    ) -> QueuedJob:
        """A job ready to push, validated; `at_ms` is the clock's now."""
        now = now_ms() if at_ms is None else at_ms
        if (
            isinstance(delay_s, bool)
            or not isinstance(delay_s, int | float)
            or not 0 <= delay_s <= MAX_DELAY_S  # NaN too
        ):
            raise ValueError(f"delay_s must be a number from 0 to {MAX_DELAY_S}, got {delay_s!r}")
        job = cls(
            id=new_id(now),
            name=name,
            payload=payload,
            queue=queue,
            max_attempts=max_attempts,
            priority=priority,
            available_at=now + round(delay_s * 1000),
            created_at=now,
            unique_key=unique_key,
        )
        job.validate()
        return job

    def validate(self) -> None:
        """Raise ValueError for anything the table or D1 would refuse or misread."""
        check_name("queue", self.queue)
        check_name("job name", self.name)
        for label, value in (
            ("max_attempts", self.max_attempts),
            ("priority", self.priority),
            ("available_at", self.available_at),
            ("attempts", self.attempts),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{label} must be an integer, got {value!r}")
            if abs(value) > MAX_SAFE_INT:
                raise ValueError(f"{label} is out of range: {value}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.unique_key is not None and (
            not isinstance(self.unique_key, str) or not 0 < len(self.unique_key) <= MAX_UNIQUE_KEY
        ):
            raise ValueError(
                f"unique_key must be a non-empty string of at most {MAX_UNIQUE_KEY} characters"
            )

    def payload_json(self) -> str:
        """The payload as stored: compact JSON; NaN and Infinity are refused
        because no other JSON reader accepts them, and so is nesting past
        MAX_JSON_DEPTH, which the drain could not read back safely."""
        if value_depth(self.payload) > MAX_JSON_DEPTH:
            raise ValueError(f"payload nests deeper than {MAX_JSON_DEPTH} levels")
        try:
            return json.dumps(self.payload, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"payload is not JSON-serialisable: {exc}") from exc

    @property
    def exhausted(self) -> bool:
        """Claimed with its attempts already spent: its worker died (or its lease
        lapsed) on the last attempt. Never run again, so a job that kills its
        worker cannot loop forever."""
        return self.attempts > self.max_attempts


class Retry(Exception):
    """Raised by a handler to be run again after `delay_s` seconds (None: the
    job's backoff decides). Counts as an attempt."""

    def __init__(self, reason: str = "retry requested", *, delay_s: float | None = None):
        super().__init__(reason)
        self.delay_s = delay_s


class Fail(Exception):
    """Raised by a handler to fail the job now, whatever attempts remain: the
    input is wrong and running it again cannot help."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits about base * factor**(n-1)
    seconds, capped; with jitter the wait is drawn from [d/2, d] so retries of
    many jobs that failed together spread out instead of stampeding."""

    base_s: float = 5.0
    factor: float = 2.0
    max_s: float = 3600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.factor < 1 or self.max_s < self.base_s:
            raise ValueError(f"invalid backoff {self!r}")

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        exponent = max(attempt - 1, 0)
        # Cap the exponent first: factor ** 1000 would overflow a float.
        d = self.max_s if exponent > 64 else min(self.max_s, self.base_s * self.factor**exponent)
        if self.jitter:
            d = d / 2 + (rng or random).uniform(0, d / 2)
        return d


Handler = Callable[..., Awaitable[Any]]


Fetch = Callable[..., Awaitable[Any]]
"""The Worker's outbound HTTP: fetch(url, *, method, headers, body, service, env)
returning a response with `status`, `header(name)` and `async text()`;
`service` names a service binding in `env` to send the request through."""


@dataclass
class JobContext:
    """What a handler may use besides its payload.

    Everything here that reaches the network counts against the job's
    declared subrequests (`registry.job(..., subrequests=N)`): `queue`,
    bindings read from `env`, and `fetch`. A call past that budget raises
    SubrequestLimitExceeded before it is sent, and the attempt is retried, so
    one handler cannot make the whole invocation cross Cloudflare's cap."""

    job: QueuedJob
    queue: Any  # the D1Queue, to dispatch follow-up jobs (typed Any: no import cycle)
    env: Any = None  # the Worker's env, bindings metered, when run by a Worker
    meter: Meter | None = None
    """This attempt's subrequest budget (None: not metered, as in unit tests)."""
    http: Fetch | None = None
    """The Worker's fetch, as given to `drain(fetch=...)`."""
    raw_env: Any = None
    """The env underneath `env`, for the service bindings `fetch` sends through."""

    @property
    def attempt(self) -> int:
        """Which attempt this is, from 1."""
        return self.job.attempts

    async def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: str | None = None,
        service: str | None = None,
    ) -> Any:
        """An HTTP request through the Worker's fetch (or the service binding
        `service`), counted as one subrequest."""
        if self.http is None:
            raise RuntimeError("this drain was given no fetch: pass drain(..., fetch=...)")
        if self.meter is not None:
            self.meter.spend("binding" if service else "fetch")
        env = self.raw_env if self.raw_env is not None else self.env
        return await self.http(
            url, method=method, headers=dict(headers or {}), body=body, service=service, env=env
        )


@dataclass(frozen=True)
class JobSpec:
    """A registered handler and its defaults."""

    name: str
    handler: Handler
    max_attempts: int = 3
    timeout_s: float = 30.0
    backoff: Backoff = field(default_factory=Backoff)
    queue: str = "default"
    wants_context: bool = True
    subrequests: int = 0
    """Subrequests one attempt may make (D1 calls, fetches, binding calls
    through its ctx): the drain plans each invocation with it."""
    priority: int = 0

    def new(
        self,
        payload: Any = None,
        *,
        queue: str | None = None,
        delay_s: float = 0,
        max_attempts: int | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
        at_ms: int | None = None,
    ) -> QueuedJob:
        """A job of this kind, ready to push: the one place a job's registered
        defaults (queue, max_attempts, priority) are applied, whichever way it
        is dispatched (Python, HTTP, RPC); a value given here overrides them.
        (timeout_s, backoff and subrequests apply when the job runs.)"""
        return QueuedJob.new(
            self.name,
            payload,
            queue=self.queue if queue is None else queue,
            delay_s=delay_s,
            max_attempts=self.max_attempts if max_attempts is None else max_attempts,
            priority=self.priority if priority is None else priority,
            unique_key=unique_key,
            at_ms=at_ms,
        )

    async def call(self, payload: Any, ctx: JobContext) -> Any:
        if self.wants_context:
            return await self.handler(payload, ctx)
        return await self.handler(payload)


class Registry:
    """Handlers by job name. One per Worker, built at import time (imports are
    snapshotted at deploy, so registering costs nothing per request) and passed
    explicitly to `drain` — there is no global registry."""

    def __init__(self) -> None:
        self._specs: dict[str, JobSpec] = {}

    def job(
        self,
        name: str | None = None,
        *,
        max_attempts: int = 3,
        timeout_s: float = 30.0,
        backoff: Backoff | None = None,
        queue: str = "default",
        subrequests: int = 0,
        priority: int = 0,
    ) -> Callable[[Handler], Handler]:
        """Decorator: register `async def handler(payload[, ctx])` under `name`
        (default: the function's name). `subrequests` is how many D1 calls,
        fetches and binding calls one attempt makes through its ctx."""

        def register(fn: Handler) -> Handler:
            self.register(
                name or fn.__name__,
                fn,
                max_attempts=max_attempts,
                timeout_s=timeout_s,
                backoff=backoff,
                queue=queue,
                subrequests=subrequests,
                priority=priority,
            )
            return fn

        return register

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        max_attempts: int = 3,
        timeout_s: float = 30.0,
        backoff: Backoff | None = None,
        queue: str = "default",
        subrequests: int = 0,
        priority: int = 0,
    ) -> JobSpec:
        check_name("job name", name)
        check_name("queue", queue)
        if name in self._specs:
            raise ValueError(f"job {name!r} is already registered")
        if not inspect.iscoroutinefunction(handler):
            raise TypeError(f"job {name!r}: the handler must be an async function")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"job {name!r}: max_attempts must be an integer >= 1")
        if not timeout_s > 0:
            raise ValueError(f"job {name!r}: timeout_s must be > 0")
        lo, hi = PRIORITY_RANGE
        if isinstance(priority, bool) or not isinstance(priority, int) or not lo <= priority <= hi:
            raise ValueError(f"job {name!r}: priority must be an integer from {lo} to {hi}")
        if (
            isinstance(subrequests, bool)
            or not isinstance(subrequests, int)
            or not 0 <= subrequests <= MAX_JOB_SUBREQUESTS
        ):
            raise ValueError(
                f"job {name!r}: subrequests must be an integer from 0 to {MAX_JOB_SUBREQUESTS}"
            )
        params = [
            p
            for p in inspect.signature(handler).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) not in (1, 2):
            raise TypeError(f"job {name!r}: the handler must take (payload) or (payload, ctx)")
        spec = JobSpec(
            name=name,
            handler=handler,
            max_attempts=max_attempts,
            timeout_s=float(timeout_s),
            backoff=backoff or Backoff(),
            queue=queue,
            wants_context=len(params) == 2,
            subrequests=subrequests,
            priority=priority,
        )
        self._specs[name] = spec
        return spec

    def get(self, name: str) -> JobSpec | None:
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> list[str]:
        return sorted(self._specs)

    def max_subrequests(self) -> int:
        return max((s.subrequests for s in self._specs.values()), default=0)

    def max_timeout_s(self) -> float:
        """The longest any handler may run: the lease must outlast it."""
        return max((s.timeout_s for s in self._specs.values()), default=0.0)


def row_to_job(row: Mapping[str, Any]) -> QueuedJob:
    """A d1queue_jobs row as a QueuedJob; an undecodable payload is kept as
    text and explained in `payload_error` instead of raising mid-claim."""
    payload_error = None
    try:
        if isinstance(row["payload"], str) and json_depth(row["payload"]) > MAX_JSON_DEPTH:
            # Written by something other than d1queue: parsing it could stop
            # the Worker's Python (see bounds.MAX_JSON_DEPTH).
            raise ValueError(f"nests deeper than {MAX_JSON_DEPTH} levels")
        payload = json.loads(row["payload"])
    except (TypeError, ValueError) as exc:
        payload, payload_error = row["payload"], f"undecodable payload: {exc}"
    return QueuedJob(
        id=row["id"],
        name=row["name"],
        payload=payload,
        queue=row["queue"],
        attempts=int(row["attempts"]),
        max_attempts=int(row["max_attempts"]),
        priority=int(row["priority"]),
        available_at=int(row["available_at"]),
        created_at=int(row["created_at"]),
        unique_key=row.get("unique_key"),
        reservation=row.get("reservation"),
        reserved_until=row.get("reserved_until"),
        last_error=row.get("last_error"),
        payload_error=payload_error,
    )
