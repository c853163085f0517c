"""The dashboard under CPython, against SqliteD1: sessions and CSRF, what a
page shows, what its forms change, and what they refuse (writing nothing).
The same pages in a real browser: tests/runtime/test_dashboard_browser.py."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlencode

import pytest

from d1queue import Config, D1Queue, JobContext, Registry, drain
from d1queue.core.bounds import SIGNOUT_PRUNE
from d1queue.core.errors import Fail
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.dashboard.app import CSP
from d1queue.interfaces.dashboard.mask import MASK, SECRET_KEY, mask
from d1queue.interfaces.dashboard.session import SESSION_S, Sessions, set_cookie
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql

from .contract import Clock

TOKEN = "dashboard-test-token"


def registry() -> Registry:
    reg = Registry()

    @reg.job("echo")
    async def echo(payload: Any) -> None: ...

    @reg.job("boom", max_attempts=1)
    async def boom(payload: Any) -> None:
        raise Fail(f"<b>bad</b> input {payload}")

    return reg


class Browser:
    """Drives Dashboard.handle as a browser would: keeps the session cookie,
    reads the CSRF token from the last page, follows nothing by itself."""

    def __init__(self, board: Dashboard, clock: Clock, host: str = "127.0.0.1:8787") -> None:
        self.board, self.clock, self.host = board, clock, host
        self.cookie = ""
        self.last = ""
        self.token = ""

    async def request(
        self, method: str, path: str, form: dict[str, Any] | None = None, **headers: str
    ) -> Any:
        body = urlencode(form or {}, doseq=True).encode()
        sent = {"host": self.host, "cookie": self.cookie, **headers}
        reply = await self.board.handle(
            method,
            f"http://{self.host}{path}",
            sent,
            body if method == "POST" else b"",
            self.clock(),
        )
        cookie = reply.headers.get("set-cookie", "")
        if cookie:
            self.cookie = cookie.split(";", 1)[0]
        self.last = reply.body
        return reply

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def post(self, path: str, form: dict[str, Any] | None = None, **headers: str) -> Any:
        return await self.request("POST", path, form, **headers)

    def csrf(self) -> str:
        """The CSRF token of the last page that carried one (one per session)."""
        m = re.search(r'name="csrf" value="([^"]+)"', self.last)
        if m:
            self.token = m.group(1)
        assert self.token, "no page carried a CSRF token"
        return self.token

    async def sign_in(self) -> None:
        reply = await self.post("/ui/signin", {"token": TOKEN, "next": "/ui"})
        assert reply.status == 303 and reply.headers["location"] == "/ui"
        await self.get("/ui")


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    return Service(D1Queue(db, clock=clock), registry())


@pytest.fixture
def board(service: Service) -> Dashboard:
    return Dashboard(service, TOKEN)


@pytest.fixture
async def browser(board: Dashboard, clock: Clock) -> Browser:
    b = Browser(board, clock)
    await b.sign_in()
    return b


def paused(db: SqliteD1, queue: str) -> bool:
    rows = db.query("SELECT paused FROM d1queue_queues WHERE name = ?1", queue)
    return bool(rows and rows[0]["paused"])


def failed_ids(db: SqliteD1) -> set[str]:
    return {r["id"] for r in db.query("SELECT id FROM d1queue_failed_jobs")}


async def fail_some(service: Service, n: int, queue: str = "mail") -> list[str]:
    ids = [(await service.dispatch(queue, {"name": "boom", "payload": i}))["id"] for i in range(n)]
    await drain(service.queue, service.registry, Config(queues=(queue,)))
    return ids


# -- signing in ---------------------------------------------------------------


PAGES = ["/ui", "/ui/queues/mail", "/ui/jobs/abc", "/ui/failed", "/ui/schedules"]


@pytest.mark.parametrize("path", PAGES)
async def test_nothing_is_readable_signed_out(board: Dashboard, clock: Clock, path: str) -> None:
    reply = await Browser(board, clock).get(path)
    assert reply.status == 303
    assert reply.headers["location"] == "/ui/signin?" + urlencode({"next": path})


async def test_a_wrong_token_is_refused_and_sets_no_cookie(board: Dashboard, clock: Clock) -> None:
    b = Browser(board, clock)
    reply = await b.post("/ui/signin", {"token": "not-it"})
    assert reply.status == 401
    assert "set-cookie" not in reply.headers
    assert "not this Worker&#x27;s API token" in reply.body
    assert (await b.get("/ui")).status == 303


async def test_the_session_cookie_is_httponly_strict_and_expires(
    board: Dashboard, clock: Clock
) -> None:
    local = await Browser(board, clock).post("/ui/signin", {"token": TOKEN})
    cookie = local.headers["set-cookie"]
    assert cookie.startswith("d1queue_session=v1.")
    assert {"HttpOnly", "SameSite=Strict", f"Max-Age={SESSION_S}", "Path=/"} <= set(
        cookie.split("; ")
    )
    assert "Secure" not in cookie  # plain HTTP on 127.0.0.1: a Secure cookie would be dropped
    remote = await Browser(board, clock, host="queue.example.com").post(
        "/ui/signin", {"token": TOKEN}
    )
    cookie = remote.headers["set-cookie"]
    assert cookie.startswith("__Host-d1queue_session=v1.") and "; Secure" in cookie


async def test_a_session_expires(browser: Browser, clock: Clock) -> None:
    assert (await browser.get("/ui")).status == 200
    clock.advance(SESSION_S - 1)
    assert (await browser.get("/ui")).status == 200
    clock.advance(2)
    assert (await browser.get("/ui")).status == 303


async def test_a_forged_or_foreign_session_is_refused(browser: Browser, clock: Clock) -> None:
    name, value = browser.cookie.split("=", 1)
    body, mac = value.rsplit(".", 1)
    later = re.sub(r"^v1\.(\d+)", lambda m: f"v1.{int(m.group(1)) + 10**9}", body)
    for forged in (
        f"{later}.{mac}",  # a longer life, same MAC
        f"{body}.{mac[:-2]}AA",  # a MAC altered
        Sessions("another-token").issue(clock()),  # signed with another token
        "",
        "garbage",
    ):
        browser.cookie = f"{name}={forged}"
        assert (await browser.get("/ui")).status == 303, forged


def test_sessions_sign_and_check() -> None:
    s = Sessions("t")
    value = s.issue(1000)
    session = s.verify(value, 1001)
    assert session is not None and session.expires_ms == 1000 + SESSION_S * 1000
    assert s.verify(value, 1000 + SESSION_S * 1000) is None
    assert Sessions("u").verify(value, 1001) is None
    other = s.verify(s.issue(1000), 1001)
    assert other is not None and s.csrf(session) != s.csrf(other)
    assert s.check_csrf(session, s.csrf(session))
    assert not s.check_csrf(session, s.csrf(other))
    assert not s.check_csrf(session, None)
    assert s.check_token("t") and not s.check_token("T")
    assert set_cookie("", secure=True, max_age_s=0).endswith(
        "Max-Age=0; HttpOnly; SameSite=Strict; Secure"
    )


async def test_sign_out_clears_the_cookie(browser: Browser) -> None:
    reply = await browser.post("/ui/signout", {"csrf": browser.csrf()})
    assert reply.status == 303 and "Max-Age=0" in reply.headers["set-cookie"]
    assert (await browser.get("/ui")).status == 303


async def test_a_session_signed_out_is_refused_when_replayed(
    browser: Browser, board: Dashboard, clock: Clock, db: SqliteD1
) -> None:
    """A cookie copied before sign-out opens nothing after it: the session is
    revoked in D1, not only cleared in the browser that signed out."""
    other = Browser(board, clock)
    await other.sign_in()
    copied = browser.cookie
    csrf = browser.csrf()
    reply = await browser.post("/ui/signout", {"csrf": csrf})
    assert reply.status == 303 and reply.headers["location"] == "/ui/signin"
    browser.cookie = copied  # the replay
    reply = await browser.get("/ui")
    assert reply.status == 303 and reply.headers["location"].startswith("/ui/signin")
    reply = await browser.post("/ui/queues/mail/pause", {"csrf": csrf})
    assert reply.status == 401 and not paused(db, "mail")
    reply = await browser.post("/ui/signout", {"csrf": csrf})
    assert reply.status == 401, "signing out again needs a live session"
    assert (await browser.get("/ui/signin?next=/ui")).status == 200, "the sign-in form, not /ui"
    assert (await other.get("/ui")).status == 200, "another session is not ended"
    (row,) = db.query("SELECT nonce, expires_at FROM d1queue_signouts")
    assert row["nonce"] in copied and row["expires_at"] == clock() + SESSION_S * 1000


async def test_signing_out_is_safe_to_resend_and_prunes_expired_rows(
    board: Dashboard, clock: Clock, db: SqliteD1, service: Service
) -> None:
    """A sign-out re-sent after a lost reply writes nothing more, and each
    sign-out deletes at most SIGNOUT_PRUNE expired rows: the table holds
    sign-outs of live sessions and a bounded backlog, never more."""
    store = board.store
    await store.sign_out("n" * 24, clock() + 1000, clock())
    await store.sign_out("n" * 24, clock() + 1000, clock())  # the re-send
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_signouts")[0]["n"] == 1
    for i in range(SIGNOUT_PRUNE + 3):
        await store.sign_out(f"{i:024d}", clock() + 1000, clock())
    clock.advance(2)
    before = db.query("SELECT COUNT(*) AS n FROM d1queue_signouts")[0]["n"]
    await store.sign_out("live" * 6, clock() + 1000, clock())
    after = db.query("SELECT COUNT(*) AS n FROM d1queue_signouts")[0]["n"]
    assert after == before + 1 - SIGNOUT_PRUNE
    assert await store.signed_out(["live" * 6, "n" * 24, "never" * 5]) == {"live" * 6, "n" * 24}


def test_sign_out_statements_seek_and_never_scan(db: SqliteD1) -> None:
    for statement, args, index in (
        (sql.SIGNED_OUT, ('["a", "b"]',), "USING PRIMARY KEY (nonce=?)"),
        (sql.PRUNE_SIGNOUTS, (1, SIGNOUT_PRUNE), "INDEX d1queue_signouts_expiry (expires_at<?)"),
    ):
        plan = [str(r["detail"]) for r in db.query("EXPLAIN QUERY PLAN " + statement, *args)]
        assert any(index in line for line in plan), plan
        assert not any(line.startswith("SCAN d1queue_signouts") for line in plan), plan


async def test_a_session_costs_one_read_and_signing_out_one_batch(
    browser: Browser, service: Service
) -> None:
    usage = service.queue.binding.usage
    csrf = browser.csrf()
    before = usage.queries
    await browser.get("/ui/signin?next=/ui")  # signed in: a redirect, no other D1 work
    assert usage.queries == before + 1, "one point read of the revoked sessions"
    cookie, browser.cookie = browser.cookie, ""
    before = usage.queries
    await browser.get("/ui/signin?next=/ui")
    assert usage.queries == before, "no session, no read"
    browser.cookie = cookie
    before = usage.queries
    await browser.post("/ui/signout", {"csrf": csrf})
    assert usage.queries == before + 2, "the session's read, then one batch"


async def test_rotating_the_token_still_ends_every_session(
    browser: Browser, service: Service
) -> None:
    rotated = Browser(Dashboard(service, "a-new-token"), browser.clock)
    rotated.cookie = browser.cookie
    assert (await rotated.get("/ui")).status == 303


async def test_sign_in_returns_only_to_a_dashboard_page(board: Dashboard, clock: Clock) -> None:
    for target, expected in (
        ("/ui/failed?queue=mail", "/ui/failed?queue=mail"),
        ("https://evil.example/ui", "/ui"),
        ("//evil.example/ui", "/ui"),
        ("/ui//evil.example", "/ui"),
        ("/v1/queues", "/ui"),
    ):
        reply = await Browser(board, clock).post("/ui/signin", {"token": TOKEN, "next": target})
        assert reply.headers["location"] == expected, target


CONTROLS = [chr(c) for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))]
"""Every control character: C0, DEL and C1."""


@pytest.mark.parametrize("char", CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
async def test_a_control_character_in_next_is_a_400(
    board: Dashboard, clock: Clock, char: str
) -> None:
    """In a Location header a CR or LF would split the header (the Worker's
    runtime throws: a 500); no control character belongs in a path."""
    target = f"/ui{char}x"
    b = Browser(board, clock)
    page = await b.get("/ui/signin?" + urlencode({"next": target}))
    assert page.status == 400 and 'role="alert"' in page.body
    assert "control character" in page.body
    reply = await b.post("/ui/signin", {"token": TOKEN, "next": target})
    assert reply.status == 400 and "location" not in reply.headers
    assert "set-cookie" not in reply.headers, "refused before signing in"
    await b.sign_in()
    page = await b.get("/ui/signin?" + urlencode({"next": target}))
    assert page.status == 400 and "location" not in page.headers


@pytest.mark.parametrize("char", CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
async def test_a_control_character_in_back_is_a_400_and_changes_nothing(
    browser: Browser, service: Service, db: SqliteD1, char: str
) -> None:
    await service.put_schedule({"id": "digest", "cron": "0 6 * * *", "name": "echo"})
    ids = await fail_some(service, 1)
    csrf = browser.csrf()
    back = f"/ui{char}x"
    for path, form in (
        ("/ui/queues/mail/pause", {}),
        ("/ui/schedules/digest/pause", {}),
        ("/ui/failed/bulk", {"action": "delete", "ids": ids, "confirm": "yes"}),
        ("/ui/failed/bulk", {"action": "delete", "ids": ids}),
    ):
        reply = await browser.post(path, {"csrf": csrf, "back": back, **form})
        assert reply.status == 400 and "location" not in reply.headers, path
        assert "control character" in reply.body
    assert not paused(db, "mail") and failed_ids(db) == set(ids)
    assert (await service.schedule("digest"))["paused"] is False


async def test_next_outside_ascii_is_sent_percent_encoded(board: Dashboard, clock: Clock) -> None:
    """A Location header carries bytes, not text: a character past ASCII
    goes percent-encoded, as a browser would send it."""
    reply = await Browser(board, clock).post(
        "/ui/signin", {"token": TOKEN, "next": "/ui/failed?error=d\u00e9j\u00e0 \u2028vu"}
    )
    assert reply.status == 303
    assert reply.headers["location"] == "/ui/failed?error=d%C3%A9j%C3%A0 %E2%80%A8vu"
    assert reply.headers["location"].isascii()


# -- CSRF and origin ------------------------------------------------------------


async def test_a_state_change_without_its_csrf_token_is_refused(
    browser: Browser, db: SqliteD1, board: Dashboard, clock: Clock
) -> None:
    other = Browser(board, clock)
    await other.sign_in()
    for form in ({}, {"csrf": ""}, {"csrf": "x" * 43}, {"csrf": other.csrf()}):
        reply = await browser.post("/ui/queues/mail/pause", form)
        assert reply.status == 403, form
        assert "security token" in reply.body
        assert not paused(db, "mail")
    reply = await browser.post("/ui/queues/mail/pause", {"csrf": browser.csrf()})
    assert reply.status == 303 and paused(db, "mail")


async def test_a_form_from_another_origin_is_refused(browser: Browser, db: SqliteD1) -> None:
    csrf = browser.csrf()
    for headers in ({"origin": "https://evil.example"}, {"sec-fetch-site": "cross-site"}):
        reply = await browser.post("/ui/queues/mail/pause", {"csrf": csrf}, **headers)
        assert reply.status == 403 and not paused(db, "mail"), headers
    reply = await browser.post(
        "/ui/queues/mail/pause",
        {"csrf": csrf},
        origin="http://127.0.0.1:8787",
        **{"sec-fetch-site": "same-origin"},
    )
    assert reply.status == 303 and paused(db, "mail")


async def test_an_action_signed_out_is_refused_and_writes_nothing(
    board: Dashboard, clock: Clock, db: SqliteD1, service: Service
) -> None:
    ids = await fail_some(service, 1)
    b = Browser(board, clock)
    for path, form in (
        ("/ui/queues/mail/pause", {}),
        ("/ui/failed/bulk", {"action": "delete", "ids": ids, "confirm": "yes"}),
    ):
        reply = await b.post(path, form)
        assert reply.status == 401, path
    assert not paused(db, "mail") and failed_ids(db) == set(ids)


# -- the headers every page carries -------------------------------------------------


@pytest.mark.parametrize("path", ["/ui", "/ui/failed", "/ui/queues/mail", "/ui/schedules"])
async def test_pages_carry_a_strict_csp_and_no_inline_code(browser: Browser, path: str) -> None:
    reply = await browser.get(path)
    assert reply.status == 200
    assert reply.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
    assert reply.headers["cache-control"] == "no-store"
    assert reply.headers["x-frame-options"] == "DENY"
    assert not re.search(r"<script(?![^>]*\bsrc=)", reply.body), "inline script"
    assert " style=" not in reply.body and "<style" not in reply.body
    assert " on" not in re.sub(r'"[^"]*"', "", reply.body).lower().replace(" one", "")


async def test_assets_are_served_by_the_worker(browser: Browser) -> None:
    page = (await browser.get("/ui")).body
    for path in re.findall(r'(?:href|src)="(/ui/static/[^"]+)"', page):
        reply = await browser.get(path)
        assert reply.status == 200 and reply.headers["content-type"].startswith(("text/", "image/"))
        assert "immutable" in reply.headers["cache-control"]
    assert len(re.findall(r"/ui/static/", page)) == 3
    assert "http://" not in page.split("<main")[0] and "https://" not in page


# -- pages ---------------------------------------------------------------------------


async def test_the_overview_counts_queues_and_empty_state(
    browser: Browser, service: Service, clock: Clock
) -> None:
    body = (await browser.get("/ui")).body
    assert "No queues yet." in body and "/v1/queues/default/jobs" in body
    for i in range(3):
        await service.dispatch("mail", {"name": "echo", "payload": i})
    await service.dispatch("mail", {"name": "echo", "payload": 9, "delay_s": 600})
    clock.advance(90)
    body = (await browser.get("/ui")).body
    row = re.search(r'<tr><th scope="row"><a href="/ui/queues/mail">mail</a></th>(.*?)</tr>', body)
    assert row, body
    cells = re.findall(r"<td class=\"num[^\"]*\">(\d+)</td>", row.group(1))
    assert cells[:3] == ["3", "1", "0"]  # ready, delayed, reserved
    assert "1 min" in row.group(1)  # the oldest ready job's age
    assert ">Pause</button>" in row.group(1) and "Running" in row.group(1)


async def test_pause_and_resume_from_the_overview(browser: Browser, db: SqliteD1) -> None:
    reply = await browser.post("/ui/queues/mail/pause", {"csrf": browser.csrf(), "back": "/ui"})
    assert reply.headers["location"] == "/ui?notice=paused"
    body = (await browser.get(reply.headers["location"])).body
    assert paused(db, "mail") and ">Resume</button>" in body and "Queue paused" in body
    await browser.post("/ui/queues/mail/resume", {"csrf": browser.csrf(), "back": "/ui"})
    assert not paused(db, "mail")


async def test_the_queue_page_pages_and_filters(
    browser: Browser, service: Service, clock: Clock
) -> None:
    for i in range(55):
        await service.dispatch("mail", {"name": "echo", "payload": i})
    for i in range(3):
        await service.dispatch("mail", {"name": "boom", "payload": i, "delay_s": 60})
    body = (await browser.get("/ui/queues/mail")).body
    assert body.count('<a href="/ui/jobs/') == 50
    nxt = re.search(r'href="(/ui/queues/mail\?cursor=[^"]+)">Next page', body)
    assert nxt
    body = (await browser.get(nxt.group(1).replace("&amp;", "&"))).body
    assert body.count('<a href="/ui/jobs/') == 8 and "Next page" not in body
    body = (await browser.get("/ui/queues/mail?name=boom")).body
    assert body.count('<a href="/ui/jobs/') == 3 and "badge delayed" in body
    body = (await browser.get("/ui/queues/mail?state=delayed")).body
    assert body.count('<a href="/ui/jobs/') == 3
    body = (await browser.get("/ui/queues/mail?state=reserved")).body
    assert "No jobs match this filter." in body
    assert "holds no jobs" in (await browser.get("/ui/queues/empty")).body


@pytest.mark.parametrize(
    "path",
    [
        "/ui/queues/mail?state=done",
        "/ui/queues/mail?cursor=zzz",
        "/ui/queues/mail?limt=5",
        "/ui/queues/bad%20name",
        "/ui/failed?age=forever",
        "/ui/failed?cursor=not-a-cursor",
        "/ui/failed?queue=%3Cx%3E",
        "/ui/jobs/%3Cscript%3E",
    ],
)
async def test_bad_input_is_a_clear_400(browser: Browser, path: str) -> None:
    reply = await browser.get(path)
    assert reply.status == 400, reply.body
    assert 'role="alert"' in reply.body


async def test_the_job_page_shows_escapes_and_acts(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    payload = {"html": "<script>alert(1)</script>", "n": [1, 2]}
    job_id = (
        await service.dispatch("mail", {"name": "echo", "payload": payload, "delay_s": 3600})
    )["id"]
    body = (await browser.get(f"/ui/jobs/{job_id}")).body
    assert "<script>alert" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "&quot;n&quot;: [\n    1,\n    2\n  ]" in body  # pretty-printed
    assert "0 of 3" in body and "in 1 h 0 min" in body and "UTC)" in body
    reply = await browser.post(f"/ui/jobs/{job_id}/run", {"csrf": browser.csrf()})
    assert reply.status == 303
    assert (await service.job(job_id))["state"] == "ready"
    reply = await browser.post(f"/ui/jobs/{job_id}/run", {"csrf": browser.csrf()})
    assert "already_ready" in reply.headers["location"]
    reply = await browser.post(f"/ui/jobs/{job_id}/cancel", {"csrf": browser.csrf()})
    assert reply.status == 303
    assert db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"] == 0
    assert (await browser.get(f"/ui/jobs/{job_id}")).status == 404


SECRET_KEYS = [
    "authorization",
    "Authorization",
    "PROXY-AUTHORIZATION",
    "cookie",
    "Set-Cookie",
    "x-api-key",
    "X-Api-Key",
    "api_key",
    "apiKey",
    "apikey",
    "token",
    "access_token",
    "refreshToken",
    "X-Auth-Token",
    "x-csrf-token",
    "secret",
    "client_secret",
    "AWS_SECRET_ACCESS_KEY",
    "password",
    "db_password",
    "Passwd",
    "passphrase",
    "pwd",
    "pass",
    "auth",
    "credentials",
    "gcp-credential",
    "private_key",
    "privateKey",
]
PLAIN_KEYS = ["url", "method", "headers", "body", "content-type", "accept", "user", "username"]
PLAIN_KEYS += ["email", "to", "author", "compass", "n", "id", "name", "passenger", "oauth_provider"]


def test_the_secret_key_rule() -> None:
    for key in SECRET_KEYS:
        assert SECRET_KEY.search(key), key
    for key in PLAIN_KEYS:
        assert not SECRET_KEY.search(key), key


def test_masking_reaches_every_depth_and_hides_every_kind_of_value() -> None:
    payload = {
        "url": "https://api.example/x",
        "headers": {"Authorization": "Bearer sk-1", "accept": "text/plain"},
        "body": [{"deep": [{"client_secret": {"v": [1, 2]}}]}, {"password": 12345}],
        "token": None,
    }
    assert mask(payload) == {
        "url": "https://api.example/x",
        "headers": {"Authorization": MASK, "accept": "text/plain"},
        "body": [{"deep": [{"client_secret": MASK}]}, {"password": MASK}],
        "token": MASK,
    }
    assert payload["headers"]["Authorization"] == "Bearer sk-1", "the payload is not changed"
    assert mask("Bearer sk-1") == "Bearer sk-1" and mask([1, "a"]) == [1, "a"]
    assert set(MASK) == {"\u2022"}, "a fixed mask: no length, no prefix"


HTTP_PAYLOAD = {
    "url": "https://hooks.example/in",
    "method": "POST",
    "headers": {
        "Authorization": "Bearer live-auth-9f2c",
        "proxy-authorization": "Basic cHJveHktc2VjcmV0",
        "Cookie": "sid=cookie-4471",
        "set-cookie": "sid=set-cookie-8812",
        "X-API-Key": "live-api-key-3310",
        "content-type": "application/json",
    },
    "body": {"user": "ada", "login": {"Password": "hunter2-5521"}, "items": [{"apiToken": "t-77"}]},
}
SECRET_VALUES = [
    "live-auth-9f2c",
    "cHJveHktc2VjcmV0",
    "cookie-4471",
    "set-cookie-8812",
    "live-api-key-3310",
    "hunter2-5521",
    "t-77",
]


async def test_the_job_page_masks_secrets_and_the_api_does_not(
    browser: Browser, service: Service
) -> None:
    job_id = (
        await service.dispatch("mail", {"name": "echo", "payload": HTTP_PAYLOAD, "delay_s": 3600})
    )["id"]
    body = (await browser.get(f"/ui/jobs/{job_id}")).body
    for secret in SECRET_VALUES:
        assert secret not in body, secret
    assert body.count(f"&quot;{MASK}&quot;") == len(SECRET_VALUES)
    assert "application/json" in body and "&quot;ada&quot;" in body and "hooks.example" in body
    assert (await service.job(job_id))["payload"] == HTTP_PAYLOAD, "the API is not masked"


async def test_the_failed_job_page_masks_secrets(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    job_id = (await service.dispatch("mail", {"name": "boom", "payload": HTTP_PAYLOAD}))["id"]
    short = {"api_key": "early-key-5678"}  # quoted early enough to be in the list's excerpt
    other = (await service.dispatch("mail", {"name": "boom", "payload": short}))["id"]
    await drain(service.queue, service.registry, Config(queues=("mail",)))
    assert failed_ids(db) == {job_id, other}
    body = (await browser.get(f"/ui/jobs/{job_id}")).body
    assert "badge failed" in body
    error, payload = body.split("<h2>Payload</h2>", 1)
    for secret in SECRET_VALUES:
        assert secret not in payload, secret
    assert payload.count(f"&quot;{MASK}&quot;") == len(SECRET_VALUES)
    # boom's error quotes its payload: the payload's secrets are masked there too.
    assert "hooks.example" in error and MASK in error
    for secret in SECRET_VALUES:
        assert secret not in error, secret
    listing = (await browser.get("/ui/failed")).body
    assert "hooks.example" in listing and f"&#x27;api_key&#x27;: &#x27;{MASK}" in listing
    for secret in [*SECRET_VALUES, "early-key-5678"]:
        assert secret not in listing, secret
    assert (await service.job(job_id))["payload"] == HTTP_PAYLOAD, "the API is not masked"


async def test_failed_jobs_filter_and_bulk_retry_after_confirming(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    ids = await fail_some(service, 3)
    other = await fail_some(service, 1, queue="other")
    body = (await browser.get("/ui/failed")).body
    assert all(f'value="{i}"' in body for i in ids + other)
    assert "&lt;b&gt;bad&lt;/b&gt;" in body and "<b>bad" not in body
    assert ">Retry</button>" in body and ">Delete</button>" in body
    assert (await browser.get("/ui/failed?queue=other")).body.count('name="ids"') == 1
    assert (await browser.get("/ui/failed?error=INPUT+2")).body.count('name="ids"') == 1
    assert (await browser.get("/ui/failed?name=echo")).body.count('name="ids"') == 0
    assert (await browser.get("/ui/failed?age=1h")).body.count('name="ids"') == 4
    assert (await browser.get("/ui/failed?age=gt1d")).body.count('name="ids"') == 0
    clock.advance(2 * 86400)
    await browser.sign_in()  # the session has expired meanwhile
    assert (await browser.get("/ui/failed?age=gt1d")).body.count('name="ids"') == 4

    await browser.get("/ui/failed")
    form = {"csrf": browser.csrf(), "action": "retry", "ids": ids[:2], "back": "/ui/failed"}
    confirm = await browser.post("/ui/failed/bulk", form)
    assert confirm.status == 200 and "Put 2 failed jobs back" in confirm.body
    assert ">Retry 2 jobs</button>" in confirm.body
    assert failed_ids(db) == set(ids + other), "nothing is done before confirming"
    reply = await browser.post(
        "/ui/failed/bulk", {**form, "csrf": browser.csrf(), "confirm": "yes"}
    )
    assert reply.headers["location"] == "/ui/failed?notice=retried&n=2"
    assert failed_ids(db) == {ids[2], *other}
    assert {(await service.job(i))["state"] for i in ids[:2]} == {"ready"}

    form = {"csrf": browser.csrf(), "action": "delete", "ids": [ids[2], *other], "confirm": "yes"}
    reply = await browser.post("/ui/failed/bulk", form)
    assert "notice=removed&n=2" in reply.headers["location"]
    assert failed_ids(db) == set()
    body = (await browser.get("/ui/failed")).body
    assert "No failed jobs." in body


async def test_bulk_refuses_bad_input_and_writes_nothing(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    ids = await fail_some(service, 2)
    csrf = browser.csrf()
    for form in (
        {"action": "retry"},
        {"action": "explode", "ids": ids},
        {"action": "delete", "ids": [*ids, "<bad>"]},
        {"action": "delete", "ids": [f"{i:032x}" for i in range(51)]},
    ):
        reply = await browser.post("/ui/failed/bulk", {"csrf": csrf, "confirm": "yes", **form})
        assert reply.status == 400, form
    assert failed_ids(db) == set(ids)


async def test_the_schedules_page_lists_pauses_and_resumes(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    body = (await browser.get("/ui/schedules")).body
    assert "No schedules yet" in body, "the empty state says what to do"
    await service.put_schedule(
        {"id": "digest", "cron": "0 6 * * *", "name": "echo", "tz": "Europe/Berlin"}
    )
    body = (await browser.get("/ui/schedules")).body
    assert "digest" in body and "0 6 * * *" in body and "Europe/Berlin" in body
    assert ">Pause</button>" in body
    refused = await browser.post("/ui/schedules/digest/pause", {"back": "/ui/schedules"})
    assert refused.status == 403, "no CSRF token, no change"
    assert (await service.schedule("digest"))["paused"] is False
    reply = await browser.post(
        "/ui/schedules/digest/pause", {"csrf": browser.csrf(), "back": "/ui/schedules"}
    )
    assert reply.headers["location"] == "/ui/schedules?notice=schedule_paused"
    assert (await service.schedule("digest"))["paused"] is True
    body = (await browser.get(reply.headers["location"])).body
    assert ">Resume</button>" in body and "Schedule paused" in body
    await browser.post(
        "/ui/schedules/digest/resume", {"csrf": browser.csrf(), "back": "/ui/schedules"}
    )
    assert (await service.schedule("digest"))["paused"] is False
    missing = await browser.post(
        "/ui/schedules/nope/pause", {"csrf": browser.csrf(), "back": "/ui/schedules"}
    )
    assert missing.status == 404


# -- mounted under a prefix ------------------------------------------------------


async def test_under_a_prefix_every_address_a_page_names_is_under_it(
    service: Service, clock: Clock, db: SqliteD1
) -> None:
    """A Worker mounting d1queue at /queue: the dashboard at /queue/ui,
    signing in, redirects, links, forms and assets all under it; `next`
    and `back` stay the dashboard's own paths."""
    board = Dashboard(service, TOKEN, prefix="/queue")
    b = Browser(board, clock)
    reply = await b.get("/queue/ui/failed")
    assert reply.status == 303
    assert reply.headers["location"] == "/queue/ui/signin?next=%2Fui%2Ffailed"
    page = await b.get(reply.headers["location"])
    assert page.status == 200 and 'action="/queue/ui/signin"' in page.body
    assert 'name="next" value="/ui/failed"' in page.body
    assets = re.findall(r'(?:href|src)="(/[^"]*static[^"]*)"', page.body)
    assert assets and all(a.startswith("/queue/ui/static/") for a in assets)
    for asset in assets:
        assert (await b.get(asset)).status == 200
    reply = await b.post("/queue/ui/signin", {"token": TOKEN, "next": "/ui/failed"})
    assert reply.status == 303 and reply.headers["location"] == "/queue/ui/failed"
    await service.dispatch("mail", {"name": "echo"})
    body = (await b.get("/queue/ui")).body
    addresses = re.findall(r'(?:href|action|src)="(/[^"]*)"', body)
    assert addresses and all(a.startswith("/queue/ui") for a in addresses), addresses
    assert "http://127.0.0.1:8787/queue/v1/" in body or "/queue/v1/" not in body
    reply = await b.post("/queue/ui/queues/mail/pause", {"csrf": b.csrf(), "back": "/ui"})
    assert reply.headers["location"] == "/queue/ui?notice=paused" and paused(db, "mail")


