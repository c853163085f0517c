"""The settle: each outcome (core/outcomes.py) written where its worker
holds the job, fenced by the lease's key and token.

- **complete**: kept as history (COMPLETE_HELD, with its result) on a
  queue that keeps it, else deleted. The completed jobs of a claim batch
  whose every job is settled at once are acknowledged by one statement
  per queue (DELETE_HELD_BATCH_PLAIN, or COMPLETE_HELD_BATCH).
- **retry**: moved within the locked band to its retry time (RETRY).
- **fail**: copied to the failed jobs and deleted (FAIL_RECORD, then the
  delete), in one transaction.

Each outcome that keeps the job (a retry, a completion kept as history, a
failure) appends its attempt to the job's history in that same statement
(core/history.py run_entry; sql._runs_set): no statement more.

A workflow's job (one waited for, or a batch's) is ended before it goes,
which releases its dependents and counts it in its batch: workflow_ends.py.
Each outcome's mark says how its settle ended (`Mark`): D1's `changes`
decide, a lookup where a re-send found nothing to change.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.bounds import MAX_RESULT_BYTES, clamp_delay_s
from ..core.history import run_entry
from ..core.job import QueuedJob
from ..core.limits import SubrequestLimitExceeded
from ..core.log import event, get
from ..core.outcomes import Mark, Outcome, history_kept
from ..core.telemetry import messaging
from . import metrics, sql
from .binding import Result, Statement
from .state import BatchKey, QueueState, batch_key
from .workflow_ends import ended_apart, ending, ending_batch, follow_ups

log = get(__name__)

SETTLE_TRIES = 3
"""Sends of one outcome, alone, after the batch carrying it failed."""


@dataclass(slots=True)
class Settling:
    """The statements settling `outcomes`, and how to read their results."""

    outcomes: Sequence[Outcome]
    statements: list[Statement]
    firsts: list[int]
    """For each outcome, the index of the statement whose `changes` tell
    whether it landed."""
    carried: dict[int, list[int]]
    """By the index of a statement acknowledging several jobs at once, the
    outcomes it carries."""
    also: dict[int, list[Statement]]
    """By the index of an acknowledgement that deletes only jobs no
    workflow has, what ends and deletes the others, sent after it if it
    fell short (workflow_ends.py)."""


def holds_places(job: QueuedJob) -> bool:
    """Whether `job` holds flow places, which its retry or undo frees."""
    return job.slot is not None or job.gslot is not None


def statements(q: QueueState, outcome: Outcome, now: int) -> list[Statement]:
    """The statements settling one outcome on its own."""
    job = outcome.job
    held = (job.id, job.reservation, job.queue, job.reserved_until)
    if outcome.action == "complete":
        if history_kept(q.keep_completed, q.registry, job.queue):
            return [(sql.COMPLETE_HELD, (*held, now, outcome.result, run_entry(outcome, now)))]
        if not job.workflow:
            # A waiter may name the job while it runs: if it did, this
            # deletes nothing and its follow-up ends and deletes it.
            return [(sql.DELETE_HELD_PLAIN, held)]
        return ending(held, sql.ENDED_DELETED)
    if outcome.action == "retry":
        # Clamped: a Retry(delay_s=inf) or a Retry-After of 10^14 must not
        # push available_at past what D1 binds, failing the whole batch.
        delay_ms = round(clamp_delay_s(outcome.delay_s) * 1000)
        retry = sql.RETRY_FREEING if holds_places(job) else sql.RETRY
        return [(retry, (now + delay_ms, outcome.error, *held, run_entry(outcome, now)))]
    entry = run_entry(outcome, now)
    record = (sql.FAIL_RECORD, (outcome.error or "failed", now, *held, entry))
    if not job.workflow:
        # As a completion's: its follow-up ends it if a waiter named it.
        return [record, (sql.DELETE_HELD_PLAIN, held)]
    return [record, *ending(held, sql.ENDED_FAILED)]


def settling(q: QueueState, outcomes: Sequence[Outcome], now: int) -> Settling:
    """The statements settling `outcomes` (Settling). The completed jobs of
    a claim batch whose every job is settled here go in one acknowledgement
    per queue (`_ack_batch`), after the batch's other statements; any other
    job takes its own."""
    groups = _whole_batches(q, outcomes)
    out = Settling(outcomes, [], [], {}, {})
    placed, firsts, also = out.statements, out.firsts, out.also

    def place(outcome: Outcome) -> int:
        first = len(placed)
        own = statements(q, outcome, now)
        placed.extend(own)
        also.update({first + k: v for k, v in follow_ups(own).items()})
        return first

    for i, outcome in enumerate(outcomes):
        group = groups.get(batch_key(outcome.job)) if groups else None
        if group is not None and outcome.action == "complete":
            group.append(i)
            firsts.append(-1)  # its group's statement, placed below
            continue
        firsts.append(place(outcome))
    for (token, queue, until), members in groups.items():
        ack, ended = _ack_batch(q, (queue, until, token), [outcomes[i] for i in members], now)
        if ack is None:
            for i in members:
                firsts[i] = place(outcomes[i])
            continue
        out.carried[len(placed)] = members
        for i in members:
            firsts[i] = len(placed)
        if ended:
            also[len(placed)] = ended
        placed.append(ack)
        if q.metrics:  # right after the ack: its changes() guard it
            placed.append(metrics.acked([outcomes[i] for i in members], now))
    if q.metrics:
        alone = [o for o, at in zip(outcomes, firsts, strict=True) if at not in out.carried]
        if alone:
            _before(out, metrics.held(alone, now))
    return out


def _before(made: Settling, statement: Statement) -> None:
    """`statement` first in `made`, the indices of the others moved past it."""
    made.statements.insert(0, statement)
    made.firsts = [at + 1 for at in made.firsts]
    made.carried = {at + 1: v for at, v in made.carried.items()}
    made.also = {at + 1: v for at, v in made.also.items()}


def _whole_batches(q: QueueState, outcomes: Sequence[Outcome]) -> dict[BatchKey, list[int]]:
    """The claim batches (per queue) whose every job won is among
    `outcomes`, each to gather its completions; every batch `outcomes`
    carries any of is forgotten (QueueState.batches)."""
    groups: dict[BatchKey, list[int]] = {}
    batches = q.batches
    if batches:
        sizes = Counter(batch_key(o.job) for o in outcomes)
        for key, n in sizes.items():
            # Every job the batch won on this queue is settled here, so
            # none is still held under the token, running. A settle of
            # part of a batch drops its count: the rest are then settled
            # one by one, since one of these may fail and stay held.
            if batches.pop(key, None) == n:
                groups[key] = []
    return groups


def _ack_batch(
    q: QueueState, held: tuple[str, int, str], outcomes: Sequence[Outcome], now: int
) -> tuple[Statement | None, list[Statement]]:
    """The one statement acknowledging every completed job of a claim
    batch's range `held` (queue, lease end, token), and what ends the jobs
    it leaves if it falls short. With history, COMPLETE_HELD_BATCH carrying
    their results (it ends a workflow's jobs itself). Without,
    DELETE_HELD_BATCH_PLAIN, which deletes only the jobs no workflow has; a
    job a waiter named while it ran is ended and deleted by the follow-up.
    None: one job (its own statement is as cheap), a batch's job among them
    without history, a job whose handler added progress or log lines to
    its attempt (its entry may be kilobytes: its own statement), or results
    and history entries too large to bind as one value."""
    if len(outcomes) < 2:
        return None, []
    if not history_kept(q.keep_completed, q.registry, held[0]):
        if any(o.job.workflow for o in outcomes):
            return None, []  # each its own statements: END_HELD, DELETE_HELD
        done = json.dumps([o.job.id for o in outcomes])
        return (sql.DELETE_HELD_BATCH_PLAIN, held), ending_batch(held, done)
    if any(o.record for o in outcomes):
        return None, []
    results = {o.job.id: o.result for o in outcomes}
    text = json.dumps(results, separators=(",", ":"))
    # Ids match ID_RULE: nothing in them to escape in a JSON key.
    entries = "{" + ",".join(f'"{o.job.id}":{run_entry(o, now)}' for o in outcomes) + "}"
    if len(text) + len(entries) > MAX_RESULT_BYTES:
        return None, []
    return (sql.COMPLETE_HELD_BATCH, (*held, text, now, entries)), []


async def settle(q: QueueState, outcomes: Sequence[Outcome]) -> list[bool]:
    """Apply many outcomes in one db.batch (one transaction). For each,
    True if it was written (also when an earlier send of ours landed and
    its reply was lost); False if the lease had lapsed and the job moved
    on, in which case nothing changed. Raises if D1 refuses the batch."""
    made = settling(q, outcomes, q.clock())
    results = await q.binding.batch(made.statements)
    return [m != "stale" for m in await marks(q, made, results)]


async def settle_outcomes(
    q: QueueState, outcomes: Sequence[Outcome], *, maybe_sent: bool = False
) -> list[Mark]:
    """Settle what a drain holds, whatever D1 does: one batch, and if D1
    refuses it, each outcome in a batch of its own, so one statement D1
    cannot take costs no other job its outcome. Never raises for a D1
    error; an outcome D1 refused every time is "unsettled". `maybe_sent`:
    these outcomes may already have landed (a batch carrying them failed
    after it may have committed)."""
    if not outcomes:
        return []
    now = q.clock()
    made = settling(q, outcomes, now)
    try:
        results = await q.binding.batch(made.statements)
        return await marks(q, made, results, maybe_sent=maybe_sent)
    except Exception as exc:
        first = exc
    return [await _settle_alone(q, outcome, now, first) for outcome in outcomes]


async def _settle_alone(q: QueueState, outcome: Outcome, now: int, first: Exception) -> Mark:
    """One outcome in a batch of its own, tried SETTLE_TRIES times: even an
    error D1 says not to retry ("overloaded") is worth a short wait here,
    since the alternative is running a finished job again."""
    own = statements(q, outcome, now)
    alone = Settling([outcome], own, [0], {}, follow_ups(own))
    if q.metrics:
        _before(alone, metrics.held([outcome], now))
    for attempt in range(SETTLE_TRIES):
        try:
            results = await q.binding.batch(alone.statements)
            (mark,) = await marks(q, alone, results, maybe_sent=True)
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
                    **messaging(
                        "settle", outcome.job.queue, outcome.job.id, error_type=type(exc).__name__
                    ),
                )
                break
            await asyncio.sleep(0.05 * 4**attempt)
    return "unsettled"


async def marks(
    q: QueueState, made: Settling, results: Sequence[Result], *, maybe_sent: bool = False
) -> list[Mark]:
    """Each outcome's mark, from the `changes` of its statement (`firsts`).
    A statement carrying several acknowledgements (`carried`) landed whole
    if it changed as many rows; if it changed fewer, the rest had moved on
    (their leases lapsed): the counts are exact, which jobs they were is
    not told. Where a re-send found nothing to change, a deleting outcome
    (ack, fail) may have landed the first time: one lookup tells, since a
    row still there was not deleted by us. D1's `changes` counts the rows
    the schema's triggers changed too (the waiters a completion frees, the
    batch it counts in): a statement that matched its own row changed at
    least that one, and one that did not fired no trigger."""
    outcomes, carried = made.outcomes, made.carried
    out: list[Mark] = []
    unsure: list[int] = []
    if made.also:
        results = await ended_apart(q.binding, results, carried, made.also)
    landed: dict[int, int] = {k: results[k].changes for k in carried}
    for n, (outcome, at) in enumerate(zip(outcomes, made.firsts, strict=True)):
        first = results[at]
        resent = first.resent or maybe_sent
        if at in landed:
            if first.changes >= len(carried[at]):
                out.append("resent" if resent else "written")
            elif resent:
                out.append("stale")
                unsure.append(n)
            elif landed[at] > 0:
                landed[at] -= 1
                out.append("written")
            else:
                out.append("stale")
        elif first.changes >= 1:
            out.append("resent" if resent else "written")
        elif resent and outcome.action in ("complete", "fail"):
            out.append("stale")
            unsure.append(n)
        else:
            out.append("stale")
    if unsure:
        await _gone(q, outcomes, out, unsure)
    return out


async def _gone(
    q: QueueState, outcomes: Sequence[Outcome], marks: list[Mark], unsure: Sequence[int]
) -> None:
    """Mark "resent" each of the `unsure` outcomes whose job is gone: a
    re-sent deletion found nothing because its first send deleted it."""
    for start in range(0, len(unsure), 100):
        chunk = unsure[start : start + 100]
        ids = [outcomes[n].job.id for n in chunk]
        try:
            still = await q.binding.run(sql.select_job_ids(len(ids)), *ids)
        except Exception:
            continue  # unknown: left as stale, which writes nothing more
        present = {r["id"] for r in still.rows}
        for n in chunk:
            if outcomes[n].job.id not in present:
                marks[n] = "resent"


async def record_progress(q: QueueState, job: QueuedJob, progress: str, seq: int) -> bool:
    """Write a running job's progress report (JSON text, with its attempt's
    log lines so far: core/runs.py) where its worker holds it, fenced by its
    lease's token and written only over a lower `seq` (sql.SET_PROGRESS).
    True if it landed now; False if the lease moved on, or an earlier send
    of this very write landed (its reply lost): either way, safe."""
    held = (job.id, job.reservation, job.queue, job.reserved_until)
    result = await q.binding.run(sql.SET_PROGRESS, *held, progress, seq)
    return result.changes > 0
