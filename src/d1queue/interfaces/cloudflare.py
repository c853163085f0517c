"""d1queue inside a Cloudflare Python Worker: the glue between the runtime
and the library.

The one module of the package that imports the `workers` SDK and Pyodide's
`js` and `pyodide`: `import d1queue` and every other module work under plain
CPython, but importing this one there fails (there is no `js` outside a
Worker). A Worker gets the whole queue, HTTP API, dashboard, RPC, cron and
wake-up consumer, in a few lines, either way (docs/library.md):

    from d1queue.interfaces.cloudflare import d1queue_entrypoint
    from jobs import registry

    class Default(d1queue_entrypoint(registry, prefix="/queue")):
        async def fetch(self, request):
            ...  # the Worker's own routes; then:
            return await super().fetch(request)

or, from the Worker's own `WorkerEntrypoint` handlers:

    await d1queue_fetch(request, self.env, self.ctx, registry)  # None: not d1queue's path
    await d1queue_scheduled(controller, self.env, self.ctx, registry)
    await d1queue_queue(batch, self.env, self.ctx, registry)

The prefix is `prefix=` or, when the code gives none, the Worker's
D1QUEUE_PREFIX var (the root by default); the offline host prints its
links under the var. The RPC methods are those of `D1QueueEntrypoint`; a
class made by `d1queue_entrypoint` has them as its own.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from pyodide import ffi
from workers import Response, WorkerEntrypoint, fetch

from ..core import telemetry
from ..core.config import Config, ConfigError, mount_prefix, resolve_prefix
from ..core.guard import AUTH_LIMITER_BINDING, CLIENT_HEADER, Guard
from ..core.limits import PLANS, Meter
from ..core.log import event, install
from ..core.registry import Registry
from ..features.after_push import AfterPush
from ..features.analytics import ANALYTICS_BINDING, Points
from ..features.cron import cron
from ..features.drain import drain
from ..features.http_request import JOB_NAME as HTTP_JOB
from ..features.http_request import register_http_job
from ..features.wake import WAKE_BINDING, Waker, consume
from ..store.queue import D1Queue
from ..store.schedules import DUE_LIMITS, trigger_grace_ms
from ..store.shardset import ShardQueue, ShardSet
from .api import (
    API_HEADERS,
    MAX_BODY_BYTES,
    NO_STORE,
    TRACE_HEADER,
    Api,
    Exposition,
    json_object,
    misconfigured,
)
from .dashboard import Dashboard, is_dashboard_path
from .openapi import document
from .service import ApiError, Service

__all__ = [
    "D1QueueEntrypoint",
    "D1QueueWorker",
    "config_from_env",
    "d1queue_entrypoint",
    "d1queue_fetch",
    "d1queue_queue",
    "d1queue_scheduled",
    "mount_prefix",
]

JS_NULL: Any = getattr(ffi, "jsnull", None)

log = install()  # the d1queue logger's JSON lines on the Worker's console


def _version() -> str:
    from .. import __version__  # the package's root, read once the package is loaded

    return __version__


# -- bodies and outbound requests -------------------------------------------------


async def _read_stream(stream: Any, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of a JS ReadableStream, and whether it held more:
    the rest is cancelled, never read nor held (a body may be any size; the
    isolate has 128 MB)."""
    # No body (GET, HEAD, 204, 304, or any request sent without one, such as
    # a bare DELETE or the host's OPTIONS probe) is JS null, which Pyodide
    # hands over as jsnull (None before jsnull existed), never as a stream.
    if stream is None or stream is JS_NULL:
        return b"", False
    reader = stream.getReader()
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await reader.read()
        if chunk.done:
            return b"".join(chunks), False
        data = bytes(chunk.value.to_bytes())
        chunks.append(data)
        size += len(data)
        if size > limit:
            await reader.cancel()
            return b"".join(chunks)[:limit], True


def _abort(controller: Any) -> None:
    """Abort a job's request (an AbortController), if it is still going."""
    if controller is not None:
        with contextlib.suppress(ffi.JsException):  # already settled: nothing to close
            controller.abort()


