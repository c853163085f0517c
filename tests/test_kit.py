"""The test kit runs a job as the drain does: `run_job`'s outcome is the one
a drain stores for the same job, attempt and configuration; the Kit's clock
brings delayed jobs and retries due without sleeping; the pytest plugin's
fixtures run async tests with no async plugin."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from d1queue import Backoff, Config, Fail, Registry, Retry, drain
from d1queue.core.outbound import HostRules
from d1queue.interfaces.testing import Clock, Kit, database, enqueued, failed, run_job

from .conftest import ROOT

T0 = 1_700_000_000_000


async def answer(url: str, **request: Any) -> Any:
    """A fetch double: every request is answered 200."""
    return SimpleNamespace(status=200)


def jobs() -> Registry:
    registry = Registry()
    exact = Backoff(base_s=10, jitter=False)

    @registry.job("over.budget", subrequests=1, backoff=exact)
    async def over_budget(payload: Any, ctx: Any) -> None:
        await ctx.queue.dispatch("noop", 1)
        await ctx.queue.dispatch("noop", 2)  # the second call was not declared

    @registry.job("swallows", subrequests=0, backoff=exact)
    async def swallows(payload: Any, ctx: Any) -> None:
        # The refusal caught: the attempt must still not count as done.
        with contextlib.suppress(Exception):
            await ctx.queue.dispatch("noop")

    @registry.job("within.budget", subrequests=2)
    async def within_budget(payload: Any, ctx: Any) -> None:
        await ctx.queue.dispatch("noop", payload)
        await ctx.fetch("https://example.com/")

    @registry.job("declares.too.many", subrequests=49)
    async def declares_too_many(payload: Any, ctx: Any) -> None:
        pass

    @registry.job("fails")
    async def fails(payload: Any) -> None:
        raise Fail("no recipient")

    @registry.job("retries", backoff=exact)
    async def retries(payload: Any) -> None:
        raise Retry("busy", delay_s=60)

    @registry.job("raises", max_attempts=2, backoff=exact)
    async def raises(payload: Any) -> None:
        raise RuntimeError("boom")

    @registry.job("slow", timeout_s=0.05, backoff=exact)
    async def slow(payload: Any) -> None:
        await asyncio.sleep(5)

    @registry.job("fetches", subrequests=1)
    async def fetches(payload: Any, ctx: Any) -> None:
        await ctx.fetch(payload)

    @registry.job("checks.payload")
    async def checks_payload(payload: Any) -> None:
        if payload != {"pair": [1, 2]}:
            raise Fail(f"got {payload!r}")

    @registry.job("noop")
    async def noop(payload: Any) -> None:
        pass

    return registry


async def drained(
    registry: Registry, name: str, payload: Any, *, attempt: int = 1, config: Config | None = None
) -> tuple[str, str | None, float]:
    """(action, error, delay_s) of the job as a drain settles it."""
    kit = Kit(registry, clock=Clock(T0), config=config, fetch=answer)
    await kit.dispatch(name, payload)
    kit.db.query("UPDATE d1queue_jobs SET attempts = ?", attempt - 1)  # attempts spent before
    report = await drain(kit.queue, registry, kit.config, fetch=answer)
    assert report.claimed == 1
    if report.completed:
        return "complete", None, 0.0
    if report.failed:
        return "fail", kit.failed(name)[0].error, 0.0
    (job,) = kit.enqueued(name)
    return "retry", job.last_error, (job.available_at - T0) / 1000


CASES = [
    ("over.budget", None, 1),
    ("swallows", None, 1),
    ("within.budget", 7, 1),
    ("declares.too.many", None, 1),
    ("fails", None, 1),
    ("retries", None, 1),
    ("retries", None, 3),  # the last attempt: failed, not retried
    ("raises", None, 1),
    ("raises", None, 2),
    ("slow", None, 1),
    ("fetches", "https://example.com/", 1),
    ("fetches", "http://127.0.0.1/admin", 1),  # refused by the default outbound rules
    ("checks.payload", {"pair": (1, 2)}, 1),  # read back from JSON: the tuple is a list
]


@pytest.mark.parametrize(("name", "payload", "attempt"), CASES)
async def test_run_job_decides_what_the_drain_decides(
    name: str, payload: Any, attempt: int
) -> None:
    registry = jobs()
    outcome = await run_job(registry, name, payload, attempt=attempt, fetch=answer, clock=Clock(T0))
    expected = await drained(registry, name, payload, attempt=attempt)
    assert (outcome.action, outcome.error, outcome.delay_s) == expected


async def test_a_call_past_the_declared_subrequests_is_retried_with_the_budget_error() -> None:
    outcome = await run_job(jobs(), "over.budget")
    assert outcome.action == "retry" and outcome.delay_s == 10
    assert outcome.error is not None
    assert outcome.error.startswith(
        "SubrequestLimitExceeded: job 'over.budget', which declared subrequests=1, may make 1"
    )


async def test_the_outbound_rules_come_from_the_config() -> None:
    registry = jobs()
    internal = "http://127.0.0.1/admin"
    refused = await run_job(registry, "fetches", internal, fetch=answer)
    assert refused.action == "fail" and "not allowed by D1QUEUE_HTTP_ALLOW" in str(refused.error)
    opened = Config(http_allow=HostRules.parse("loopback"))
    allowed = await run_job(registry, "fetches", internal, fetch=answer, config=opened)
    assert allowed.action == "complete"
    assert await drained(registry, "fetches", internal, config=opened) == ("complete", None, 0.0)


async def test_the_follow_ups_go_to_the_database_given() -> None:
    db = database()
    assert (await run_job(jobs(), "within.budget", 7, db=db, fetch=answer)).action == "complete"
    assert [j.payload for j in enqueued(db, "noop")] == [7]


async def test_a_lease_shorter_than_a_timeout_is_refused_as_the_drain_refuses_it() -> None:
    short = Config(reservation_s=1)
    with pytest.raises(ValueError, match="must cover the longest job timeout"):
        await run_job(jobs(), "noop", config=short)


async def test_an_unknown_job_or_attempt_is_an_error() -> None:
    with pytest.raises(KeyError, match="no job is registered"):
        await run_job(jobs(), "nope")
    with pytest.raises(ValueError, match="attempt counts from 1"):
        await run_job(jobs(), "noop", attempt=0)


async def test_a_delayed_job_runs_once_the_clock_reaches_it() -> None:
    kit = Kit(jobs(), clock=Clock(T0))
    await kit.dispatch("noop", delay_s=30)
    assert (await kit.run_due()).claimed == 0
    kit.advance(29.999)
    assert (await kit.run_due()).claimed == 0
    kit.advance(0.001)
    assert (await kit.run_due()).completed == 1
    assert kit.enqueued() == []


async def test_a_retry_waits_its_backoff_then_fails_on_the_last_attempt() -> None:
    kit = Kit(jobs(), clock=Clock(T0))
    await kit.dispatch("raises")
    assert (await kit.run_due()).retried == 1
    (job,) = kit.enqueued("raises")
    assert (job.attempts, job.available_at - T0) == (1, 10_000)
    assert (await kit.run_due()).claimed == 0  # its backoff has not passed
    assert kit.advance_to_next() == 10
    report = await kit.run_due()
    assert (report.claimed, report.failed) == (1, 1)
    (gone,) = kit.failed("raises")
    assert gone.error.startswith("RuntimeError: boom") and gone.error.endswith("(attempt 2 of 2)")


async def test_run_due_runs_follow_ups_past_one_drains_job_cap() -> None:
    registry = jobs()
    kit = Kit(registry, clock=Clock(T0))
    for i in range(12):  # the free plan's drain claims 5 jobs a run
        await kit.dispatch("within.budget", i)
    kit.fetch = answer
    report = await kit.run_due()
    assert report.completed == 24 and report.claimed == 24
    assert kit.enqueued() == [] and failed(kit.db) == []


async def test_run_due_stops_a_job_that_always_queues_another() -> None:
    registry = Registry()

    @registry.job("again", subrequests=1)
    async def again(payload: Any, ctx: Any) -> None:
        await ctx.queue.dispatch("again")

    kit = Kit(registry)
    await kit.dispatch("again")
    with pytest.raises(RuntimeError, match="still due after 100 drains"):
        await kit.run_due()


def test_the_clock_moves_forward_only() -> None:
    clock = Clock(T0)
    clock.advance(1.5)
    assert clock() == T0 + 1500
    with pytest.raises(ValueError, match="forward only"):
        clock.advance(-1)


PLUGIN_PROJECT = """
import asyncio

