"""The OpenAPI 3.1 document of the HTTP API (served at GET /v1/openapi.json).

Kept as Python so the Worker serves it with no file to bundle and the limits
in it are the ones the code enforces (from bounds.py). Its paths are made from
api.ROUTES: an operation is documented for each route and for nothing else,
and each operation's query parameters are its route's own (`QueryParam`).
"""

from __future__ import annotations

import copy
from typing import Any

from ..core.bounds import (
    BATCH_JOBS,
    GROUP_RULE,
    ID_RULE,
    LIMIT_RANGE,
    MAX_AFTER,
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_DELAY_S,
    MAX_DEPENDENTS,
    MAX_JSON_DEPTH,
    MAX_LOG_BYTES,
    MAX_LOG_LINE_CHARS,
    MAX_LOG_LINES,
    MAX_PAGE_BYTES,
    MAX_PARTITION,
    MAX_PAYLOAD_BYTES,
    MAX_PROGRESS_NOTE,
    MAX_RUN_ERROR_CHARS,
    MAX_RUNS,
    MAX_UNIQUE_KEY,
    NAME_RULE,
    PERIOD_RANGE,
    PRIORITY_RANGE,
    TRACEPARENT_RULE,
    TRACEPARENT_ZEROS,
)
from ..core.flow import LIMIT_FIELDS
from ..core.job import DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, DEFAULT_QUEUE
from ..core.metrics import BUCKETS_S, OUTCOMES, WINDOWS
from ..core.runs import PROGRESS_INTERVAL_S
from ..core.schedule import (
    CATCH_UP_POLICIES,
    DEFAULT_CATCH_UP,
    DEFAULT_TZ,
    MAX_CATCH_UP,
    MAX_CRON,
    TZ_RULE,
)
from .api import INDEX, MAX_BODY_BYTES, ROUTES, TRACE_HEADER, TRACED
from .router import Route
from .service import (
    BATCH_JOBS_RULE,
    CALLBACK_FIELDS,
    CALLBACKS,
    DEPENDENTS_SHOWN,
    EDGES_RULE,
    SAME_SHARD,
)

NAME_SCHEMA = {"type": "string", "pattern": f"^{NAME_RULE}$"}


PAGE_RULE = (
    f"A page holds at most `limit` rows and at most {MAX_PAGE_BYTES} bytes of their stored "
    "payloads, results and errors (a single row past that is a page of its own), whichever "
    "comes first; the rest follows from `next_cursor`. A page of fewer than `limit` rows is "
    "not the last: follow next_cursor until it is null."
)
"""The rule of every listing's page (bounds.MAX_PAGE_BYTES), as the
document states it."""


