"""The read-only token (D1QUEUE_READONLY_TOKEN): it signs in to the
dashboard and reads the API, sees every page, and can change nothing. Its
pages show no action and the server refuses every one (403), writing
nothing; the API token's sessions are untouched by it."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from d1queue import Config, D1Queue
from d1queue.core.config import ConfigError
from d1queue.interfaces.api import Api
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.dashboard.session import Sessions
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1

from .contract import Clock
from .test_dashboard import TOKEN, Browser, fail_some, paused, registry

READONLY = "read-only-token-of-the-dashboard-tests"
LONG_TOKEN = "the-api-token-of-these-tests-32-chars"


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    return Service(D1Queue(db, clock=clock), registry())


@pytest.fixture
def board(service: Service) -> Dashboard:
    return Dashboard(service, TOKEN, readonly_token=READONLY)


async def signed_in(board: Dashboard, clock: Clock, token: str) -> Browser:
    b = Browser(board, clock)
    reply = await b.post("/ui/signin", {"token": token, "next": "/ui"})
    assert reply.status == 303 and reply.headers["location"] == "/ui"
    await b.get("/ui")
    return b


ACTIONS = re.compile(r'<form method="post" action="/ui/(?!signout)')
"""A form that would change something (every one but sign-out)."""


def _without_reads(page: str) -> str:
    """A page without the buttons any session has: filters (GET forms),
    the auto-refresh toggle, sign-out."""
    page = re.sub(r'<form method="get".*?</form>', "", page, flags=re.S)
    page = page.replace('<button type="button" id="refresh-toggle"', "")
    return page.replace('<button type="submit">Sign out</button>', "")


async def test_the_readonly_token_sees_every_page_without_an_action(
    board: Dashboard, service: Service, clock: Clock, db: SqliteD1
) -> None:
    (failed,) = await fail_some(service, 1)
    ready = (await service.dispatch("mail", {"name": "echo", "payload": 1}))["id"]
    running = (await service.dispatch("held", {"name": "echo", "payload": 2}))["id"]
    await service.queue.reserve_batch("held", 1)
    await service.put_schedule({"id": "nightly", "cron": "0 3 * * *", "name": "echo"})
    admin = await signed_in(board, clock, TOKEN)
    viewer = await signed_in(board, clock, READONLY)
    for path in (
        "/ui",
        "/ui/queues/mail",
        f"/ui/jobs/{failed}",
        f"/ui/jobs/{ready}",
        f"/ui/jobs/{running}",
        "/ui/running",
        "/ui/failed",
        "/ui/schedules",
        "/ui/schedules/nightly",
    ):
        seen = await viewer.get(path)
        assert seen.status == 200, path
        assert "Read-only" in seen.body
        assert not ACTIONS.search(seen.body), path
        assert "<button" not in _without_reads(seen.body), path
        # The same page for the API token's session has its actions.
        full = await admin.get(path)
        assert "Read-only" not in full.body
        assert ACTIONS.search(full.body), path
    assert failed in (await viewer.get("/ui/failed")).body


async def test_every_action_of_a_readonly_session_is_refused_and_writes_nothing(
    board: Dashboard, service: Service, clock: Clock, db: SqliteD1
) -> None:
    (failed,) = await fail_some(service, 1)
    ready = (await service.dispatch("mail", {"name": "echo", "payload": 1}))["id"]
    await service.put_schedule({"id": "nightly", "cron": "0 3 * * *", "name": "echo"})
    viewer = await signed_in(board, clock, READONLY)
    csrf = viewer.csrf()  # its sign-out form's: a valid token, which does not help
    jobs_before = db.query("SELECT id, available_at FROM d1queue_jobs ORDER BY id")
    for path, form in (
        ("/ui/queues/mail/pause", {}),
        ("/ui/queues/mail/limits", {"concurrency": "1", "confirm": "yes"}),
        (f"/ui/jobs/{ready}/cancel", {}),
        (f"/ui/jobs/{ready}/run", {}),
        ("/ui/failed/bulk", {"action": "delete", "ids": failed, "confirm": "yes"}),
        ("/ui/failed/bulk", {"action": "retry", "ids": failed, "confirm": "yes"}),
        ("/ui/schedules/nightly/pause", {}),
        ("/ui/schedules/nightly/run", {"run": "0" * 32}),
        ("/ui/schedules/nightly/edit", {"cron": "* * * * *", "tz": "UTC", "payload": "1"}),
    ):
        reply = await viewer.post(path, {"csrf": csrf, **form})
        assert reply.status == 403, path
        assert "read-only token" in reply.body
    assert not paused(db, "mail")
    assert db.query("SELECT id FROM d1queue_failed_jobs")[0]["id"] == failed
    assert db.query("SELECT id, available_at FROM d1queue_jobs ORDER BY id") == jobs_before
    assert (await service.schedule("nightly"))["paused"] is False
    assert (await service.schedule("nightly"))["cron"] == "0 3 * * *"
    # Signing in again with the API token gives a session that may act.
    switched = Browser(viewer.board, viewer.clock)
    switched.cookie = viewer.cookie
    reply = await switched.post("/ui/signin", {"token": TOKEN, "next": "/ui"})
    assert reply.status == 303 and switched.cookie != viewer.cookie
    assert "Read-only" not in (await switched.get("/ui")).body
    # Signing out is the other thing it may do.
    assert (await viewer.post("/ui/signout", {"csrf": csrf})).status == 303
    assert (await viewer.get("/ui")).status == 303


async def test_a_readonly_session_cannot_pass_for_the_api_tokens() -> None:
    s = Sessions(TOKEN, READONLY)
    full = s.verify(s.issue(1000), 1001)
    viewer = s.verify(s.issue(1000, "readonly"), 1001)
    assert full is not None and not full.readonly
    assert viewer is not None and viewer.readonly
    assert s.check_token(TOKEN) == "full" and s.check_token(READONLY) == "readonly"
    assert s.check_token("neither") is None
    # Without the read-only token configured its sessions are refused.
    assert Sessions(TOKEN).verify(s.issue(1000, "readonly"), 1001) is None
    assert Sessions(TOKEN).check_token(READONLY) is None
    # Its CSRF tokens are its own.
    assert s.csrf(viewer) != s.csrf(replace(viewer, readonly=False))


async def test_the_api_reads_with_the_readonly_token_and_refuses_its_writes(
    db: SqliteD1, queue: D1Queue
) -> None:
    api = Api(Service(queue, registry()), TOKEN, "9.9", SPEC, readonly_token=READONLY)
    full = {"authorization": f"Bearer {TOKEN}"}
    ro = {"authorization": f"Bearer {READONLY}"}
    pushed = await api.handle(
        "POST", "https://q.example/v1/queues/mail/jobs", full, b'{"name": "echo"}'
    )
    assert pushed.status == 201
    id = pushed.body["id"]
    for path in ("/v1/queues", "/v1/queues/mail", f"/v1/jobs/{id}", "/v1/metrics", "/v1/failed"):
        assert (await api.handle("GET", f"https://q.example{path}", ro, b"")).status == 200, path
    rows = db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"]
    for method, path, body in (
        ("POST", "/v1/queues/mail/jobs", b'{"name": "echo"}'),
        ("POST", "/v1/queues/mail/pause", b""),
        ("DELETE", f"/v1/jobs/{id}", b""),
        ("DELETE", "/v1/queues/mail/jobs", b""),
        ("PUT", "/v1/queues/mail/limits", b"{}"),
        ("POST", "/v1/schedules", b'{"cron": "* * * * *", "name": "echo"}'),
    ):
        reply = await api.handle(method, f"https://q.example{path}", ro, body)
        assert (reply.status, reply.body["error"]["code"]) == (403, "read_only"), path
        assert not api.authorized(ro, method)
    assert api.authorized(ro, "GET") and api.authorized(full, "POST")
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == rows
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_queues WHERE paused = 1")[0]["n"] == 0
    # A wrong token is still a 401, and the read-only token is no API token
    # where none is configured for it.
    wrong = {"authorization": "Bearer nope"}
    assert (await api.handle("GET", "https://q.example/v1/queues", wrong, b"")).status == 401
    plain = Api(Service(queue, registry()), TOKEN, "9.9", SPEC)
    assert (await plain.handle("GET", "https://q.example/v1/queues", ro, b"")).status == 401


def test_openapi_states_the_403_of_every_write() -> None:
    for path, item in SPEC["paths"].items():
        for method, op in item.items():
            if method in ("parameters",) or path == "/health":
                continue
            refused = "403" in op["responses"]
            assert refused == (method != "get"), (method, path)
    assert "read_only" in json.dumps(SPEC["components"]["responses"]["E403"])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"D1QUEUE_READONLY_TOKEN": "short"}, "D1QUEUE_READONLY_TOKEN must be at least 32"),
        ({"D1QUEUE_READONLY_TOKEN": LONG_TOKEN[::-1]}, "set without D1QUEUE_TOKEN"),
        (
            {"D1QUEUE_TOKEN": LONG_TOKEN, "D1QUEUE_READONLY_TOKEN": LONG_TOKEN},
            "must differ from D1QUEUE_TOKEN",
        ),
    ],
)
def test_the_readonly_token_is_checked_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Config.from_vars(env)
    # The error names the secret, never its value.
    assert env["D1QUEUE_READONLY_TOKEN"] not in str(caught.value)


def test_a_good_readonly_token_is_a_secret_not_a_setting() -> None:
    Config.from_vars({"D1QUEUE_TOKEN": LONG_TOKEN, "D1QUEUE_READONLY_TOKEN": LONG_TOKEN[::-1]})
