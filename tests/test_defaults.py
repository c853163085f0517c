"""Registered defaults hold however a job is dispatched: from Python (a
D1Queue given the registry, and a handler's ctx.queue), over HTTP and over
RPC (both through Service); a per-call value overrides them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from d1queue import Config, D1Queue, JobContext, Registry, drain
from d1queue.api import Api
from d1queue.openapi import SPEC
from d1queue.service import Service
from d1queue.testing import SqliteD1

from .conftest import Clock
from .test_api import AUTH


def registry() -> Registry:
    reg = Registry()

    @reg.job("mail.send", queue="mail", max_attempts=5, priority=7)
    async def send(payload: Any) -> None: ...

    @reg.job("fan.out", subrequests=1)
    async def fan_out(payload: Any, ctx: JobContext) -> None:
        await ctx.queue.dispatch("mail.send", payload)

    return reg


async def via_python(q: D1Queue, reg: Registry, overrides: dict[str, Any]) -> str:
    return await D1Queue(q.binding, clock=q.clock, registry=reg).dispatch(
        "mail.send", {"to": "a"}, queue="mail", **overrides
    )


async def via_http(q: D1Queue, reg: Registry, overrides: dict[str, Any]) -> str:
    api = Api(Service(q, reg), "s3cret-token", "9", SPEC)
    body = json.dumps({"name": "mail.send", "payload": {"to": "a"}, **overrides}).encode()
    reply = await api.handle("POST", "https://q.example/v1/queues/mail/jobs", AUTH, body)
    assert reply.status == 201, reply.body
    return str(reply.body["id"])


async def via_rpc(q: D1Queue, reg: Registry, overrides: dict[str, Any]) -> str:
    pushed = await Service(q, reg).dispatch(
        "mail", {"name": "mail.send", "payload": 1, **overrides}
    )
    return str(pushed["id"])


@pytest.mark.parametrize("path", [via_python, via_http, via_rpc])
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, (5, 7)),
        ({"max_attempts": 2}, (2, 7)),
        ({"priority": -3}, (5, -3)),
    ],
)
async def test_registered_defaults_hold_on_every_path(
    queue: D1Queue, path: Any, overrides: dict[str, Any], expected: tuple[int, int]
) -> None:
    job_id = await path(queue, registry(), overrides)
    job = await queue.job(job_id)
    assert job is not None and job.queue == "mail"
    assert (job.max_attempts, job.priority) == expected


async def test_the_registered_queue_applies_from_python_and_handlers(
    db: SqliteD1, clock: Clock
) -> None:
    reg = registry()
    q = D1Queue(db, clock=clock, registry=reg)
    first = await q.job(await q.dispatch("mail.send", 1))
    assert first is not None and (first.queue, first.max_attempts, first.priority) == ("mail", 5, 7)
    # A handler's ctx.queue carries the drain's registry, even when the
    # D1Queue the drain was given had none.
    await D1Queue(db, clock=clock).dispatch("fan.out", 2)
    assert (await drain(D1Queue(db, clock=clock), reg, Config())).succeeded == 1
    (row,) = db.query("SELECT queue, max_attempts, priority FROM d1queue_jobs WHERE payload = '2'")
    assert dict(row) == {"queue": "mail", "max_attempts": 5, "priority": 7}


async def test_without_a_registry_the_built_in_defaults_apply(queue: D1Queue) -> None:
    job = await queue.job(await queue.dispatch("anything", None))
    assert job is not None and (job.queue, job.max_attempts, job.priority) == ("default", 3, 0)
