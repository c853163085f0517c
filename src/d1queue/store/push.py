"""The push: a job (or many, a workflow batch, a chain) becomes rows, in
one db.batch (one transaction: all or none) on the database its shard set
routes it to.

A job is checked by the job model (QueuedJob.validate) when it is stamped
with its id and times, then written by the statements its kind needs: a
plain INSERT, a grouped or debounced job's, a waiter's (`after`). A unique
key already held makes the insert change nothing, and the same batch reads
the key's holder, so a deduplicated push is still one round trip.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any, Unpack

from ..core.bounds import BATCH_JOBS, MAX_DEPENDENTS
from ..core.errors import BatchNotRunning, EmptyBatch, TooManyDependents, UnknownDependency
from ..core.job import QueuedJob, check_edges, new_id
from ..core.registry import Overrides, spec_for
from ..core.shards import mark_id, shard_of_id
from . import sql
from .binding import Result, Statement, was_resent
from .state import QueueState

Pushed = list[tuple[str, bool]]
"""Each job's id (its unique key's holder's when it was deduplicated) and
whether it was deduplicated, in order."""


class DuplicateJobId(Exception):
    """push() was given a job whose id is already queued."""


def new_job(
    q: QueueState, name: str, payload: Any = None, **overrides: Unpack[Overrides]
) -> QueuedJob:
    """The job `dispatch` pushes, made now: JobSpec.new of `name`'s spec
    (registry.spec_for), which applies its declared defaults and checks it."""
    job = spec_for(q.registry, name).new(payload, at_ms=q.clock(), **overrides)
    joined(q, (job,))
    return job


async def dispatch(
    q: QueueState,
    name: str,
    payload: Any = None,
    partition: str | None = None,
    **overrides: Unpack[Overrides],
) -> str:
    """Push job `name` made now (`new_job`) to the shard its queue (or
    `partition`) routes to."""
    job = new_job(q, name, payload, **overrides)
    target = q if q.shards is None else q.shards.route_new(q, job, partition)
    job_id, _ = await push(target, job)
    return job_id


def _routed(q: QueueState, jobs: Sequence[QueuedJob], shard: int | None = None) -> QueueState:
    """The queue `jobs` go to: the shard set's choice (shardset.ShardSet.route),
    or `q` when it is the only database. Jobs given no trace context join
    `q`'s (`joined`)."""
    joined(q, jobs)
    return q if q.shards is None else q.shards.route(q, jobs, shard=shard)


def joined(q: QueueState, jobs: Iterable[QueuedJob]) -> None:
    """Give each of `jobs` with no traceparent `q`'s (QueueState.traceparent,
    set on a handler's ctx.queue): the jobs a run pushes (follow-ups,
    dependents, batches and their callbacks) keep its producer's trace."""
    trace = q.traceparent
    if trace is not None:
        for job in jobs:
            if job.traceparent is None:
                job.traceparent = trace


def stamp(q: QueueState, job: QueuedJob) -> QueuedJob:
    """`job` checked by the job model, with its id and times (now, unless
    it has them)."""
    job.validate()
    now = q.clock()
    job.id = job.id or new_id(now)
    job.available_at = job.available_at or now
    job.created_at = job.created_at or now
    return job


async def push(
    q: QueueState, job: QueuedJob, reads: Sequence[Statement] = ()
) -> tuple[str, list[Result]]:
    """Store `job` on the shard it routes to, `reads` riding in the same
    batch (their results are returned after the id): its id, or, when its
    unique_key is already held by a queued job, that job's id (nothing
    stored)."""
    q = _routed(q, [job])
    stamp(q, job)
    statements = _job_statements(q, job)
    if job.unique_key is None:
        results = await _send(q, statements + list(reads), [job])
        inserted, read = results[0], results[len(statements) :]
        if inserted.changes != 1 and not (
            # A transient error hid that the first send landed: the row
            # with this id is our own job.
            inserted.resent and (await q.binding.run(sql.SELECT_JOB, job.id)).rows
        ):
            raise DuplicateJobId(f"a job with id {job.id!r} is already queued")
        return job.id, read
    # Insert and read the key's holder in one round trip: the holder is
    # this job if the insert won, else the job that already had the key.
    statements.append((sql.SELECT_UNIQUE_HOLDER, (job.unique_key,)))
    results = await _send(q, [*statements, *reads], [job])
    holder, read = results[len(statements) - 1], results[len(statements) :]
    if not holder.rows:  # nobody holds the key: the conflict was on the id
        raise DuplicateJobId(f"a job with id {job.id!r} is already queued")
    holder_id = str(holder.rows[0]["id"])
    if job.debounce_s and holder_id != job.id:
        # DEBOUNCE, just before the holder's read: did it move that job?
        debounced = results[len(statements) - 2]
        job.debounced = debounced.changes == 1 or debounced.resent
    return holder_id, read