def _page(items: str, key: str) -> dict[str, Any]:
    """A listing's page: `key` an array of `items`, and the next cursor."""
    return {
        "type": "object",
        "required": [key, "next_cursor"],
        "description": PAGE_RULE,
        "properties": {
            key: {"type": "array", "items": _ref(items)},
            "next_cursor": {
                "type": ["string", "null"],
                "description": "where the next page starts (the `cursor` to send); null: "
                "this is the last page",
            },
        },
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _returns(schema: str, description: str, status: int = 200) -> dict[str, Any]:
    """A success answer: JSON of components.schemas' `schema`."""
    return {str(status): _json(_ref(schema), description)}


def _op(
    summary: str, ok: dict[str, Any], *codes: int, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An operation answering `ok`, 401 and 503 (auth), and `codes`; with
    `body`, taking a JSON request body of that schema."""
    errors = {str(c): {"$ref": f"#/components/responses/E{c}"} for c in (401, 503, *codes)}
    op: dict[str, Any] = {"summary": summary, "responses": ok | errors}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def _done(what: str) -> dict[str, Any]:
    """An action's answer: the id it acted on, and `what`: true."""
    return {
        "type": "object",
        "required": ["id", what],
        "properties": {"id": {"type": "string"}, what: {"const": True}},
    }


QUEUE_PARAM = {"name": "queue", "in": "path", "required": True, "schema": NAME_SCHEMA}
ID_PARAM = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{ID_RULE}$"},
    "description": "a job id (or a batch id) is `[s<shard>-]<32 hex digits>`: the shard "
    "that holds it (none: shard 0); a schedule id is the one it was given",
}
JOB_ID = {"type": "string", "pattern": f"^{ID_RULE}$"}

TRACEPARENT_SCHEMA = {
    "type": ["string", "null"],
    "pattern": f"^{TRACEPARENT_RULE}$",
    "description": "the producer's W3C trace context (00-<trace id>-<parent id>-<flags>, "
    f"lowercase hex; {TRACEPARENT_ZEROS}): the job, the jobs its runs push, its retries "
    "and a batch's callbacks keep it, and each run's d1queue.process log line carries its "
    "trace_id and parent_span_id. Without it, the request's traceparent header applies",
}
JOB_IN: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    # debounce_s names what it debounces by the job's unique_key.
    "if": {"required": ["debounce_s"], "properties": {"debounce_s": {"type": "number"}}},
    "then": {"required": ["unique_key"], "properties": {"unique_key": {"type": "string"}}},
    # A job that waits for others is not debounced (it would move a waiting job).
    "not": {
        "required": ["after", "debounce_s"],
        "properties": {"after": {"type": "array"}, "debounce_s": {"type": "number"}},
    },
    "properties": {
        "name": NAME_SCHEMA | {"description": "a registered job name"},
        "payload": {
            "description": f"any JSON value, at most {MAX_PAYLOAD_BYTES} bytes and "
            f"{MAX_JSON_DEPTH} levels deep (a request nested deeper is refused: 422 too_deep)"
        },
        "delay_s": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_S},
        "max_attempts": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_ATTEMPTS,
            "description": "attempts before the job is failed; without it, the job's "
            f"registered max_attempts ({DEFAULT_MAX_ATTEMPTS} if it declares none)",
        },
        "priority": {
            "type": "integer",
            "minimum": PRIORITY_RANGE[0],
            "maximum": PRIORITY_RANGE[1],
            "description": "higher runs first; without it, the job's registered priority "
            f"({DEFAULT_PRIORITY} if it declares none)",
        },
        "unique_key": {
            "type": ["string", "null"],
            "minLength": 1,
            "maxLength": MAX_UNIQUE_KEY,
            "description": "a queued job holding the same key (on the same shard: "
            "with shards, keys are unique per D1 database) makes this push store nothing",
        },
        "group": {
            "type": ["string", "null"],
            "pattern": f"^{GROUP_RULE}$",
            "description": "the key of the queue's per-group limits and fair turns (a "
            "tenant, an account, an upstream host); without it, the job's registration "
            "may derive one from the payload. Jobs with no group are one group of their own",
        },
        "debounce_s": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_DELAY_S,
            "description": "with unique_key: the queued job holding the key takes this "
            "payload and starts debounce_s from now (200, debounced: true); with no such "
            "job, or once it started, a new job starts debounce_s from now (201)",
        },
        "partition": {
            "type": ["string", "null"],
            "minLength": 1,
            "maxLength": MAX_PARTITION,
            "description": "with several shards (D1QUEUE_SHARDS), the key whose hash picks "
            "the job's shard instead of its queue's name; a queue pinned in "
            "D1QUEUE_SHARD_MAP ignores it. Not stored: the job's id names its shard",
        },
        "after": {
            "type": ["array", "null"],
            "items": JOB_ID,
            "minItems": 1,
            "maxItems": MAX_AFTER,
            "uniqueItems": True,
            "description": "ids of jobs this one waits for: it is `waiting` until each of "
            "them completed, then ready. One that fails for good or is cancelled fails this "
            "job (`dependency <id> failed`) unless ignore_failed. Each must be queued, "
            "running, failed or kept as completed (else 422 unknown_dependency, nothing "
            f"written); {SAME_SHARD}. A job may be waited for by at most {MAX_DEPENDENTS} jobs "
            "(else 422 too_many_dependents naming it, nothing written). Not with debounce_s",
        },
        "ignore_failed": {
            "type": "boolean",
            "default": False,
            "description": "with after: run even if a job it waits for fails or is cancelled",
        },
        "traceparent": TRACEPARENT_SCHEMA,
    },
}
STATS = {
    "type": "object",
    "required": ["queue", "ready", "delayed", "reserved", "failed", "paused"],
    "properties": {
        "queue": {"type": "string"},
        "ready": {"type": "integer"},
        "delayed": {"type": "integer"},
        "waiting": {"type": "integer", "description": "Jobs waiting for others (`after`)."},
        "reserved": {"type": "integer"},
        "failed": {"type": "integer"},
        "oldest_ready_age_s": {"type": ["number", "null"]},
        "paused": {"type": "boolean"},
        "limits": {
            "oneOf": [{"$ref": "#/components/schemas/Limits"}, {"type": "null"}],
            "description": "its flow limits (null: none); `reserved` is their use",
        },
    },
}
_COUNT = {"type": "integer", "minimum": LIMIT_RANGE[0], "maximum": LIMIT_RANGE[1]}
_RATE = {
    "type": ["object", "null"],
    "required": ["limit", "period_s"],
    "additionalProperties": False,
    "properties": {
        "limit": _COUNT,
        "period_s": {"type": "integer", "minimum": PERIOD_RANGE[0], "maximum": PERIOD_RANGE[1]},
    },
}
LIMITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "concurrency": _COUNT
        | {"type": ["integer", "null"], "description": "at most N of the queue's jobs running"},
        "group_concurrency": _COUNT
        | {"type": ["integer", "null"], "description": "at most N running per group"},
        "rate": _RATE
        | {"description": "at most `limit` starts in any window of `period_s` seconds"},
        "group_rate": _RATE | {"description": "the same, per group"},
    },
    "description": "a queue's flow limits, across every invocation; a field absent or "
    "null is no limit of that kind (docs/flow-control.md)",
}
LIMITS_STATE = {
    "type": "object",
    "required": ["queue", "limits", "source", "running", "running_by_group"],
    "properties": {
        "queue": {"type": "string"},
        "limits": LIMITS | {"required": list(LIMIT_FIELDS)},
        "source": {
            "enum": ["api", "code", "none"],
            "description": "set over the API, declared in code, or none",
        },
        "running": {"type": "integer", "description": "the queue's jobs held now"},
        "running_by_group": {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "description": "the busiest groups' jobs held now ('' for no group)",
        },
    },
}
PROGRESS = {
    "type": "object",
    "required": ["value", "at"],
    "properties": {
        "attempt": {"type": "integer", "description": "the attempt that reported it"},
        "value": {
            "type": "number",
            "minimum": 0,
            "description": "a fraction (0 to 1) or a count, as the handler reported it",
        },
        "note": {"type": "string", "maxLength": MAX_PROGRESS_NOTE},
        "at": {"type": "integer", "description": "when it was reported, epoch ms"},
    },
}
LOG_LINE = {
    "type": "object",
    "required": ["at", "level", "message"],
    "properties": {
        "at": {"type": "integer", "description": "epoch ms"},
        "level": {"type": "string", "description": "debug, info, warning, error, critical"},
        "message": {"type": "string", "maxLength": MAX_LOG_LINE_CHARS},
    },
}
RUN = {
    "type": "object",
    "required": ["attempt", "started_at", "duration_ms", "outcome"],
    "properties": {
        "attempt": {"type": "integer", "description": "its number, from 1"},
        "started_at": {"type": "integer", "description": "epoch ms"},
        "duration_ms": {"type": "integer", "description": "its handler's run"},
        "outcome": {"type": "string", "description": "completed, retried or failed"},
        "error": {
            "type": "string",
            "maxLength": MAX_RUN_ERROR_CHARS,
            "description": "why it did not complete, with the traceback's last frames",
        },
        "progress": PROGRESS,
        "logs": {
            "type": "array",
            "items": LOG_LINE,
            "maxItems": MAX_LOG_LINES,
            "description": f"what it logged through ctx.log: at most {MAX_LOG_LINES} lines "
            f"and {MAX_LOG_BYTES} bytes",
        },
        "logs_truncated": {"type": "integer", "description": "lines past that, not kept"},
    },
}
JOB_OUT = {
    "type": "object",
    "required": ["id", "queue", "name", "state", "attempts", "max_attempts"],
    "properties": {
        "id": {"type": "string"},
        "queue": {"type": "string"},
        "name": {"type": "string"},
        "state": {
            "enum": [
                "waiting",
                "ready",
                "delayed",
                "reserved",
                "cancelling",
                "completed",
                "failed",
                "cancelled",
            ],
            "description": "waiting: for the jobs in `after`; cancelling: a cancel marked it "
            "while a worker held it, and it will not run again; completed: ran, and kept with "
            "its result (D1QUEUE_KEEP_COMPLETED_S); cancelled: cancelled while it ran, kept "
            "with the failed jobs",
        },
        "payload": {
            "description": "the JSON value pushed; for a failed job whose stored text is "
            f"not valid JSON (or nests past {MAX_JSON_DEPTH} levels), that text as a string"
        },
        "attempts": {"type": "integer", "description": "claims so far"},
        "max_attempts": {
            "type": "integer",
            "description": "claims allowed before the job fails; a retried failed job's is "
            "its attempts so far plus its registration's max_attempts",
        },
        "priority": {"type": "integer"},
        "available_at": {"type": "integer", "description": "epoch ms"},
        "created_at": {"type": "integer", "description": "epoch ms"},
        "reserved_until": {"type": ["integer", "null"]},
        "unique_key": {"type": ["string", "null"]},
        "group": {"type": ["string", "null"]},
        "last_error": {"type": ["string", "null"]},
        "error": {"type": "string", "description": "failed jobs: why"},
        "failed_at": {"type": "integer"},
        "after": {
            "type": ["array", "null"],
            "items": {"type": "string"},
            "description": "the ids it waits (or waited) for; null: none",
        },
        "ignore_failed": {
            "type": ["boolean", "null"],
            "description": "it runs even if one of `after` fails; null for a failed job "
            "(not kept once it failed)",
        },
        "batch": {"type": ["string", "null"], "description": "the batch it is a job of"},
        "result": {
            "description": "completed: what its handler returned (JSON; null otherwise)",
        },
        "completed_at": {
            "type": ["integer", "null"],
            "description": "completed: when, epoch ms (null otherwise)",
        },
        "started_at": {
            "type": ["integer", "null"],
            "description": "reserved: when its running attempt was claimed, epoch ms "
            "(null otherwise)",
        },
        "progress": {
            "oneOf": [PROGRESS, {"type": "null"}],
            "description": "its latest progress report (ctx.progress): written while it "
            f"runs at most once per {PROGRESS_INTERVAL_S:g} s, and the attempt's last with its "
            "settle; null: its handler reported none",
        },
        "logs": {
            "type": ["array", "null"],
            "items": LOG_LINE,
            "maxItems": MAX_LOG_LINES,
            "description": "reserved: what its running attempt logged through ctx.log, as "
            "written with its last progress report (null when not running)",
        },
        "logs_truncated": {
            "type": "integer",
            "description": "reserved: lines its running attempt logged past the bound, not kept",
        },
        "runs": {
            "type": "array",
            "items": RUN,
            "maxItems": MAX_RUNS,
            "description": f"its attempt history, oldest first: the latest {MAX_RUNS} "
            "attempts, each added by the settle that ended it (a running attempt is "
            "not there yet; an attempt whose worker died before settling is not there)",
        },
        "dependents": {
            "type": "array",
            "items": {"type": "string"},
            "maxItems": DEPENDENTS_SHOWN,
            "description": "GET /v1/jobs/{id}: ids of the jobs waiting (or that waited) for "
            f"it, at most {DEPENDENTS_SHOWN}",
        },
    },
}
CALLBACK_JOB: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {},  # JOB_BY_NAME's, below
    "description": "a batch's callback: a job by name, with the fields a callback keeps "
    f"({', '.join(sorted(CALLBACK_FIELDS))}; any other is 422). Its id is "
    "`<batch>:<on_success|on_failure|on_finish>`; its handler's context carries the batch",
}
BATCH_OF_JOBS = {
    "type": "array",
    "minItems": BATCH_JOBS[0],
    "maxItems": BATCH_JOBS[1],
    "items": _ref("JobByName"),
    "description": f"{BATCH_JOBS_RULE}, each as POST /v1/jobs takes it, all routing to one "
    f"shard; {EDGES_RULE}",
}
BATCH_IN = {
    "type": "object",
    "required": ["jobs"],
    "additionalProperties": False,
    "properties": {
        "jobs": BATCH_OF_JOBS,
        "on_success": {
            "oneOf": [_ref("CallbackJob"), {"type": "null"}],
            "description": "enqueued once, when every job completed",
        },
        "on_failure": {
            "oneOf": [_ref("CallbackJob"), {"type": "null"}],
            "description": "enqueued once, when the first job failed for good (or was cancelled)",
        },
        "on_finish": {
            "oneOf": [_ref("CallbackJob"), {"type": "null"}],
            "description": "enqueued once, when every job completed or failed",
        },
    },
}
BATCH_JOBS_IN = {
    "type": "object",
    "required": ["jobs"],
    "additionalProperties": False,
    "properties": {"jobs": BATCH_OF_JOBS},
}
BATCH_CREATED = {
    "type": "object",
    "required": ["batch", "ids"],
    "properties": {
        "batch": {"type": "string", "description": "the batch's id (GET /v1/batches/{id})"},
        "ids": {
            "type": "array",
            "items": {"type": "string"},
            "description": "its jobs' ids, in order (a job whose unique_key a queued job "
            "held: that job's id, and it is not a job of the batch)",
        },
    },
}
BATCH_STATE = {
    "type": "object",
    "required": ["id", "total", "pending", "completed", "failed", "state", "created_at"],
    "properties": {
        "id": {"type": "string"},
        "total": {"type": "integer", "description": "its jobs"},
        "pending": {"type": "integer", "description": "not ended yet"},
        "completed": {"type": "integer"},
        "failed": {"type": "integer", "description": "failed for good, or cancelled"},
        "state": {
            "enum": ["running", "succeeded", "failed"],
            "description": "running while a job is pending; then succeeded if none failed, "
            "else failed",
        },
        "created_at": {"type": "integer", "description": "epoch ms"},
        "finished_at": {"type": ["integer", "null"], "description": "when the last job ended"},
        "ids": {"type": "array", "items": {"type": "string"}, "description": "its jobs' ids"},
    },
}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "state": {
                    "type": "string",
                    "description": "409 ended: the state the job ended in (completed, "
                    "failed or cancelled)",
                },
            },
        }
    },
}
JOB_BY_NAME = JOB_IN | {
    "properties": JOB_IN["properties"]
    | {
        "queue": NAME_SCHEMA
        | {
            "description": "the queue to push to; without it, the queue the job is "
            f"registered with ({DEFAULT_QUEUE!r} if it declares none)"
        }
    }
}
CALLBACK_JOB["properties"] = {
    k: v for k, v in JOB_BY_NAME["properties"].items() if k in CALLBACK_FIELDS
}
NOTES = {
    "paused": {
        "type": "boolean",
        "description": "the queue is paused: its jobs wait until it is resumed",
    },
    "runs_here": {
        "type": "boolean",
        "description": "this Worker's D1QUEUE_QUEUES names the queue, so a drain of "
        "this Worker runs the job; false: none of this Worker's drains will",
    },
    "drained": {
        "type": "boolean",
        "deprecated": True,
        "description": "the older name of runs_here, the same value",
    },
    "warnings": {
        "type": "array",
        "items": {"type": "string"},
        "description": "why the job may not run soon, in words (empty: no reason)",
    },
}
PUSHED = {
    "type": "object",
    "required": ["id", "queue", "deduplicated", *NOTES],
    "properties": {
        "id": {"type": "string"},
        "queue": {"type": "string"},
        "deduplicated": {"type": "boolean"},
        "debounced": {
            "type": "boolean",
            "description": "a push with debounce_s: the queued job holding its key took its "
            "payload and start (the id is that job's)",
        },
        **NOTES,
    },
}
PUSHED_BATCH = {
    "type": "object",
    "required": ["ids", "deduplicated", *NOTES],
    "properties": {
        "ids": {"type": "array", "items": {"type": "string"}},
        "deduplicated": {"type": "array", "items": {"type": "boolean"}},
        "debounced": {
            "type": "array",
            "items": {"type": "boolean"},
            "description": "with any debounce_s in the batch: per job, as a single push says",
        },
        **NOTES,
    },
}
OBJ = {"type": "object"}
DELETED_N = {
    "type": "object",
    "required": ["deleted"],
    "properties": {"deleted": {"type": "integer", "description": "how many were deleted"}},
}