async def test_under_a_prefix_a_back_outside_the_dashboard_is_not_followed(
    service: Service, clock: Clock, db: SqliteD1
) -> None:
    board = Dashboard(service, TOKEN, prefix="/queue")
    b = Browser(board, clock)
    await b.post("/queue/ui/signin", {"token": TOKEN, "next": "/ui"})
    await b.get("/queue/ui")
    reply = await b.post(
        "/queue/ui/queues/mail/pause", {"csrf": b.csrf(), "back": "https://evil.example/ui"}
    )
    assert reply.headers["location"] == "/queue/ui/queues/mail?notice=paused"


def non_canonical(path: str) -> list[str]:
    """Other spellings of `path` that a rule matching the exact path would
    miss: each must be a 404, never the page."""
    at = path.index("/ui") + 1
    return [
        path + "/",
        path + ";x",
        path + "//",
        path.replace("/ui", "/UI", 1),
        path[:at] + "%75" + path[at + 1 :],  # /ui as /%75i
    ]


async def test_under_a_prefix_every_page_names_it_and_answers_at_one_spelling(
    db: SqliteD1, clock: Clock
) -> None:
    """Every page reached from the overview, every form's action and every
    redirect is under /queue/ui; every page and action answers at the one
    spelling its links use, and any other spelling is a 404."""
    reg = registry()
    service = Service(D1Queue(db, clock=clock, registry=reg, keep_completed=True), reg)
    board = Dashboard(service, TOKEN, prefix="/queue")
    b = Browser(board, clock)
    addresses: set[str] = set()

    def names(reply: Any) -> None:
        """Collect the addresses an answer names; each must be under /queue/ui."""
        found = [reply.headers.get("location", "")]
        found += re.findall(r'\b(?:href|action|src|formaction)="([^"#][^"]*)"', reply.body or "")
        for address in filter(None, (html.unescape(a) for a in found)):
            assert re.match(r"/queue/ui(?:[/?]|$)", address), address
            addresses.add(address)
        for value in re.findall(r'name="(?:back|next)" value="([^"]*)"', reply.body or ""):
            assert re.match(r"/ui(?:[/?]|$)", html.unescape(value)), value

    names(await b.get("/queue/ui"))
    names(await b.get("/queue/ui/signin?next=%2Fui%2Ffailed"))
    names(await b.post("/queue/ui/signin", {"token": TOKEN, "next": "/ui"}))
    await service.batch(
        {"jobs": [{"name": "echo", "queue": "mail"}], "on_success": {"name": "echo"}}
    )
    await service.put_schedule({"id": "digest", "cron": "0 6 * * *", "name": "echo"})
    ids = await fail_some(service, 2)
    job = (await service.dispatch("mail", {"name": "echo", "delay_s": 60}))["id"]
    pages, seen = ["/queue/ui"], set()
    while pages:
        path = pages.pop()
        if path in seen or "/static/" in path:
            continue
        seen.add(path)
        page = await b.get(path)
        assert page.status == 200, path
        names(page)
        pages += [html.unescape(a) for a in re.findall(r'href="(/[^"]*)"', page.body)]
    kinds = {re.sub(r"/ui/(\w+)/[^/?]+", r"/ui/\1/x", p.split("?")[0]) for p in seen}
    assert {"/queue/ui/jobs/x", "/queue/ui/batches/x", "/queue/ui/schedules"} <= kinds, kinds
    csrf = b.csrf()
    actions = [
        ("/queue/ui/queues/mail/pause", {"back": "/ui"}),
        ("/queue/ui/queues/mail/resume", {}),
        ("/queue/ui/queues/mail/limits", {"concurrency": "3"}),
        ("/queue/ui/queues/mail/limits", {"concurrency": "-3"}),
        ("/queue/ui/queues/mail/limits", {"concurrency": "3", "confirm": "yes"}),
        ("/queue/ui/failed/bulk", {"action": "retry", "ids": ids[:1]}),
        ("/queue/ui/failed/bulk", {"action": "retry", "ids": ids[:1], "confirm": "yes"}),
        (f"/queue/ui/jobs/{job}/run", {}),
        (f"/queue/ui/jobs/{job}/cancel", {}),
        ("/queue/ui/schedules/digest/pause", {}),
        ("/queue/ui/schedules/nope/pause", {}),
    ]
    for path, form in actions:
        for other in non_canonical(path):
            refused = await b.post(other, {"csrf": csrf, **form})
            assert refused.status == 404 and "location" not in refused.headers, other
        reply = await b.post(path, {"csrf": csrf, **form})
        assert reply.status in (200, 303, 404, 422), (path, reply.status)
        names(reply)
    for path in sorted(seen):
        for other in non_canonical(path.split("?")[0]):
            assert (await b.get(other)).status == 404, other
    names(await b.get("/queue/ui/nope"))
    for other in non_canonical("/queue/ui/signout"):
        assert (await b.post(other, {"csrf": csrf})).status == 404, other
    names(await b.post("/queue/ui/signout", {"csrf": csrf}))
    names(await b.get("/queue/ui"))
    assert {"/queue/ui/signout", "/queue/ui/signin"} <= addresses


