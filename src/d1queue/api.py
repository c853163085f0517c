"""The HTTP API under /v1, as plain Python: method, URL, headers and body in,
status, headers and a JSON body out. entry.py adapts the Worker's Request and
Response; tests drive it directly under CPython and through the real Worker.
The route table (ROUTES) is the one statement of what is routed and which
query parameters each route takes; openapi.py documents it from the same
table.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlparse

from .admin import FAILED_CURSOR_RULE
from .bounds import (
    ID_PATTERN,
    ID_RULE,
    MAX_JSON_DEPTH,
    MAX_OLDER_THAN_S,
    MAX_PAGE,
    NAME_RULE,
    json_depth,
)
from .guard import RETRY_AFTER_S, Guard
from .log import event, get
from .service import ApiError, Service, too_deep

log = get(__name__)

MAX_BODY_BYTES = 1024 * 1024
"""A request body, batch included: 100 jobs of ~10 KB, or fewer larger ones."""


@dataclass
class ApiReply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


Endpoint = Callable[..., Awaitable[tuple[int, Any]]]
"""What a route runs: `(api, *path_args, query=..., body=..., headers=...)`
to `(status, body)`; `query` holds the route's own parameters, parsed."""

_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_JSON_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,15})")


@dataclass(frozen=True)
class QueryParam:
    """One query parameter a route accepts. Its type and bounds are both what
    the API checks and what the OpenAPI document states (`schema`), so the two
    cannot drift; the bounds themselves come from bounds.py."""

    name: str
    type: Literal["integer", "number", "string"]
    minimum: int | None = None
    maximum: int | None = None
    pattern: str | None = None
    """A string's shape, a regex matched in full (the document anchors it)."""
    required: bool = False
    default: Any = None
    code: str = ""
    """The error code of a bad value (default `invalid_<name>`)."""

    def schema(self) -> dict[str, Any]:
        """The parameter's JSON Schema, as the OpenAPI document states it."""
        schema: dict[str, Any] = {"type": self.type}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.pattern is not None:
            schema["pattern"] = f"^{self.pattern}$"
        if self.default is not None:
            schema["default"] = self.default
        return schema

    def rule(self) -> str:
        """What a valid value is, in words, for the error message."""
        kind = {"integer": "an integer", "number": "a number", "string": "a string"}[self.type]
        if self.pattern is not None:
            return f"{kind} matching {self.pattern}"
        if self.minimum is not None and self.maximum is not None:
            return f"{kind} from {self.minimum} to {self.maximum}"
        return kind

    def parse(self, raw: str) -> Any:
        """The value of `?name=raw`, checked against the schema (ApiError 400
        otherwise). Numbers are JSON numbers: no "inf", "nan", "1_0" or
        spaces, which Python's int() and float() would take."""
        value: Any = raw
        if self.type == "integer" and _JSON_INTEGER.fullmatch(raw):
            value = int(raw)
        elif self.type == "number" and _JSON_NUMBER.fullmatch(raw):
            value = float(raw)
            value = value if math.isfinite(value) else None
        elif self.type != "string":
            value = None
        ok = value is not None and (
            (self.pattern is None or re.fullmatch(self.pattern, value) is not None)
            if self.type == "string"
            else (self.minimum is None or value >= self.minimum)
            and (self.maximum is None or value <= self.maximum)
        )
        if not ok:
            raise ApiError(
                400, self.code or f"invalid_{self.name}", f"{self.name} must be {self.rule()}"
            )
        return value


