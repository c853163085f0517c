"""The dashboard over plain HTTP, as an outside client probes `make dev`: the
Worker in the offline host, redirects not followed, cookies copied by hand.
The same pages in a browser: test_dashboard_browser.py."""

from __future__ import annotations

import http.client
import re
from urllib.parse import urlencode, urlparse

import pytest

from .conftest import TOKEN, Host, Reply


def send(
    host: Host, method: str, path: str, form: dict[str, str] | None = None, **headers: str
) -> Reply:
    """One request, no redirect followed (urllib would follow a 303)."""
    url = urlparse(host.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = urlencode(form).encode() if form is not None else None
    if body is not None:
        headers.setdefault("content-type", "application/x-www-form-urlencoded")
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def sign_in(host: Host) -> str:
    """A fresh session: its cookie, as `name=value`."""
    reply = send(host, "POST", "/ui/signin", {"token": TOKEN, "next": "/ui"})
    assert reply.status == 303 and reply.headers["location"] == "/ui", reply.text
    return reply.headers["set-cookie"].split(";", 1)[0]


def csrf(page: Reply) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert m, page.text
    return m.group(1)


@pytest.mark.parametrize("which", ["host", "raw_host"])
def test_a_cookie_replayed_after_sign_out_is_refused(
    which: str, request: pytest.FixtureRequest
) -> None:
    host: Host = request.getfixturevalue(which)
    cookie = sign_in(host)
    other = sign_in(host)
    page = send(host, "GET", "/ui", cookie=cookie)
    assert page.status == 200
    token = csrf(page)
    out = send(host, "POST", "/ui/signout", {"csrf": token}, cookie=cookie)
    assert out.status == 303 and out.headers["location"] == "/ui/signin"
    assert "Max-Age=0" in out.headers["set-cookie"]

    replayed = send(host, "GET", "/ui", cookie=cookie)  # the copy kept before signing out
    assert replayed.status == 303
    assert replayed.headers["location"] == "/ui/signin?next=%2Fui"
    action = send(host, "POST", "/ui/queues/mail/pause", {"csrf": token}, cookie=cookie)
    assert action.status == 401
    assert host.api("GET", "/v1/queues/mail").json()["paused"] is False
    again = send(host, "POST", "/ui/signout", {"csrf": token}, cookie=cookie)
    assert again.status == 401, "a session signs out once"
    assert send(host, "GET", "/ui", cookie=other).status == 200, "other sessions live on"


@pytest.mark.parametrize("path", ["/ui/signin?next=/ui%0dx", "/ui/signin?next=/ui%0ax"])
def test_a_control_character_in_next_is_a_400_not_a_500(clean_host: Host, path: str) -> None:
    page = send(clean_host, "GET", path)
    assert page.status == 400 and "control character" in page.text
    signed_in = send(clean_host, "GET", path, cookie=sign_in(clean_host))
    assert signed_in.status == 400 and "location" not in signed_in.headers
    posted = send(clean_host, "POST", "/ui/signin", {"token": TOKEN, "next": "/ui\rx"})
    assert posted.status == 400 and "set-cookie" not in posted.headers


def test_next_past_ascii_is_sent_percent_encoded(clean_host: Host) -> None:
    """A Location header carries bytes: a character past ASCII in `next`
    goes percent-encoded (UTF-8), as a browser sends it, not as the Latin-1
    byte the runtime would write (another address)."""
    target = "/ui/failed?error=d\u00e9j\u00e0\u2028"
    reply = send(clean_host, "POST", "/ui/signin", {"token": TOKEN, "next": target})
    assert reply.status == 303
    assert reply.headers["location"] == "/ui/failed?error=d%C3%A9j%C3%A0%E2%80%A8"


def test_head_options_and_405_follow_the_routers_rule(clean_host: Host) -> None:
    """Through the Worker: a 204 and a HEAD answer go out with no body (the
    runtime refuses a 204 Response with any body), and the host's own 405
    for a method no Request can carry takes `allow` from OPTIONS."""
    options = send(clean_host, "OPTIONS", "/ui/signin")
    assert options.status == 204 and options.body == b""
    assert options.headers["allow"] == "OPTIONS, GET, POST, HEAD"
    head = send(clean_host, "HEAD", "/ui/signin")
    get = send(clean_host, "GET", "/ui/signin")
    assert head.status == get.status == 200 and head.body == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    refused = send(clean_host, "PUT", "/ui/signin")
    assert refused.status == 405 and refused.headers["allow"] == options.headers["allow"]
    assert "accepts GET, POST, HEAD" in refused.text
    traced = send(clean_host, "TRACE", "/ui/failed")
    assert traced.status == 405 and traced.headers["allow"] == "OPTIONS, GET, HEAD"
    api = send(clean_host, "HEAD", "/health")
    assert api.status == 200 and api.body == b""
    assert api.headers["content-type"] == "application/json"


def test_sign_in_answers_at_its_one_path_only(clean_host: Host) -> None:
    """Spellings that reached the sign-in through the Worker's URL parser:
    each is a 404 that signs no one in, so a WAF rule on /ui/signin sees
    every try."""
    for path in ("/ui/signin/", "/ui/signin;x", "/ui/signin//", "/ui/%73ignin", "/UI/signin"):
        reply = send(clean_host, "POST", path, {"token": TOKEN, "next": "/ui"})
        assert reply.status == 404 and "set-cookie" not in reply.headers, (path, reply.text)
        assert "There is no page at" in reply.text