ESCAPES = [
    "/ui/%2e%2e/%2e%2e/admin/x",
    "/ui/../../admin/x",
    "/ui/%2E%2E/.%2e/admin/x",
    "/ui/queues/%2e%2e/%2e%2e/%2e%2e/admin/x",
    "/ui\\..\\..\\admin/x",
    "/ui/%5c..%5c..%5cadmin/x",
    "/ui/%252e%252e/%252e%252e/admin/x",
    "/ui/./../admin/x",
    "/uiadmin/x",
    "/ui/..",
]
"""`next` and `back` values a browser resolves to a path outside the
dashboard: each is sent the action's own page instead."""


@pytest.mark.parametrize("prefix", ["", "/queue"])
async def test_next_and_back_with_dot_segments_stay_in_the_dashboard(
    service: Service, clock: Clock, db: SqliteD1, prefix: str
) -> None:
    """Mounted at /queue, a Location of /queue/ui/%2e%2e/%2e%2e/admin/x is
    /admin/x to the browser: a route of the Worker around d1queue."""
    board = Dashboard(service, TOKEN, prefix=prefix)
    b = Browser(board, clock)
    for target in ESCAPES:
        reply = await b.post(f"{prefix}/ui/signin", {"token": TOKEN, "next": target})
        assert reply.status == 303 and reply.headers["location"] == f"{prefix}/ui", target
        page = await b.get(f"{prefix}/ui/signin?" + urlencode({"next": target}))
        assert page.status == 303 and page.headers["location"] == f"{prefix}/ui", target
        await b.get(f"{prefix}/ui")
        reply = await b.post(f"{prefix}/ui/queues/mail/pause", {"csrf": b.csrf(), "back": target})
        assert reply.status == 303 and paused(db, "mail")
        assert reply.headers["location"] == f"{prefix}/ui/queues/mail?notice=paused", target
        signed_out = await Browser(board, clock).get(
            f"{prefix}/ui/signin?" + urlencode({"next": target})
        )
        assert 'name="next" value="/ui"' in signed_out.body, target


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/ui/queues/../failed", "/ui/failed"),
        ("/ui/./failed?queue=mail", "/ui/failed?queue=mail"),
        ("/ui/%66ailed?queue=mail#top", "/ui/failed?queue=mail"),
        ("/ui/queues/a:b/../a:b", "/ui/queues/a%3Ab"),
        ("/ui/failed/", "/ui"),
        ("/ui/", "/ui"),
    ],
)
async def test_next_is_resolved_then_sent_as_the_pages_spell_it(
    service: Service, clock: Clock, target: str, expected: str
) -> None:
    """The Location has nothing left for the browser to resolve: no
    dot-segment, no escape of a letter, no empty segment."""
    board = Dashboard(service, TOKEN, prefix="/queue")
    reply = await Browser(board, clock).post("/queue/ui/signin", {"token": TOKEN, "next": target})
    assert reply.headers["location"] == "/queue" + expected, target


