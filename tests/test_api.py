"""The HTTP API, driven as plain Python over SqliteD1: every route's success
and error paths, and nothing written on any 4xx."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.bounds import MAX_PAYLOAD_BYTES
from d1queue.core.d1_faults import is_unavailable
from d1queue.core.job import QueuedJob
from d1queue.core.log import fields_of
from d1queue.interfaces.api import INDEX, MAX_BODY_BYTES, Api, ApiReply
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import UNAVAILABLE_RETRY_AFTER_S, Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.admin import Admin
from d1queue.store.binding import RetryPolicy
from d1queue.store.push import push_many_noting_paused, push_noting_paused

from .conftest import Clock

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def registry() -> Registry:
    reg = Registry()

    @reg.job("t.echo", max_attempts=4)
    async def echo(payload: Any) -> None: ...

    @reg.job("t.boom", max_attempts=1)
    async def boom(payload: Any) -> None:
        raise RuntimeError("boom")

    return reg


class Client:
    def __init__(self, api: Api, db: SqliteD1) -> None:
        self.api, self.db = api, db

    async def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: bool = True,
        raw: bytes | None = None,
    ) -> ApiReply:
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        return await self.api.handle(method, f"https://q.example{path}", AUTH if auth else {}, data)

    def counts(self) -> tuple[int, int, int]:
        return tuple(  # type: ignore[return-value]
            self.db.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"]
            for t in ("d1queue_jobs", "d1queue_failed_jobs", "d1queue_queues")
        )


@pytest.fixture
def reg() -> Registry:
    return registry()


@pytest.fixture
def client(db: SqliteD1, queue: D1Queue, reg: Registry) -> Client:
    return Client(Api(Service(queue, reg), TOKEN, "9.9", SPEC), db)


async def test_health_needs_no_token(client: Client) -> None:
    r = await client("GET", "/health", auth=False)
    assert (r.status, r.body) == (200, {"ok": True, "version": "9.9"})


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer nope"}, {"authorization": TOKEN}, {"authorization": "Basic x"}],
)
async def test_every_route_but_health_needs_the_token(client: Client, headers: dict) -> None:
    for method, path in [("GET", "/v1/queues"), ("POST", "/v1/queues/a/jobs"), ("GET", "/nope")]:
        r = await client.api.handle(method, path, headers, b"{}")
        assert r.status == 401 and r.body["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"


async def test_no_token_configured_is_503(db: SqliteD1, queue: D1Queue, reg: Registry) -> None:
    api = Api(Service(queue, reg), None, "1", SPEC)
    r = await api.handle("GET", "/v1/queues", AUTH, b"")
    assert r.status == 503 and "D1QUEUE_TOKEN" in r.body["error"]["message"]


async def test_push_dedupe_state_cancel(client: Client, queue: D1Queue, clock: Clock) -> None:
    r = await client("POST", "/v1/queues/mail/jobs", {"name": "t.echo", "payload": {"a": 1}})
    assert r.status == 201 and r.body["queue"] == "mail" and r.body["deduplicated"] is False
    job_id = r.body["id"]
    got = await client("GET", f"/v1/jobs/{job_id}")
    assert got.status == 200
    assert (got.body["state"], got.body["payload"], got.body["max_attempts"]) == (
        "ready",
        {"a": 1},
        4,
    )

    body = {"name": "t.echo", "unique_key": "k", "delay_s": 30, "priority": 7, "max_attempts": 2}
    first = await client("POST", "/v1/queues/mail/jobs", body)
    again = await client("POST", "/v1/queues/mail/jobs", body)
    assert (first.status, again.status) == (201, 200)
    assert again.body == {**first.body, "deduplicated": True}
    assert again.body["id"] == first.body["id"] and again.body["queue"] == "mail"
    assert (await client("GET", f"/v1/jobs/{first.body['id']}")).body["state"] == "delayed"

    await queue.reserve("mail")
    assert (await client("GET", f"/v1/jobs/{job_id}")).body["state"] == "reserved"
    r = await client("DELETE", f"/v1/jobs/{job_id}")
    assert (r.status, r.body) == (202, {"id": job_id, "cancelled": False, "state": "cancelling"})
    assert (await client("GET", f"/v1/jobs/{job_id}")).body["state"] == "cancelling"
    r = await client("DELETE", f"/v1/jobs/{first.body['id']}")
    assert (r.status, r.body) == (200, {"id": first.body["id"], "cancelled": True})
    r = await client("GET", f"/v1/jobs/{first.body['id']}")
    assert r.status == 404 and "never existed" in r.body["error"]["message"]
    assert (await client("DELETE", "/v1/jobs/nope")).status == 404


async def test_batch_is_all_or_nothing_and_packed(client: Client, db: SqliteD1) -> None:
    jobs = [{"name": "t.echo", "payload": i} for i in range(25)]
    jobs[3]["unique_key"] = jobs[4]["unique_key"] = "same"
    before = len(db.statements)
    r = await client("POST", "/v1/queues/q/jobs/batch", {"jobs": jobs})
    assert r.status == 201 and len(r.body["ids"]) == 25
    assert r.body["ids"][4] == r.body["ids"][3] and r.body["deduplicated"][4] is True
    assert sum(r.body["deduplicated"]) == 1
    inserts = [s for s in db.statements[before:] if s.startswith("INSERT")]
    assert len(inserts) == 4, "23 plain rows in 3 statements, 2 keyed rows in 1"
    assert client.counts() == (24, 0, 0)

    bad = [*jobs[:5], {"name": "t.unknown"}]
    r = await client("POST", "/v1/queues/q/jobs/batch", {"jobs": bad})
    assert r.status == 422 and "jobs[5]" in r.body["error"]["message"]
    too_many = [{"name": "t.echo"}] * 101
    assert (await client("POST", "/v1/queues/q/jobs/batch", {"jobs": too_many})).status == 422
    assert (await client("POST", "/v1/queues/q/jobs/batch", {"jobs": []})).status == 422
    assert client.counts() == (24, 0, 0)


@pytest.mark.parametrize(
    ("path", "body", "raw", "status", "code"),
    [
        ("/v1/queues/q/jobs", None, b"{not json", 400, "malformed_json"),
        ("/v1/queues/q/jobs", None, b"\xff\xfe", 400, "malformed_json"),
        ("/v1/queues/q/jobs", None, b'{"name": "t.echo", "payload": NaN}', 400, "malformed_json"),
        ("/v1/queues/q/jobs", [1, 2], None, 400, "malformed_json"),
        ("/v1/queues/bad%20name/jobs", {"name": "t.echo"}, None, 400, "invalid_queue"),
        ("/v1/queues/q/jobs", {"name": "t.nope"}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"name": "bad name"}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"payload": 1}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "delay_s": -1}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "delay_s": True}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "max_attempts": 0}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "max_attempts": 1.5}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "priority": 10**20}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "unique_key": ""}, None, 422, "invalid"),
        ("/v1/queues/q/jobs", {"name": "t.echo", "extra": 1}, None, 422, "invalid"),
        (
            "/v1/queues/q/jobs",
            {"name": "t.echo", "payload": "x" * MAX_PAYLOAD_BYTES},
            None,
            413,
            "payload_too_large",
        ),
        ("/v1/queues/q/jobs", None, b" " * (MAX_BODY_BYTES + 1), 413, "payload_too_large"),
        ("/v1/queues/q/jobs/batch", {"jobs": [], "x": 1}, None, 422, "invalid"),
    ],
)
async def test_bad_input_is_refused_and_writes_nothing(
    client: Client, path: str, body: Any, raw: bytes | None, status: int, code: str
) -> None:
    r = await client("POST", path, body, raw=raw)
    assert (r.status, r.body["error"]["code"]) == (status, code), r.body
    assert set(r.body) == {"error"} and r.body["error"]["message"]
    assert client.counts() == (0, 0, 0)


async def test_unknown_routes_and_methods(client: Client) -> None:
    assert (await client("GET", "/v2/x")).status == 404
    r = await client("PUT", "/v1/queues")
    assert r.status == 405 and r.body["error"]["code"] == "method_not_allowed"


async def test_stats_pause_resume_clear(
    client: Client, queue: D1Queue, reg: Registry, clock: Clock
) -> None:
    for i in range(3):
        await client("POST", "/v1/queues/a/jobs", {"name": "t.echo", "payload": i})
        clock.advance(1)
    await client("POST", "/v1/queues/a/jobs", {"name": "t.echo", "delay_s": 60})
    await client("POST", "/v1/queues/b/jobs", {"name": "t.boom"})
    await queue.reserve("a")
    await drain(queue, reg, Config(queues=("b",)))
    a = (await client("GET", "/v1/queues/a")).body
    assert a == {
        "queue": "a",
        "ready": 2,
        "delayed": 1,
        "reserved": 1,
        "waiting": 0,
        "failed": 0,
        "oldest_ready_age_s": 2.0,
        "paused": False,
        "limits": None,
    }
    everything = (await client("GET", "/v1/queues")).body["queues"]
    assert [(s["queue"], s["failed"]) for s in everything] == [("a", 0), ("b", 1)]
    empty = (await client("GET", "/v1/queues/nothing")).body
    assert empty["ready"] == 0 and empty["oldest_ready_age_s"] is None

    assert (await client("POST", "/v1/queues/a/pause")).body["paused"] is True
    report = await drain(queue, reg, Config(queues=("a",)))
    assert report.claimed == 0 and report.paused == ["a"]
    assert (await client("POST", "/v1/queues/a/jobs", {"name": "t.echo"})).status == 201
    assert (await client("POST", "/v1/queues/a/resume")).body["paused"] is False
    assert (await drain(queue, reg, Config(queues=("a",)))).completed == 3
    r = await client("DELETE", "/v1/queues/a/jobs")
    assert r.body == {"deleted": 2}, "the delayed job and the reserved one"


async def test_failed_jobs_page_retry_delete_prune(
    client: Client, queue: D1Queue, reg: Registry, clock: Clock
) -> None:
    for i in range(5):
        await client("POST", f"/v1/queues/{'ab'[i % 2]}/jobs", {"name": "t.boom", "payload": i})
    for i in range(5):  # fail them in order, a second apart
        job = await queue.reserve("ab"[i % 2])
        assert job is not None and job.payload == i
        await queue.fail(job, "RuntimeError: boom")
        clock.advance(1)
    page1 = (await client("GET", "/v1/failed?limit=2")).body
    assert [j["payload"] for j in page1["jobs"]] == [4, 3] and page1["next_cursor"]
    page2 = (await client("GET", f"/v1/failed?limit=2&cursor={page1['next_cursor']}")).body
    page3 = (await client("GET", f"/v1/failed?limit=2&cursor={page2['next_cursor']}")).body
    assert [j["payload"] for j in page2["jobs"] + page3["jobs"]] == [2, 1, 0]
    assert page3["next_cursor"] is None
    only_b = (await client("GET", "/v1/failed?queue=b")).body["jobs"]
    assert [j["payload"] for j in only_b] == [3, 1] and only_b[0]["state"] == "failed"
    assert "RuntimeError: boom" in only_b[0]["error"]
    failed_id = only_b[0]["id"]
    assert (await client("GET", f"/v1/jobs/{failed_id}")).body["state"] == "failed"
    for bad in ("limit=0", "limit=x", "limit=501", "cursor=zzz", "queue=a%20b"):
        assert (await client("GET", f"/v1/failed?{bad}")).status == 400, bad

    r = await client("POST", f"/v1/failed/{failed_id}/retry")
    assert (r.status, r.body) == (200, {"id": failed_id, "retried": True})
    again = (await client("GET", f"/v1/jobs/{failed_id}")).body
    assert again["state"] == "ready" and again["payload"] == 3
    # Its history stays, and t.boom's registration gives it 1 attempt more.
    assert (again["attempts"], again["max_attempts"]) == (1, 2)
    assert again["last_error"] == "RuntimeError: boom"
    assert (await client("POST", f"/v1/failed/{failed_id}/retry")).status == 404
    assert (await client("DELETE", f"/v1/failed/{page1['jobs'][0]['id']}")).body == {"deleted": 1}
    assert (await client("DELETE", f"/v1/failed/{page1['jobs'][0]['id']}")).status == 404
    assert (await client("DELETE", "/v1/failed")).status == 400
    assert (await client("DELETE", "/v1/failed?older_than_s=-1")).status == 400
    clock.advance(100)
    assert (await client("DELETE", "/v1/failed?older_than_s=104.5")).body == {"deleted": 1}
    assert (await client("DELETE", "/v1/failed?older_than_s=0")).body == {"deleted": 2}


@pytest.mark.parametrize(
    ("text", "answered"),
    [
        ('{"a": [1, 2]}', {"a": [1, 2]}),
        ('"x"', "x"),
        ("null", None),
        ("not json", "not json"),
        ("NaN", "NaN"),
        ("[" * 80 + "]" * 80, "[" * 80 + "]" * 80),
    ],
)
async def test_a_failed_jobs_payload_is_its_json_value_or_else_its_text(
    client: Client, queue: D1Queue, text: str, answered: Any
) -> None:
    """The store keeps a failure's payload as text; the API answers the
    value, as for a queued job, and text that is not JSON (or nests too
    deep to parse safely) as the string it is."""
    await queue.binding.run(
        "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, attempts, "
        "max_attempts, priority, created_at, failed_at) VALUES ('f1', 'q', 't.echo', ?1, "
        "'bad', 1, 1, 0, 1, 2)",
        text,
    )
    page = (await client("GET", "/v1/failed")).body["jobs"]
    assert [j["payload"] for j in page] == [answered]
    assert (await client("GET", "/v1/jobs/f1")).body["payload"] == answered
    json.dumps((await client("GET", "/v1/failed")).body, allow_nan=False)


async def test_the_openapi_document_is_served_and_valid(client: Client) -> None:
    from openapi_spec_validator import validate

    r = await client("GET", "/v1/openapi.json")
    assert r.status == 200 and r.body["openapi"] == "3.1.0"
    validate(r.body)


async def test_a_push_says_when_its_queue_is_paused_or_not_drained(
    db: SqliteD1, queue: D1Queue, reg: Registry
) -> None:
    """A 201 alone does not mean the job will run: the answer says whether
    the queue is paused and whether this Worker's D1QUEUE_QUEUES drains it,
    for one push and for a batch."""
    client = Client(Api(Service(queue, reg, config=Config(queues=("mail",))), TOKEN, "1", SPEC), db)
    job = {"name": "t.echo"}
    r = await client("POST", "/v1/queues/mail/jobs", job)
    assert r.status == 201
    assert (r.body["paused"], r.body["runs_here"], r.body["warnings"]) == (False, True, [])
    assert r.body["drained"] is True  # the older name, kept beside runs_here
    r = await client("POST", "/v1/queues/other/jobs", job)
    assert r.status == 201 and (r.body["paused"], r.body["runs_here"]) == (False, False)
    assert r.body["drained"] is False
    (warning,) = r.body["warnings"]
    assert "'other' is not drained" in warning and "D1QUEUE_QUEUES is 'mail'" in warning
    assert (await client("POST", "/v1/queues/mail/pause")).status == 200
    r = await client("POST", "/v1/queues/mail/jobs/batch", {"jobs": [job, job]})
    assert r.status == 201 and (r.body["paused"], r.body["runs_here"]) == (True, True)
    assert r.body["warnings"] == [
        "queue 'mail' is paused: its jobs wait until it is resumed (POST /v1/queues/mail/resume)"
    ]
    # "the rest": a list ending in * drains every queue.
    rest = Service(queue, reg, config=Config(queues=("mail", "*")))
    assert (await rest.dispatch("other", job))["runs_here"] is True
    assert client.counts() == (5, 0, 1), "the answers are reads: every push was stored"


@pytest.mark.parametrize("unique", [False, True])
async def test_a_push_and_its_pause_state_cost_one_round_trip(
    queue: D1Queue, reg: Registry, unique: bool
) -> None:
    await Service(queue, reg).set_paused("mail", True)
    service = Service(queue, reg)
    job = {"name": "t.echo", **({"unique_key": "k"} if unique else {})}
    for call in (
        lambda: service.dispatch("mail", job),
        lambda: service.dispatch_job({**job, "queue": "mail"}),
        lambda: service.dispatch_batch("mail", [job]),
    ):
        before = queue.binding.usage.queries
        answer = await call()
        assert answer["paused"] is True
        assert queue.binding.usage.queries - before == 1, "the insert and the read, one batch"


async def test_a_push_reads_the_pause_state_in_its_own_batch(queue: D1Queue) -> None:
    """The driver's push_noting_paused and push_many_noting_paused: the
    paused queues ride in the insert's db.batch, one round trip each, for a
    plain, a unique and a batch push."""
    await Admin(queue).set_paused("p", True)
    for job in (
        QueuedJob.new("t.echo", 1, queue="p", at_ms=queue.clock()),
        QueuedJob.new("t.echo", 2, queue="q", at_ms=queue.clock(), unique_key="k"),
    ):
        before = queue.binding.usage.queries
        job_id, paused = await push_noting_paused(queue, job)
        assert (job_id, paused) == (job.id, {"p"})
        assert queue.binding.usage.queries - before == 1
    before = queue.binding.usage.queries
    jobs = [QueuedJob.new("t.echo", i, queue="q", at_ms=queue.clock()) for i in range(3)]
    results, paused = await push_many_noting_paused(queue, jobs)
    assert [r for r, _ in results] == [j.id for j in jobs] and paused == {"p"}
    assert queue.binding.usage.queries - before == 1


# -- GET /: where things are ---------------------------------------------------

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


async def test_the_root_sends_a_browser_to_the_dashboard_and_a_client_the_links(
    client: Client,
) -> None:
    async def root(method: str, accept: str | None) -> ApiReply:
        headers = {} if accept is None else {"accept": accept}
        return await client.api.handle(method, "https://q.example/?x=1", headers, b"")

    for accept in (BROWSER_ACCEPT, "text/html"):
        r = await root("GET", accept)
        assert (r.status, r.headers["location"], r.body) == (303, "/ui", None)
        assert (await root("HEAD", accept)).status == 303
    for accept in (None, "*/*", "application/json", "text/html;q=0.5, application/json"):
        r = await root("GET", accept)
        assert r.status == 200 and r.headers["content-type"] == "application/json", accept
        assert r.body["api"] == "/v1" and r.body["openapi"] == "/v1/openapi.json"
        assert (r.body["dashboard"], r.body["health"]) == ("/ui", "/health")
    head = await root("HEAD", None)
    assert (head.status, head.body) == (200, None)
    options = await root("OPTIONS", None)
    assert (options.status, options.headers["allow"]) == (204, "OPTIONS, GET, HEAD")
    post = await root("POST", None)  # public path: 405 without the token, not 401
    assert (post.status, post.headers["allow"]) == (405, "OPTIONS, GET, HEAD")


async def test_under_a_prefix_the_root_sends_a_browser_and_a_client_under_it(
    queue: D1Queue, reg: Registry
) -> None:
    """A Worker mounting d1queue at /queue routes /queue here as "/": what
    it answers names the paths a browser or a client must send, the prefix
    included (/ui alone is the Worker's own route, not the dashboard)."""
    api = Api(Service(queue, reg), TOKEN, "9.9", SPEC, prefix="/queue")
    browser = await api.handle("GET", "https://q.example/", {"accept": BROWSER_ACCEPT}, b"")
    assert (browser.status, browser.headers["location"]) == (303, "/queue/ui")
    client = await api.handle("GET", "https://q.example/", {}, b"")
    assert client.status == 200 and set(client.body) == set(INDEX)
    for key, path in INDEX.items():
        if path.startswith("/"):
            assert client.body[key] == "/queue" + path, key
    assert client.body["auth"] == "Authorization: Bearer <D1QUEUE_TOKEN> on every /queue/v1 route"
    root = await Api(Service(queue, reg), TOKEN, "9.9", SPEC).handle("GET", "https://q/", {}, b"")
    assert root.body == INDEX


# -- D1 failing: 503 unavailable, never a 500 carrying its text ------------------

OVERLOADED = "D1_ERROR: D1 DB is overloaded. Too many requests queued."
LOST = "D1_ERROR: Network connection lost."


@pytest.mark.parametrize("message", [OVERLOADED, LOST])
async def test_d1_unavailable_is_503_with_retry_after(
    db: SqliteD1, reg: Registry, clock: Clock, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A D1 fault the binding cannot ride out (overloaded is not re-sent; a
    lost connection is, until its tries run out) answers 503 `unavailable`
    with Retry-After, on a read and a write, and is logged."""
    queue = D1Queue(db, clock=clock)
    queue.binding.retry = RetryPolicy(tries=2, base_s=0.001)
    client = Client(Api(Service(queue, reg), TOKEN, "9.9", SPEC), db)
    db.fail_when("d1queue", message, times=None)
    with caplog.at_level(logging.WARNING, logger="d1queue"):
        for method, path, body in (
            ("GET", "/v1/queues/q", None),
            ("POST", "/v1/queues/q/jobs", {"name": "t.echo"}),
            ("GET", "/v1/failed", None),
        ):
            r = await client(method, path, body)
            assert r.status == 503, (path, r.body)
            assert r.body["error"]["code"] == "unavailable"
            assert r.headers["retry-after"] == str(UNAVAILABLE_RETRY_AFTER_S)
            assert 1 <= UNAVAILABLE_RETRY_AFTER_S <= 5
            assert "D1_ERROR" not in r.body["error"]["message"]
    logged = [fields_of(r) for r in caplog.records if r.getMessage() == "d1queue.api.unavailable"]
    assert len(logged) == 3 and message in logged[0]["error"]
    db.clear_faults()
    assert (await client("GET", "/v1/queues/q")).status == 200


async def test_a_bug_is_500_internal_without_its_text(
    client: Client, db: SqliteD1, caplog: pytest.LogCaptureFixture
) -> None:
    """D1 refusing a statement, or Python raising, is a bug: 500 `internal`,
    the exception's text in the log and not in the answer."""
    db.fail_when("d1queue", "D1_ERROR: no such column: secret_column", times=1)
    with caplog.at_level(logging.ERROR, logger="d1queue"):
        r = await client("GET", "/v1/queues/q")
    assert (r.status, r.body["error"]["code"]) == (500, "internal")
    assert "secret_column" not in json.dumps(r.body) and "retry-after" not in r.headers
    (logged,) = [fields_of(x) for x in caplog.records if x.getMessage() == "d1queue.api.failed"]
    assert "secret_column" in logged["error"] and "Traceback" in logged["traceback"]

    async def broken(*_: Any) -> Any:
        raise RuntimeError("a token-like secret in a bug's message")

    client.api.service.queues = broken  # type: ignore[method-assign]
    r = await client("GET", "/v1/queues")
    assert (r.status, r.body["error"]["code"]) == (500, "internal")
    assert "secret" not in r.body["error"]["message"]


def test_unavailable_is_the_d1_errors_that_pass_not_the_statements_faults() -> None:
    for text in (OVERLOADED, LOST, "D1_ERROR: D1 DB storage operation exceeded timeout"):
        assert is_unavailable(RuntimeError(f"Error: {text}")), text
    for text in ("D1_ERROR: UNIQUE constraint failed", "D1_ERROR: no such table: x", "boom"):
        assert not is_unavailable(RuntimeError(text)), text
    try:
        try:
            raise RuntimeError(LOST)
        except RuntimeError as exc:
            raise ValueError("wrapped") from exc
    except ValueError as wrapped:
        assert is_unavailable(wrapped), "a D1 error raised again from it counts"
    try:
        try:
            raise RuntimeError(LOST)
        except RuntimeError:
            raise KeyError("a bug while handling it") from None
    except KeyError as bug:
        assert not is_unavailable(bug), "a bug met while handling one does not"
