"""The one routing rule (router.py), on the router itself and on both surfaces
that route through it: a GET route answers HEAD without a body; OPTIONS on a
served path is 204 with `allow`; a served path asked with another method is
405 with the same `allow`; no route is 404. The API answers its errors in
JSON, the dashboard in HTML, around the same status and `allow`."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import D1Queue
from d1queue.interfaces.api import ROUTES, Api
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.dashboard.assets import CSS_PATH
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.router import Reply, Route, Router
from d1queue.interfaces.service import Service

from .conftest import Clock
from .test_api import AUTH
from .test_api import TOKEN as API_TOKEN
from .test_api import registry as api_registry
from .test_dashboard import TOKEN as BOARD_TOKEN
from .test_dashboard import Browser
from .test_dashboard import registry as board_registry


async def _noop(*_: Any, **__: Any) -> None: ...


ROUTER = Router(
    (
        Route("GET", "/a", _noop),
        Route("DELETE", "/a", _noop),
        Route("POST", "/a/{id}/go", _noop),
        Route("GET", "/static", _noop, public=True),
    )
)


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/a", 200, "OPTIONS, GET, DELETE, HEAD"),
        ("HEAD", "/a", 200, "OPTIONS, GET, DELETE, HEAD"),
        ("DELETE", "/a", 200, "OPTIONS, GET, DELETE, HEAD"),
        ("OPTIONS", "/a", 204, "OPTIONS, GET, DELETE, HEAD"),
        ("PUT", "/a", 405, "OPTIONS, GET, DELETE, HEAD"),
        ("POST", "/a/x%2Fy/go", 200, "OPTIONS, POST"),
        ("HEAD", "/a/x/go", 405, "OPTIONS, POST"),
        ("OPTIONS", "/a/x/go", 204, "OPTIONS, POST"),
        ("GET", "/a//go", 404, "OPTIONS"),
        ("GET", "/a/", 404, "OPTIONS"),
        ("OPTIONS", "/nowhere", 404, "OPTIONS"),
    ],
)
def test_the_rule(method: str, path: str, status: int, allow: str) -> None:
    found = ROUTER.resolve(method, path)
    assert (found.status, found.allow) == (status, allow)
    assert (found.route is not None) == (status == 200)


def test_path_values_are_decoded_and_public_is_the_paths() -> None:
    found = ROUTER.resolve("POST", "/a/x%2Fy/go")
    assert found.args == ("x/y",) and not found.public
    assert ROUTER.resolve("POST", "/static").public, "a 405 on a public path is public"
    assert not ROUTER.resolve("PUT", "/a").public


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/a", 200),
        ("/a/x%2Fy/go", 200),
        ("/a/x%3Ay/go", 200),
        ("/a/x%2fy/go", 404),  # the escape in lower case
        ("/a/x:y/go", 404),  # `:` unescaped: the links escape it
        ("/a/%78/go", 404),  # a letter escaped
        ("/a/x;y/go", 404),
        ("/a/", 404),
        ("/a;x", 404),
        ("/A", 404),
        ("/%61", 404),
    ],
)
def test_a_canonical_router_serves_a_path_at_one_spelling(path: str, status: int) -> None:
    canonical = Router(ROUTER.routes, canonical=True)
    assert canonical.resolve("POST" if "go" in path else "GET", path).status == status
    assert canonical.resolve("OPTIONS", path).status == (204 if status == 200 else 404)


SIGN_IN_SPELLINGS = [
    "/ui/signin/",
    "/ui/signin;x",
    "/ui/signin//",
    "/ui//signin",
    "/ui/signin%2F",
    "/ui/%73ignin",
    "/ui/signi%6E",
    "/%75i/signin",
    "/UI/signin",
    "/ui/SignIn",
]
"""Other spellings of /ui/signin: a rule in front of the Worker matching the
path /ui/signin exactly does not see them."""


@pytest.mark.parametrize("prefix", ["", "/queue"])
async def test_sign_in_answers_at_its_one_path_only(
    queue: D1Queue, clock: Clock, prefix: str
) -> None:
    board = Dashboard(Service(queue, board_registry()), BOARD_TOKEN, prefix=prefix)
    browser = Browser(board, clock)
    for path in SIGN_IN_SPELLINGS:
        posted = await browser.post(prefix + path, {"token": BOARD_TOKEN, "next": "/ui"})
        assert posted.status == 404 and "set-cookie" not in posted.headers, path
        assert f"There is no page at {path}" in posted.body
        assert (await browser.get(prefix + path)).status == 404, path
        assert (await browser.request("OPTIONS", prefix + path)).status == 404, path
    signed = await browser.post(prefix + "/ui/signin", {"token": BOARD_TOKEN, "next": "/ui"})
    assert signed.status == 303 and "set-cookie" in signed.headers
    for page in ("/ui", "/ui/queues/mail", "/ui/failed"):
        assert (await browser.get(prefix + page)).status == 200
        assert (await browser.get(prefix + page + "/")).status == 404
    assert (await browser.get(prefix + "/ui/queues/%6Dail")).status == 404


def test_every_spelling_of_ui_is_the_dashboards_to_refuse() -> None:
    """The Worker hands these to the dashboard, whose router answers 404
    for any but /ui's own spelling; the API would answer 401 first."""
    from d1queue.interfaces.dashboard import is_dashboard_path

    for path in ("/ui", "/ui/signin", "/UI/signin", "/%75i/signin", "/ui;x/signin", "//ui/signin"):
        assert is_dashboard_path(path), path
    for path in ("/ui%2Fsignin", "/Ui", "/ui\\signin"):
        assert is_dashboard_path(path), path
    for path in ("/", "/uiadmin", "/v1/ui", "/health", "/u", "/ui-x"):
        assert not is_dashboard_path(path), path


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS"])
def test_no_route_declares_what_the_router_answers(method: str) -> None:
    with pytest.raises(ValueError, match="router"):
        Route(method, "/x", _noop)


