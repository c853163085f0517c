"""Names no route can carry: dots alone (`.`, `..`, ...) are refused as queue
names, job names, schedule ids and job ids, over HTTP, RPC, the library and
the Python client, with a 4xx naming the rule and nothing written. The URL
parser resolves a path's dot-segments before the Worker sees it, so a
schedule of id `..` could be created and never reached again, and a push to
queue `..` landed elsewhere. Rows a table already holds under such a name
are still read, drained and deleted over RPC."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urljoin

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.bounds import (
    DOTS_ONLY,
    ID_RULE,
    NAME_RULE,
    InvalidName,
    is_name,
    is_stored_name,
)
from d1queue.core.job import QueuedJob
from d1queue.interfaces.api import Api
from d1queue.interfaces.client import Client, ClientError
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import ApiError, Service
from d1queue.interfaces.testing import SqliteD1

from .conftest import Clock
from .test_api import TOKEN, registry
from .test_api import Client as RawApi

DOTS = (".", "..", "...")
TABLES = ("d1queue_jobs", "d1queue_schedules", "d1queue_queues", "d1queue_flow")


def written(db: SqliteD1) -> tuple[int, ...]:
    return tuple(db.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in TABLES)


@pytest.fixture
def service(queue: D1Queue) -> Service:
    return Service(queue, registry())


@pytest.fixture
def api(service: Service, db: SqliteD1) -> RawApi:
    return RawApi(Api(service, TOKEN, "1", SPEC), db)


def test_the_rule_refuses_dots_alone_and_the_document_states_it() -> None:
    for dots in DOTS:
        assert not is_name(dots) and is_stored_name(dots)
        assert not re.fullmatch(ID_RULE, dots)
    for fine in ("a.", ".a", "a..b", "mail.out-1", "a:b"):
        assert is_name(fine) and re.fullmatch(ID_RULE, fine)
    # The document states the rule wherever a name is written or a path
    # carries one: a generated client refuses dots alone too.
    name, id_ = f"^{NAME_RULE}$", f"^{ID_RULE}$"
    schemas = SPEC["components"]["schemas"]
    assert schemas["Job"]["properties"]["name"]["pattern"] == name
    assert schemas["JobByName"]["properties"]["queue"]["pattern"] == name
    schedule = schemas["ScheduleIn"]["properties"]
    assert schedule["id"]["pattern"] == schedule["queue"]["pattern"] == name
    (queue,) = SPEC["paths"]["/v1/queues/{queue}/jobs"]["parameters"]
    (job,) = SPEC["paths"]["/v1/jobs/{id}"]["parameters"]
    assert (queue["schema"]["pattern"], job["schema"]["pattern"]) == (name, id_)
    for dots in DOTS:
        assert not re.search(name, dots) and not re.search(id_, dots)


@pytest.mark.parametrize("dots", DOTS)
async def test_a_schedule_of_dots_alone_is_422_naming_the_rule_and_writes_nothing(
    api: RawApi, db: SqliteD1, dots: str
) -> None:
    before = written(db)
    r = await api("POST", "/v1/schedules", {"id": dots, "cron": "* * * * *", "name": "t.echo"})
    assert r.status == 422 and r.body["error"]["code"] == "invalid"
    message = r.body["error"]["message"]
    assert NAME_RULE in message and DOTS_ONLY in message, message
    r = await api("POST", "/v1/schedules", {"cron": "* * * * *", "name": "t.echo", "queue": dots})
    assert r.status == 422 and DOTS_ONLY in r.body["error"]["message"]
    assert written(db) == before


@pytest.mark.parametrize("dots", DOTS)
async def test_a_push_to_a_queue_of_dots_alone_is_refused_and_writes_nothing(
    api: RawApi, service: Service, db: SqliteD1, dots: str
) -> None:
    before = written(db)
    # In a body: 422, as any invalid field.
    r = await api("POST", "/v1/jobs", {"name": "t.echo", "queue": dots})
    assert r.status == 422 and DOTS_ONLY in r.body["error"]["message"]
    r = await api("POST", "/v1/batches", {"jobs": [{"name": "t.echo", "queue": dots}]})
    assert r.status == 422 and DOTS_ONLY in r.body["error"]["message"]
    # In a path, spelled so that it reaches the router: 400 invalid_queue.
    segment = dots.replace(".", "%2e")
    for path, body in (
        (f"/v1/queues/{segment}/jobs", {"name": "t.echo"}),
        (f"/v1/queues/{segment}/jobs/batch", {"jobs": [{"name": "t.echo"}]}),
    ):
        r = await api("POST", path, body)
        assert (r.status, r.body["error"]["code"]) == (400, "invalid_queue"), path
    # RPC calls the Service: the same answers.
    for call in (
        service.dispatch(dots, {"name": "t.echo"}),
        service.dispatch_batch(dots, [{"name": "t.echo"}]),
        service.set_limits(dots, {"concurrency": 1}),
        service.set_paused(dots, True),
    ):
        with pytest.raises(ApiError) as caught:
            await call
        assert (caught.value.status, caught.value.code) == (400, "invalid_queue")
        assert DOTS_ONLY in caught.value.message
    with pytest.raises(ApiError) as caught:
        await service.put_schedule({"id": dots, "cron": "@daily", "name": "t.echo"})
    assert (caught.value.status, caught.value.code) == (422, "invalid")
    assert written(db) == before


async def test_the_library_refuses_dots_alone_as_a_queue_a_job_name_or_an_id(
    queue: D1Queue, db: SqliteD1
) -> None:
    before = written(db)
    with pytest.raises(InvalidName, match="dot-segment"):
        await queue.dispatch("t.echo", None, queue="..")
    with pytest.raises(InvalidName, match="dot-segment"):
        Registry().register("..", lambda p: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="id"):
        await queue.push(QueuedJob(name="t.echo", id=".."))
    with pytest.raises(ValueError, match="id"):
        await queue.push(QueuedJob(name="t.echo", id="a/b"))
    assert written(db) == before


CLIENT_CALLS: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("push", (DOTS, "t.echo", {}), "invalid_queue"),
    ("push_batch", (DOTS, [{"name": "t.echo"}]), "invalid_queue"),
    ("stats", (DOTS,), "invalid_queue"),
    ("limits", (DOTS,), "invalid_queue"),
    ("set_limits", (DOTS,), "invalid_queue"),
    ("completed", (DOTS,), "invalid_queue"),
    ("job", (DOTS,), "invalid_id"),
    ("cancel", (DOTS,), "invalid_id"),
    ("batch_state", (DOTS,), "invalid_id"),
    ("add_to_batch", (DOTS, [{"name": "t.echo"}]), "invalid_id"),
)
"""Every client method taking a queue or an id, its arguments (DOTS: the
name of dots under test), and the code of its refusal."""


class Recorder:
    """An HTTP transport in front of the in-process API that resolves the
    URL as the runtime's parser does (dot-segments removed), and records
    what it sent."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.sent: list[str] = []

    async def __call__(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        url = urljoin(url, url)  # RFC 3986 remove_dot_segments, as WHATWG does
        self.sent.append(f"{method} {url}")
        reply = await self.api.handle(method, url, headers, body or b"")
        return reply.status, b"" if reply.body is None else json.dumps(reply.body).encode()


@pytest.mark.parametrize("dots", DOTS)
async def test_the_client_refuses_dots_alone_before_sending(
    service: Service, db: SqliteD1, dots: str
) -> None:
    http = Recorder(Api(service, TOKEN, "1", SPEC))
    sent: list[str] = []

    class Binding:
        def __getattr__(self, method: str) -> Any:
            async def call(*args: Any) -> Any:
                sent.append(method)
                raise AssertionError("nothing should be sent")

            return call

    before = written(db)
    clients = (
        Client.over_http("https://q.example", TOKEN, fetch=http),
        Client.over_binding(Binding()),
    )
    for client in clients:
        for method, args, code in CLIENT_CALLS:
            with pytest.raises(ClientError) as caught:
                await getattr(client, method)(*(dots if a is DOTS else a for a in args))
            assert (caught.value.status, caught.value.code) == (400, code), method
            assert DOTS_ONLY in caught.value.message
    assert http.sent == [] and sent == []
    assert written(db) == before


async def test_rows_already_named_with_dots_alone_are_still_reached_over_rpc(
    api: RawApi, service: Service, queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    """A deployment may hold such rows: nothing in the schema refused them.
    RPC (and the library) reads, drains and deletes them by the stored name;
    nothing new is written under it."""
    every_minute = {"cron": "* * * * *", "name": "t.echo"}
    assert (await api("POST", "/v1/schedules", {"id": "..", **every_minute})).status == 422
    for id in ("was", "zz"):
        assert (await api("POST", "/v1/schedules", {"id": id, **every_minute})).status == 201
    await service.dispatch("q", {"name": "t.echo", "payload": 1})
    db.query("UPDATE d1queue_schedules SET id = '..' WHERE id = 'was'")
    db.query("UPDATE d1queue_jobs SET queue = '..' WHERE queue = 'q'")
    assert (await service.schedule(".."))["id"] == ".."
    page = await service.schedules(1)
    assert [s["id"] for s in page["schedules"]] == [".."]
    # Its id is the next page's cursor: paging goes on past it.
    assert page["next_cursor"] == ".."
    assert [s["id"] for s in (await service.schedules(1, ".."))["schedules"]] == ["zz"]
    r = await api("GET", "/v1/schedules?limit=1&cursor=..")
    assert r.status == 200 and [s["id"] for s in r.body["schedules"]] == ["zz"]
    assert (await service.pause_schedule(".."))["paused"] is True
    assert (await service.queue_stats(".."))["ready"] == 1
    # A drain over every queue claims its jobs as any other's.
    report = await drain(queue, registry(), Config(queues=["*"]))
    assert report.completed == 1 and not report.error
    assert await service.delete_schedule("..") == {"id": "..", "deleted": True}
    assert [r["id"] for r in db.query("SELECT id FROM d1queue_schedules")] == ["zz"]
    await service.dispatch("q", {"name": "t.echo"})
    db.query("UPDATE d1queue_jobs SET queue = '.' WHERE queue = 'q'")
    assert await service.clear(".") == {"deleted": 1}