class _FetchReply:
    """A Workers fetch response as d1queue.core.outbound reads one: the body
    is read from its stream up to a limit, never whole (a target may answer
    with any size; the isolate has 128 MB)."""

    def __init__(self, response: Any, controller: Any = None) -> None:
        self._response = getattr(response, "js_object", response)  # the JS Response
        self.status = int(self._response.status)
        self._controller = controller
        """The request's AbortController: a read cancelled (its job was)
        aborts the body's download, closing the connection."""

    def header(self, name: str) -> str | None:
        value = self._response.headers.get(name)
        return None if value is None else str(value)

    async def read(self, limit: int) -> bytes:
        try:
            data, _ = await _read_stream(self._response.body, limit)
        except BaseException:
            _abort(self._controller)
            raise
        return data

    async def cancel(self) -> None:
        stream = self._response.body
        if stream is not None and not stream.locked:
            await stream.cancel()


class _JobFetch:
    """The Workers fetch as d1queue.core.outbound sends a job's requests:
    one request, redirects not followed, and `read_url`, the runtime's own
    URL parser, so the host outbound checks is the host fetch connects to."""

    async def __call__(
        self,
        url: str,
        *,
        method: str,
        headers: dict[str, str],
        body: str | None,
        service: Any,
        env: Any,
    ) -> _FetchReply:
        # Redirects are followed by d1queue.core.outbound, which checks every
        # hop against the deployment's rules; the platform would follow them blind.
        from js import AbortController  # only exists inside the Worker

        # A job cancelled while it waits for the answer (its drain's cancel
        # watch, or its timeout) aborts the request: awaiting the promise
        # alone would stop the Python side and leave the target's
        # connection open until it answered.
        controller = AbortController.new()
        options: dict[str, Any] = {
            "method": method,
            "headers": headers,
            "redirect": "manual",
            "signal": controller.signal,
        }
        if body is not None:
            options["body"] = body
        try:
            if service is not None:
                binding = getattr(env, service, None)
                if binding is None:  # outbound.send checked it; a binding cannot vanish
                    raise LookupError("the service binding is not available")
                return _FetchReply(await binding.fetch(url, **options), controller)
            return _FetchReply(await fetch(url, **options), controller)
        except BaseException:
            _abort(controller)
            raise

    @staticmethod
    def read_url(url: str, base: str | None = None, /) -> str:
        """`url` as the runtime's WHATWG parser writes it (`new URL(url,
        base).href`): host lower-cased, IDNA to ASCII by current Unicode,
        addresses in their one form. Python cannot parse as it does: a code
        point its IDNA drops (U+2064) or reads as a digit (U+1FBF1) would
        otherwise hide an internal address from the check."""
        from js import URL  # only exists inside the Worker

        try:
            parsed = URL.new(url) if base is None else URL.new(url, base)
        except ffi.JsException:
            raise ValueError("the URL is not valid") from None
        return str(parsed.href)


job_fetch = _JobFetch()
"""The `fetch` every drain in the Worker is given."""


async def _body(request: Any) -> bytes | None:
    """The request's body, or None when it is longer than MAX_BODY_BYTES
    (read no further than that: a chunked body says no length up front)."""
    data, more = await _read_stream(getattr(request, "js_object", request).body, MAX_BODY_BYTES)
    return None if more else data


# -- configuration ----------------------------------------------------------------


def _raw_env(env: Any) -> Any:
    return getattr(env, "_env", env)


def config_from_env(env: Any) -> Config:
    """The drain's Config from the Worker's D1QUEUE_* vars. The SDK's env
    wrapper proxies attribute reads but cannot list names, so the names come
    from the JS object underneath: an unknown (mistyped) name must be seen
    to be refused."""
    from js import Object  # only exists inside the Worker

    raw = _raw_env(env)
    names = [str(k) for k in Object.keys(raw) if str(k).startswith("D1QUEUE_")]
    return Config.from_vars({k: str(getattr(raw, k)) for k in names})


def _prepared(registry: Registry) -> Registry:
    """The registry with the built-in http.request job, registered once."""
    if HTTP_JOB not in registry.names():
        register_http_job(registry)
    return registry


_DOCUMENTS: dict[tuple[int, str], tuple[Registry, dict[str, Any]]] = {}


