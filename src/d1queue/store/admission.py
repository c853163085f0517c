"""Flow admission: how a claim round reads and claims on queues with flow
control (core/flow.py: concurrency and rate limits, per queue and per
group, and groups taking turns). A round over queues with none never comes
here: claim.py's plain path reads SELECT_CANDIDATES and claims with CLAIM.

The limits hold in the claim batch itself: each claim under them takes its
places (CLAIM_LIMITED, through the slot indexes) and its rates' starts
(TAKE_FLOW) in SQL, and changes nothing if another drain took them first.
What is decided here only spares the batch claims it would refuse anyway:
how many candidates to read, in which order (groups in turn), and which
to try, each of a queue with a concurrency limit given a place its last
read found free ([flow-control.md](../../../docs/flow-control.md)).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

from ..core.bounds import MAX_SAFE_INT
from ..core.flow import NO_GROUP, QUEUE_ROW, Flow
from ..core.job import QueuedJob
from ..core.outcomes import Outcome
from . import sql
from .binding import Result, Statement
from .candidates import claim, claim_order
from .rows import values_to_job


class Admission:
    """One claim round's reads and claims on queues with flow control
    (`flows`; the round's other queues as claim.py's plain path has them):
    the round's `reads` per queue, the places free on those with a
    concurrency limit (`occupied`, kept by the queue across rounds)."""

    def __init__(
        self,
        shares: Mapping[str, int],
        flows: Mapping[str, Flow],
        occupied: dict[str, set[int]],
    ) -> None:
        self.flows = flows
        self.occupied = occupied
        self.reads = {q: _reads(k, flows.get(q)) for q, k in shares.items()}
        """How many candidates the round reads from each queue."""
        self.limited = [q for q in shares if (f := flows.get(q)) and f.limits.concurrency]
        """The queues with a concurrency limit, whose places are read with
        the candidates."""

    def selects(self, now: int, *, guarded: bool) -> list[Statement]:
        """The candidate SELECT of each queue, then the places held on the
        limited ones (sql.OCCUPIED_SLOTS). `guarded`: a queue at its own
        limits reads nothing (the next round's reads, read ahead, are not:
        this round's claims may fill the limit, and its settle free it)."""
        flows = self.flows
        selects = [_select(q, now, k, flows.get(q), guarded=guarded) for q, k in self.reads.items()]
        return selects + [(sql.OCCUPIED_SLOTS, (q,)) for q in self.limited]

    def heads(self, found: Sequence[Result]) -> tuple[list[list[QueuedJob]], int]:
        """What `selects`' results hold: each queue's candidates in claim
        order, and how many queues their guard held back (at their limit:
        none of their jobs was read). Notes the places found held."""
        reads, flows = self.reads, self.flows
        selected, places = found[: len(reads)], found[len(reads) :]
        heads = [
            _order(r.rows, k, flows.get(q))
            for r, (q, k) in zip(selected, reads.items(), strict=True)
        ]
        for q, held in zip(self.limited, places, strict=True):
            self.occupied[q] = {r[0] for r in held.rows}
        # A queue its guard held back answered one row of NULLs.
        held_back = sum(1 for r in selected if r.rows and r.rows[-1][0] is None)
        return heads, held_back

    def within(self, candidates: list[QueuedJob], settling: Sequence[Outcome]) -> list[QueuedJob]:
        """The candidates the round tries, within each queue's limits, given
        the places free (those the last read found free, and those of the
        jobs the round's own settle frees: it runs before the claims, in
        their batch)."""
        free = _free_places(self.flows, self.limited, self.occupied, settling)
        return _within_limits(candidates, self.flows, free)

    def claims(
        self, chosen: Sequence[QueuedJob], now: int, until: int, db_time: bool
    ) -> tuple[list[Statement], list[int], list[int]]:
        """The claim batch's statements for `chosen`; the index of each one's
        CLAIM in them; and of its first TAKE_FLOW (-1: none, no limit)."""
        flows = self.flows
        claims: list[Statement] = []
        at: list[int] = []
        takes: list[int] = []
        for job in chosen:
            flow = flows.get(job.queue)
            takes.append(len(claims) if flow is not None and not flow.limits.none else -1)
            claims += _claim_under(job, now, until, flow, db_time=db_time)
            at.append(len(claims) - 1)
        return claims, at, takes

    @staticmethod
    def refused(claimed: Sequence[Result], takes: Sequence[int]) -> int:
        """Limited claims (`claimed`: each chosen job's CLAIM result) that
        changed nothing: a rate's take refused one, or a place was gone
        (another drain's claim took it, or its group had none free), or
        another drain took the job itself."""
        return sum(
            1
            for t, r in zip(takes, claimed, strict=True)
            if t >= 0 and r.changes != 1 and not r.resent
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
        return [claim(job, now, until)]
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
    _, params = claim(job, now, until)
    places = (job.slot, limits.group_concurrency or 0, job.group or NO_GROUP)
    if limits.group_concurrency is not None and job.gslot is None:
        job.gslot = -1  # a place in its group, the claim's SQL picks which
    out.append((sql.claim_limited(lapsed=job.held, rate_rows=len(rows)), (*params, *places, *rows)))
    return out
