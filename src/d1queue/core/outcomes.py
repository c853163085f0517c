"""How one attempt of a job ends, decided in one place: completed (with
its result), retried after its backoff, failed (by the handler, or with its
attempts spent), failed without running (exhausted by a worker that died, a
dependency failed, a payload that does not decode, no handler, more
subrequests declared than a drain can give), and retried when the handler
returned after a subrequest was refused. The drain, the test kit's
`run_job` and the store's settle all take their outcomes from here."""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .bounds import MAX_ERROR_CHARS, MAX_JSON_DEPTH, MAX_RESULT_BYTES, value_depth
from .errors import Fail, Retry
from .job import QueuedJob
from .outbound import strip_credentials
from .registry import Backoff, JobSpec, Registry


@dataclass(frozen=True)
class Outcome:
    """How one reserved job ends this attempt; settled in batches."""

    job: QueuedJob
    action: Literal["complete", "retry", "fail"]
    delay_s: float = 0.0
    error: str | None = None
    result: str | None = None
    """A completion's return value as JSON text (None: nothing returned),
    kept with the job while its queue keeps history."""
    error_type: str | None = None
    """What failed, as the log's `error.type` names it (core/telemetry.py):
    the class of the exception a handler raised, or a d1queue code for a job
    failed without running; None for a completion."""
    record: Mapping[str, Any] | None = None
    """What the handler added to its attempt's history entry (progress,
    log lines: runs.Notes.kept); None: nothing."""


Mark = Literal["written", "resent", "stale", "unsettled"]
"""How an outcome's settle ended: "written" (our lease held);
"resent": written by an earlier send of ours whose reply was lost; "stale":
another worker holds the job now (our lease lapsed), nothing written;
"unsettled": D1 refused it every time; the lease will lapse and the job
run again."""


def error_text(text: str) -> str:
    """An error as stored with its job: at most MAX_ERROR_CHARS, and with no
    URL's `user:password@` in it (the dashboard and the API show errors)."""
    return strip_credentials(text[: MAX_ERROR_CHARS * 2])[:MAX_ERROR_CHARS]


