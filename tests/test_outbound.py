"""What a job may reach over HTTP (outbound.py): host rules, services,
redirects checked at every hop, headers dropped, bodies read under a cap,
credentials kept out of stored errors."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from d1queue import Config, ConfigError, D1Queue, Registry
from d1queue.core.bounds import MAX_REDIRECTS, MAX_RESPONSE_BYTES
from d1queue.core.log import fields_of
from d1queue.core.outbound import (
    HostRules,
    Outbound,
    OutboundRefused,
    Reply,
    clean_headers,
    parse_host,
    send,
    strip_credentials,
)
from d1queue.features.http_request import register_http_job

from .http_server import Server, running_server
from .test_http_job import LOCAL, run


@pytest.mark.parametrize(
    ("host", "kind", "name"),
    [
        ("example.com", "public", "example.com"),
        ("API.Example.COM.", "public", "api.example.com"),
        ("8.8.8.8", "public", "8.8.8.8"),
        ("2606:4700::1111", "public", "2606:4700::1111"),
        ("127.0.0.1", "loopback", "127.0.0.1"),
        ("127.1", "loopback", "127.0.0.1"),
        ("0x7f.1", "loopback", "127.0.0.1"),
        ("0x7F000001", "loopback", "127.0.0.1"),
        ("2130706433", "loopback", "127.0.0.1"),
        ("0177.0.0.1", "loopback", "127.0.0.1"),
        ("127.0.0.1.", "loopback", "127.0.0.1"),
        ("%31%32%37.0.0.1", "loopback", "127.0.0.1"),
        ("::1", "loopback", "::1"),
        ("::ffff:127.0.0.1", "loopback", "::ffff:7f00:1"),
        ("::ffff:7f00:1", "loopback", "::ffff:7f00:1"),
        ("64:ff9b::7f00:1", "loopback", "64:ff9b::7f00:1"),
        ("localhost", "localhost", "localhost"),
        ("LOCALHOST.", "localhost", "localhost"),
        ("api.localhost", "localhost", "api.localhost"),
        ("10.0.0.1", "private", "10.0.0.1"),
        ("172.16.5.4", "private", "172.16.5.4"),
        ("192.168.1.1", "private", "192.168.1.1"),
        ("100.64.0.1", "private", "100.64.0.1"),
        ("0.0.0.0", "private", "0.0.0.0"),
        ("0", "private", "0.0.0.0"),
        ("fd00::1", "private", "fd00::1"),
        ("224.0.0.1", "private", "224.0.0.1"),
        ("2002:a00:1::", "private", "2002:a00:1::"),  # 6to4 of 10.0.0.1
        ("intranet", "private", "intranet"),
        ("metadata.google.internal", "private", "metadata.google.internal"),
        ("printer.local", "private", "printer.local"),
        ("169.254.169.254", "link-local", "169.254.169.254"),
        ("fe80::1", "link-local", "fe80::1"),
    ],
)
def test_hosts_are_classified_as_the_platform_would_reach_them(
    host: str, kind: str, name: str
) -> None:
    parsed = parse_host(host)
    assert (parsed.kind, parsed.name) == (kind, name)


@pytest.mark.parametrize(
    "host",
    [
        "1.2.3.4.5",
        "256.0.0.1",
        "0x7g.1",
        "1.2.3.09",
        "",
        "a%00b",
        "a<b",
        "xn--zz.com",
        "xn--a.com",
        # not ASCII once decoded: refused, as Python's IDNA (Unicode 3.2) is
        # not the runtime's (the Worker checks the runtime's own reading)
        "\uff11\uff12\uff17\u30020.0.1",
        "127.0.0.1\u2064",
        "127.0.0.1%e2%81%a4",
        "m\u00fcnchen.de",
        "fe80::1%25eth0",
    ],
)
def test_hosts_that_are_no_valid_host_are_refused(host: str) -> None:
    with pytest.raises(ValueError):
        parse_host(host)


INTERNAL = [
    "http://127.0.0.1/",
    "http://127.0.0.1:8787/ui",
    "http://localhost:8787/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://10.0.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "https://metadata.google.internal/",
    "http://user:pw@127.0.0.1/",
    "http://example.com@127.0.0.1/",
    "http://127.0.0.1\\@example.com/",
    "http://127.0.0.1\t/",
    "ftp://example.com/",
    "http://example.com:99999/",
    "file:///etc/passwd",
]


@pytest.mark.parametrize("url", INTERNAL)
def test_the_default_rules_refuse_internal_targets(url: str) -> None:
    assert HostRules().refusal(url) is not None
    assert Config().http_allow.refusal(url) is not None


@pytest.mark.parametrize(
    "url", ["https://example.com/hook", "http://8.8.8.8:8080/x", "https://user:pw@example.com/"]
)
def test_the_default_rules_admit_public_targets(url: str) -> None:
    assert HostRules().refusal(url) is None


def test_rules_grammar() -> None:
    rules = HostRules.parse("public, loopback")
    assert rules.refusal("http://127.0.0.1:9/") is None
    assert rules.refusal("http://127.9.9.9/") is None
    assert rules.refusal("http://localhost/") is not None, "localhost is a kind of its own"
    assert rules.refusal("http://10.0.0.1/") is not None
    strict = HostRules.parse("api.example.com,*.hooks.example.net,10.1.0.0/16,fd00::5")
    assert strict.refusal("https://api.example.com/x") is None
    assert strict.refusal("https://a.b.hooks.example.net/x") is None
    assert strict.refusal("https://hooks.example.net/x") is not None, "*. is subdomains only"
    assert strict.refusal("https://example.com/") is not None, "no public unless listed"
    assert strict.refusal("http://10.1.200.3/") is None
    assert strict.refusal("http://10.2.0.1/") is not None
    assert strict.refusal("http://[fd00::5]/") is None
    assert HostRules.parse("*").refusal("http://169.254.169.254/") is None
    assert HostRules.parse("").refusal("https://example.com/") is not None, "empty: nothing"
    for bad in ("exa mple.com", "10.0.0.0/33", "http://x", "pub lic"):
        with pytest.raises(ValueError):
            HostRules.parse(bad)


def test_settings_are_validated_at_start() -> None:
    config = Config.from_vars({"D1QUEUE_HTTP_ALLOW": "public,loopback"})
    assert config.http_allow.refusal("http://127.0.0.1/") is None
    config = Config.from_vars({"D1QUEUE_HTTP_SERVICES": "HOOKS, BILLING"})
    assert config.http_services == frozenset({"HOOKS", "BILLING"})
    assert Config().http_services == frozenset(), "no service unless listed"
    with pytest.raises(ConfigError, match=r"D1QUEUE_HTTP_ALLOW.*not a host rule"):
        Config.from_vars({"D1QUEUE_HTTP_ALLOW": "public,http://x"})
    with pytest.raises(ConfigError, match=r"D1QUEUE_HTTP_SERVICES.*not a binding name"):
        Config.from_vars({"D1QUEUE_HTTP_SERVICES": "HOOKS,bad-name"})


def test_a_short_token_is_refused_at_start_with_a_way_to_make_one() -> None:
    with pytest.raises(ConfigError, match=r"at least 32 characters.*secrets\.token_urlsafe"):
        Config.from_vars({"D1QUEUE_TOKEN": "x" * 31})
    Config.from_vars({"D1QUEUE_TOKEN": "x" * 32})


def test_forwarding_and_cloudflare_headers_are_dropped() -> None:
    sent = clean_headers(
        {
            "CF-Connecting-IP": "1.2.3.4",
            "cf-ray": "x",
            "X-Forwarded-For": "1.2.3.4",
            "x-forwarded-host": "a",
            "Forwarded": "for=1.2.3.4",
            "X-Real-IP": "1.2.3.4",
            "True-Client-IP": "1.2.3.4",
            "Host": "internal",
            "authorization": "Bearer kept",
            "x-k": "kept",
        }
    )
    assert sent == {"authorization": "Bearer kept", "x-k": "kept"}


def test_credentials_are_stripped_from_text() -> None:
    text = "GET https://user:pa55@example.com/x failed; also ftp://me@host/y and http://plain/"
    assert strip_credentials(text) == (
        "GET https://example.com/x failed; also ftp://host/y and http://plain/"
    )


# -- the http.request job through a real server ------------------------------------


@pytest.fixture
def reg() -> Registry:
    r = Registry()
    register_http_job(r, max_attempts=3)
    return r


async def _error(queue: D1Queue) -> str:
    (failed,) = await queue.failed_jobs()
    return failed.error


async def test_a_refused_target_fails_for_good_without_a_request(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    await queue.dispatch("http.request", {"url": f"{server.url}/x"})
    report = await run(queue, reg, config=Config())  # the default: public only
    assert (report.failed, report.retried) == (1, 0)
    assert server.seen == []
    assert "loopback host 127.0.0.1 is not allowed by D1QUEUE_HTTP_ALLOW" in await _error(queue)


async def test_redirects_are_followed_and_checked_at_every_hop(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    server.script["/a"] = [(302, {"location": "/b"}, "", 0)]
    server.script["/b"] = [(307, {"location": f"{server.url}/c"}, "", 0)]
    server.script["/c"] = [(200, {}, "done", 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/a", "body": {"x": 1}})
    assert (await run(queue, reg)).completed == 1
    # 302 turns a POST into a GET without its body; 307 keeps the method.
    assert [(m, p) for m, p, _, _ in server.seen] == [("POST", "/a"), ("GET", "/b"), ("GET", "/c")]


async def test_a_redirect_to_a_refused_target_fails_without_echoing_it(
    queue: D1Queue, reg: Registry, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    secret_place = "http://169.254.169.254/latest/meta-data/iam/SECRET-ROLE"
    server.script["/hop"] = [(302, {"location": secret_place}, "body-said-this", 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/hop"})
    with caplog.at_level(logging.WARNING, logger="d1queue.outbound"):
        report = await run(queue, reg)
    assert (report.failed, report.retried) == (1, 0)
    error = await _error(queue)
    assert "redirected to a target D1QUEUE_HTTP_ALLOW refuses" in error
    assert "169.254" not in error and "SECRET" not in error and "body-said" not in error
    assert len(server.seen) == 1
    assert any("link-local" in fields_of(r).get("why", "") for r in caplog.records), "logged"


async def test_a_redirect_to_localhost_is_refused_even_where_loopback_is_open(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    server.script["/hop"] = [(301, {"location": "http://localhost:8787/ui"}, "", 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/hop"})
    assert (await run(queue, reg)).failed == 1
    assert "refuses" in await _error(queue)


async def test_at_most_five_redirects(queue: D1Queue, reg: Registry, server: Server) -> None:
    server.script["/loop"] = [(302, {"location": "/loop"}, "", 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/loop"})
    report = await run(queue, reg)
    assert report.failed == 1
    assert f"more than {MAX_REDIRECTS} redirects" in await _error(queue)
    assert len(server.seen) == MAX_REDIRECTS + 1, "the first request and five hops"


async def test_credentials_do_not_follow_a_redirect_to_another_origin(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    with running_server() as other:
        server.script["/a"] = [(302, {"location": f"{other.url}/b"}, "", 0)]
        headers = {
            "authorization": "Bearer s3cret",
            "cookie": "a=b",
            "x-api-key": "k3y",
            "x-k": "v",
            "Accept": "application/json",
            "user-agent": "ua",
        }
        await queue.dispatch("http.request", {"url": f"{server.url}/a", "headers": headers})
        assert (await run(queue, reg)).completed == 1
        assert server.headers_seen[0]["authorization"] == "Bearer s3cret"
        assert server.headers_seen[0]["x-api-key"] == "k3y"
        (seen,) = other.headers_seen
        # Only the safe list crosses to another origin: any other header may
        # be a credential a target could have a job forward to a third party.
        for name in ("authorization", "cookie", "x-api-key", "x-k"):
            assert name not in seen, name
        assert seen["accept"] == "application/json" and seen["user-agent"] == "ua"


async def test_headers_follow_a_redirect_within_the_origin(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    server.script["/a"] = [(302, {"location": "/b"}, "", 0)]
    server.script["/b"] = [(200, {}, "ok", 0)]
    headers = {"authorization": "Bearer s3cret", "x-api-key": "k3y"}
    await queue.dispatch("http.request", {"url": f"{server.url}/a", "headers": headers})
    assert (await run(queue, reg)).completed == 1
    assert [h.get("x-api-key") for h in server.headers_seen] == ["k3y", "k3y"]
    assert server.headers_seen[1]["authorization"] == "Bearer s3cret"


async def test_forwarding_headers_never_reach_the_target(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    headers = {"cf-connecting-ip": "6.6.6.6", "x-forwarded-for": "6.6.6.6", "x-k": "v"}
    await queue.dispatch("http.request", {"url": f"{server.url}/h", "headers": headers})
    assert (await run(queue, reg)).completed == 1
    (seen,) = server.headers_seen
    assert "cf-connecting-ip" not in seen and "x-forwarded-for" not in seen
    assert seen["x-k"] == "v"


async def test_service_names_refused_and_missing_read_the_same(
    queue: D1Queue, reg: Registry, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    env = SimpleNamespace(HOOKS=server.url, DB=server.url)
    config = replace(LOCAL, http_services=frozenset({"HOOKS", "GONE"}))
    await queue.dispatch("http.request", {"service": "DB", "path": "/x"})  # exists, not listed
    await queue.dispatch("http.request", {"service": "GONE", "path": "/x"})  # listed, missing
    await queue.dispatch("http.request", {"service": "HOOKS", "path": "/x"})
    with caplog.at_level(logging.WARNING, logger="d1queue.outbound"):
        report = await run(queue, reg, env=env, config=config)
    assert (report.completed, report.failed) == (1, 2)
    errors = {
        f.error.replace("'DB'", "'X'").replace("'GONE'", "'X'") for f in await queue.failed_jobs()
    }
    assert len(errors) == 1, errors
    assert [p for _, p, _, _ in server.seen] == ["/x"]
    logged = [fields_of(r) for r in caplog.records]
    assert {(e["service"], e["why"]) for e in logged} == {("DB", "not listed"), ("GONE", "missing")}


async def test_url_credentials_never_reach_a_stored_error(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    server.script["/gone"] = [(404, {}, "nope", 0)]
    url = server.url.replace("http://", "http://alice:hunter2@") + "/gone"
    await queue.dispatch("http.request", {"url": url})
    await run(queue, reg)
    # fetch itself refuses a URL with credentials (WHATWG), so the job retries
    # with the client's error; where a client sends it, it answers 404.
    (row,) = (await queue.binding.run("SELECT last_error FROM d1queue_jobs")).rows
    error = row["last_error"]
    assert "127.0.0.1" in error and "hunter2" not in error and "alice" not in error


async def test_a_large_answer_is_read_under_the_cap(
    queue: D1Queue, reg: Registry, server: Server
) -> None:
    big = "x" * (4 * MAX_RESPONSE_BYTES)
    server.script["/big"] = [(500, {}, big, 0)]
    await queue.dispatch("http.request", {"url": f"{server.url}/big"})
    assert (await run(queue, reg)).retried == 1
    (row,) = (await queue.binding.run("SELECT last_error FROM d1queue_jobs")).rows
    assert "answered 500" in row["last_error"] and len(row["last_error"]) < 500


class _Raw:
    """A response whose body is endless: only the cap stops reading it."""

    def __init__(self, length: str | None) -> None:
        self.status, self._length = 200, length
        self.asked: list[int] = []
        self.cancelled = False

    def header(self, name: str) -> str | None:
        return self._length if name == "content-length" else None

    async def read(self, limit: int) -> bytes:
        self.asked.append(limit)
        return b"y" * limit

    async def cancel(self) -> None:
        self.cancelled = True


async def test_a_reply_reads_at_most_the_cap_and_not_at_all_past_content_length() -> None:
    endless = _Raw(None)
    reply = Reply(endless, "https://example.com/")
    assert len(await reply.read()) == MAX_RESPONSE_BYTES and reply.truncated
    assert endless.asked == [MAX_RESPONSE_BYTES + 1]
    declared = _Raw(str(200 * 1024 * 1024))
    reply = Reply(declared, "https://example.com/")
    assert await reply.read() == b"" and reply.truncated
    assert declared.asked == [] and declared.cancelled


async def test_each_hop_is_a_subrequest() -> None:
    spent: list[str] = []
    hops = iter([*(["/next"] * 2), None])

    class Hop:
        def __init__(self, location: str | None) -> None:
            self.status = 302 if location else 200
            self._location = location

        def header(self, name: str) -> str | None:
            return self._location if name == "location" else None

    async def http(url: str, **_: Any) -> Hop:
        return Hop(next(hops))

    reply = await send(
        http,
        Outbound(),
        "https://example.com/start",
        method="GET",
        headers={},
        body=None,
        service=None,
        env=None,
        spend=spent.append,
    )
    assert reply.status == 200 and reply.url == "https://example.com/next"
    assert spent == ["fetch"] * 3


async def test_a_handlers_own_fetch_is_under_the_same_rules(queue: D1Queue) -> None:
    reg = Registry()
    seen: list[Exception] = []

    @reg.job("peek", subrequests=1)
    async def peek(payload: Any, ctx: Any) -> None:
        try:
            await ctx.fetch("http://169.254.169.254/")
        except OutboundRefused as exc:
            seen.append(exc)
            raise

    await queue.dispatch("peek", None)
    assert (await run(queue, reg)).failed == 1
    assert seen and "link-local" in str(seen[0])