CANCELLED, RETRIED, SCHEDULE_DELETED = _done("cancelled"), _done("retried"), _done("deleted")
CANCELLING = {
    "type": "object",
    "required": ["id", "cancelled", "state"],
    "properties": {
        "id": {"type": "string"},
        "cancelled": {"const": False},
        "state": {
            "const": "cancelling",
            "description": "a worker holds the job: it is marked, and its drain ends it "
            "cancelled (its handler's task cancelled where it declared a watch, else at its "
            "settle); it never runs again",
        },
    },
}
HEALTH = {
    "type": "object",
    "required": ["ok", "version"],
    "properties": {"ok": {"const": True}, "version": {"type": "string"}},
}
SCHEDULE_IN: dict[str, Any] = {
    "type": "object",
    "required": ["cron", "name"],
    "additionalProperties": False,
    "properties": {
        "id": NAME_SCHEMA
        | {"description": "the schedule's id; the same id again replaces it (default: a new id)"},
        "cron": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_CRON,
            "description": "5 fields (minute hour day-of-month month day-of-week: ranges, "
            "steps, lists, month and day names) or @yearly, @monthly, @weekly, @daily, "
            "@hourly; a bad one is 422 invalid_cron",
        },
        "name": NAME_SCHEMA | {"description": "a registered job name (else 422 unknown_job)"},
        "payload": {"description": f"any JSON value, at most {MAX_PAYLOAD_BYTES} bytes"},
        "queue": NAME_SCHEMA
        | {"description": "the queue each slot's job goes to (default: the job's own)"},
        "tz": {
            "type": "string",
            "default": DEFAULT_TZ,
            "pattern": f"^{TZ_RULE}$",
            "description": "IANA time zone the cron is read in; an unknown one is 422 "
            "unknown_timezone",
        },
        "catch_up": {
            "enum": list(CATCH_UP_POLICIES),
            "default": DEFAULT_CATCH_UP,
            "description": "slots missed in an outage: none (skip them), latest (the most "
            f"recent one), all (every one, at most {MAX_CATCH_UP})",
        },
    },
}
SCHEDULE_OUT = {
    "type": "object",
    "required": ["id", "cron", "tz", "name", "queue", "paused", "next_run_at", "last_run_at"],
    "properties": {
        "id": {"type": "string"},
        "cron": {"type": "string"},
        "tz": {"type": "string"},
        "name": {"type": "string"},
        "queue": {"type": "string"},
        "payload": {},
        "catch_up": {"enum": list(CATCH_UP_POLICIES)},
        "paused": {"type": "boolean"},
        "source": {"enum": ["code", "api"], "description": "declared in code, or by the API"},
        "next_run_at": {"type": ["integer", "null"], "description": "epoch ms of the next slot"},
        "last_run_at": {"type": ["integer", "null"], "description": "the last slot enqueued"},
        "created_at": {"type": "integer"},
        "updated_at": {"type": "integer"},
        "created": {"type": "boolean", "description": "POST only: new (201) or replaced (200)"},
    },
}

