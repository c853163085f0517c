"""Attempt history, progress and per-job log lines (core/history.py,
core/runs.py): what each attempt leaves with its job, through the API, the
failed store and the completed history, and what D1's faults cannot do to
it (no attempt recorded twice, progress never moved back). Real SQLite."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from d1queue import Backoff, Config, D1Queue, JobContext, Registry, drain
from d1queue.core import runs
from d1queue.core.bounds import (
    MAX_LOG_LINES,
    MAX_PROGRESS_NOTE,
    MAX_RUN_BYTES,
    MAX_RUNS,
)
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import settle, sql
from d1queue.store.binding import Binding, RetryPolicy

from .conftest import Clock
from .test_api import TOKEN, Client

NO_WAIT = RetryPolicy(tries=5, base_s=0, cap_s=0)


@pytest.fixture
def kept(db: SqliteD1, clock: Clock) -> D1Queue:
    """A queue keeping completed jobs, re-sending lost replies at once."""
    return D1Queue(Binding(db, retry=NO_WAIT), clock=clock, keep_completed=True)


class Mono:
    """runs.time's stand-in: a monotonic clock that moves when told."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t


@pytest.fixture
def mono(monkeypatch: pytest.MonkeyPatch) -> Mono:
    m = Mono()
    monkeypatch.setattr(runs, "time", SimpleNamespace(monotonic=m.monotonic))
    return m


def flaky(clock: Clock, fails: int = 2, **opts: Any) -> Registry:
    """`flaky` runs 1.5 s (the test clock's), raising on its first `fails`
    attempts."""
    reg = Registry()

    @reg.job("flaky", backoff=Backoff(base_s=1, jitter=False), **opts)
    async def run(payload: Any, ctx: JobContext) -> dict[str, int]:
        clock.advance(1.5)
        if ctx.attempt <= fails:
            raise RuntimeError(f"boom on attempt {ctx.attempt}")
        return {"attempt": ctx.attempt}

    return reg


async def run_out(queue: D1Queue, reg: Registry, clock: Clock, times: int) -> None:
    for _ in range(times):
        await drain(queue, reg, Config(plan="paid"))
        clock.advance(3600)


def runs_of(db: SqliteD1, table: str = "d1queue_jobs") -> list[dict[str, Any]]:
    (row,) = db.query(f"SELECT runs FROM {table}")
    return json.loads(row["runs"]) if row["runs"] else []


async def test_failing_twice_then_succeeding_shows_three_attempts_through_the_api(
    db: SqliteD1, kept: D1Queue, clock: Clock
) -> None:
    reg = flaky(clock, max_attempts=3)
    client = Client(Api(Service(kept, reg), TOKEN, "1", SPEC), db)
    r = await client("POST", "/v1/queues/default/jobs", {"name": "flaky"})
    job_id = r.body["id"]
    starts = []
    for _ in range(3):
        starts.append(clock())
        await drain(kept, reg, Config(plan="paid"))
        clock.advance(60)
    got = await client("GET", f"/v1/jobs/{job_id}")
    assert got.status == 200 and got.body["state"] == "completed"
    history = got.body["runs"]
    assert [(h["attempt"], h["outcome"], h["duration_ms"]) for h in history] == [
        (1, "retried", 1500),
        (2, "retried", 1500),
        (3, "completed", 1500),
    ]
    assert [h["started_at"] for h in history] == starts
    for n, h in zip((1, 2), history, strict=False):
        # The error, and where it was raised: the traceback's last frames.
        assert h["error"].startswith(f"RuntimeError: boom on attempt {n} (at ")
        assert "in run" in h["error"]
    assert "error" not in history[2]
    assert got.body["started_at"] is None and got.body["progress"] is None
    # The completed history's page shows the same.
    page = await client("GET", "/v1/queues/default/completed")
    assert page.body["jobs"][0]["runs"] == history


