"""The Worker under Cloudflare's per-invocation limits, enforced by the host
(limits mode): successive free-plan cron runs drain I/O-heavy jobs without
ever crossing a cap, a handler past its declared subrequests is retried,
drain-on-push leaves jobs too long for `waitUntil` to the cron, and CPU shows
in the drain's log line. Counts are asserted, never timings."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..http_server import Server, running_server
from .conftest import Host, start_host

LIMIT_ERRORS = re.compile(r"Too many subrequests|Too many API requests|have been cancelled", re.I)


def lines_of(host: Host, since: int, event: str) -> list[dict[str, Any]]:
    out = []
    for line in host.output()[since:]:
        if line.startswith("{") and f'"{event}"' in line:
            out.append(json.loads(line))
    return out


def wait_lines(
    host: Host, since: int, event: str, done: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The `event` lines since `since`, once `done` says they are all there:
    the host prints a drain's line when its invocation ends, which may be
    after the HTTP answer."""
    deadline = time.monotonic() + 60
    while not done(lines := lines_of(host, since, event)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


@pytest.fixture(scope="module")
def free_host() -> Iterator[Host]:
    """The Worker on a host enforcing the free plan's caps. CPU is reported,
    not enforced: the host's CPU only approximates production's."""
    h = start_host("--plan", "free", "--cpu", "warn", "--var", "D1QUEUE_DRAIN_ON_PUSH=true")
    yield h
    h.stop()


@pytest.fixture
def server() -> Iterator[Server]:
    with running_server() as s:
        yield s


def test_io_jobs_drain_over_free_plan_cron_runs_within_every_cap(
    free_host: Host, server: Server
) -> None:
    free_host.reset()
    since = len(free_host.output())
    jobs = [{"name": "example.ping", "payload": {"url": f"{server.url}/p/{i}"}} for i in range(200)]
    for start in range(0, 200, 100):
        pushed = free_host.rpc("dispatch_batch", "default", jobs[start : start + 100])
        assert len(pushed["ids"]) == 100
    runs = 0
    while free_host.rpc("stats", "default")["ready"] and runs < 120:
        free_host.scheduled()
        runs += 1
    free_host.idle()
    drains = wait_lines(  # cron runs, and the drains the pushes started
        free_host, since, "d1queue.drain", lambda ds: sum(d["completed"] for d in ds) >= 400
    )
    invocations = [
        i for i in lines_of(free_host, since, "d1queue.invocation") if i.get("kind") == "scheduled"
    ]
    # Each ping makes one fetch and one D1 query (it dispatches an echo job):
    # 400 jobs in all, 5 a run (the free plan's job cap).
    assert sum(d["completed"] for d in drains) == 400
    assert sum(d["retried"] + d["failed"] + d["stale"] for d in drains) == 0
    assert max(i["subrequests"] for i in invocations) <= 50
    assert all(i["outcome"] == "ok" for i in invocations), invocations
    assert not [line for line in free_host.output()[since:] if LIMIT_ERRORS.search(line)]
    assert Counter(path for _, path, _, _ in server.seen) == Counter(
        f"/p/{i}" for i in range(200)
    ), "every job fetched once: none ran twice"
    print(
        f"200 pings + 200 echoes over {runs} free-plan cron runs: "
        f"max {max(i['subrequests'] for i in invocations)} subrequests a run, "
        f"CPU per run: {sorted(round(d['cpu_ms']) for d in drains)}"
    )


def test_a_handler_fetching_past_its_declaration_is_retried_with_the_budget_error(
    free_host: Host, server: Server
) -> None:
    free_host.reset()
    result = free_host.python(
        f"""
        from d1queue import Config, D1Queue, Registry, drain
        from d1queue.core.limits import PLANS, Meter
        from d1queue.core.outbound import HostRules
        from d1queue.store.binding import Binding
        from d1queue.interfaces.cloudflare import job_fetch

        async def main(env):
            reg = Registry()

            @reg.job("greedy", subrequests=1)
            async def greedy(payload, ctx):
                for _ in range(3):
                    await ctx.fetch("{server.url}/greedy")

            meter = Meter.for_plan(PLANS["free"])
            queue = D1Queue(Binding(env.DB, meter=meter))
            await queue.dispatch("greedy", None)
            local = Config(http_allow=HostRules.parse("public,loopback"))  # the test's server
            report = await drain(queue, reg, local, env=env, fetch=job_fetch)
            row = await queue.binding.run("SELECT last_error FROM d1queue_jobs")
            return {{"retried": report.retried, "error": row.rows[0]["last_error"]}}
        """
    )
    assert result["retried"] == 1
    assert "SubrequestLimitExceeded" in result["error"]
    assert "declared subrequests=1" in result["error"]
    assert len(server.seen) == 1, "the second fetch was refused before it was sent"


def test_drain_on_push_leaves_a_65_s_job_to_the_cron(free_host: Host, server: Server) -> None:
    free_host.reset()
    since = len(free_host.output())
    reply = free_host.api(
        "POST",
        "/v1/queues/hooks/jobs",
        {"name": "http.request", "payload": {"url": f"{server.url}/h"}},
    )
    assert reply.status == 201
    free_host.idle()
    (pushed,) = wait_lines(free_host, since, "d1queue.drain", lambda ds: len(ds) >= 1)
    assert (pushed["claimed"], pushed["stopped"]) == (0, "window")
    job = free_host.api("GET", f"/v1/jobs/{reply.json()['id']}").json()
    assert (job["state"], job["attempts"]) == ("ready", 0)
    assert server.seen == []


def test_a_cpu_heavy_job_shows_in_the_reported_cpu(free_host: Host) -> None:
    def drain_cpu(loops: int) -> float:
        since = len(free_host.output())
        free_host.python(
            f"""
            from d1queue import Config, D1Queue, Registry, drain

            async def main(env):
                reg = Registry()

                @reg.job("burn")
                async def burn(payload):
                    n = 0
                    for i in range({loops}):
                        n += i * i
                    return n

                queue = D1Queue(env.DB)
                await queue.dispatch("burn", None)
                report = await drain(queue, reg, Config())
                print('{{"event": "d1queue.drain", "trigger": "test"}}')
                assert report.completed == 1
            """
        )
        (line,) = [
            d
            for d in wait_lines(
                free_host,
                since,
                "d1queue.drain",
                lambda ds: any(d.get("trigger") == "test" for d in ds),
            )
            if d.get("trigger") == "test"
        ]
        return float(line["cpu_ms"])

    free_host.reset()
    light, heavy = drain_cpu(1), drain_cpu(2_000_000)
    print(f"drain CPU: {light:.1f} ms with a trivial job, {heavy:.1f} ms with 2M loop steps")
    assert heavy > light + 50