def _openapi(registry: Registry, prefix: str) -> dict[str, Any]:
    """The OpenAPI document of a registry's API mounted at `prefix`, made
    once per registry and prefix (its paths are `/v1/...`; `servers` says
    where they start)."""
    key = (id(registry), prefix)
    if key not in _DOCUMENTS:
        doc = document(_prepared(registry).names())
        if prefix:
            doc["servers"] = [{"url": prefix}]
        _DOCUMENTS[key] = (registry, doc)  # the registry kept: its id is never reused
    return _DOCUMENTS[key][1]


# -- HTTP ---------------------------------------------------------------------------

DASHBOARD_HEADERS = ("cookie", "host", "origin", "sec-fetch-site", "content-type", CLIENT_HEADER)
"""The request headers the dashboard reads (sessions, origin checks)."""


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if body is None:  # 204
        return Response(None, status=status, headers={**NO_STORE, **(headers or {})})
    return Response(
        json.dumps(body, separators=(",", ":")),
        status=status,
        headers={"content-type": "application/json", **NO_STORE, **(headers or {})},
    )


def _too_large() -> Response:
    error = ApiError(413, "payload_too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")
    return _json(error.body(), 413)


def _py(value: Any) -> Any:
    """An RPC argument as Python (callers' objects may arrive as JsProxy)."""
    to_py = getattr(value, "to_py", None)
    return to_py() if callable(to_py) else value


def _data_point_writer(binding: Any) -> Any:
    """writeDataPoint of an Analytics Engine binding, taking a Python dict
    (made a JS object: the binding reads `blobs`, `doubles`, `indexes`)."""
    from js import Object
    from pyodide.ffi import to_js

    def write(point: dict[str, Any]) -> None:
        binding.writeDataPoint(to_js(point, dict_converter=Object.fromEntries))

    return write


def _guard(env: Any) -> Guard:
    """The sign-in and token guard, with the Rate Limiting binding when
    wrangler.toml declares one ([[ratelimits]] name = "AUTH_LIMITER")."""
    binding = getattr(_raw_env(env), AUTH_LIMITER_BINDING, None)
    if binding is None:
        return Guard()

    async def limiter(key: str) -> bool:
        from js import Object  # only exists inside the Worker
        from pyodide.ffi import to_js

        outcome = await binding.limit(to_js({"key": key}, dict_converter=Object.fromEntries))
        return bool(outcome.success)

    return Guard(limiter)


def _inside(path: str, prefix: str) -> str | None:
    """`path` without `prefix`, or None when it is not under it (a path that
    merely starts with the same letters, /queues for /queue, is not)."""
    if not prefix:
        return path
    if path == prefix or path.startswith(prefix + "/"):
        return path[len(prefix) :] or "/"
    return None


# -- one invocation -------------------------------------------------------------------


