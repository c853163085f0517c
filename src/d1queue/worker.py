"""The drain: claim → run → settle in rounds until the queues are empty or a
budget is spent. A claim takes over a job whose lease lapsed (its worker died
or overran) when it meets one, so there is no separate reclaim step.

A round costs two D1 queries whatever its size: the previous round's settle
statements travel in one batch with this round's candidate SELECT, then the
claim batch; the last round's settle goes alone. Before each round the drain
checks that the round and the settle it will owe fit in what is left of the
invocation's subrequests (its handlers' declared ones included), so it never
claims jobs it could not settle; it claims no more jobs than can finish inside
their lease (`D1Queue.reservation_s`), waiting for a handler slot included,
so no job runs past its lease; and it starts no round after the time budget.

Settling never depends on claiming: if the batch carrying a round's outcomes
fails, they are settled on their own (one by one if need be), the run stops
claiming, and whatever D1 refused every time is reported as unsettled.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections.abc import Callable, Coroutine, Generator
from dataclasses import asdict, dataclass, field, replace
from heapq import heapreplace
from typing import Any, TypeVar, cast

from .config import ALL_QUEUES, Config, ConfigError
from .context import DrainContext, Fetch, JobContext
from .errors import Fail, Retry
from .job import QueuedJob
from .limits import PLANS, Meter, Slots
from .outbound import strip_credentials
from .queue import D1Queue, Mark, Outcome, exhausted_outcome
from .registry import Backoff, JobSpec, Registry
from .stats import RunCounts
from .stats import record as record_counts

MAX_ERROR_CHARS = 4000
"""last_error and the failed table's error are kept short: they are read by
people, and every byte is stored and billed."""


@dataclass
class DrainReport:
    claimed: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    stale: int = 0
    reclaimed: int = 0
    rounds: int = 0
    queries: int = 0
    statements: int = 0
    rows_read: int = 0
    rows_written: int = 0
    subrequests: int = 0
    """Subrequests the invocation spent during the drain, handlers' included."""
    resent: int = 0
    """Outcomes written through a re-send after a lost reply (counted in
    completed, retried or failed too); `stale` are those another worker held."""
    unsettled: list[str] = field(default_factory=list)
    """Ids of jobs whose outcome D1 refused every time: their lease will lapse
    and they will run again."""
    error: str = ""
    """The D1 error that stopped the run early ("d1_error"), if one did."""
    elapsed_s: float = 0.0
    paused: list[str] = field(default_factory=list)
    stopped: str = ""
    """Why the drain ended: "empty"; "time_budget", "query_budget" (the
    subrequests left could not pay for another round), "max_jobs" (the run's
    job cap, its CPU bound) or "window" (what is left to run would not finish
    inside the invocation's window: the cron runs it) or "d1_error" (D1
    failed past its retries; what the run held was settled first)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def succeeded(self) -> int:
        """`completed` by its earlier public name, kept for callers that read it."""
        return self.completed


def round_cost(k: int, owed: int, batch_counts_as: str, queues: int = 1) -> int:
    """Worst-case budget a round claiming `k` jobs needs, with `owed` settle
    statements of the previous round still to send: the batch carrying them
    and a SELECT for each of the round's `queues` (sent on its own when the
    round has no candidates read ahead), the claim batch (k UPDATEs and the
    next round's SELECTs), and the settle this round will owe (up to 2
    statements a job, when every job fails)."""
    if batch_counts_as == "query":
        return 3
    return (owed + queues) + (k + queues) + 2 * k


def _describe(exc: BaseException) -> str:
    """`Type: message` and where it was raised, for last_error."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}" for f in frames)
    text = f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")
    return _error_text(text)


def _error_text(text: str) -> str:
    """An error as stored with its job: bounded, and with no URL's
    `user:password@` in it (the dashboard and the API show errors)."""
    return strip_credentials(text[: MAX_ERROR_CHARS * 2])[:MAX_ERROR_CHARS]