@dataclass(frozen=True)
class Route:
    """One operation: method, path (an OpenAPI path template such as
    `/v1/jobs/{id}`), what it runs, and the query parameters it accepts. The
    API routes and validates from this table and openapi.py documents it, so
    a parameter is accepted exactly where the document says it is."""

    method: str
    path: str
    endpoint: Endpoint
    query: tuple[QueryParam, ...] = ()

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """The path as a regex, one group per `{param}` segment."""
        parts = re.split(r"\{[a-z_]+\}", self.path)
        return re.compile("([^/]+)".join(re.escape(p) for p in parts) + "$")

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"\{([a-z_]+)\}", self.path)

    def check_path(self, args: list[str]) -> None:
        """An `{id}` must be of ID_RULE's shape (400 invalid_id), as the
        document says; `{queue}` is checked by the operation (invalid_queue)."""
        for name, value in zip(self.path_params, args, strict=True):
            if name == "id" and not ID_PATTERN.fullmatch(value):
                raise ApiError(400, "invalid_id", f"id must match {ID_RULE}")

    def parse_query(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """The route's query parameters, parsed, defaults filled in; a name
        the route does not declare is refused (a typo such as ?limt=10 must
        not be silently ignored), and so is a missing required one."""
        known = {p.name: p for p in self.query}
        unknown = sorted(set(query) - set(known))
        if unknown:
            message = f"unknown query parameter(s): {', '.join(unknown)}"
            raise ApiError(400, "invalid_query", message)
        parsed: dict[str, Any] = {}
        for name, param in known.items():
            values = query.get(name)
            if values:
                parsed[name] = param.parse(values[-1])
            elif param.required:
                message = f"{name} is required: {param.rule()}"
                raise ApiError(400, param.code or f"invalid_{name}", message)
            else:
                parsed[name] = param.default
        return parsed


NO_STORE = {"cache-control": "no-store"}
"""On every answer: queue contents and errors are for the token's holder,
never for a shared cache or the browser's."""


class Api:
    """Routes requests to a Service. `token` is the D1QUEUE_TOKEN secret
    (None: not configured, and every route but /health answers 503).
    `guard` slows a client that sends wrong tokens (guard.py)."""

    def __init__(
        self,
        service: Service,
        token: str | None,
        version: str,
        openapi: dict[str, Any],
        guard: Guard | None = None,
    ) -> None:
        self.service, self.token, self.version, self.openapi = service, token, version, openapi
        self.guard = guard if guard is not None else Guard()
        self.routes = ROUTES

    def authorized(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries the API token: checked before its body
        is read (entry.py), so no one without the token makes the Worker
        read a body."""
        try:
            self._authorize(headers)
        except ApiError:
            return False
        return True

    async def handle(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> ApiReply:
        reply = await self._handle(method, url, headers, body)
        reply.headers.update(NO_STORE)
        return reply

    async def _handle(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> ApiReply:
        parsed = urlparse(url)
        path, query = parsed.path, parse_qs(parsed.query, keep_blank_values=True)
        allowed = self._allowed(path)
        if method == "OPTIONS" and allowed:
            # What a path accepts (RFC 9110); no token needed to ask.
            return ApiReply(204, None, {"allow": ", ".join(["OPTIONS", *allowed])})
        if path == "/health":
            if method not in ("GET", "HEAD"):
                error = ApiError(405, "method_not_allowed", f"{path} accepts GET")
                return _error(error, {"allow": "GET, HEAD, OPTIONS"})
            return ApiReply(200, {"ok": True, "version": self.version})
        try:
            self._authorize(headers)
            for route in self.routes:
                match = route.pattern.match(path)
                # HEAD is GET without the body (RFC 9110): the host drops it.
                if match and method in (route.method, "HEAD" if route.method == "GET" else ""):
                    params = route.parse_query(query)
                    args = [unquote(g) for g in match.groups()]
                    route.check_path(args)
                    status, result = await route.endpoint(
                        self, *args, query=params, body=body, headers=headers
                    )
                    return ApiReply(status, result)
            if allowed:
                raise ApiError(405, "method_not_allowed", f"{path} accepts {', '.join(allowed)}")
            raise ApiError(404, "not_found", f"no route {method} {path}")
        except ApiError as exc:
            # A wrong token is a guess and pays for it; no token at all is not.
            guessed = exc.status == 401 and bool(headers.get("authorization", "").strip())
            if guessed and await self.guard.failed(headers):
                exc = ApiError(429, "too_many_attempts", "too many wrong tokens: wait, then retry")
                return _error(exc, {"retry-after": str(RETRY_AFTER_S)})
            extra = {"www-authenticate": "Bearer"} if exc.status == 401 else {}
            if exc.status == 405:
                extra["allow"] = ", ".join(["OPTIONS", *allowed])
            return _error(exc, extra)
        except Exception as exc:  # a bug or D1 failing: say so, never a bare 500
            event(
                log,
                "d1queue.api.failed",
                logging.ERROR,
                request=f"{method} {path}",
                traceback=traceback.format_exc(),
            )
            return _error(ApiError(500, "internal", f"{type(exc).__name__}: {exc}"))

    def _allowed(self, path: str) -> list[str]:
        """The methods routed for `path` (empty: no such path)."""
        if path == "/health":
            return ["GET", "HEAD"]
        methods = [r.method for r in self.routes if r.pattern.match(path)]
        return [*methods, "HEAD"] if "GET" in methods else methods

    def _authorize(self, headers: Mapping[str, str]) -> None:
        if not self.token:
            raise ApiError(
                503,
                "not_configured",
                "no API token is configured: set the D1QUEUE_TOKEN secret "
                "(wrangler secret put D1QUEUE_TOKEN; .dev.vars locally)",
            )
        given = headers.get("authorization", "")
        scheme, _, credential = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            credential.strip().encode(), self.token.encode()
        ):
            raise ApiError(401, "unauthorized", "missing or wrong bearer token")

    # -- endpoints: from HTTP to Service calls ------------------------------------

    async def _openapi(self, **_: Any) -> tuple[int, Any]:
        return 200, self.openapi

    async def _dispatch(self, queue: str, *, body: bytes, **_: Any) -> tuple[int, Any]:
        result = await self.service.dispatch(queue, json_object(body))
        return (200 if result["deduplicated"] else 201), result

    async def _dispatch_job(self, *, body: bytes, **_: Any) -> tuple[int, Any]:
        result = await self.service.dispatch_job(json_object(body))
        return (200 if result["deduplicated"] else 201), result

    async def _dispatch_batch(self, queue: str, *, body: bytes, **_: Any) -> tuple[int, Any]:
        obj = json_object(body)
        if set(obj) - {"jobs"}:
            raise ApiError(422, "invalid", 'the body is {"jobs": [...]} and nothing else')
        return 201, await self.service.dispatch_batch(queue, obj.get("jobs"))

    async def _pause(self, queue: str, **_: Any) -> tuple[int, Any]:
        return 200, await self.service.set_paused(queue, True)

    async def _resume(self, queue: str, **_: Any) -> tuple[int, Any]:
        return 200, await self.service.set_paused(queue, False)

    async def _queues(self, **_: Any) -> tuple[int, Any]:
        return 200, await self.service.queues()

    async def _failed(self, *, query: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.service.failed(query["queue"], query["limit"], query["cursor"])

    async def _prune(self, *, query: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.service.prune_failed(query["older_than_s"])

    async def _put_schedule(self, *, body: bytes, **_: Any) -> tuple[int, Any]:
        created, result = await self.service.put_schedule(json_object(body))
        return (201 if created else 200), result

    async def _schedules(self, *, query: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.service.schedules(query["limit"], query["cursor"])


def _on_path(call: Callable[[Service, str], Awaitable[Any]]) -> Endpoint:
    """An endpoint calling `Service.<call>` with the path's one parameter."""

    async def endpoint(api: Api, arg: str, **_: Any) -> tuple[int, Any]:
        return 200, await call(api.service, arg)

    return endpoint


ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/openapi.json", Api._openapi),
    Route("POST", "/v1/jobs", Api._dispatch_job),
    Route("POST", "/v1/queues/{queue}/jobs", Api._dispatch),
    Route("POST", "/v1/queues/{queue}/jobs/batch", Api._dispatch_batch),
    Route("DELETE", "/v1/queues/{queue}/jobs", _on_path(Service.clear)),
    Route("GET", "/v1/queues", Api._queues),
    Route("GET", "/v1/queues/{queue}", _on_path(Service.queue_stats)),
    Route("POST", "/v1/queues/{queue}/pause", Api._pause),
    Route("POST", "/v1/queues/{queue}/resume", Api._resume),
    Route("GET", "/v1/jobs/{id}", _on_path(Service.job)),
    Route("DELETE", "/v1/jobs/{id}", _on_path(Service.cancel)),
    Route(
        "GET",
        "/v1/failed",
        Api._failed,
        query=(
            QueryParam("queue", "string", pattern=NAME_RULE),
            QueryParam("limit", "integer", minimum=1, maximum=MAX_PAGE, default=50),
            QueryParam("cursor", "string", pattern=FAILED_CURSOR_RULE),
        ),
    ),
    Route(
        "DELETE",
        "/v1/failed",
        Api._prune,
        query=(
            QueryParam(
                "older_than_s", "number", minimum=0, maximum=MAX_OLDER_THAN_S, required=True
            ),
        ),
    ),
    Route("POST", "/v1/failed/{id}/retry", _on_path(Service.retry_failed)),
    Route("DELETE", "/v1/failed/{id}", _on_path(Service.delete_failed)),
    Route("POST", "/v1/schedules", Api._put_schedule),
    Route(
        "GET",
        "/v1/schedules",
        Api._schedules,
        query=(
            QueryParam("limit", "integer", minimum=1, maximum=MAX_PAGE, default=100),
            QueryParam("cursor", "string", pattern=NAME_RULE),
        ),
    ),
    Route("GET", "/v1/schedules/{id}", _on_path(Service.schedule)),
    Route("DELETE", "/v1/schedules/{id}", _on_path(Service.delete_schedule)),
    Route("POST", "/v1/schedules/{id}/pause", _on_path(Service.pause_schedule)),
    Route("POST", "/v1/schedules/{id}/resume", _on_path(Service.resume_schedule)),
)
"""Every route but /health (answered before auth). Order matters only where
two paths could match the same URL; none do."""


def json_object(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object: size and depth checked before it is
    parsed (ApiError otherwise)."""
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, "payload_too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    # Before parsing: a few thousand levels overflow Pyodide's stack inside
    # the parser, which no `except` can catch and the Worker does not survive.
    if json_depth(text) > MAX_JSON_DEPTH:
        raise too_deep("the body")
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "malformed_json", "the body must be a JSON object")
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _error(exc: ApiError, headers: dict[str, str] | None = None) -> ApiReply:
    return ApiReply(exc.status, exc.body(), headers or {})
