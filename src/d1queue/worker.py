"""The drain: reclaim lapsed leases, then claim → run → settle in rounds until
the queues are empty or a budget is spent.

A round costs two D1 queries whatever its size: the previous round's settle
statements travel in one batch with this round's candidate SELECT, then the
claim batch; the last round's settle goes alone. Before each round the drain
checks that the round and the settle it will owe fit in what is left of the
query budget, so it never claims jobs it could not settle; and it starts no
round after the time budget, while the lease (`D1Queue.reservation_s`) is
required to outlast the time budget plus the longest handler timeout, so no
job runs past its lease.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .config import Config, ConfigError
from .job import Fail, JobContext, QueuedJob, Registry, Retry
from .queue import D1Queue, Outcome, exhausted_outcome

MAX_ERROR_CHARS = 4000
"""last_error and the failed table's error are kept short: they are read by
people, and every byte is stored and billed."""


@dataclass
class DrainReport:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    stale: int = 0
    reclaimed: int = 0
    rounds: int = 0
    queries: int = 0
    statements: int = 0
    rows_read: int = 0
    rows_written: int = 0
    elapsed_s: float = 0.0
    paused: list[str] = field(default_factory=list)
    stopped: str = ""
    """Why the drain ended: "empty", "time_budget" or "query_budget"."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def round_cost(k: int, owed: int, batch_counts_as: str) -> int:
    """Worst-case budget a round claiming `k` jobs needs, with `owed` settle
    statements of the previous round still to send: the batch carrying them
    and the SELECT, the claim batch (k UPDATEs), and the settle this round
    will owe (up to 2 statements a job, when every job fails)."""
    if batch_counts_as == "query":
        return 3
    return (owed + 1) + k + 2 * k


def _describe(exc: BaseException) -> str:
    """`Type: message` and where it was raised, for last_error."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}" for f in frames)
    text = f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")
    return text[:MAX_ERROR_CHARS]


async def run_job(job: QueuedJob, registry: Registry, ctx: JobContext) -> Outcome:
    """Run one claimed job and decide its outcome. Never raises for anything
    the job did: a bad job fails alone and the drain goes on."""
    if job.exhausted:
        return exhausted_outcome(job)
    if job.payload_error:
        return Outcome(job, "fail", error=job.payload_error)
    spec = registry.get(job.name)
    if spec is None:
        return Outcome(job, "fail", error=f"no handler is registered for job name {job.name!r}")

    def retry_or_fail(error: str, delay_s: float | None = None) -> Outcome:
        if job.attempts >= job.max_attempts:
            return Outcome(
                job, "fail", error=f"{error} (attempt {job.attempts} of {job.max_attempts})"
            )
        delay = spec.backoff.delay_s(job.attempts) if delay_s is None else delay_s
        return Outcome(job, "release", delay_s=delay, error=error)

    try:
        await asyncio.wait_for(spec.call(job.payload, ctx), spec.timeout_s)
    except Fail as exc:
        return Outcome(job, "fail", error=f"failed by the handler: {exc}"[:MAX_ERROR_CHARS])
    except Retry as exc:
        return retry_or_fail(f"retry requested: {exc}"[:MAX_ERROR_CHARS], exc.delay_s)
    except TimeoutError:
        return retry_or_fail(f"timed out after {spec.timeout_s:g}s")
    except Exception as exc:
        return retry_or_fail(_describe(exc))
    return Outcome(job, "ack")


async def drain(
    queue: D1Queue,
    registry: Registry,
    config: Config | None = None,
    *,
    env: Any = None,
    clock: Callable[[], float] = time.monotonic,
    reclaim: bool = True,
    **settings: Any,
) -> DrainReport:
    """Reclaim (and skip paused queues), then drain `config.queues` within the
    budgets; see the module docstring. `env` is handed to handlers as
    `ctx.env`. `reclaim=False` skips the first step, for the short drain
    after a push, which the cron's full drain backs up. Keyword `settings`
    override `config`'s fields (`drain(q, reg, queues=["mail"], batch_size=10)`)
    and are validated as Config's are."""
    config = config or Config()
    if settings:
        if "queues" in settings:  # a list, a tuple, or one name
            q = settings["queues"]
            settings["queues"] = (q,) if isinstance(q, str) else tuple(q)
        config = replace(config, **settings)
    longest = registry.max_timeout_s()
    if queue.reservation_s <= config.time_budget_s + longest:
        raise ConfigError(
            f"the lease ({queue.reservation_s:g}s) must outlast the time budget "
            f"({config.time_budget_s:g}s) plus the longest job timeout ({longest:g}s), "
            "or a job still running could be reclaimed and run twice"
        )
    usage = queue.binding.usage
    base = (usage.queries, usage.statements, usage.rows_read, usage.rows_written)

    def cost_so_far() -> int:
        if config.batch_counts_as == "query":
            return usage.queries - base[0]
        return usage.statements - base[1]

    start = clock()
    report = DrainReport()
    slots = asyncio.Semaphore(config.concurrency)

    async def run(job: QueuedJob) -> Outcome:
        async with slots:
            return await run_job(job, registry, JobContext(job=job, queue=queue, env=env))

    if reclaim:
        report.reclaimed, paused = await queue.reclaim_and_list_paused()
    else:
        paused = set()
    active = [q for q in config.queues if q not in paused]
    report.paused = sorted(paused & set(config.queues))
    lost: dict[str, int] = {}
    turn = 0
    pending: list[Outcome] = []  # the last round's outcomes, not yet settled

    def record(outcomes: list[Outcome], held: list[bool]) -> None:
        for outcome, ok in zip(outcomes, held, strict=True):
            if not ok:
                report.stale += 1
            elif outcome.action == "ack":
                report.succeeded += 1
            elif outcome.action == "release":
                report.retried += 1
            else:
                report.failed += 1

    while True:
        if not active:
            report.stopped = "empty"
            break
        if clock() - start >= config.time_budget_s:
            report.stopped = "time_budget"
            break
        left = config.query_budget - cost_so_far()
        owed = sum(2 if o.action == "fail" else 1 for o in pending)
        k = config.batch_size
        while k > 0 and round_cost(k, owed, config.batch_counts_as) > left:
            k -= 1
        if k == 0:
            report.stopped = "query_budget"
            break
        name = active[turn % len(active)]
        held, jobs, candidates = await queue.settle_and_claim(pending, name, k)
        record(pending, held)
        pending = []
        report.rounds += 1
        if not candidates:
            active.remove(name)  # nothing ready on this queue
            continue
        if not jobs:
            # Every candidate went to another drain running at the same time;
            # the queue is not empty. Try it again, a bounded number of times.
            lost[name] = lost.get(name, 0) + 1
            if lost[name] >= queue.max_claim_attempts:
                active.remove(name)
            continue
        lost[name] = 0
        if candidates < k:
            # Fewer ready jobs than asked for: this round empties the queue,
            # so skip the SELECT that would only say so. Jobs pushed from now
            # on wait for the next run (or start a drain of their own).
            active.remove(name)
        else:
            turn += 1
        report.claimed += len(jobs)
        pending = list(await asyncio.gather(*(run(job) for job in jobs)))
    if pending:  # every budget check reserved room for this
        record(pending, await queue.settle(pending))

    report.queries = usage.queries - base[0]
    report.statements = usage.statements - base[1]
    report.rows_read = usage.rows_read - base[2]
    report.rows_written = usage.rows_written - base[3]
    report.elapsed_s = round(clock() - start, 3)
    return report


__all__ = ["DrainReport", "drain", "round_cost", "run_job"]
