"""The HTTP API under /v1, as plain Python: method, URL, headers and body in,
status, headers and a JSON body out. entry.py adapts the Worker's Request and
Response; tests drive it directly under CPython and through the real Worker.
The route table (ROUTES) is the one statement of what is routed and which
query parameters each route takes; openapi.py documents it from the same
table. The router (router.py) decides HEAD, OPTIONS, 404 and 405 as it does
for the dashboard; the API says them in JSON.
"""

from __future__ import annotations

import hmac
import json
import logging
import traceback
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlparse

from ..core.bounds import (
    MAX_JSON_DEPTH,
    MAX_OLDER_THAN_S,
    MAX_PAGE,
    STORED_NAME_RULE,
    json_depth,
)
from ..core.config import token_problem
from ..core.d1_faults import is_unavailable
from ..core.guard import CLIENT_HEADER, RETRY_AFTER_S, Guard
from ..core.log import event, get
from ..core.metrics import WINDOWS, wants_prometheus
from ..store.failed import FAILED_CURSOR_RULE
from ..store.workflows import COMPLETED_CURSOR_RULE
from .router import QueryParam, Reply, Route, Router, options_reply, without_body
from .service import UNAVAILABLE_RETRY_AFTER_S, ApiError, Service, too_deep, unavailable

log = get(__name__)

MAX_BODY_BYTES = 1024 * 1024
"""A request body, batch included: 100 jobs of ~10 KB, or fewer larger ones."""


TRACE_HEADER = "traceparent"
"""The W3C Trace Context header a push reads: its jobs join the producer's
trace (a job's own `traceparent` field wins)."""


def _trace(headers: Mapping[str, str]) -> str | None:
    """A push request's traceparent header (None: none sent; an empty one
    is sent, and refused), checked by the service."""
    value = headers.get(TRACE_HEADER)
    return None if value is None else value.strip()


ApiReply = Reply
"""What the API answers: `body` a JSON value, None for none (204, HEAD)."""

Endpoint = Callable[..., Awaitable[tuple[int, Any]]]
"""What a route runs: `(api, *path_args, query=..., body=..., headers=...)`
to `(status, body)`; `query` holds the route's own parameters, parsed."""

API_HEADERS = ("authorization", "accept", CLIENT_HEADER, TRACE_HEADER)
"""The request headers the API reads: the token, what the client accepts
(GET / sends a browser to the dashboard), the client's address (the guard),
the producer's W3C trace context (a push's jobs keep it).
The Worker glue hands the API these and no other."""

INDEX = {
    "name": "d1queue",
    "api": "/v1",
    "openapi": "/v1/openapi.json",
    "dashboard": "/ui",
    "health": "/health",
    "queues": "/v1/queues",
    "failed": "/v1/failed",
    "schedules": "/v1/schedules",
    "auth": "Authorization: Bearer <D1QUEUE_TOKEN> on every /v1 route",
}
"""GET / for a client: where things are, and nothing else (it is public).
Mounted under a prefix, each path has it before it (`index`)."""


def index(prefix: str = "") -> dict[str, str]:
    """INDEX for d1queue mounted at `prefix` ("" the root, else "/queue"):
    every path with the prefix before it, as a client must send it."""
    if not prefix:
        return dict(INDEX)
    shown = {k: prefix + v if v.startswith("/") else v for k, v in INDEX.items()}
    shown["auth"] = INDEX["auth"].replace(" /v1 ", f" {prefix}/v1 ")
    return shown


NO_STORE = {"cache-control": "no-store"}
"""On every answer: queue contents and errors are for the token's holder,
never for a shared cache or the browser's."""