class D1QueueWorker:
    """d1queue for one invocation (a request, a cron run, a queue batch, an
    RPC call) of a Worker: its env and ctx, the registry, and the prefix the
    HTTP API and dashboard are mounted at (`prefix`, or when it is None the
    Worker's D1QUEUE_PREFIX). Its meter counts that invocation's
    subrequests, a push's and its drain's alike, so make one per invocation
    (the entrypoint and the d1queue_* functions do)."""

    def __init__(
        self, env: Any, ctx: Any, registry: Registry, *, prefix: str | None = None
    ) -> None:
        self.env, self.ctx = env, ctx
        self.registry = _prepared(registry)
        self._code_prefix = None if prefix is None else mount_prefix(prefix)
        self._meter: Meter | None = None
        self._shards: ShardSet | None = None
        self._points: Points | None = None
        self._points_looked_up = False

    def mounted(self) -> tuple[str, str | None]:
        """The prefix d1queue answers under, and the operator's mistake when
        there is one (config.resolve_prefix)."""
        return resolve_prefix(
            self._code_prefix, getattr(_raw_env(self.env), "D1QUEUE_PREFIX", None)
        )

    @property
    def prefix(self) -> str:
        """The prefix d1queue answers under ("" the root)."""
        return self.mounted()[0]

    def meter(self, config: Config) -> Meter:
        if self._meter is None:
            self._meter = Meter.for_plan(PLANS[config.plan])
        return self._meter

    def shard_set(self, config: Config) -> ShardSet:
        """A queue per D1 binding of D1QUEUE_SHARDS (shard i: the i-th), all
        counting into this invocation's meter. A binding missing from env
        is the operator's mistake, said plainly."""
        if self._shards is None:
            queues = []
            for name in config.shards:
                binding = getattr(self.env, name, None)
                if binding is None:
                    raise ConfigError(
                        f"D1QUEUE_SHARDS names {name}, but this Worker has no D1 binding "
                        f"{name} (wrangler.toml [[d1_databases]]; docs/operations.md: Shards)"
                    )
                keep = config.keep_completed_s > 0
                if config.reservation_s is None:
                    queue = D1Queue(binding, keep_completed=keep, metrics=config.metrics)
                else:
                    queue = D1Queue(
                        binding,
                        reservation_s=config.reservation_s,
                        keep_completed=keep,
                        metrics=config.metrics,
                    )
                queues.append(queue.derive(binding=queue.binding.metered(self.meter(config))))
            self._shards = ShardSet(queues, config.routing)
        return self._shards

    def points(self) -> Points | None:
        """This invocation's Analytics Engine dataset (the binding named
        ANALYTICS_BINDING), and the points it may still write; None without
        the binding. One per invocation: the 250 points are the
        invocation's, however many drains it runs."""
        if not self._points_looked_up:
            self._points_looked_up = True
            binding = getattr(self.env, ANALYTICS_BINDING, None)
            if binding is not None:
                self._points = Points(_data_point_writer(binding))
        return self._points

    def waker(self, config: Config) -> Waker | None:
        """The wake-up sender (D1QUEUE_WAKE = "queues"), counting its sends on
        this invocation's meter; None when wake-ups are off. A missing
        producer binding is the operator's mistake, said plainly."""
        if config.wake != "queues":
            return None
        producer = getattr(self.env, WAKE_BINDING, None)
        if producer is None:
            raise ConfigError(
                f'D1QUEUE_WAKE = "queues" needs a [[queues.producers]] binding named '
                f"{WAKE_BINDING} in wrangler.toml (docs/operations.md: Wake-ups)"
            )
        return Waker(producer, self.meter(config))

    def service(self) -> Service:
        """The operations HTTP and RPC share, on this invocation's shards;
        a push hands off to its wake-up and short drain (AfterPush), which
        runs in ctx.waitUntil after the answer."""
        config = config_from_env(self.env)
        shards = self.shard_set(config)
        waker = self.waker(config)

        async def drain_shard(queue: ShardQueue, short: Config, window_s: float) -> Any:
            return await self.drain(queue, short, why="push", window_s=window_s)

        def background(work: Any) -> None:
            self.ctx.waitUntil(work)  # the answer does not wait for it

        after = AfterPush(config, shards, waker=waker, drain=drain_shard, background=background)
        return Service(shards.home, self.registry, config=config, shards=shards, after_push=after)

    async def drain(
        self, queue: ShardQueue, config: Config, *, why: str, window_s: float | None = None
    ) -> Any:
        """Drain one shard and log its report as one JSON line."""
        report = await self._run_drain(queue, config, window_s=window_s)
        done = report.as_dict()
        event(
            log, "d1queue.drain", trigger=why, shard=queue.shard, **done, **telemetry.drained(done)
        )
        return report

    async def _run_drain(
        self, queue: ShardQueue, config: Config, *, window_s: float | None = None
    ) -> Any:
        return await drain(
            queue,
            self.registry,
            config,
            env=self.env,
            fetch=job_fetch,
            window_s=window_s,
            points=self.points(),
        )

    async def fetch(self, request: Any) -> Response | None:
        """The HTTP API at `<prefix>/health` and `<prefix>/v1/...`, the
        dashboard at `<prefix>/ui`; None for a path outside the prefix (the
        Worker's own). With no prefix every path is d1queue's (404 in JSON)."""
        url = str(request.url)
        # urlsplit, not urlparse: urlparse drops a last segment's `;x` (as
        # parameters), so /ui/signin;x would be read as /ui/signin.
        parsed = urlsplit(url)
        prefix, problem = self.mounted()
        path = _inside(parsed.path, prefix)
        if path is None:
            return None
        length = request.headers.get("content-length")
        if length is not None and str(length).isdigit() and int(str(length)) > MAX_BODY_BYTES:
            return _too_large()
        raw_token = getattr(_raw_env(self.env), "D1QUEUE_TOKEN", None)
        token = str(raw_token) if raw_token else None
        raw_readonly = getattr(_raw_env(self.env), "D1QUEUE_READONLY_TOKEN", None)
        readonly = str(raw_readonly) if raw_readonly else None
        # The SDK's Request.method is an HTTPMethod enum and raises for any
        # other method (QUERY, say); the JS Request underneath has the string.
        method = str(getattr(request, "js_object", request).method)
        guard = _guard(self.env)
        try:
            if problem is not None:
                raise ConfigError(problem)
            service = self.service()
        except ConfigError as exc:  # the operator's mistake: said in full to the token only
            headers = {k: str(request.headers.get(k) or "") for k in API_HEADERS}
            reply = await misconfigured(str(exc), token, method, parsed.path, headers, guard)
            return _json(reply.body, reply.status, reply.headers)
        if is_dashboard_path(path):
            body = b"" if method in ("GET", "HEAD") else await _body(request)
            if body is None:
                return _too_large()
            headers = {k: str(request.headers.get(k) or "") for k in DASHBOARD_HEADERS}
            board = Dashboard(service, token, guard, prefix=prefix, readonly_token=readonly)
            reply = await board.handle(method, url, headers, body, service.queue.clock())
            # None for HEAD and 204: a 204 Response with any body, "" included,
            # is refused by the runtime.
            return Response(reply.body, status=reply.status, headers=reply.headers)
        openapi = _openapi(self.registry, prefix)
        api = Api(
            service, token, _version(), openapi, guard, prefix=prefix, readonly_token=readonly
        )
        headers = {k: str(request.headers.get(k) or "") for k in API_HEADERS}
        if request.headers.get(TRACE_HEADER) is None:
            # Absent, not empty: an empty traceparent is a bad one (422).
            del headers[TRACE_HEADER]
        body = b""
        # Without the token the answer is 401 whatever the body holds: it is
        # never read, so no one without the token makes the Worker read one.
        if method not in ("GET", "HEAD") and api.authorized(headers, method):
            read = await _body(request)
            if read is None:
                return _too_large()
            body = read
        inner = urlunsplit(parsed._replace(path=path))  # the API routes /v1/... as its own
        answer = await api.handle(method, inner, headers, body)
        if isinstance(answer.body, Exposition):  # Prometheus text, sent as it is
            return Response(str(answer.body), status=answer.status, headers=answer.headers)
        return _json(answer.body, answer.status, answer.headers)

    async def scheduled(self, controller: Any) -> None:
        """The cron: on each shard in turn (features/cron.py), enqueue its due
        schedule slots, then drain it within its share of the budgets (claims
        take over lapsed leases), so a slot's job starts in the run that
        enqueued it. Schedules cost at most 2 D1 queries a shard, counted on
        the invocation's meter before the drain plans with what is left; the
        first also prunes failed jobs past D1QUEUE_KEEP_FAILED_S. Each
        shard's report is logged as one JSON line (the prune's count is
        `schedules.pruned_failed`), for `wrangler tail` and Logpush."""
        config = config_from_env(self.env)
        shards = self.shard_set(config)
        # The later of the clock and the trigger's time: a run that starts a
        # moment early still takes the slots of its own minute.
        now = max(shards.home.clock(), int(float(controller.scheduledTime or 0)))
        trigger = str(controller.cron or "")

        async def run_drain(queue: ShardQueue, c: Config) -> Any:
            return await self._run_drain(queue, c)

        runs = await cron(
            shards,
            self.registry,
            config,
            now=now,
            grace_ms=trigger_grace_ms(trigger, now),
            due_limit=DUE_LIMITS[config.plan],
            run_drain=run_drain,
        )
        for run in runs:  # one line per shard: its drain, and its schedules before it
            done = run.drained.as_dict()
            event(
                log,
                "d1queue.drain",
                trigger=f"cron {trigger}",
                shard=run.shard,
                **done,
                schedules=run.schedules.as_dict(),
                **telemetry.drained(done),
            )

    async def queue(self, batch: Any) -> None:
        """The Cloudflare Queues consumer (D1QUEUE_WAKE = "queues"): drain the
        queues the batch's wake messages name, within this invocation's own
        limits, then acknowledge every message. Messages are acknowledged only
        after the drain: a consumer that dies mid-batch has them delivered
        again, and the jobs it held go back when their leases lapse. A drain
        stopped by D1 failing asks for the batch again (retry)."""
        config = config_from_env(self.env)
        messages = list(batch.messages)
        bodies = [_py(m.body) for m in messages]

        async def run_drain(queue: ShardQueue, c: Config) -> Any:
            return await self._run_drain(queue, c)

        report, drained = await consume(
            self.shard_set(config),
            config,
            bodies,
            run_drain=run_drain,
            waker=self.waker(config),
        )
        done = drained.as_dict() if drained is not None else {}
        event(
            log,
            "d1queue.drain",
            trigger=f"queue {batch.queue}",
            **done,
            wake=report.as_dict(),
            **telemetry.drained(done),
        )
        for m in messages:
            if report.retry:
                m.retry()
            else:
                m.ack()


