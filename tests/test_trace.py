"""Trace context from push to run, and OpenTelemetry's messaging names on the
log: a push's W3C traceparent (the HTTP header, a job's field, a library
option) is checked strictly and stored with its job; bad ones are a 422
that writes nothing; the job's process line carries the trace and the
messaging attributes; follow-ups, retries, dependents and callbacks keep it."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from d1queue import D1Queue, Registry, drain
from d1queue.core.bounds import check_traceparent
from d1queue.core.job import QueuedJob
from d1queue.core.log import install
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql

from .conftest import Clock
from .test_api import AUTH, TOKEN

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE, SPAN = TP[3:35], TP[36:52]
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"

BAD = [
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",  # short flags
    TP + "-extra",
    "",
]


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """The d1queue logger's JSON lines, as a Worker writes them."""
    logger = logging.getLogger("d1queue")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    out = io.StringIO()
    install(stream=out)
    yield out
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def events(out: io.StringIO, name: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in out.getvalue().splitlines()]
    return [e for e in found if e["event"] == name]


def traces(db: SqliteD1) -> dict[str, Any]:
    return {
        r["name"]: r["traceparent"] for r in db.query("SELECT name, traceparent FROM d1queue_jobs")
    }


@pytest.fixture
def pushed() -> list[Any]:
    return []


@pytest.fixture
def reg(pushed: list[Any]) -> Registry:
    reg = Registry()

    @reg.job("t.echo")
    async def echo(payload: Any) -> None: ...

    @reg.job("t.boom", max_attempts=2)
    async def boom(payload: Any) -> None:
        raise KeyError("boom")

    @reg.job("t.parent", subrequests=3)
    async def parent(payload: Any, ctx: Any) -> None:
        pushed.append(await ctx.queue.dispatch("t.echo", {"from": "parent"}))
        job = ctx.queue.new_job("t.child", {}, after=[pushed[-1]])
        ((child, _),) = await ctx.queue.push_many([job])
        pushed.append(child)

    @reg.job("t.child")
    async def child(payload: Any) -> None: ...

    @reg.job("t.done")
    async def done(payload: Any) -> None: ...

    return reg


class Http:
    def __init__(self, api: Api) -> None:
        self.api = api

    async def __call__(self, path: str, body: Any, trace: str | None = None) -> Any:
        headers = dict(AUTH) | ({"traceparent": trace} if trace is not None else {})
        return await self.api.handle(
            "POST", f"https://q.example{path}", headers, json.dumps(body).encode()
        )


@pytest.fixture
def http(queue: D1Queue, reg: Registry) -> Http:
    return Http(Api(Service(queue, reg), TOKEN, "9.9", SPEC))


def test_the_w3c_format_is_checked_strictly() -> None:
    assert check_traceparent(TP) == TP
    assert check_traceparent(None) is None
    for bad in [*BAD, 12]:
        with pytest.raises(ValueError, match="traceparent"):
            check_traceparent(bad)
    with pytest.raises(ValueError):
        QueuedJob.new("t.echo", traceparent=BAD[0])


async def test_the_header_is_stored_with_each_pushed_job(http: Http, db: SqliteD1) -> None:
    r = await http("/v1/queues/q/jobs", {"name": "t.echo"}, TP)
    assert r.status == 201, r.body
    r = await http("/v1/jobs", {"name": "t.done", "traceparent": OTHER}, TP)  # its own wins
    assert r.status == 201, r.body
    r = await http("/v1/queues/q/jobs/batch", {"jobs": [{"name": "t.child"}]}, TP)
    assert r.status == 201, r.body
    r = await http("/v1/jobs", {"name": "t.boom"})
    assert r.status == 201, r.body
    assert traces(db) == {"t.echo": TP, "t.done": OTHER, "t.child": TP, "t.boom": None}