class Api:
    """Routes requests to a Service. `token` is the D1QUEUE_TOKEN secret
    (None: not configured, and every route but /health answers 503).
    `guard` slows a client that sends wrong tokens (guard.py). `prefix`:
    where the Worker mounts d1queue ("" the root, else a path such as
    "/queue"); the API routes its paths without it, and puts it before
    every path it names (GET /'s links and redirect). `readonly_token`: the
    D1QUEUE_READONLY_TOKEN secret (None: none), which reads every GET route
    and is refused every other with 403 `read_only`."""

    def __init__(
        self,
        service: Service,
        token: str | None,
        version: str,
        openapi: dict[str, Any],
        guard: Guard | None = None,
        *,
        prefix: str = "",
        readonly_token: str | None = None,
    ) -> None:
        self.service, self.token, self.version, self.openapi = service, token, version, openapi
        self.readonly_token = readonly_token
        self.guard = guard if guard is not None else Guard()
        self.prefix = prefix
        self.router = Router((INDEX_ROUTE, HEALTH, *ROUTES))

    def authorized(self, headers: Mapping[str, str], method: str = "POST") -> bool:
        """Whether the request carries a token that may send it (the API
        token; the read-only one for GET and HEAD only): checked before its
        body is read (entry.py), so no one without the token makes the
        Worker read a body."""
        try:
            self._authorize(headers, method)
        except ApiError:
            return False
        return True

    async def handle(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> ApiReply:
        reply = await self._handle(method, url, headers, body)
        reply.headers.update(NO_STORE)
        if isinstance(reply.body, Exposition):
            reply.headers["content-type"] = reply.body.content_type
        elif reply.body is not None:
            reply.headers["content-type"] = "application/json"
        return without_body(method, reply)

    async def _handle(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> ApiReply:
        parsed = urlparse(url)
        path, query = parsed.path, parse_qs(parsed.query, keep_blank_values=True)
        found = self.router.resolve(method, path)
        if found.status == 204:  # OPTIONS (RFC 9110): no token needed to ask
            return options_reply(found)
        try:
            # /health answers without the token and whatever its query (a
            # probe's cache-buster must not fail it), and so does a 405 there.
            if not found.public:
                self._authorize(headers, method)
            if found.status == 404:
                raise ApiError(404, "not_found", f"no route {method} {path}")
            if found.status == 405:
                accepts = ", ".join(found.methods)
                raise ApiError(405, "method_not_allowed", f"{path} accepts {accepts}")
            assert found.route is not None
            route, args = found.route, list(found.args)
            params = {} if route.public else route.parse_query(query)
            status, result = await route.handler(
                self, *args, query=params, body=body, headers=headers
            )
            return ApiReply(status, result)
        except Redirect as to:
            return ApiReply(303, None, {"location": to.location})
        except ApiError as exc:
            # A wrong token is a guess and pays for it; no token at all is not.
            guessed = exc.status == 401 and bool(headers.get("authorization", "").strip())
            if guessed and await self.guard.failed(headers):
                return _too_many_attempts()
            extra = {"www-authenticate": "Bearer"} if exc.status == 401 else {}
            if exc.status == 405:
                extra["allow"] = found.allow
            return _error(exc, extra)
        except Exception as exc:
            if is_unavailable(exc):  # D1 failing past the binding's re-sends: come back
                event(
                    log,
                    "d1queue.api.unavailable",
                    logging.WARNING,
                    request=f"{method} {path}",
                    error=f"{type(exc).__name__}: {exc}",
                )
                return _error(unavailable(), {"retry-after": str(UNAVAILABLE_RETRY_AFTER_S)})
            # A bug, or D1 refusing the statement: the details are for the
            # log, not the client (they may hold SQL, a payload, a stack).
            event(
                log,
                "d1queue.api.failed",
                logging.ERROR,
                request=f"{method} {path}",
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(),
            )
            message = "the request failed inside the Worker; its log says why (d1queue.api.failed)"
            return _error(ApiError(500, "internal", message))

    def _authorize(self, headers: Mapping[str, str], method: str) -> None:
        """The API token passes any request; the read-only token a GET or
        HEAD (every GET route reads only), and is refused anything else
        with 403 before its body is read; anything else is a 401."""
        if not self.token:
            raise ApiError(
                503,
                "not_configured",
                "no API token is configured: set the D1QUEUE_TOKEN secret "
                "(wrangler secret put D1QUEUE_TOKEN; .dev.vars locally)",
            )
        if bearer_matches(headers, self.token):
            return
        if self.readonly_token and bearer_matches(headers, self.readonly_token):
            if method in ("GET", "HEAD"):
                return
            raise ApiError(
                403,
                "read_only",
                "the read-only token (D1QUEUE_READONLY_TOKEN) reads and changes nothing: "
                "send this request with the API token",
            )
        raise ApiError(401, "unauthorized", "missing or wrong bearer token")

    # -- endpoints: from HTTP to Service calls ------------------------------------

    async def _index(self, *, headers: Mapping[str, str], **_: Any) -> tuple[int, Any]:
        if prefers_html(headers.get("accept", "")):
            raise Redirect(self.prefix + "/ui")
        return 200, index(self.prefix)

    async def _health(self, **_: Any) -> tuple[int, Any]:
        return 200, {"ok": True, "version": self.version}

    async def _openapi(self, **_: Any) -> tuple[int, Any]:
        return 200, self.openapi

    async def _dispatch(
        self, queue: str, *, body: bytes, headers: Mapping[str, str], **_: Any
    ) -> tuple[int, Any]:
        result = await self.service.dispatch(queue, json_object(body), _trace(headers))
        return (200 if result["deduplicated"] else 201), result

    async def _cancel(self, id: str, **_: Any) -> tuple[int, Any]:
        result = await self.service.cancel(id)
        # A running job is marked, not yet ended: accepted, its drain ends it.
        return (202 if result.get("state") == "cancelling" else 200), result

    async def _dispatch_job(
        self, *, body: bytes, headers: Mapping[str, str], **_: Any
    ) -> tuple[int, Any]:
        result = await self.service.dispatch_job(json_object(body), _trace(headers))
        return (200 if result["deduplicated"] else 201), result

    async def _dispatch_batch(
        self, queue: str, *, body: bytes, headers: Mapping[str, str], **_: Any
    ) -> tuple[int, Any]:
        obj = json_object(body)
        if set(obj) - {"jobs"}:
            raise ApiError(422, "invalid", 'the body is {"jobs": [...]} and nothing else')
        return 201, await self.service.dispatch_batch(queue, obj.get("jobs"), _trace(headers))

    async def _batch(self, *, body: bytes, headers: Mapping[str, str], **_: Any) -> tuple[int, Any]:
        return 201, await self.service.batch(json_object(body), _trace(headers))

    async def _add_to_batch(
        self, id: str, *, body: bytes, headers: Mapping[str, str], **_: Any
    ) -> tuple[int, Any]:
        obj = json_object(body)
        unknown = sorted(set(obj) - {"jobs"})
        if unknown:
            message = f'unknown field(s): {", ".join(unknown)} (the body is {{"jobs": [...]}})'
            raise ApiError(422, "invalid", message)
        return 201, await self.service.add_to_batch(id, obj.get("jobs"), _trace(headers))

    async def _completed(self, queue: str, *, query: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.service.completed(queue, query["limit"], query["cursor"])

    async def _pause(self, queue: str, **_: Any) -> tuple[int, Any]:
        return 200, await self.service.set_paused(queue, True)

    async def _resume(self, queue: str, **_: Any) -> tuple[int, Any]:
        return 200, await self.service.set_paused(queue, False)

    async def _put_limits(self, queue: str, *, body: bytes, **_: Any) -> tuple[int, Any]:
        return 200, await self.service.set_limits(queue, json_object(body))

    async def _queues(self, **_: Any) -> tuple[int, Any]:
        return 200, await self.service.queues()

    async def _failed(self, *, query: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.service.failed(query["queue"], query["limit"], query["cursor"])

    async def _prune(self, *, query: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.service.prune_failed(query["older_than_s"])

    async def _put_schedule(self, *, body: bytes, **_: Any) -> tuple[int, Any]:
        created, result = await self.service.put_schedule(json_object(body))
        return (201 if created else 200), result

    async def _metrics(
        self, *, query: dict[str, Any], headers: Mapping[str, str], **_: Any
    ) -> tuple[int, Any]:
        text = wants_prometheus(headers.get("accept", ""))
        if text is not None:
            body = await self.service.metrics_text(openmetrics=text == "openmetrics")
            return 200, Exposition(body, text)
        return 200, await self.service.metrics(query["window"], query["queue"], query["name"])

    async def _schedules(self, *, query: dict[str, Any], **_: Any) -> tuple[int, Any]:
        return 200, await self.service.schedules(query["limit"], query["cursor"])


TRACED = frozenset(
    {Api._dispatch, Api._dispatch_job, Api._dispatch_batch, Api._batch, Api._add_to_batch}
)
"""The push routes: they read the traceparent header (TRACE_HEADER), as the
OpenAPI document says."""


def _on_path(call: Callable[[Service, str], Awaitable[Any]]) -> Endpoint:
    """An endpoint calling `Service.<call>` with the path's one parameter."""

    async def endpoint(api: Api, arg: str, **_: Any) -> tuple[int, Any]:
        return 200, await call(api.service, arg)

    return endpoint


def paged(cursor_rule: str, default: int = 50) -> tuple[QueryParam, QueryParam]:
    """A listing's query: how many rows a page holds (`limit`, 1 to
    MAX_PAGE, `default` when not sent) and where it starts (`cursor`, of
    `cursor_rule`'s shape, as the last page's next_cursor gives it)."""
    return (
        QueryParam("limit", "integer", minimum=1, maximum=MAX_PAGE, default=default),
        QueryParam("cursor", "string", pattern=cursor_rule),
    )


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
    Route("GET", "/v1/queues/{queue}/limits", _on_path(Service.limits)),
    Route("PUT", "/v1/queues/{queue}/limits", Api._put_limits),
    Route(
        "GET", "/v1/queues/{queue}/completed", Api._completed, query=paged(COMPLETED_CURSOR_RULE)
    ),
    Route("GET", "/v1/jobs/{id}", _on_path(Service.job)),
    Route("DELETE", "/v1/jobs/{id}", Api._cancel),
    Route("POST", "/v1/batches", Api._batch),
    Route("GET", "/v1/batches/{id}", _on_path(Service.batch_state)),
    Route("POST", "/v1/batches/{id}/jobs", Api._add_to_batch),
    Route(
        "GET",
        "/v1/failed",
        Api._failed,
        query=(
            QueryParam("queue", "string", pattern=STORED_NAME_RULE),
            *paged(FAILED_CURSOR_RULE),
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
    Route(
        "GET",
        "/v1/metrics",
        Api._metrics,
        query=(
            QueryParam("window", "string", pattern="(?:" + "|".join(WINDOWS) + ")", default="1h"),
            QueryParam("queue", "string", pattern=STORED_NAME_RULE),
            QueryParam("name", "string", pattern=STORED_NAME_RULE),
        ),
    ),
    Route("POST", "/v1/schedules", Api._put_schedule),
    Route("GET", "/v1/schedules", Api._schedules, query=paged(STORED_NAME_RULE, default=100)),
    Route("GET", "/v1/schedules/{id}", _on_path(Service.schedule)),
    Route("DELETE", "/v1/schedules/{id}", _on_path(Service.delete_schedule)),
    Route("POST", "/v1/schedules/{id}/pause", _on_path(Service.pause_schedule)),
    Route("POST", "/v1/schedules/{id}/resume", _on_path(Service.resume_schedule)),
)
"""Every route but /health, each documented by openapi.py. Order matters only
where two paths could match the same URL; none do."""

INDEX_ROUTE = Route("GET", "/", Api._index, public=True)
"""Where a first visit lands: a browser (Accept prefers text/html) is sent to
the dashboard, 303 to <prefix>/ui; a client gets INDEX, prefixed (`index`).
Public, as it reveals nothing but the routes; documented by hand, as
/health is."""

HEALTH = Route("GET", "/health", Api._health, public=True)
"""Liveness: public, so answered before the token is checked (a load
balancer's probe holds none) and with any query; documented by hand."""


class Redirect(Exception):
    """A route's answer is elsewhere: 303 to `location`."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


class Exposition(str):
    """A body sent as the text it is, not as JSON: the Prometheus
    exposition of GET /v1/metrics, with its content type."""

    content_type: str

    def __new__(cls, text: str, kind: str) -> Exposition:
        made = super().__new__(cls, text)
        made.content_type = (
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
            if kind == "openmetrics"
            else "text/plain; version=0.0.4; charset=utf-8"
        )
        return made


def prefers_html(accept: str) -> bool:
    """Whether an Accept header asks for text/html over JSON: text/html (or
    text/*) named with a q above application/json's (a tie goes to JSON).
    A browser's navigation does; curl's */* and an API client's
    application/json do not."""
    html = json_ = 0.0
    for item in accept.split(","):
        kind, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        kind = kind.lower()
        if kind in ("text/html", "application/xhtml+xml", "text/*"):
            html = max(html, q)
        elif kind in ("application/json", "application/*"):
            json_ = max(json_, q)
    return html > json_


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


def bearer_matches(headers: Mapping[str, str], token: str) -> bool:
    """Whether the request's Authorization is `Bearer <token>`, compared in
    constant time (a timing difference would spell the token out)."""
    scheme, _, credential = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        credential.strip().encode(), token.encode()
    )


MISCONFIGURED = "the Worker's configuration is invalid; its log says why (d1queue.misconfigured)"
"""What a caller without the token reads while the configuration is invalid."""


async def misconfigured(
    reason: str,
    token: str | None,
    method: str,
    path: str,
    headers: Mapping[str, str],
    guard: Guard | None = None,
) -> ApiReply:
    """The answer to any request (the API, /health, the dashboard) while the
    Worker's `D1QUEUE_*` configuration is invalid: 500 `misconfigured`.

    `reason` (the ConfigError's text) may quote a var's value, and
    D1QUEUE_HTTP_ALLOW's names internal hosts: it goes to the log, one JSON
    line, and into the answer only for a caller holding the valid token.
    A token that is itself invalid (too short) signs in nobody. A wrong
    token is a guess as on any route, slowed by the guard (the detail tells
    the right token from a wrong one)."""
    event(log, "d1queue.misconfigured", logging.ERROR, request=f"{method} {path}", error=reason)
    usable = token if token and token_problem(token) is None else None
    if usable is not None and bearer_matches(headers, usable):
        return _error(ApiError(500, "misconfigured", reason))
    if headers.get("authorization", "").strip() and await (guard or Guard()).failed(headers):
        return _too_many_attempts()
    return _error(ApiError(500, "misconfigured", MISCONFIGURED))


def _too_many_attempts() -> ApiReply:
    exc = ApiError(429, "too_many_attempts", "too many wrong tokens: wait, then retry")
    return _error(exc, {"retry-after": str(RETRY_AFTER_S)})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _error(exc: ApiError, headers: dict[str, str] | None = None) -> ApiReply:
    return ApiReply(exc.status, exc.body(), headers or {})