async def test_the_failed_store_keeps_the_history_and_a_retry_carries_it_on(
    db: SqliteD1, kept: D1Queue, clock: Clock
) -> None:
    reg = flaky(clock, fails=99)
    client = Client(Api(Service(kept, reg), TOKEN, "1", SPEC), db)
    job_id = await kept.dispatch("flaky", None, max_attempts=2)
    await run_out(kept, reg, clock, 2)
    got = await client("GET", f"/v1/jobs/{job_id}")
    assert got.body["state"] == "failed"
    assert [(h["attempt"], h["outcome"]) for h in got.body["runs"]] == [
        (1, "retried"),
        (2, "failed"),
    ]
    listed = await client("GET", "/v1/failed")
    assert listed.body["jobs"][0]["runs"] == got.body["runs"]
    assert (await client("POST", f"/v1/failed/{job_id}/retry")).status == 200
    await run_out(kept, reg, clock, 1)
    assert [(h["attempt"], h["outcome"]) for h in runs_of(db)] == [
        (1, "retried"),
        (2, "failed"),
        (3, "retried"),
    ]


async def test_the_history_keeps_the_latest_attempts(
    kept: D1Queue, clock: Clock, db: SqliteD1
) -> None:
    reg = flaky(clock, fails=99)
    await kept.dispatch("flaky", None, max_attempts=MAX_RUNS + 3)
    await run_out(kept, reg, clock, MAX_RUNS + 2)
    assert [h["attempt"] for h in runs_of(db)] == list(range(3, MAX_RUNS + 3))


@pytest.mark.parametrize(
    "lost",
    [sql.RETRY, sql.COMPLETE_HELD, sql.FAIL_RECORD, sql.COMPLETE_HELD_BATCH],
)
async def test_a_settle_re_sent_after_a_lost_reply_records_its_attempt_once(
    kept: D1Queue, db: SqliteD1, clock: Clock, lost: str
) -> None:
    fails = {sql.RETRY: 1, sql.COMPLETE_HELD: 0, sql.FAIL_RECORD: 99}.get(lost, 0)
    reg = flaky(clock, fails=fails)
    for _ in range(2 if lost == sql.COMPLETE_HELD_BATCH else 1):
        await kept.dispatch("flaky", None, max_attempts=1 if lost == sql.FAIL_RECORD else 3)
    fault = db.lose_reply_when(lambda text: text == lost)
    report = await drain(kept, reg, Config(plan="paid"))
    assert fault.times == 0, "the reply was lost, and the settle re-sent"
    assert report.unsettled == [] and report.stale == 0 and report.resent >= 1
    table = "d1queue_failed_jobs" if lost == sql.FAIL_RECORD else "d1queue_jobs"
    for row in db.query(f"SELECT runs FROM {table}"):
        assert [h["attempt"] for h in json.loads(row["runs"])] == [1]


async def test_a_handler_using_none_of_it_sends_what_it_sent_before(
    kept: D1Queue, clock: Clock
) -> None:
    """The history rides in the settle: no statement more, none for a
    handler that never reports progress."""
    reg = flaky(clock, fails=1)
    for _ in range(3):
        await kept.dispatch("flaky", None)
    before = dict(kept.binding.usage.by_name)
    await run_out(kept, reg, clock, 2)
    used = {k: v - before.get(k, 0) for k, v in kept.binding.usage.by_name.items()}
    assert "SET_PROGRESS" not in used
    assert used["RETRY"] == 3 and used["COMPLETE_HELD_BATCH"] == 1


def stepper(clock: Clock, mono: Mono, db: SqliteD1, seen: list[Any], **opts: Any) -> Registry:
    reg = Registry()

    @reg.job("steps", **opts)
    async def run(payload: Any, ctx: JobContext) -> None:
        for i in range(1, 5):
            ctx.log.info("step %d", i)
            await ctx.progress(i, note=f"step {i}")
            (row,) = db.query("SELECT progress FROM d1queue_jobs")
            seen.append(json.loads(row["progress"]) if row["progress"] else None)
            mono.t += 1.0  # two reports a PROGRESS_INTERVAL_S

    return reg