def describe(exc: BaseException) -> str:
    """`Type: message` and where it was raised, as an error is stored."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}" for f in frames)
    return error_text(f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else ""))


def exhausted_outcome(job: QueuedJob) -> Outcome:
    """Failing a job claimed with its attempts already spent, or one whose
    dependency failed (its row says which)."""
    if job.doomed:
        return Outcome(
            job,
            "fail",
            error=job.last_error or "a dependency failed",
            error_type="dependency_failed",
        )
    return Outcome(
        job,
        "fail",
        error=(
            f"attempted too many times: claimed for attempt {job.attempts} of "
            f"{job.max_attempts} after its lease lapsed on the last attempt "
            f"(the worker died or overran); last error: {job.last_error or 'none'}"
        ),
        error_type="attempts_exhausted",
    )


CANCELLED_ERROR = "cancelled while it ran"
"""How the error of a job cancelled while a worker held it begins, in the
failed-jobs store: the API shows such a failure as state `cancelled`
(`is_cancelled`)."""


CANCELLED_TYPE = "cancelled"
"""The `error_type` of a job ended because a cancel marked it while it ran."""


def ending(outcome: Outcome) -> str:
    """How an outcome ends its attempt, as metrics, history and process lines
    name it: its action, or "cancel" for a failure a cancel caused."""
    return "cancel" if outcome.error_type == CANCELLED_TYPE else outcome.action


def is_cancelled(error: str | None) -> bool:
    """Whether a failure's stored error says its job was cancelled while it
    ran (CANCELLED_ERROR; no handler's error can begin so: a raised
    exception's begins with its class name and a colon)."""
    return error is not None and error.startswith(CANCELLED_ERROR)


def cancelled_outcome(job: QueuedJob, noticed: str) -> Outcome:
    """Failing a job a cancel marked while it was held: never retried,
    counted as a failure by its waiters and its batch. `noticed` says how
    the drain learnt of the mark."""
    return Outcome(
        job,
        "fail",
        error=error_text(
            f"{CANCELLED_ERROR}: {noticed} (attempt {job.attempts} of {job.max_attempts}); "
            f"last error: {job.last_error or 'none'}"
        ),
        error_type=CANCELLED_TYPE,
    )


def decided(job: QueuedJob, spec: JobSpec | None, most: int | None = None) -> Outcome | None:
    """The outcome of a job that must not run (None: run it): a cancel
    marked it while it was held (its worker died, or its handler retried),
    it declares more subrequests than a drain can give (`most`), its
    attempts were spent by a worker that died or a dependency failed, its
    payload does not decode, or no handler has its name."""
    if job.cancel_at is not None:
        return cancelled_outcome(job, "the cancel was found when the job was claimed again")
    if spec is not None and most is not None and spec.subrequests > most and not job.exhausted:
        return Outcome(
            job,
            "fail",
            error=f"job {job.name!r} declares {spec.subrequests} subrequests per attempt, "
            f"but a drain on this configuration can give a job at most {most} "
            "(D1QUEUE_PLAN, D1QUEUE_QUERY_BUDGET)",
            error_type="subrequests_declared",
        )
    if job.exhausted or job.doomed:
        return exhausted_outcome(job)
    if job.payload_error:
        return Outcome(job, "fail", error=job.payload_error, error_type="payload_undecodable")
    if spec is None:
        return Outcome(
            job,
            "fail",
            error=f"no handler is registered for job name {job.name!r}",
            error_type="no_handler",
        )
    return None


def raised(job: QueuedJob, spec: JobSpec, exc: Exception) -> Outcome:
    """A handler that raised `exc`: Fail fails the job; Retry, a timeout or
    any other error retries it (after Retry's delay, else the backoff),
    unless that was its last attempt."""
    if isinstance(exc, Fail):
        return Outcome(
            job, "fail", error=error_text(f"failed by the handler: {exc}"), error_type="Fail"
        )
    kind = type(exc).__name__
    if isinstance(exc, Retry):
        text = error_text(f"retry requested: {exc}")
        return retry_or_fail_outcome(job, spec, text, exc.delay_s, error_type=kind)
    if isinstance(exc, TimeoutError):
        text = f"timed out after {spec.timeout_s:g}s"
        return retry_or_fail_outcome(job, spec, text, error_type=kind)
    return retry_or_fail_outcome(job, spec, describe(exc), error_type=kind)


def completed(job: QueuedJob, value: Any) -> Outcome:
    """A handler that returned `value`: the job completes with it as its
    result (JSON), or, for a value that cannot be kept (not JSON, nested
    past MAX_JSON_DEPTH, or over MAX_RESULT_BYTES), fails with why: running
    it again would return the same."""
    if value is None:
        return Outcome(job, "complete")
    if value_depth(value) > MAX_JSON_DEPTH:
        return Outcome(
            job,
            "fail",
            error=f"result nests deeper than {MAX_JSON_DEPTH} levels",
            error_type="result_invalid",
        )
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        return Outcome(
            job, "fail", error=error_text(f"result is not JSON: {exc}"), error_type="result_invalid"
        )
    size = len(text.encode())
    if size > MAX_RESULT_BYTES:
        return Outcome(
            job,
            "fail",
            error=f"result is {size} bytes as JSON; the limit is {MAX_RESULT_BYTES} (64 KiB)",
            error_type="result_invalid",
        )
    return Outcome(job, "complete", result=text)


def retry_or_fail_outcome(
    job: QueuedJob,
    spec: JobSpec | None,
    error: str,
    delay_s: float | None = None,
    error_type: str | None = None,
) -> Outcome:
    """Run again after the backoff (or `delay_s`), unless that was the last
    attempt. `error_type`: what failed (Outcome.error_type)."""
    if job.attempts >= job.max_attempts:
        error = f"{error} (attempt {job.attempts} of {job.max_attempts})"
        return Outcome(job, "fail", error=error, error_type=error_type)
    backoff = spec.backoff if spec is not None else Backoff()
    delay = backoff.delay_s(job.attempts) if delay_s is None else delay_s
    return Outcome(job, "retry", delay_s=delay, error=error, error_type=error_type)


def refused(outcome: Outcome, spec: JobSpec | None, refusal: BaseException | None) -> Outcome:
    """`outcome`, unless the handler caught a subrequest its budget refused
    (`refusal`) and returned: its work is not whole, and the attempt must
    not count as done, so it is retried (or failed on its last attempt)."""
    if refusal is not None and outcome.action == "complete":
        kind = type(refusal).__name__
        return retry_or_fail_outcome(outcome.job, spec, describe(refusal), error_type=kind)
    return outcome


def history_kept(keep_completed: bool, registry: Registry | None, queue: str) -> bool:
    """Whether `queue`'s completed jobs are kept as history, with their
    results: when the store keeps completed jobs (D1QUEUE_KEEP_COMPLETED_S)
    and the registry does not opt the queue out."""
    return keep_completed and (registry is None or registry.keeps_history(queue))
