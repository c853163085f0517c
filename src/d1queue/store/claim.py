"""The claim: optimistic, by conditional UPDATE (no locks: D1 has none).
A worker reads candidates, then claims each where it was read; the
statement that changes the row wins the job, and every later step of the
job is fenced by the lease's key and token (docs/architecture.md).

A claim round (`settle_and_claim`) is a short run of steps of `_Round`:

    read    the candidates: read ahead by the last claim batch, else a
            SELECT per queue, the owed settle riding in its batch
    choose  which to claim: within the queues' flow limits (admission.py,
            only for queues that have them), then the caller's `admit`
    send    one batch: the owed settle, the claims, and the next round's
            SELECTs (read ahead)
    won     which claims landed (a re-send looks for its own token), each
            job as the UPDATE left it

The settle never depends on the claim: if a batch carrying both fails, the
outcomes are settled on their own (settle.settle_outcomes), the claims are
undone where they may have landed (no attempt spent), and the round
returns the error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.bounds import MAX_ERROR_CHARS, check_stored_name
from ..core.flow import Flow
from ..core.job import QueuedJob, now_ms
from ..core.log import event, get
from ..core.outcomes import Mark, Outcome, exhausted_outcome
from ..core.telemetry import messaging
from . import sql
from .admission import Admission
from .binding import Result, Statement
from .candidates import claim, claim_order, interleave
from .settle import Settling, holds_places, marks, settle, settle_outcomes, settling
from .state import QueueState, batch_key

log = get(__name__)

Admit = Callable[[list[QueuedJob], int], list[QueuedJob]]
"""`admit(candidates, carried)`: which candidates to claim, in order."""


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


RECLAIM_NOTE = sql.RECLAIM_NOTE


def noted(last_error: str | None) -> str:
    """A reclaimed job's last_error as CLAIM writes it (sql._NOTED): the
    reclaim note first, once, then the error it had, cut at MAX_ERROR_CHARS."""
    if last_error is None:
        return RECLAIM_NOTE
    if last_error.startswith(RECLAIM_NOTE):
        return last_error
    return f"{RECLAIM_NOTE}; before that: {last_error}"[:MAX_ERROR_CHARS]


_TOKENS: list[str] = []


def _token() -> str:
    """A fresh reservation token: 64 random bits. Drawn 256 at a time: on
    Pyodide each os.urandom call is a trip to JS (crypto.getRandomValues)
    costing more CPU than the rest of claiming the job."""
    if not _TOKENS:
        pool = os.urandom(8 * 256).hex()
        _TOKENS.extend(pool[i : i + 16] for i in range(0, len(pool), 16))
    return _TOKENS.pop()


class _Plain:
    """A round's reads and claims where no queue has flow control (as
    admission.Admission has them under limits): SELECT_CANDIDATES, and
    CLAIM for each job chosen."""

    __slots__ = ("reads",)

    def __init__(self, shares: dict[str, int]) -> None:
        self.reads = shares

    def selects(self, now: int, *, guarded: bool) -> list[Statement]:
        return [(sql.SELECT_CANDIDATES, (q, now, k)) for q, k in self.reads.items()]

    def heads(self, found: Sequence[Result]) -> tuple[list[list[QueuedJob]], int]:
        return [claim_order(r.rows, k) for r, k in zip(found, self.reads.values(), strict=True)], 0

    def within(self, candidates: list[QueuedJob], settling: Sequence[Outcome]) -> list[QueuedJob]:
        return candidates

    def claims(
        self, chosen: Sequence[QueuedJob], now: int, until: int, db_time: bool
    ) -> tuple[list[Statement], list[int], list[int]]:
        return [claim(job, now, until) for job in chosen], list(range(len(chosen))), []

    @staticmethod
    def refused(claimed: Sequence[Result], takes: Sequence[int]) -> int:
        return 0


async def settle_and_claim(
    q: QueueState,
    outcomes: Sequence[Outcome],
    queue: str | Mapping[str, int],
    n: int,
    admit: Admit | None = None,
    ahead: Mapping[str, list[QueuedJob]] | None = None,
    read_ahead: bool = False,
    flows: Mapping[str, Flow] | None = None,
) -> Round:
    """Settle `outcomes` and claim up to `n` jobs of `queue` in few round
    trips. `queue` may map several queues to their shares of the round: one
    SELECT each, and the candidates taken in turns, one from each queue,
    so a queue with one job is not kept waiting behind another with
    thousands. `admit(candidates, carried)` picks which candidates to
    claim, in order (the drain's budget and window: it knows their names
    and so their handlers' needs only now); `carried` is how many other
    statements ride in the claim batch (the owed settle, the read-ahead
    SELECTs), which a budget counting statements must price too.

    With `read_ahead`, the claim batch also reads the next round's
    candidates (a SELECT per queue after the claims, which see them
    taken): `Round.ahead`. Given back as `ahead` for the same queues, they
    are this round's candidates, and the round is one round trip: the
    settle, the claims and the next SELECTs in one batch. (A candidate
    taken meanwhile by another worker is lost to it, as in any race; a job
    that came due meanwhile waits for the round after.) Without them the
    settle travels with a SELECT first: two round trips.

    `flows` gives the queues with flow control (core/flow.py), which
    admission.py reads and claims (`Round.limited` counts the claims a
    limit refused). Without `flows` (a caller that did not survey) no limit
    applies: limits are the drain's."""
    shares = {queue: n} if isinstance(queue, str) else dict(queue)
    for name in shares:
        check_stored_name("queue", name)
    step = _Round(q, outcomes, shares, n, flows)
    done = await step.read(ahead)
    if done is None:
        step.choose(admit, read_ahead)
        done = await step.send()
    return done if done is not None else await step.won()


class _Round:
    """One claim round's state, moved on by its steps (`settle_and_claim`)."""

    __slots__ = (
        "ahead_reads",
        "at",
        "candidates",
        "chosen",
        "claims",
        "gate",
        "heads",
        "held_back",
        "marks",
        "n",
        "now",
        "offered",
        "owed",
        "q",
        "read_ahead",
        "results",
        "shares",
        "takes",
        "until",
    )

    def __init__(
        self,
        q: QueueState,
        outcomes: Sequence[Outcome],
        shares: dict[str, int],
        n: int,
        flows: Mapping[str, Flow] | None,
    ) -> None:
        self.q, self.shares, self.n = q, shares, n
        self.now = q.clock()
        # Not surveyed (reserve, claim_round): no limit applies, and the
        # plain SELECT reads the grouped bands with the ready one.
        active = {name: f for name, f in (flows or {}).items() if name in shares and f.active}
        self.gate = Admission(shares, active, q.occupied) if active else _Plain(shares)
        self.owed: Settling | None = settling(q, outcomes, self.now) if outcomes else None
        """The settle this round owes, until a batch carried it."""
        self.marks: list[Mark] = []
        self.held_back = 0
        """Queues whose guard held them back: at their limit, none read."""

    async def read(self, ahead: Mapping[str, list[QueuedJob]] | None) -> Round | None:
        """The candidates, each queue's in claim order: those read ahead,
        else read now (with the owed settle, and the places held on queues
        with a concurrency limit, in one batch when there are several).
        A Round if D1 failed (the owed outcomes settled on their own)."""
        gate, owed, binding = self.gate, self.owed, self.q.binding
        if ahead is not None and all(name in ahead for name in self.shares):
            self.heads = [ahead[name][:k] for name, k in gate.reads.items()]
            return None
        reads = gate.selects(self.now, guarded=True)
        settles = owed.statements if owed is not None else []
        try:
            if settles or len(reads) > 1:
                results = await binding.batch([*settles, *reads], positional=True)
                found = results[len(settles) :]
                if owed is not None:
                    self.marks = await marks(self.q, owed, results)
            else:
                found = [await binding.run(reads[0][0], *reads[0][1], positional=True)]
        except Exception as exc:
            if owed is not None:
                self.marks = await settle_outcomes(self.q, owed.outcomes, maybe_sent=True)
            return Round(self.marks, [], 0, exc)
        self.owed = None
        self.heads, self.held_back = gate.heads(found)
        return None

    def choose(self, admit: Admit | None, read_ahead: bool) -> None:
        """The jobs to claim, in turns over the queues, within their limits
        and the caller's `admit`; their claims, under one fresh token."""
        gate, shares, heads, owed = self.gate, self.shares, self.heads, self.owed
        # A read cut short by the queue's limits that came back full offers
        # the queue's whole share: it did not run dry.
        reads = gate.reads
        self.offered = {
            name: shares[name] if len(h) >= reads[name] else len(h)
            for name, h in zip(shares, heads, strict=True)
        }
        settling = owed.outcomes if owed is not None else ()
        candidates = gate.within(interleave(heads)[: self.n], settling)
        self.candidates = len(candidates)
        self.until = self.now + round(self.q.reservation_s * 1000)
        self.read_ahead = read_ahead
        self.ahead_reads = gate.selects(self.now, guarded=False) if read_ahead else []
        riding = (len(owed.statements) if owed is not None else 0) + len(self.ahead_reads)
        chosen = (candidates if admit is None else admit(candidates, riding)) if candidates else []
        # One token for the batch: its jobs on a queue then share their held
        # key's prefix and token, one range (sql.DELETE_HELD_BATCH).
        token = _token()
        for job in chosen:
            job.reservation = token
        self.chosen = chosen
        db_time = self.q.clock is now_ms
        self.claims, self.at, self.takes = gate.claims(chosen, self.now, self.until, db_time)

    async def send(self) -> Round | None:
        """One batch: the owed settle, the claims, the next round's reads.
        A Round when there is nothing to send, or D1 failed (the owed
        outcomes settled on their own, the claims undone)."""
        owed = self.owed
        settles = owed.statements if owed is not None else []
        if not self.claims and not settles:
            held_back = self.held_back
            return Round(self.marks, [], self.candidates, found=self.offered, limited=held_back)
        try:
            self.results = await self.q.binding.batch(
                [*settles, *self.claims, *self.ahead_reads], positional=True
            )
        except Exception as exc:
            if owed is not None:
                self.marks = await settle_outcomes(self.q, owed.outcomes, maybe_sent=True)
            if self.chosen:
                await _unclaim(self.q, self.chosen, self.until)
            return Round(self.marks, [], self.candidates, exc, found=self.offered)
        if owed is not None:
            self.marks = await marks(self.q, owed, self.results)
        return None

    async def won(self) -> Round:
        """The jobs won, as the claim left them (one attempt more, the lease
        ends at `until`), each counted in its claim batch; and the next
        round's candidates read ahead."""
        results, gate, until = self.results, self.gate, self.until
        base = len(self.owed.statements) if self.owed is not None else 0
        claimed = [results[base + i] for i in self.at]
        limited = self.held_back + gate.refused(claimed, self.takes)
        next_heads: dict[str, list[QueuedJob]] | None = None
        if self.read_ahead:
            heads, _ = gate.heads(results[base + len(self.claims) :])
            next_heads = dict(zip(gate.reads, heads, strict=True))
        landed = await _landed(self.q, self.chosen, claimed, until)
        won = []
        for job, took in zip(self.chosen, landed, strict=True):
            if took:
                # The UPDATE set the stored count to one more than read;
                # mirror it so the attempt number the worker sees matches.
                job.attempts += 1
                job.reserved_until = until
                if job.held:
                    job.last_error = noted(job.last_error)
                won.append(job)
        batches = self.q.batches
        for job in won:
            key = batch_key(job)
            batches[key] = batches.get(key, 0) + 1
        return Round(
            self.marks, won, self.candidates, found=self.offered, ahead=next_heads, limited=limited
        )


async def _landed(
    q: QueueState, jobs: Sequence[QueuedJob], results: Sequence[Result], until: int
) -> list[bool]:
    """Which claims won. A claim moves its row, so a re-send of a claim
    that landed finds nothing where the row was read and changes nothing:
    for those (rare: an answer to a re-send), one batch looks for our
    token where the claim put the row."""
    won = [r.changes == 1 for r in results]
    unsure = [i for i, r in enumerate(results) if r.resent and r.changes != 1]
    if unsure:
        try:
            found = await q.binding.batch(
                [
                    (sql.CLAIM_LANDED, (jobs[i].queue, until, jobs[i].id, jobs[i].reservation))
                    for i in unsure
                ]
            )
        except Exception as exc:  # unknown: the lease frees them later
            fields = messaging("receive", count=len(unsure), error_type=type(exc).__name__)
            event(
                log,
                "d1queue.claim.unchecked",
                logging.WARNING,
                jobs=len(unsure),
                error=str(exc),
                **fields,
            )
            return won
        for i, res in zip(unsure, found, strict=True):
            won[i] = bool(res.rows)
    return won


async def _unclaim(q: QueueState, jobs: Sequence[QueuedJob], until: int) -> None:
    """Put back jobs whose claim batch failed: it may have committed before
    the error, and the jobs would sit reserved, an attempt spent, until
    their lease lapsed. If this fails too, the lease does it later."""
    try:
        await q.binding.batch(
            [
                (
                    sql.UNCLAIM_FREEING if holds_places(j) else sql.UNCLAIM,
                    (j.attempts, j.id, j.reservation, j.queue, until, j.band, j.available_at),
                )
                for j in jobs
            ]
        )
    except Exception as exc:
        fields = messaging("receive", count=len(jobs), error_type=type(exc).__name__)
        event(
            log,
            "d1queue.claim.not_undone",
            logging.WARNING,
            jobs=len(jobs),
            error=str(exc),
            **fields,
        )


async def claim_round(q: QueueState, queue: str, n: int) -> tuple[list[QueuedJob], int]:
    """One claim round of `queue`, nothing settled: SELECT up to `n`
    candidates, then one batch of conditional UPDATEs. The jobs whose UPDATE
    changed a row, and how many candidates there were (fewer than `n`: the
    queue ran dry; more than won: the rest were lost to other workers).
    Exhausted jobs are included (see `QueuedJob.exhausted`): the caller
    fails them. Two queries; raises a D1 error."""
    done = await settle_and_claim(q, (), queue, n)
    if done.error is not None:
        raise done.error
    return done.jobs, done.candidates


async def reserve_batch(q: QueueState, queue: str, n: int) -> list[QueuedJob]:
    """Claim up to `n` runnable jobs. Candidates lost to other workers are
    replaced by a fresh SELECT, at most `max_claim_attempts` rounds, so
    contention cannot spin. Jobs claimed with their attempts spent are
    failed here, never returned."""
    jobs: list[QueuedJob] = []
    for _ in range(q.max_claim_attempts):
        want = n - len(jobs)
        if want <= 0:
            break
        won, candidates = await claim_round(q, queue, want)
        exhausted = [j for j in won if j.exhausted or j.doomed]
        if exhausted:
            await settle(q, [exhausted_outcome(j) for j in exhausted])
        jobs += [j for j in won if not (j.exhausted or j.doomed)]
        if candidates < want or (len(won) == candidates and not exhausted):
            break  # the queue ran dry, or nothing was lost to a race
    return jobs


async def reserve(q: QueueState, queue: str) -> QueuedJob | None:
    """Claim the next runnable job of `queue` (`reserve_batch` of one);
    None if the queue is empty or every candidate was taken."""
    check_stored_name("queue", queue)
    jobs = await reserve_batch(q, queue, 1)
    return jobs[0] if jobs else None
