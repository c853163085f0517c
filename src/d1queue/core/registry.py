"""The registry of handlers: each job name with its handler and its defaults
(queue, attempts, priority, unique policy, timeout, backoff, subrequests)."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypedDict, Unpack

from .bounds import MAX_JSON_DEPTH, MAX_UNIQUE_KEY, PRIORITY_RANGE, check_name, value_depth
from .context import JobContext
from .flow import GroupRule, Limits, derive_group
from .job import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    DEFAULT_SUBREQUESTS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_UNIQUE,
    PushOptions,
    QueuedJob,
)
from .limits import PLANS
from .schedule import DEFAULT_CATCH_UP, DEFAULT_TZ, ScheduleDef

MAX_JOB_SUBREQUESTS = PLANS["paid"].subrequests
"""No attempt can make more subrequests than a whole paid invocation."""

MIN_CANCEL_WATCH_S = 1.0
"""The shortest interval between a running attempt's cancel watches: each
is a D1 query."""


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

UniquePolicy = bool | Callable[[Any], str | int | None]
"""How a job's unique_key is derived when a dispatch gives none: False, no
key; True, one queued job per distinct payload; a function, one queued job
per value it returns for the payload (None: this payload is not unique)."""


def derive_unique_key(name: str, unique: UniquePolicy, payload: Any) -> str | None:
    """The unique_key `unique` derives for job `name`'s `payload`. Prefixed
    with the job name, so two kinds of job never hold each other's keys; a
    payload key is a SHA-256 of its canonical JSON, so any payload fits in
    MAX_UNIQUE_KEY. ValueError for a key that cannot be stored."""
    if unique is False:
        return None
    if unique is True:
        if value_depth(payload) > MAX_JSON_DEPTH:
            raise ValueError(f"payload nests deeper than {MAX_JSON_DEPTH} levels")
        try:
            text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"payload is not JSON-serialisable: {exc}") from None
        return f"{name}:sha256:{hashlib.sha256(text.encode()).hexdigest()}"
    try:
        value = unique(payload)
    except Exception as exc:
        raise ValueError(
            f"job {name!r}: its unique policy found no key in the payload: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"job {name!r}: its unique policy must return a str, got {value!r}")
    key = f"{name}:{value}"
    if len(key) > MAX_UNIQUE_KEY:
        raise ValueError(
            f"job {name!r}: the derived unique_key is {len(key)} characters; "
            f"the limit is {MAX_UNIQUE_KEY}"
        )
    return key


Overrides = PushOptions
"""What one dispatch may set over a job's declared defaults (job.PushOptions)."""


class Stored(NamedTuple):
    """A job's queue, max_attempts and priority as its row holds them."""

    queue: str
    max_attempts: int
    priority: int


@dataclass(frozen=True)
class JobSpec:
    """A registered handler and its defaults. A field not declared at
    registration holds the library's default (job.DEFAULT_*), so a spec is
    all a job needs: `spec_for` gives one for a name never registered."""

    name: str
    handler: Handler
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    timeout_s: float = DEFAULT_TIMEOUT_S
    backoff: Backoff = field(default_factory=Backoff)
    queue: str = DEFAULT_QUEUE
    wants_context: bool = True
    subrequests: int = DEFAULT_SUBREQUESTS
    """Subrequests one attempt may make (D1 calls, fetches, binding calls
    through its ctx): the drain plans each invocation with it."""
    priority: int = DEFAULT_PRIORITY
    unique: UniquePolicy = DEFAULT_UNIQUE
    """Derives the unique_key of a dispatch that gives none (UniquePolicy)."""
    group: GroupRule | None = None
    """Derives the group of a dispatch that gives none, from its payload."""
    cancel_watch_s: float | None = None
    """How often a running attempt reads whether a cancel marked it (None:
    never while it runs; its settle and any later claim still end it). Each
    read is one subrequest, counted in `subrequests` (`watches`)."""

    @property
    def watches(self) -> int:
        """The most cancel watches one attempt sends: one each
        cancel_watch_s while the handler runs, which is less than timeout_s."""
        every = self.cancel_watch_s
        return 0 if every is None else max(0, math.ceil(self.timeout_s / every) - 1)

    def stored(
        self,
        queue: str | None = None,
        max_attempts: int | None = None,
        priority: int | None = None,
    ) -> Stored:
        """The queue, max_attempts and priority a job of this kind is stored
        with: a value given here, else the one declared at registration
        (which is the library's when none was). The cron's slot jobs, written
        by SQL from the schedule's row, take theirs from here too."""
        return Stored(
            self.queue if queue is None else queue,
            self.max_attempts if max_attempts is None else max_attempts,
            self.priority if priority is None else priority,
        )

    def new(
        self, payload: Any = None, *, at_ms: int | None = None, **options: Unpack[PushOptions]
    ) -> QueuedJob:
        """A job of this kind, ready to push: the one place a job's declared
        defaults (queue, max_attempts, priority, unique policy, group rule) are applied,
        whichever way it is dispatched (Python, a handler's ctx.queue, HTTP,
        RPC, a shard's queue); a value given in `options` (PushOptions)
        overrides them. (timeout_s, backoff and subrequests apply when the
        job runs, looked up by name.) ValueError for anything unstorable."""
        given = options.copy()
        if given.get("unique_key") is None:
            given["unique_key"] = derive_unique_key(self.name, self.unique, payload)
        if given.get("group") is None:
            given["group"] = derive_group(self.group, payload)
        stored = self.stored(given.get("queue"), given.get("max_attempts"), given.get("priority"))
        given["queue"], given["max_attempts"], given["priority"] = stored
        return QueuedJob.new(self.name, payload, at_ms=at_ms, **given)

    async def call(self, payload: Any, ctx: JobContext) -> Any:
        if self.wants_context:
            return await self.handler(payload, ctx)
        return await self.handler(payload)