# -- the API ------------------------------------------------------------------


@pytest.fixture
def api(queue: D1Queue) -> Api:
    return Api(Service(queue, api_registry()), API_TOKEN, "1", SPEC)


async def _api(api: Api, method: str, path: str, headers: dict[str, str]) -> Reply:
    return await api.handle(method, f"https://q.example{path}", headers, b"")


async def test_api_head_is_get_without_a_body(api: Api) -> None:
    for path, headers in [("/v1/queues", AUTH), ("/health", {}), ("/v1/nope", AUTH)]:
        get = await _api(api, "GET", path, headers)
        head = await _api(api, "HEAD", path, headers)
        assert get.body is not None and head.body is None
        assert (head.status, head.headers) == (get.status, get.headers)
    assert (await _api(api, "HEAD", "/health", {})).headers["content-type"] == "application/json"


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
async def test_api_options_and_405_state_the_same_allow(api: Api, route: Route) -> None:
    path = route.path.replace("{queue}", "q").replace("{id}", "0123")
    options = await _api(api, "OPTIONS", path, {})
    assert options.status == 204 and options.body is None
    allow = options.headers["allow"]
    assert route.method in allow.split(", ")
    refused = await _api(api, "PATCH", path, AUTH)
    assert refused.status == 405 and refused.headers["allow"] == allow
    assert refused.body["error"]["code"] == "method_not_allowed"
    assert refused.body["error"]["message"] == f"{path} accepts {allow.removeprefix('OPTIONS, ')}"


async def test_api_health_is_public_and_follows_the_rule(api: Api) -> None:
    refused = await _api(api, "POST", "/health", {})  # no token: /health is public
    assert refused.status == 405 and refused.headers["allow"] == "OPTIONS, GET, HEAD"
    assert refused.body["error"]["message"] == "/health accepts GET, HEAD"
    assert (await _api(api, "GET", "/health?probe=1", {})).status == 200


async def test_api_404_and_405_come_after_the_token(api: Api) -> None:
    assert (await _api(api, "GET", "/v1/nope", {})).status == 401
    assert (await _api(api, "PUT", "/v1/queues", {})).status == 401
    assert (await _api(api, "OPTIONS", "/v1/nope", {})).status == 401
    assert (await _api(api, "OPTIONS", "/v1/nope", AUTH)).status == 404


# -- the dashboard ------------------------------------------------------------


@pytest.fixture
def board(queue: D1Queue) -> Dashboard:
    return Dashboard(Service(queue, board_registry()), BOARD_TOKEN)


async def test_dashboard_head_is_get_without_a_body(board: Dashboard, clock: Clock) -> None:
    browser = Browser(board, clock)
    await browser.sign_in()
    for path in ["/ui", "/ui/failed", "/ui/nope", CSS_PATH]:
        get = await browser.get(path)
        head = await browser.request("HEAD", path)
        assert get.body and head.body is None, path
        assert (head.status, head.headers) == (get.status, get.headers), path
    signed_out = await Browser(board, clock).request("HEAD", "/ui/failed")
    assert signed_out.status == 303 and signed_out.body is None


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/ui", "OPTIONS, GET, HEAD"),
        ("/ui/signin", "OPTIONS, GET, POST, HEAD"),
        ("/ui/failed/bulk", "OPTIONS, POST"),
        ("/ui/jobs/abc", "OPTIONS, GET, HEAD"),
        ("/ui/jobs/abc/cancel", "OPTIONS, POST"),
        (CSS_PATH, "OPTIONS, GET, HEAD"),
    ],
)
async def test_dashboard_options_and_405_state_the_same_allow(
    board: Dashboard, clock: Clock, path: str, allow: str
) -> None:
    browser = Browser(board, clock)  # signed out: asking needs no session
    options = await browser.request("OPTIONS", path)
    assert (options.status, options.body, options.headers["allow"]) == (204, None, allow)
    assert "content-type" not in options.headers
    assert options.headers["cache-control"] == "no-store"
    refused = await browser.request("PUT", path)
    assert refused.status == 405 and refused.headers["allow"] == allow
    assert refused.headers["content-type"].startswith("text/html")
    assert f"{path} accepts {allow.removeprefix('OPTIONS, ')}" in refused.body
    if "HEAD" not in allow:
        assert (await browser.request("HEAD", path)).status == 405


async def test_dashboard_404_is_a_page(board: Dashboard, clock: Clock) -> None:
    browser = Browser(board, clock)
    for method in ("GET", "POST", "OPTIONS"):
        reply = await browser.request(method, "/ui/nope")
        assert reply.status == 404 and "There is no page at /ui/nope" in reply.body
        assert "allow" not in reply.headers


async def test_dashboard_not_configured(queue: D1Queue, clock: Clock) -> None:
    browser = Browser(Dashboard(Service(queue, board_registry()), None), clock)
    assert (await browser.get("/ui/signin")).status == 503
    assert (await browser.get("/ui/nope")).status == 503
    assert (await browser.request("PUT", "/ui")).status == 503
    assert (await browser.get(CSS_PATH)).status == 200, "assets are public"
    assert (await browser.request("POST", CSS_PATH)).status == 405
    assert (await browser.request("OPTIONS", "/ui")).status == 204