# -- functions a Worker's own handlers call -------------------------------------------


async def d1queue_fetch(
    request: Any, env: Any, ctx: Any, registry: Registry, *, prefix: str | None = None
) -> Response | None:
    """d1queue's answer to `request`, or None when its path is not under
    `prefix` (then the Worker's own routes answer; None: the Worker's
    D1QUEUE_PREFIX var, the root by default). `env` and `ctx` are the
    entrypoint's `self.env` and `self.ctx`."""
    return await D1QueueWorker(env, ctx, registry, prefix=prefix).fetch(request)


async def d1queue_scheduled(controller: Any, env: Any, ctx: Any, registry: Registry) -> None:
    """The cron run (schedules, then a drain of every shard), from the
    Worker's own `scheduled(self, controller, env, ctx)`: pass `self.env`,
    `self.ctx` (workerd calls a class's `scheduled` with env and ctx unset)."""
    await D1QueueWorker(env, ctx, registry).scheduled(controller)


async def d1queue_queue(batch: Any, env: Any, ctx: Any, registry: Registry) -> None:
    """The wake-up consumer, from the Worker's own `queue(self, batch, ...)`
    (a batch of d1queue's wake queue only: its messages are acknowledged)."""
    await D1QueueWorker(env, ctx, registry).queue(batch)