@pytest.mark.parametrize("bad", BAD)
async def test_a_bad_traceparent_is_a_422_that_writes_nothing(
    http: Http, db: SqliteD1, bad: str
) -> None:
    job, own = {"name": "t.echo"}, {"name": "t.echo", "traceparent": bad}
    for path, body, with_own in [
        ("/v1/queues/q/jobs", job, own),
        ("/v1/jobs", job, own),
        ("/v1/queues/q/jobs/batch", {"jobs": [job]}, {"jobs": [job, own]}),
        ("/v1/batches", {"jobs": [job]}, {"jobs": [job], "on_finish": own}),
    ]:
        r = await http(path, body, bad)
        assert (r.status, r.body["error"]["code"]) == (422, "invalid"), (path, r.body)
        assert "traceparent header" in r.body["error"]["message"]
        r = await http(path, with_own)
        assert (r.status, r.body["error"]["code"]) == (422, "invalid"), (path, r.body)
        assert "traceparent" in r.body["error"]["message"]
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == 0


def test_traced_rows_pack_within_d1s_bound_parameter_limit() -> None:
    for batch in (False, True):
        for traced in (False, True):
            most = sql.rows_per_insert(batch=batch, traced=traced)
            text = sql.insert_jobs(most, unique=False, batch=batch, traced=traced)
            assert max(int(n) for n in re.findall(r"\?(\d+)", text)) <= 100
            with pytest.raises(ValueError):
                sql.insert_jobs(most + 1, unique=False, batch=batch, traced=traced)
    # Untraced rows pack as many to a statement as before traces existed.
    assert sql.rows_per_insert(batch=False, traced=False) == sql.INSERT_ROWS_PER_STATEMENT
    assert sql.rows_per_insert(batch=True, traced=False) == sql.BATCH_ROWS_PER_STATEMENT


async def test_a_batch_of_traced_and_untraced_jobs_stores_each_ones(
    queue: D1Queue, db: SqliteD1
) -> None:
    jobs = [
        QueuedJob.new(
            "t.echo",
            {"i": i},
            traceparent=TP if i % 2 else None,
            unique_key=(f"k{i}" if i % 3 == 0 else None),
        )
        for i in range(40)
    ]
    await queue.push_many(jobs)
    rows = db.query("SELECT payload, traceparent FROM d1queue_jobs")
    assert len(rows) == 40
    for r in rows:
        i = json.loads(r["payload"])["i"]
        assert r["traceparent"] == (TP if i % 2 else None)


async def test_the_process_line_carries_the_trace_and_the_messaging_names(
    http: Http, queue: D1Queue, reg: Registry, clock: Clock, lines: io.StringIO
) -> None:
    r = await http("/v1/queues/q/jobs", {"name": "t.echo", "delay_s": 5}, TP)
    job_id = r.body["id"]
    (push,) = events(lines, "d1queue.push")
    assert push["messaging.operation.type"] == "send"
    assert (push["messaging.message.id"], push["trace_id"]) == (job_id, TRACE)
    clock.advance(7)
    await drain(queue, reg)
    (line,) = events(lines, "d1queue.process")
    assert line == line | {
        "messaging.system": "d1queue",
        "messaging.operation.type": "process",
        "messaging.destination.name": "q",
        "messaging.message.id": job_id,
        "name": "t.echo",
        "attempt": 1,
        "outcome": "completed",
        "trace_id": TRACE,
        "parent_span_id": SPAN,
        "level": "info",
    }
    assert line["wait_ms"] >= 2000  # due 5 s after the push, started 7 s after it
    assert line["run_ms"] >= 0
    assert "error.type" not in line


async def test_a_retry_keeps_its_trace_and_names_its_error_type(
    http: Http, queue: D1Queue, reg: Registry, clock: Clock, lines: io.StringIO
) -> None:
    await http("/v1/queues/q/jobs", {"name": "t.boom"}, TP)
    await drain(queue, reg)
    clock.advance(3600)
    await drain(queue, reg)
    runs = events(lines, "d1queue.process")
    assert [(e["attempt"], e["outcome"], e["error.type"], e["trace_id"]) for e in runs] == [
        (1, "retried", "KeyError", TRACE),
        (2, "failed", "KeyError", TRACE),
    ]


async def test_what_a_run_pushes_joins_its_trace(
    http: Http, queue: D1Queue, reg: Registry, db: SqliteD1, pushed: list[str]
) -> None:
    await http("/v1/queues/q/jobs", {"name": "t.parent"}, TP)
    await drain(queue, reg)
    assert len(pushed) == 2
    found = {
        r["id"]: r["traceparent"] for r in db.query("SELECT id, traceparent FROM d1queue_jobs")
    }
    # The follow-up and the job waiting for it, both pushed by the handler.
    assert found[pushed[0]] == found[pushed[1]] == TP