async def test_progress_is_written_at_most_once_an_interval_and_last_with_the_settle(
    kept: D1Queue, db: SqliteD1, clock: Clock, mono: Mono
) -> None:
    assert runs.PROGRESS_INTERVAL_S == 2.0
    seen: list[Any] = []
    reg = stepper(clock, mono, db, seen, subrequests=5)
    client = Client(Api(Service(kept, reg), TOKEN, "1", SPEC), db)
    job_id = await kept.dispatch("steps", None)
    await drain(kept, reg, Config(plan="paid"))
    # Reports 1 and 3 were written (with the log lines so far); 2 and 4
    # coalesced, 4 written by the settle.
    assert [(s["value"], s["note"], len(s["logs"])) for s in seen] == [
        (1, "step 1", 1),
        (1, "step 1", 1),
        (3, "step 3", 3),
        (3, "step 3", 3),
    ]
    assert kept.binding.usage.by_name["SET_PROGRESS"] == 2
    got = (await client("GET", f"/v1/jobs/{job_id}")).body
    assert got["progress"]["value"] == 4 and got["progress"]["note"] == "step 4"
    (entry,) = got["runs"]
    assert entry["progress"]["value"] == 4
    assert [line["message"] for line in entry["logs"]] == [f"step {i}" for i in range(1, 5)]
    assert {line["level"] for line in entry["logs"]} == {"info"}


async def test_a_running_job_shows_its_start_progress_and_log_lines(
    kept: D1Queue, db: SqliteD1, clock: Clock, mono: Mono
) -> None:
    reg = Registry()
    views: list[dict[str, Any]] = []
    client = Client(Api(Service(kept, reg), TOKEN, "1", SPEC), db)

    @reg.job("watched", subrequests=1)
    async def watched(payload: Any, ctx: JobContext) -> None:
        ctx.log.warning("halfway")
        await ctx.progress(0.5, note="half")
        views.append((await client("GET", f"/v1/jobs/{ctx.job.id}")).body)

    job_id = await kept.dispatch("watched", None)
    start = clock()
    await drain(kept, reg, Config(plan="paid"))
    (running,) = views
    assert running["state"] == "reserved" and running["started_at"] == start
    assert running["progress"] == {
        "attempt": 1,
        "value": 0.5,
        "note": "half",
        "at": running["progress"]["at"],
    }
    assert [(x["level"], x["message"]) for x in running["logs"]] == [("warning", "halfway")]
    done = (await client("GET", f"/v1/jobs/{job_id}")).body
    assert done["started_at"] is None and done["logs"] is None


async def test_progress_past_the_declared_subrequests_waits_for_the_settle(
    kept: D1Queue, db: SqliteD1, clock: Clock, mono: Mono
) -> None:
    """Each write is a subrequest of the job's declared plan; with none
    left the report is kept for the settle, and the job is not refused."""
    seen: list[Any] = []
    reg = stepper(clock, mono, db, seen, subrequests=1)
    await kept.dispatch("steps", None)
    report = await drain(kept, reg, Config(plan="paid"))
    assert report.completed == 1 and report.retried == 0
    assert kept.binding.usage.by_name["SET_PROGRESS"] == 1
    (row,) = db.query("SELECT progress FROM d1queue_jobs")
    assert json.loads(row["progress"])["value"] == 4


async def test_a_huge_note_is_a_clear_error_in_the_handler_and_writes_nothing(
    kept: D1Queue, db: SqliteD1, clock: Clock, mono: Mono
) -> None:
    reg = Registry()

    @reg.job("loud", max_attempts=1, subrequests=1)
    async def loud(payload: Any, ctx: JobContext) -> None:
        await ctx.progress(0.1, note="x" * (MAX_PROGRESS_NOTE + 1))

    job_id = await kept.dispatch("loud", None, max_attempts=1)
    await drain(kept, reg, Config(plan="paid"))
    failed = await kept.failed_jobs()
    assert failed[0].id == job_id
    assert f"a progress note is at most {MAX_PROGRESS_NOTE} characters" in failed[0].error
    assert "progress" not in failed[0].runs[0]
    assert kept.binding.usage.by_name.get("SET_PROGRESS", 0) == 0
    for bad in (-1, float("nan"), float("inf"), True, "half"):
        with pytest.raises((TypeError, ValueError)):
            runs.check_progress(bad, None)


