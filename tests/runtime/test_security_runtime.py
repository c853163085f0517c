"""The security review's probes, run against the real Worker in the host as
`make dev` serves it (jobs may reach loopback, nothing else internal):
outbound requests, bounded reads, bodies read only with the token, the
token's length, the read-only token, the Rate Limiting binding, API
caching, RPC ids."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from d1queue.core.guard import CLIENT_HEADER

from ..http_server import Server, running_server
from .conftest import ROOT, TOKEN, Host, RpcError, start_host
from .test_dashboard_http import send


def _push(host: Host, payload: dict[str, Any]) -> str:
    reply = host.api(
        "POST", "/v1/queues/default/jobs", {"name": "http.request", "payload": payload}
    )
    assert reply.status == 201, reply.text
    return str(reply.json()["id"])


def _failed_error(host: Host, id: str) -> str:
    job = host.api("GET", f"/v1/jobs/{id}").json()
    assert job["state"] == "failed", (job, host.events("d1queue.drain")[-3:])
    return str(job["error"])


def test_internal_targets_and_service_names_are_refused(clean_host: Host, server: Server) -> None:
    targets = {
        "metadata": "http://169.254.169.254/latest/meta-data/",
        "private": "http://10.0.0.1/",
        "localhost": f"http://localhost:{server.server_address[1]}/",
        "decimal": "http://167772161/",  # 10.0.0.1
        "mapped": "http://[::ffff:a00:1]/",
    }
    ids = {k: _push(clean_host, {"url": url}) for k, url in targets.items()}
    existing = _push(clean_host, {"service": "DB", "path": "/"})  # the D1 binding's name
    missing = _push(clean_host, {"service": "NO_SUCH_BINDING", "path": "/"})
    clean_host.scheduled()
    clean_host.scheduled()  # the free plan's run takes 5 jobs
    for kind, id in ids.items():
        error = _failed_error(clean_host, id)
        assert "refused" in error and "D1QUEUE_HTTP_ALLOW" in error, (kind, error)
    said = [_failed_error(clean_host, i) for i in (existing, missing)]
    assert said[0].replace("'DB'", "'?'") == said[1].replace("'NO_SUCH_BINDING'", "'?'"), said
    assert "D1QUEUE_HTTP_SERVICES" in said[0]
    assert server.seen == []


def test_redirects_are_rechecked_at_every_hop(clean_host: Host, server: Server) -> None:
    server.script["/to-metadata"] = [
        (302, {"location": "http://169.254.169.254/latest/meta-data/"}, "moved", 0)
    ]
    server.script["/to-ui"] = [(302, {"location": "http://localhost:8787/ui"}, "", 0)]
    server.script["/a"] = [(301, {"location": "/b"}, "", 0)]
    server.script["/b"] = [(200, {}, "fine", 0)]
    server.script["/loop"] = [(302, {"location": "/loop"}, "", 0)]
    metadata = _push(clean_host, {"url": f"{server.url}/to-metadata"})
    ui = _push(clean_host, {"url": f"{server.url}/to-ui"})
    followed = _push(clean_host, {"url": f"{server.url}/a"})
    loop = _push(clean_host, {"url": f"{server.url}/loop"})
    clean_host.scheduled()
    for id in (metadata, ui):
        error = _failed_error(clean_host, id)
        assert "redirected to a target D1QUEUE_HTTP_ALLOW refuses" in error
        assert "169.254" not in error and "/ui" not in error and "moved" not in error
    followed_state = clean_host.api("GET", f"/v1/jobs/{followed}").json()
    assert followed_state["state"] == "completed", "delivered"
    assert "more than 5 redirects" in _failed_error(clean_host, loop)
    assert sum(1 for _, p, *_ in server.seen if p == "/loop") == 6


def test_loopback_is_closed_where_the_deployment_closes_it(server: Server) -> None:
    h = start_host("--var", "D1QUEUE_HTTP_ALLOW=public")
    try:
        id = _push(h, {"url": f"{server.url}/x"})
        h.scheduled()
        assert "loopback host 127.0.0.1 is not allowed" in _failed_error(h, id)
        assert server.seen == []
    finally:
        h.stop()


def test_the_client_in_a_worker_follows_no_redirect(clean_host: Host, server: Server) -> None:
    """d1queue's Python client over HTTP inside a Worker (Pyodide's fetch):
    a 3xx is ClientError `redirected`, and the Location's server never sees
    the request nor the token."""
    paths = ["/v1/jobs/abc", "/v1/queues", "/v1/queues/mail/jobs"]
    with running_server() as other:
        for path in paths:
            server.script[path] = [(302, {"location": other.url + path}, "", 0)]
        said = clean_host.python(
            f"""
            async def main(env):
                from d1queue.interfaces.client import Client, ClientError
                client = Client.over_http({server.url!r}, {TOKEN!r})
                said = []
                for call in (client.job("abc"), client.stats(), client.push("mail", "x.y", 1)):
                    try:
                        said.append(["answered", await call])
                    except ClientError as exc:
                        said.append([exc.status, exc.code, exc.message])
                return said
            """
        )
        for (status, code, message), path in zip(said, paths, strict=True):
            assert (status, code) == (302, "redirected"), said
            assert other.url + path in message
        assert [p for _, p, *_ in server.seen] == paths
        assert other.seen == []


class _Flood(http.server.ThreadingHTTPServer):
    """Answers 200 with an endless body (chunked, or a Content-Length of
    200 MiB), counting what it managed to send before the client left."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _FloodHandler)
        self.sent = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _FloodHandler(http.server.BaseHTTPRequestHandler):
    server: _Flood
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        chunk = b"z" * 65536
        self.send_response(200)
        declared = self.path == "/declared"
        if declared:
            self.send_header("content-length", str(200 * 1024 * 1024))
        else:
            self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for _ in range(200 * 16):  # 200 MiB
                if declared:
                    self.wfile.write(chunk)
                else:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.server.sent += len(chunk)
        except OSError:
            return  # the client cancelled the body

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flood() -> Iterator[_Flood]:
    s = _Flood()
    threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True).start()
    yield s
    s.shutdown()
    s.server_close()