_NUM_OR_NULL = {"type": ["number", "null"]}
_COUNTS = {
    "type": "object",
    "required": list(OUTCOMES),
    "properties": {k: {"type": "integer", "minimum": 0} for k in OUTCOMES},
}
_TIMES = {
    "type": "object",
    "description": "Seconds; percentiles interpolated inside the histogram's fixed buckets "
    f"(upper bounds {', '.join(f'{b:g}' for b in BUCKETS_S)} s and +Inf); null with "
    "nothing observed.",
    "required": ["count", "sum_s", "p50_s", "p95_s", "p99_s"],
    "properties": {
        "count": {"type": "integer", "minimum": 0},
        "sum_s": {"type": "number"},
        "p50_s": _NUM_OR_NULL,
        "p95_s": _NUM_OR_NULL,
        "p99_s": _NUM_OR_NULL,
    },
}
_POINT = {
    "type": "object",
    "required": ["at", *OUTCOMES, "wait_p50_s", "wait_p95_s", "run_p50_s", "run_p95_s"],
    "properties": {
        "at": {"type": "integer", "description": "the step's start, epoch ms"},
        **{k: {"type": "integer", "minimum": 0} for k in OUTCOMES},
        **{k: _NUM_OR_NULL for k in ("wait_p50_s", "wait_p95_s", "run_p50_s", "run_p95_s")},
    },
}
METRICS = {
    "type": "object",
    "description": "Job metrics per queue and job name over a window. As "
    "Prometheus text (d1queue_jobs_total, d1queue_job_wait_seconds, "
    "d1queue_job_run_seconds, d1queue_queue_jobs) when the Accept header asks "
    "for text/plain or application/openmetrics-text.",
    "required": ["window", "step_s", "from", "to", "metrics"],
    "properties": {
        "window": {"type": "string", "enum": list(WINDOWS)},
        "step_s": {"type": "integer", "description": "the series' step"},
        "from": {"type": "integer", "description": "the window's start, epoch ms"},
        "to": {"type": "integer", "description": "the window's end, epoch ms"},
        "metrics": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["queue", "name", "counts", "wait", "run", "total", "series"],
                "properties": {
                    "queue": {"type": "string"},
                    "name": {"type": "string"},
                    "counts": _COUNTS | {"description": "in the window"},
                    "wait": _TIMES,
                    "run": _TIMES,
                    "total": _COUNTS | {"description": "all time"},
                    "series": {"type": "array", "items": _POINT},
                },
            },
        },
    },
}
"""GET /v1/metrics's JSON answer (interfaces/service.py Service.metrics)."""

