"""Regressions for the queue's own faults: what reaches Python is bounded,
and one bad value never costs other jobs their outcome. Real SQLite."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from d1queue import Config, D1Queue, QueuedJob, Registry, Retry, drain
from d1queue.core.bounds import MAX_DELAY_S, MAX_JSON_DEPTH, json_depth, value_depth
from d1queue.features.http_request import register_http_job
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import ApiError, Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql
from d1queue.store.binding import Binding, RetryPolicy

from .conftest import Clock
from .http_server import Server
from .test_api import AUTH, Client, registry
from .test_http_job import LOCAL, urllib_fetch

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
    report = await drain(queue, reg, Config(plan="paid"))
    assert (report.retried, report.completed) == (1, INNOCENT)
    (row,) = (await queue.binding.run("SELECT available_at FROM d1queue_jobs")).rows
    expected = 0 if delay == -5 else MAX_DELAY_S * 1000
    assert row["available_at"] == clock() + expected


async def test_a_huge_retry_after_is_clamped(queue: D1Queue, server: Server, clock: Clock) -> None:
    reg = Registry()
    register_http_job(reg)
    server.script["/busy"] = [(503, {"Retry-After": "99999999999999"}, "busy", 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/busy"})
    report = await drain(queue, reg, LOCAL, fetch=urllib_fetch)
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
    assert (report.failed, report.completed) == (1, 1)
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
    await queue.retry(job, 0, "ValueError: the real cause")
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


# -- settling and every write, under D1 faults and lost replies ---------------


def ACK(statement: str) -> bool:
    """An acknowledgement: of one job, or of a claim batch's completed jobs."""
    return statement in (
        sql.DELETE_HELD,
        sql.DELETE_HELD_BATCH,
        sql.DELETE_HELD_PLAIN,
        sql.DELETE_HELD_BATCH_PLAIN,
    )


RELEASE = sql.RETRY
CLAIM = sql.CLAIM
NO_WAIT = RetryPolicy(tries=5, base_s=0, cap_s=0)


def counting(runs: Counter[Any], **opts: Any) -> Registry:
    reg = Registry()

    @reg.job("count", **opts)
    async def count(payload: Any) -> None:
        runs[payload] += 1

    @reg.job("again", **opts)
    async def again(payload: Any) -> None:
        runs[payload] += 1
        raise Retry("later", delay_s=60)

    return reg


@pytest.fixture
def patient(db: SqliteD1, clock: Clock) -> D1Queue:
    """A queue whose binding re-sends transient errors without sleeping."""
    return D1Queue(Binding(db, retry=NO_WAIT), clock=clock)


async def test_a_failed_settle_batch_settles_its_outcomes_on_their_own(
    patient: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    runs: Counter[Any] = Counter()
    for i in range(30):
        await patient.dispatch("count", i, max_attempts=1)
    # The batch carrying round 1's acks and round 2's SELECT fails once,
    # with an error that is not retried.
    db.fail_when(ACK, "D1_ERROR: D1 DB is overloaded. Too many requests queued.", times=1)
    report = await drain(patient, counting(runs), Config(plan="paid", batch_size=10))
    assert report.stopped == "d1_error" and "overloaded" in report.error
    assert report.completed == 10 and report.unsettled == [] and report.stale == 0
    clock.advance(3600)  # any lease would have lapsed by now
    report = await drain(patient, counting(runs), Config(plan="paid", batch_size=10))
    assert runs == Counter(range(30)), "no job ran twice"
    assert await patient.failed_jobs() == [], "no completed job was failed"


async def test_one_outcome_d1_refuses_costs_no_other_its_outcome(
    patient: D1Queue, db: SqliteD1
) -> None:
    runs: Counter[Any] = Counter()
    reg = counting(runs)
    await patient.dispatch("again", "r")
    for i in range(5):
        await patient.dispatch("count", i)
    db.fail_when(RELEASE, "D1_ERROR: something D1 will never take", times=None)
    report = await drain(patient, reg, Config(plan="paid"))
    assert report.completed == 5
    assert len(report.unsettled) == 1, "the release D1 refuses every time is reported"
    assert await patient.size("default") == 0, "the unsettled job is still held"


async def test_a_lost_claim_reply_spends_no_attempt(patient: D1Queue, db: SqliteD1) -> None:
    runs: Counter[Any] = Counter()
    await patient.dispatch("count", "once", max_attempts=1)
    db.lose_reply_when(CLAIM)
    report = await drain(patient, counting(runs), Config())
    assert (report.completed, report.failed, report.stale) == (1, 0, 0)
    assert runs == Counter(["once"])


async def test_a_claim_whose_batch_fails_after_landing_is_undone(
    patient: D1Queue, db: SqliteD1
) -> None:
    runs: Counter[Any] = Counter()
    job_id = await patient.dispatch("count", "one try", max_attempts=1)
    db.lose_reply_when(CLAIM, "D1_ERROR: D1 DB is overloaded. Too many requests queued.")
    report = await drain(patient, counting(runs), Config())
    assert (report.claimed, report.stopped) == (0, "d1_error")
    job = await patient.job(job_id)
    assert job is not None and job.attempts == 0 and job.reserved_until is None
    report = await drain(patient, counting(runs), Config())
    assert report.completed == 1 and runs == Counter(["one try"])


async def test_a_lost_settle_reply_is_our_write_not_a_stale_one(
    patient: D1Queue, db: SqliteD1
) -> None:
    runs: Counter[Any] = Counter()
    for i in range(4):
        await patient.dispatch("count", i)
    await patient.dispatch("again", "r")
    db.lose_reply_when(ACK, times=1)
    db.lose_reply_when(RELEASE, times=1)
    report = await drain(patient, counting(runs), Config())
    assert (report.completed, report.retried, report.stale) == (4, 1, 0)
    assert report.resent == 5
    assert report.unsettled == []


async def test_single_writes_are_idempotent_under_a_lost_reply(
    patient: D1Queue, db: SqliteD1
) -> None:
    for i in range(3):
        await patient.dispatch("t", i)
    a, b, c = await patient.reserve_batch("default", 3)
    db.lose_reply_when(ACK)
    assert await patient.complete(a) is True
    db.lose_reply_when(RELEASE)
    assert await patient.retry(b, 10) is True
    db.lose_reply_when("INSERT OR REPLACE INTO d1queue_failed_jobs")
    assert await patient.fail(c, "boom") is True
    db.lose_reply_when("INSERT INTO d1queue_jobs")
    assert await patient.retry_failed(c.id) is True
    assert {r["id"] for r in db.query("SELECT id FROM d1queue_jobs")} == {b.id, c.id}
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_failed_jobs")[0]["n"] == 0


async def test_push_many_re_sent_after_a_lost_reply_stores_each_job_once(
    patient: D1Queue, db: SqliteD1
) -> None:
    jobs = [QueuedJob.new("t", i) for i in range(25)]
    jobs.append(QueuedJob.new("t", "keyed", unique_key="k"))
    db.lose_reply_when("INSERT INTO d1queue_jobs")
    out = await patient.push_many(jobs)
    assert out == [(j.id, False) for j in jobs]
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == 26


async def test_push_many_still_refuses_a_reused_id(queue: D1Queue, db: SqliteD1) -> None:
    first = QueuedJob.new("t", 1)
    await queue.push(first)
    again = QueuedJob.new("t", 2)
    again.id = first.id
    with pytest.raises(Exception, match="UNIQUE"):
        await queue.push_many([QueuedJob.new("t", 3), again])
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == 1, "all or nothing"