def test_a_very_large_answer_is_read_under_the_cap(clean_host: Host, flood: _Flood) -> None:
    endless = _push(clean_host, {"url": f"{flood.url}/endless", "expect_status": 201})
    declared = _push(clean_host, {"url": f"{flood.url}/declared", "expect_status": 201})
    clean_host.scheduled()
    for id in (endless, declared):
        error = _failed_error(clean_host, id)
        assert "answered 200" in error and len(error) < 600
    # What the target sent before the Worker cancelled: socket buffers and the
    # cap, not the 400 MiB offered.
    assert flood.sent < 16 * 1024 * 1024, flood.sent
    assert clean_host.get("/health").status == 200, "the host still serves"


def test_a_body_is_not_read_without_the_token(clean_host: Host) -> None:
    """A chunked POST with no token: the Worker answers 401 after the first
    chunk, without waiting for (or reading) the rest."""
    port = int(clean_host.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        head = (
            "POST /v1/queues/default/jobs HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        sock.sendall(head.encode() + b"10000\r\n" + b" " * 0x10000 + b"\r\n")
        answer = sock.recv(4096).decode("latin-1")  # more body never comes
    assert answer.startswith("HTTP/1.1 401"), answer[:200]


def test_api_answers_are_not_stored_by_caches(clean_host: Host) -> None:
    for reply in (
        clean_host.api("GET", "/v1/queues"),
        clean_host.api("GET", "/v1/jobs/nope"),
        clean_host.api("GET", "/v1/queues", token=None),
        clean_host.get("/health"),
    ):
        assert reply.headers.get("cache-control") == "no-store", reply.headers


def test_rpc_ids_follow_the_id_pattern(clean_host: Host) -> None:
    for method in ("job", "cancel", "retry_failed", "schedule", "delete_schedule"):
        with pytest.raises(RpcError, match="invalid_id"):
            clean_host.rpc(method, "../../etc")
        with pytest.raises(RpcError, match="invalid_id"):
            clean_host.rpc(method, "x" * 129)


def test_a_short_token_is_refused_at_start() -> None:
    """A short token guards nothing, so nobody is signed in with it: its
    sender reads `misconfigured` alone, the log says why."""
    h = start_host("--var", "D1QUEUE_TOKEN=too-short")
    try:
        reply = h.api("GET", "/v1/queues", token="too-short")
        assert reply.status == 500 and reply.json()["error"]["code"] == "misconfigured"
        assert "32" not in reply.text and "D1QUEUE_TOKEN" not in reply.text
        h.wait_for_output('"d1queue.misconfigured"')
        (line,) = h.events("d1queue.misconfigured")
        assert (
            "at least 32 characters" in line["error"] and "secrets.token_urlsafe" in line["error"]
        )
    finally:
        h.stop()


READONLY = "a-read-only-token-of-32-characters-or-more"


def test_the_readonly_token_reads_and_its_writes_are_refused_unread() -> None:
    """The read-only token: a GET answers; a chunked POST is refused 403
    after its first chunk, its body never read, and nothing is pushed."""
    h = start_host("--var", f"D1QUEUE_READONLY_TOKEN={READONLY}")
    try:
        assert h.api("GET", "/v1/queues", token=READONLY).status == 200
        port = int(h.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            head = (
                "POST /v1/queues/default/jobs HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                f"authorization: Bearer {READONLY}\r\n"
                "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            sock.sendall(head.encode() + b"10000\r\n" + b" " * 0x10000 + b"\r\n")
            answer = sock.recv(4096).decode("latin-1")  # more body never comes
        assert answer.startswith("HTTP/1.1 403"), answer[:200]
        assert '"read_only"' in answer
        assert h.api("GET", "/v1/queues").json()["queues"] == []
    finally:
        h.stop()


def test_a_readonly_token_like_the_api_token_is_refused_at_start() -> None:
    """The same value for both secrets would make every reader an admin: the
    Worker refuses to start with it, and says why naming the secret only."""
    h = start_host("--var", f"D1QUEUE_READONLY_TOKEN={TOKEN}")
    try:
        reply = h.api("GET", "/v1/queues", token=None)
        assert reply.status == 500 and reply.json()["error"]["code"] == "misconfigured"
        assert "READONLY" not in reply.text
        h.wait_for_output('"d1queue.misconfigured"')
        (line, *_) = h.events("d1queue.misconfigured")
        assert "D1QUEUE_READONLY_TOKEN must differ from D1QUEUE_TOKEN" in line["error"]
        assert TOKEN not in str(line)
    finally:
        h.stop()


def test_a_bad_setting_is_told_to_the_tokens_holder_only() -> None:
    """A bad D1QUEUE_HTTP_ALLOW names internal hosts: /health, the API and
    the dashboard answer 500 `misconfigured` without it to anyone without
    the token (a wrong one included); the token's holder and the log read it."""
    h = start_host("--var", "D1QUEUE_HTTP_ALLOW=public,db.internal.corp:5432")
    try:
        anonymous = [
            h.get("/health"),
            h.get("/ui", headers={"accept": "text/html"}),
            h.post("/ui/signin", body="token=x", headers={"origin": h.url}),
            h.api("GET", "/v1/queues", token=None),
            h.api("POST", "/v1/queues/q/jobs", {"name": "http.request"}, token=None),
            h.api("GET", "/v1/queues", token="wrong-" + "x" * 32),
        ]
        for reply in anonymous:
            assert reply.status == 500, reply.text
            assert reply.json()["error"]["code"] == "misconfigured"
            assert "internal" not in reply.text and "5432" not in reply.text, reply.text
        for path in ("/health", "/v1/queues/told"):
            told = h.api("GET", path)
            assert told.status == 500 and told.json()["error"]["code"] == "misconfigured"
            assert "D1QUEUE_HTTP_ALLOW" in told.text and "db.internal.corp:5432" in told.text
        h.wait_for_output('"request":"GET /v1/queues/told"')  # the last request's line
        lines = h.events("d1queue.misconfigured")
        assert len(lines) == len(anonymous) + 2
        assert all("db.internal.corp:5432" in line["error"] for line in lines)
        assert {line["request"] for line in lines} >= {"GET /health", "POST /ui/signin"}
    finally:
        h.stop()


GUARDED = ROOT / "wrangler.guard.toml"


@pytest.fixture(scope="module")
def guarded_host() -> Iterator[Host]:
    """The Worker with a Rate Limiting binding AUTH_LIMITER (5 a minute)."""
    text = (ROOT / "wrangler.toml").read_text()
    GUARDED.write_text(
        text
        + '\n[[ratelimits]]\nname = "AUTH_LIMITER"\nnamespace_id = "1001"\n'
        + "simple = { limit = 5, period = 60 }\n"
    )
    h = start_host("--config", str(GUARDED))
    yield h
    h.stop()
    GUARDED.unlink(missing_ok=True)


def test_wrong_tokens_are_limited_by_the_binding(guarded_host: Host) -> None:
    # The binding counts in fixed 60 s windows: a run that straddles the
    # end of one starts counting afresh, so it is tried again, once, in
    # the next window.
    for attempt in range(2):
        if attempt or time.time() % 60 > 45:
            time.sleep(61 - time.time() % 60)  # the next window, from its start
        replies = [
            guarded_host.api("GET", "/v1/queues", token=f"wrong-{attempt}-{i}") for i in range(8)
        ]
        statuses = [r.status for r in replies]
        if statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}:
            break
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}, statuses
    assert {r.headers.get("retry-after") for r in replies[5:]} == {"60"}
    assert guarded_host.api("GET", "/v1/queues", token=TOKEN).status == 200, "the token still works"


def test_wrong_sign_ins_from_one_ipv6_64_share_one_limit(guarded_host: Host) -> None:
    """Each try from a fresh address of one /64 (which one subscriber holds)
    counts against the same limit; another /64 has its own."""

    def sign_in(address: str, token: str) -> int:
        form = {"token": token, "next": "/ui"}
        return send(guarded_host, "POST", "/ui/signin", form, **{CLIENT_HEADER: address}).status

    statuses = [sign_in(f"2001:db8:64:64:{i:x}::{i + 1:x}", f"wrong-{i}") for i in range(7)]
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}, statuses
    assert sign_in("2001:db8:64:65::1", "wrong") == 401, "another /64 has its own count"
    assert sign_in("2001:db8:64:64::99", TOKEN) == 303, "the token still signs in"
