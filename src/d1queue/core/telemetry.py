"""OpenTelemetry's names on d1queue's log events, stated once.

Every event about a job, a push or a drain carries the messaging semantic
conventions' attributes (`messaging`), so Workers Logs and any OTLP
destination can be queried by the standard names:

    messaging.system               "d1queue"
    messaging.operation.type       "send" (a push), "receive" (a claim),
                                   "process" (a run, a drain), "settle"
    messaging.destination.name     the queue
    messaging.message.id           the job's id
    messaging.batch.message_count  the jobs of a batch push or of a drain
    error.type                     what failed: an exception's class, or a
                                   d1queue code (outcomes.py)

A job pushed with a W3C `traceparent` keeps it (QueuedJob.traceparent); its
`d1queue.process` lines carry `trace_id` (the producer's trace) and
`parent_span_id` (the producer's span: the creation context a tracing
backend links the run to).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .job import trace_fields as trace_fields  # its home; named here as before
from .outcomes import Mark, Outcome, ending

SYSTEM = "d1queue"

PROCESS_EVENT = "d1queue.process"
"""One line per job run and settled (or found stale, or left unsettled)."""

PROCESS_LOGGER = "d1queue.process"
"""The logger of the process lines: a notable run's at INFO, any other's at
DEBUG (`notable`), so its level says which runs log (Config.job_logs)."""

JOB_LOG_LEVELS = {"notable": logging.NOTSET, "all": logging.DEBUG, "off": logging.WARNING}
"""PROCESS_LOGGER's level for each D1QUEUE_JOB_LOGS: NOTSET follows the
d1queue logger's (INFO: notable runs only)."""

OUTCOMES = {"complete": "completed", "retry": "retried", "fail": "failed", "cancel": "cancelled"}
"""A settled outcome's ending (outcomes.ending) as a process line names it
(the drain's report counts the same words; a cancel among its failures)."""


def messaging(
    operation: str,
    queue: str | None = None,
    id: str | None = None,
    count: int | None = None,
    error_type: str | None = None,
) -> dict[str, Any]:
    """The convention's attributes of one event: `operation` (send,
    receive, process, settle), and those of `queue`, `id` (the job's),
    `count` (a batch's jobs) and `error_type` that apply (None: left out)."""
    out: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.operation.type": operation}
    if queue is not None:
        out["messaging.destination.name"] = queue
    if id is not None:
        out["messaging.message.id"] = id
    if count is not None:
        out["messaging.batch.message_count"] = count
    if error_type is not None:
        out["error.type"] = error_type
    return out


def notable(outcome: Outcome, mark: Mark) -> bool:
    """Whether a run's process line is logged at INFO: it did not simply
    complete (a failure, a retry, a settle lost to another worker or to
    D1), or its job carries a trace someone will look for."""
    return (
        outcome.action != "complete"
        or (mark != "written" and mark != "resent")
        or outcome.job.traceparent is not None
    )


def process_fields(outcome: Outcome, mark: Mark) -> dict[str, Any]:
    """The fields of one job's process line: who (queue, name, id, attempt),
    how it ended (`outcome`: completed, retried, failed; or `stale` when
    another worker held the job by its settle, `unsettled` when D1 refused
    the settle), `wait_ms` (due → started; a grouped job's due time is its
    fair turn), `run_ms` (its handler's run), `error.type` and the trace:
    the job's one measured start and end (QueuedJob.started_at, ended_at),
    which its metrics count too (store/metrics.py)."""
    job = outcome.job
    written = mark == "written" or mark == "resent"
    fields = messaging(
        "process",
        job.queue,
        job.id,
        error_type=outcome.error_type if outcome.action != "complete" else None,
    )
    fields["name"] = job.name
    fields["attempt"] = job.attempts
    fields["outcome"] = OUTCOMES[ending(outcome)] if written else mark
    fields["wait_ms"] = job.wait_ms
    fields["run_ms"] = job.run_ms
    if job.traceparent is not None:
        fields.update(trace_fields(job.traceparent))
    return fields


def drained(report: Mapping[str, Any]) -> dict[str, Any]:
    """The convention's attributes of a drain's summary line (its report as
    a dict): a "process" of the jobs it claimed, `error.type` the D1 error
    that stopped it ("d1_error"), if one did."""
    return messaging(
        "process",
        count=int(report.get("claimed") or 0),
        error_type="d1_error" if report.get("error") else None,
    )