async def push_noting_paused(q: QueueState, job: QueuedJob) -> tuple[str, set[str]]:
    """`push`, and the names of the paused queues, read in the push's own
    db.batch: a push that tells whether its queue is paused still costs
    one round trip."""
    job_id, (paused,) = await push(q, job, [(sql.PAUSED_QUEUES, ())])
    return job_id, _names(paused)


async def push_many(
    q: QueueState, jobs: Sequence[QueuedJob], reads: Sequence[Statement] = ()
) -> tuple[Pushed, list[Result]]:
    """Store many jobs in one db.batch (one transaction: all or none), on
    the one shard they all route to (ShardError if they route to several),
    `reads` riding in it: (id, deduplicated) per job, in order. Rows are
    packed ten to a statement, D1's 100-bound-parameter limit. TooManyEdges,
    and nothing sent, when their `after` name more than MAX_EDGES ids."""
    check_edges(jobs)
    return await _insert(_routed(q, jobs), jobs, reads)


async def push_many_noting_paused(
    q: QueueState, jobs: Sequence[QueuedJob]
) -> tuple[Pushed, set[str]]:
    """`push_many`, and the paused queues' names read in its db.batch."""
    out, (paused,) = await push_many(q, jobs, [(sql.PAUSED_QUEUES, ())])
    return out, _names(paused)


async def push_batch(
    q: QueueState,
    jobs: Sequence[QueuedJob],
    callbacks: Iterable[tuple[str, QueuedJob | None]],
) -> tuple[str, list[str]]:
    """Store `jobs` as one workflow batch, in one db.batch (all or none):
    the batch's id and the jobs' ids. Each callback given (by its kind:
    on_success, on_failure, on_finish) is enqueued once by the schema
    (migrations/0010_workflows.sql). A job whose unique_key another job
    holds is not pushed, and is not a job of the batch (its id is the
    holder's, as `push_many` says)."""
    if not BATCH_JOBS[0] <= len(jobs) <= BATCH_JOBS[1]:
        raise ValueError(f"a batch holds {BATCH_JOBS[0]} to {BATCH_JOBS[1]} jobs")
    target = _routed(q, jobs)
    batch_id = mark_id(new_id(q.clock()), target.shard)
    for job in jobs:
        job.batch = batch_id
    callbacks = list(callbacks)
    joined(q, [cb for _, cb in callbacks if cb is not None])
    specs = [None if cb is None else _callback_row(cb, f"{batch_id}:{k}") for k, cb in callbacks]
    ids = json.dumps([j.id for j in jobs])
    made = [
        (sql.INSERT_BATCH, (batch_id, len(jobs), target.clock())),
        (sql.INSERT_BATCH_PARTS, (batch_id, ids, *specs)),
    ]
    check_edges(jobs)
    try:
        out, _ = await _insert(target, jobs, (), made, _recount(batch_id, jobs))
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


async def add_to_batch(q: QueueState, batch_id: str, jobs: Sequence[QueuedJob]) -> list[str]:
    """Add `jobs` to batch `batch_id` while it runs (a job of it is still
    pending: a handler of one of its jobs may always add): their ids.
    BatchNotRunning, and nothing written, for a batch that finished or does
    not exist. On the batch's database, whatever the jobs' queues route to."""
    if not BATCH_JOBS[0] <= len(jobs) <= BATCH_JOBS[1]:
        raise ValueError(f"add {BATCH_JOBS[0]} to {BATCH_JOBS[1]} jobs to a batch")
    for job in jobs:
        job.batch = batch_id
    target = _routed(q, jobs, shard_of_id(batch_id))
    ids = [stamp(target, j).id for j in jobs]
    text = json.dumps(ids)
    # After the inserts, counted once: a re-send finds the ids listed.
    grow = [
        (sql.GROW_BATCH, (batch_id, text, ids[0])),
        (sql.GROW_BATCH_IDS, (batch_id, text, ids[0])),
    ]
    check_edges(jobs)
    out, _ = await _insert(target, jobs, (), (), grow)
    return [i for i, _ in out]


async def chain(q: QueueState, jobs: Sequence[QueuedJob]) -> list[str]:
    """Push `jobs` to run one after another: each waits for the one before
    it (`after`), in one db.batch (all or none). Their ids. A job of the
    chain that fails fails the rest (`dependency <id> failed`)."""
    if not 1 <= len(jobs) <= BATCH_JOBS[1]:
        raise ValueError(f"a chain holds 1 to {BATCH_JOBS[1]} jobs")
    target = _routed(q, jobs)  # ids of the shard they go to
    for job in jobs:
        stamp(target, job)
    for before, job in pairwise(jobs):
        job.after = [*(i for i in job.after or () if i != before.id), before.id]
    check_edges(jobs)
    out, _ = await _insert(target, jobs, ())
    return [i for i, _ in out]


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


