"""Inside the Worker: for every spelling of tests/url_corpus.py, d1queue's
verdict on a URL (through the Worker's fetch and its `read_url`) equals the
verdict on the runtime's own reading of it (a JavaScript Request's url), and
an end-to-end job to a host the runtime reads as an internal address fails
without a request."""

from __future__ import annotations

import json
from typing import Any

from d1queue.core.outbound import HostRules

from .. import url_corpus
from ..http_server import Server
from .conftest import Host, start_host

RULES = ["public", "public,loopback", "*.example.com,10.0.0.0/8", "localhost,link-local"]

_SOURCE = """
async def main(env):
    import json
    from js import URL, Request
    from d1queue.core.outbound import HostRules
    from d1queue.interfaces.cloudflare import job_fetch

    rules = [HostRules.parse(t) for t in json.loads(RULES)]
    out = []
    for url, base in json.loads(PAIRS):
        verdicts = []
        for r in rules:
            try:
                r.target(url, base, read=job_fetch.read_url)
                verdicts.append(True)
            except ValueError:
                verdicts.append(False)
        href = None
        try:
            full = url if base is None else str(URL.new(url, base).href)
            try:
                href = str(Request.new(full).url)
            except Exception:  # a Request refuses credentials in the URL
                href = str(URL.new(full).href)
        except Exception:
            pass
        out.append([verdicts, href])
    return out
"""


def test_the_verdict_inside_the_worker_is_the_runtimes(host: Host) -> None:
    pairs: list[list[Any]] = [[u, None] for u in url_corpus.urls()]
    pairs += [[loc, base] for base, loc in url_corpus.REDIRECTS]
    source = _SOURCE.replace("PAIRS", repr(json.dumps(pairs))).replace(
        "RULES", repr(json.dumps(RULES))
    )
    results = host.python(source)
    assert len(results) == len(pairs) > 1000
    rules = [HostRules.parse(t) for t in RULES]
    wrong = [
        (url, base, text, ours, href)
        for (url, base), (verdicts, href) in zip(pairs, results, strict=True)
        for text, r, ours in zip(RULES, rules, verdicts, strict=True)
        if ours != url_corpus.verdict(r, href)
    ]
    assert wrong == []
    # and the spellings the runtime reads as internal addresses are among them
    readings = {url: href for (url, _), (_, href) in zip(pairs, results, strict=True)}
    assert readings["http://169.254.169.254\u2064/x"] == "http://169.254.169.254/x"
    assert readings["http://127.0.0.1%E2%81%A4/x"] == "http://127.0.0.1/x"


def _spellings(port: int) -> list[str]:
    """The runtime reads each as 127.0.0.1:port (U+2064 and U+180F dropped,
    U+1FBF1 read as 1); Python's IDNA codec read them as public names."""
    return [
        f"http://127.0.0.1\u2064:{port}/a",
        f"http://127.0.0.\U0001fbf1:{port}/b",
        f"http://127.0.0.1%E2%81%A4:{port}/c",
        f"http://127.0.0.1%E1%A0%8F:{port}/d",
    ]


def _push_all(h: Host, urls: list[str]) -> list[str]:
    ids = []
    for url in urls:
        reply = h.api(
            "POST", "/v1/queues/default/jobs", {"name": "http.request", "payload": {"url": url}}
        )
        assert reply.status == 201, reply.text
        ids.append(str(reply.json()["id"]))
    return ids


def test_jobs_to_hosts_the_runtime_reads_as_internal_fail_without_a_request(
    server: Server,
) -> None:
    h = start_host("--var", "D1QUEUE_HTTP_ALLOW=public")
    try:
        ids = _push_all(h, _spellings(server.server_address[1]))
        h.scheduled()
        for id in ids:
            job = h.api("GET", f"/v1/jobs/{id}").json()
            assert job["state"] == "failed", job
            assert "loopback host 127.0.0.1 is not allowed" in job["error"], job["error"]
        assert server.seen == []
    finally:
        h.stop()


def test_where_loopback_is_open_the_runtimes_reading_is_what_is_fetched(
    clean_host: Host, server: Server
) -> None:
    ids = _push_all(clean_host, _spellings(server.server_address[1]))
    clean_host.scheduled()
    for id in ids:
        job = clean_host.api("GET", f"/v1/jobs/{id}").json()
        assert job["state"] == "completed", job
    assert sorted(p for _, p, *_ in server.seen) == ["/a", "/b", "/c", "/d"]