async def test_a_batchs_callback_keeps_the_batch_pushs_trace(
    http: Http, queue: D1Queue, reg: Registry, db: SqliteD1, lines: io.StringIO
) -> None:
    r = await http(
        "/v1/batches", {"jobs": [{"name": "t.echo"}], "on_finish": {"name": "t.done"}}, TP
    )
    assert r.status == 201, r.body
    await drain(queue, reg)
    await drain(queue, reg)
    runs = {e["name"]: e for e in events(lines, "d1queue.process")}
    assert runs["t.done"]["trace_id"] == TRACE
    assert runs["t.echo"]["trace_id"] == TRACE


async def test_which_runs_log_a_process_line_is_a_setting(
    queue: D1Queue, reg: Registry, clock: Clock, lines: io.StringIO
) -> None:
    """notable (the default): a failure or retry, or a traced job's run, but
    not a plain completion; all: every run; off: none."""
    for job_logs, expected in [
        ("notable", ["retried"]),
        ("all", ["completed", "retried"]),
        ("off", []),
    ]:
        lines.truncate(0)
        lines.seek(0)
        await queue.dispatch("t.echo", {}, queue=job_logs)
        await queue.dispatch("t.boom", {}, queue=job_logs)
        await drain(queue, reg, queues=[job_logs], job_logs=job_logs)
        found = events(lines, "d1queue.process")
        assert sorted(e["outcome"] for e in found) == expected, job_logs
        assert all("trace_id" not in e for e in found)
        assert len(events(lines, "d1queue.drain")) == 0
        clock.advance(3600)


async def test_a_library_push_takes_the_option(queue: D1Queue, db: SqliteD1) -> None:
    await queue.dispatch("t.echo", {}, traceparent=TP)
    assert traces(db) == {"t.echo": TP}
    with pytest.raises(ValueError, match="traceparent"):
        await queue.dispatch("t.echo", {}, traceparent=BAD[2])
    assert traces(db) == {"t.echo": TP}


async def test_a_failed_job_retried_from_the_failed_store_keeps_its_trace(
    queue: D1Queue, reg: Registry, clock: Clock, db: SqliteD1
) -> None:
    id = await queue.dispatch("t.boom", {}, traceparent=TP, max_attempts=2)
    for _ in range(2):
        await drain(queue, reg)
        clock.advance(3600)
    (failed,) = db.query("SELECT id, traceparent FROM d1queue_failed_jobs")
    assert (failed["id"], failed["traceparent"]) == (id, TP)
    assert await queue.retry_failed(id)
    assert traces(db) == {"t.boom": TP}


async def test_a_process_line_and_the_metrics_count_the_same_wait_and_run(
    db: SqliteD1, clock: Clock, lines: io.StringIO
) -> None:
    """One start and one end are measured per job: the wait and run its
    process line shows are the ones its metrics add up."""
    queue = D1Queue(db, clock=clock, metrics=True)
    reg = Registry()

    @reg.job("t.slow")
    async def slow(payload: Any) -> None:
        clock.advance(payload)  # the handler "runs" this many seconds

    for seconds in (0.25, 3, 40):
        await queue.dispatch("t.slow", seconds, traceparent=TP)
    clock.advance(2)
    await drain(queue, reg, job_logs="all")
    found = events(lines, "d1queue.process")
    assert sorted(e["run_ms"] for e in found) == [250, 3000, 40_000]
    # Handlers run in turn: each waits for the ones before it too.
    assert sorted(e["wait_ms"] for e in found) == [2000, 2250, 5250]
    (row,) = db.query(
        f"SELECT * FROM d1queue_metrics WHERE period = {sql.METRIC_TOTAL} AND name = 't.slow'"
    )
    assert row["completed"] == 3
    assert row["run_ms"] == sum(e["run_ms"] for e in found)
    assert row["wait_ms"] == sum(e["wait_ms"] for e in found)