def _job_statements(q: QueueState, job: QueuedJob) -> list[Statement]:
    """The statements pushing one job (stamped), its INSERT first."""
    if job.after is not None:
        return _waiter_statements(job)
    if job.group is not None or job.debounce_s:
        return _flow_statements(q, job)
    if job.batch is not None or job.traceparent is not None:
        return _packed([job], set())
    return [(sql.INSERT_JOB, _insert_params(job))]


def _waiter_statements(job: QueuedJob) -> list[Statement]:
    """A job waiting for others: its INSERT_WAITER (which checks and
    counts them), its edges, the marks on the jobs it waits for and,
    with a group, its queue's."""
    after = json.dumps(job.after)
    waiter = (job.group, after, int(job.ignore_failed), job.batch, MAX_DEPENDENTS, job.traceparent)
    out: list[Statement] = [
        (sql.INSERT_WAITER, (*_insert_params(job), *waiter)),
        (sql.INSERT_EDGES, (job.id, after)),
        (sql.MARK_WAITED, (after,)),
        (sql.MARK_WAITED_RUNNING, (after,)),
    ]
    if job.group is not None:
        out.append((sql.MARK_GROUPED, (job.queue, job.created_at)))
    return out


def _flow_statements(q: QueueState, job: QueuedJob) -> list[Statement]:
    """The statements pushing a grouped or debounced job (stamped): its
    INSERT_FLOW_JOB, then for a group its tag and its queue's mark, for
    a debounce the update of the job holding its key."""
    flow = (
        job.group,
        _group_step(q, job.queue),
        int(bool(job.debounce_s)),
        job.batch,
        job.traceparent,
    )
    out: list[Statement] = [(sql.INSERT_FLOW_JOB, (*_insert_params(job), *flow))]
    if job.group is not None:
        out += [(sql.BUMP_TAG, (job.id,)), (sql.MARK_GROUPED, (job.queue, job.created_at))]
    if job.debounce_s:
        out.append((sql.DEBOUNCE, (job.unique_key, job.payload_json(), job.available_at, job.id)))
    return out


def _group_step(q: QueueState, queue: str) -> int:
    """The fair-tag step of a group's jobs on `queue`: 1 ms, or the even
    spacing of its group rate (declared in code), so a rate-limited
    group's burst lies spread over time in its band."""
    limits = q.registry.limits().get(queue) if q.registry is not None else None
    if limits is not None and limits.group_rate is not None:
        return limits.group_rate.spacing_ms
    return 1


def _packed(rows: Sequence[QueuedJob], single: set[int]) -> list[Statement]:
    """The INSERTs of the plain jobs of `rows` (not in `single`), packed as
    many to a statement as D1's bound-parameter limit allows: apart by
    whether they have a unique key, whether they are a batch's and whether
    they carry a trace context (untraced rows pack as if traces did not
    exist)."""
    out: list[Statement] = []
    for batch in (False, True):
        for traced in (False, True):
            step = sql.rows_per_insert(batch=batch, traced=traced)
            for unique in (False, True):
                group = [
                    j
                    for j in rows
                    if id(j) not in single
                    and (j.unique_key is not None) == unique
                    and (j.batch is not None) == batch
                    and (j.traceparent is not None) == traced
                ]
                for i in range(0, len(group), step):
                    chunk = group[i : i + step]
                    params = [v for j in chunk for v in _packed_params(j, batch, traced)]
                    insert = sql.insert_jobs(len(chunk), unique=unique, batch=batch, traced=traced)
                    out.append((insert, params))
    return out


def _packed_params(job: QueuedJob, batch: bool, traced: bool) -> tuple[Any, ...]:
    """One row's values in insert_jobs: the ten, then its batch and its
    traceparent where its statement has them."""
    extra = ((job.batch,) if batch else ()) + ((job.traceparent,) if traced else ())
    return (*_insert_params(job), *extra)


