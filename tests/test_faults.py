"""Regressions for the queue's own faults: what reaches Python is bounded,
and one bad value never costs other jobs their outcome. Real SQLite."""

from __future__ import annotations

import json
from typing import Any

import pytest

from d1queue import Config, D1Queue, QueuedJob, Registry, Retry, drain
from d1queue.api import Api
from d1queue.bounds import MAX_DELAY_S, MAX_JSON_DEPTH, json_depth, value_depth
from d1queue.http_job import register_http_job
from d1queue.openapi import SPEC
from d1queue.service import ApiError, Service
from d1queue.testing import SqliteD1

from .conftest import Clock
from .http_server import Server
from .test_api import AUTH, Client, registry
from .test_http_job import urllib_fetch

INNOCENT = 5


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("delay", [float("inf"), float("nan"), 1e13, -5, "soon"])
async def test_a_wild_retry_delay_is_clamped_and_settles_with_the_others(
    queue: D1Queue, clock: Clock, delay: Any
) -> None:
    reg = Registry()
    ran: list[int] = []

    @reg.job("wild")
    async def wild(payload: Any) -> None:
        raise Retry("later", delay_s=delay)

    @reg.job("fine")
    async def fine(payload: int) -> None:
        ran.append(payload)

    await queue.dispatch("wild", None)
    for i in range(INNOCENT):
        await queue.dispatch("fine", i)
    report = await drain(queue, reg, Config())
    assert (report.retried, report.succeeded) == (1, INNOCENT)
    (row,) = (await queue.binding.run("SELECT available_at FROM d1queue_jobs")).rows
    expected = 0 if delay == -5 else MAX_DELAY_S * 1000
    assert row["available_at"] == clock() + expected


async def test_a_huge_retry_after_is_clamped(queue: D1Queue, server: Server, clock: Clock) -> None:
    reg = Registry()
    register_http_job(reg)
    server.script["/busy"] = [(503, {"Retry-After": "99999999999999"}, "busy", 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/busy"})
    report = await drain(queue, reg, Config(), fetch=urllib_fetch)
    assert report.retried == 1
    (row,) = (await queue.binding.run("SELECT available_at FROM d1queue_jobs")).rows
    assert row["available_at"] == clock() + MAX_DELAY_S * 1000


def test_depth_is_measured_without_parsing() -> None:
    assert json_depth(nested(8000)) == 8000
    assert json_depth('{"a": "[[[[{{", "b": [1, {"c": null}]}') == 3
    assert json_depth('"\\"[["') == 0
    deep: Any = 1
    for _ in range(10_000):
        deep = [deep]
    assert value_depth(deep) == MAX_JSON_DEPTH + 1, "counted no further than needed"
    assert value_depth({"a": [{"b": 1}]}) == 3


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5_000, 8_000, 100_000])
async def test_deep_json_is_refused_before_parsing_and_writes_nothing(
    db: SqliteD1, queue: D1Queue, depth: int
) -> None:
    client = Client(Api(Service(queue, registry()), "s3cret-token", "9", SPEC), db)
    body = '{"name": "t.echo", "payload": ' + nested(depth) + "}"
    r = await client("POST", "/v1/queues/q/jobs", raw=body.encode())
    assert r.status == 422 and r.body["error"]["code"] == "too_deep", r.body
    assert client.counts() == (0, 0, 0)


async def test_json_at_the_depth_limit_is_accepted(db: SqliteD1, queue: D1Queue) -> None:
    client = Client(Api(Service(queue, registry()), "s3cret-token", "9", SPEC), db)
    payload = nested(MAX_JSON_DEPTH - 1)  # the body object adds one level
    r = await client(
        "POST", "/v1/queues/q/jobs", raw=f'{{"name":"t.echo","payload":{payload}}}'.encode()
    )
    assert r.status == 201, r.body


async def test_deep_rpc_arguments_are_refused(queue: D1Queue) -> None:
    deep: Any = None
    for _ in range(5_000):
        deep = [deep]
    with pytest.raises(ApiError) as caught:
        await Service(queue, registry()).dispatch("q", {"name": "t.echo", "payload": deep})
    assert (caught.value.status, caught.value.code) == (422, "too_deep")
    with pytest.raises(ValueError, match="nests deeper"):
        await queue.dispatch("t.echo", deep)
    assert await queue.size("q") == await queue.size("default") == 0


async def test_a_deep_payload_written_behind_our_back_fails_alone(
    queue: D1Queue, db: SqliteD1
) -> None:
    job_id = await queue.dispatch("fine", 1)
    db.query("UPDATE d1queue_jobs SET payload = ?1 WHERE id = ?2", nested(5_000), job_id)
    await queue.dispatch("fine", 2)
    reg = Registry()

    @reg.job("fine")
    async def fine(payload: Any) -> None: ...

    report = await drain(queue, reg, Config())
    assert (report.failed, report.succeeded) == (1, 1)
    (failed,) = await queue.failed_jobs()
    assert "nests deeper than 64 levels" in failed.error


def test_a_delay_past_the_maximum_is_refused_at_the_edge() -> None:
    for delay in (MAX_DELAY_S + 1, float("inf"), float("nan"), 1e13):
        with pytest.raises(ValueError, match="delay_s must be a number from 0"):
            QueuedJob.new("x", None, delay_s=delay)


async def test_head_answers_as_get_without_a_body(db: SqliteD1, queue: D1Queue) -> None:
    api = Api(Service(queue, registry()), "s3cret-token", "9", SPEC)
    head = await api.handle("HEAD", "https://q.example/v1/queues", AUTH, b"")
    get = await api.handle("GET", "https://q.example/v1/queues", AUTH, b"")
    assert head.status == get.status == 200
    options = await api.handle("OPTIONS", "https://q.example/v1/queues", {}, b"")
    assert options.headers["allow"] == "OPTIONS, GET, HEAD"


async def test_reclaim_keeps_the_error_a_job_had(queue: D1Queue, clock: Clock) -> None:
    await queue.dispatch("x", None, max_attempts=2)
    job = await queue.reserve("default")
    assert job is not None
    await queue.release(job, 0, "ValueError: the real cause")
    again = await queue.reserve("default")  # attempt 2; its worker dies
    assert again is not None
    clock.advance(queue.reservation_s + 1)
    assert await queue.reclaim_expired() == 1
    stored = await queue.job(job.id)
    assert stored is not None and stored.last_error is not None
    assert stored.last_error.startswith("lease expired")
    assert "ValueError: the real cause" in stored.last_error
    clock.advance(queue.reservation_s + 1)
    await queue.reclaim_expired()  # nothing held: nothing changes
    # Claimed again with its attempts spent: failed, naming the real cause.
    assert await queue.reserve("default") is None
    (failed,) = await queue.failed_jobs()
    assert "attempted too many times" in failed.error
    assert "ValueError: the real cause" in failed.error
    assert json.dumps(failed.error).count("lease expired") == 1