class JobOptions(TypedDict, total=False):
    """`Registry.register`'s options, which `Registry.job` passes on."""

    max_attempts: int
    timeout_s: float
    backoff: Backoff | None
    queue: str
    subrequests: int
    priority: int
    unique: UniquePolicy
    group: GroupRule | None
    limits: Limits | None
    cancel_watch_s: float | None


async def _unregistered(payload: Any) -> None:
    raise AssertionError("a stand-in spec, never run")


def spec_for(registry: Registry | None, name: str) -> JobSpec:
    """Job `name`'s spec in `registry`; for a name it does not know (or no
    registry), a stand-in holding the library's defaults. Such a job is
    still pushed: another Worker on the same D1 may run it, else the drain
    fails it, visibly."""
    spec = registry.get(name) if registry is not None else None
    return spec if spec is not None else JobSpec(name, _unregistered)


class Registry:
    """Handlers by job name. One per Worker, built at import time (imports are
    snapshotted at deploy, so registering costs nothing per request) and passed
    explicitly to `drain` — there is no global registry."""

    def __init__(self) -> None:
        self._specs: dict[str, JobSpec] = {}
        self._schedules: dict[str, ScheduleDef] = {}
        self._limits: dict[str, Limits] = {}
        self._unkept: set[str] = set()

    def limit(self, queue: str, limits: Limits | None = None, **fields: Any) -> Limits:
        """Declare `queue`'s flow limits in code: `limit("api",
        concurrency=3, rate=Rate(5, 10))` or a Limits. They hold until limits
        are set over the API (PUT /v1/queues/{queue}/limits), which win."""
        check_name("queue", queue)
        if limits is None:
            limits = Limits(**fields)
        elif fields:
            raise TypeError("give a Limits or its fields, not both")
        if queue in self._limits and self._limits[queue] != limits:
            raise ValueError(f"queue {queue!r} already has other limits declared")
        self._limits[queue] = limits
        return limits

    def limits(self) -> dict[str, Limits]:
        """The queues' limits declared in code."""
        return dict(self._limits)

    def history(self, queue: str, *, keep: bool) -> None:
        """Whether `queue` keeps its completed jobs (and their results) for
        D1QUEUE_KEEP_COMPLETED_S: it does unless told not to. A queue that
        keeps none deletes a job as it completes, at the cost of a job's
        life without history (docs/workflows.md)."""
        check_name("queue", queue)
        if keep:
            self._unkept.discard(queue)
        else:
            self._unkept.add(queue)

    def keeps_history(self, queue: str) -> bool:
        """Whether `queue` keeps its completed jobs (see `history`)."""
        return queue not in self._unkept

    def job(
        self,
        name: str | None = None,
        *,
        schedule: str | None = None,
        tz: str = DEFAULT_TZ,
        catch_up: str = DEFAULT_CATCH_UP,
        **options: Unpack[JobOptions],
    ) -> Callable[[Handler], Handler]:
        """Decorator: register `async def handler(payload[, ctx])` under `name`
        (default: the function's name), with `register`'s options
        (max_attempts, timeout_s, backoff, queue, subrequests, priority,
        unique). `subrequests` is how many D1 calls, fetches and binding calls
        one attempt makes through its ctx. `unique` derives a unique_key when
        a dispatch gives none (UniquePolicy): `unique=True` keeps one queued
        job per payload, `unique=lambda p: p["user"]` one per user.
        `schedule` (a cron expression, read in `tz`) also declares a schedule
        with the job's name as its id and a null payload (see `schedule` for
        more)."""

        def register(fn: Handler) -> Handler:
            job_name = name or fn.__name__
            self.register(job_name, fn, **options)
            if schedule is not None:
                self.schedule(job_name, schedule, job_name, tz=tz, catch_up=catch_up)
            return fn

        return register

    def schedule(
        self,
        id: str,
        cron: str,
        name: str,
        *,
        payload: Any = None,
        queue: str | None = None,
        tz: str = DEFAULT_TZ,
        catch_up: str = DEFAULT_CATCH_UP,
    ) -> ScheduleDef:
        """Declare a recurring schedule in code: job `name` (registered
        first) with `payload` at each slot of `cron` (5 fields or @hourly,
        @daily…) in IANA zone `tz`, to `queue` (default: the job's own).
        `catch_up` is what happens to slots missed during an outage: "none",
        "latest" or "all" (docs/operations.md, "Schedules"). Each cron run syncs the
        declared set into D1: new ones are added, changed ones replaced,
        ones no longer declared deleted. ValueError (ScheduleError, naming
        the field) for anything invalid, at import, not at the first run."""
        if name not in self._specs:
            raise ValueError(f"schedule {id!r}: register job {name!r} before scheduling it")
        if id in self._schedules:
            raise ValueError(f"schedule {id!r} is already declared")
        spec = ScheduleDef(id, cron, name, payload, queue, tz, catch_up)
        self._schedules[id] = spec
        return spec

    def schedules(self) -> list[ScheduleDef]:
        """The schedules declared in code, by id."""
        return [self._schedules[k] for k in sorted(self._schedules)]

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        backoff: Backoff | None = None,
        queue: str = DEFAULT_QUEUE,
        subrequests: int = DEFAULT_SUBREQUESTS,
        priority: int = DEFAULT_PRIORITY,
        unique: UniquePolicy = DEFAULT_UNIQUE,
        group: GroupRule | None = None,
        limits: Limits | None = None,
        cancel_watch_s: float | None = None,
    ) -> JobSpec:
        """Register `handler` under `name`. `group` derives a job's group
        from its payload (`group=lambda p: p["account"]`) when its dispatch
        gives none; `limits` declares the flow limits of the job's queue
        (`limit`). `cancel_watch_s` makes a running attempt read whether a
        cancel marked it every so many seconds, and cancel its handler's
        task if so (ctx.cancelled): each read is one subrequest, added to
        the `subrequests` the job declares (JobSpec.watches)."""
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
        if cancel_watch_s is not None and (
            isinstance(cancel_watch_s, bool)
            or not isinstance(cancel_watch_s, int | float)
            or not MIN_CANCEL_WATCH_S <= cancel_watch_s < timeout_s
        ):
            raise ValueError(
                f"job {name!r}: cancel_watch_s must be a number of seconds from "
                f"{MIN_CANCEL_WATCH_S:g} to less than its timeout_s ({timeout_s:g})"
            )
        if group is not None and not callable(group):
            raise TypeError(f"job {name!r}: group must be a function of the payload")
        if limits is not None:
            self.limit(queue, limits)
        if not isinstance(unique, bool) and not callable(unique):
            raise TypeError(
                f"job {name!r}: unique must be True, False or a function of the payload"
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
            unique=unique,
            group=group,
            cancel_watch_s=None if cancel_watch_s is None else float(cancel_watch_s),
        )
        if spec.watches:
            # The watches are subrequests of the attempt's own plan: the
            # drain budgets them with the handler's.
            total = subrequests + spec.watches
            if total > MAX_JOB_SUBREQUESTS:
                raise ValueError(
                    f"job {name!r}: subrequests ({subrequests}) and its cancel watches "
                    f"({spec.watches}) come to more than {MAX_JOB_SUBREQUESTS}"
                )
            spec = replace(spec, subrequests=total)
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
