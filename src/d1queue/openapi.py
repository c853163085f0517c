"""The OpenAPI 3.1 document of the HTTP API (served at GET /v1/openapi.json).

Kept as Python so the Worker serves it with no file to bundle and the limits
in it are the ones the code enforces (imported from service.py).
"""

from __future__ import annotations

import copy
from typing import Any

from .admin import CURSOR_PATTERN
from .api import MAX_BODY_BYTES
from .bounds import (
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_DELAY_S,
    MAX_JSON_DEPTH,
    MAX_PAYLOAD_BYTES,
    MAX_UNIQUE_KEY,
    NAME_RULE,
    PRIORITY_RANGE,
)
from .service import MAX_LIST, MAX_OLDER_THAN_S

NAME_SCHEMA = {"type": "string", "pattern": f"^{NAME_RULE}$"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _op(summary: str, ok: dict[str, Any], *codes: int, **extra: Any) -> dict[str, Any]:
    """An operation answering `ok`, 401 and 503 (auth), and `codes`."""
    errors = {str(c): {"$ref": f"#/components/responses/E{c}"} for c in (401, 503, *codes)}
    return {"summary": summary, "responses": ok | errors, **extra}


QUEUE_PARAM = {"name": "queue", "in": "path", "required": True, "schema": NAME_SCHEMA}
ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}