async def test_d1_unavailable_is_a_503_page_with_retry_after_and_a_bug_a_500_without_text(
    browser: Browser, db: SqliteD1
) -> None:
    """D1 failing past the binding's re-sends: 503 "Unavailable" with
    Retry-After, not a 500 quoting the JS error; D1 refusing a statement is
    a 500 that says to look at the log, the error's text left out."""
    db.fail_when("d1queue_jobs", "D1_ERROR: D1 DB is overloaded. Too many requests queued.")
    reply = await browser.get("/ui")
    assert reply.status == 503 and 1 <= int(reply.headers["retry-after"]) <= 5
    assert "Unavailable" in reply.body and "D1_ERROR" not in reply.body
    db.fail_when("d1queue_jobs", "D1_ERROR: no such column: secret_column")
    reply = await browser.get("/ui")
    assert reply.status == 500 and "retry-after" not in reply.headers
    assert "secret_column" not in reply.body and "log" in reply.body
    assert (await browser.get("/ui")).status == 200


# -- flow limits -------------------------------------------------------------------

LIMITS_FORM = {
    "concurrency": "3",
    "group_concurrency": "1",
    "rate_limit": "5",
    "rate_period_s": "10",
    "group_rate_limit": "",
    "group_rate_period_s": "",
}
LIMITS = {
    "concurrency": 3,
    "group_concurrency": 1,
    "rate": {"limit": 5, "period_s": 10},
    "group_rate": None,
}


