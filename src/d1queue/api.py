"""The HTTP API under /v1, as plain Python: method, URL, headers and body in,
status, headers and a JSON body out. entry.py adapts the Worker's Request and
Response; tests drive it directly under CPython and through the real Worker.
The routes and their shapes are documented in openapi.py.
"""

from __future__ import annotations

import hmac
import json
import re
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from .bounds import MAX_JSON_DEPTH, json_depth
from .service import ApiError, Service, too_deep

MAX_BODY_BYTES = 1024 * 1024
"""A request body, batch included: 100 jobs of ~10 KB, or fewer larger ones."""


@dataclass
class ApiReply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


Route = Callable[..., Awaitable[Any]]
QUERY_PARAMS = {"_failed": {"queue", "limit", "cursor"}, "_prune": {"older_than_s"}}
"""The query parameters each handler reads; any other is refused."""
SEGMENT = r"([^/]+)"


class Api:
    """Routes requests to a Service. `token` is the D1QUEUE_TOKEN secret
    (None: not configured, and every route but /health answers 503)."""

    def __init__(
        self, service: Service, token: str | None, version: str, openapi: dict[str, Any]
    ) -> None:
        self.service, self.token, self.version, self.openapi = service, token, version, openapi
        s = service
        table: list[tuple[str, str, Route]] = [
            ("GET", "/v1/openapi.json", self._openapi),
            ("POST", f"/v1/queues/{SEGMENT}/jobs", self._dispatch),
            ("POST", f"/v1/queues/{SEGMENT}/jobs/batch", self._dispatch_batch),
            ("DELETE", f"/v1/queues/{SEGMENT}/jobs", self._path(s.clear)),
            ("GET", "/v1/queues", self._none(s.queues)),
            ("GET", f"/v1/queues/{SEGMENT}", self._path(s.queue_stats)),
            ("POST", f"/v1/queues/{SEGMENT}/pause", self._pause(True)),
            ("POST", f"/v1/queues/{SEGMENT}/resume", self._pause(False)),
            ("GET", f"/v1/jobs/{SEGMENT}", self._path(s.job)),
            ("DELETE", f"/v1/jobs/{SEGMENT}", self._path(s.cancel)),
            ("GET", "/v1/failed", self._failed),
            ("DELETE", "/v1/failed", self._prune),
            ("POST", f"/v1/failed/{SEGMENT}/retry", self._path(s.retry_failed)),
            ("DELETE", f"/v1/failed/{SEGMENT}", self._path(s.delete_failed)),
        ]
        self.routes = [(m, re.compile(p + "$"), h) for m, p, h in table]

    async def handle(
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
            for route_method, pattern, handler in self.routes:
                match = pattern.match(path)
                # HEAD is GET without the body (RFC 9110): the host drops it.
                if match and method in (route_method, "HEAD" if route_method == "GET" else ""):
                    unknown = sorted(set(query) - QUERY_PARAMS.get(handler.__name__, set()))
                    if unknown:
                        # A typo (?limt=10) must not be silently ignored.
                        message = f"unknown query parameter(s): {', '.join(unknown)}"
                        raise ApiError(400, "invalid_query", message)
                    args = [unquote(g) for g in match.groups()]
                    status, result = await handler(*args, query=query, body=body, headers=headers)
                    return ApiReply(status, result)
            if allowed:
                raise ApiError(405, "method_not_allowed", f"{path} accepts {', '.join(allowed)}")
            raise ApiError(404, "not_found", f"no route {method} {path}")
        except ApiError as exc:
            extra = {"www-authenticate": "Bearer"} if exc.status == 401 else {}
            if exc.status == 405:
                extra["allow"] = ", ".join(["OPTIONS", *allowed])
            return _error(exc, extra)
        except Exception as exc:  # a bug or D1 failing: say so, never a bare 500
            print(f"d1queue api: {method} {path} failed: {traceback.format_exc()}")
            return _error(ApiError(500, "internal", f"{type(exc).__name__}: {exc}"))

    def _allowed(self, path: str) -> list[str]:
        """The methods routed for `path` (empty: no such path)."""
        if path == "/health":
            return ["GET", "HEAD"]
        methods = [m for m, pattern, _ in self.routes if pattern.match(path)]
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

    # -- adapters from HTTP to Service calls -----------------------------------------

    async def _openapi(self, **_: Any) -> tuple[int, Any]:
        return 200, self.openapi

    def _path(self, call: Callable[[str], Awaitable[Any]]) -> Route:
        async def handler(arg: str, **_: Any) -> tuple[int, Any]:
            return 200, await call(arg)

        return handler

    def _none(self, call: Callable[[], Awaitable[Any]]) -> Route:
        async def handler(**_: Any) -> tuple[int, Any]:
            return 200, await call()

        return handler

    def _pause(self, paused: bool) -> Route:
        async def handler(queue: str, **_: Any) -> tuple[int, Any]:
            return 200, await self.service.set_paused(queue, paused)

        return handler

    async def _dispatch(self, queue: str, *, body: bytes, **_: Any) -> tuple[int, Any]:
        result = await self.service.dispatch(queue, json_object(body))
        return (200 if result["deduplicated"] else 201), result

    async def _dispatch_batch(self, queue: str, *, body: bytes, **_: Any) -> tuple[int, Any]:
        obj = json_object(body)
        if set(obj) - {"jobs"}:
            raise ApiError(422, "invalid", 'the body is {"jobs": [...]} and nothing else')
        return 201, await self.service.dispatch_batch(queue, obj.get("jobs"))

    async def _failed(self, *, query: dict[str, list[str]], **_: Any) -> tuple[int, Any]:
        limit = _query(query, "limit", "50")
        if not re.fullmatch(r"\d{1,4}", limit):
            raise ApiError(400, "invalid_limit", "limit must be an integer from 1 to 500")
        return 200, await self.service.failed(
            _query(query, "queue", None), int(limit), _query(query, "cursor", None)
        )

    async def _prune(self, *, query: dict[str, list[str]], **_: Any) -> tuple[int, Any]:
        raw = _query(query, "older_than_s", None)
        try:
            value = float(raw) if raw is not None else None
        except ValueError:
            value = None
        if value is None or value != value:
            raise ApiError(400, "invalid_older_than_s", "older_than_s must be a number >= 0")
        return 200, await self.service.prune_failed(value)


def _query(query: dict[str, list[str]], key: str, default: Any) -> Any:
    values = query.get(key)
    return values[-1] if values else default


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
