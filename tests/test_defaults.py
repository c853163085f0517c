"""Registered defaults hold however a job is dispatched: from Python (a
D1Queue given the registry, and a handler's ctx.queue), over HTTP and over
RPC (both through Service, the RPC entrypoint's methods calling the same
Service methods as here); a per-call value overrides them. Stored defaults
(queue, max_attempts, priority, unique policy) are read back from the row;
run-time ones (timeout, backoff) by draining the job."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from d1queue import Backoff, Config, D1Queue, JobContext, Registry, drain
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1

from .conftest import Clock
from .test_api import AUTH, TOKEN

BACKOFF = Backoff(base_s=11, jitter=False)


def registry() -> Registry:
    reg = Registry()

    @reg.job(
        "mail.send",
        queue="mail",
        max_attempts=5,
        priority=7,
        timeout_s=0.05,
        backoff=BACKOFF,
        unique=lambda payload: payload["to"],
    )
    async def send(payload: Any) -> None:
        await asyncio.sleep(5)  # past its timeout: retried with its backoff

    @reg.job("fan.out", subrequests=1)
    async def fan_out(payload: Any, ctx: JobContext) -> None:
        await ctx.queue.dispatch("mail.send", payload)

    @reg.job("digest", unique=True)
    async def digest(payload: Any) -> None: ...

    return reg


async def via_python(q: D1Queue, reg: Registry, call: dict[str, Any]) -> str:
    """`queue.dispatch(name, payload, **overrides)` on a D1Queue with the registry."""
    call = dict(call)
    name, payload = call.pop("name"), call.pop("payload")
    return await D1Queue(q.binding, clock=q.clock, registry=reg).dispatch(name, payload, **call)


async def via_http(q: D1Queue, reg: Registry, call: dict[str, Any]) -> str:
    """POST /v1/jobs: the job by name, no queue in the path."""
    api = Api(Service(q, reg), TOKEN, "9", SPEC)
    reply = await api.handle("POST", "https://q.example/v1/jobs", AUTH, json.dumps(call).encode())
    assert reply.status in (200, 201), reply.body
    return str(reply.body["id"])


async def via_rpc(q: D1Queue, reg: Registry, call: dict[str, Any]) -> str:
    """The RPC entrypoint's dispatch_job(job) calls Service.dispatch_job."""
    return str((await Service(q, reg).dispatch_job(call))["id"])


PATHS = [via_python, via_http, via_rpc]
TO_A = {"name": "mail.send", "payload": {"to": "a@example.com"}}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, ("mail", 5, 7, "mail.send:a@example.com")),
        ({"queue": "urgent"}, ("urgent", 5, 7, "mail.send:a@example.com")),
        ({"max_attempts": 2}, ("mail", 2, 7, "mail.send:a@example.com")),
        ({"priority": -3}, ("mail", 5, -3, "mail.send:a@example.com")),
        ({"unique_key": "mine"}, ("mail", 5, 7, "mine")),
    ],
    ids=["defaults", "queue", "max_attempts", "priority", "unique_key"],
)
async def test_registered_defaults_hold_on_every_path(
    db: SqliteD1,
    queue: D1Queue,
    clock: Clock,
    path: Any,
    overrides: dict[str, Any],
    expected: tuple[str, int, int, str],
) -> None:
    reg = registry()
    job_id = await path(queue, reg, {**TO_A, **overrides})
    job = await queue.job(job_id)
    assert job is not None
    assert (job.queue, job.max_attempts, job.priority, job.unique_key) == expected
    # The unique policy is a lock: the same payload again stores nothing.
    assert await path(queue, reg, {**TO_A, **overrides}) == job_id
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == 1
    # Run-time defaults: the job times out after 0.05 s, and is put back
    # with its registered backoff (11 s for the first attempt).
    report = await drain(D1Queue(db, clock=clock), reg, Config(queues=(job.queue,)))
    assert report.retried == 1, report
    back = await queue.job(job_id)
    assert back is not None and back.available_at == clock() + 11_000 and back.attempts == 1
    assert back.last_error == "timed out after 0.05s"


@pytest.mark.parametrize("path", PATHS)
async def test_a_payload_unique_job_holds_one_job_per_payload(queue: D1Queue, path: Any) -> None:
    reg = registry()
    first = await path(queue, reg, {"name": "digest", "payload": {"day": 1, "user": "u"}})
    # Key order does not matter: the payload is hashed as canonical JSON.
    again = await path(queue, reg, {"name": "digest", "payload": {"user": "u", "day": 1}})
    other = await path(queue, reg, {"name": "digest", "payload": {"day": 2, "user": "u"}})
    assert first == again != other
    job = await queue.job(first)
    assert job is not None and job.unique_key is not None
    assert job.unique_key.startswith("digest:sha256:") and len(job.unique_key) == 78


