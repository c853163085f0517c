"""The host's limits mode (host/limits.mjs): Cloudflare's per-invocation caps
on subrequests, D1 queries, CPU and waitUntil time, each failing the way
Cloudflare fails it. Counts are asserted, never timings; CPU only where the
difference is gross (a busy loop of hundreds of milliseconds against 10 ms)."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ..http_server import Server
from .conftest import Host, start_host

TOO_MANY_SUBREQUESTS = "Too many subrequests by single Worker invocation."
TOO_MANY_API_REQUESTS = "Too many API requests by single worker invocation."
CPU_EXCEEDED = "Worker exceeded CPU time limit."
PYTHON_CPU_EXCEEDED = "CpuLimitExceeded: Python Worker exceeded CPU time limit"
WAIT_UNTIL_CANCELLED = "waitUntil() tasks did not complete within the allowed time"

HOSTS = {
    # CPU warned about, not enforced: 50 SDK queries cost more than 10 ms here.
    "free": ("--plan", "free", "--cpu", "warn"),
    "paid": ("--plan", "paid", "--wait-until-s", "2"),
    "free_cpu": ("--plan", "free"),  # CPU enforced at 10 ms
}

BUSY = "sum(i * i for i in range(1_000_000))"
"""Hundreds of milliseconds of Pyodide CPU: obviously past 10 ms."""


@pytest.fixture(scope="module")
def hosts() -> Iterator[dict[str, Host]]:
    """The three hosts; the first alone (it may build the session's upload),
    the other two side by side."""
    names = list(HOSTS)
    started = {names[0]: start_host(*HOSTS[names[0]])}
    try:
        with ThreadPoolExecutor(len(names) - 1) as pool:
            futures = {name: pool.submit(start_host, *HOSTS[name]) for name in names[1:]}
        errors = []
        for name, future in futures.items():
            try:
                started[name] = future.result()
            except BaseException as e:  # stop the others, then fail
                errors.append(e)
        if errors:
            raise errors[0]
        yield started
    finally:
        for h in started.values():
            h.stop()


def invocations(host: Host, since: int, n: int = 1) -> list[dict[str, Any]]:
    """The first `n` invocation lines printed since output line `since`
    (each is printed when its invocation ends, waitUntil work included)."""
    return events(host, since, "d1queue.invocation", n)


def events(host: Host, since: int, event: str, n: int = 1) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = host.events(event, since)
        if len(found) >= n:
            return found[:n]
        time.sleep(0.02)
    raise AssertionError(f"{len(found)} {event} lines after 30 s, wanted {n}")


def python_reply(host: Host, source: str) -> tuple[int, Any]:
    reply = host.post("/__test/python", body=textwrap.dedent(source))
    return reply.status, reply.json()


D1_LOOP = """
    async def main(env):
        done = 0
        for i in range({n}):
            try:
                await env.DB.prepare("SELECT ? AS i").bind(i).first()
            except Exception as e:
                return [done, str(e)]
            done += 1
        return [done, None]
"""


def test_free_plan_fails_the_51st_d1_query_as_cloudflare_does(hosts: dict[str, Host]) -> None:
    free = hosts["free"]
    since = len(free.output())
    done, error = free.python(D1_LOOP.format(n=51))
    assert done == 50
    assert error == f"Error: {TOO_MANY_API_REQUESTS}"
    [line] = invocations(free, since)
    assert (line["kind"], line["plan"]) == ("test", "free")
    assert (line["subrequests"], line["d1_queries"], line["refused"]) == (50, 50, 1)
    assert line["outcome"] == "ok"  # the script caught it; the invocation goes on


def test_free_plan_fails_the_51st_fetch_as_cloudflare_does(
    hosts: dict[str, Host], server: Server
) -> None:
    free = hosts["free"]
    since = len(free.output())
    done, error = free.python(
        f"""
        from workers import fetch

        async def main(env):
            done = 0
            for i in range(51):
                try:
                    r = await fetch("{server.url}/f/" + str(i))
                    await r.text()
                except Exception as e:
                    return [done, str(e)]
                done += 1
            return [done, None]
        """
    )
    assert done == 50
    assert TOO_MANY_SUBREQUESTS in error
    assert sorted(path for _, path, _, _ in server.seen) == sorted(f"/f/{i}" for i in range(50))
    [line] = invocations(free, since)
    assert (line["subrequests"], line["d1_queries"], line["refused"]) == (50, 0, 1)


MIXED = """
    import asyncio
    from workers import fetch

    async def query(env, i):
        await asyncio.sleep(0.001 * (i % 3))
        await env.DB.prepare("SELECT ? AS i").bind(i).first()

    async def get(i):
        await (await fetch("{url}/m/{tag}/" + str(i))).text()

    async def later(env):
        await asyncio.sleep(0.01)
        for i in range(5):
            await get(100 + i)
        await asyncio.gather(*(query(env, i) for i in range(5)))

    async def main(env):
        for i in range(5):
            await query(env, i)
        await asyncio.gather(*(query(env, i) for i in range(5)))
        tasks = [asyncio.create_task(get(i)) for i in range(10)]
        worker.ctx.waitUntil(later(env))
        await asyncio.gather(*tasks)
        return "{tag}"
"""
"""20 subrequests in the call (direct, gathered, create_task'd), 10 more in
its waitUntil work: 15 D1 queries and 15 fetches, 30 in all."""


def test_counts_are_per_invocation_even_when_two_interleave(
    hosts: dict[str, Host], server: Server
) -> None:
    free = hosts["free"]
    since = len(free.output())
    with ThreadPoolExecutor(2) as pool:
        tags = list(
            pool.map(lambda tag: free.python(MIXED.format(url=server.url, tag=tag)), ["a", "b"])
        )
    assert tags == ["a", "b"]
    lines = invocations(free, since, 2)
    assert [(i["subrequests"], i["d1_queries"], i.get("refused", 0)) for i in lines] == [
        (30, 15, 0),
        (30, 15, 0),
    ]
    assert all(i["outcome"] == "ok" for i in lines)
    assert len(server.seen) == 30


def test_paid_plan_fails_the_1001st_d1_query(hosts: dict[str, Host]) -> None:
    paid = hosts["paid"]
    since = len(paid.output())
    done, error = paid.python(D1_LOOP.format(n=1001))
    assert (done, error) == (1000, f"Error: {TOO_MANY_API_REQUESTS}")
    [line] = invocations(paid, since)
    assert (line["plan"], line["subrequests"], line["d1_queries"], line["refused"]) == (
        "paid",
        1000,
        1000,
        1,
    )


def test_wait_until_work_past_its_window_is_cut(hosts: dict[str, Host]) -> None:
    """The paid host cuts waitUntil work 2 s (--wait-until-s) after the
    response; this work sleeps 6 s between its two queries."""
    paid = hosts["paid"]
    since = len(paid.output())
    assert (
        paid.python(
            """
            import asyncio

            async def later(env):
                await env.DB.prepare("SELECT 1").all()
                await asyncio.sleep(6)
                await env.DB.prepare("SELECT 2").all()
                print("the cut work went on")

            async def main(env):
                worker.ctx.waitUntil(later(env))
                return "queued"
            """
        )
        == "queued"
    )
    paid.idle()  # returns at the cut, not when the work ends
    [line] = invocations(paid, since)
    assert (line["d1_queries"], line["wait_until_cancelled"], line["outcome"]) == (1, 1, "ok")
    assert any(WAIT_UNTIL_CANCELLED in out for out in paid.output()[since:])
    lines = paid.wait_for_output("cancelled waitUntil work of a test invocation failed", since)
    assert any("can do no more I/O" in out for out in lines)
    assert not any("the cut work went on" in out for out in paid.output()[since:])


def test_cpu_is_reported_and_grows_with_a_cpu_heavy_invocation(hosts: dict[str, Host]) -> None:
    paid = hosts["paid"]
    light = "async def main(env):\n    return 1\n"
    heavy = f"async def main(env):\n    {BUSY}\n    return 2\n"
    cpu = []
    for source in (light, light, heavy):
        since = len(paid.output())
        paid.python(source)
        cpu.append(invocations(paid, since)[0]["cpu_ms"])
    assert cpu[2] > 100 and cpu[2] > 10 * cpu[1], cpu
    # The drain's own line carries its invocation's CPU and subrequests too.
    since = len(paid.output())
    paid.scheduled()
    [drain] = events(paid, since, "d1queue.drain")
    [line] = invocations(paid, since)
    assert drain["cpu_ms"] == line["cpu_ms"] > 0
    assert drain["host_subrequests"] == line["subrequests"] > 0
    assert drain["host_d1_queries"] == line["d1_queries"]


def test_cpu_enforcement_fails_a_cpu_heavy_invocation_at_its_next_io(
    hosts: dict[str, Host],
) -> None:
    strict = hosts["free_cpu"]
    since = len(strict.output())
    status, answer = python_reply(
        strict,
        f"""
        async def main(env):
            {BUSY}
            await env.DB.prepare("SELECT 1").all()
            return "not reached"
        """,
    )
    assert status == 503
    assert answer["outcome"] == "exceededCpu"
    assert CPU_EXCEEDED in answer["error"] and "1102" in answer["error"]
    assert PYTHON_CPU_EXCEEDED in answer["detail"]["error"]  # what the D1 call raised
    [line] = invocations(strict, since)
    assert (line["outcome"], line["d1_queries"], line["refused"]) == ("exceededCpu", 0, 1)
    assert line["cpu_ms"] > 10


def test_cpu_enforcement_answers_fetch_503_scheduled_500_and_fails_rpc(
    hosts: dict[str, Host],
) -> None:
    """The Worker's own handlers made CPU-heavy (patched on its class)."""
    strict = hosts["free_cpu"]
    since = len(strict.output())
    python_reply(  # this call's own outcome does not matter
        strict,
        f"""
        def heavy(original):
            async def run(self, *args, **kwargs):
                {BUSY}
                return await original(self, *args, **kwargs)
            return run

        async def main(env):
            cls = type(worker)
            for name in ("fetch", "scheduled", "stats"):
                setattr(cls, name, heavy(getattr(cls, name)))
        """,
    )
    invocations(strict, since)
    since = len(strict.output())
    reply = strict.get("/health")
    assert reply.status == 503
    assert CPU_EXCEEDED in reply.text and "1102" in reply.text
    reply = strict.get("/__scheduled?cron=*+*+*+*+*")
    assert reply.status == 500 and CPU_EXCEEDED in reply.text
    assert strict.post("/__test/rpc/stats", json=[]).json() == {"ok": False, "error": CPU_EXCEEDED}
    lines = invocations(strict, since, 3)
    assert [(i["kind"], i["outcome"]) for i in lines] == [
        ("fetch", "exceededCpu"),
        ("scheduled", "exceededCpu"),
        ("rpc", "exceededCpu"),
    ]


def test_a_scheduled_run_past_its_wall_time_is_cut() -> None:
    """Cron runs may take 15 minutes of wall time; this host allows 2 s
    (--scheduled-s). The run's only job waits 4 s for its server: the run is
    cut, and its settle, which comes after, can do no more I/O."""
    from ..http_server import running_server

    host = start_host("--plan", "paid", "--scheduled-s", "2")
    try:
        with running_server() as server:
            server.script["/slow"] = [(200, {}, "late", 4.0)]
            pushed = host.api(
                "POST",
                "/v1/queues/default/jobs",
                {"name": "http.request", "payload": {"url": f"{server.url}/slow"}},
            )
            assert pushed.status == 201
            since = len(host.output())
            reply = host.get("/__scheduled?cron=*+*+*+*+*")
            assert (reply.status, reply.text.strip()) == (
                500,
                "Scheduled event outcome: exceededWallTime",
            )
            lines = host.wait_for_output('"kind":"scheduled"', since)
            line = next(json.loads(x) for x in lines if '"kind":"scheduled"' in x)
            assert (line["outcome"], line["wall_ms"] < 3000) == ("exceededWallTime", True)
            # The drain, cut before it could settle, says so.
            [report] = events(host, since, "d1queue.drain")
            assert (report["claimed"], report["completed"]) == (1, 0)
            assert report["unsettled"] == [pushed.json()["id"]]
    finally:
        host.stop()