def stored_limits(db: SqliteD1) -> dict[str, Any]:
    return {r["name"]: r["limits"] for r in db.query("SELECT name, limits FROM d1queue_queues")}


async def test_the_pages_show_limits_their_use_and_groups(
    browser: Browser, service: Service
) -> None:
    await service.dispatch("mail", {"name": "echo", "payload": 0})
    body = (await browser.get("/ui")).body
    assert '<th scope="col" class="hide-narrow">Limits</th>' in body
    assert '<td class="hide-narrow"><span class="muted">none</span></td>' in body
    body = (await browser.get("/ui/queues/mail")).body
    assert "None: drains claim this queue" in body
    assert "<dt>Concurrency</dt><dd>no limit (0 running)</dd>" in body

    await service.set_limits("mail", {**LIMITS, "group_rate": {"limit": 2, "period_s": 120}})
    ids = [
        (await service.dispatch("mail", {"name": "echo", "payload": i, "group": g}))["id"]
        for i, g in enumerate(["acct:1", "b"])
    ]
    await service.dispatch("mail", {"name": "echo", "group": "acct:1", "delay_s": 60})
    held = await service.queue.reserve_batch("mail", 3)
    assert len(held) == 3  # a job of each group: acct:1, b, and no group
    body = (await browser.get("/ui")).body
    row = re.search(r'<tr><th scope="row"><a href="/ui/queues/mail">mail</a></th>(.*?)</tr>', body)
    assert row, body
    assert (
        "concurrency 3/3 running, group concurrency 1, rate 5 per 10 s, group rate 2 per 2 min"
        in row.group(1)
    )

    body = (await browser.get("/ui/queues/mail")).body
    assert "Set here or over the API" in body
    assert "<dt>Concurrency</dt><dd>3 of 3 running</dd>" in body
    assert "<dt>Per group</dt><dd>at most 1 running</dd>" in body
    assert "<dt>Rate</dt><dd>5 claims per 10 s</dd>" in body
    assert "<dt>Rate per group</dt><dd>2 claims per 2 min</dd>" in body
    # The busiest groups; jobs without a group are a group of their own.
    assert '<th scope="row">acct:1</th><td class="num">1 / 1</td>' in body
    assert '<span class="muted">no group</span></th><td class="num">1 / 1</td>' in body
    # The form is filled with the limits in force.
    for name, value in {
        **LIMITS_FORM,
        "group_rate_limit": "2",
        "group_rate_period_s": "120",
    }.items():
        assert re.search(rf'name="{name}" value="{value}"', body), name
    # The job list's Group column, and the job page's.
    assert '<td class="hide-narrow">acct:1</td>' in body
    assert '<td class="hide-narrow"><span class="muted">—</span></td>' in body
    job = (await browser.get(f"/ui/jobs/{ids[1]}")).body
    assert "<dt>Group</dt><dd>b</dd>" in job


