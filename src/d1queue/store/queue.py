"""D1Queue: the driver. Every read and write of the queue tables is here.

Optimistic claims by conditional UPDATE (no locks: D1 has none), with
what D1 makes worth having: claims in batches of one SELECT and
one `db.batch`, a fencing token on every lease, failing as one transaction,
and jobs that exhausted their attempts in a crash failed instead of re-run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import groupby, pairwise
from typing import Any, Protocol, Self, Unpack

from ..core.bounds import (
    BATCH_JOBS,
    MAX_DEPENDENTS,
    MAX_ERROR_CHARS,
    MAX_RESULT_BYTES,
    MAX_SAFE_INT,
    check_name,
    check_stored_name,
    clamp_delay_s,
)
from ..core.errors import BatchNotRunning, EmptyBatch, TooManyDependents, UnknownDependency
from ..core.flow import NO_GROUP, QUEUE_ROW, Flow, Limits, flows_of
from ..core.job import QueuedJob, check_edges, new_id, now_ms
from ..core.limits import Meter, SubrequestLimitExceeded
from ..core.log import event, get
from ..core.outcomes import Mark, Outcome, exhausted_outcome, history_kept
from ..core.registry import Overrides, Registry, spec_for
from ..core.shards import mark_id, shard_of_id
from . import sql
from .binding import Binding, Result, Statement, was_resent
from .failed import FailedJob as FailedJob  # public: d1queue.FailedJob
from .failed import FailedJobs
from .rows import row_to_job, values_to_job
from .workflows import Workflows

log = get(__name__)


class DuplicateJobId(Exception):
    """push() was given a job whose id is already queued."""


@dataclass
class Round:
    """What `settle_and_claim` did: the marks of the outcomes it settled, the
    jobs it won, how many candidates it saw, and the D1 error that stopped it
    claiming, if one did (the outcomes were settled all the same)."""

    marks: list[Mark]
    jobs: list[QueuedJob]
    candidates: int = 0
    error: Exception | None = None
    found: dict[str, int] = field(default_factory=dict)
    """Candidates each queue of the round offered (at most its share; a
    queue whose limits cut its read short offers its whole share when the
    read came back full)."""
    ahead: dict[str, list[QueuedJob]] | None = None
    """The next round's candidates per queue, read after this round's claims
    (None when the round sent no claim batch)."""
    limited: int = 0
    """Claims a flow limit refused (the job stays queued)."""

    @property
    def reclaimed(self) -> int:
        """Jobs won whose previous lease had lapsed: their worker died or
        overran, and this claim took them over."""
        return sum(1 for j in self.jobs if j.held)


SETTLE_TRIES = 3
"""Sends of one outcome, alone, after the batch carrying it failed."""

RECLAIM_NOTE = sql.RECLAIM_NOTE

DONE_BAND = sql.DONE_BAND
"""The band of completed jobs kept as history (sql.DONE_BAND)."""


def noted(last_error: str | None) -> str:
    """A reclaimed job's last_error as CLAIM writes it (sql._NOTED): the
    reclaim note first, once, then the error it had, cut at MAX_ERROR_CHARS."""
    if last_error is None:
        return RECLAIM_NOTE
    if last_error.startswith(RECLAIM_NOTE):
        return last_error
    return f"{RECLAIM_NOTE}; before that: {last_error}"[:MAX_ERROR_CHARS]


def interleave(lists: Sequence[Sequence[QueuedJob]]) -> list[QueuedJob]:
    """The first of each list, then the second of each, and so on: a round
    over several queues offers each its turn before any gets a second."""
    if len(lists) == 1:
        return list(lists[0])
    out: list[QueuedJob] = []
    for i in range(max((len(xs) for xs in lists), default=0)):
        out += [xs[i] for xs in lists if i < len(xs)]
    return out


def claim_order(rows: Sequence[Sequence[Any]], n: int) -> list[QueuedJob]:
    """The first `n` of SELECT_CANDIDATES' rows (read `positional`ly) in
    claim order: highest priority first, then the one due longest, then by
    id. The SELECT returns the heads of the ready, delayed and locked bands,
    each in its own order; this merges them."""
    jobs = [values_to_job(r) for r in rows]
    jobs.sort(key=lambda j: (-j.priority, j.available_at, j.id))
    return jobs[:n]


def _names(result: Result) -> set[str]:
    return {str(r["name"]) for r in result.rows}


def _insert_params(job: QueuedJob) -> tuple[Any, ...]:
    """INSERT_JOB's ten values for `job`."""
    return (
        job.id,
        job.queue,
        job.name,
        job.payload_json(),
        job.attempts,
        job.max_attempts,
        job.priority,
        job.available_at,
        job.created_at,
        job.unique_key,
    )


_TOKENS: list[str] = []


def _batch_key(job: QueuedJob) -> tuple[str, str, int]:
    """Which claim batch's jobs on a queue `job` is one of: its token, queue
    and lease end, the prefix of its held key (D1Queue._batches)."""
    return (job.reservation or "", job.queue, job.reserved_until or 0)


def _claim(job: QueuedJob, now: int, until: int) -> Statement:
    """The CLAIM of `job` as it was read (its key: queue, band, available_at,
    id), for a lease ending at `until`."""
    return (
        sql.CLAIM_LAPSED if job.held else sql.CLAIM,
        (now, until, job.reservation, job.id, job.attempts, job.queue, job.band, job.available_at),
    )


def _select(q: str, now: int, k: int, flow: Flow | None, *, guarded: bool) -> Statement:
    """The candidate SELECT of queue `q` for `k` jobs: SELECT_CANDIDATES, or
    with flow control select_flow_candidates (guarded by the queue's own
    limits when `guarded`)."""
    if flow is None:
        return (sql.SELECT_CANDIDATES, (q, now, k))
    n, rate, window = flow.limits.row(QUEUE_ROW)
    guard = guarded and flow.limits.queue_wide
    spaced = flow.limits.group_rate is not None
    return (
        sql.select_flow_candidates(grouped=flow.grouped, guarded=guard, spaced=spaced),
        (q, now, k, n, rate, window) if guard else (q, now, k),
    )


def _reads(k: int, flow: Flow | None) -> int:
    """How many candidates a round reads from a queue for a share of `k`:
    no more than one round may claim there (`_within_limits` claims no more;
    the rest would be read and left, round after round). Under queue-wide
    limits (concurrency, a rate's limit) that many, twice that with
    per-group limits too, which may pass some over (a group at its limit,
    the jobs with no group taking turns with the grouped ones); on a queue
    with no grouped job, whose jobs are all one group, no more than a
    group's limit."""
    if flow is None or flow.limits.none:
        return k
    limits = flow.limits
    cap = k
    if limits.queue_wide:
        cap = min(k, limits.concurrency or k, limits.rate.limit if limits.rate else k)
    if limits.per_group:
        if not flow.grouped:
            rate = limits.group_rate
            return min(cap, limits.group_concurrency or k, rate.limit if rate else k)
        if limits.queue_wide:
            return min(k, 2 * cap)
    return cap


def _order(rows: Sequence[Sequence[Any]], n: int, flow: Flow | None) -> list[QueuedJob]:
    """The first `n` candidates in claim order: `claim_order`, and for a
    queue with groups, the grouped bands' head (groups in turn, by fair tag)
    with the rest (jobs with no group, due delayed ones and retries) as one
    group more: at each priority, one of the rest opens every turn of the
    groups. (A turn ends where a group comes round again.)"""
    if rows and rows[-1][0] is None:  # the guard's row: no job was read
        rows = rows[:-1]
    if flow is None or not flow.grouped:
        return claim_order(rows, n)
    jobs = [values_to_job(r) for r in rows]
    jobs.sort(key=lambda j: (-j.priority, j.available_at, j.id))
    out: list[QueuedJob] = []
    for _, level in groupby(jobs, key=lambda j: j.priority):
        at = list(level)
        grouped = [j for j in at if j.waiting_turn]
        rest = deque(j for j in at if not j.waiting_turn)
        turn: set[str | None] = set()
        if rest:
            out.append(rest.popleft())
        for job in grouped:
            if job.group in turn:
                turn.clear()
                if rest:
                    out.append(rest.popleft())
            turn.add(job.group)
            out.append(job)
        out += rest
        if len(out) >= n:
            break
    return out[:n]


