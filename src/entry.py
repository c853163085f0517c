"""d1queue's Worker: the glue between Cloudflare's runtime and the library.

The only module that imports the `workers` SDK (and `js`), so everything in
d1queue/ and jobs.py imports and tests under plain CPython.
"""

import json
from typing import Any
from urllib.parse import urlparse

from pyodide import ffi
from workers import Response, WorkerEntrypoint, fetch

from d1queue import Config, ConfigError, D1Queue, __version__, drain
from d1queue.core.guard import AUTH_LIMITER_BINDING, CLIENT_HEADER, Guard
from d1queue.core.limits import PLANS, Meter
from d1queue.core.log import event, install
from d1queue.features.after_push import AfterPush
from d1queue.features.cron import cron
from d1queue.features.http_request import register_http_job
from d1queue.features.wake import WAKE_BINDING, Waker, consume
from d1queue.interfaces.api import MAX_BODY_BYTES, NO_STORE, Api, json_object
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.openapi import document
from d1queue.interfaces.service import ApiError, Service
from d1queue.store.binding import Binding
from d1queue.store.schedules import DUE_LIMITS, trigger_grace_ms
from d1queue.store.shardset import ShardQueue, ShardSet
from jobs import registry

JS_NULL: Any = getattr(ffi, "jsnull", None)


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


class _FetchReply:
    """A Workers fetch response as d1queue.outbound reads one: the body is
    read from its stream up to a limit, never whole (a target may answer
    with any size; the isolate has 128 MB)."""

    def __init__(self, response: Any) -> None:
        self._response = getattr(response, "js_object", response)  # the JS Response
        self.status = int(self._response.status)

    def header(self, name: str) -> str | None:
        value = self._response.headers.get(name)
        return None if value is None else str(value)

    async def read(self, limit: int) -> bytes:
        data, _ = await _read_stream(self._response.body, limit)
        return data

    async def cancel(self) -> None:
        stream = self._response.body
        if stream is not None and not stream.locked:
            await stream.cancel()


async def _fetch(
    url: str, *, method: str, headers: dict[str, str], body: str | None, service: Any, env: Any
) -> _FetchReply:
    # Redirects are followed by d1queue.outbound, which checks every hop
    # against the deployment's rules; the platform would follow them blind.
    options: dict[str, Any] = {"method": method, "headers": headers, "redirect": "manual"}
    if body is not None:
        options["body"] = body
    if service is not None:
        binding = getattr(env, service, None)
        if binding is None:  # outbound.send checked it; a binding cannot vanish
            raise LookupError("the service binding is not available")
        return _FetchReply(await binding.fetch(url, **options))
    return _FetchReply(await fetch(url, **options))


register_http_job(registry)
log = install()  # the d1queue logger's JSON lines on the Worker's console
OPENAPI = document(registry.names())


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


def _too_large() -> Response:
    error = ApiError(413, "payload_too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")
    return _json(error.body(), 413)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if body is None:  # 204
        return Response(None, status=status, headers={**NO_STORE, **(headers or {})})
    return Response(
        json.dumps(body, separators=(",", ":")),
        status=status,
        headers={"content-type": "application/json", **NO_STORE, **(headers or {})},
    )


def _py(value: Any) -> Any:
    """An RPC argument as Python (callers' objects may arrive as JsProxy)."""
    to_py = getattr(value, "to_py", None)
    return to_py() if callable(to_py) else value


async def _body(request: Any) -> bytes | None:
    """The request's body, or None when it is longer than MAX_BODY_BYTES
    (read no further than that: a chunked body says no length up front)."""
    data, more = await _read_stream(getattr(request, "js_object", request).body, MAX_BODY_BYTES)
    return None if more else data


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


def _is_dashboard(url: str) -> bool:
    """/ui and everything under it is the dashboard (d1queue.dashboard)."""
    path = urlparse(url).path
    return path == "/ui" or path.startswith("/ui/")


API_HEADERS = ("authorization", CLIENT_HEADER)
"""The request headers the API reads (the token; the client's address, for
the guard)."""

DASHBOARD_HEADERS = ("cookie", "host", "origin", "sec-fetch-site", "content-type", CLIENT_HEADER)
"""The request headers the dashboard reads (sessions, origin checks)."""


