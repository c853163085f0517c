"""A client for Python code that pushes jobs to a d1queue Worker: over HTTP
(the /v1 API and its bearer token) or over a service binding (RPC), with one
interface and d1queue's own errors either way.

    client = Client.over_binding(self.env.QUEUE)          # in a Python Worker
    client = Client.over_http("https://q.example.workers.dev", token)
    pushed = await client.push("mail", "mail.send", {"to": "a@example.com"}, unique_key="k")
    state = await client.job(pushed["id"])

A refusal raises ClientError (an ApiError) with the status and code the HTTP
API answers for the same input, over either transport. Over HTTP a redirect
is never followed: a 3xx answer is ClientError `redirected`, naming its
Location, and nothing is sent there (the request carries the bearer token,
and a POST re-sent as GET would read another server's JSON as d1queue's
answer). Runs under CPython and
in Pyodide; `pyodide` and `js` are imported only when a Worker's
transport is used, never at import.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from .service import ApiError, check_path_id, check_queue

Fetch = Callable[[str, str, dict[str, str], bytes | None], Awaitable[tuple[int, bytes]]]
"""`(method, url, headers, body)` to `(status, body)`: how the HTTP transport
sends a request. Tests pass one that calls `Api.handle` in-process. It must
not follow redirects: a 3xx status it answers is a ClientError `redirected`
(the default fetches raise it themselves, naming the Location)."""

ERROR_STATUS: dict[str, int] = {
    "malformed_json": 400,
    "invalid_queue": 400,
    "invalid_window": 400,
    "invalid_name": 400,
    "invalid_id": 400,
    "invalid_limit": 400,
    "invalid_cursor": 400,
    "invalid_query": 400,
    "invalid_older_than_s": 400,
    "unauthorized": 401,
    "read_only": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "reserved": 409,  # a cancel of a running job, as Workers before 202 cancelling answered it
    "ended": 409,
    "batch_not_running": 409,
    "declared_in_code": 409,
    "payload_too_large": 413,
    "invalid": 422,
    "too_deep": 422,
    "unknown_job": 422,
    "unknown_dependency": 422,
    "too_many_dependents": 422,
    "too_many_edges": 422,
    "invalid_cron": 422,
    "unknown_timezone": 422,
    "too_many_attempts": 429,
    "internal": 500,
    "misconfigured": 500,
    "not_configured": 503,
    "unavailable": 503,
}
"""The HTTP status of each error code: an RPC error carries only its code
(its message is "<code>: <message>"), so the status comes from here."""

_RPC_ERROR = re.compile(r"^(?:[A-Za-z]*Error: )?([a-z][a-z0-9_]*): (.*)$", re.DOTALL)
"""A d1queue error as a calling Worker sees it: "<code>: <message>", perhaps
behind the JS error's name."""


class ClientError(ApiError):
    """d1queue refused a request: `status`, `code` and `message` are the HTTP
    API's (docs/api.md, "Status codes and errors"), over HTTP or RPC."""