# -- the entrypoint --------------------------------------------------------------------

_HANDLERS = ("fetch", "scheduled", "queue")
_RPC_METHODS = (
    "dispatch",
    "dispatch_job",
    "dispatch_json",
    "dispatch_batch",
    "stats",
    "metrics",
    "limits",
    "set_limits",
    "job",
    "completed",
    "batch",
    "batch_state",
    "add_to_batch",
    "cancel",
    "retry_failed",
    "put_schedule",
    "schedules",
    "schedule",
    "delete_schedule",
    "pause_schedule",
    "resume_schedule",
)
"""The RPC methods of D1QueueEntrypoint, as callers name them."""


class D1QueueEntrypoint(WorkerEntrypoint):
    """A Worker's `Default` with d1queue in it: fetch (the HTTP API and the
    dashboard under the prefix), scheduled (the cron), queue (wake-ups) and
    the RPC methods below. Make one with `d1queue_entrypoint(registry,
    prefix=...)` and inherit it; override `fetch` to add routes, calling
    `super().fetch(request)` for the rest.

    workerd exposes to callers only the methods a Worker's class defines
    itself (its `__dict__`, not its bases'), so every subclass is given the
    handlers and RPC methods it inherits as its own (`__init_subclass__`).

    RPC, for Workers with a service binding to this one: the same validation
    as the HTTP API; errors raise (the caller sees "<code>: <message>");
    results are plain JSON-able dicts."""

    _d1queue_registry: ClassVar[Registry | None] = None
    _d1queue_prefix: ClassVar[str | None] = None
    _d1queue_now: D1QueueWorker | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        for name in (*_HANDLERS, *_RPC_METHODS):
            if name not in cls.__dict__:
                setattr(cls, name, getattr(cls, name))  # inherited, made the class's own
        super().__init_subclass__(**kwargs)  # the SDK wraps __init__ and queue

    def _d1queue(self) -> D1QueueWorker:
        """This event's d1queue (one instance per event: its meter is the
        invocation's)."""
        if self._d1queue_now is None:
            registry = type(self)._d1queue_registry
            if registry is None:
                raise TypeError(
                    "D1QueueEntrypoint has no registry: inherit d1queue_entrypoint(registry)"
                )
            self._d1queue_now = D1QueueWorker(
                self.env, self.ctx, registry, prefix=type(self)._d1queue_prefix
            )
        return self._d1queue_now

    def _service(self) -> Service:
        return self._d1queue().service()

    async def fetch(self, request: Any) -> Response:
        """d1queue's HTTP API and dashboard; outside the prefix, a 404."""
        answer = await self._d1queue().fetch(request)
        if answer is None:
            error = ApiError(404, "not_found", f"no route for {urlsplit(str(request.url)).path}")
            return _json(error.body(), 404)
        return answer

    async def scheduled(self, controller: Any, env: Any = None, ctx: Any = None) -> None:
        """The cron (D1QueueWorker.scheduled). workerd passes env and ctx
        unset: they are on `self`."""
        await self._d1queue().scheduled(controller)

    async def queue(self, batch: Any, env: Any = None, ctx: Any = None) -> None:
        """The wake-up consumer (D1QueueWorker.queue); env and ctx are on
        `self`, as for `scheduled`."""
        await self._d1queue().queue(batch)

    # -- RPC --------------------------------------------------------------------------

    async def dispatch(self, queue: str, job: Any) -> dict[str, Any]:
        """Push `job` ({name, payload?, delay_s?, priority?, unique_key?,
        group?, debounce_s?, after?, ignore_failed?, ...}, as POST
        /v1/queues/{queue}/jobs) to `queue`: {id, queue, deduplicated,
        paused, runs_here, warnings}."""
        return await self._service().dispatch(str(queue), _py(job))

    async def dispatch_job(self, job: Any) -> dict[str, Any]:
        """Push a job by name alone (POST /v1/jobs): to its `queue` field if
        it has one, else to the queue its name is registered with."""
        return await self._service().dispatch_job(_py(job))

    async def dispatch_json(self, queue: str, job: str) -> dict[str, Any]:
        """`dispatch` with the job as JSON text: checked for size and depth
        before it is parsed, as the HTTP API checks a body. Object arguments
        are converted by the workers SDK before any method runs, and that
        conversion fails past about 1,000 levels: use this for input the
        calling Worker did not make itself."""
        return await self._service().dispatch(str(queue), json_object(str(job).encode()))

    async def dispatch_batch(self, queue: str, jobs: Any) -> dict[str, Any]:
        """Push up to 100 jobs to `queue` in one transaction (POST
        /v1/queues/{queue}/jobs/batch): {ids, ...}."""
        return await self._service().dispatch_batch(str(queue), _py(jobs))

    async def stats(self, queue: Any = None) -> dict[str, Any]:
        """Every queue's counts (GET /v1/queues), or one queue's (GET
        /v1/queues/{queue})."""
        service = self._service()
        return await (service.queues() if queue is None else service.queue_stats(str(queue)))

    async def metrics(
        self, window: Any = None, queue: Any = None, name: Any = None
    ) -> dict[str, Any]:
        """Job metrics per queue and name over a window ("1h", "24h", "7d";
        default "1h"), optionally of one queue and one job name (GET
        /v1/metrics): counts by outcome, p50/p95/p99 of wait and run, the
        all-time totals and a series for charts."""
        return await self._service().metrics(
            "1h" if window is None else _py(window),
            None if queue is None else _py(queue),
            None if name is None else _py(name),
        )

    async def limits(self, queue: str) -> dict[str, Any]:
        """A queue's flow limits and their use now (GET /v1/queues/{queue}/limits)."""
        return await self._service().limits(str(queue))

    async def set_limits(self, queue: str, limits: Any) -> dict[str, Any]:
        """Replace a queue's flow limits ({concurrency, group_concurrency,
        rate, group_rate}, null meaning none; PUT /v1/queues/{queue}/limits)."""
        return await self._service().set_limits(str(queue), _py(limits))

    async def job(self, id: str) -> dict[str, Any]:
        """A job's state (GET /v1/jobs/{id}): waiting, ready, delayed,
        reserved, completed (while kept, with its result) or failed."""
        return await self._service().job(str(id))

    async def completed(self, queue: str, limit: Any = 50, cursor: Any = None) -> dict[str, Any]:
        """A page of a queue's completed jobs, newest first, with their results
        (GET /v1/queues/{queue}/completed): {jobs, next_cursor}. A JS caller's
        `undefined` limit arrives as None: the default page."""
        limit = _py(limit)
        return await self._service().completed(
            str(queue), 50 if limit is None else limit, _py(cursor)
        )

    async def batch(self, batch: Any) -> dict[str, Any]:
        """Push a workflow batch ({jobs, on_success?, on_failure?, on_finish?},
        POST /v1/batches): {batch, ids}."""
        return await self._service().batch(_py(batch))

    async def batch_state(self, id: str) -> dict[str, Any]:
        """A batch's progress (GET /v1/batches/{id})."""
        return await self._service().batch_state(str(id))

    async def add_to_batch(self, id: str, jobs: Any) -> dict[str, Any]:
        """Add jobs to a running batch (POST /v1/batches/{id}/jobs): {ids}."""
        return await self._service().add_to_batch(str(id), _py(jobs))

    async def cancel(self, id: str) -> dict[str, Any]:
        """Cancel a job (DELETE /v1/jobs/{id}): a queued one is deleted, a
        running one marked ("cancelling") for its drain to end."""
        return await self._service().cancel(str(id))

    async def retry_failed(self, id: str) -> dict[str, Any]:
        """Give a failed job one fresh attempt (POST /v1/failed/{id}/retry)."""
        return await self._service().retry_failed(str(id))

    async def put_schedule(self, schedule: Any) -> dict[str, Any]:
        """Create or replace a schedule ({id?, cron, name, payload?, queue?,
        tz?, catch_up?}); the answer's `created` says which."""
        _, result = await self._service().put_schedule(_py(schedule))
        return result

    async def schedules(self, limit: Any = 100, cursor: Any = None) -> dict[str, Any]:
        """A page of schedules (GET /v1/schedules): {schedules, next_cursor}.
        A JS caller's `undefined` limit arrives as None: the default page."""
        limit = _py(limit)
        return await self._service().schedules(100 if limit is None else limit, _py(cursor))

    async def schedule(self, id: str) -> dict[str, Any]:
        """One schedule (GET /v1/schedules/{id})."""
        return await self._service().schedule(str(id))

    async def delete_schedule(self, id: str) -> dict[str, Any]:
        """Delete a schedule (DELETE /v1/schedules/{id})."""
        return await self._service().delete_schedule(str(id))

    async def pause_schedule(self, id: str) -> dict[str, Any]:
        """Stop a schedule enqueuing its slots (POST /v1/schedules/{id}/pause)."""
        return await self._service().pause_schedule(str(id))

    async def resume_schedule(self, id: str) -> dict[str, Any]:
        """Let a paused schedule enqueue again (POST /v1/schedules/{id}/resume)."""
        return await self._service().resume_schedule(str(id))


def d1queue_entrypoint(registry: Registry, *, prefix: str | None = None) -> type[D1QueueEntrypoint]:
    """A D1QueueEntrypoint for `registry` (http.request added), its HTTP API
    and dashboard mounted at `prefix` ("" the root; "/queue": /queue/v1/...,
    /queue/ui; None: the Worker's D1QUEUE_PREFIX var, the root by default).
    Inherit it as the Worker's `Default`. Called at import, so the OpenAPI
    document is made once, into the deploy's snapshot."""
    mounted = None if prefix is None else mount_prefix(prefix)
    _openapi(_prepared(registry), mounted or "")
    return type(
        "D1QueueDefault",
        (D1QueueEntrypoint,),
        {"_d1queue_registry": registry, "_d1queue_prefix": mounted, "__module__": __name__},
    )
