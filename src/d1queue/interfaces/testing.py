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

SqliteD1, and what a database holds, are the store's (store/sqlite_d1.py):
this module offers them under the kit's documented names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, Unpack

from ..core.bounds import json_loads
from ..core.config import Config
from ..core.context import Fetch
from ..core.job import QueuedJob, now_ms
from ..core.limits import PLANS, Meter
from ..core.outcomes import Outcome
from ..core.registry import Overrides, Registry
from ..features.drain import Budget, Drain, DrainReport, drain, leased
from ..store.failed import FailedJob
from ..store.queue import D1Queue
from ..store.sqlite_d1 import MIGRATIONS as MIGRATIONS
from ..store.sqlite_d1 import D1Error as D1Error
from ..store.sqlite_d1 import Fault as Fault
from ..store.sqlite_d1 import Row as Row
from ..store.sqlite_d1 import SqliteD1 as SqliteD1
from ..store.sqlite_d1 import SqliteStatement as SqliteStatement
from ..store.sqlite_d1 import completed_jobs, failed_jobs, queued_jobs
from ..store.sqlite_d1 import database as database


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
    jobs = queued_jobs(db)
    return [j for j in jobs if (name is None or j.name == name) and (queue in (None, j.queue))]


def completed(db: SqliteD1, name: str | None = None, queue: str | None = None) -> list[Any]:
    """The completed jobs kept in `db` (those of job `name`, on `queue`, if
    given), oldest completion first, each with `result`: its handler's return
    value (None when it returned nothing)."""
    jobs = completed_jobs(db)
    return [j for j in jobs if (name is None or j.name == name) and (queue in (None, j.queue))]


def failed(db: SqliteD1, name: str | None = None, queue: str | None = None) -> list[FailedJob]:
    """The failed jobs in `db` (those of job `name`, on `queue`, if given),
    oldest failure first; each `payload` is the stored JSON text."""
    jobs = failed_jobs(db)
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
            metrics=self.config.metrics,
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