async def test_limits_are_set_from_the_queue_page_after_confirming(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    await browser.get("/ui/queues/mail")
    form = {"csrf": browser.csrf(), "back": "/ui/queues/mail?state=ready", **LIMITS_FORM}
    confirm = await browser.post("/ui/queues/mail/limits", form)
    assert confirm.status == 200, confirm.body
    assert (
        "Set the flow limits of queue mail to <strong>concurrency 3, group concurrency 1, "
        "rate 5 per 10 s</strong>?" in confirm.body
    )
    assert "Now: no limits (0 running)" in confirm.body and ">Set limits</button>" in confirm.body
    assert 'name="confirm" value="yes"' in confirm.body
    assert stored_limits(db) == {}, "nothing is written before confirming"

    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.body))
    assert fields["back"] == "/ui/queues/mail?state=ready"
    reply = await browser.post("/ui/queues/mail/limits", fields)
    assert reply.status == 303
    assert reply.headers["location"] == "/ui/queues/mail?state=ready&notice=limits_set"
    assert (await service.limits("mail"))["limits"] == LIMITS
    assert (await service.limits("mail"))["source"] == "api"
    body = (await browser.get(reply.headers["location"])).body
    assert "Limits saved" in body and "<dt>Concurrency</dt><dd>0 of 3 running</dd>" in body
    overview = (await browser.get("/ui")).body
    assert "concurrency 0/3 running, group concurrency 1, rate 5 per 10 s" in overview

    # Every field empty: no limits at all, stored as such.
    empty = {k: "" for k in LIMITS_FORM}
    reply = await browser.post(
        "/ui/queues/mail/limits", {"csrf": browser.csrf(), "confirm": "yes", **empty}
    )
    assert reply.headers["location"] == "/ui/queues/mail?notice=limits_set"
    assert (await service.limits("mail"))["limits"] == dict.fromkeys(LIMITS)
    assert (await service.queue_stats("mail"))["limits"] is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"concurrency": "0"}, "concurrency must be an integer from 1 to 1000, got 0"),
        ({"concurrency": "-2"}, "got -2"),
        ({"concurrency": "2.5"}, "got &#x27;2.5&#x27;"),
        ({"group_concurrency": "1001"}, "group_concurrency must be an integer from 1 to 1000"),
        ({"concurrency": "<b>x</b>"}, "got &#x27;&lt;b&gt;x&lt;/b&gt;&#x27;"),
        ({"concurrency": "9" * 40}, "got &#x27;99999999999999999999999…&#x27;"),
        ({"rate_limit": "5"}, "rate needs limit and period_s"),
        ({"group_rate_period_s": "10"}, "group_rate needs limit and period_s"),
        ({"rate_limit": "5", "rate_period_s": "86401"}, "period_s must be an integer from 1"),
        ({"group_rate_limit": "x", "group_rate_period_s": "1"}, "group_rate.limit must be"),
    ],
)
async def test_bad_limits_are_a_422_page_at_either_step_and_write_nothing(
    browser: Browser, service: Service, db: SqliteD1, fields: dict[str, str], message: str
) -> None:
    await service.set_limits("mail", {"concurrency": 7})
    before = stored_limits(db)
    csrf = browser.csrf()
    for confirm in ("", "yes"):
        form = {"csrf": csrf, **dict.fromkeys(LIMITS_FORM, ""), **fields, "confirm": confirm}
        reply = await browser.post("/ui/queues/mail/limits", form)
        assert reply.status == 422, reply.body
        assert 'role="alert"' in reply.body and message in reply.body
        assert "Nothing was changed" in reply.body
        assert "location" not in reply.headers
    assert stored_limits(db) == before


