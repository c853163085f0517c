"""The Python client (interfaces/client.py) under CPython, against the real
API and Service over SqliteD1: over HTTP (a fetch that calls `Api.handle`
in-process) and over a service binding (an object whose methods are the RPC
entrypoint's, raising as a calling Worker sees). Bad input gets the same
status and code as the HTTP API, over either transport, and writes nothing."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from d1queue import Config, D1Queue, drain
from d1queue.core.bounds import MAX_PAYLOAD_BYTES
from d1queue.interfaces.api import Api
from d1queue.interfaces.client import ERROR_STATUS, Client, ClientError
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import ApiError, Service
from d1queue.interfaces.testing import SqliteD1

from .http_server import running_server
from .test_api import TOKEN, registry
from .test_api import Client as RawApi

BASE = "https://q.example"


class Binding:
    """A service binding to the Worker: the RPC methods as entry.py's
    entrypoint defines them, a refusal raised as the calling Worker sees it
    (a JS Error whose message is "<code>: <message>")."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def _call(self, work: Any) -> Any:
        try:
            return await work
        except ApiError as exc:
            raise RuntimeError(f"Error: {exc}") from None

    async def dispatch(self, queue: str, job: Any) -> Any:
        return await self._call(self.service.dispatch(str(queue), job))

    async def dispatch_job(self, job: Any) -> Any:
        return await self._call(self.service.dispatch_job(job))

    async def dispatch_batch(self, queue: str, jobs: Any) -> Any:
        return await self._call(self.service.dispatch_batch(str(queue), jobs))

    async def stats(self, queue: Any = None) -> Any:
        s = self.service
        return await self._call(s.queues() if queue is None else s.queue_stats(str(queue)))

    async def job(self, id: str) -> Any:
        return await self._call(self.service.job(str(id)))

    async def cancel(self, id: str) -> Any:
        return await self._call(self.service.cancel(str(id)))

    async def completed(self, queue: str, limit: Any = 50, cursor: Any = None) -> Any:
        return await self._call(
            self.service.completed(str(queue), 50 if limit is None else limit, cursor)
        )

    async def batch(self, batch: Any) -> Any:
        return await self._call(self.service.batch(batch))

    async def batch_state(self, id: str) -> Any:
        return await self._call(self.service.batch_state(str(id)))

    async def add_to_batch(self, id: str, jobs: Any) -> Any:
        return await self._call(self.service.add_to_batch(str(id), jobs))


@pytest.fixture
def api(queue: D1Queue) -> Api:
    # Completed jobs kept, as the Worker glue keeps them by default.
    queue.keep_completed = True
    return Api(Service(queue, registry()), TOKEN, "1", SPEC)