T = TypeVar("T")

if sys.version_info >= (3, 12):

    def _eager(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A task run at once, in this step, up to its first wait: a job
        whose handler never waits is done when this returns. On Pyodide every
        event-loop callback (a task's first step, a done callback, a timer)
        is a JS macrotask costing tens of microseconds of CPU; with
        create_task, gather and wait_for a no-op job took about four."""
        return asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True)

else:  # no eager tasks before Python 3.12 (CPython tests only: Workers run 3.13+)

    def _eager(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        return asyncio.ensure_future(coro)


class _Started:
    """A coroutine already past its first step, awaitable for the rest of its
    run: what `yield from` does, for a coroutine that was started by hand."""

    __slots__ = ("_coro", "_signal")

    def __init__(self, coro: Coroutine[Any, Any, Any], signal: Any) -> None:
        self._coro = coro
        self._signal = signal

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, signal = self._coro, self._signal
        while True:
            try:
                sent = yield signal
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation (the timeout) or a throw
                try:
                    signal = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    signal = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _call(job: QueuedJob, spec: JobSpec, ctx: JobContext | None) -> Outcome:
    """Run the job's handler for at most its timeout and decide the outcome
    from how it ended. It runs in the caller's task, not one of its own (on
    Pyodide a task costs CPU, and the job already has one: see _eager); its
    first step runs at once, and the timer (a JS setTimeout on Pyodide) is
    armed only for a handler still running after it."""
    try:
        # The handler's coroutine itself, not spec.call's wrapper around it:
        # one coroutine fewer to make and step per job (the registry admits
        # only coroutine functions, so this is what call() would await).
        handler = spec.handler
        coro = cast(
            "Coroutine[Any, Any, Any]",
            handler(job.payload, ctx) if spec.wants_context else handler(job.payload),
        )
        try:
            signal = coro.send(None)
        except StopIteration:
            pass
        else:
            await asyncio.wait_for(_Started(coro, signal), spec.timeout_s)
    except Fail as exc:
        return Outcome(job, "fail", error=_error_text(f"failed by the handler: {exc}"))
    except Retry as exc:
        return retry_or_fail_outcome(job, spec, _error_text(f"retry requested: {exc}"), exc.delay_s)
    except TimeoutError:
        return retry_or_fail_outcome(job, spec, f"timed out after {spec.timeout_s:g}s")
    except Exception as exc:
        return retry_or_fail_outcome(job, spec, _describe(exc))
    return Outcome(job, "complete")


def retry_or_fail_outcome(
    job: QueuedJob, spec: JobSpec | None, error: str, delay_s: float | None = None
) -> Outcome:
    """Run again after the backoff (or `delay_s`), unless that was the last attempt."""
    if job.attempts >= job.max_attempts:
        return Outcome(job, "fail", error=f"{error} (attempt {job.attempts} of {job.max_attempts})")
    backoff = spec.backoff if spec is not None else Backoff()
    delay = backoff.delay_s(job.attempts) if delay_s is None else delay_s
    return Outcome(job, "retry", delay_s=delay, error=error)


async def outcome_of(job: QueuedJob, registry: Registry, ctx: JobContext) -> Outcome:
    """Run one claimed job and decide its outcome. Never raises for anything
    the job did: a bad job fails alone and the drain goes on."""
    return await _attempt(job, registry.get(job.name), ctx)


def _decided(job: QueuedJob, spec: JobSpec | None) -> Outcome | None:
    """The outcome of a job that must not run (None: run it): its attempts
    were spent by a worker that died, its payload does not decode, or no
    handler has its name."""
    if job.exhausted:
        return exhausted_outcome(job)
    if job.payload_error:
        return Outcome(job, "fail", error=job.payload_error)
    if spec is None:
        return Outcome(job, "fail", error=f"no handler is registered for job name {job.name!r}")
    return None


async def _attempt(job: QueuedJob, spec: JobSpec | None, ctx: JobContext) -> Outcome:
    """outcome_of with the job's spec already looked up."""
    decided = _decided(job, spec)
    if decided is not None or spec is None:
        return cast("Outcome", decided)
    return await _call(job, spec, ctx)


SETTLE_MARGIN_S = 2.0
"""Time kept between a job's worst-case finish and the end of its lease or of
the invocation's window, for the settle that records its outcome."""


async def drain(
    queue: D1Queue,
    registry: Registry,
    config: Config | None = None,
    *,
    env: Any = None,
    fetch: Fetch | None = None,
    meter: Meter | None = None,
    window_s: float | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    **settings: Any,
) -> DrainReport:
    """Drain `config.queues` (paused ones skipped) within the budgets; see the
    module docstring.

    `env` and `fetch` are what handlers reach through their ctx (the Worker's
    env and outbound fetch). `meter` is the invocation's subrequest meter
    (default: a fresh one for `config.plan`); the drain plans every round
    with what it has left, its handlers' declared subrequests included.
    `window_s` is how long the invocation may still run (drain-on-push runs
    inside `waitUntil`, cut 30 s after the response): only jobs that can
    finish inside it are claimed, the cron takes the rest. Keyword
    `settings` override `config`'s fields (`drain(q, reg, queues=["mail"],
    batch_size=10)`) and are validated as Config's are."""
    config = config or Config()
    if settings:
        if "queues" in settings:  # a list, a tuple, or one name
            q = settings["queues"]
            settings["queues"] = (q,) if isinstance(q, str) else tuple(q)
        config = replace(config, **settings)
    if config.reservation_s is not None and config.reservation_s != queue.reservation_s:
        queue = queue.derive(reservation_s=config.reservation_s)  # every claim's lease
    longest = registry.max_timeout_s()
    outbound = config.outbound  # what handlers' fetch may reach
    if queue.reservation_s < longest + SETTLE_MARGIN_S:
        raise ConfigError(
            f"the lease ({queue.reservation_s:g}s) must cover the longest job timeout "
            f"({longest:g}s) and {SETTLE_MARGIN_S:g}s to settle it, or a job still "
            "running could be reclaimed and run twice"
        )
    if queue.registry is None:
        queue = queue.derive(registry=registry)  # ctx.queue.dispatch applies job defaults
    meter = meter or queue.binding.meter or Meter.for_plan(PLANS[config.plan])
    queue = queue.metered(meter)
    usage = queue.binding.usage
    base = (usage.queries, usage.statements, usage.rows_read, usage.rows_written)
    used0 = meter.used
    per_statement = config.batch_counts_as == "statements"

    def left() -> int:
        """Subrequests this drain may still plan: its budget less what the
        invocation has spent since it started (handlers included), within the
        invocation's caps. With batches counted per statement, a batch costs
        its statements."""
        spent = meter.used - used0
        if per_statement:
            spent += (usage.statements - base[1]) - (usage.queries - base[0])
        # Kept back for the run's counters, sent after the last settle.
        return min(config.budget - spent, meter.left()) - config.stats_reserve

    def claim_and_settle(n: int) -> int:
        """The claim batch of `n` jobs and the settle it will owe (every job
        failing: two statements each)."""
        return 1 + 1 if not per_statement else n + 2 * n

    most = config.budget - 3  # a fresh drain's room for one job's handler

    start = monotonic()
    report = DrainReport()

    def finish() -> DrainReport:
        report.queries = usage.queries - base[0]
        report.statements = usage.statements - base[1]
        report.rows_read = usage.rows_read - base[2]
        report.rows_written = usage.rows_written - base[3]
        report.subrequests = meter.used - used0
        report.elapsed_s = round(monotonic() - start, 3)
        return report

    slots = Slots(config.concurrency)

    async def run(job: QueuedJob) -> Outcome:
        spec = registry.get(job.name)
        if spec is not None and spec.subrequests > most and not job.exhausted:
            return Outcome(
                job,
                "fail",
                error=f"job {job.name!r} declares {spec.subrequests} subrequests per attempt, "
                f"but a drain on this configuration can give a job at most {most} "
                "(D1QUEUE_PLAN, D1QUEUE_QUERY_BUDGET)",
            )
        # A handler that takes no ctx gets none: nothing can reach its budget.
        # For one that does, the budget and the metered queue and env are made
        # only if it reaches for them (DrainContext).
        ctx = (
            DrainContext(
                job,
                parent=meter,
                declared=spec.subrequests,
                queue=queue,
                env=env,
                http=fetch,
                outbound=outbound,
            )
            if spec is not None and spec.wants_context
            else None
        )
        if not slots.take_now():
            await slots.take()
        try:
            outcome = _decided(job, spec)
            if outcome is None and spec is not None:
                outcome = await _call(job, spec, ctx)
        finally:
            slots.give()
        outcome = cast("Outcome", outcome)
        if ctx is not None and ctx.refused is not None and outcome.action == "complete":
            # The handler caught the refusal and returned: its work is not
            # whole, and this attempt must not count as done.
            outcome = retry_or_fail_outcome(job, spec, _describe(ctx.refused))
        return outcome

    stop = ""  # why admit() refused the rest of a round's candidates
    windowed = False  # some job was left for the cron: too long for the window

    def admit(candidates: list[QueuedJob]) -> list[QueuedJob]:
        """The candidates this round may claim, in order: those whose declared
        subrequests fit in what the invocation has left (stopping at the first
        that does not, so a large job is not starved by small ones behind it);
        as many as can finish inside the lease, each held from the claim until
        it has waited for a slot and run its whole timeout, with time left to
        settle (the rest wait for the next round); and, with a window, only
        those that can finish inside it too."""
        nonlocal stop
        room = left()
        elapsed = monotonic() - start
        lease = queue.reservation_s
        chosen: list[QueuedJob] = []
        # When each handler slot frees at the latest, the chosen jobs started
        # in order and each running its whole timeout: a candidate is held
        # from the claim until the earliest slot frees and it has run too.
        # (A heap: its first is the earliest; which of equal ones is taken
        # makes no difference.)
        slots = [0.0] * config.concurrency
        declared = 0
        for job in candidates:
            spec = registry.get(job.name)
            need = spec.subrequests if spec and spec.subrequests <= most else 0
            held_for = slots[0] + (spec.timeout_s if spec else 0.0)
            if window_s is not None and elapsed + held_for + SETTLE_MARGIN_S > window_s:
                stop = stop or "window"
                continue  # too long for this invocation: the cron runs it
            if held_for + SETTLE_MARGIN_S > lease:
                stop = stop or "lease"  # it would wait for a slot past its lease
                break
            if claim_and_settle(len(chosen) + 1) + declared + need > room:
                stop = "query_budget"
                break
            chosen.append(job)
            declared += need
            heapreplace(slots, held_for)
        return chosen

    listed = list(config.listed_queues)
    try:
        paused, found = await queue.survey(every_queue=config.queues[-1] == ALL_QUEUES)
    except Exception as exc:  # D1 is failing: nothing is held yet
        report.stopped, report.error = "d1_error", _describe(exc)
        return finish()
    # The listed queues first, in their order, then (with "*") every other
    # queue holding jobs, by name. Each round offers each queue an equal share.
    names = listed + [q for q in found if q not in listed]
    active = [q for q in names if q not in paused]
    report.paused = sorted(paused & set(names))
    lost = 0
    turn = 0
    pending: list[Outcome] = []  # the last round's outcomes, not yet settled
    # The next round's candidates per queue, read by the last claim batch:
    # a round that has them for its queues is one round trip.
    ahead: dict[str, list[QueuedJob]] = {}
    counts = RunCounts()  # for the per-minute counters (stats.py)

    def record(outcomes: list[Outcome], marks: list[Mark]) -> None:
        add = counts.add
        for outcome, mark in zip(outcomes, marks, strict=True):
            action = outcome.action
            if mark == "written":
                add(outcome.job.queue, action)
            elif mark == "resent":
                add(outcome.job.queue, action)
                report.resent += 1
            elif mark == "stale":
                report.stale += 1
                continue
            else:  # unsettled
                report.unsettled.append(outcome.job.id)
                continue
            if action == "complete":
                report.completed += 1
            elif action == "retry":
                report.retried += 1
            else:
                report.failed += 1

    while True:
        if not active:
            report.stopped = "empty"
            break
        if monotonic() - start >= config.time_budget_s:
            report.stopped = "time_budget"
            break
        if report.claimed >= config.job_cap:
            report.stopped = "max_jobs"
            break
        room = left()
        owed = len(pending) + [o.action for o in pending].count("fail")
        k = min(config.batch_size, config.job_cap - report.claimed)
        # The round's queues: as many as it has jobs to claim, in turn.
        m = min(len(active), k)
        while k > 0 and round_cost(k, owed, config.batch_counts_as, m) > room:
            k -= 1
            m = min(m, k)
        if k == 0:
            report.stopped = "query_budget"
            break
        turns = [active[(turn + i) % len(active)] for i in range(m)]
        share = -(-k // m)  # an equal share, rounded up: k is the round's cap
        stop = ""
        # No read-ahead for a round that takes the run to its job cap (a
        # free-plan consumer's only round, say): nothing would use it.
        more = report.claimed + k < config.job_cap
        done = await queue.settle_and_claim(
            pending, {q: share for q in turns}, k, admit=admit, ahead=ahead, read_ahead=more
        )
        jobs, candidates = done.jobs, done.candidates
        ahead = done.ahead or {}
        record(pending, done.marks)
        report.reclaimed += done.reclaimed
        pending = []
        report.rounds += 1
        if done.error is not None:
            # D1 failed past its retries: what was held is settled; claim no
            # more this run.
            report.stopped, report.error = "d1_error", _describe(done.error)
            break
        for name in turns:
            if not done.found.get(name):
                active.remove(name)  # nothing ready on this queue
        if not candidates:
            continue
        if stop == "query_budget" and not jobs:
            report.stopped = "query_budget"
            break
        windowed = windowed or stop == "window"
        if stop == "window" and not jobs:
            for name in turns:  # what is ready there is the cron's to run
                if name in active:
                    active.remove(name)
            continue
        if not jobs:
            # Every candidate went to another drain running at the same time;
            # the queues are not empty. Try again, a bounded number of times.
            lost += 1
            if lost >= queue.max_claim_attempts:
                break
            continue
        lost = 0
        if not stop:
            # A queue with nothing left after this round's claims is done: the
            # SELECT that read ahead found nothing there, or (without one) it
            # offered fewer jobs than its share. Jobs pushed from now on wait
            # for the next run (or start a drain of their own).
            for name in turns:
                if name in active and (
                    not ahead.get(name)
                    if done.ahead is not None
                    else done.found.get(name, 0) < share
                ):
                    active.remove(name)
        if active:
            turn = (turn + m) % len(active)
        report.claimed += len(jobs)
        # Eager tasks, awaited only if still running: no event-loop callback
        # for a job that never waits (see _eager).
        tasks = [_eager(run(job)) for job in jobs]
        running = [t for t in tasks if not t.done()]
        if running:
            await asyncio.wait(running)
        pending = [t.result() for t in tasks]
        if stop == "query_budget":
            report.stopped = "query_budget"  # the next round could not be paid for
            break
    if pending:  # every budget check reserved room for this
        record(pending, await queue.settle_outcomes(pending))
    if report.stopped == "empty" and windowed:
        report.stopped = "window"
    if config.stats and not counts.empty:
        # One statement, at most one row written; left() kept room for it.
        await record_counts(queue.binding, counts, queue.clock())
    return finish()


__all__ = ["DrainReport", "drain", "outcome_of", "round_cost"]