async def _insert(
    q: QueueState,
    jobs: Sequence[QueuedJob],
    reads: Sequence[Statement],
    before: Sequence[Statement] = (),
    then: Sequence[Statement] = (),
) -> tuple[Pushed, list[Result]]:
    """Insert `jobs` on `q` (their shard's) in one batch: `before` first,
    then the plain jobs packed, the grouped and debounced ones, the
    waiters, `then`, the unique keys' holders read, and `reads`."""
    rows = [stamp(q, job) for job in jobs]
    # Jobs that wait for others, one by one after the rest, in order:
    # each may wait for a job pushed before it in this batch.
    waiters = [j for j in rows if j.after is not None]
    flow = [j for j in rows if (j.group is not None or j.debounce_s) and j.after is None]
    single = {id(j) for j in (*waiters, *flow)}
    statements = [*before, *_packed(rows, single)]
    # Grouped and debounced jobs one by one, in order: each one's fair
    # tag follows the one before it in its group.
    debounces: dict[str, int] = {}
    for job in flow:
        statements += _flow_statements(q, job)
        if job.debounce_s:
            debounces[job.id] = len(statements) - 1
    for job in waiters:
        statements += _waiter_statements(job)
    statements += then
    keys = sorted({j.unique_key for j in rows if j.unique_key is not None})
    for i in range(0, len(keys), 100):
        chunk_keys = keys[i : i + 100]
        statements.append((sql.select_unique_holders(len(chunk_keys)), chunk_keys))
    # The reads after the inserts: the holder SELECTs, then `reads`.
    tail = (len(keys) + 99) // 100 + len(reads)
    statements.extend(reads)
    plain = [j for j in rows if id(j) not in single and j.unique_key is None]
    try:
        results = await _send(q, statements, rows)
    except Exception as exc:
        # A re-send after a lost reply meets the ids its first send stored
        # (the batch is one transaction: all of them, or none). The keys'
        # holders and the reads are then read on their own.
        if not (plain and was_resent(exc) and await _all_queued(q, plain)):
            raise
        results = await q.binding.batch(statements[len(statements) - tail :])
    read = results[len(results) - len(reads) :] if reads else []
    selects = results[len(results) - tail : len(results) - len(reads)]
    holders = {r["unique_key"]: str(r["id"]) for res in selects for r in res.rows}
    whole = len(results) == len(statements)
    return [_pushed(job, holders, debounces, results if whole else None) for job in rows], read


def _pushed(
    job: QueuedJob,
    holders: dict[Any, str],
    debounces: dict[str, int],
    results: Sequence[Result] | None,
) -> tuple[str, bool]:
    """One job's (id, deduplicated) after `_insert`'s batch, and whether
    its push debounced the job holding its key (`results` None: only the
    reads came back, after a re-send; the first send's debounce landed
    with its inserts)."""
    holder = holders.get(job.unique_key, job.id) if job.unique_key else job.id
    if job.id in debounces and holder != job.id:
        result = None if results is None else results[debounces[job.id]]
        job.debounced = result is None or result.changes == 1 or result.resent
    return holder, holder != job.id


async def _send(
    q: QueueState, statements: Sequence[Statement], jobs: Sequence[QueuedJob]
) -> list[Result]:
    """A push's db.batch; what the schema refused, said in the push's
    terms: an `after` naming no job it may wait for or one waited for
    by MAX_DEPENDENTS jobs already, a batch not running. Nothing was
    written in any case (one transaction)."""
    try:
        return await q.binding.batch(statements)
    except Exception as exc:
        text = str(exc)
        if "d1queue_jobs.waiting" in text:
            await _refused_after(q, jobs)
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


async def _refused_after(q: QueueState, jobs: Sequence[QueuedJob]) -> None:
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
        found = await q.binding.run(sql.UNKNOWN_AFTER, chunk)
        unknown += [str(r["id"]) for r in found.rows]
        counted = await q.binding.run(sql.DEPENDENT_COUNTS, chunk, MAX_DEPENDENTS)
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
    full = [i for i in ids if (i in live or i in pushed) and edges[i] + named[i] > MAX_DEPENDENTS]
    if full:
        raise TooManyDependents(full, MAX_DEPENDENTS)
    raise UnknownDependency(unknown)


async def _all_queued(q: QueueState, jobs: Sequence[QueuedJob]) -> bool:
    """Whether every one of `jobs` is queued (by id): a re-send's first
    send landed."""
    for i in range(0, len(jobs), 100):
        ids = [j.id for j in jobs[i : i + 100]]
        found = await q.binding.run(sql.select_job_ids(len(ids)), *ids)
        if len(found.rows) != len(ids):
            return False
    return True


def _callback_row(job: QueuedJob, id: str) -> str:
    """A batch callback as its row in d1queue_batch_parts: what the trigger
    that enqueues it inserts ([id, queue, name, payload, max_attempts,
    priority, unique_key]), its id fixed by the batch and its kind."""
    job.validate()
    row = [id, job.queue, job.name, job.payload_json(), job.max_attempts, job.priority]
    return json.dumps([*row, job.unique_key, job.traceparent])


def _recount(batch_id: str, jobs: Sequence[QueuedJob]) -> list[Statement]:
    """RECOUNT_BATCH, when a job of `jobs` may not be inserted (a unique key
    held by another job); none otherwise."""
    if all(j.unique_key is None for j in jobs):
        return []
    return [(sql.RECOUNT_BATCH, (batch_id, json.dumps([j.id for j in jobs]), len(jobs)))]
