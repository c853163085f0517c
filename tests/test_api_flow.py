"""Flow control over the HTTP API and the Python client (HTTP and RPC):
limits set, read and shown in stats; groups and debounce on every push
route; every bad input a 4xx that writes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1

from .conftest import Clock
from .test_api import TOKEN, Client, registry
from .test_client import over_http


@pytest.fixture
def reg() -> Registry:
    return registry()


@pytest.fixture
def api(queue: D1Queue, reg: Registry) -> Api:
    return Api(Service(queue, reg), TOKEN, "9.9", SPEC)


@pytest.fixture
def client(db: SqliteD1, api: Api) -> Client:
    return Client(api, db)


LIMITS = {
    "concurrency": 3,
    "group_concurrency": 1,
    "rate": {"limit": 5, "period_s": 10},
    "group_rate": None,
}


def written(db: SqliteD1) -> tuple[int, ...]:
    return tuple(
        db.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"]
        for t in ("d1queue_jobs", "d1queue_queues", "d1queue_flow")
    )


async def test_limits_are_set_read_and_shown_in_stats(client: Client) -> None:
    r = await client("GET", "/v1/queues/fresh/limits")
    assert r.status == 200 and r.body["limits"]["concurrency"] is None
    assert r.body["source"] == "none" and r.body["running"] == 0
    r = await client("PUT", "/v1/queues/fresh/limits", LIMITS)
    assert r.status == 200, r.body
    assert r.body == {
        "queue": "fresh",
        "limits": LIMITS,
        "source": "api",
        "running": 0,
        "running_by_group": {},
    }
    assert (await client("GET", "/v1/queues/fresh/limits")).body["limits"] == LIMITS
    stats = (await client("GET", "/v1/queues/fresh")).body
    assert stats["limits"] == LIMITS and stats["reserved"] == 0
    # Replacing: a field left out is no limit of that kind.
    r = await client("PUT", "/v1/queues/fresh/limits", {"concurrency": 7})
    assert r.body["limits"] == {
        "concurrency": 7,
        "group_concurrency": None,
        "rate": None,
        "group_rate": None,
    }
    r = await client("PUT", "/v1/queues/fresh/limits", {})
    assert r.body["limits"]["concurrency"] is None
    assert (await client("GET", "/v1/queues/fresh")).body["limits"] is None


async def test_running_jobs_are_counted_by_group(
    client: Client, queue: D1Queue, reg: Registry
) -> None:
    for i, group in enumerate("aab"):
        r = await client(
            "POST", "/v1/queues/q/jobs", {"name": "t.echo", "payload": i, "group": group}
        )
        assert r.status == 201, r.body
    await client("POST", "/v1/queues/q/jobs", {"name": "t.echo", "payload": 9})
    jobs = await queue.reserve_batch("q", 4)
    assert len(jobs) == 4
    r = await client("GET", "/v1/queues/q/limits")
    assert r.body["running"] == 4
    assert r.body["running_by_group"] == {"a": 2, "b": 1, "": 1}


@pytest.mark.parametrize(
    "body",
    [
        {"concurrency": 0},
        {"concurrency": -2},
        {"concurrency": 2.5},
        {"concurrency": "3"},
        {"group_concurrency": 10**6},
        {"rate": {"limit": 5, "period_s": 0}},
        {"rate": {"limit": 5, "period_s": 86_401}},
        {"rate": {"limit": 5}},
        {"group_rate": {"limit": 1, "period_s": 10, "x": 1}},
        {"concurrency": 1, "burst": 3},
        [1],
        "3",
    ],
)
async def test_bad_limits_are_422_and_write_nothing(
    client: Client, db: SqliteD1, body: Any
) -> None:
    before = written(db)
    r = await client("PUT", "/v1/queues/q/limits", body)
    # A body that is not an object is malformed (400), as on every route.
    expected = (422, "invalid") if isinstance(body, dict) else (400, "malformed_json")
    assert (r.status, r.body["error"]["code"]) == expected, r.body
    assert written(db) == before


async def test_a_bad_queue_name_in_the_limits_path_is_400(client: Client) -> None:
    r = await client("PUT", "/v1/queues/a%20b/limits", {"concurrency": 1})
    assert r.status == 400


@pytest.mark.parametrize(
    ("path", "job", "message"),
    [
        ("/v1/queues/q/jobs", {"name": "t.echo", "group": ""}, "group must match"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "group": "a b"}, "group must match"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "group": "x" * 256}, "group must match"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "group": 5}, "group must match"),
        ("/v1/jobs", {"name": "t.echo", "debounce_s": 5}, "needs a unique_key"),
        ("/v1/jobs", {"name": "t.echo", "unique_key": "k", "debounce_s": 0}, "debounce_s"),
        ("/v1/jobs", {"name": "t.echo", "unique_key": "k", "debounce_s": -1}, "debounce_s"),
        ("/v1/jobs", {"name": "t.echo", "unique_key": "k", "debounce_s": "5"}, "debounce_s"),
        ("/v1/jobs", {"name": "t.echo", "grp": "a"}, "unknown field"),
    ],
)
async def test_bad_groups_and_debounces_are_422_and_write_nothing(
    client: Client, db: SqliteD1, path: str, job: dict[str, Any], message: str
) -> None:
    r = await client("POST", path, job)
    assert r.status == 422 and message in r.body["error"]["message"], r.body
    r = await client("POST", "/v1/queues/q/jobs/batch", {"jobs": [{"name": "t.echo"}, job]})
    assert r.status == 422, r.body
    assert written(db) == (0, 0, 0)


async def test_a_grouped_job_is_ready_and_says_its_group(client: Client, clock: Clock) -> None:
    ids = []
    for i in range(3):
        r = await client("POST", "/v1/jobs", {"name": "t.echo", "payload": i, "group": "acct-1"})
        ids.append(r.body["id"])
    r = await client(
        "POST",
        "/v1/queues/q/jobs/batch",
        {"jobs": [{"name": "t.echo", "group": "acct-2"}, {"name": "t.echo"}]},
    )
    assert r.status == 201, r.body
    state = (await client("GET", f"/v1/jobs/{ids[2]}")).body
    assert state["group"] == "acct-1" and state["state"] == "ready", state
    for queue, ready in (("default", 3), ("q", 2)):
        stats = (await client("GET", f"/v1/queues/{queue}")).body
        assert (stats["ready"], stats["delayed"]) == (ready, 0), stats


async def test_debounce_keeps_one_job_with_the_last_payload(
    client: Client, queue: D1Queue, reg: Registry, clock: Clock
) -> None:
    ran: list[Any] = []

    @reg.job("t.debounced", queue="d")
    async def debounced(payload: Any) -> None:
        ran.append(payload)

    body = {"name": "t.debounced", "unique_key": "doc-7", "debounce_s": 3}
    first = await client("POST", "/v1/jobs", {**body, "payload": 1})
    assert first.status == 201 and first.body.get("debounced") is False, first.body
    for i in (2, 3, 4):
        clock.advance(1)
        r = await client("POST", "/v1/jobs", {**body, "payload": i})
        assert r.status == 200 and r.body["debounced"] is True, r.body
        assert r.body["id"] == first.body["id"]
    state = (await client("GET", f"/v1/jobs/{first.body['id']}")).body
    assert state["payload"] == 4 and state["available_at"] == clock() + 3_000
    assert state["state"] == "delayed"
    await drain(queue, reg, Config(queues=("d",)))
    assert ran == []
    clock.advance(3)
    await drain(queue, reg, Config(queues=("d",)))
    assert ran == [4], "one delivery, with the last payload"
    # A plain unique push is not a debounce: it keeps the first payload.
    a = await client("POST", "/v1/jobs", {"name": "t.debounced", "unique_key": "u", "payload": 1})
    b = await client("POST", "/v1/jobs", {"name": "t.debounced", "unique_key": "u", "payload": 2})
    assert b.status == 200 and b.body["id"] == a.body["id"] and "debounced" not in b.body
    assert (await client("GET", f"/v1/jobs/{a.body['id']}")).body["payload"] == 1


async def test_a_debounce_after_the_job_started_queues_a_new_one(
    client: Client, queue: D1Queue, clock: Clock
) -> None:
    body = {"name": "t.echo", "queue": "d", "unique_key": "k", "debounce_s": 1}
    first = (await client("POST", "/v1/jobs", {**body, "payload": 1})).body
    clock.advance(1)
    running = await queue.reserve("d")
    assert running is not None and running.id == first["id"]
    r = await client("POST", "/v1/jobs", {**body, "payload": 2})
    assert r.status == 201 and r.body["id"] != first["id"] and r.body["debounced"] is False
    # The running job still holds its row; completing it frees nothing the
    # new job needs.
    assert await queue.complete(running)
    assert (await client("GET", f"/v1/jobs/{r.body['id']}")).body["payload"] == 2


async def test_the_client_sets_and_reads_limits(api: Api) -> None:
    client = over_http(api)
    answer = await client.set_limits("api-q", concurrency=2, rate={"limit": 1, "period_s": 5})
    assert answer["limits"]["concurrency"] == 2 and answer["source"] == "api"
    assert (await client.limits("api-q"))["limits"]["rate"] == {"limit": 1, "period_s": 5}
    pushed = await client.push("api-q", "t.echo", {"x": 1}, group="g1")
    assert (await client.job(pushed["id"]))["group"] == "g1"
