"""A claim's candidates: the heads of a queue's bands merged in claim
order, several queues' taken in turns, and the CLAIM of one where it was
read. What every claim round does, with flow control (admission.py) or
without (claim.py's plain path)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.job import QueuedJob
from . import sql
from .binding import Statement
from .rows import values_to_job


def claim_order(rows: Sequence[Sequence[Any]], n: int) -> list[QueuedJob]:
    """The first `n` of SELECT_CANDIDATES' rows (read `positional`ly) in
    claim order: highest priority first, then the one due longest, then by
    id. The SELECT returns the heads of the ready, delayed and locked bands,
    each in its own order; this merges them."""
    jobs = [values_to_job(r) for r in rows]
    jobs.sort(key=lambda j: (-j.priority, j.available_at, j.id))
    return jobs[:n]


def interleave(lists: Sequence[Sequence[QueuedJob]]) -> list[QueuedJob]:
    """The first of each list, then the second of each, and so on: a round
    over several queues offers each its turn before any gets a second."""
    if len(lists) == 1:
        return list(lists[0])
    out: list[QueuedJob] = []
    for i in range(max((len(xs) for xs in lists), default=0)):
        out += [xs[i] for xs in lists if i < len(xs)]
    return out


def claim(job: QueuedJob, now: int, until: int) -> Statement:
    """The CLAIM of `job` as it was read (its key: queue, band, available_at,
    id), for a lease ending at `until`."""
    return (
        sql.CLAIM_LAPSED if job.held else sql.CLAIM,
        (now, until, job.reservation, job.id, job.attempts, job.queue, job.band, job.available_at),
    )