class Client:
    """Push jobs and read their state. Build one with `over_http` or
    `over_binding`; every method answers the API's JSON as plain Python."""

    def __init__(self, transport: _Transport) -> None:
        self._transport = transport

    @classmethod
    def over_http(cls, base_url: str, token: str, fetch: Fetch | None = None) -> Client:
        """Over the HTTP API at `base_url` (no trailing /v1), with the
        D1QUEUE_TOKEN secret. `fetch`: how to send (default: the Workers
        runtime's fetch in Pyodide, urllib in a thread under CPython)."""
        return cls(_Http(base_url.rstrip("/"), token, fetch or _default_fetch()))

    @classmethod
    def over_binding(cls, binding: Any) -> Client:
        """Over a service binding to the d1queue Worker (`self.env.QUEUE`)."""
        return cls(_Rpc(binding))

    async def push(
        self, queue: str | None, name: str, payload: Any = None, /, **options: Any
    ) -> dict[str, Any]:
        """Push one job: `options` are the job's other fields (delay_s,
        max_attempts, priority, unique_key, group, debounce_s, partition,
        after, ignore_failed, traceparent: the producer's W3C trace context,
        whose trace the job's runs log). `after`: 1 to 100 ids of jobs on the same
        shard it waits for (422 unknown_dependency for one that is not
        there, too_many_dependents for one that 100 jobs wait for already).
        `queue` None: the job's registered queue (or `queue=` among
        the options, as POST /v1/jobs takes it). Answers {id, queue,
        deduplicated, paused, runs_here, warnings}."""
        job = {"name": name, "payload": payload, **options}
        if queue is None:
            return await self._transport.call("dispatch_job", job)
        return await self._transport.call("dispatch", _segment(check_queue, queue), job)

    async def push_batch(self, queue: str, jobs: list[Mapping[str, Any]]) -> dict[str, Any]:
        """Push 1 to 100 jobs ({name, payload?, ...} each) to `queue`, all or
        nothing. Answers {ids, deduplicated, paused, runs_here, warnings}."""
        return await self._transport.call(
            "dispatch_batch", _segment(check_queue, queue), list(jobs)
        )

    async def job(self, id: str) -> dict[str, Any]:
        """A job's state: waiting, ready, delayed, reserved, completed (with
        its result, while kept) or failed; with its after, batch and
        dependents (404 not_found once it is no longer kept)."""
        return await self._transport.call("job", _segment(check_path_id, id))

    async def completed(
        self, queue: str, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        """A page of `queue`'s completed jobs, newest first, with their
        results: {jobs, next_cursor} (pass next_cursor for the next page)."""
        return await self._transport.call("completed", _segment(check_queue, queue), limit, cursor)

    async def batch(
        self,
        jobs: list[Mapping[str, Any]],
        *,
        on_success: Mapping[str, Any] | None = None,
        on_failure: Mapping[str, Any] | None = None,
        on_finish: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Push a workflow batch of 1 to 1,000 jobs ({name, payload?, queue?,
        after?, ...} each, as `push` takes them by name), all or nothing,
        with callback jobs ({name, payload?, queue?, max_attempts?,
        priority?, unique_key?}) each enqueued exactly once: on_success when
        every job completed, on_failure at the first that failed for good,
        on_finish when every job ended. Answers {batch, ids}."""
        body: dict[str, Any] = {"jobs": list(jobs)}
        for kind, callback in (
            ("on_success", on_success),
            ("on_failure", on_failure),
            ("on_finish", on_finish),
        ):
            if callback is not None:
                body[kind] = dict(callback)
        return await self._transport.call("batch", body)

    async def batch_state(self, id: str) -> dict[str, Any]:
        """A batch's progress: {id, total, pending, completed, failed, state,
        created_at, finished_at, ids}."""
        return await self._transport.call("batch_state", _segment(check_path_id, id))

    async def add_to_batch(self, id: str, jobs: list[Mapping[str, Any]]) -> dict[str, Any]:
        """Add jobs to a running batch: {ids}; 409 batch_not_running once
        every job of it ended."""
        return await self._transport.call("add_to_batch", _segment(check_path_id, id), list(jobs))

    async def cancel(self, id: str) -> dict[str, Any]:
        """Cancel a job: one no worker holds is deleted ({id, cancelled:
        True}); a running one is marked and its drain ends it cancelled
        ({id, cancelled: False, state: "cancelling"}); one that already
        ended raises ClientError 409 `ended`, an unknown id 404."""
        return await self._transport.call("cancel", _segment(check_path_id, id))

    async def stats(self, queue: str | None = None) -> dict[str, Any]:
        """One queue's stats, or every queue's ({queues: [...]}) without one."""
        if queue is None:
            return await self._transport.call("stats")
        return await self._transport.call("stats", _segment(check_queue, queue))

    async def metrics(
        self, window: str = "1h", queue: str | None = None, name: str | None = None
    ) -> dict[str, Any]:
        """Job metrics per queue and name over `window` ("1h", "24h", "7d"),
        optionally of one queue and one job name: {window, step_s, from, to,
        metrics: [{queue, name, counts, wait, run, total, series}]}."""
        return await self._transport.call("metrics", window, queue, name)

    async def limits(self, queue: str) -> dict[str, Any]:
        """A queue's flow limits and their use now ({queue, limits, source,
        running, running_by_group})."""
        return await self._transport.call("limits", _segment(check_queue, queue))

    async def set_limits(self, queue: str, **limits: Any) -> dict[str, Any]:
        """Replace a queue's flow limits: `concurrency`, `group_concurrency`
        (int or None), `rate`, `group_rate` ({"limit": N, "period_s": S} or
        None); a kind not given is none. Answers as `limits`."""
        return await self._transport.call("set_limits", _segment(check_queue, queue), limits)


def _segment(check: Callable[[Any], str], value: Any) -> str:
    """A path segment checked on this side as the Worker checks a name it
    writes under (same status and code): over HTTP a value holding "/" or
    "?", or of dots alone (a dot-segment, which the URL parser resolves:
    `/v1/queues/../jobs` is `/v1/jobs`), must not reach another route, and
    over either transport nothing is sent for it."""
    try:
        return check(value)
    except ApiError as exc:
        raise ClientError(exc.status, exc.code, exc.message) from None


class _Transport:
    async def call(self, method: str, *args: Any) -> dict[str, Any]:
        raise NotImplementedError


class _Http(_Transport):
    """The RPC methods as the HTTP routes they mirror."""

    def __init__(self, base: str, token: str, fetch: Fetch) -> None:
        self.base, self.token, self.fetch = base, token, fetch

    async def call(self, method: str, *args: Any) -> dict[str, Any]:
        # Escaped whole anyway: _segment refused "/" and "?", and the rules
        # may one day allow a character a URL holds specially.
        seg = [quote(str(a), safe="") for a in args if isinstance(a, str)]
        if method == "dispatch":
            return await self._send("POST", f"/v1/queues/{seg[0]}/jobs", args[1])
        if method == "dispatch_job":
            return await self._send("POST", "/v1/jobs", args[0])
        if method == "dispatch_batch":
            return await self._send("POST", f"/v1/queues/{seg[0]}/jobs/batch", {"jobs": args[1]})
        if method == "job":
            return await self._send("GET", f"/v1/jobs/{seg[0]}")
        if method == "cancel":
            return await self._send("DELETE", f"/v1/jobs/{seg[0]}")
        if method == "completed":
            query = {k: v for k, v in (("limit", args[1]), ("cursor", args[2])) if v is not None}
            path = f"/v1/queues/{seg[0]}/completed"
            return await self._send("GET", path + (f"?{urlencode(query)}" if query else ""))
        if method == "batch":
            return await self._send("POST", "/v1/batches", args[0])
        if method == "batch_state":
            return await self._send("GET", f"/v1/batches/{seg[0]}")
        if method == "add_to_batch":
            return await self._send("POST", f"/v1/batches/{seg[0]}/jobs", {"jobs": args[1]})
        if method == "stats":
            return await self._send("GET", f"/v1/queues/{seg[0]}" if seg else "/v1/queues")
        if method == "metrics":
            names = ("window", "queue", "name")
            query = {k: v for k, v in zip(names, args, strict=True) if v is not None}
            return await self._send("GET", f"/v1/metrics?{urlencode(query)}")
        if method == "limits":
            return await self._send("GET", f"/v1/queues/{seg[0]}/limits")
        if method == "set_limits":
            return await self._send("PUT", f"/v1/queues/{seg[0]}/limits", args[1])
        raise AssertionError(f"no route for {method}")

    async def _send(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = _json_bytes(body)
            headers["content-type"] = "application/json"
        status, raw = await self.fetch(method, self.base + path, headers, data)
        if 300 <= status < 400:  # a fetch of the caller's own that does not say where
            raise _redirected(status, method, path, None)
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        if 200 <= status < 300 and isinstance(answer, dict):
            return answer
        error = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            raise ClientError(status, error["code"], str(error.get("message", "")))
        # Not d1queue's answer (a proxy's error page, say): its status, in words.
        text = raw[:200].decode("utf-8", "replace")
        raise ClientError(status, "http_error", f"HTTP {status} from {path}: {text}")


def _redirected(status: int, method: str, url: str, location: str | None) -> ClientError:
    """A 3xx answer, refused rather than followed: whoever answers the
    Location would receive the bearer token (and a POST re-sent as a GET
    would read that server's JSON as a pushed job)."""
    where = f"to {location!r}" if location else "(no Location given)"
    return ClientError(
        status,
        "redirected",
        f"{method} {url} answered {status}, a redirect {where}; the client follows none: "
        "point it at the d1queue Worker's own URL",
    )


def _json_bytes(body: Any) -> bytes:
    """A request body as JSON: a value JSON cannot hold is refused as the API
    refuses a body it cannot read (422 invalid), before anything is sent."""
    try:
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ClientError(422, "invalid", f"the job is not JSON: {exc}") from None


class _Rpc(_Transport):
    """The binding's RPC methods, arguments converted to plain JS values and
    results back to plain Python; a d1queue refusal becomes a ClientError."""

    def __init__(self, binding: Any) -> None:
        self.binding = binding

    async def call(self, method: str, *args: Any) -> dict[str, Any]:
        # JSON-shaped only: what crosses RPC is what the HTTP API would accept.
        sent = [json.loads(_json_bytes(a)) for a in args]
        try:
            result = await getattr(self.binding, method)(*[_to_js(a) for a in sent])
        except Exception as exc:
            found = _RPC_ERROR.match(str(exc))
            if found is None or found.group(1) not in ERROR_STATUS:
                raise  # not d1queue's refusal (the binding or the network failed)
            code, message = found.group(1), found.group(2)
            raise ClientError(ERROR_STATUS[code], code, message) from None
        plain = _to_py(result)
        if not isinstance(plain, dict):
            raise TypeError(f"{method} answered {type(plain).__name__}, not an object")
        return plain


def _in_pyodide() -> bool:
    return sys.platform == "emscripten"


def _to_js(value: Any) -> Any:
    """A dict or list as a plain JS value when the binding is a raw JS object
    (a Python dict would cross as a PyProxy, which RPC cannot send); as is
    under CPython and for the SDK's wrapped bindings, which convert."""
    if not _in_pyodide() or not isinstance(value, dict | list):
        return value
    from js import Object  # only inside the Worker
    from pyodide.ffi import to_js

    return to_js(value, dict_converter=Object.fromEntries)


def _to_py(value: Any) -> Any:
    """An RPC result as plain Python: JsProxy (to_py) and the SDK's JsDict
    (a dict with attribute access) both become dicts and lists."""
    to_py = getattr(value, "to_py", None)
    if callable(to_py):
        value = to_py()
    if isinstance(value, Mapping):
        return {str(k): _to_py(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_py(v) for v in value]
    return value


def _default_fetch() -> Fetch:
    return _workers_fetch if _in_pyodide() else _urllib_fetch


async def _workers_fetch(
    method: str, url: str, headers: dict[str, str], body: bytes | None
) -> tuple[int, bytes]:
    # Pyodide's own fetch (the Worker's global fetch underneath): the workers
    # SDK stays the glue's alone. Only in a Worker; never at import.
    from pyodide.http import pyfetch

    # "manual": a redirect is answered as it is, not followed with the token.
    options: dict[str, Any] = {"method": method, "headers": headers, "redirect": "manual"}
    if body is not None:
        options["body"] = body.decode("utf-8")
    response = await pyfetch(url, **options)
    status = int(response.status)
    if 300 <= status < 400:
        raise _redirected(status, method, url, response.headers.get("location"))
    return status, (await response.string()).encode("utf-8")


async def _urllib_fetch(
    method: str, url: str, headers: dict[str, str], body: bytes | None
) -> tuple[int, bytes]:
    def send() -> tuple[int, bytes]:
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with _OPENER.open(request, timeout=30) as reply:
                return int(reply.status), bytes(reply.read())
        except urllib.error.HTTPError as exc:  # a 3xx, 4xx or 5xx is an answer
            if 300 <= exc.code < 400:
                raise _redirected(exc.code, method, url, exc.headers.get("location")) from None
            return int(exc.code), bytes(exc.read())

    return await asyncio.to_thread(send)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handler would re-send the request, Authorization
    included, to any Location (and a POST as a GET): this one follows none,
    so a 3xx reaches the caller as an HTTPError."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)
"""urllib's default handlers (proxies from the environment, HTTPS) but for
redirects, which are never followed."""