async def test_setting_limits_needs_the_csrf_token_and_a_session(
    browser: Browser, board: Dashboard, clock: Clock, db: SqliteD1
) -> None:
    form = {**LIMITS_FORM, "confirm": "yes"}
    for token in ({}, {"csrf": ""}, {"csrf": "x" * 43}):
        reply = await browser.post("/ui/queues/mail/limits", {**form, **token})
        assert reply.status == 403 and "security token" in reply.body, token
    reply = await browser.post(
        "/ui/queues/mail/limits", {**form, "csrf": browser.csrf()}, origin="https://evil.example"
    )
    assert reply.status == 403
    reply = await Browser(board, clock).post("/ui/queues/mail/limits", form)
    assert reply.status == 401
    assert stored_limits(db) == {}
    reply = await browser.post("/ui/queues/bad%20name/limits", {**form, "csrf": browser.csrf()})
    assert reply.status == 400 and stored_limits(db) == {}


async def test_limits_declared_in_code_are_shown_as_such(
    db: SqliteD1, clock: Clock, browser: Browser, service: Service
) -> None:
    service.registry.limit("mail", concurrency=2)
    body = (await browser.get("/ui/queues/mail")).body
    assert "Declared in the Worker&#x27;s code" in body
    assert "<dt>Concurrency</dt><dd>0 of 2 running</dd>" in body
    assert 'name="concurrency" value="2"' in body
    await browser.get("/ui/queues/mail")
    confirm = await browser.post(
        "/ui/queues/mail/limits", {"csrf": browser.csrf(), **LIMITS_FORM, "concurrency": "4"}
    )
    assert "replace the limits declared in code" in confirm.body
    assert "Now: concurrency 2" in confirm.body