def _free_places(
    flows: Mapping[str, Flow],
    queues: Sequence[str],
    occupied: Mapping[str, set[int]],
    settling: Sequence[Outcome],
) -> dict[str, list[int]]:
    """The places of each of `queues` (with a concurrency limit) a round may
    give: those its last read found free, and those of the jobs the round's
    own settle frees (it runs before the claims, in their batch)."""
    freed: dict[str, set[int]] = {}
    for o in settling:
        if o.job.slot is not None:
            freed.setdefault(o.job.queue, set()).add(o.job.slot)
    return {
        q: [
            s
            for s in range(flows[q].limits.concurrency or 0)
            if s not in occupied.get(q, set()) - freed.get(q, set())
        ]
        for q in queues
    }


def _within_limits(
    candidates: list[QueuedJob], flows: Mapping[str, Flow], free: Mapping[str, list[int]]
) -> list[QueuedJob]:
    """The candidates a round tries, in order, each of a queue with a
    concurrency limit given a place its round read free (`free`, taken in
    order; a job reclaimed after its lease lapsed keeps its own): no more
    per queue than its free places (or a rate's limit), nor per group than
    its group_concurrency (or group rate). The rest would be refused in the
    batch anyway, which alone decides: another drain may take places too."""
    per_queue: Counter[str] = Counter()
    per_group: Counter[tuple[str, str]] = Counter()
    places = {q: list(slots) for q, slots in free.items()}
    out = []
    for job in candidates:
        flow = flows.get(job.queue)
        if flow is None or flow.limits.none:
            out.append(job)
            continue
        limits = flow.limits
        cap = limits.rate.limit if limits.rate else MAX_SAFE_INT
        gcap = min(
            limits.group_concurrency or MAX_SAFE_INT,
            limits.group_rate.limit if limits.group_rate else MAX_SAFE_INT,
        )
        key = (job.queue, job.group or NO_GROUP)
        if per_queue[job.queue] >= cap or per_group[key] >= gcap:
            continue
        if limits.concurrency is not None and job.slot is None:
            if not places.get(job.queue):
                continue
            job.slot = places[job.queue].pop(0)
        per_queue[job.queue] += 1
        per_group[key] += 1
        out.append(job)
    return out


def _claim_under(
    job: QueuedJob, now: int, until: int, flow: Flow | None, *, db_time: bool = False
) -> list[Statement]:
    """The claim of `job`: its CLAIM, or under flow limits CLAIM_LIMITED
    (its places: `job.slot`, given by `_within_limits`, and its group's
    least free one), after a TAKE_FLOW per rate that applies (its group's,
    then its queue's, taken only if the group's admitted it:
    TAKE_FLOW_AFTER), on which it lands only if they admitted it."""
    if flow is None or flow.limits.none:
        return [_claim(job, now, until)]
    limits = flow.limits
    rows = [job.group or NO_GROUP] if limits.group_rate is not None else []
    if limits.rate is not None:
        rows.append(QUEUE_ROW)
    out: list[Statement] = []
    for k, row in enumerate(rows):
        _, rate, window = limits.row(row)
        # A start is counted at the database's time when the clock is the
        # wall's (sql._NOW): the time the claim commits, re-sends and all.
        at = None if db_time else now
        take = (job.queue, row, at, job.id, job.reservation, rate, window, job.attempts)
        if k:  # the second row's take only if the first admitted this claim
            out.append((sql.TAKE_FLOW_AFTER, (*take, rows[0])))
        elif limits.group_concurrency is not None and job.gslot is None:
            # Only if its group has a place: a busy group spends no start.
            gate = (limits.group_concurrency, job.group or NO_GROUP)
            out.append((sql.TAKE_FLOW_GATED, (*take, *gate)))
        else:
            out.append((sql.TAKE_FLOW, take))
    _, params = _claim(job, now, until)
    places = (job.slot, limits.group_concurrency or 0, job.group or NO_GROUP)
    if limits.group_concurrency is not None and job.gslot is None:
        job.gslot = -1  # a place in its group, the claim's SQL picks which
    out.append((sql.claim_limited(lapsed=job.held, rate_rows=len(rows)), (*params, *places, *rows)))
    return out


def _holds_places(job: QueuedJob) -> bool:
    """Whether `job` holds flow places, which its retry or undo frees."""
    return job.slot is not None or job.gslot is not None


def _token() -> str:
    """A fresh reservation token: 64 random bits. Drawn 256 at a time: on
    Pyodide each os.urandom call is a trip to JS (crypto.getRandomValues)
    costing more CPU than the rest of claiming the job."""
    if not _TOKENS:
        pool = os.urandom(8 * 256).hex()
        _TOKENS.extend(pool[i : i + 16] for i in range(0, len(pool), 16))
    return _TOKENS.pop()


class Router(Protocol):
    """Where a push goes when a queue is one of several databases' (a
    ShardSet, shardset.py): the queue of the shard a job routes to."""

    def route(self, here: D1Queue, job: QueuedJob, partition: str | None = None) -> D1Queue: ...

    def route_new(self, here: D1Queue, job: QueuedJob, partition: str | None = None) -> D1Queue: ...

    def route_many(self, here: D1Queue, jobs: Sequence[QueuedJob]) -> D1Queue: ...