_PROMETHEUS = {
    "text/plain": {"schema": {"type": "string"}},
    "application/openmetrics-text": {"schema": {"type": "string"}},
}


SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "d1queue",
        "version": "1",
        "description": (
            "A durable job queue in Cloudflare D1. Every route but / and /health needs "
            "`Authorization: Bearer <D1QUEUE_TOKEN>`; the read-only token "
            "(D1QUEUE_READONLY_TOKEN), where one is set, reads every GET route and is "
            "refused anything else with 403 `read_only`. Every error is "
            f"{{error: {{code, message}}}}. Request bodies are at most {MAX_BODY_BYTES} bytes; "
            "nothing is written when a request is refused. D1 failing past the Worker's "
            "retries is 503 `unavailable` with Retry-After; a failure inside the Worker is "
            "500 `internal`, its details in the Worker's log, not the answer. Payloads are "
            "JSON values, as pushed."
        ),
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Job": JOB_IN,
            "JobByName": JOB_BY_NAME,
            "Stats": STATS,
            "Limits": LIMITS,
            "LimitsState": LIMITS_STATE,
            "JobState": JOB_OUT,
            "Error": ERROR,
            "ScheduleIn": SCHEDULE_IN,
            "Schedule": SCHEDULE_OUT,
            "Pushed": PUSHED,
            "PushedBatch": PUSHED_BATCH,
            "CallbackJob": CALLBACK_JOB,
            "BatchIn": BATCH_IN,
            "BatchJobs": BATCH_JOBS_IN,
            "BatchCreated": BATCH_CREATED,
            "BatchState": BATCH_STATE,
            "AddedToBatch": {
                "type": "object",
                "required": ["ids"],
                "properties": {"ids": {"type": "array", "items": {"type": "string"}}},
            },
            "Queues": {
                "type": "object",
                "required": ["queues"],
                "properties": {"queues": {"type": "array", "items": _ref("Stats")}},
            },
            "FailedPage": _page("JobState", "jobs"),
            "CompletedPage": _page("JobState", "jobs"),
            "SchedulePage": _page("Schedule", "schedules"),
            "Deleted": DELETED_N,
            "Cancelled": CANCELLED,
            "Cancelling": CANCELLING,
            "Retried": RETRIED,
            "ScheduleDeleted": SCHEDULE_DELETED,
            "Health": HEALTH,
            "Metrics": METRICS,
        },
        "responses": {
            f"E{c}": _json(_ref("Error"), d)
            for c, d in {
                400: "Malformed request",
                401: "Missing or wrong bearer token",
                403: "read_only: the read-only token (D1QUEUE_READONLY_TOKEN) sent a "
                "request that is not a read",
                404: "Not found",
                405: "Method not allowed",
                409: "Conflict",
                413: "Too large",
                422: "Invalid",
            }.items()
        }
        | {
            "E503": _json(
                _ref("Error"),
                "not_configured: no D1QUEUE_TOKEN secret is set; or unavailable: D1 failed "
                "past the Worker's own retries, and the request may be sent again after "
                "Retry-After seconds (a write may have landed: every write is safe to re-send)",
            )
            | {
                "headers": {
                    "retry-after": {
                        "description": "unavailable: seconds to wait before sending again",
                        "schema": {"type": "integer", "minimum": 1},
                    }
                }
            }
        },
    },
    "security": [{"bearer": []}],
    "paths": {},  # from ROUTES, below
}