async def test_a_jobs_page_shows_its_attempts_and_progress(
    browser: Browser, service: Service
) -> None:
    """A failed job's page lists its attempts, newest first, with their
    errors (escaped) and what each logged; its last progress report."""
    reg = Registry()

    @reg.job("noisy", max_attempts=2)
    async def noisy(payload: Any, ctx: JobContext) -> None:
        ctx.log.warning("<i>trying</i> attempt %d", ctx.attempt)
        await ctx.progress(0.5, note="<half>")
        raise RuntimeError(f"<b>boom</b> {ctx.attempt}")

    job_id = await service.queue.dispatch("noisy", None, max_attempts=2)
    for _ in range(2):
        await drain(service.queue, reg, Config(plan="paid"))
        browser.clock.advance(3600)
    body = (await browser.get(f"/ui/jobs/{job_id}")).body
    assert "<h2>Attempts</h2>" in body and "<h2>Progress</h2>" in body
    assert body.index("RuntimeError: &lt;b&gt;boom&lt;/b&gt; 2") < body.index(
        "RuntimeError: &lt;b&gt;boom&lt;/b&gt; 1"
    ), "newest first"
    assert "warning: &lt;i&gt;trying&lt;/i&gt; attempt 1" in body
    assert "&lt;half&gt;" in body and "<b>boom" not in body