async def test_log_lines_are_bounded_and_also_json_log_lines(
    kept: D1Queue, db: SqliteD1, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    reg = Registry()
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    @reg.job("chatty")
    async def chatty(payload: Any, ctx: JobContext) -> None:
        for i in range(MAX_LOG_LINES + 10):
            ctx.log.info("line %d", i)
        ctx.log.debug("not kept: below INFO")

    job_id = await kept.dispatch("chatty", None, traceparent=trace)
    lines: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = lines.append  # type: ignore[method-assign]
    jlog = logging.getLogger(runs.JOB_LOGGER)
    jlog.addHandler(handler)
    caplog.set_level(logging.INFO, logger=runs.JOB_LOGGER)
    try:
        await drain(kept, reg, Config(plan="paid"))
    finally:
        jlog.removeHandler(handler)
    (entry,) = runs_of(db)
    assert len(entry["logs"]) == MAX_LOG_LINES and entry["logs_truncated"] == 10
    assert entry["logs"][-1]["message"] == f"line {MAX_LOG_LINES - 1}"
    assert len(lines) == MAX_LOG_LINES + 10
    fields = lines[0].d1queue_fields  # type: ignore[attr-defined]
    assert fields["id"] == job_id and fields["trace_id"] == trace[3:35]
    assert fields["message"] == "line 0"


async def test_an_entry_is_bounded_in_bytes(kept: D1Queue, db: SqliteD1) -> None:
    reg = Registry()

    @reg.job("wide")
    async def wide(payload: Any, ctx: JobContext) -> None:
        for _ in range(MAX_LOG_LINES):
            ctx.log.info("\u2603" * 1000)  # escaped: 6 bytes a character
        raise RuntimeError("\u2603" * 5000)

    await kept.dispatch("wide", None)
    await drain(kept, reg, Config(plan="paid"))
    (row,) = db.query("SELECT runs FROM d1queue_jobs")
    assert len(row["runs"].encode()) <= MAX_RUN_BYTES + 2
    (entry,) = json.loads(row["runs"])
    assert entry["outcome"] == "retried" and entry["logs_truncated"] > 0


async def test_progress_writes_are_fenced_and_never_move_back(
    kept: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    await kept.dispatch("t", None)
    (job,) = await kept.reserve_batch("default", 1)

    def stored() -> Any:
        (row,) = db.query("SELECT progress FROM d1queue_jobs")
        return row["progress"]

    assert await settle.record_progress(kept, job, '{"seq":5,"value":5}', 5) is True
    # A re-send of an earlier write (its reply lost, sent again late) lands nowhere.
    assert await settle.record_progress(kept, job, '{"seq":3,"value":3}', 3) is False
    assert await settle.record_progress(kept, job, '{"seq":5,"value":5}', 5) is False
    assert json.loads(stored())["value"] == 5
    # A drain whose lease lapsed, its job claimed again, writes nothing.
    clock.advance(kept.reservation_s + 1)
    (again,) = await kept.reserve_batch("default", 1)
    assert again.reservation != job.reservation
    assert await settle.record_progress(kept, job, '{"seq":9,"value":9}', 9) is False
    assert json.loads(stored())["value"] == 5
    # Under a lost reply the binding re-sends: the value stays the latest.
    db.lose_reply_when(lambda text: text == sql.SET_PROGRESS)
    await settle.record_progress(kept, again, '{"seq":7,"value":7}', 7)
    assert json.loads(stored())["value"] == 7


async def test_a_progress_write_d1_refuses_costs_the_job_nothing(
    kept: D1Queue, db: SqliteD1, clock: Clock, mono: Mono, caplog: pytest.LogCaptureFixture
) -> None:
    """A report D1 fails is logged, not raised: the handler goes on, the job
    completes, and its settle writes the report."""
    seen: list[Any] = []
    reg = stepper(clock, mono, db, seen, subrequests=5)
    await kept.dispatch("steps", None)
    db.fail_when(lambda text: text == sql.SET_PROGRESS, "D1_ERROR: no such thing", times=None)
    caplog.set_level(logging.WARNING, logger=runs.JOB_LOGGER)
    report = await drain(kept, reg, Config(plan="paid"))
    assert report.completed == 1 and seen == [None] * 4
    assert [r.getMessage() for r in caplog.records].count("d1queue.job.progress_failed") == 2
    (entry,) = runs_of(db)
    assert entry["outcome"] == "completed" and entry["progress"]["value"] == 4
    (row,) = db.query("SELECT progress FROM d1queue_jobs")
    assert json.loads(row["progress"])["value"] == 4
