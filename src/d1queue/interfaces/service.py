"""The operations other Workers and people call, over HTTP (api.py) or RPC
(entry.py), with one validation for both.

Every check runs before anything is written, so a bad request writes nothing;
failures are `ApiError`s carrying an HTTP status and a stable code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from ..core.bounds import (
    BATCH_JOBS,
    ID_PATTERN,
    ID_RULE,
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_EDGES,
    MAX_JSON_DEPTH,
    MAX_OLDER_THAN_S,
    MAX_PAGE,
    MAX_PARTITION,
    MAX_PAYLOAD_BYTES,
    PRIORITY_RANGE,
    STORED_ID_PATTERN,
    STORED_ID_RULE,
    STORED_NAME_RULE,
    check_traceparent,
    is_name,
    is_stored_name,
    json_depth,
    name_refusal,
    page_bytes,
    value_depth,
)
from ..core.config import Config
from ..core.errors import (
    BatchNotRunning,
    EmptyBatch,
    TooManyDependents,
    TooManyEdges,
    UnknownDependency,
)
from ..core.flow import Limits, LimitsError
from ..core.job import QueuedJob, new_id
from ..core.log import event, get
from ..core.metrics import OUTCOMES, WINDOWS, Figures, prometheus
from ..core.outcomes import history_kept, is_cancelled
from ..core.registry import Registry, spec_for
from ..core.schedule import DEFAULT_CATCH_UP, DEFAULT_TZ, ScheduleDef, ScheduleError
from ..core.shards import merge_pages, shard_of_id
from ..core.telemetry import messaging, trace_fields
from ..features.after_push import AfterPush
from ..store import metrics as store_metrics
from ..store.admin import QueueStats
from ..store.aggregate import ShardedAdmin, ShardedSchedules
from ..store.failed import FailedJob
from ..store.push import push_many_noting_paused, push_noting_paused
from ..store.queue import D1Queue
from ..store.shardset import ShardSet
from ..store.workflows import COMPLETED_CURSOR_RULE, JobView, Workflows, stored

log = get(__name__)

SCHEDULE_FIELDS = {"id", "cron", "name", "payload", "queue", "tz", "catch_up"}
"""A schedule's fields in POST /v1/schedules (and the RPC argument)."""
SCHEDULE_ERROR_CODES = {"cron": "invalid_cron", "tz": "unknown_timezone"}
"""422 codes naming what is wrong with a schedule; other fields: `invalid`."""

JOB_FIELDS = {
    "name",
    "payload",
    "delay_s",
    "max_attempts",
    "priority",
    "unique_key",
    "partition",
    "group",
    "debounce_s",
    "after",
    "ignore_failed",
    "traceparent",
}
"""A job's fields in a push whose queue is in the path (or the RPC argument)."""
JOB_FIELDS_WITH_QUEUE = JOB_FIELDS | {"queue"}
"""A job's fields in a push by name alone (POST /v1/jobs, RPC dispatch_job):
`queue` is optional there, and the job's registered queue applies without it."""

CALLBACKS = ("on_success", "on_failure", "on_finish")
"""A batch's callback jobs, by the field naming each in POST /v1/batches."""
BATCH_FIELDS = {"jobs", *CALLBACKS}
"""The fields of POST /v1/batches (and of the RPC `batch` argument)."""
CALLBACK_FIELDS = {
    "name",
    "payload",
    "queue",
    "max_attempts",
    "priority",
    "unique_key",
    "traceparent",
}
"""What a batch's callback job keeps: the trigger that enqueues it inserts
these and nothing else (store/push.py _callback_row), so any other field a
job may take is refused in a callback rather than dropped unsaid."""
BATCH_JOBS_RULE = f"jobs must be an array of {BATCH_JOBS[0]} to {BATCH_JOBS[1]} jobs"
"""bounds.BATCH_JOBS in words: the message of a batch's or an addition's
job count, as the OpenAPI document's minItems and maxItems state it."""
EDGES_RULE = (
    f"their after name at most {MAX_EDGES} ids in all (else 422 too_many_edges, nothing written)"
)
"""bounds.MAX_EDGES in words, as the OpenAPI document states it of a batch
push's, a batch's and an addition's jobs."""
DEPENDENTS_SHOWN = 100
"""Dependents a job's answer lists (GET /v1/jobs/{id}): one indexed read
of the edges, a page's worth; a job waited on by more lists its first."""
SAME_SHARD = (
    "a job waits only for jobs on its own D1 database (shard): an id of another "
    "shard is unknown to it"
)
COMPLETED_CURSOR = re.compile(COMPLETED_CURSOR_RULE)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **fields: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.fields = fields
        """More of the error object, beside code and message (a 409 `ended`'s
        `state`)."""

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.fields}}


UNAVAILABLE_RETRY_AFTER_S = 2
"""The Retry-After of a 503 `unavailable`: D1 failing past the binding's own
re-sends (store/binding.py's RetryPolicy) is most often back within seconds."""


def unavailable() -> ApiError:
    """D1 failed in a way the request could not ride out (binding's
    is_unavailable): the client should retry after UNAVAILABLE_RETRY_AFTER_S."""
    return ApiError(
        503,
        "unavailable",
        f"the database is unavailable for now: retry in {UNAVAILABLE_RETRY_AFTER_S} s",
    )