JOB_IN = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": NAME_SCHEMA | {"description": "a registered job name"},
        "payload": {
            "description": f"any JSON value, at most {MAX_PAYLOAD_BYTES} bytes and "
            f"{MAX_JSON_DEPTH} levels deep (a request nested deeper is refused: 422 too_deep)"
        },
        "delay_s": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_S},
        "max_attempts": {"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS},
        "priority": {
            "type": "integer",
            "minimum": PRIORITY_RANGE[0],
            "maximum": PRIORITY_RANGE[1],
            "description": "higher runs first",
        },
        "unique_key": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_UNIQUE_KEY},
    },
}
STATS = {
    "type": "object",
    "required": ["queue", "ready", "delayed", "reserved", "failed", "paused"],
    "properties": {
        "queue": {"type": "string"},
        "ready": {"type": "integer"},
        "delayed": {"type": "integer"},
        "reserved": {"type": "integer"},
        "failed": {"type": "integer"},
        "oldest_ready_age_s": {"type": ["number", "null"]},
        "paused": {"type": "boolean"},
    },
}
JOB_OUT = {
    "type": "object",
    "required": ["id", "queue", "name", "state", "attempts", "max_attempts"],
    "properties": {
        "id": {"type": "string"},
        "queue": {"type": "string"},
        "name": {"type": "string"},
        "state": {"enum": ["ready", "delayed", "reserved", "failed"]},
        "payload": {},
        "attempts": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "priority": {"type": "integer"},
        "available_at": {"type": "integer", "description": "epoch ms"},
        "created_at": {"type": "integer", "description": "epoch ms"},
        "reserved_until": {"type": ["integer", "null"]},
        "unique_key": {"type": ["string", "null"]},
        "last_error": {"type": ["string", "null"]},
        "error": {"type": "string", "description": "failed jobs: why"},
        "failed_at": {"type": "integer"},
    },
}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}
PUSHED = {
    "type": "object",
    "required": ["id", "queue", "deduplicated"],
    "properties": {
        "id": {"type": "string"},
        "queue": {"type": "string"},
        "deduplicated": {"type": "boolean"},
    },
}
OBJ = {"type": "object"}

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "d1queue",
        "version": "1",
        "description": (
            "A durable job queue in Cloudflare D1. Every route but /health needs "
            "`Authorization: Bearer <D1QUEUE_TOKEN>`. Every error is "
            f"{{error: {{code, message}}}}. Request bodies are at most {MAX_BODY_BYTES} bytes; "
            "nothing is written when a request is refused."
        ),
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {"Job": JOB_IN, "Stats": STATS, "JobState": JOB_OUT, "Error": ERROR},
        "responses": {
            f"E{c}": _json(_ref("Error"), d)
            for c, d in {
                400: "Malformed request",
                401: "Missing or wrong bearer token",
                404: "Not found",
                405: "Method not allowed",
                409: "Conflict",
                413: "Too large",
                422: "Invalid",
                503: "Not configured",
            }.items()
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/health": {
            "get": {
                "summary": "Liveness, without auth",
                "security": [],
                "responses": {"200": _json(OBJ, "ok and the version")},
            }
        },
        "/v1/openapi.json": {"get": _op("This document", {"200": _json(OBJ, "OpenAPI 3.1")})},
        "/v1/queues": {
            "get": _op(
                "Every queue with stats",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"queues": {"type": "array", "items": _ref("Stats")}},
                        },
                        "queues",
                    )
                },
            )
        },
        "/v1/queues/{queue}": {
            "parameters": [QUEUE_PARAM],
            "get": _op("A queue's stats", {"200": _json(_ref("Stats"), "stats")}, 400),
        },
        "/v1/queues/{queue}/pause": {
            "parameters": [QUEUE_PARAM],
            "post": _op(
                "Stop draining a queue (pushes still accepted)",
                {"200": _json(_ref("Stats"), "stats")},
                400,
            ),
        },
        "/v1/queues/{queue}/resume": {
            "parameters": [QUEUE_PARAM],
            "post": _op("Drain a paused queue again", {"200": _json(_ref("Stats"), "stats")}, 400),
        },
        "/v1/queues/{queue}/jobs": {
            "parameters": [QUEUE_PARAM],
            "post": _op(
                "Push a job",
                {
                    "201": _json(PUSHED, "queued"),
                    "200": _json(PUSHED, "a queued job already holds the unique_key"),
                },
                400,
                413,
                422,
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": _ref("Job")}},
                },
            ),
            "delete": _op(
                "Delete every job on the queue",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["deleted"],
                            "properties": {"deleted": {"type": "integer"}},
                        },
                        "deleted",
                    )
                },
                400,
            ),
        },
        "/v1/queues/{queue}/jobs/batch": {
            "parameters": [QUEUE_PARAM],
            "post": _op(
                f"Push 1 to {MAX_BATCH} jobs, all or nothing",
                {
                    "201": _json(
                        {
                            "type": "object",
                            "required": ["ids", "deduplicated"],
                            "properties": {
                                "ids": {"type": "array", "items": {"type": "string"}},
                                "deduplicated": {"type": "array", "items": {"type": "boolean"}},
                            },
                        },
                        "queued",
                    )
                },
                400,
                413,
                422,
                requestBody={
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["jobs"],
                                "additionalProperties": False,
                                "properties": {
                                    "jobs": {
                                        "type": "array",
                                        "minItems": 1,
                                        "maxItems": MAX_BATCH,
                                        "items": _ref("Job"),
                                    }
                                },
                            }
                        }
                    },
                },
            ),
        },
        "/v1/jobs/{id}": {
            "parameters": [ID_PARAM],
            "get": _op("A job's state", {"200": _json(_ref("JobState"), "the job")}, 404),
            "delete": _op(
                "Cancel a job no worker holds",
                {"200": _json(OBJ, "cancelled")},
                404,
                409,
            ),
        },
        "/v1/failed": {
            "get": _op(
                "Failed jobs, newest first",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["jobs", "next_cursor"],
                            "properties": {
                                "jobs": {"type": "array", "items": _ref("JobState")},
                                "next_cursor": {"type": ["string", "null"]},
                            },
                        },
                        "a page",
                    )
                },
                400,
                parameters=[
                    {"name": "queue", "in": "query", "schema": NAME_SCHEMA},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST},
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string", "pattern": CURSOR_PATTERN},
                    },
                ],
            ),
            "delete": _op(
                "Prune failed jobs older than older_than_s",
                {"200": _json(OBJ, "deleted")},
                400,
                parameters=[
                    {
                        "name": "older_than_s",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "number", "minimum": 0, "maximum": MAX_OLDER_THAN_S},
                    }
                ],
            ),
        },
        "/v1/failed/{id}": {
            "parameters": [ID_PARAM],
            "delete": _op("Delete a failed job", {"200": _json(OBJ, "deleted")}, 404),
        },
        "/v1/failed/{id}/retry": {
            "parameters": [ID_PARAM],
            "post": _op(
                "Queue a failed job again, with one attempt", {"200": _json(OBJ, "retried")}, 404
            ),
        },
    },
}


def document(job_names: list[str]) -> dict[str, Any]:
    """SPEC for a Worker whose registry has `job_names`: a job's `name` is one
    of them, so the document promises exactly what the Worker accepts."""
    doc = copy.deepcopy(SPEC)
    doc["components"]["schemas"]["Job"]["properties"]["name"] = {
        "enum": sorted(job_names),
        "description": "a registered job name",
    }
    return doc