async def test_a_queue_in_the_path_overrides_the_registered_one(queue: D1Queue) -> None:
    api = Api(Service(queue, registry()), TOKEN, "9", SPEC)
    body = json.dumps({**TO_A, "priority": 1}).encode()
    reply = await api.handle("POST", "https://q.example/v1/queues/side/jobs", AUTH, body)
    assert reply.status == 201 and reply.body["queue"] == "side"
    job = await queue.job(reply.body["id"])
    assert job is not None and (job.queue, job.max_attempts, job.priority) == ("side", 5, 1)
    # A body naming a queue is for POST /v1/jobs only: here the path names it.
    body = json.dumps({**TO_A, "queue": "x"}).encode()
    reply = await api.handle("POST", "https://q.example/v1/queues/side/jobs", AUTH, body)
    assert reply.status == 422 and "unknown field(s): queue" in reply.body["error"]["message"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"name": "mail.send", "payload": {"no": "to"}}, "found no key in the payload: KeyError"),
        ({"name": "mail.send", "payload": {"to": "x" * 300}}, "the limit is 255"),
        ({"name": "mail.send", "payload": {"to": ["a"]}}, "must return a str"),
        ({"name": "mail.send", "queue": "a b"}, "queue must match"),
        ({"name": "mail.send", "queue": 7}, "queue must match"),
        ({"name": "nope"}, "no job is registered"),
        ({"payload": 1}, "name must match"),
    ],
)
async def test_a_push_by_name_refuses_bad_input_and_writes_nothing(
    db: SqliteD1, queue: D1Queue, call: dict[str, Any], message: str
) -> None:
    api = Api(Service(queue, registry()), TOKEN, "9", SPEC)
    reply = await api.handle("POST", "https://q.example/v1/jobs", AUTH, json.dumps(call).encode())
    assert reply.status == 422 and reply.body["error"]["code"] == "invalid"
    assert message in reply.body["error"]["message"]
    with pytest.raises(Exception, match=message):
        await Service(queue, registry()).dispatch_job(call)
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == 0


def test_a_unique_policy_is_checked_when_registered() -> None:
    reg = Registry()

    async def handler(payload: Any) -> None: ...

    with pytest.raises(TypeError, match="unique must be True, False or a function"):
        reg.register("x", handler, unique="yes")  # type: ignore[arg-type]


async def test_the_registered_queue_applies_from_python_and_handlers(
    db: SqliteD1, clock: Clock
) -> None:
    reg = registry()
    q = D1Queue(db, clock=clock, registry=reg)
    first = await q.job(await q.dispatch("mail.send", {"to": "b"}))
    assert first is not None and (first.queue, first.max_attempts, first.priority) == ("mail", 5, 7)
    # A handler's ctx.queue carries the drain's registry, even when the
    # D1Queue the drain was given had none.
    await D1Queue(db, clock=clock).dispatch("fan.out", {"to": "c"})
    assert (await drain(D1Queue(db, clock=clock), reg, Config())).completed == 1
    (row,) = db.query(
        "SELECT queue, max_attempts, priority, unique_key FROM d1queue_jobs "
        'WHERE payload = \'{"to":"c"}\''
    )
    assert dict(row) == {
        "queue": "mail",
        "max_attempts": 5,
        "priority": 7,
        "unique_key": "mail.send:c",
    }


async def test_without_a_registry_the_built_in_defaults_apply(queue: D1Queue) -> None:
    job = await queue.job(await queue.dispatch("anything", None))
    assert job is not None
    assert (job.queue, job.max_attempts, job.priority, job.unique_key) == ("default", 3, 0, None)


def test_the_library_defaults_are_stated_once_and_read_everywhere() -> None:
    """job.DEFAULT_* are what an unregistered name, a registration that
    declares nothing, a bare QueuedJob and the OpenAPI document say."""
    from dataclasses import replace

    from d1queue import QueuedJob
    from d1queue.core.job import (
        DEFAULT_MAX_ATTEMPTS,
        DEFAULT_PRIORITY,
        DEFAULT_QUEUE,
        DEFAULT_SUBREQUESTS,
        DEFAULT_TIMEOUT_S,
        DEFAULT_UNIQUE,
    )
    from d1queue.core.registry import spec_for

    stand_in = spec_for(None, "anything")
    assert stand_in.stored() == (DEFAULT_QUEUE, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY)
    assert (stand_in.timeout_s, stand_in.subrequests, stand_in.unique) == (
        DEFAULT_TIMEOUT_S,
        DEFAULT_SUBREQUESTS,
        DEFAULT_UNIQUE,
    )
    assert spec_for(Registry(), "anything") == stand_in

    async def handler(payload: Any) -> None: ...

    registered = Registry().register("anything", handler)
    assert registered == replace(stand_in, handler=handler, wants_context=False)
    job = QueuedJob("anything")
    assert (job.queue, job.max_attempts, job.priority) == stand_in.stored()
    by_name = SPEC["components"]["schemas"]["JobByName"]["properties"]
    assert f"({DEFAULT_MAX_ATTEMPTS} if it declares none)" in by_name["max_attempts"]["description"]
    assert f"({DEFAULT_PRIORITY} if it declares none)" in by_name["priority"]["description"]
    assert f"({DEFAULT_QUEUE!r} if it declares none)" in by_name["queue"]["description"]


async def test_a_slot_of_an_unknown_job_is_stored_with_the_library_defaults(
    db: SqliteD1, queue: D1Queue, clock: Clock
) -> None:
    """A schedule whose job this Worker does not know (another Worker on the
    same D1 may run it) enqueues with the same defaults a dispatch gets."""
    from d1queue.store.schedules import ScheduleDef, Schedules

    reg = registry()
    store = Schedules(queue, reg)
    await store.put(ScheduleDef("other", "* * * * *", "digest"))
    db.query("UPDATE d1queue_schedules SET name = 'elsewhere.job', next_run_at = ?", clock())
    report = await store.run(now=clock())
    assert report.enqueued == 1, report
    (row,) = db.query("SELECT name, queue, max_attempts, priority FROM d1queue_jobs")
    dispatched = await queue.job(await queue.dispatch("elsewhere.job"))
    assert dispatched is not None
    assert dict(row) == {
        "name": "elsewhere.job",
        "queue": dispatched.queue,
        "max_attempts": dispatched.max_attempts,
        "priority": dispatched.priority,
    }