class D1Queue:
    """A job queue in a D1 database (or anything shaped like a D1 binding).

    `reservation_s` is how long a claim lasts before another worker's claim may
    take the job over: it must exceed the longest a handler runs, or a
    slow job could be run twice. `clock` returns epoch milliseconds (tests move
    time with it).
    """

    def __init__(
        self,
        db: Any,
        *,
        reservation_s: float = 90,
        max_claim_attempts: int = 5,
        clock: Callable[[], int] = now_ms,
        registry: Registry | None = None,
        keep_completed: bool = False,
    ) -> None:
        if not reservation_s > 0:
            raise ValueError(f"reservation_s must be > 0, got {reservation_s!r}")
        if not isinstance(max_claim_attempts, int) or max_claim_attempts < 1:
            raise ValueError(
                f"max_claim_attempts must be an integer >= 1, got {max_claim_attempts!r}"
            )
        self.binding = db if isinstance(db, Binding) else Binding(db)
        self.reservation_s = reservation_s
        self.max_claim_attempts = max_claim_attempts
        self.clock = clock
        self.registry = registry
        """Whose job defaults `dispatch` applies (None: the built-in ones)."""
        self.keep_completed = keep_completed
        """Whether completed jobs are kept (with their results) as history,
        on the queues whose registry does not opt them out; False: deleted
        as they complete (D1QUEUE_KEEP_COMPLETED_S = 0)."""
        self.shard = 0
        """Which database this queue is, of its `shards`."""
        self.shards: Router | None = None
        """The databases this queue is one of (a ShardSet), which route each
        push to its shard; None: this database alone."""
        self._occupied: dict[str, set[int]] = {}
        """The flow places held per queue with a concurrency limit, as the
        last read of them found (sql.OCCUPIED_SLOTS): which a round may
        give its claims. Shared with this queue's metered twins."""
        self._batches: dict[tuple[str, str, int], int] = {}
        """Jobs won per claim batch and queue, by (token, queue, lease end),
        until a settle first carries any of them: one carrying all of them
        may acknowledge the completed ones in one statement
        (sql.DELETE_HELD_BATCH). Shared with this queue's metered twins."""

    @property
    def reservation_ms(self) -> int:
        return round(self.reservation_s * 1000)

    def derive(self, **changes: Any) -> Self:
        """This queue with some of its attributes replaced (`binding`,
        `reservation_s`, `registry`): the one way a queue is made from
        another. The class is kept (a shard's queue keeps routing), and so is
        what the twins share (the binding's usage, the claim batches)."""
        # Not copy.copy: its generic protocol is slow in Pyodide, and every
        # job of a drain gets a metered twin.
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.__dict__.update(changes)
        return twin

    def metered(self, meter: Meter) -> Self:
        """This queue, its D1 calls counted into `meter` (a job's budget)."""
        return self.derive(binding=self.binding.metered(meter))

    # -- pushing ---------------------------------------------------------

    async def push(self, job: QueuedJob) -> str:
        """Store `job`; returns its id, or, when its unique_key is already held
        by a queued job, that job's id and stores nothing."""
        job_id, _ = await self._push(job, ())
        return job_id

    async def push_noting_paused(self, job: QueuedJob) -> tuple[str, set[str]]:
        """`push`, and the names of the paused queues, read in the push's own
        db.batch: a push that tells whether its queue is paused still costs
        one round trip."""
        job_id, (paused,) = await self._push(job, [(sql.PAUSED_QUEUES, ())])
        return job_id, _names(paused)

    async def push_many(self, jobs: Sequence[QueuedJob]) -> list[tuple[str, bool]]:
        """Store many jobs in one db.batch (one transaction: all or none);
        returns (id, deduplicated) per job, in order. Rows are packed ten to a
        statement, D1's 100-bound-parameter limit."""
        out, _ = await self._push_many(jobs, ())
        return out

    async def push_many_noting_paused(
        self, jobs: Sequence[QueuedJob]
    ) -> tuple[list[tuple[str, bool]], set[str]]:
        """`push_many`, and the paused queues' names read in its db.batch."""
        out, (paused,) = await self._push_many(jobs, [(sql.PAUSED_QUEUES, ())])
        return out, _names(paused)

    def _stamp(self, job: QueuedJob) -> QueuedJob:
        job.validate()
        now = self.clock()
        job.id = job.id or new_id(now)
        job.available_at = job.available_at or now
        job.created_at = job.created_at or now
        return job

    async def _push(self, job: QueuedJob, reads: Sequence[Statement]) -> tuple[str, list[Result]]:
        """Insert `job` with `reads` riding in the same batch (their results
        are returned after the id); with `shards`, on the shard its id names
        (made for its queue's shard when it has none)."""
        if self.shards is not None:
            target = self.shards.route(self, job)
            if target is not self:
                return await target._push(job, reads)
        self._stamp(job)
        statements = self._job_statements(job)
        if job.unique_key is None:
            results = await self._send(statements + list(reads), [job])
            inserted, read = results[0], results[len(statements) :]
            if inserted.changes != 1 and not (
                # A transient error hid that the first send landed: the row
                # with this id is our own job.
                inserted.resent and await self.job(job.id) is not None
            ):
                raise DuplicateJobId(f"a job with id {job.id!r} is already queued")
            return job.id, read
        # Insert and read the key's holder in one round trip: the holder is
        # this job if the insert won, else the job that already had the key.
        statements.append((sql.SELECT_UNIQUE_HOLDER, (job.unique_key,)))
        results = await self._send([*statements, *reads], [job])
        holder, read = results[len(statements) - 1], results[len(statements) :]
        if not holder.rows:  # nobody holds the key: the conflict was on the id
            raise DuplicateJobId(f"a job with id {job.id!r} is already queued")
        holder_id = str(holder.rows[0]["id"])
        if job.debounce_s and holder_id != job.id:
            # DEBOUNCE, just before the holder's read: did it move that job?
            debounced = results[len(statements) - 2]
            job.debounced = debounced.changes == 1 or debounced.resent
        return holder_id, read

    def _job_statements(self, job: QueuedJob) -> list[Statement]:
        """The statements pushing one job (stamped), its INSERT first."""
        if job.after is not None:
            return self._waiter_statements(job)
        if job.group is not None or job.debounce_s:
            return self._flow_statements(job)
        if job.batch is not None:
            insert = sql.insert_jobs(1, unique=job.unique_key is not None, batch=True)
            return [(insert, (*_insert_params(job), job.batch))]
        return [(sql.INSERT_JOB, _insert_params(job))]

    def _waiter_statements(self, job: QueuedJob) -> list[Statement]:
        """A job waiting for others: its INSERT_WAITER (which checks and
        counts them), its edges, the marks on the jobs it waits for and,
        with a group, its queue's."""
        after = json.dumps(job.after)
        out: list[Statement] = [
            (
                sql.INSERT_WAITER,
                (
                    *_insert_params(job),
                    job.group,
                    after,
                    int(job.ignore_failed),
                    job.batch,
                    MAX_DEPENDENTS,
                ),
            ),
            (sql.INSERT_EDGES, (job.id, after)),
            (sql.MARK_WAITED, (after,)),
            (sql.MARK_WAITED_RUNNING, (after,)),
        ]
        if job.group is not None:
            out.append((sql.MARK_GROUPED, (job.queue, job.created_at)))
        return out

    async def _send(
        self, statements: Sequence[Statement], jobs: Sequence[QueuedJob]
    ) -> list[Result]:
        """A push's db.batch; what the schema refused, said in the push's
        terms: an `after` naming no job it may wait for or one waited for
        by MAX_DEPENDENTS jobs already, a batch not running. Nothing was
        written in any case (one transaction)."""
        try:
            return await self.binding.batch(statements)
        except Exception as exc:
            text = str(exc)
            if "d1queue_jobs.waiting" in text:
                await self._refused_after(jobs)
            if "d1queue_batches.total" in text:
                raise EmptyBatch(
                    "every job of the batch is already queued under its unique_key: "
                    "a batch of none of them could never end"
                ) from None
            if "batch not running" in text:
                raise BatchNotRunning(
                    "the batch is not running: it finished, or never existed"
                ) from None
            raise

    async def _refused_after(self, jobs: Sequence[QueuedJob]) -> None:
        """Why the schema refused a push's `after` (read after the batch
        rolled back, so only on this error's path): UnknownDependency for
        ids no job may wait for, TooManyDependents for one the push would
        have given more than MAX_DEPENDENTS waiters."""
        ids = sorted({i for j in jobs for i in (j.after or ())})
        unknown: list[str] = []
        edges: dict[str, int] = {}
        live: set[str] = set()
        for i in range(0, len(ids), 100):
            chunk = json.dumps(ids[i : i + 100])
            found = await self.binding.run(sql.UNKNOWN_AFTER, chunk)
            unknown += [str(r["id"]) for r in found.rows]
            counted = await self.binding.run(sql.DEPENDENT_COUNTS, chunk, MAX_DEPENDENTS)
            for r in counted.rows:
                edges[str(r["id"])] = int(r["edges"])
                if r["live"]:
                    live.add(str(r["id"]))
        # An id pushed in the same batch was known to the jobs after it (the
        # batch rolled back); one named before it was pushed is the unknown
        # one then, unless the batch gave it too many waiters.
        pushed = {j.id for j in jobs}
        if any(i not in pushed for i in unknown):
            raise UnknownDependency([i for i in unknown if i not in pushed])
        named = Counter(i for j in jobs for i in (j.after or ()))
        full = [
            i for i in ids if (i in live or i in pushed) and edges[i] + named[i] > MAX_DEPENDENTS
        ]
        if full:
            raise TooManyDependents(full, MAX_DEPENDENTS)
        raise UnknownDependency(unknown)

    def _flow_statements(self, job: QueuedJob) -> list[Statement]:
        """The statements pushing a grouped or debounced job (stamped): its
        INSERT_FLOW_JOB, then for a group its tag and its queue's mark, for
        a debounce the update of the job holding its key."""
        step = self.group_step(job.queue)
        out: list[Statement] = [
            (
                sql.INSERT_FLOW_JOB,
                (*_insert_params(job), job.group, step, int(bool(job.debounce_s)), job.batch),
            )
        ]
        if job.group is not None:
            out += [(sql.BUMP_TAG, (job.id,)), (sql.MARK_GROUPED, (job.queue, job.created_at))]
        if job.debounce_s:
            out.append(
                (sql.DEBOUNCE, (job.unique_key, job.payload_json(), job.available_at, job.id))
            )
        return out

    def group_step(self, queue: str) -> int:
        """The fair-tag step of a group's jobs on `queue`: 1 ms, or the even
        spacing of its group rate (declared in code), so a rate-limited
        group's burst lies spread over time in its band."""
        limits = self.registry.limits().get(queue) if self.registry is not None else None
        if limits is not None and limits.group_rate is not None:
            return limits.group_rate.spacing_ms
        return 1

    async def _push_many(
        self,
        jobs: Sequence[QueuedJob],
        reads: Sequence[Statement],
        before: Callable[[D1Queue], Sequence[Statement]] | None = None,
        then: Sequence[Statement] = (),
    ) -> tuple[list[tuple[str, bool]], list[Result]]:
        """Insert `jobs` in one batch, `reads` riding in it (and `before`'s
        statements for the queue they land on, first); with `shards`, on
        the one shard they all route to (a batch is one transaction on one
        database: ShardError if they route to several). TooManyEdges, and
        nothing sent, when their `after` name more than MAX_EDGES ids."""
        check_edges(jobs)
        if self.shards is not None:
            target = self.shards.route_many(self, jobs)
            if target is not self:
                return await target._push_many(jobs, reads, before, then)
        rows = [self._stamp(job) for job in jobs]
        statements: list[Statement] = list(before(self)) if before is not None else []
        # Jobs that wait for others, one by one after the rest, in order:
        # each may wait for a job pushed before it in this batch.
        waiters = [j for j in rows if j.after is not None]
        flow = [j for j in rows if (j.group is not None or j.debounce_s) and j.after is None]
        single = {id(j) for j in (*waiters, *flow)}
        for batch in (False, True):
            step = sql.BATCH_ROWS_PER_STATEMENT if batch else sql.INSERT_ROWS_PER_STATEMENT
            for unique in (False, True):
                group = [
                    j
                    for j in rows
                    if id(j) not in single
                    and (j.unique_key is not None) == unique
                    and (j.batch is not None) == batch
                ]
                for i in range(0, len(group), step):
                    chunk = group[i : i + step]
                    params = [
                        v
                        for j in chunk
                        for v in (*_insert_params(j), *((j.batch,) if batch else ()))
                    ]
                    statements.append(
                        (sql.insert_jobs(len(chunk), unique=unique, batch=batch), params)
                    )
        plain = [j for j in rows if id(j) not in single and j.unique_key is None]
        # Grouped and debounced jobs one by one, in order: each one's fair
        # tag follows the one before it in its group.
        debounces: dict[str, int] = {}
        for job in flow:
            statements += self._flow_statements(job)
            if job.debounce_s:
                debounces[job.id] = len(statements) - 1
        for job in waiters:
            statements += self._waiter_statements(job)
        statements += then
        keys = sorted({j.unique_key for j in rows if j.unique_key is not None})
        for i in range(0, len(keys), 100):
            chunk_keys = keys[i : i + 100]
            statements.append((sql.select_unique_holders(len(chunk_keys)), chunk_keys))
        # The reads after the inserts: the holder SELECTs, then `reads`.
        tail = (len(keys) + 99) // 100 + len(reads)
        statements.extend(reads)
        try:
            results = await self._send(statements, rows)
        except Exception as exc:
            # A re-send after a lost reply meets the ids its first send stored
            # (the batch is one transaction: all of them, or none). The keys'
            # holders and the reads are then read on their own.
            if not (plain and was_resent(exc) and await self._all_queued(plain)):
                raise
            results = await self.binding.batch(statements[len(statements) - tail :])
        read = results[len(results) - len(reads) :] if reads else []
        selects = results[len(results) - tail : len(results) - len(reads)]
        holders = {r["unique_key"]: str(r["id"]) for res in selects for r in res.rows}
        out = []
        for job in rows:
            holder = holders.get(job.unique_key, job.id) if job.unique_key else job.id
            if job.id in debounces and holder != job.id:
                # After a re-send only the reads came back: the first send's
                # debounce landed with its inserts.
                whole = len(results) == len(statements)
                result = results[debounces[job.id]] if whole else None
                job.debounced = result is None or result.changes == 1 or result.resent
            out.append((holder, holder != job.id))
        return out, read

    async def push_batch(
        self,
        jobs: Sequence[QueuedJob],
        *,
        on_success: QueuedJob | None = None,
        on_failure: QueuedJob | None = None,
        on_finish: QueuedJob | None = None,
    ) -> tuple[str, list[str]]:
        """Store `jobs` as one workflow batch, in one db.batch (all or none):
        returns the batch's id and the jobs' ids. Each callback given is
        enqueued once: `on_success` when every job completed, `on_failure`
        at the first that failed for good (or was cancelled), `on_finish`
        when every job ended either way (migrations/0010_workflows.sql). A
        job whose unique_key another job holds is not pushed, and is not a
        job of the batch (its id is the holder's, as `push_many` says)."""
        if not BATCH_JOBS[0] <= len(jobs) <= BATCH_JOBS[1]:
            raise ValueError(f"a batch holds {BATCH_JOBS[0]} to {BATCH_JOBS[1]} jobs")
        target = self if self.shards is None else self.shards.route_many(self, jobs)
        batch_id = mark_id(new_id(self.clock()), target.shard)
        for job in jobs:
            job.batch = batch_id
        specs = [
            None if cb is None else _callback_row(cb, f"{batch_id}:{kind}")
            for kind, cb in (
                ("on_success", on_success),
                ("on_failure", on_failure),
                ("on_finish", on_finish),
            )
        ]

        def before(q: D1Queue) -> list[Statement]:
            ids = json.dumps([j.id for j in jobs])
            return [
                (sql.INSERT_BATCH, (batch_id, len(jobs), q.clock())),
                (sql.INSERT_BATCH_PARTS, (batch_id, ids, *specs)),
            ]

        try:
            out, _ = await target._push_many(jobs, (), before, _recount(batch_id, jobs))
        except Exception as exc:
            # A re-send after a lost reply meets the batch's row: the first
            # send stored it, and its jobs with it (one transaction).
            if not was_resent(exc):
                raise
            found = await target.binding.run(sql.SELECT_BATCH, batch_id)
            if not found.rows:
                raise
            return batch_id, [j.id for j in jobs]
        return batch_id, [i for i, _ in out]

    batch = push_batch
    """`push_batch` by the name a caller looks for: `queue.batch([...],
    on_success=queue.new_job("report", ...))`."""

    async def add_to_batch(self, batch_id: str, jobs: Sequence[QueuedJob]) -> list[str]:
        """Add `jobs` to batch `batch_id` while it runs (a job of it is still
        pending: a handler of one of its jobs may always add); returns their
        ids. BatchNotRunning, and nothing written, for a batch that finished
        or does not exist. On the batch's database: a ShardSet routes there."""
        if not BATCH_JOBS[0] <= len(jobs) <= BATCH_JOBS[1]:
            raise ValueError(f"add {BATCH_JOBS[0]} to {BATCH_JOBS[1]} jobs to a batch")
        for job in jobs:
            job.batch = batch_id
            if self.shards is not None and not job.id:
                # On the batch's database, whatever the job's queue routes to.
                job.id = mark_id(new_id(self.clock()), shard_of_id(batch_id))
        target = self if self.shards is None else self.shards.route_many(self, jobs)
        ids = [self._stamp(j).id for j in jobs]

        text = json.dumps(ids)
        # After the inserts, counted once: a re-send finds the ids listed.
        grow = [
            (sql.GROW_BATCH, (batch_id, text, ids[0])),
            (sql.GROW_BATCH_IDS, (batch_id, text, ids[0])),
        ]
        out, _ = await target._push_many(jobs, (), None, grow)
        return [i for i, _ in out]

    async def dependency_results(self, ids: Sequence[str]) -> dict[str, Any]:
        """The results of the completed jobs among `ids` kept as history."""
        return await Workflows(self.binding, self.clock).results(ids)

    async def batch_state(self, batch_id: str) -> dict[str, Any] | None:
        """Batch `batch_id`'s progress and its jobs' ids (None: no such batch)."""
        found = await Workflows(self.binding, self.clock).batch(batch_id)
        return None if found is None else found.as_dict(ids=True)

    async def chain(self, jobs: Sequence[QueuedJob]) -> list[str]:
        """Push `jobs` to run one after another: each waits for the one
        before it (`after`), in one db.batch (all or none). Returns their
        ids. A job of the chain that fails fails the rest (`dependency <id>
        failed`)."""
        if not 1 <= len(jobs) <= BATCH_JOBS[1]:
            raise ValueError(f"a chain holds 1 to {BATCH_JOBS[1]} jobs")
        if self.shards is not None:
            self.shards.route_many(self, jobs)  # ids of the shard they go to
        for job in jobs:
            self._stamp(job)
        for before, job in pairwise(jobs):
            job.after = [*(i for i in job.after or () if i != before.id), before.id]
        out = await self.push_many(jobs)
        return [i for i, _ in out]

    async def _all_queued(self, jobs: Sequence[QueuedJob]) -> bool:
        for i in range(0, len(jobs), 100):
            ids = [j.id for j in jobs[i : i + 100]]
            found = await self.binding.run(sql.select_job_ids(len(ids)), *ids)
            if len(found.rows) != len(ids):
                return False
        return True

    async def dispatch(
        self,
        name: str,
        payload: Any = None,
        *,
        partition: str | None = None,
        **overrides: Unpack[Overrides],
    ) -> str:
        """Queue job `name` with `payload`; returns the new job's id, or the id
        of the queued job already holding `unique_key`. `overrides` (queue,
        delay_s, max_attempts, priority, unique_key) win over the job's
        declared defaults: with a registry (given to the D1Queue, or by the
        drain to its handlers' `ctx.queue`), those it was registered with;
        without one, or for a name it does not know, the library's. With
        `shards`, the job lands on the shard its queue (or `partition`)
        routes to: a handler's follow-up job lands where its queue lives."""
        job = self.new_job(name, payload, **overrides)
        target = self if self.shards is None else self.shards.route_new(self, job, partition)
        return await target.push(job)

    def new_job(self, name: str, payload: Any = None, **overrides: Unpack[Overrides]) -> QueuedJob:
        """The job `dispatch` pushes, made now: JobSpec.new of `name`'s spec
        (registry.spec_for)."""
        return spec_for(self.registry, name).new(payload, at_ms=self.clock(), **overrides)

    # -- claiming --------------------------------------------------------

    async def claim_round(self, queue: str, n: int) -> tuple[list[QueuedJob], int]:
        """One claim round: SELECT up to `n` candidates, then one batch of
        conditional UPDATEs. Returns the jobs whose UPDATE changed a row and
        how many candidates there were (fewer than `n`: the queue ran dry; more
        than won: the rest were lost to other workers). Exhausted jobs are
        included (see `QueuedJob.exhausted`): the caller fails them. Two
        queries."""
        done = await self.settle_and_claim((), queue, n)
        if done.error is not None:
            raise done.error
        return done.jobs, done.candidates

    async def settle_and_claim(
        self,
        outcomes: Sequence[Outcome],
        queue: str | Mapping[str, int],
        n: int,
        admit: Callable[[list[QueuedJob], int], list[QueuedJob]] | None = None,
        ahead: Mapping[str, list[QueuedJob]] | None = None,
        read_ahead: bool = False,
        flows: Mapping[str, Flow] | None = None,
    ) -> Round:
        """`settle(outcomes)` and `claim_round(queue, n)` in few round trips.
        `queue` may map several queues to their shares of the round: one
        SELECT each, and the candidates taken in turns, one from each queue,
        so a queue with one job is not kept waiting behind another with
        thousands. `admit(candidates, carried)` picks which candidates to
        claim, in order (the drain's budget and window: it knows their names
        and so their handlers' needs only now); `carried` is how many other
        statements ride in the claim batch (the owed settle, the read-ahead
        SELECTs), which a budget counting statements must price too.

        With `read_ahead`, the claim batch also reads the next round's
        candidates (a SELECT per queue after the claims, which see them
        taken): `Round.ahead`. Given
        back as `ahead` for the same queues, they are this round's
        candidates, and the round is one round trip: the settle, the claims
        and the next SELECTs in one batch. (A candidate taken meanwhile by
        another worker is lost to it, as in any race; a job that came due
        meanwhile waits for the round after.) Without them the settle travels
        with a SELECT first: two round trips.

        The settle never depends on the claim: if a batch carrying both
        fails, the outcomes are settled on their own (`settle_outcomes`),
        the claims are undone where they may have landed (no attempt is
        spent on them), and the round returns the error.

        `flows` gives the queues with flow control (core/flow.py): their
        candidates come from `select_flow_candidates` (groups in turn; none
        read while the queue is at its limit) and each of their claims takes
        its place under the limits in the claim batch (TAKE_FLOW before its
        CLAIM). `Round.limited` counts the claims a limit refused. Without
        `flows` (a caller that did not survey) no limit applies: limits are
        the drain's."""
        shares = {queue: n} if isinstance(queue, str) else dict(queue)
        for name in shares:
            check_stored_name("queue", name)
        # Not surveyed (reserve, claim_round): no limit applies, and the
        # plain SELECT reads the grouped bands with the ready one.
        flows = {q: f for q, f in (flows or {}).items() if q in shares and f.active}
        now = self.clock()
        statements, firsts, carried, also = self._settle_statements(outcomes, now)
        reads = {q: _reads(k, flows.get(q)) for q, k in shares.items()}
        selects = [_select(q, now, k, flows.get(q), guarded=True) for q, k in reads.items()]
        # The places held on queues with a concurrency limit, read with the
        # candidates (or, read ahead, by the last claim batch): which are
        # free this round. The settle riding in this batch frees its jobs'.
        limited_queues = [q for q in shares if (f := flows.get(q)) and f.limits.concurrency]
        places = [(sql.OCCUPIED_SLOTS, (q,)) for q in limited_queues]
        occupied = self._occupied
        marks: list[Mark] = []
        held_back = 0
        if ahead is not None and all(q in ahead for q in shares):
            heads = [ahead[q][:k] for q, k in reads.items()]
        else:
            try:
                if statements or len(selects) > 1 or places:
                    results = await self.binding.batch(
                        [*statements, *selects, *places], positional=True
                    )
                    found = results[len(statements) : len(statements) + len(selects)]
                    held_now = results[len(results) - len(places) :]
                    for q, held in zip(limited_queues, held_now, strict=True):
                        occupied[q] = {r[0] for r in held.rows}
                    marks = await self._marks(outcomes, results, firsts, carried, also=also)
                else:
                    found = [await self.binding.run(selects[0][0], *selects[0][1], positional=True)]
            except Exception as exc:
                if statements:
                    marks = await self.settle_outcomes(outcomes, maybe_sent=True)
                return Round(marks, [], 0, exc)
            statements, outcomes = [], ()
            heads = [
                _order(r.rows, k, flows.get(q))
                for r, (q, k) in zip(found, reads.items(), strict=True)
            ]
            # A queue its guard held back (at its limit) answered one row
            # of NULLs: none of its jobs was read.
            held_back = sum(1 for r in found if r.rows and r.rows[-1][0] is None)
        # A read cut short by the queue's limits (`_reads`) that came back
        # full offers the queue's whole share: it did not run dry.
        offered = {
            q: shares[q] if len(h) >= reads[q] else len(h)
            for q, h in zip(shares, heads, strict=True)
        }
        candidates = interleave(heads)[:n]
        if flows:
            free = _free_places(flows, limited_queues, occupied, outcomes)
            candidates = _within_limits(candidates, flows, free)
        until = now + self.reservation_ms
        if read_ahead:
            # The next round's reads are not guarded: this round's claims may
            # fill the queue's limit, and the next round's settle free it.
            selects = [_select(q, now, k, flows.get(q), guarded=False) for q, k in reads.items()]
        riding = len(statements) + (len(selects) + len(places) if read_ahead else 0)
        chosen = (candidates if admit is None else admit(candidates, riding)) if candidates else []
        # One token for the batch: its jobs on a queue then share their held
        # key's prefix and token, one range (sql.DELETE_HELD_BATCH).
        token = _token()
        for job in chosen:
            job.reservation = token
        claims: list[Statement] = []
        at: list[int] = []  # each chosen job's CLAIM, in `claims`
        takes: list[int] = []  # each chosen job's first TAKE_FLOW (-1: none)
        for job in chosen:
            flow = flows.get(job.queue) if flows else None
            takes.append(len(claims) if flow is not None and not flow.limits.none else -1)
            claims += _claim_under(job, now, until, flow, db_time=self.clock is now_ms)
            at.append(len(claims) - 1)
        if not read_ahead:
            selects, places = [], []
        if not claims and not statements:
            return Round(marks, [], len(candidates), found=offered, limited=held_back)
        try:
            results = await self.binding.batch(
                [*statements, *claims, *selects, *places], positional=True
            )
        except Exception as exc:
            if statements:
                marks = await self.settle_outcomes(outcomes, maybe_sent=True)
            if chosen:
                await self._unclaim(chosen, until)
            return Round(marks, [], len(candidates), exc, found=offered)
        if statements:
            marks = await self._marks(outcomes, results, firsts, carried, also=also)
        base = len(statements)
        claimed = [results[base + i] for i in at]
        # A limited claim that changed nothing: a rate's take refused it, or
        # a place was gone (another drain's claim took it, or its group had
        # none free), or another drain took the job itself.
        limited = held_back + sum(
            1
            for t, i in zip(takes, at, strict=True)
            if t >= 0 and results[base + i].changes != 1 and not results[base + i].resent
        )
        if read_ahead:
            after = base + len(claims)
            next_heads: dict[str, list[QueuedJob]] | None = {
                q: _order(r.rows, k, flows.get(q))
                for (q, k), r in zip(
                    reads.items(), results[after : after + len(selects)], strict=True
                )
            }
            for q, held in zip(limited_queues, results[after + len(selects) :], strict=True):
                occupied[q] = {r[0] for r in held.rows}
        else:
            next_heads = None
        landed = await self._landed(chosen, claimed, until)
        won = []
        for job, took in zip(chosen, landed, strict=True):
            if took:
                # The UPDATE set the stored count to one more than read;
                # mirror it so the attempt number the worker sees matches.
                job.attempts += 1
                job.reserved_until = until
                if job.held:
                    job.last_error = noted(job.last_error)
                won.append(job)
        for job in won:
            key = _batch_key(job)
            self._batches[key] = self._batches.get(key, 0) + 1
        return Round(marks, won, len(candidates), found=offered, ahead=next_heads, limited=limited)

    async def _landed(
        self, jobs: Sequence[QueuedJob], results: Sequence[Result], until: int
    ) -> list[bool]:
        """Which claims won. A claim moves its row, so a re-send of a claim
        that landed finds nothing where the row was read and changes nothing:
        for those (rare: an answer to a re-send), one batch looks for our
        token where the claim put the row."""
        won = [r.changes == 1 for r in results]
        unsure = [i for i, r in enumerate(results) if r.resent and r.changes != 1]
        if unsure:
            try:
                found = await self.binding.batch(
                    [
                        (sql.CLAIM_LANDED, (jobs[i].queue, until, jobs[i].id, jobs[i].reservation))
                        for i in unsure
                    ]
                )
            except Exception as exc:  # unknown: the lease frees them later
                event(
                    log,
                    "d1queue.claim.unchecked",
                    logging.WARNING,
                    jobs=len(unsure),
                    error=str(exc),
                )
                return won
            for i, res in zip(unsure, found, strict=True):
                won[i] = bool(res.rows)
        return won

    async def _unclaim(self, jobs: Sequence[QueuedJob], until: int) -> None:
        """Put back jobs whose claim batch failed: it may have committed before
        the error, and the jobs would sit reserved, an attempt spent, until
        their lease lapsed. If this fails too, the lease does it later."""
        try:
            await self.binding.batch(
                [
                    (
                        sql.UNCLAIM_FREEING if _holds_places(j) else sql.UNCLAIM,
                        (j.attempts, j.id, j.reservation, j.queue, until, j.band, j.available_at),
                    )
                    for j in jobs
                ]
            )
        except Exception as exc:
            event(log, "d1queue.claim.not_undone", logging.WARNING, jobs=len(jobs), error=str(exc))

    async def reserve_batch(self, queue: str, n: int) -> list[QueuedJob]:
        """Claim up to `n` runnable jobs. Candidates lost to other workers are
        replaced by a fresh SELECT, at most `max_claim_attempts` rounds, so
        contention cannot spin. Jobs claimed with their attempts spent are
        failed here, never returned."""
        jobs: list[QueuedJob] = []
        for _ in range(self.max_claim_attempts):
            want = n - len(jobs)
            if want <= 0:
                break
            won, candidates = await self.claim_round(queue, want)
            exhausted = [j for j in won if j.exhausted or j.doomed]
            if exhausted:
                await self.settle([exhausted_outcome(j) for j in exhausted])
            jobs += [j for j in won if not (j.exhausted or j.doomed)]
            if candidates < want or (len(won) == candidates and not exhausted):
                break  # the queue ran dry, or nothing was lost to a race
        return jobs

    async def reserve(self, queue: str) -> QueuedJob | None:
        """Claim the next runnable job; None if the queue is empty or every
        candidate was taken. Reading `max_claim_attempts` candidates and
        trying them in order would read more rows; this reads one (the head of each band) and
        reads again only after losing it to another worker, at most
        `max_claim_attempts` times: 5 rows read a job with its
        acknowledgement (tests/runtime/test_counts_runtime.py)."""
        check_stored_name("queue", queue)
        jobs = await self.reserve_batch(queue, 1)
        return jobs[0] if jobs else None

    # -- settling ----------------------------------------------------------

    def _statements(self, outcome: Outcome, now: int) -> list[Statement]:
        job = outcome.job
        held = (job.id, job.reservation, job.queue, job.reserved_until)
        if outcome.action == "complete":
            if self.keeps(job.queue):
                return [(sql.COMPLETE_HELD, (*held, now, outcome.result))]
            if not job.workflow:
                # A waiter may name the job while it runs: if it did, this
                # deletes nothing and `_ended_apart` ends and deletes it.
                return [(sql.DELETE_HELD_PLAIN, held)]
            return [
                (sql.END_HELD, (*held, sql.ENDED_DELETED)),
                (sql.DELETE_HELD, held),
            ]
        if outcome.action == "retry":
            # Clamped: a Retry(delay_s=inf) or a Retry-After of 10^14 must not
            # push available_at past what D1 binds, failing the whole batch.
            delay_ms = round(clamp_delay_s(outcome.delay_s) * 1000)
            retry = sql.RETRY_FREEING if _holds_places(job) else sql.RETRY
            return [(retry, (now + delay_ms, outcome.error, *held))]
        record = (sql.FAIL_RECORD, (outcome.error or "failed", now, *held))
        if not job.workflow:
            # As a completion's: `_ended_apart` ends it if a waiter named it.
            return [record, (sql.DELETE_HELD_PLAIN, held)]
        return [record, (sql.END_HELD, (*held, sql.ENDED_FAILED)), (sql.DELETE_HELD, held)]

    def _settle_statements(
        self, outcomes: Sequence[Outcome], now: int
    ) -> tuple[list[Statement], list[int], dict[int, list[int]], dict[int, list[Statement]]]:
        """The statements settling `outcomes`; for each outcome, the index of
        the statement whose `changes` tells whether it landed; and for each
        statement acknowledging several jobs at once, which outcomes it
        carries. The completed jobs of a claim batch whose every job is
        settled here go in one DELETE_HELD_BATCH per queue, after the
        batch's other statements; any other job takes its own. `also`: by
        the index of an acknowledgement that deletes only jobs no workflow
        has (DELETE_HELD_PLAIN, DELETE_HELD_BATCH_PLAIN), the statements
        that end and delete the others, sent after it if it fell short."""
        groups: dict[tuple[str, str, int], list[int]] = {}
        batches = self._batches
        if batches:
            sizes = Counter(_batch_key(o.job) for o in outcomes)
            for key, n in sizes.items():
                # Every job the batch won on this queue is settled here, so
                # none is still held under the token, running. A settle of
                # part of a batch drops its count: the rest are then settled
                # one by one, since one of these may fail and stay held.
                if batches.pop(key, None) == n:
                    groups[key] = []
        firsts: list[int] = []
        statements: list[Statement] = []
        also: dict[int, list[Statement]] = {}

        def place(outcome: Outcome) -> int:
            first = len(statements)
            own = self._statements(outcome, now)
            statements.extend(own)
            also.update({first + k: v for k, v in _ended_after(own).items()})
            return first

        for i, outcome in enumerate(outcomes):
            group = groups.get(_batch_key(outcome.job)) if groups else None
            if group is not None and outcome.action == "complete":
                group.append(i)
                firsts.append(-1)  # its group's statement, placed below
                continue
            firsts.append(place(outcome))
        carried: dict[int, list[int]] = {}
        for (token, queue, until), members in groups.items():
            ack, ended = self._ack_batch(queue, until, token, [outcomes[i] for i in members], now)
            if ack is None:
                for i in members:
                    firsts[i] = place(outcomes[i])
            else:
                carried[len(statements)] = members
                for i in members:
                    firsts[i] = len(statements)
                if ended:
                    also[len(statements)] = ended
                statements.append(ack)
        return statements, firsts, carried, also

    def keeps(self, queue: str) -> bool:
        """Whether `queue`'s completed jobs are kept as history."""
        return history_kept(self.keep_completed, self.registry, queue)

    def _ack_batch(
        self, queue: str, until: int, token: str, outcomes: Sequence[Outcome], now: int
    ) -> tuple[Statement | None, list[Statement]]:
        """The one statement acknowledging every completed job of a claim
        batch on `queue`, and what ends the jobs it leaves if it falls short.
        With history, COMPLETE_HELD_BATCH carrying their results (it ends a
        workflow's jobs itself). Without, DELETE_HELD_BATCH_PLAIN, which
        deletes only the jobs no workflow has; a job a waiter named while
        it ran is ended and deleted by the follow-up (`_ended_apart`). None:
        one job (its own statement is as cheap), a batch's job among them
        without history, or results too large to bind as one value."""
        if len(outcomes) < 2:
            return None, []
        held = (queue, until, token)
        if not self.keeps(queue):
            if any(o.job.workflow for o in outcomes):
                return None, []  # each its own statements: END_HELD, DELETE_HELD
            done = json.dumps([o.job.id for o in outcomes])
            ended: list[Statement] = [
                (sql.END_HELD_BATCH, (*held, sql.ENDED_DELETED, done)),
                (sql.DELETE_ENDED_BATCH, held),
            ]
            return (sql.DELETE_HELD_BATCH_PLAIN, held), ended
        results = {o.job.id: o.result for o in outcomes}
        text = json.dumps(results, separators=(",", ":"))
        if len(text) > MAX_RESULT_BYTES:
            return None, []
        return (sql.COMPLETE_HELD_BATCH, (*held, text, now)), []

    async def settle(self, outcomes: Sequence[Outcome]) -> list[bool]:
        """Apply many outcomes in one db.batch (one transaction). For each,
        True if it was written (also when an earlier send of ours landed and
        its reply was lost); False if the lease had lapsed and the job moved
        on, in which case nothing changed. Raises if D1 refuses the batch."""
        statements, firsts, carried, also = self._settle_statements(outcomes, self.clock())
        results = await self.binding.batch(statements)
        marks = await self._marks(outcomes, results, firsts, carried, also=also)
        return [m != "stale" for m in marks]

    async def settle_outcomes(
        self, outcomes: Sequence[Outcome], *, maybe_sent: bool = False
    ) -> list[Mark]:
        """Settle what a drain holds, whatever D1 does: one batch, and if D1
        refuses it, each outcome in a batch of its own, so one statement D1
        cannot take costs no other job its outcome. Never raises for a D1
        error; an outcome D1 refused every time is "unsettled". `maybe_sent`:
        these outcomes may already have landed (a batch carrying them failed
        after it may have committed)."""
        if not outcomes:
            return []
        now = self.clock()
        statements, firsts, carried, also = self._settle_statements(outcomes, now)
        try:
            results = await self.binding.batch(statements)
            return await self._marks(
                outcomes, results, firsts, carried, maybe_sent=maybe_sent, also=also
            )
        except Exception as exc:
            first = exc
        marks: list[Mark] = []
        for outcome in outcomes:
            marks.append(await self._settle_alone(outcome, now, first))
        return marks

    async def _settle_alone(self, outcome: Outcome, now: int, first: Exception) -> Mark:
        """One outcome in a batch of its own, tried SETTLE_TRIES times: even an
        error D1 says not to retry ("overloaded") is worth a short wait here,
        since the alternative is running a finished job again."""
        stmts = self._statements(outcome, now)
        for attempt in range(SETTLE_TRIES):
            try:
                results = await self.binding.batch(stmts)
                also = _ended_after(stmts)
                (mark,) = await self._marks([outcome], results, [0], {}, maybe_sent=True, also=also)
                return mark
            except Exception as exc:
                if attempt + 1 == SETTLE_TRIES or isinstance(exc, SubrequestLimitExceeded):
                    event(
                        log,
                        "d1queue.settle.failed",
                        logging.ERROR,
                        id=outcome.job.id,
                        action=outcome.action,
                        error=str(exc),
                        first_error=str(first),
                    )
                    break
                await asyncio.sleep(0.05 * 4**attempt)
        return "unsettled"

    async def _marks(
        self,
        outcomes: Sequence[Outcome],
        results: Sequence[Result],
        firsts: Sequence[int],
        carried: Mapping[int, list[int]],
        *,
        maybe_sent: bool = False,
        also: Mapping[int, list[Statement]] | None = None,
    ) -> list[Mark]:
        """Each outcome's mark, from the `changes` of its statement
        (`firsts`, as _settle_statements placed them). A statement carrying
        several acknowledgements (`carried`) landed whole if it changed as
        many rows; if it changed fewer, the rest had moved on (their leases
        lapsed): the counts are exact, which jobs they were is not told.
        Where a re-send found nothing to change, a deleting outcome (ack,
        fail) may have landed the first time: one lookup tells, since a row
        still there was not deleted by us. D1's `changes` counts the rows
        the schema's triggers changed too (the waiters a completion frees,
        the batch it counts in): a statement that matched its own row
        changed at least that one, and one that did not fired no trigger."""
        marks: list[Mark] = []
        unsure: list[int] = []
        if also:
            results = await self._ended_apart(results, carried, also)
        landed: dict[int, int] = {k: results[k].changes for k in carried}
        for n, (outcome, at) in enumerate(zip(outcomes, firsts, strict=True)):
            first = results[at]
            resent = first.resent or maybe_sent
            if at in landed:
                if first.changes >= len(carried[at]):
                    marks.append("resent" if resent else "written")
                elif resent:
                    marks.append("stale")
                    unsure.append(n)
                elif landed[at] > 0:
                    landed[at] -= 1
                    marks.append("written")
                else:
                    marks.append("stale")
            elif first.changes >= 1:
                marks.append("resent" if resent else "written")
            elif resent and outcome.action in ("complete", "fail"):
                marks.append("stale")
                unsure.append(n)
            else:
                marks.append("stale")
        for start in range(0, len(unsure), 100):
            chunk = unsure[start : start + 100]
            ids = [outcomes[n].job.id for n in chunk]
            try:
                still = await self.binding.run(sql.select_job_ids(len(ids)), *ids)
            except Exception:
                continue  # unknown: left as stale, which writes nothing more
            present = {r["id"] for r in still.rows}
            for n in chunk:
                if outcomes[n].job.id not in present:
                    marks[n] = "resent"
        return marks

    async def _ended_apart(
        self,
        results: Sequence[Result],
        carried: Mapping[int, list[int]],
        also: Mapping[int, list[Statement]],
    ) -> list[Result]:
        """`results`, where an acknowledgement that deletes only jobs no
        workflow has fell short, with the jobs its follow-up ended and
        deleted counted in: a waiter named them while they ran (or their
        lease lapsed: then the follow-up finds nothing either). The
        follow-up is fenced by the same key and token, so sending it is
        safe whatever the first did; if D1 refuses it, those jobs stay held
        until their lease lapses and run again, as any unsettled job."""
        out = list(results)
        for at, statements in also.items():
            expected = len(carried[at]) if at in carried else 1
            if out[at].changes >= expected:
                continue
            try:
                ended = await self.binding.batch(statements)
            except Exception as exc:
                event(log, "d1queue.settle.unended", logging.WARNING, error=str(exc))
                continue
            out[at] = replace(out[at], changes=out[at].changes + ended[-1].changes)
        return out

    async def complete(self, job: QueuedJob) -> bool:
        """The job is done: kept as history where its queue keeps it, else
        deleted (either releases its unique_key). False if the lease had
        lapsed and this worker no longer held the job."""
        (written,) = await self.settle([Outcome(job, "complete")])
        return written

    async def retry(self, job: QueuedJob, delay_s: float = 0, error: str | None = None) -> bool:
        """Put the job back, runnable after `delay_s`. False if stale."""
        (written,) = await self.settle([Outcome(job, "retry", delay_s=delay_s, error=error)])
        return written

    acknowledge = complete
    """`complete` by its other public name (kept: callers use both)."""
    release = retry
    """`retry` by its other public name (kept: callers use both)."""

    async def fail(self, job: QueuedJob, error: str) -> bool:
        """Move the job to the failed table with `error`, in one transaction:
        never lost, never recorded twice. False if stale."""
        (written,) = await self.settle([Outcome(job, "fail", error=error)])
        return written

    # -- inspection and maintenance -----------------------------------------

    async def size(self, queue: str) -> int:
        """Unreserved jobs on `queue`, delayed ones included."""
        result = await self.binding.run(sql.COUNT_UNRESERVED, check_stored_name("queue", queue))
        return int(result.rows[0]["n"])

    async def due(self, queue: str, cap: int) -> int:
        """Jobs on `queue` a claim could take now, counted up to about `cap`
        (one query reading about as many rows): how many more consumers a
        wake-up should bring in (wake.py), not an exact figure."""
        result = await self.binding.run(
            sql.COUNT_DUE_CAPPED, check_stored_name("queue", queue), self.clock(), max(1, int(cap))
        )
        return min(int(result.rows[0]["n"]), int(cap))

    async def take_fan_out(self, queue: str, window_s: float) -> bool:
        """Whether this caller may fan out on `queue` now: True for the one
        that takes the lease, if no fan-out took it in the last `window_s`
        (one query; a row written only when taken)."""
        now = self.clock()
        result = await self.binding.run(
            sql.TAKE_FAN_OUT, check_stored_name("queue", queue), now, now - int(window_s * 1000)
        )
        return result.changes == 1

    async def clear(self, queue: str) -> int:
        """Delete every job on `queue`, reserved or not (its completed jobs
        stay until pruned; its workflow jobs end as failed for their waiters
        and batches); returns how many."""
        check_stored_name("queue", queue)
        # A workflow's jobs are marked ended first: a clear fails them for
        # their waiters and batches, in the same transaction.
        *_, result = await self.binding.batch(
            [*((e, (queue,)) for e in sql.END_CLEARED), (sql.CLEAR_QUEUE, (queue,))]
        )
        return result.changes

    async def reclaim_expired(self) -> int:
        """Free every lease that lapsed (its worker died or overran); returns
        how many. Maintenance only, as it reads every job: the drain never
        needs it, since a claim takes over a lapsed lease when it meets one."""
        result = await self.binding.run(sql.RECLAIM_EXPIRED, self.clock())
        return result.changes

    async def set_limits(self, queue: str, limits: Limits) -> None:
        """Store `queue`'s flow limits, replacing any: they hold from the next
        claim batch of every drain, on a queue with no jobs yet too. One row
        written; sending it again writes the same."""
        check_name("queue", queue)
        await self.binding.run(sql.SET_LIMITS, queue, self.clock(), limits.to_json())

    async def survey(self, *, every_queue: bool = False) -> tuple[set[str], list[str]]:
        """What a drain reads first, in one round trip: the paused queues and,
        if `every_queue`, the names of every queue holding jobs (found by a
        walk of the key: about two rows read per queue, whatever it holds)."""
        paused, names, _ = await self.survey_flows(every_queue=every_queue)
        return paused, names

    async def survey_flows(
        self, *, every_queue: bool = False
    ) -> tuple[set[str], list[str], dict[str, Flow]]:
        """`survey`, and each queue's flow control (flow.flows_of: its stored
        limits, else those its registry declares, and whether it has groups),
        read from the same rows in the same round trip."""
        if not every_queue:
            queues = await self.binding.run(sql.QUEUE_FLOWS)
            found: list[str] = []
        else:
            queues, names = await self.binding.batch([(sql.QUEUE_FLOWS, ()), (sql.QUEUE_NAMES, ())])
            found = [str(r["name"]) for r in names.rows]
        paused = {str(r["name"]) for r in queues.rows if r["paused"]}
        declared = self.registry.limits() if self.registry is not None else {}
        rows = [(str(r["name"]), r["limits"], bool(r["grouped"])) for r in queues.rows]
        return paused, found, flows_of(rows, declared)

    async def job(self, id: str) -> QueuedJob | None:
        """The queued job `id`, or None (acknowledged, failed or never queued)."""
        result = await self.binding.run(sql.SELECT_JOB, id)
        return row_to_job(result.rows[0]) if result.rows else None

    async def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        """Failed jobs, newest first (failed.py): the first page, at most
        `limit` of them and bounds.MAX_PAGE_BYTES of their payloads and
        errors."""
        jobs, _ = await FailedJobs(self.binding, self.clock).page(None, max(0, int(limit)))
        return jobs

    async def retry_failed(self, id: str) -> bool:
        """Put failed job `id` back on its queue, keeping its attempts and
        last error, with its registration's max_attempts afresh; False if
        there is no such failed job (failed.py)."""
        return await FailedJobs(self.binding, self.clock, self.registry).retry(id)


