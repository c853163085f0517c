"""Cloudflare's per-invocation limits, and the meters that keep a drain inside them.

A Worker invocation (one cron run, one request and its `waitUntil` work) may
make a fixed number of subrequests: 50 on the free plan; on paid, 10,000 in
all of which at most 1,000 may be D1 queries. Every D1 call or `db.batch`
counts one, every `fetch` one, every call on a service binding one, and the
handlers' calls count against the same invocation as the drain's own. Past
the cap the platform fails the call, and the settle that would have recorded
finished jobs is lost with it, so they run again. The drain therefore counts
every subrequest *before* it is sent and never plans work that could cross
the cap: the invocation `Meter` holds the plan's caps, and each job attempt
gets a child meter holding the subrequests its handler declared.

CPU is the other cap (10 ms on free, 30 s by default on paid). A deployed
Worker cannot measure its own CPU (its clocks stand still between I/O), so the
drain bounds it by a job count per run instead (`Config.max_jobs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

SubrequestKind = Literal["d1", "fetch", "binding"]


@dataclass(frozen=True)
class Plan:
    """One Workers plan's per-invocation caps (Workers and D1 "limits" docs)."""

    name: str
    subrequests: int
    """Subrequests of every kind, D1 queries included."""
    d1_queries: int
    """D1 queries (a db.batch is one) within `subrequests`."""
    wait_until_s: float = 30.0
    """How long `waitUntil` work may go on after the response."""


PLANS: dict[str, Plan] = {
    "free": Plan("free", subrequests=50, d1_queries=50),
    "paid": Plan("paid", subrequests=10_000, d1_queries=1_000),
}


class SubrequestLimitExceeded(RuntimeError):
    """A subrequest was refused before it was sent: it would have crossed a
    cap. Raised inside a handler, it means the handler made more subrequests
    than it declared; the attempt is retried, and the invocation lives on."""


class Meter:
    """Counts subrequests against caps; a child counts into its parents too.

    `spend` checks every cap up the chain first and only then counts, so a
    refused subrequest leaves every meter as it was and is never sent.
    """

    def __init__(
        self,
        subrequests: int,
        d1_queries: int | None = None,
        *,
        label: str = "this invocation",
        parent: Meter | None = None,
        hint: str = "",
    ) -> None:
        self.subrequests = subrequests
        self.d1_queries = subrequests if d1_queries is None else d1_queries
        self.label = label
        self.parent = parent
        self.hint = hint
        self.used = 0
        self.used_d1 = 0
        self.refused: SubrequestLimitExceeded | None = None
        """The first refusal, kept so a handler that swallows the error
        still has its attempt retried."""

    @classmethod
    def for_plan(cls, plan: Plan) -> Meter:
        return cls(plan.subrequests, plan.d1_queries, label=f"the {plan.name} plan's invocation")

    def child(self, subrequests: int, *, label: str, hint: str = "") -> Meter:
        """A meter for one piece of work (a job attempt) inside this one."""
        return Meter(subrequests, subrequests, label=label, parent=self, hint=hint)

    def left(self) -> int:
        """Subrequests that may still be sent, of any kind, up the chain."""
        own = min(self.subrequests - self.used, self.d1_queries - self.used_d1)
        return own if self.parent is None else min(own, self.parent.left())

    def _check(self, kind: SubrequestKind) -> None:
        if self.used + 1 > self.subrequests or (
            kind == "d1" and self.used_d1 + 1 > self.d1_queries
        ):
            what = "D1 queries" if self.used + 1 <= self.subrequests else "subrequests"
            cap = self.d1_queries if what == "D1 queries" else self.subrequests
            error = SubrequestLimitExceeded(
                f"{self.label} may make {cap} {what}; a {kind} subrequest past that was "
                f"refused before it was sent{self.hint}"
            )
            if self.refused is None:
                self.refused = error
            raise error
        if self.parent is not None:
            self.parent._check(kind)

    def spend(self, kind: SubrequestKind) -> None:
        """Count one subrequest about to be sent, or raise without counting."""
        self._check(kind)
        meter: Meter | None = self
        while meter is not None:
            meter.used += 1
            if kind == "d1":
                meter.used_d1 += 1
            meter = meter.parent


SYNC_METHODS = frozenset({"prepare", "bind", "withSession", "with_session"})
"""Binding methods that build an object locally and send nothing (D1's
prepare and bind): their results are metered in turn, not counted."""

_PLAIN = (str, bytes, int, float, bool, type(None))


class MeteredBinding:
    """A binding (D1, a service, KV…) whose every sending call is counted.

    Any method call counts one subrequest before it is made, except the
    local builders in SYNC_METHODS, whose results are wrapped in turn (a D1
    statement counts when it is run). Counting a call that sends nothing is
    the safe mistake: it can only stop work early, never cross a cap.
    """

    __slots__ = ("_meter", "_target")

    def __init__(self, target: Any, meter: Meter) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_meter", meter)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        meter = self._meter

        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(_unwrap(a) for a in args)
            if name in SYNC_METHODS:
                return MeteredBinding(value(*args, **kwargs), meter)
            meter.spend("d1" if _is_d1(self._target) else "binding")
            return value(*args, **kwargs)

        return call

    def __repr__(self) -> str:
        return f"MeteredBinding({self._target!r})"


def _is_d1(target: Any) -> bool:
    """A D1 database or statement: what the platform counts as a D1 query."""
    return hasattr(target, "prepare") or hasattr(target, "bind")


def _unwrap(value: Any) -> Any:
    """The real objects under metered ones (db.batch takes statements)."""
    if isinstance(value, MeteredBinding):
        return value._target
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


class MeteredEnv:
    """The Worker's env as a handler sees it: vars as they are, bindings metered."""

    __slots__ = ("_env", "_meter")

    def __init__(self, env: Any, meter: Meter) -> None:
        object.__setattr__(self, "_env", env)
        object.__setattr__(self, "_meter", meter)

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, _PLAIN) or inspect.isroutine(value):
            return value
        return MeteredBinding(value, self._meter)

    def __getattr__(self, name: str) -> Any:
        return self._wrap(getattr(self._env, name))

    def __getitem__(self, name: str) -> Any:
        return self._wrap(self._env[name])

    def __repr__(self) -> str:
        return f"MeteredEnv({self._env!r})"


class Slots:
    """A limit on things running at once (the drain's handlers, a binding's D1
    calls in flight): asyncio.Semaphore's admission (first come, first
    served) with a synchronous fast path. Taking a free slot and giving it
    back are two plain calls, where `async with Semaphore` makes and steps
    three coroutines (on Pyodide every one costs CPU). A slot given back
    while others wait passes straight to the first of them."""

    __slots__ = ("_free", "_waiting")

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiting: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """Take a slot if one is free and nobody is waiting for one."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot (after take_now() said no)."""
        if self.take_now():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(waiter)
            raise

    def give(self) -> None:
        """Give a slot back: to the first job still waiting, else to the pool."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


__all__ = [
    "PLANS",
    "Meter",
    "MeteredBinding",
    "MeteredEnv",
    "Plan",
    "Slots",
    "SubrequestLimitExceeded",
]