STATS_OK = _returns("Stats", "stats")
DELETED = _returns("Deleted", "deleted")
SCHEDULE_OK = _returns("Schedule", "the schedule")
BODY_CODES = (413, 422)
"""What a request with a JSON body may be refused with besides: too large,
invalid."""


def _push(schema: str, summary: str) -> dict[str, Any]:
    queued = "queued (see paused, drained and warnings: queued is not running)"
    held = "a queued job already holds the unique_key"
    ok = _returns("Pushed", queued, 201) | _returns("Pushed", held)
    return _op(summary, ok, 400, *BODY_CODES, body=_ref(schema))


PUSH_MANY = {
    "type": "object",
    "required": ["jobs"],
    "additionalProperties": False,
    "properties": {
        "jobs": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_BATCH,
            "items": _ref("Job"),
            "description": EDGES_RULE,
        }
    },
}
"""POST /v1/queues/{queue}/jobs/batch's body."""

OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("GET", "/v1/openapi.json"): _op("This document", {"200": _json(OBJ, "OpenAPI 3.1")}),
    ("GET", "/v1/queues"): _op("Every queue with stats", _returns("Queues", "queues")),
    ("GET", "/v1/metrics"): _op(
        "Job metrics per queue and name: counts by outcome, wait and run percentiles, "
        "all-time totals and a series; Prometheus text for Accept: text/plain or "
        "application/openmetrics-text",
        {
            "200": {
                "description": "metrics",
                "content": {"application/json": {"schema": _ref("Metrics")}} | _PROMETHEUS,
            }
        },
        400,
    ),
    ("GET", "/v1/queues/{queue}"): _op("A queue's stats", STATS_OK, 400),
    ("POST", "/v1/queues/{queue}/pause"): _op(
        "Stop draining a queue (pushes still accepted)", STATS_OK, 400
    ),
    ("POST", "/v1/queues/{queue}/resume"): _op("Drain a paused queue again", STATS_OK, 400),
    ("GET", "/v1/queues/{queue}/limits"): _op(
        "A queue's flow limits and their use now", _returns("LimitsState", "limits"), 400
    ),
    ("PUT", "/v1/queues/{queue}/limits"): _op(
        "Replace a queue's flow limits (null: none of that kind); works on a queue with no "
        "jobs yet",
        _returns("LimitsState", "the limits now"),
        400,
        422,
        body=_ref("Limits"),
    ),
    ("POST", "/v1/jobs"): _push(
        "JobByName",
        "Push a job by name: to its `queue` if given, else to the queue it is registered with",
    ),
    ("POST", "/v1/queues/{queue}/jobs"): _push("Job", "Push a job to this queue"),
    ("DELETE", "/v1/queues/{queue}/jobs"): _op("Delete every job on the queue", DELETED, 400),
    ("POST", "/v1/queues/{queue}/jobs/batch"): _op(
        f"Push 1 to {MAX_BATCH} jobs, all or nothing",
        _returns("PushedBatch", "queued", 201),
        400,
        *BODY_CODES,
        body=PUSH_MANY,
    ),
    ("GET", "/v1/queues/{queue}/completed"): _op(
        "A queue's completed jobs kept as history, newest first, with their results",
        _returns("CompletedPage", "a page"),
        400,
    ),
    ("GET", "/v1/jobs/{id}"): _op(
        "A job's state: waiting, ready, delayed, reserved, cancelling, completed (while "
        "kept), failed or cancelled",
        _returns("JobState", "the job"),
        404,
    ),
    ("DELETE", "/v1/jobs/{id}"): _op(
        "Cancel a job: one no worker holds is deleted (200); a running one is marked and "
        "its drain ends it cancelled (202); one that already ended is left as it is (409 "
        "ended, with its state)",
        _returns("Cancelled", "cancelled") | _returns("Cancelling", "marked: cancelling", 202),
        400,
        404,
        409,
    ),
    ("POST", "/v1/batches"): _op(
        f"Push a batch of {BATCH_JOBS[0]} to {BATCH_JOBS[1]} jobs, all or nothing, with "
        f"callbacks ({', '.join(CALLBACKS)}) each enqueued exactly once",
        _returns("BatchCreated", "queued", 201),
        400,
        409,
        *BODY_CODES,
        body=_ref("BatchIn"),
    ),
    ("GET", "/v1/batches/{id}"): _op(
        "A batch's progress", _returns("BatchState", "the batch"), 404
    ),
    ("POST", "/v1/batches/{id}/jobs"): _op(
        "Add jobs to a running batch, all or nothing (409 batch_not_running once every job "
        "of it ended, or for no such batch)",
        _returns("AddedToBatch", "added", 201),
        409,
        *BODY_CODES,
        body=_ref("BatchJobs"),
    ),
    ("GET", "/v1/failed"): _op("Failed jobs, newest first", _returns("FailedPage", "a page"), 400),
    ("DELETE", "/v1/failed"): _op("Prune failed jobs older than older_than_s", DELETED, 400),
    ("DELETE", "/v1/failed/{id}"): _op("Delete a failed job", DELETED, 404),
    ("POST", "/v1/failed/{id}/retry"): _op(
        "Queue a failed job again: it keeps its attempts and last_error, and gets its "
        "registration's max_attempts afresh",
        _returns("Retried", "retried"),
        404,
    ),
    ("POST", "/v1/schedules"): _op(
        "Create a recurring schedule, or replace the one with this id",
        _returns("Schedule", "created", 201) | _returns("Schedule", "replaced"),
        400,
        409,
        *BODY_CODES,
        body=_ref("ScheduleIn"),
    ),
    ("GET", "/v1/schedules"): _op("Every schedule, by id", _returns("SchedulePage", "a page"), 400),
    ("GET", "/v1/schedules/{id}"): _op("A schedule", SCHEDULE_OK, 404),
    ("DELETE", "/v1/schedules/{id}"): _op(
        "Delete a schedule created by the API (409 for one declared in code)",
        _returns("ScheduleDeleted", "deleted"),
        404,
        409,
    ),
    ("POST", "/v1/schedules/{id}/pause"): _op(
        "Pause a schedule: it enqueues nothing until resumed", SCHEDULE_OK, 404
    ),
    ("POST", "/v1/schedules/{id}/resume"): _op(
        "Resume a schedule from its next slot (slots while paused are skipped)", SCHEDULE_OK, 404
    ),
}
"""What each route does and answers, by (method, path); the parameters come
from the route itself."""

