"""The drain: claim → run → settle in rounds until the queues are empty or a
budget is spent. A claim takes over a job whose lease lapsed (its worker died
or overran) when it meets one, so there is no separate reclaim step.

`drain` is a loop over the steps of a `Drain` (its state): `survey` the
queues, then for each round `plan` it within the budgets (`Budget.plan`),
`claim` it (sending the last round's settle with the claims, and recording
it), `run` its jobs; then `settle` the last round and `close` the report.

What it sends, one line a D1 round trip:

    survey    the paused queues (with "*", and the queues holding jobs)
    round 1   the candidate SELECT (one a queue, in one batch if several)
              batch[claims, the next round's candidate SELECTs]
    round n   batch[round n-1's settle, claims, the next round's SELECTs]
    last      batch[the last round's settle]
              the UPSERT of the run's counts (if it counted any)

So a round after the first is one round trip when the previous claim batch
read its candidates ahead. It is two (the settle travels with a fresh
SELECT) when it did not: the previous round claimed nothing, or this round
serves other queues. A round that takes the run to its job cap reads nothing
ahead. Re-sends after a lost reply, and settles D1 refused, cost more
(store/claim.py's `settle_and_claim`, store/settle.py's `settle_outcomes`).

Before each round the drain checks that its worst case fits in what is left
of the invocation's subrequests, the run's counters kept back: the candidates
read on their own, the claims and the settle the round will owe, its
handlers' declared subrequests included (`round_cost`, one formula for the
plan and for each job admitted), so it claims no job it could not settle
(with batches counted per statement, `Budget.admit` says where a job's
declared subrequests can take the room kept for a read-ahead). It claims no
more jobs than can finish inside their lease (`D1Queue.reservation_s`),
waiting for a handler slot included, so no job runs past its lease; and it
starts no round after the time budget.

Settling never depends on claiming: if the batch carrying a round's outcomes
fails, they are settled on their own (one by one if need be), the run stops
claiming, and whatever D1 refused every time is reported as unsettled.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from heapq import heapreplace
from typing import Any, TypeVar, cast

from ..core.config import ALL_QUEUES, Config, ConfigError
from ..core.context import DrainContext, Fetch, JobContext
from ..core.costs import LEAST_ROUND, round_cost
from ..core.flow import Flow
from ..core.job import QueuedJob
from ..core.limits import PLANS, Meter, Slots
from ..core.log import event, get
from ..core.metrics import Tally
from ..core.outbound import Outbound
from ..core.outcomes import (
    Mark,
    Outcome,
    cancelled_outcome,
    completed,
    decided,
    describe,
    ending,
    history_kept,
    raised,
    refused,
)
from ..core.registry import JobSpec, Registry
from ..core.telemetry import (
    JOB_LOG_LEVELS,
    OUTCOMES,
    PROCESS_EVENT,
    PROCESS_LOGGER,
    notable,
    process_fields,
)
from ..store.cancel import marked as cancel_marked
from ..store.queue import D1Queue
from ..store.settle import record_progress
from ..store.stats import RunCounts
from ..store.stats import record as record_counts
from .analytics import Points


@dataclass
class DrainReport:
    claimed: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    stale: int = 0
    reclaimed: int = 0
    limited: int = 0
    """Claims a queue's flow limits refused (the jobs stay queued), and
    queues found at their limit before any job was read."""
    rounds: int = 0
    queries: int = 0
    statements: int = 0
    rows_read: int = 0
    rows_written: int = 0
    subrequests: int = 0
    """Subrequests the invocation spent during the drain, handlers' included."""
    data_points: int = 0
    """Analytics Engine data points the drain wrote (features/analytics.py)."""
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
    from how it ended (core/outcomes.py). It runs in the caller's task, not
    one of its own (on Pyodide a task costs CPU, and the job already has
    one: see _eager); its first step runs at once, and the timer (a JS
    setTimeout on Pyodide) is armed only for a handler still running after
    it."""
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
        except StopIteration as stop:
            value = stop.value
        else:
            value = await asyncio.wait_for(_Started(coro, signal), spec.timeout_s)
    except Exception as exc:
        return raised(job, spec, exc)
    if value is not None and ctx is not None and not ctx.keeps_result:
        # A queue keeping no history ignores the value, as before results
        # were kept: no check, no cost.
        return Outcome(job, "complete")
    return completed(job, value)


async def _watched(
    job: QueuedJob, spec: JobSpec, ctx: DrainContext, marked: Callable[[Meter], Awaitable[bool]]
) -> Outcome:
    """`_call` for a job whose handler declares a cancel watch: its handler
    runs in a task of its own, and every `cancel_watch_s` while it runs one
    query reads whether a cancel marked the job (`marked`, metered by a
    child of the attempt's budget holding spec.watches, so a watch never
    takes a subrequest the handler's own calls were given). Found marked,
    `ctx.cancelled` is set and the task cancelled (asyncio.CancelledError
    in the handler): the job ends cancelled, whatever the handler then
    returns. A handler that ended before a watch found the mark keeps its
    outcome."""
    every = spec.cancel_watch_s
    assert every is not None
    task = asyncio.ensure_future(_call(job, spec, ctx))
    budget = ctx.meter
    watches = budget.child(spec.watches, label=f"job {job.name!r}'s cancel watches")
    try:
        while True:
            await asyncio.wait((task,), timeout=every)
            if task.done():
                return task.result()
            if watches.left() < 1:
                return await task  # no watch left in its plan: it runs to its end
            refused = budget.refused
            try:
                found = await marked(watches)
            except Exception as exc:  # D1 failing past its retries, or the meter
                # A watch refused by the attempt's budget is not the
                # handler's refusal: its outcome stands (outcomes.refused).
                budget.refused = refused
                event(
                    log, "d1queue.cancel.watch_failed", logging.WARNING, id=job.id, error=str(exc)
                )
                continue
            if found and not task.done():
                ctx.cancelled = True
                task.cancel()
                # Its cleanup runs; what it returns or raises is dropped.
                await asyncio.wait((task,))
                return cancelled_outcome(job, "its drain found the mark and cancelled its handler")
    except BaseException:
        task.cancel()  # the drain itself is cancelled: take the handler with it
        raise


plog = get(PROCESS_LOGGER)
log = get(__name__)

SETTLE_MARGIN_S = 2.0
"""Time kept between a job's worst-case finish and the end of its lease or of
the invocation's window, for the settle that records its outcome."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One round, as planned before it is claimed."""

    k: int
    """The most jobs it claims."""
    queues: list[str]
    """The queues it reads candidates from, in turn."""
    share: int
    """The most candidates each queue offers: an equal share of `k`, rounded up."""
    read_ahead: bool
    """Whether its claim batch reads the next round's candidates."""


@dataclass(frozen=True, slots=True)
class Budget:
    """What one drain may spend, fixed when it starts. `plan` and `admit` are
    the decisions taken from it and what is left; each depends only on its
    arguments, so each can be tested alone."""

    subrequests: int
    """D1QUEUE_QUERY_BUDGET: the drain's subrequests, its handlers' included."""
    jobs: int
    """D1QUEUE_MAX_JOBS: the jobs one run claims, its CPU bound."""
    time_s: float
    """D1QUEUE_TIME_BUDGET_S: no round starts after this."""
    batch_size: int
    concurrency: int
    lease_s: float
    """Every claim's lease: a job must finish inside it, or another drain may
    take it over and run it a second time."""
    window_s: float | None = None
    """How long the invocation may still run (None: no limit but the others)."""
    per_statement: bool = False
    """A batch costs its statements (D1QUEUE_BATCH_COUNTS_AS = "statements")."""
    reserve: int = 0
    """Subrequests kept back for the run's counters, sent after the last settle."""
    metrics: bool = False
    """Settles carry the job metrics' UPSERTs (store/metrics.py): with
    batches counted per statement, one more statement a settle."""
    most: int = field(init=False)
    """The most subrequests a job's handler can be given: what a fresh drain
    has once the cheapest round is paid for. A job declaring more fails."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "most", self.subrequests - LEAST_ROUND)

    @classmethod
    def of(cls, config: Config, lease_s: float, window_s: float | None = None) -> Budget:
        return cls(
            subrequests=config.budget,
            jobs=config.job_cap,
            time_s=config.time_budget_s,
            batch_size=config.batch_size,
            concurrency=config.concurrency,
            lease_s=lease_s,
            window_s=window_s,
            per_statement=config.batch_counts_as == "statements",
            reserve=config.stats_reserve,
        )

    def plan(
        self, active: list[str], turn: int, claimed: int, owed: int, room: int, elapsed: float
    ) -> Plan | str:
        """The next round, or why there is none ("empty", "time_budget",
        "max_jobs", "query_budget"). `active` are the queues that may still
        hold jobs, `turn` the first of them this round serves, `claimed` the
        jobs claimed so far, `owed` the settle statements of the last round
        not yet sent, `room` the subrequests left, `elapsed` the seconds since
        the drain started. The round takes as many jobs as its batch size and
        the job cap allow, fewer while its worst case (`round_cost`: the
        candidates read on their own, not ahead) does not fit in `room`; it
        reads from as many queues as it has jobs to claim, in turn."""
        if not active:
            return "empty"
        if elapsed >= self.time_s:
            return "time_budget"
        if claimed >= self.jobs:
            return "max_jobs"
        k = min(self.batch_size, self.jobs - claimed)
        m = min(len(active), k)
        per_statement = self.per_statement
        metrics = self.metrics
        while (
            k > 0 and round_cost(k, owed, m, m, per_statement=per_statement, metrics=metrics) > room
        ):
            k -= 1
            m = min(m, k)
        if k == 0:
            return "query_budget"
        n = len(active)
        # No read-ahead for a round that takes the run to its job cap (a
        # free-plan consumer's only round, say): nothing would use it.
        return Plan(
            k, [active[(turn + i) % n] for i in range(m)], -(-k // m), claimed + k < self.jobs
        )

    def admit(
        self,
        candidates: list[QueuedJob],
        registry: Registry,
        room: int,
        elapsed: float,
        carried: int = 0,
        flows: Mapping[str, Flow] | None = None,
    ) -> tuple[list[QueuedJob], str]:
        """The candidates a round claims, in order, and why it left the rest
        ("" if none was left):

        - "query_budget": stop at the first whose claim, settle (the claims
          and settle of `round_cost` with nothing else) and declared
          subrequests, with those chosen before it, do not fit in `room`, so
          a large job is not starved by small ones behind it;
        - "lease": stop at the first that could not finish inside its lease,
          held from the claim until the earliest handler slot frees and it
          has run its whole timeout, with SETTLE_MARGIN_S to settle it (the
          rest wait for the next round);
        - "window": skip those that could not finish inside the window
          (`elapsed` is how much of it is gone): the cron runs them.

        `carried` statements ride in the claim batch besides the claims (the
        owed settle when the candidates were read ahead, the next round's
        SELECTs): with per-statement counting they are priced with the
        first job, so declared subrequests never take their room.

        `flows`: a claim under flow limits carries a statement per limit row
        it takes (priced as `carried`), and a job of a rate-limited queue is
        claimed only if a handler slot is free for it now ("limit"): a
        rate counts claims, and a handler that waited for a slot would start
        later than its claim by more than the rate's guard."""
        most = self.most
        per_statement = self.per_statement
        window_s = self.window_s
        lease = self.lease_s
        stop = ""
        chosen: list[QueuedJob] = []
        # When each handler slot frees at the latest, the chosen jobs started
        # in order and each running its whole timeout: a candidate is held
        # from the claim until the earliest slot frees and it has run too.
        # (A heap: its first is the earliest; which of equal ones is taken
        # makes no difference.)
        slots = [0.0] * self.concurrency
        declared = 0
        for job in candidates:
            spec = registry.get(job.name)
            need = spec.subrequests if spec and spec.subrequests <= most else 0
            flow = flows.get(job.queue) if flows else None
            if flow is not None and flow.limits.rated and slots[0] > 0:
                stop = stop or "limit"
                continue
            held_for = slots[0] + (spec.timeout_s if spec else 0.0)
            if window_s is not None and elapsed + held_for + SETTLE_MARGIN_S > window_s:
                stop = stop or "window"
                continue  # too long for this invocation: the cron runs it
            if held_for + SETTLE_MARGIN_S > lease:
                stop = stop or "lease"  # it would wait for a slot past its lease
                break
            # Flow rows a claim takes, and a workflow's job's end (its
            # failure's third settle statement, END_HELD).
            takes = (flow.limits.rows if flow is not None else 0) + int(job.workflow)
            cost = round_cost(
                len(chosen) + 1,
                owed=carried + takes,
                per_statement=per_statement,
                metrics=self.metrics,
            )
            if cost + declared + need > room:
                stop = "query_budget"
                break
            chosen.append(job)
            carried += takes
            declared += need
            heapreplace(slots, held_for)
        return chosen, stop


class Drain:
    """One drain's state, from its survey to its report: the steps `plan`,
    `claim`, `run`, `settle` and `close` move it on; see `drain`."""

    __slots__ = (
        "active",
        "ahead",
        "base",
        "budget",
        "counts",
        "env",
        "fetch",
        "flows",
        "keeps",
        "lost",
        "meter",
        "monotonic",
        "outbound",
        "pending",
        "queue",
        "registry",
        "report",
        "slots",
        "start",
        "stats",
        "stop",
        "tally",
        "turn",
        "usage",
        "used0",
        "windowed",
    )

    def __init__(
        self,
        queue: D1Queue,
        registry: Registry,
        budget: Budget,
        meter: Meter,
        *,
        env: Any = None,
        fetch: Fetch | None = None,
        outbound: Outbound | None = None,
        stats: bool = False,
        tally: Tally | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queue = queue.derive(binding=queue.binding.metered(meter))
        self.registry = registry
        self.keeps = partial(history_kept, queue.keep_completed, queue.registry)
        """Whether a queue keeps its completed jobs, and so their results."""
        self.budget = budget
        self.meter = meter
        self.env = env
        self.fetch = fetch
        self.outbound = outbound  # what handlers' fetch may reach
        self.stats = stats
        self.monotonic = monotonic
        self.usage = usage = self.queue.binding.usage
        self.base = (usage.queries, usage.statements, usage.rows_read, usage.rows_written)
        self.used0 = meter.used
        self.start = monotonic()
        self.report = DrainReport()
        self.slots = Slots(budget.concurrency)
        self.active: list[str] = []
        """The queues that may still hold jobs, in the order rounds serve them."""
        self.turn = 0
        """The index in `active` of the queue the next round serves first."""
        self.lost = 0
        """Rounds in a row whose every candidate another drain took."""
        self.pending: list[Outcome] = []
        """The last round's outcomes, settled by the next claim batch."""
        self.ahead: dict[str, list[QueuedJob]] = {}
        """The next round's candidates per queue, read by the last claim
        batch: a round that has them for its queues is one round trip."""
        self.counts = RunCounts()  # for the per-minute counters (stats.py)
        self.tally = tally
        """What it settled per (queue, name, outcome), for Analytics Engine."""
        self.stop = ""
        """Why the current round's admission left candidates ("" if none)."""
        self.windowed = False
        """Some job was left for the cron: too long for the window."""
        self.flows: dict[str, Flow] = {}
        """The queues with flow control (limits, groups), from the survey."""

    def left(self) -> int:
        """Subrequests this drain may still plan: its budget less what the
        invocation has spent since it started (handlers included), within the
        invocation's caps, less the counters' reserve. With batches counted
        per statement, a batch costs its statements."""
        usage, base, budget = self.usage, self.base, self.budget
        spent = self.meter.used - self.used0
        if budget.per_statement:
            spent += (usage.statements - base[1]) - (usage.queries - base[0])
        return min(budget.subrequests - spent, self.meter.left()) - budget.reserve

    async def survey(self, listed: list[str], every_queue: bool) -> bool:
        """Read the paused queues (and with `every_queue` the queues holding
        jobs) in one round trip, and order the queues to drain: the `listed`
        ones first, in their order, then every other queue found, by name.
        False if D1 failed (the report says so): nothing is held yet."""
        report = self.report
        try:
            paused, found, self.flows = await self.queue.survey(every_queue=every_queue)
        except Exception as exc:
            report.stopped, report.error = "d1_error", describe(exc)
            return False
        names = listed + [q for q in found if q not in listed]
        self.active = [q for q in names if q not in paused]
        report.paused = sorted(paused & set(names))
        return True

    def plan(self) -> Plan | None:
        """The next round within the budgets (Budget.plan), or None with the
        reason in the report."""
        pending = self.pending
        owed = len(pending) + [o.action for o in pending].count("fail")
        if pending and self.budget.metrics:
            owed += 1  # the metrics' UPSERT (round_cost)
        plan = self.budget.plan(
            self.active,
            self.turn,
            self.report.claimed,
            owed,
            self.left(),
            self.monotonic() - self.start,
        )
        if isinstance(plan, str):
            self.report.stopped = plan
            return None
        return plan

    def admit(self, candidates: list[QueuedJob], carried: int = 0) -> list[QueuedJob]:
        """Budget.admit with what is left when the candidates are in hand
        (after the SELECT, when they were not read ahead), `carried`
        statements riding in the claim batch with them."""
        flows = self.flows
        chosen, self.stop = self.budget.admit(
            candidates,
            self.registry,
            self.left(),
            self.monotonic() - self.start,
            carried,
            flows=flows,
        )
        return chosen

    async def claim(self, plan: Plan) -> list[QueuedJob] | None:
        """Send the last round's settle and this round's claims
        (`D1Queue.settle_and_claim`: one round trip with the candidates read
        ahead, else two), record the settle, and drop the queues found empty.
        The jobs won; [] for a round that won none but leaves the drain going
        (no candidates, all too long for the window, all lost to another
        drain); None when the drain ends (the reason in the report)."""
        report, active, queue = self.report, self.active, self.queue
        turns = plan.queues
        self.stop = ""
        done = await queue.settle_and_claim(
            self.pending,
            {q: plan.share for q in turns},
            plan.k,
            admit=self.admit,
            ahead=self.ahead,
            read_ahead=plan.read_ahead,
            flows=self.flows,
        )
        jobs = done.jobs
        report.limited += done.limited
        self.ahead = done.ahead or {}
        self.record(self.pending, done.marks)
        report.reclaimed += done.reclaimed
        self.pending = []
        report.rounds += 1
        if done.error is not None:
            # D1 failed past its retries: what was held is settled; claim no
            # more this run.
            report.stopped, report.error = "d1_error", describe(done.error)
            return None
        for name in turns:
            if not done.found.get(name):
                active.remove(name)  # nothing ready on this queue (or at its limit)
        if done.limited:
            # A queue whose every claim this round a limit refused is at its
            # limit: other invocations hold its places. Its jobs wait for a
            # later run, which finds them free (or the guard says no: one query).
            won = Counter(j.queue for j in jobs)
            for name in turns:
                if name in self.flows and not won[name] and name in active:
                    active.remove(name)
        if not done.candidates:
            return []
        stop = self.stop
        if stop == "query_budget" and not jobs:
            report.stopped = "query_budget"
            return None
        self.windowed = self.windowed or stop == "window"
        if stop == "window" and not jobs:
            for name in turns:  # what is ready there is the cron's to run
                if name in active:
                    active.remove(name)
            return []
        if not jobs:
            # Every candidate went to another drain running at the same time;
            # the queues are not empty. Try again, a bounded number of times,
            # so contention cannot spin.
            self.lost += 1
            return None if self.lost >= queue.max_claim_attempts else []
        self.lost = 0
        if not stop:
            # A queue with nothing left after this round's claims is done: the
            # SELECT that read ahead found nothing there, or (without one) it
            # offered fewer jobs than its share. Jobs pushed from now on wait
            # for the next run (or start a drain of their own).
            ahead = done.ahead
            for name in turns:
                if name in active and (
                    not ahead.get(name)
                    if ahead is not None
                    else done.found.get(name, 0) < plan.share
                ):
                    active.remove(name)
        if active:
            self.turn = (self.turn + len(turns)) % len(active)
        report.claimed += len(jobs)
        if stop == "query_budget":
            report.stopped = "query_budget"  # the next round could not be paid for
        return jobs

    async def run(self, jobs: list[QueuedJob]) -> list[Outcome]:
        """Run a round's jobs, at most `concurrency` at once, and return their
        outcomes in order. Eager tasks, awaited only if still running: no
        event-loop callback for a job that never waits (see _eager)."""
        run_job = self.run_job
        tasks = [_eager(run_job(job)) for job in jobs]
        running = [t for t in tasks if not t.done()]
        if running:
            await asyncio.wait(running)
        return [t.result() for t in tasks]

    async def run_job(self, job: QueuedJob) -> Outcome:
        """One claimed job's outcome (core/outcomes.py), its handler run in
        a slot. Never raises for anything the job did."""
        spec = self.registry.get(job.name)
        clock = self.queue.clock
        # Its wait ends: the one start its process line and metrics share.
        job.started_at = clock()
        decision = decided(job, spec, self.budget.most)
        if decision is not None:
            return decision
        assert spec is not None  # decided fails a job no handler has
        # A handler that takes no ctx gets none: nothing can reach its budget.
        # For one that does, the budget and the metered queue and env are made
        # only if it reaches for them (DrainContext).
        # A cancel watch is metered by the attempt's budget: its ctx is made
        # for it even when the handler takes none.
        ctx = (
            DrainContext(
                job,
                parent=self.meter,
                declared=spec.subrequests,
                queue=self.queue,
                env=self.env,
                http=self.fetch,
                outbound=self.outbound,
                keeps=self.keeps,
                write_progress=record_progress,
            )
            if spec.wants_context or spec.cancel_watch_s is not None
            else None
        )
        slots = self.slots
        if not slots.take_now():
            await slots.take()
            job.started_at = clock()  # it waited for a handler slot
        try:
            if ctx is not None and spec.cancel_watch_s is not None:
                binding = self.queue.binding
                outcome = await _watched(
                    job, spec, ctx, lambda meter: cancel_marked(binding.metered(meter), job)
                )
            else:
                outcome = await _call(job, spec, ctx)
        finally:
            slots.give()
            job.ended_at = clock()
        if ctx is None:
            return outcome
        outcome = refused(outcome, spec, ctx.refused)
        kept = ctx.kept  # progress and log lines, for the attempt's history
        return outcome if kept is None else replace(outcome, record=kept)

    def record(self, outcomes: list[Outcome], marks: list[Mark]) -> None:
        """Count settled outcomes into the report and the run's counters,
        and log each job's process line (core/telemetry.py)."""
        if plog.isEnabledFor(logging.INFO):
            # A JSON line costs about what a job's share of the drain does
            # (CPU per job, bench/cpu_same.py): a plain completion logs at
            # DEBUG, which D1QUEUE_JOB_LOGS = "all" turns on.
            for outcome, mark in zip(outcomes, marks, strict=True):
                level = logging.INFO if notable(outcome, mark) else logging.DEBUG
                if level == logging.INFO or plog.isEnabledFor(level):
                    fields = process_fields(outcome, mark)
                    event(plog, PROCESS_EVENT, level, **fields)
        report = self.report
        add = self.counts.add
        tally = self.tally
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
            if tally is not None:
                job = outcome.job
                tally.add(
                    job.queue,
                    job.name,
                    OUTCOMES[ending(outcome)],
                    job.wait_ms,
                    job.run_ms,
                )
            if action == "complete":
                report.completed += 1
            elif action == "retry":
                report.retried += 1
            else:
                report.failed += 1

    async def settle(self) -> None:
        """Settle the last round's outcomes in a batch of their own (every
        plan reserved room for it), and record them."""
        pending = self.pending
        if pending:
            self.record(pending, await self.queue.settle_outcomes(pending))
            self.pending = []

    async def close(self) -> DrainReport:
        """Send the run's counters (one statement, at most one row written;
        `left` kept room for it) and complete the report."""
        report, queue = self.report, self.queue
        if report.stopped == "empty" and self.windowed:
            report.stopped = "window"
        if self.stats and not self.counts.empty:
            await record_counts(queue.binding, self.counts, queue.clock())
        return self.finish()

    def finish(self) -> DrainReport:
        """The report with what the drain sent and how long it took."""
        report, usage, base = self.report, self.usage, self.base
        report.queries = usage.queries - base[0]
        report.statements = usage.statements - base[1]
        report.rows_read = usage.rows_read - base[2]
        report.rows_written = usage.rows_written - base[3]
        report.subrequests = self.meter.used - self.used0
        report.elapsed_s = round(self.monotonic() - self.start, 3)
        return report


async def drain(
    queue: D1Queue,
    registry: Registry,
    config: Config | None = None,
    *,
    env: Any = None,
    fetch: Fetch | None = None,
    meter: Meter | None = None,
    window_s: float | None = None,
    points: Points | None = None,
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
    finish inside it are claimed, the cron takes the rest. `points`: the
    invocation's Analytics Engine dataset (features/analytics.py), which
    gets one data point per (queue, name, outcome) it settled. Keyword
    `settings` override `config`'s fields (`drain(q, reg, queues=["mail"],
    batch_size=10)`) and are validated as Config's are."""
    config = _configured(config, settings)
    plog.setLevel(JOB_LOG_LEVELS[config.job_logs])
    queue = leased(queue, registry, config)
    budget = Budget.of(config, queue.reservation_s, window_s)
    if queue.metrics:
        budget = replace(budget, metrics=True)
    state = Drain(
        queue,
        registry,
        budget,
        meter or queue.binding.meter or Meter.for_plan(PLANS[config.plan]),
        env=env,
        fetch=fetch,
        outbound=config.outbound,
        stats=config.stats,
        tally=None if points is None else Tally(),
        monotonic=monotonic,
    )
    if not await state.survey(list(config.listed_queues), config.queues[-1] == ALL_QUEUES):
        return state.finish()
    while (plan := state.plan()) is not None:
        jobs = await state.claim(plan)
        if jobs is None:
            break
        if jobs:
            state.pending = await state.run(jobs)  # settled by the next claim batch
            if state.report.stopped:  # the next round could not be paid for
                break
    await state.settle()
    report = await state.close()
    if points is not None and state.tally:
        report.data_points = points.send(state.tally)
    return report


def _configured(config: Config | None, settings: dict[str, Any]) -> Config:
    """`config` (default Config()) with keyword `settings` over its fields."""
    config = config or Config()
    if settings:
        if "queues" in settings:  # a list, a tuple, or one name
            q = settings["queues"]
            settings["queues"] = (q,) if isinstance(q, str) else tuple(q)
        config = replace(config, **settings)
    return config


def leased(queue: D1Queue, registry: Registry, config: Config) -> D1Queue:
    """The queue the drain claims through: with the configured lease, which
    must cover the longest job's timeout and the settle after it (or a job
    still running could be reclaimed and run twice), and the registry (so
    ctx.queue.dispatch applies job defaults)."""
    if config.reservation_s is not None and config.reservation_s != queue.reservation_s:
        queue = queue.derive(reservation_s=config.reservation_s)  # every claim's lease
    longest = registry.max_timeout_s()
    if queue.reservation_s < longest + SETTLE_MARGIN_S:
        raise ConfigError(
            f"the lease ({queue.reservation_s:g}s) must cover the longest job timeout "
            f"({longest:g}s) and {SETTLE_MARGIN_S:g}s to settle it, or a job still "
            "running could be reclaimed and run twice"
        )
    if queue.registry is None:
        queue = queue.derive(registry=registry)
    return queue


__all__ = [
    "LEAST_ROUND",
    "Budget",
    "Drain",
    "DrainReport",
    "Plan",
    "drain",
    "round_cost",
]