def _ended_after(statements: Sequence[Statement]) -> dict[int, list[Statement]]:
    """For a job's settle statements: by the index of its DELETE_HELD_PLAIN
    (a completion's, or a failure's after its copy), what ends and deletes
    the job if that found it named by a waiter since its claim."""
    out: dict[int, list[Statement]] = {}
    for i, (text, held) in enumerate(statements):
        if text == sql.DELETE_HELD_PLAIN:
            failed = statements[0][0] == sql.FAIL_RECORD
            ended = sql.ENDED_FAILED if failed else sql.ENDED_DELETED
            out[i] = [(sql.END_HELD, (*held, ended)), (sql.DELETE_HELD, held)]
    return out


def _callback_row(job: QueuedJob, id: str) -> str:
    """A batch callback as its row in d1queue_batch_parts: what the trigger
    that enqueues it inserts ([id, queue, name, payload, max_attempts,
    priority, unique_key]), its id fixed by the batch and its kind."""
    job.validate()
    return json.dumps(
        [
            id,
            job.queue,
            job.name,
            job.payload_json(),
            job.max_attempts,
            job.priority,
            job.unique_key,
        ]
    )


def _recount(batch_id: str, jobs: Sequence[QueuedJob]) -> list[Statement]:
    """RECOUNT_BATCH, when a job of `jobs` may not be inserted (a unique key
    held by another job); none otherwise."""
    if all(j.unique_key is None for j in jobs):
        return []
    return [(sql.RECOUNT_BATCH, (batch_id, json.dumps([j.id for j in jobs]), len(jobs)))]