OPERATION_IDS: dict[tuple[str, str], str] = {
    ("GET", "/v1/openapi.json"): "openapi",
    ("POST", "/v1/jobs"): "dispatchJob",
    ("POST", "/v1/queues/{queue}/jobs"): "dispatch",
    ("POST", "/v1/queues/{queue}/jobs/batch"): "dispatchBatch",
    ("DELETE", "/v1/queues/{queue}/jobs"): "clearQueue",
    ("GET", "/v1/queues"): "queues",
    ("GET", "/v1/metrics"): "metrics",
    ("GET", "/v1/queues/{queue}"): "queueStats",
    ("POST", "/v1/queues/{queue}/pause"): "pauseQueue",
    ("POST", "/v1/queues/{queue}/resume"): "resumeQueue",
    ("GET", "/v1/queues/{queue}/limits"): "limits",
    ("PUT", "/v1/queues/{queue}/limits"): "setLimits",
    ("GET", "/v1/queues/{queue}/completed"): "completed",
    ("GET", "/v1/jobs/{id}"): "job",
    ("DELETE", "/v1/jobs/{id}"): "cancel",
    ("POST", "/v1/batches"): "createBatch",
    ("GET", "/v1/batches/{id}"): "batchState",
    ("POST", "/v1/batches/{id}/jobs"): "addToBatch",
    ("GET", "/v1/failed"): "failed",
    ("DELETE", "/v1/failed"): "pruneFailed",
    ("POST", "/v1/failed/{id}/retry"): "retryFailed",
    ("DELETE", "/v1/failed/{id}"): "deleteFailed",
    ("POST", "/v1/schedules"): "putSchedule",
    ("GET", "/v1/schedules"): "schedules",
    ("GET", "/v1/schedules/{id}"): "schedule",
    ("DELETE", "/v1/schedules/{id}"): "deleteSchedule",
    ("POST", "/v1/schedules/{id}/pause"): "pauseSchedule",
    ("POST", "/v1/schedules/{id}/resume"): "resumeSchedule",
}
"""Each operation's operationId: the name generated clients give it (the
TypeScript types in clients/ts name their types after it). Stable: renaming
one renames a client's type."""