def invalid(message: str) -> ApiError:
    return ApiError(422, "invalid", message)


def too_deep(what: str) -> ApiError:
    return ApiError(422, "too_deep", f"{what} nests deeper than {MAX_JSON_DEPTH} levels")


def check_queue(name: Any) -> str:
    """A queue jobs or settings are written to, named in a path or an
    argument (NAME_RULE): 400 invalid_queue otherwise."""
    if not is_name(name):
        raise ApiError(400, "invalid_queue", name_refusal("queue", name))
    return str(name)


def check_stored_queue(name: Any) -> str:
    """A queue read or cleared, named in a path or an argument: any name a
    row may have (STORED_NAME_RULE), so one no URL can carry is still
    reached over RPC; 400 invalid_queue otherwise."""
    if not is_stored_name(name):
        raise ApiError(400, "invalid_queue", name_refusal("queue", name, STORED_NAME_RULE))
    return str(name)


def check_id(id: Any) -> str:
    """A job's, failed job's, batch's or schedule's id as every caller gives
    one (a path segment, an RPC argument): any id a row may have
    (STORED_ID_RULE: what d1queue makes and ID_RULE allows, and rows whose id
    no URL can carry, reached over RPC), or 400 invalid_id."""
    if not isinstance(id, str) or not STORED_ID_PATTERN.fullmatch(id):
        raise ApiError(400, "invalid_id", name_refusal("id", id, STORED_ID_RULE))
    return id


def check_path_id(id: Any) -> str:
    """An id as a URL path can carry it (ID_RULE): what the Python client
    checks before it sends one."""
    if not isinstance(id, str) or not ID_PATTERN.fullmatch(id):
        raise ApiError(400, "invalid_id", name_refusal("id", id, ID_RULE))
    return id