async def _dashboard(
    service: Service, token: Any, method: str, url: str, request: Any, body: bytes, guard: Guard
) -> Response:
    headers = {k: str(request.headers.get(k) or "") for k in DASHBOARD_HEADERS}
    board = Dashboard(service, str(token) if token else None, guard)
    reply = await board.handle(method, url, headers, body, service.queue.clock())
    # None for HEAD and 204: a 204 Response with any body, "" included, is
    # refused by the runtime.
    return Response(reply.body, status=reply.status, headers=reply.headers)


class Default(WorkerEntrypoint):
    """One instance per event (request, cron run, RPC call): its meter counts
    that invocation's subrequests, the push's and its drain's alike."""

    _meter: Meter | None = None
    _shards: ShardSet | None = None

    def _invocation(self, config: Config) -> Meter:
        if self._meter is None:
            self._meter = Meter.for_plan(PLANS[config.plan])
        return self._meter

    def _shard_set(self, config: Config) -> ShardSet:
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
                db = Binding(binding, meter=self._invocation(config))
                if config.reservation_s is None:
                    queues.append(D1Queue(db))
                else:
                    queues.append(D1Queue(db, reservation_s=config.reservation_s))
            self._shards = ShardSet(queues, config.routing)
        return self._shards

    def _waker(self, config: Config) -> Waker | None:
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
        return Waker(producer, self._invocation(config))

    def _service(self) -> Service:
        config = config_from_env(self.env)
        shards = self._shard_set(config)
        waker = self._waker(config)

        async def drain_shard(queue: ShardQueue, short: Config, window_s: float) -> Any:
            return await self._drain(queue, short, why="push", window_s=window_s)

        def background(work: Any) -> None:
            self.ctx.waitUntil(work)  # the answer does not wait for it

        after = AfterPush(config, shards, waker=waker, drain=drain_shard, background=background)
        return Service(shards.home, registry, config=config, shards=shards, after_push=after)

    async def _drain(
        self,
        queue: ShardQueue,
        config: Config,
        *,
        why: str,
        window_s: float | None = None,
    ) -> Any:
        """Drain one shard and log its report as one JSON line."""
        report = await drain(queue, registry, config, env=self.env, fetch=_fetch, window_s=window_s)
        event(log, "d1queue.drain", trigger=why, shard=queue.shard, **report.as_dict())
        return report

    async def fetch(self, request: Any) -> Response:
        length = request.headers.get("content-length")
        if length is not None and str(length).isdigit() and int(str(length)) > MAX_BODY_BYTES:
            return _too_large()
        token = getattr(_raw_env(self.env), "D1QUEUE_TOKEN", None)
        try:
            service = self._service()
        except ConfigError as exc:  # the operator's mistake, said plainly
            return _json(ApiError(500, "misconfigured", str(exc)).body(), 500)
        # The SDK's Request.method is an HTTPMethod enum and raises for any
        # other method (QUERY, say); the JS Request underneath has the string.
        method = str(getattr(request, "js_object", request).method)
        url = str(request.url)
        guard = _guard(self.env)
        if _is_dashboard(url):
            body = b"" if method in ("GET", "HEAD") else await _body(request)
            if body is None:
                return _too_large()
            return await _dashboard(service, token, method, url, request, body, guard)
        api = Api(service, str(token) if token else None, __version__, OPENAPI, guard)
        headers = {k: str(request.headers.get(k) or "") for k in API_HEADERS}
        body = b""
        # Without the token the answer is 401 whatever the body holds: it is
        # never read, so no one without the token makes the Worker read one.
        if method not in ("GET", "HEAD") and api.authorized(headers):
            body = await _body(request)
            if body is None:
                return _too_large()
        reply = await api.handle(method, url, headers, body)
        return _json(reply.body, reply.status, reply.headers)

    async def scheduled(self, controller: Any, env: Any, ctx: Any) -> None:
        """The cron: on each shard in turn (d1queue.crons), enqueue its due
        schedule slots, then drain it within its share of the budgets (claims
        take over lapsed leases), so a slot's job starts in the run that
        enqueued it. Schedules cost at most 2 D1 queries a shard, counted on
        the invocation's meter before the drain plans with what is left; the
        first also prunes failed jobs past D1QUEUE_KEEP_FAILED_S. Each
        shard's report is logged as one JSON line (the prune's count is
        `schedules.pruned_failed`), for `wrangler tail` and Logpush."""
        config = config_from_env(self.env)
        shards = self._shard_set(config)
        # The later of the clock and the trigger's time: a run that starts a
        # moment early still takes the slots of its own minute.
        now = max(shards.home.clock(), int(float(controller.scheduledTime or 0)))
        trigger = str(controller.cron or "")

        async def run_drain(queue: ShardQueue, c: Config) -> Any:
            return await drain(queue, registry, c, env=self.env, fetch=_fetch)

        runs = await cron(
            shards,
            registry,
            config,
            now=now,
            grace_ms=trigger_grace_ms(trigger, now),
            due_limit=DUE_LIMITS[config.plan],
            run_drain=run_drain,
        )
        for run in runs:  # one line per shard: its drain, and its schedules before it
            event(
                log,
                "d1queue.drain",
                trigger=f"cron {trigger}",
                shard=run.shard,
                **run.drained.as_dict(),
                schedules=run.schedules.as_dict(),
            )

    async def queue(self, batch: Any, env: Any = None, ctx: Any = None) -> None:
        """The Cloudflare Queues consumer (D1QUEUE_WAKE = "queues"): drain the
        queues the batch's wake messages name, within this invocation's own
        limits, then acknowledge every message. Messages are acknowledged only
        after the drain: a consumer that dies mid-batch has them delivered
        again, and the jobs it held go back when their leases lapse. A drain
        stopped by D1 failing asks for the batch again (retry). env and ctx
        are on `self`, as for `scheduled`."""
        config = config_from_env(self.env)
        messages = list(batch.messages)
        bodies = [_py(m.body) for m in messages]

        async def run_drain(queue: ShardQueue, c: Config) -> Any:
            return await drain(queue, registry, c, env=self.env, fetch=_fetch)

        report, drained = await consume(
            self._shard_set(config),
            config,
            bodies,
            run_drain=run_drain,
            waker=self._waker(config),
        )
        event(
            log,
            "d1queue.drain",
            trigger=f"queue {batch.queue}",
            **(drained.as_dict() if drained is not None else {}),
            wake=report.as_dict(),
        )
        for m in messages:
            if report.retry:
                m.retry()
            else:
                m.ack()

    # -- RPC: for Workers with a service binding to this one ---------------------
    # Same validation as the HTTP API; errors raise (the caller sees
    # "<code>: <message>"); results are plain JSON-able dicts.

    async def dispatch(self, queue: str, job: Any) -> dict[str, Any]:
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
        return await self._service().dispatch_batch(str(queue), _py(jobs))

    async def stats(self, queue: Any = None) -> dict[str, Any]:
        service = self._service()
        return await (service.queues() if queue is None else service.queue_stats(str(queue)))

    async def job(self, id: str) -> dict[str, Any]:
        return await self._service().job(str(id))

    async def cancel(self, id: str) -> dict[str, Any]:
        return await self._service().cancel(str(id))

    async def retry_failed(self, id: str) -> dict[str, Any]:
        return await self._service().retry_failed(str(id))

    # Schedules: POST/GET/DELETE /v1/schedules... as methods.

    async def put_schedule(self, schedule: Any) -> dict[str, Any]:
        """Create or replace a schedule ({id?, cron, name, payload?, queue?,
        tz?, catch_up?}); the answer's `created` says which."""
        _, result = await self._service().put_schedule(_py(schedule))
        return result

    async def schedules(self, limit: Any = 100, cursor: Any = None) -> dict[str, Any]:
        return await self._service().schedules(_py(limit), _py(cursor))

    async def schedule(self, id: str) -> dict[str, Any]:
        return await self._service().schedule(str(id))

    async def delete_schedule(self, id: str) -> dict[str, Any]:
        return await self._service().delete_schedule(str(id))

    async def pause_schedule(self, id: str) -> dict[str, Any]:
        return await self._service().pause_schedule(str(id))

    async def resume_schedule(self, id: str) -> dict[str, Any]:
        return await self._service().resume_schedule(str(id))
