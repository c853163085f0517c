"""The queued job: the row as Python sees it, its id and name rules, and
the library's job defaults (how a stored row becomes a QueuedJob is the
store's: store/rows.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from .bounds import (
    ID_PATTERN,
    ID_RULE,
    MAX_AFTER,
    MAX_DELAY_S,
    MAX_EDGES,
    MAX_JSON_DEPTH,
    MAX_SAFE_INT,
    MAX_UNIQUE_KEY,
    PRIORITY_RANGE,
    check_group,
    check_name,
    check_traceparent,
    value_depth,
)
from .errors import TooManyEdges

GROUPED_ABOVE = PRIORITY_RANGE[1]
"""Bands above every priority are the grouped bands (store/sql.py GROUP_SHIFT)."""

DEFAULT_QUEUE = "default"


class PushOptions(TypedDict, total=False):
    """What one push may set over a job's declared defaults, stated once:
    QueuedJob.new and JobSpec.new take these keywords, and `dispatch` passes
    them on every push path (Python, a handler's ctx.queue, HTTP, RPC). A
    None is "not given": the declared default applies."""

    queue: str | None
    delay_s: float
    max_attempts: int | None
    priority: int | None
    unique_key: str | None
    group: str | None
    debounce_s: float | None
    after: Sequence[str] | None
    ignore_failed: bool
    traceparent: str | None


PUSH_OPTIONS = frozenset(PushOptions.__annotations__)
"""PushOptions' names, for the checks of callers that pass them untyped."""
"""The queue of a job whose dispatch and registration name none."""
DEFAULT_MAX_ATTEMPTS = 3
"""Attempts before a job is failed, when neither its dispatch nor its
registration says."""
DEFAULT_PRIORITY = 0
"""A job's priority (higher runs first), when neither its dispatch nor its
registration says."""
DEFAULT_TIMEOUT_S = 30.0
"""How long one attempt may run, when its registration does not say."""
DEFAULT_SUBREQUESTS = 0
"""Subrequests one attempt makes through its ctx, when its registration does
not say: none, so the drain plans nothing for it."""
DEFAULT_UNIQUE = False
"""No unique_key is derived for a job whose registration declares no unique
policy."""


def trace_fields(traceparent: str | None) -> dict[str, str]:
    """The producer's trace id and span id of a (valid) `traceparent`, as a
    job's log lines carry them (core/telemetry.py, core/runs.py): {} for none."""
    if traceparent is None:
        return {}
    return {"trace_id": traceparent[3:35], "parent_span_id": traceparent[36:52]}


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


@dataclass
class QueuedJob:
    """One job on a queue: its name, payload and attempts, its priority, the lease's fencing
    token and the last error. `payload` is the decoded JSON value."""

    name: str
    payload: Any = None
    queue: str = DEFAULT_QUEUE
    id: str = ""
    attempts: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    priority: int = DEFAULT_PRIORITY
    available_at: int = 0
    created_at: int = 0
    unique_key: str | None = None
    reservation: str | None = None
    reserved_until: int | None = None
    """When the lease ends, while a worker holds the job (else None)."""
    last_error: str | None = None
    held: bool = field(default=False, compare=False)
    """The row was marked held when read. A claim candidate that is held is a
    lease that lapsed: claiming it reclaims the job."""
    payload_error: str | None = field(default=None, compare=False)
    """Why the stored payload could not be decoded, if it could not: such a job
    is failed by the drain rather than run with a wrong payload."""
    group: str | None = None
    """The key of the job's per-group limits and fair turn (None: no group;
    such jobs form one group of their own)."""
    debounce_s: float = field(default=0, compare=False, repr=False)
    """At push only: with a unique_key, a push that replaces the payload of
    the queued job holding the key and moves its start to now + debounce_s
    (see D1Queue.push)."""
    debounced: bool = field(default=False, compare=False, repr=False)
    """After a push: it debounced the job holding its key."""
    slot: int | None = field(default=None, compare=False, repr=False)
    """The place it holds under its queue's concurrency limit, while held."""
    gslot: int | None = field(default=None, compare=False, repr=False)
    """The place it holds under its group's concurrency limit, while held;
    -1 for a job this worker claimed under one, whose number the claim's
    SQL chose (what matters to its retry or undo is that it holds one)."""
    band: int | None = field(default=None, compare=False, repr=False)
    """The band of the key the row was read at (sql.DELAYED_BAND,
    sql.LOCKED_BAND or the priority): with queue, available_at and id, where
    a claim finds the row. None for a job not read from the table."""
    after: list[str] | None = None
    """The ids of the jobs this one waits for (None: none): it runs once
    each of them completed (docs/workflows.md)."""
    ignore_failed: bool = field(default=False, compare=False)
    """With `after`: run even if a job it waits for fails or is cancelled
    (else it fails, with the error `dependency <id> failed`)."""
    batch: str | None = None
    """The workflow batch this job belongs to (None: none)."""
    waiting: int = field(default=0, compare=False, repr=False)
    """As read: how many of `after` had not ended; -1: one of them failed,
    so the job is failed instead of run (`doomed`)."""
    dependents: bool = field(default=False, compare=False, repr=False)
    """As read: some job waits for this one (one may start to while it
    runs: its settle finds out then)."""
    traceparent: str | None = field(default=None, compare=False, repr=False)
    """The W3C trace context of the push that made it (None: none given):
    its runs' log lines carry its trace id, and the jobs a run pushes
    inherit it (core/telemetry.py)."""
    started_at: int = field(default=0, compare=False, repr=False)
    """When a drain started this attempt's handler (epoch ms, the queue's
    clock; after any wait for a handler slot; 0: not run here). The one
    measurement its process line's wait (due -> started) and its metrics'
    wait are both taken from (core/telemetry.py, core/metrics.py)."""
    ended_at: int = field(default=0, compare=False, repr=False)
    """When its handler returned or raised (epoch ms; 0: no handler ran, as
    for a job failed without running): its run is ended_at - started_at,
    on its process line and in its metrics alike (`QueuedJob.run_ms`)."""
    cancel_at: int | None = field(default=None, compare=False, repr=False)
    """As read: when a cancel marked the job while a worker held it (epoch
    ms; None: never). Such a job ends cancelled and never runs again."""

    @property
    def wait_ms(self) -> int:
        """How long it was due before its handler started this attempt, in
        ms (due: the `available_at` it was claimed at; a clock that ran
        backwards counts as 0)."""
        return max(0, self.started_at - self.available_at)

    @property
    def run_ms(self) -> int:
        """How long its handler ran this attempt, in ms (0: none ran here;
        a clock that ran backwards counts as 0)."""
        return max(0, self.ended_at - self.started_at) if self.ended_at else 0

    @property
    def cancelling(self) -> bool:
        """A cancel marked the job while a worker held it: it never runs
        again (core/outcomes.py `decided`)."""
        return self.cancel_at is not None

    @classmethod
    def new(
        cls,
        name: str,
        payload: Any = None,
        *,
        at_ms: int | None = None,
        **options: Unpack[PushOptions],
    ) -> QueuedJob:
        """A job ready to push, validated (`options`: PushOptions, the
        library's defaults where not given); `at_ms` is the clock's now. With
        `debounce_s` (which needs a unique_key) the job starts debounce_s
        from now, and its push debounces the queued job holding its key.
        With `after` (1 to MAX_AFTER job ids) it waits for those jobs."""
        unknown = options.keys() - PUSH_OPTIONS
        if unknown:
            raise TypeError(f"unknown push options: {', '.join(sorted(unknown))}")
        delay_s = options.get("delay_s", 0)
        debounce_s = options.get("debounce_s")
        unique_key = options.get("unique_key")
        after, ignore_failed = options.get("after"), options.get("ignore_failed", False)
        max_attempts = options.get("max_attempts")
        priority = options.get("priority")
        now = now_ms() if at_ms is None else at_ms
        if (
            isinstance(delay_s, bool)
            or not isinstance(delay_s, int | float)
            or not 0 <= delay_s <= MAX_DELAY_S  # NaN too
        ):
            raise ValueError(f"delay_s must be a number from 0 to {MAX_DELAY_S}, got {delay_s!r}")
        if debounce_s is not None:
            if (
                isinstance(debounce_s, bool)
                or not isinstance(debounce_s, int | float)
                or not 0 < debounce_s <= MAX_DELAY_S  # NaN too
            ):
                raise ValueError(
                    f"debounce_s must be a number above 0 and at most {MAX_DELAY_S}, "
                    f"got {debounce_s!r}"
                )
            if unique_key is None:
                raise ValueError("debounce_s needs a unique_key: the key names what it debounces")
            delay_s = max(delay_s, debounce_s)
        job = cls(
            id=new_id(now),
            name=name,
            payload=payload,
            queue=options.get("queue") or DEFAULT_QUEUE,
            max_attempts=DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts,
            priority=DEFAULT_PRIORITY if priority is None else priority,
            available_at=now + round(delay_s * 1000),
            created_at=now,
            unique_key=unique_key,
            group=options.get("group"),
            debounce_s=debounce_s or 0,
            after=check_after(after, ignore_failed),
            ignore_failed=ignore_failed,
            traceparent=options.get("traceparent"),
        )
        if job.after is not None and job.debounce_s:
            raise ValueError("debounce_s and after cannot be combined")
        job.validate()
        return job

    def validate(self) -> None:
        """Raise ValueError for anything the table or D1 would refuse or misread."""
        check_name("queue", self.queue)
        check_name("job name", self.name)
        if self.id and not (isinstance(self.id, str) and ID_PATTERN.fullmatch(self.id)):
            # An id its caller chose: one no route could address (dots alone,
            # a "/") would leave the job unreachable over HTTP.
            raise ValueError(f"a job's id must match {ID_RULE}, got {self.id!r}")
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
        if self.group is not None:
            check_group(self.group)
        check_traceparent(self.traceparent)

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
    def waiting_turn(self) -> bool:
        """A grouped job in its priority's grouped band (sql.GROUP_SHIFT):
        due, claimed when its group's turn comes (its available_at is its
        fair tag there, not a time to wait for)."""
        return self.band is not None and self.band > GROUPED_ABOVE

    @property
    def workflow(self) -> bool:
        """A job whose end its waiters or its batch count, as read: its
        settle marks it ended (store/sql.py END_HELD) before it goes."""
        return self.batch is not None or self.dependents

    @property
    def doomed(self) -> bool:
        """A job it waited for failed or was cancelled: it is failed with the
        error its row was given (`dependency <id> failed`), never run."""
        return self.waiting < 0

    @property
    def exhausted(self) -> bool:
        """Claimed with its attempts already spent: its worker died (or its lease
        lapsed) on the last attempt. Never run again, so a job that kills its
        worker cannot loop forever."""
        return self.attempts > self.max_attempts


def check_after(after: Any, ignore_failed: Any = False) -> list[str] | None:
    """A push's `after` as stored: None, or 1 to MAX_AFTER distinct job ids
    (ID_RULE); ValueError otherwise. `ignore_failed` must be a boolean."""
    if not isinstance(ignore_failed, bool):
        raise ValueError("ignore_failed must be true or false")
    if after is None:
        return None
    if isinstance(after, str) or not isinstance(after, Sequence):
        raise ValueError(f"after must be an array of 1 to {MAX_AFTER} job ids")
    ids = list(after)
    if not 1 <= len(ids) <= MAX_AFTER:
        raise ValueError(f"after must name 1 to {MAX_AFTER} job ids, got {len(ids)}")
    for id in ids:
        if not isinstance(id, str) or not ID_PATTERN.fullmatch(id):
            raise ValueError(f"after: {id!r} is not a job id (ids match {ID_RULE})")
    if len(set(ids)) != len(ids):
        raise ValueError("after names a job id more than once")
    return ids


def check_edges(jobs: Iterable[QueuedJob]) -> int:
    """The edges one push of `jobs` writes (the ids their `after` name, in
    all): TooManyEdges past MAX_EDGES, before anything is sent."""
    edges = sum(len(j.after or ()) for j in jobs)
    if edges > MAX_EDGES:
        raise TooManyEdges(edges, MAX_EDGES)
    return edges