import pytest

from d1queue import Registry

registry = Registry()


@registry.job("later")
async def later(payload):
    pass


@pytest.fixture
def d1queue_registry():
    return registry


async def test_the_kit_fixture_runs_without_an_async_plugin(d1queue, d1queue_db, d1queue_clock):
    assert d1queue.db is d1queue_db and d1queue.clock is d1queue_clock
    await d1queue.dispatch("later", delay_s=5)
    d1queue.advance(5)
    assert (await d1queue.run_due()).completed == 1


@pytest.mark.d1queue
async def test_a_marked_test_runs_too():
    await asyncio.sleep(0)


async def test_another_async_test_is_not_taken_over():
    pass
"""


def pytest_with_the_plugin_alone(project: Path) -> subprocess.CompletedProcess[str]:
    """pytest in `project` with d1queue's plugin and no other: with no plugin
    loaded from the environment, pytest-asyncio and anyio included, the
    plugin is loaded from this checkout whether or not the installed
    d1queue declares its entry point."""
    (project / "pytest.ini").write_text("[pytest]\n")  # not this repository's settings
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "d1queue.interfaces.pytest_plugin", str(project)],
        cwd=project, capture_output=True, text=True, check=False,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin",
             "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip


def test_the_plugin_runs_its_async_tests_without_pytest_asyncio(tmp_path: Path) -> None:
    (tmp_path / "test_plugin.py").write_text(PLUGIN_PROJECT)
    run = pytest_with_the_plugin_alone(tmp_path)
    assert "1 failed, 2 passed" in run.stdout, run.stdout + run.stderr
    assert "test_another_async_test_is_not_taken_over" in run.stdout
    assert "async def functions are not natively supported" in run.stdout


def test_the_registry_fixture_says_it_must_be_overridden(tmp_path: Path) -> None:
    (tmp_path / "test_none.py").write_text("async def test_it(d1queue):\n    pass\n")
    run = pytest_with_the_plugin_alone(tmp_path)
    assert "1 error" in run.stdout, run.stdout + run.stderr
    assert "define a fixture named `d1queue_registry`" in run.stdout