def over_http(api: Api, token: str = TOKEN) -> Client:
    async def fetch(
        method: str, url: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        assert url.startswith(BASE)
        reply = await api.handle(method, url, headers, body or b"")
        return reply.status, b"" if reply.body is None else json.dumps(reply.body).encode()

    return Client.over_http(BASE + "/", token, fetch=fetch)


@pytest.fixture(params=["http", "binding"])
def client(request: pytest.FixtureRequest, api: Api) -> Client:
    if request.param == "http":
        return over_http(api)
    return Client.over_binding(Binding(api.service))


async def test_push_read_cancel(client: Client) -> None:
    pushed = await client.push("mail", "t.echo", {"a": 1}, unique_key="k", priority=3)
    assert pushed["queue"] == "mail" and pushed["deduplicated"] is False
    again = await client.push("mail", "t.echo", {"a": 2}, unique_key="k")
    assert again["id"] == pushed["id"] and again["deduplicated"] is True
    state = await client.job(pushed["id"])
    assert (state["state"], state["payload"], state["priority"]) == ("ready", {"a": 1}, 3)
    assert (await client.stats("mail"))["ready"] == 1
    assert [s["queue"] for s in (await client.stats())["queues"]] == ["mail"]
    assert await client.cancel(pushed["id"]) == {"id": pushed["id"], "cancelled": True}
    with pytest.raises(ClientError) as caught:
        await client.job(pushed["id"])
    assert (caught.value.status, caught.value.code) == (404, "not_found")


async def test_push_by_name_and_batch(client: Client) -> None:
    by_name = await client.push(None, "t.echo", 1)
    assert by_name["queue"] == "default"
    batch = await client.push_batch("bulk", [{"name": "t.echo", "payload": i} for i in range(3)])
    assert len(batch["ids"]) == 3 and batch["deduplicated"] == [False] * 3
    assert (await client.job(batch["ids"][2]))["payload"] == 2


BAD: list[tuple[str, tuple[Any, ...], dict[str, Any], str, dict[str, Any] | None]] = [
    # (client method, args, options, the HTTP request path, its body)
    ("push", ("mail", "nope"), {}, "/v1/queues/mail/jobs", {"name": "nope", "payload": None}),
    (
        "push",
        ("mail", "t.echo"),
        {"priority": "high"},
        "/v1/queues/mail/jobs",
        {"name": "t.echo", "payload": None, "priority": "high"},
    ),
    (
        "push",
        ("mail", "t.echo"),
        {"delay": 5},
        "/v1/queues/mail/jobs",
        {"name": "t.echo", "payload": None, "delay": 5},
    ),
    (
        "push",
        ("mail", "t.echo", "x" * MAX_PAYLOAD_BYTES),
        {},
        "/v1/queues/mail/jobs",
        {"name": "t.echo", "payload": "x" * MAX_PAYLOAD_BYTES},
    ),
    ("push", ("no/such queue", "t.echo"), {}, "/v1/queues/no%20queue/jobs", {"name": "t.echo"}),
    ("push", (None, "t.echo"), {"queue": "a b"}, "/v1/jobs", {"name": "t.echo", "queue": "a b"}),
    ("push_batch", ("mail", []), {}, "/v1/queues/mail/jobs/batch", {"jobs": []}),
    ("job", ("a/b",), {}, "/v1/jobs/a%2Fb", None),
    ("cancel", ("x" * 200,), {}, "/v1/jobs/" + "x" * 200, None),
    ("stats", ("bad queue",), {}, "/v1/queues/bad%20queue", None),
    (
        "push",
        ("mail", "t.echo"),
        {"after": ["a b"]},
        "/v1/queues/mail/jobs",
        {"name": "t.echo", "payload": None, "after": ["a b"]},
    ),
    (
        "push",
        (None, "t.echo"),
        {"after": ["0" * 32], "ignore_failed": True},
        "/v1/jobs",
        {"name": "t.echo", "payload": None, "after": ["0" * 32], "ignore_failed": True},
    ),
    ("batch", ([],), {}, "/v1/batches", {"jobs": []}),
    (
        "batch",
        ([{"name": "t.echo"}],),
        {"on_success": {"name": "t.echo", "delay_s": 1}},
        "/v1/batches",
        {"jobs": [{"name": "t.echo"}], "on_success": {"name": "t.echo", "delay_s": 1}},
    ),
    ("batch_state", ("a b",), {}, "/v1/batches/a%20b", None),
    ("batch_state", ("0" * 32,), {}, "/v1/batches/" + "0" * 32, None),
    (
        "add_to_batch",
        ("0" * 32, [{"name": "t.echo"}]),
        {},
        "/v1/batches/" + "0" * 32 + "/jobs",
        {"jobs": [{"name": "t.echo"}]},
    ),
    ("completed", ("a b",), {}, "/v1/queues/a%20b/completed", None),
    ("completed", ("mail",), {"limit": 0}, "/v1/queues/mail/completed?limit=0", None),
    ("completed", ("mail",), {"cursor": "x"}, "/v1/queues/mail/completed?cursor=x", None),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: f"{c[0]}:{c[3]}")
async def test_bad_input_is_refused_as_the_api_refuses_it(
    case: tuple[str, tuple[Any, ...], dict[str, Any], str, dict[str, Any] | None],
    api: Api,
    db: SqliteD1,
) -> None:
    method, args, options, path, body = case
    raw = RawApi(api, db)
    answer = await raw("GET" if body is None else "POST", path, body)
    if method == "cancel":
        answer = await raw("DELETE", path)
    assert 400 <= answer.status < 500
    expected = (answer.status, answer.body["error"]["code"])
    for client in (over_http(api), Client.over_binding(Binding(api.service))):
        with pytest.raises(ClientError) as caught:
            await getattr(client, method)(*args, **options)
        assert (caught.value.status, caught.value.code) == expected
    assert raw.counts() == (0, 0, 0), "nothing written"
    for table in ("d1queue_deps", "d1queue_batches"):
        assert db.query(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"] == 0, table


async def test_workflows_over_either_transport(client: Client, api: Api) -> None:
    a = await client.push("flow", "t.echo", {"n": 1})
    b = await client.push(None, "t.echo", {"n": 2}, queue="flow", after=[a["id"]])
    c = await client.push("flow", "t.echo", {"n": 3}, after=[a["id"]], ignore_failed=True)
    state = await client.job(b["id"])
    assert (state["state"], state["after"], state["ignore_failed"]) == ("waiting", [a["id"]], False)
    assert (await client.job(c["id"]))["ignore_failed"] is True
    assert (await client.job(a["id"]))["dependents"] == sorted([b["id"], c["id"]])
    with pytest.raises(ClientError) as caught:
        await client.push("flow", "t.echo", after=["0" * 32])
    assert (caught.value.status, caught.value.code) == (422, "unknown_dependency")

    made = await client.batch(
        [{"name": "t.echo", "payload": i, "queue": "flow"} for i in range(2)],
        on_finish={"name": "t.echo", "payload": "done", "queue": "flow"},
    )
    assert set(made) == {"batch", "ids"} and len(made["ids"]) == 2
    added = await client.add_to_batch(made["batch"], [{"name": "t.echo", "queue": "flow"}])
    assert len(added["ids"]) == 1
    got = await client.batch_state(made["batch"])
    assert (got["total"], got["state"], got["ids"]) == (3, "running", made["ids"] + added["ids"])

    await drain(api.service.queue, api.service.registry, Config())
    await drain(api.service.queue, api.service.registry, Config())
    got = await client.batch_state(made["batch"])
    assert (got["state"], got["completed"]) == ("succeeded", 3)
    with pytest.raises(ClientError) as caught:
        await client.add_to_batch(made["batch"], [{"name": "t.echo"}])
    assert (caught.value.status, caught.value.code) == (409, "batch_not_running")
    assert (await client.job(b["id"]))["state"] == "completed"

    page = await client.completed("flow", limit=3)
    assert len(page["jobs"]) == 3 and page["next_cursor"] is not None
    assert all(j["state"] == "completed" for j in page["jobs"])
    rest = await client.completed("flow", 100, page["next_cursor"])
    seen = [j["id"] for j in page["jobs"] + rest["jobs"]]
    assert rest["next_cursor"] is None and len(seen) == len(set(seen)) == 7
    assert f"{made['batch']}:on_finish" in seen


async def test_a_payload_json_cannot_hold_is_refused_before_sending(client: Client) -> None:
    with pytest.raises(ClientError) as caught:
        await client.push("mail", "t.echo", {1, 2})
    assert (caught.value.status, caught.value.code) == (422, "invalid")


async def test_a_wrong_token_is_a_client_error(api: Api) -> None:
    with pytest.raises(ClientError) as caught:
        await over_http(api, token="wrong").push("mail", "t.echo")
    assert (caught.value.status, caught.value.code) == (401, "unauthorized")


async def test_an_error_that_is_not_d1queues_is_raised_as_is() -> None:
    class Broken:
        async def job(self, id: str) -> Any:
            raise RuntimeError("Error: Network connection lost.")

    with pytest.raises(RuntimeError, match="Network connection lost"):
        await Client.over_binding(Broken()).job("abc")


async def test_an_answer_that_is_not_d1queues_says_its_status() -> None:
    async def proxy(method: str, url: str, headers: dict[str, str], body: Any) -> Any:
        return 502, b"<html>bad gateway</html>"

    with pytest.raises(ClientError) as caught:
        await Client.over_http(BASE, TOKEN, fetch=proxy).job("abc")
    assert (caught.value.status, caught.value.code) == (502, "http_error")


REDIRECTED: list[tuple[str, tuple[Any, ...], str, str]] = [
    # (client method, args, the request's method and path)
    ("job", ("abc",), "GET", "/v1/jobs/abc"),
    ("stats", (), "GET", "/v1/queues"),
    ("push", ("mail", "t.echo", {"to": "a@example.com"}), "POST", "/v1/queues/mail/jobs"),
]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("case", REDIRECTED, ids=lambda c: c[0])
async def test_a_redirect_is_an_error_and_is_not_followed(
    case: tuple[str, tuple[Any, ...], str, str], status: int
) -> None:
    """The urllib transport on loopback: a d1queue URL answering 3xx to
    another server. The client raises `redirected`, naming the Location,
    and the other server sees nothing: not the request, not the token."""
    method, args, verb, path = case
    with running_server() as other, running_server() as first:
        location = f"{other.url}{path}"
        first.script[path] = [(status, {"location": location}, "moved", 0.0)]
        # What the other server would answer: a pushed job's shape.
        other.script[path] = [(200, {"content-type": "application/json"}, '{"id": "x"}', 0.0)]
        client = Client.over_http(first.url, TOKEN)
        with pytest.raises(ClientError) as caught:
            await getattr(client, method)(*args)
        assert (caught.value.status, caught.value.code) == (status, "redirected")
        assert location in caught.value.message
        assert [(m, p) for m, p, *_ in first.seen] == [(verb, path)]
        assert first.headers_seen[0]["authorization"] == f"Bearer {TOKEN}"
        assert other.seen == [] and other.headers_seen == []


async def test_a_3xx_from_a_callers_fetch_is_an_error() -> None:
    async def moved(method: str, url: str, headers: dict[str, str], body: Any) -> Any:
        return 302, b'{"id": "x"}'

    with pytest.raises(ClientError) as caught:
        await Client.over_http(BASE, TOKEN, fetch=moved).push("mail", "t.echo")
    assert (caught.value.status, caught.value.code) == (302, "redirected")


def test_every_error_code_has_its_status() -> None:
    """ERROR_STATUS gives an RPC error its HTTP status: every
    ApiError(<status>, "<code>") the package raises is in it, with its status."""
    package = Path(__file__).resolve().parents[1] / "src" / "d1queue"
    raised: dict[str, int] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "ApiError"
                and len(node.args) >= 2
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[1], ast.Constant)
            ):
                raised[node.args[1].value] = node.args[0].value
    assert raised and all(ERROR_STATUS.get(code) == status for code, status in raised.items())


