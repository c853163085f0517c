"""The built-in http.request job against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.outbound import HostRules
from d1queue.features.http_request import register_http_job, retry_after_s

from .conftest import Clock
from .http_server import Server


class UrllibResponse:
    """A response as the Worker's fetch gives one (entry.py): the body read
    from its stream up to a limit, the rest never read."""

    def __init__(self, status: int, headers: Any, stream: Any) -> None:
        self.status, self._headers, self._stream = status, headers, stream
        self.read_sizes: list[int] = []

    def header(self, name: str) -> str | None:
        return self._headers.get(name)

    async def read(self, limit: int) -> bytes:
        self.read_sizes.append(limit)
        data = await asyncio.to_thread(self._stream.read, limit)
        self._stream.close()
        return bytes(data)

    async def cancel(self) -> None:
        self._stream.close()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """fetch(..., redirect="manual"): a 3xx is the answer."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


async def urllib_fetch(url: str, *, method: str, headers: dict, body: Any, service: Any, env: Any):  # type: ignore[no-untyped-def]
    """A stand-in for the Workers fetch under CPython: real HTTP, in a thread,
    redirects not followed (as entry.py asks of fetch)."""
    if service is not None:
        url = getattr(env, service) + url.split(service, 1)[1]
    sent.append((url, dict(headers)))

    def send() -> UrllibResponse:
        req = urllib.request.Request(url, data=body.encode() if body else None, method=method)
        for k, v in headers.items():
            req.add_header(k, v)
        try:
            r = _OPENER.open(req, timeout=30)
            return UrllibResponse(r.status, r.headers, r)
        except urllib.error.HTTPError as e:
            return UrllibResponse(e.code, e.headers, e)

    return await asyncio.to_thread(send)


sent: list[tuple[str, dict[str, str]]] = []
"""What urllib_fetch sent (url, headers), for tests that look."""

LOCAL = Config(http_allow=HostRules.parse("public,loopback"))
"""A configuration whose jobs may reach these tests' 127.0.0.1 servers, as
`make dev` allows."""


@pytest.fixture
def reg() -> Registry:
    r = Registry()
    register_http_job(r, max_attempts=3)
    return r


async def run(queue: D1Queue, reg: Registry, env: Any = None, config: Config = LOCAL):  # type: ignore[no-untyped-def]
    return await drain(queue, reg, config, env=env, fetch=urllib_fetch)


async def test_delivers_once_on_2xx(queue: D1Queue, reg: Registry, server: Server) -> None:
    payload = {"url": f"{server.url}/hook", "body": {"a": 1}, "headers": {"x-k": "v"}}
    await queue.dispatch("http.request", payload)
    report = await run(queue, reg)
    assert report.completed == 1
    assert server.seen == [("POST", "/hook", '{"a": 1}', "v")]


async def test_503_then_success_honours_retry_after(
    queue: D1Queue, reg: Registry, server: Server, clock: Clock
) -> None:
    server.script["/flaky"] = [(503, {"Retry-After": "42"}, "busy", 0), (200, {}, "ok", 0)]
    job_id = await queue.dispatch("http.request", {"url": f"{server.url}/flaky"})
    assert (await run(queue, reg)).retried == 1
    job = await queue.job(job_id)
    assert job is not None and job.available_at == clock() + 42_000
    assert job.last_error == f"retry requested: GET {server.url}/flaky answered 503: busy"
    clock.advance(42)
    assert (await run(queue, reg)).completed == 1
    assert len(server.seen) == 2


async def test_a_4xx_fails_for_good(queue: D1Queue, reg: Registry, server: Server) -> None:
    server.script["/gone"] = [(404, {}, "no such hook " * 50, 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/gone", "method": "PUT"})
    assert (await run(queue, reg)).failed == 1
    (failed,) = await queue.failed_jobs()
    assert f"PUT {server.url}/gone answered 404: no such hook" in failed.error
    assert len(failed.error) < 600, "a short excerpt, not the whole body"


async def test_429_and_timeouts_and_refused_connections_retry(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    server.script["/limited"] = [(429, {}, "slow down", 0)]
    server.script["/slow"] = [(200, {}, "late", 1.0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/limited"})
    await queue.dispatch("http.request", {"url": f"{server.url}/slow", "timeout_s": 0.2})
    await queue.dispatch("http.request", {"url": "http://127.0.0.1:9/refused"})
    report = await run(queue, reg)
    assert report.retried == 3
    errors = sorted(
        j["last_error"]
        for j in (await queue.binding.run("SELECT last_error FROM d1queue_jobs")).rows
    )
    assert "answered 429" in errors[0]
    assert any("no response within 0.2s" in e for e in errors)
    assert any("refused" in e.lower() for e in errors)


async def test_expect_status_and_service_bindings(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    server.script["/created"] = [(201, {}, "", 0)]
    server.script["/conflict"] = [(409, {}, "exists", 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/created", "expect_status": 202})
    await queue.dispatch(
        "http.request", {"service": "HOOKS", "path": "/conflict", "expect_status": 409}
    )
    config = replace(LOCAL, http_services=frozenset({"HOOKS"}))
    report = await run(queue, reg, env=SimpleNamespace(HOOKS=server.url), config=config)
    assert (report.completed, report.failed) == (1, 1)
    (failed,) = await queue.failed_jobs()
    assert "answered 201" in failed.error


@pytest.mark.parametrize(
    "payload",
    [
        "http://x",
        {"url": "ftp://x"},
        {"url": "http://x", "method": "BREW"},
        {"url": "http://x", "headers": {"a": 1}},
        {"url": "http://x", "timeout_s": 0},
        {"url": "http://x", "extra": 1},
        {"service": "S", "path": "no-slash"},
    ],
)
async def test_a_malformed_payload_fails_without_a_request(
    queue: D1Queue, reg: Registry, server: Server, payload: Any
) -> None:
    await queue.dispatch("http.request", payload)
    assert (await run(queue, reg)).failed == 1
    assert server.seen == []


def test_retry_after_parsing() -> None:
    assert retry_after_s("120") == 120
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470) == 10
    assert retry_after_s("soon") is None and retry_after_s(None) is None