PATH_PARAMS = {"queue": QUEUE_PARAM, "id": ID_PARAM}


INDEX_SCHEMA = {
    "type": "object",
    "required": list(INDEX),
    "properties": {k: {"type": "string"} for k in INDEX},
}


TRACE_PARAM = {
    "name": TRACE_HEADER,
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": f"^{TRACEPARENT_RULE}$"},
    "description": "the producer's W3C trace context: the pushed jobs (and the jobs their "
    "runs push, their retries and callbacks) keep it, and each run's d1queue.process log "
    "line carries its trace_id and parent_span_id. A job's own traceparent field wins; "
    f"{TRACEPARENT_ZEROS} (else 422 invalid, nothing written)",
}


def _paths(routes: tuple[Route, ...]) -> dict[str, Any]:
    """The document's paths: one operation per route, its path parameters
    from the template, its query parameters from the route. A route with no
    entry in OPERATIONS, or an entry with no route, is an error at import, so
    the document cannot promise or miss an operation."""
    keys = {(r.method, r.path) for r in routes}
    if keys != set(OPERATIONS) or keys != set(OPERATION_IDS):
        raise AssertionError(
            f"routes without an operation: {sorted(keys - set(OPERATIONS))}; "
            f"operations without a route: {sorted(set(OPERATIONS) - keys)}; "
            f"routes without an operationId: {sorted(keys - set(OPERATION_IDS))}"
        )
    paths: dict[str, Any] = {
        "/": {
            "get": {
                "summary": "Where things are, without auth: a browser (Accept preferring "
                "text/html) is sent to the dashboard, anything else gets the links",
                "security": [],
                "operationId": "index",
                "responses": {
                    "200": _json(
                        INDEX_SCHEMA, "the API's, the document's and the dashboard's paths"
                    ),
                    "303": {
                        "description": "to the dashboard (/ui)",
                        "headers": {"location": {"schema": {"type": "string"}}},
                    },
                },
            }
        },
        "/health": {
            "get": {
                "summary": "Liveness, without auth",
                "security": [],
                "operationId": "health",
                "responses": {"200": _json(_ref("Health"), "ok and the version")},
            }
        },
    }
    for route in routes:
        item = paths.setdefault(route.path, {})
        if route.path_params:
            item["parameters"] = [PATH_PARAMS[p] for p in route.path_params]
        op: dict[str, Any] = {"operationId": OPERATION_IDS[(route.method, route.path)]}
        op |= OPERATIONS[(route.method, route.path)]
        if "id" in route.path_params:  # an id not of ID_RULE's shape: 400 invalid_id
            op["responses"] = {"400": {"$ref": "#/components/responses/E400"}} | op["responses"]
        if route.method != "GET":  # the read-only token reads only
            op["responses"] = op["responses"] | {"403": {"$ref": "#/components/responses/E403"}}
        if route.handler in TRACED:
            op["parameters"] = [TRACE_PARAM]
        if route.query:
            op["parameters"] = [
                {"name": q.name, "in": "query", "required": q.required, "schema": q.schema()}
                for q in route.query
            ]
        item[route.method.lower()] = op
    return paths


SPEC["paths"] = _paths(ROUTES)


def document(job_names: list[str]) -> dict[str, Any]:
    """SPEC for a Worker whose registry has `job_names`: a job's `name` is one
    of them, so the document promises exactly what the Worker accepts."""
    doc = copy.deepcopy(SPEC)
    for schema in ("Job", "JobByName", "CallbackJob", "ScheduleIn"):
        doc["components"]["schemas"][schema]["properties"]["name"] = {
            "enum": sorted(job_names),
            "description": "a registered job name",
        }
    return doc
