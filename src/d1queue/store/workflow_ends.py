"""A workflow's jobs at their settle: a job some job waits for (`after`) or
a batch counts is marked ended before it is deleted, which fires the
schema's trigger counting its end for its waiters and batch, in the
settle's transaction (migrations/0010_workflows.sql).

A job read as no workflow's is deleted by a statement that leaves
workflow jobs alone (DELETE_HELD_PLAIN, DELETE_HELD_BATCH_PLAIN), so a
settle of plain jobs deletes in one pass. A waiter may name such a job
while it runs: then that statement falls short, and the follow-up made
here ends and deletes it. settle.py sends these; nothing else does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..core.log import event, get
from ..core.telemetry import messaging
from . import sql
from .binding import Binding, Result, Statement

log = get(__name__)


def ending(held: Sequence[Any], ended: int) -> list[Statement]:
    """The statements ending and deleting the held job `held` (id,
    reservation, queue, lease end) as `ended` (sql.ENDED_DELETED: completed
    without history, sql.ENDED_FAILED): END_HELD, then DELETE_HELD."""
    return [(sql.END_HELD, (*held, ended)), (sql.DELETE_HELD, held)]


def ending_batch(held: Sequence[Any], done: str) -> list[Statement]:
    """What ends and deletes the completed jobs `done` (their ids, JSON) of a
    claim batch's range `held` (queue, lease end, token) that a waiter
    named while they ran: after DELETE_HELD_BATCH_PLAIN fell short."""
    return [
        (sql.END_HELD_BATCH, (*held, sql.ENDED_DELETED, done)),
        (sql.DELETE_ENDED_BATCH, held),
    ]


def follow_ups(statements: Sequence[Statement]) -> dict[int, list[Statement]]:
    """For a job's settle statements: by the index of its DELETE_HELD_PLAIN
    (a completion's, or a failure's after its copy), what ends and deletes
    the job if that found it named by a waiter since its claim."""
    out: dict[int, list[Statement]] = {}
    for i, (text, held) in enumerate(statements):
        if text == sql.DELETE_HELD_PLAIN:
            failed = statements[0][0] == sql.FAIL_RECORD
            out[i] = ending(held, sql.ENDED_FAILED if failed else sql.ENDED_DELETED)
    return out


async def ended_apart(
    binding: Binding,
    results: Sequence[Result],
    carried: Mapping[int, list[int]],
    also: Mapping[int, list[Statement]],
) -> list[Result]:
    """`results`, where an acknowledgement that deletes only jobs no
    workflow has fell short, with the jobs its follow-up (`also`) ended and
    deleted counted in: a waiter named them while they ran (or their lease
    lapsed: then the follow-up finds nothing either). The follow-up is
    fenced by the same key and token, so sending it is safe whatever the
    first did; if D1 refuses it, those jobs stay held until their lease
    lapses and run again, as any unsettled job."""
    out = list(results)
    for at, statements in also.items():
        expected = len(carried[at]) if at in carried else 1
        if out[at].changes >= expected:
            continue
        try:
            ended = await binding.batch(statements)
        except Exception as exc:
            kind = type(exc).__name__
            fields = messaging("settle", error_type=kind)
            event(log, "d1queue.settle.unended", logging.WARNING, error=str(exc), **fields)
            continue
        out[at] = replace(out[at], changes=out[at].changes + ended[-1].changes)
    return out