def _int(obj: dict[str, Any], key: str, lo: int, hi: int, where: str = "") -> int | None:
    """`obj[key]` checked as an integer from lo to hi; None when absent, so
    the job's declared default applies (JobSpec.new). A null is refused."""
    if key not in obj:
        return None
    value = obj[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema's integer: 120.0 is one
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise invalid(f"{where}{key} must be an integer from {lo} to {hi}")
    return value


def _stats(s: QueueStats) -> dict[str, Any]:
    return asdict(s)


def _merge(into: Figures, other: Figures) -> None:
    into.merge(other)


def _point(at: int, f: Figures) -> dict[str, Any]:
    """One step of a chart: its counts and its p50/p95 wait and run."""
    wait, run = f.wait.summary(), f.run.summary()
    return {
        "at": at,
        **dict(zip(OUTCOMES, f.counts, strict=True)),
        "wait_p50_s": wait["p50_s"],
        "wait_p95_s": wait["p95_s"],
        "run_p50_s": run["p50_s"],
        "run_p95_s": run["p95_s"],
    }


def stored_payload(text: str) -> Any:
    """A failed job's payload as the JSON value it was pushed as, the same
    as a queued job's. The store keeps the text, and the text may be what
    made the job fail (a row written by hand or by another writer): text
    that is not valid JSON, or that nests past MAX_JSON_DEPTH (whose parse
    could overflow Pyodide's stack), is answered as the string it is."""
    if json_depth(text) > MAX_JSON_DEPTH:
        return text
    try:
        # NaN and Infinity parse in Python but are not JSON: the answer
        # would not be either.
        return json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return text


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _failed(f: FailedJob) -> dict[str, Any]:
    after = stored(f.after)
    last = f.runs[-1] if f.runs else {}
    return {
        **asdict(f),
        "payload": stored_payload(f.payload),
        "state": "cancelled" if is_cancelled(f.error) else "failed",
        "after": after if isinstance(after, list) else None,
        # Not kept with a failure: it decided nothing once the job failed.
        "ignore_failed": None,
        "started_at": None,
        "progress": last.get("progress"),
        "logs": None,
        "logs_truncated": 0,
    }


def _progress(view: JobView) -> tuple[dict[str, Any] | None, list[Any] | None, int]:
    """A job's latest progress as the API shows it ({attempt, value, note?,
    at}), and, while its attempt runs, the log lines that attempt has
    written with its progress so far and how many it left out."""
    stored = view.progress
    if stored is None:
        return None, ([] if view.started_at is not None else None), 0
    progress = {k: v for k, v in stored.items() if k in ("attempt", "value", "note", "at")}
    if view.started_at is None or stored.get("attempt") != view.job.attempts:
        return progress, ([] if view.started_at is not None else None), 0
    return progress, list(stored.get("logs") or []), int(stored.get("logs_truncated") or 0)


def _view(view: JobView) -> dict[str, Any]:
    """A live or completed job as the API answers it."""
    job = view.job
    completed = view.state == "completed"
    progress, logs, truncated = _progress(view)
    return {
        "id": job.id,
        "queue": job.queue,
        "name": job.name,
        "state": view.state,
        "payload": job.payload,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "available_at": job.available_at,
        "created_at": job.created_at,
        "reserved_until": None if completed else job.reserved_until,
        "unique_key": job.unique_key,
        "group": job.group,
        "last_error": job.last_error,
        "after": job.after,
        "ignore_failed": view.ignore_failed,
        "batch": job.batch,
        "result": view.result if completed else None,
        "completed_at": view.completed_at if completed else None,
        "started_at": view.started_at,
        "progress": progress,
        "logs": logs,
        "logs_truncated": truncated,
        "runs": view.runs,
    }


def unknown_dependency(exc: UnknownDependency) -> ApiError:
    return ApiError(
        422,
        "unknown_dependency",
        "after names no job that is queued, running, failed or kept as completed on the "
        f"job's database: {', '.join(exc.ids)} ({SAME_SHARD})",
    )


REFUSED_AFTER = (UnknownDependency, TooManyDependents, TooManyEdges)
"""What a push's `after` may be refused for, nothing written: the 422 each
becomes is `refused_after`'s."""


def refused_after(exc: Exception) -> ApiError:
    """A push's refused `after` as its 422, naming the bound and the jobs."""
    if isinstance(exc, TooManyDependents):
        return ApiError(422, "too_many_dependents", str(exc))
    if isinstance(exc, TooManyEdges):
        return ApiError(422, "too_many_edges", str(exc))
    assert isinstance(exc, UnknownDependency)
    return unknown_dependency(exc)


def batch_not_running(id: str) -> ApiError:
    return ApiError(
        409,
        "batch_not_running",
        f"batch {id!r} is not running (every job of it ended, or it never existed): "
        "nothing was added",
    )


def _page_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ApiError(400, "invalid_limit", f"limit must be an integer from 1 to {MAX_PAGE}")
    return limit


class Service:
    """`after_push` (features/after_push.py) is told of every successful
    push, with the shard it wrote to: wake-ups and drain-on-push start there.
    (`on_push(queue, shard)`, a plain function, is its earlier form and still
    works.) `config` is the Worker's
    drain configuration: a push to a queue it does not drain says so in its
    answer (default: Config()). `shards`: the D1 databases, one queue each
    (default: `queue` alone); every operation goes to the shard a job's id
    or queue names, or to all of them (aggregate.py)."""

    def __init__(
        self,
        queue: D1Queue,
        registry: Registry,
        on_push: Callable[[str, int], Awaitable[None] | None] | None = None,
        config: Config | None = None,
        shards: ShardSet | None = None,
        after_push: AfterPush | None = None,
    ) -> None:
        self.shards = shards or ShardSet.of(queue)
        self.queue = self.shards.home
        for q in self.shards.queues:
            # A queue made without the registry (the Worker glue makes its
            # queues before it knows one) would retry a failed job with the
            # library's default attempts, not its registration's.
            if q.registry is None:
                q.registry = registry
        self.registry, self.on_push, self.after_push = registry, on_push, after_push
        self.config = config or Config()
        self.admin = ShardedAdmin(self.shards)
        self.schedule_store = ShardedSchedules(self.shards, registry)

    # -- pushing ----------------------------------------------------------------

    def parse_job(
        self, queue: str | None, obj: Any, where: str = "", traceparent: str | None = None
    ) -> QueuedJob:
        """A validated job from a request's JSON object (ApiError otherwise).
        `queue` None: the push named no queue in its path, the object may
        (`queue`), and without it the job's registered queue applies.
        `traceparent`: the request's (checked), for a job naming none."""
        if not isinstance(obj, dict):
            raise invalid(f"{where}a job must be a JSON object")
        if value_depth(obj) > MAX_JSON_DEPTH:  # RPC arguments are not parsed by api.py
            raise too_deep(f"{where}the job")
        unknown = sorted(set(obj) - (JOB_FIELDS if queue is not None else JOB_FIELDS_WITH_QUEUE))
        if unknown:
            raise invalid(f"{where}unknown field(s): {', '.join(unknown)}")
        if queue is None and "queue" in obj:
            queue = obj["queue"]
            if not is_name(queue):
                raise invalid(f"{where}{name_refusal('queue', queue)}")
        name = obj.get("name")
        if not is_name(name):
            raise invalid(f"{where}{name_refusal('name', name)}")
        if name not in self.registry:
            raise invalid(f"{where}no job is registered under the name {name!r}")
        max_attempts = _int(obj, "max_attempts", 1, MAX_ATTEMPTS, where)
        priority = _int(obj, "priority", *PRIORITY_RANGE, where)
        partition = obj.get("partition")
        if partition is not None and (
            not isinstance(partition, str) or not 1 <= len(partition) <= MAX_PARTITION
        ):
            raise invalid(f"{where}partition must be a string of 1 to {MAX_PARTITION} characters")
        try:
            # Every field of the job is checked by the job model (JobSpec.new,
            # QueuedJob.new and validate: delay_s, unique_key, group, debounce_s,
            # after, ignore_failed): this checks only the JSON's shape.
            job = spec_for(self.registry, name).new(
                obj.get("payload"),
                queue=queue,
                delay_s=obj.get("delay_s", 0),
                max_attempts=max_attempts,
                priority=priority,
                unique_key=obj.get("unique_key"),
                group=obj.get("group"),
                debounce_s=obj.get("debounce_s"),
                after=obj.get("after"),
                ignore_failed=obj.get("ignore_failed", False),
                traceparent=obj.get("traceparent", traceparent),
                at_ms=self.queue.clock(),
            )
            size = len(job.payload_json().encode())
        except ValueError as exc:
            raise invalid(f"{where}{exc}") from None
        # The job's shard, fixed in its id before anything is sent.
        shard = self.shards.place_new(job, partition)
        elsewhere = [i for i in job.after or () if shard_of_id(i) != shard]
        if elsewhere:
            raise ApiError(
                422,
                "unknown_dependency",
                f"{where}after names {', '.join(elsewhere)}, not on this job's shard "
                f"({shard}): {SAME_SHARD}",
            )
        if size > MAX_PAYLOAD_BYTES:
            raise ApiError(
                413,
                "payload_too_large",
                f"{where}payload is {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}",
            )
        return job

    def keeps_history(self, queue: str) -> bool:
        """Whether `queue` keeps its completed jobs (outcomes.history_kept)."""
        return history_kept(self.queue.keep_completed, self.queue.registry, queue)

    async def _pushed(self, queue: str, shard: int) -> None:
        """After a push's write succeeded: what it sets going (AfterPush)."""
        if self.after_push is not None:
            await self.after_push.pushed(queue, shard)
        if self.on_push is not None:
            result = self.on_push(queue, shard)
            if result is not None:
                await result

    def _notes(self, queue: str, paused_queues: set[str]) -> dict[str, Any]:
        """What a push's answer says about its queue: a 201 alone does not
        mean the job will run. `paused`: the queue is paused, its jobs wait
        for a resume; `runs_here`: this Worker's D1QUEUE_QUEUES names it, so
        a drain of this Worker runs the job (when False, none here does;
        `drained` is its older name, kept in answers); `warnings`: either, in
        words."""
        paused = queue in paused_queues
        runs_here = self.config.drains(queue)
        warnings = []
        if paused:
            warnings.append(
                f"queue {queue!r} is paused: its jobs wait until it is resumed "
                f"(POST /v1/queues/{queue}/resume)"
            )
        if not runs_here:
            warnings.append(
                f"queue {queue!r} is not drained by this Worker: D1QUEUE_QUEUES is "
                f'{",".join(self.config.queues)!r}; add the queue, or end the list with "*"'
            )
        return {
            "paused": paused,
            "runs_here": runs_here,
            "drained": runs_here,
            "warnings": warnings,
        }

    async def dispatch(
        self, queue: str, obj: Any, traceparent: str | None = None
    ) -> dict[str, Any]:
        """Push one job to `queue` (the path's queue overrides the registered
        one). `traceparent` (every push's): the request's W3C trace context,
        which a job naming none of its own (`traceparent`) joins."""
        trace = check_trace(traceparent)
        return await self._dispatch(self.parse_job(check_queue(queue), obj, "", trace))

    async def dispatch_job(self, obj: Any, traceparent: str | None = None) -> dict[str, Any]:
        """Push one job by name alone: to the object's `queue` if it has one,
        else to the job's registered queue."""
        trace = check_trace(traceparent)
        return await self._dispatch(self.parse_job(None, obj, "", trace))

    async def _dispatch(self, job: QueuedJob) -> dict[str, Any]:
        shard = shard_of_id(job.id)
        try:
            job_id, paused = await push_noting_paused(self.shards.queue(shard), job)
        except REFUSED_AFTER as exc:
            raise refused_after(exc) from None
        await self._pushed(job.queue, shard)
        sent([job], job_id)
        out = {
            "id": job_id,
            "queue": job.queue,
            "deduplicated": job_id != job.id,
            **self._notes(job.queue, paused),
        }
        if job.debounce_s:
            # The job holding the key took this push's payload and start.
            out["debounced"] = job.debounced
        return out

    async def dispatch_batch(
        self, queue: str, jobs: Any, traceparent: str | None = None
    ) -> dict[str, Any]:
        check_queue(queue)
        trace = check_trace(traceparent)
        if not isinstance(jobs, list) or not 1 <= len(jobs) <= MAX_BATCH:
            raise invalid(f"jobs must be an array of 1 to {MAX_BATCH} jobs")
        parsed = [self.parse_job(queue, j, f"jobs[{i}]: ", trace) for i, j in enumerate(jobs)]
        shard = _one_shard(parsed)
        try:
            results, paused = await push_many_noting_paused(self.shards.queue(shard), parsed)
        except REFUSED_AFTER as exc:
            raise refused_after(exc) from None
        await self._pushed(queue, shard)
        sent(parsed)
        out: dict[str, Any] = {
            "ids": [i for i, _ in results],
            "deduplicated": [d for _, d in results],
            **self._notes(queue, paused),
        }
        if any(j.debounce_s for j in parsed):
            out["debounced"] = [j.debounced for j in parsed]
        return out

    # -- workflow batches ---------------------------------------------------------

    def _batch_jobs(self, jobs: Any, traceparent: str | None = None) -> list[QueuedJob]:
        """A batch's (or an addition's) jobs, each of POST /v1/jobs' shape."""
        if not isinstance(jobs, list) or not BATCH_JOBS[0] <= len(jobs) <= BATCH_JOBS[1]:
            raise invalid(BATCH_JOBS_RULE)
        return [self.parse_job(None, j, f"jobs[{i}]: ", traceparent) for i, j in enumerate(jobs)]

    def _callback(self, kind: str, obj: Any, traceparent: str | None = None) -> QueuedJob | None:
        """A batch's callback job (None: none): a job, with only the fields a
        callback keeps (CALLBACK_FIELDS)."""
        if obj is None:
            return None
        job = self.parse_job(None, obj, f"{kind}: ", traceparent)
        dropped = sorted(set(obj) - CALLBACK_FIELDS)
        if dropped:
            raise invalid(
                f"{kind}: a callback job takes {', '.join(sorted(CALLBACK_FIELDS))}; "
                f"not {', '.join(dropped)}"
            )
        return job

    async def batch(self, obj: Any, traceparent: str | None = None) -> dict[str, Any]:
        """Push a workflow batch: {jobs, on_success?, on_failure?,
        on_finish?}, every job and callback checked before anything is
        written, all of them in one transaction on one shard. A callback
        naming no traceparent joins the request's, else its first job's."""
        trace = check_trace(traceparent)
        if not isinstance(obj, dict):
            raise invalid("a batch must be a JSON object")
        if value_depth(obj) > MAX_JSON_DEPTH:  # RPC arguments are not parsed by api.py
            raise too_deep("the batch")
        unknown = sorted(set(obj) - BATCH_FIELDS)
        if unknown:
            raise invalid(
                f"unknown field(s): {', '.join(unknown)} (a batch is jobs, {', '.join(CALLBACKS)})"
            )
        parsed = self._batch_jobs(obj.get("jobs"), trace)
        trace = trace or next((j.traceparent for j in parsed if j.traceparent), None)
        callbacks = {kind: self._callback(kind, obj.get(kind), trace) for kind in CALLBACKS}
        shard = _one_shard(parsed)
        try:
            batch_id, ids = await self.shards.queue(shard).batch(
                parsed,
                on_success=callbacks["on_success"],
                on_failure=callbacks["on_failure"],
                on_finish=callbacks["on_finish"],
            )
        except REFUSED_AFTER as exc:
            raise refused_after(exc) from None
        except EmptyBatch as exc:
            raise ApiError(409, "conflict", str(exc)) from None
        for queue in dict.fromkeys(j.queue for j in parsed):
            await self._pushed(queue, shard)
        sent(parsed)
        return {"batch": batch_id, "ids": ids}

    async def batch_state(self, id: str) -> dict[str, Any]:
        """A batch's progress and its jobs' ids, from the shard its id names."""
        id = check_id(id)
        queue = self.shards.for_id(id)
        state = None if queue is None else await Workflows(queue.binding, queue.clock).batch(id)
        if state is None:
            raise ApiError(404, "not_found", f"no batch {id!r} (never made, or pruned)")
        return state.as_dict(ids=True)

    async def add_to_batch(
        self, id: str, jobs: Any, traceparent: str | None = None
    ) -> dict[str, Any]:
        """Add jobs to a running batch (409 batch_not_running, nothing written,
        for one that finished or does not exist)."""
        id = check_id(id)
        parsed = self._batch_jobs(jobs, check_trace(traceparent))
        shard = _one_shard(parsed)
        queue = self.shards.for_id(id)
        if queue is None:
            raise batch_not_running(id)
        if shard != queue.shard:
            raise invalid(
                f"the jobs route to shard {shard} and batch {id!r} is on shard {queue.shard}: "
                "a batch's jobs are on its own D1 database (give them a partition or queue "
                "of that shard)"
            )
        try:
            ids = await queue.add_to_batch(id, parsed)
        except BatchNotRunning:
            raise batch_not_running(id) from None
        except REFUSED_AFTER as exc:
            raise refused_after(exc) from None
        for name in dict.fromkeys(j.queue for j in parsed):
            await self._pushed(name, shard)
        sent(parsed)
        return {"ids": ids}

    # -- queues -----------------------------------------------------------------

    async def queues(self) -> dict[str, Any]:
        return {"queues": [_stats(s) for s in await self.admin.stats()]}

    async def queue_stats(self, queue: str) -> dict[str, Any]:
        (stats,) = await self.admin.stats(check_stored_queue(queue))
        return _stats(stats)

    # -- metrics (store/metrics.py) ------------------------------------------------

    async def _metrics_window(
        self, window: str, queue: str | None, name: str | None
    ) -> store_metrics.Window:
        """One window's figures over every shard, merged."""
        if window not in WINDOWS:
            raise ApiError(
                400, "invalid_window", f"window must be one of {', '.join(WINDOWS)}, not {window!r}"
            )
        q = "" if queue is None else check_stored_queue(queue)
        if name is not None and not is_stored_name(name):
            raise ApiError(400, "invalid_name", name_refusal("name", name, STORED_NAME_RULE))
        n = name or ""
        now = self.queue.clock()
        shards = await self.shards.each(lambda s: store_metrics.read(s.binding, now, window, q, n))
        merged = shards[0]
        for other in shards[1:]:
            for mine, theirs in (
                (merged.totals, other.totals),
                (merged.figures, other.figures),
            ):
                for key, f in theirs.items():
                    _merge(mine.setdefault(key, Figures()), f)
            for key, points in other.series.items():
                into = merged.series.setdefault(key, {})
                for at, f in points.items():
                    _merge(into.setdefault(at, Figures()), f)
        return merged

    async def metrics_window(
        self, window: str = "1h", queue: str | None = None, name: str | None = None
    ) -> store_metrics.Window:
        """What `metrics` answers, as the store's figures (with their
        histograms) merged over the shards: the dashboard's charts. One
        round trip a shard (store/metrics.py read)."""
        return await self._metrics_window(window, queue, name)

    async def metrics(
        self, window: str = "1h", queue: str | None = None, name: str | None = None
    ) -> dict[str, Any]:
        """Per queue and job name: the window's counts by outcome, wait and
        run (count, sum, p50/p95/p99 from the histogram buckets), the
        all-time totals, and the window's series for charts (one point a
        minute for 1h, an hour for 24h and 7d; steps with no job left out)."""
        w = await self._metrics_window(window, queue, name)
        out = []
        for key in sorted(set(w.totals) | set(w.figures)):
            f = w.figures.get(key, Figures())
            total = w.totals.get(key, Figures())
            points = w.series.get(key, {})
            out.append(
                {
                    "queue": key[0],
                    "name": key[1],
                    "counts": dict(zip(OUTCOMES, f.counts, strict=True)),
                    "wait": f.wait.summary(),
                    "run": f.run.summary(),
                    "total": dict(zip(OUTCOMES, total.counts, strict=True)),
                    "series": [_point(at, points[at]) for at in sorted(points)],
                }
            )
        return {
            "window": window,
            "step_s": w.step_ms // 1000,
            "from": w.start_ms,
            "to": w.end_ms,
            "metrics": out,
        }

    async def metrics_text(self, *, openmetrics: bool = False) -> str:
        """The all-time totals and the jobs per queue by state now, in the
        Prometheus text exposition format (core/metrics.py prometheus)."""
        w = await self._metrics_window("1h", None, None)
        states = {
            s.queue: {
                "ready": s.ready,
                "delayed": s.delayed,
                "reserved": s.reserved,
                "waiting": s.waiting,
                "failed": s.failed,
            }
            for s in await self.admin.stats()
        }
        return prometheus(w.totals, states, openmetrics=openmetrics)

    async def set_paused(self, queue: str, paused: bool) -> dict[str, Any]:
        await self.admin.set_paused(check_queue(queue), paused)
        return await self.queue_stats(queue)

    async def clear(self, queue: str) -> dict[str, Any]:
        return {"deleted": await self.admin.clear(check_stored_queue(queue))}

    async def limits(self, queue: str) -> dict[str, Any]:
        """The queue's flow limits and their use now."""
        return (await self.admin.limits(check_stored_queue(queue))).as_dict()

    async def set_limits(self, queue: str, obj: Any) -> dict[str, Any]:
        """Replace the queue's flow limits (null fields: none of that kind):
        the whole body is checked before anything is written."""
        check_queue(queue)
        if value_depth(obj) > MAX_JSON_DEPTH:  # RPC arguments are not parsed by api.py
            raise too_deep("the limits")
        try:
            limits = Limits.parse(obj)
        except LimitsError as exc:
            raise invalid(str(exc)) from None
        await self.admin.set_limits(queue, limits)
        return await self.limits(queue)

    # -- jobs -------------------------------------------------------------------

    async def job(self, id: str) -> dict[str, Any]:
        """A job wherever it is in its life (store/workflows.py), from the
        shard its id names, with the ids of the jobs waiting for it."""
        id = check_id(id)
        queue = self.shards.for_id(id)
        found: JobView | FailedJob | None = None
        dependents: list[str] = []
        if queue is not None:
            views = Workflows(queue.binding, queue.clock)
            found, dependents = await views.job_and_dependents(id, DEPENDENTS_SHOWN)
        if found is None:
            raise ApiError(
                404,
                "not_found",
                f"job {id!r} never existed, or is no longer kept (cancelled, or completed "
                "and its history pruned or not kept)",
            )
        out = _failed(found) if isinstance(found, FailedJob) else _view(found)
        return {**out, "dependents": dependents}

    async def cancel(self, id: str) -> dict[str, Any]:
        """Cancel job `id`: a job no worker holds is deleted (`cancelled`:
        true); a running one is marked, and the drain holding it ends it
        cancelled (`state`: "cancelling", answered 202 over HTTP). A job
        that already ended is left as it is: 409 `ended` with its `state`;
        an id no job has, 404."""
        id = check_id(id)
        outcome = await self.admin.cancel(id)
        if outcome == "cancelling":
            return {"id": id, "cancelled": False, "state": "cancelling"}
        if outcome == "missing":
            queue = self.shards.for_id(id)
            found = None
            if queue is not None:
                found = await Workflows(queue.binding, queue.clock).job(id)
            if found is not None:
                state = _failed(found)["state"] if isinstance(found, FailedJob) else found.state
                raise ApiError(
                    409,
                    "ended",
                    f"job {id!r} already ended ({state}): a cancel changes nothing",
                    state=state,
                )
            raise ApiError(
                404,
                "not_found",
                f"job {id!r} never existed, or is no longer kept (cancelled, or completed "
                "and its history pruned or not kept)",
            )
        return {"id": id, "cancelled": True}

    # -- failed jobs --------------------------------------------------------------

    async def failed(
        self, queue: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        if queue is not None:
            check_stored_queue(queue)
        _page_limit(limit)
        try:
            jobs, next_cursor = await self.admin.failed_page(queue, limit, cursor)
        except ValueError as exc:
            raise ApiError(400, "invalid_cursor", str(exc)) from None
        return {"jobs": [_failed(j) for j in jobs], "next_cursor": next_cursor}

    # -- completed jobs -----------------------------------------------------------

    async def completed(
        self, queue: str, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        """A page of `queue`'s completed jobs kept, newest first, with their
        results: each shard's page after the same cursor, merged (a position
        `<completed_at>:<id>` in the list, not a shard's)."""
        check_stored_queue(queue)
        _page_limit(limit)
        if cursor is not None and (
            not isinstance(cursor, str) or not COMPLETED_CURSOR.fullmatch(cursor)
        ):
            raise ApiError(
                400,
                "invalid_cursor",
                f"a cursor is <completed_at>:<id> ({COMPLETED_CURSOR_RULE}), as next_cursor "
                "gives it",
            )
        share = page_bytes(len(self.shards))
        pages = await self.shards.each(
            lambda q: Workflows(q.binding, q.clock).completed(queue, limit, cursor, share)
        )
        views, more = merge_pages(
            [(page, nxt is not None) for page, nxt in pages],
            lambda v: (v.completed_at or 0, v.job.id),
            limit,
            reverse=True,
        )
        last = views[-1] if more and views else None
        return {
            "jobs": [_view(v) for v in views],
            "next_cursor": None if last is None else f"{last.completed_at}:{last.job.id}",
        }

    async def retry_failed(self, id: str) -> dict[str, Any]:
        id = check_id(id)
        if not await self.admin.retry_failed(id):
            raise ApiError(404, "not_found", f"no failed job {id!r}")
        return {"id": id, "retried": True}

    async def delete_failed(self, id: str) -> dict[str, Any]:
        id = check_id(id)
        if not await self.admin.delete_failed(id):
            raise ApiError(404, "not_found", f"no failed job {id!r}")
        return {"deleted": 1}

    async def prune_failed(self, older_than_s: Any) -> dict[str, Any]:
        if (
            isinstance(older_than_s, bool)
            or not isinstance(older_than_s, int | float)
            or not 0 <= older_than_s <= MAX_OLDER_THAN_S
        ):
            raise ApiError(
                400,
                "invalid_older_than_s",
                f"older_than_s must be a number from 0 to {MAX_OLDER_THAN_S}",
            )
        return {"deleted": await self.admin.prune_failed(older_than_s)}

    # -- schedules --------------------------------------------------------------

    def parse_schedule(self, obj: Any) -> ScheduleDef:
        """A validated schedule from a request's JSON object: 422 with code
        invalid_cron, unknown_timezone or unknown_job saying which, `invalid`
        for anything else; 413 for a payload past the limit."""
        if not isinstance(obj, dict):
            raise invalid("a schedule must be a JSON object")
        if value_depth(obj) > MAX_JSON_DEPTH:  # RPC arguments are not parsed by api.py
            raise too_deep("the schedule")
        unknown = sorted(set(obj) - SCHEDULE_FIELDS)
        if unknown:
            raise invalid(f"unknown field(s): {', '.join(unknown)}")
        for key in ("cron", "name"):
            if key not in obj:
                raise invalid(f"{key} is required")
        name = obj["name"]
        if is_name(name) and name not in self.registry:
            raise ApiError(
                422, "unknown_job", f"name: no job is registered under the name {name!r}"
            )
        schedule_id = obj.get("id")
        if schedule_id is None:
            schedule_id = new_id(self.queue.clock())
        if isinstance(schedule_id, str) and schedule_id in {
            d.id for d in self.registry.schedules()
        }:
            raise declared_in_code(schedule_id)
        try:
            return ScheduleDef(
                id=schedule_id,
                cron=obj["cron"],
                name=name,
                payload=obj.get("payload"),
                queue=obj.get("queue"),
                tz=obj.get("tz", DEFAULT_TZ),
                catch_up=obj.get("catch_up", DEFAULT_CATCH_UP),
            )
        except ScheduleError as exc:
            if exc.field == "payload" and "bytes" in str(exc):
                raise ApiError(413, "payload_too_large", f"payload: {exc}") from None
            code = SCHEDULE_ERROR_CODES.get(exc.field, "invalid")
            raise ApiError(422, code, f"{exc.field}: {exc}") from None

    async def put_schedule(self, obj: Any) -> tuple[bool, dict[str, Any]]:
        """Create or replace a schedule: (created, the schedule)."""
        definition = self.parse_schedule(obj)
        created, row = await self.schedule_store.put(definition)
        if row is None:  # deleted between the write and the read: say so
            raise ApiError(409, "conflict", f"schedule {definition.id!r} changed meanwhile")
        if row.source == "code":
            raise declared_in_code(row.id)
        return created, {**row.as_dict(self.registry), "created": created}

    async def schedules(self, limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
        _page_limit(limit)
        if cursor is not None and not is_stored_name(cursor):
            raise ApiError(400, "invalid_cursor", f"cursor is a schedule id ({STORED_NAME_RULE})")
        rows, next_cursor = await self.schedule_store.page(limit, cursor)
        return {
            "schedules": [r.as_dict(self.registry) for r in rows],
            "next_cursor": next_cursor,
        }

    async def schedule(self, id: str) -> dict[str, Any]:
        id = check_id(id)
        row = await self.schedule_store.get(id)
        if row is None:
            raise ApiError(404, "not_found", f"no schedule {id!r}")
        return row.as_dict(self.registry)

    async def edit_schedule(self, id: str, cron: Any, tz: Any, payload: Any) -> dict[str, Any]:
        """Change an API schedule's cron, time zone and payload, keeping its
        job, queue and catch-up (the dashboard's "Edit"): checked by
        parse_schedule's rules, as POST /v1/schedules checks them, before
        anything is written (422 saying which field); a code-declared
        schedule is a 409 (its code says what it is). Safe to re-send: the
        same definition writes nothing the second time."""
        id = check_id(id)
        row = await self.schedule_store.get(id)
        if row is None:
            raise ApiError(404, "not_found", f"no schedule {id!r}")
        fields: dict[str, Any] = {
            "id": id,
            "cron": cron,
            "tz": tz,
            "name": row.name,
            "payload": payload,
            "catch_up": row.catch_up,
        }
        if row.queue:
            fields["queue"] = row.queue
        _, out = await self.put_schedule(fields)
        return out

    async def run_schedule_now(self, id: str, nonce: str) -> dict[str, Any]:
        """Push schedule `id`'s job once now (the dashboard's "Run now"),
        with job id `nonce` (a job.new_id the page made: a click sent twice
        sends the same) marked as the schedule's shard's: sending it again
        pushes nothing (ShardedSchedules.run_now). {id (the job's), queue,
        pushed (False: this job id was pushed before)}."""
        id = check_id(id)
        found = await self.schedule_store.located(id)
        if found is None:
            raise ApiError(404, "not_found", f"no schedule {id!r}")
        shard, row = found
        job_id, pushed, queue = await self.schedule_store.run_now(shard, row, nonce)
        if pushed:
            await self._pushed(queue, shard)
        return {"id": job_id, "queue": queue, "pushed": pushed}

    async def schedule_runs(self, ids: list[str]) -> dict[str, list[list[Any]]]:
        """The last runs of each of `ids`, newest first: [time, job id] or
        [time, job id, "now"] (pushed by "Run now")."""
        return await self.schedule_store.runs(ids)

    async def delete_schedule(self, id: str) -> dict[str, Any]:
        id = check_id(id)
        outcome = await self.schedule_store.delete(id)
        if outcome == "code":
            raise declared_in_code(id)
        if outcome == "missing":
            raise ApiError(404, "not_found", f"no schedule {id!r}")
        return {"id": id, "deleted": True}

    async def pause_schedule(self, id: str) -> dict[str, Any]:
        return await self._set_paused(id, True)

    async def resume_schedule(self, id: str) -> dict[str, Any]:
        return await self._set_paused(id, False)

    async def _set_paused(self, id: str, paused: bool) -> dict[str, Any]:
        id = check_id(id)
        row = await self.schedule_store.set_paused(id, paused)
        if row is None:
            raise ApiError(404, "not_found", f"no schedule {id!r}")
        return row.as_dict(self.registry)


def check_trace(traceparent: str | None) -> str | None:
    """A request's traceparent (the HTTP header's), checked: 422 invalid,
    before anything is written, for one that is not a W3C trace context."""
    try:
        return check_traceparent(traceparent, "the traceparent header")
    except ValueError as exc:
        raise invalid(str(exc)) from None


def sent(jobs: list[QueuedJob], id: str | None = None) -> None:
    """Log a push that was written (`d1queue.push`, operation "send"): its
    queue, its job's id (`id`, one job) or its count, and its trace."""
    queues = {j.queue for j in jobs}
    first = jobs[0]
    queue = first.queue if len(queues) == 1 else None
    fields = messaging("send", queue, id, None if id is not None else len(jobs))
    if id is not None:
        fields["name"] = first.name
    fields.update(trace_fields(first.traceparent))
    event(log, "d1queue.push", **fields)


def _one_shard(jobs: list[QueuedJob]) -> int:
    """The one shard a batch's jobs route to (422 if they route to several):
    a batch is one transaction on one D1 database."""
    shards = [shard_of_id(j.id) for j in jobs]
    for i, shard in enumerate(shards):
        if shard != shards[0]:
            raise invalid(
                f"jobs[{i}]: routes to shard {shard} and jobs[0] to shard {shards[0]} "
                "(their queues or partition keys differ): a batch is one transaction on one "
                "D1 database, so push them in separate batches"
            )
    return shards[0]


def declared_in_code(id: str) -> ApiError:
    return ApiError(
        409,
        "declared_in_code",
        f"schedule {id!r} is declared in the Worker's code: change or remove it there "
        "(pause and resume work on it)",
    )