async def test_a_push_carries_its_traceparent_over_http_and_rpc(
    client: Client, db: SqliteD1
) -> None:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    pushed = await client.push("mail", "t.echo", {}, traceparent=trace)
    (row,) = db.query("SELECT traceparent FROM d1queue_jobs WHERE id = ?", pushed["id"])
    assert row["traceparent"] == trace
    with pytest.raises(ClientError) as caught:
        await client.push("mail", "t.echo", {}, traceparent=trace.upper())
    assert (caught.value.status, caught.value.code) == (422, "invalid")
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == 1


async def test_cancel_of_a_running_job_and_of_an_ended_one(client: Client, queue: D1Queue) -> None:
    """Over HTTP (202) and over the binding (RPC) alike: a running job is
    marked, and a job that ended is 409 `ended`, with nothing written."""
    pushed = await client.push("mail", "t.echo", {"a": 1})
    await queue.reserve("mail")
    cancelling = {"id": pushed["id"], "cancelled": False, "state": "cancelling"}
    assert await client.cancel(pushed["id"]) == cancelling
    assert await client.cancel(pushed["id"]) == cancelling, "the same answer, re-sent"
    assert (await client.job(pushed["id"]))["state"] == "cancelling"
    done = await client.push("mail", "t.echo", {"a": 2})
    (job,) = await queue.reserve_batch("mail", 1)
    await queue.complete(job)
    with pytest.raises(ClientError) as caught:
        await client.cancel(done["id"])
    assert (caught.value.status, caught.value.code) == (409, "ended")
    assert "completed" in caught.value.message
