"""Deeply nested JSON against the real Worker: refused before anything
parses it, and the Worker's Python keeps serving. At a few thousand levels
Pyodide's parser overflows the JS stack, and a Python runtime that overflowed
it cannot run again (issue 9: 8,000 levels in a 16 KB body stopped it)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from .conftest import TOKEN, Host, start_host


@pytest.fixture(scope="module")
def deep_host() -> Iterator[Host]:
    """A host of its own: a test here that fails may leave its Python dead."""
    h = start_host()
    yield h
    h.stop()


def nested(depth: int, kind: str) -> str:
    """JSON text nesting `depth` arrays or objects."""
    if kind == "array":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def still_serving(host: Host) -> None:
    """/health answers, and a normal push is stored."""
    assert host.get("/health").json()["ok"] is True
    reply = host.api("POST", "/v1/queues/deep/jobs", {"name": "example.echo", "payload": {"i": 1}})
    assert reply.status == 201, reply.text


def post(host: Host, path: str, body: str) -> tuple[int, str]:
    reply = host.request(
        "POST",
        path,
        body=body,
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    return reply.status, reply.json()["error"]["code"] if reply.status >= 400 else reply.text


@pytest.mark.parametrize("depth", [8000, 5000])
@pytest.mark.parametrize("kind", ["array", "object"])
def test_a_deep_body_answers_422_too_deep_and_the_worker_keeps_serving(
    deep_host: Host, depth: int, kind: str
) -> None:
    deep = nested(depth, kind)
    if kind == "array":
        assert len(deep) == 2 * depth  # 8,000 levels: 16 KB
    bodies = {
        "/v1/queues/deep/jobs": deep,
        "/v1/queues/deep/jobs#payload": f'{{"name": "example.echo", "payload": {deep}}}',
        "/v1/queues/deep/jobs/batch": (
            f'{{"jobs": [{{"name": "example.echo", "payload": {deep}}}]}}'
        ),
    }
    for path, body in bodies.items():
        assert post(deep_host, path.split("#")[0], body) == (422, "too_deep"), path
        still_serving(deep_host)


def rpc(host: Host, method: str, args: str) -> str:
    """Call RPC `method` with `args`, the JSON text of its argument list (as
    host.rpc does; CPython's json cannot encode thousands of levels), and
    return what it raised: the last line of the error a caller sees (the
    host's RPC errors carry the Python traceback above it)."""
    reply = host.request(
        "POST",
        f"/__test/rpc/{method}",
        body=args,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status == 200, reply.text
    answer = reply.json()
    assert not answer["ok"], answer
    return str([line for line in answer["error"].splitlines() if line.strip()][-1])


def raised(line: str) -> str:
    """ "module.Error: message" -> "message"."""
    return line.split(": ", 1)[1]


@pytest.mark.parametrize("depth", [65, 900])
def test_a_deep_rpc_payload_is_refused_and_the_worker_keeps_serving(
    deep_host: Host, depth: int
) -> None:
    job = f'{{"name": "example.echo", "payload": {nested(depth, "array")}}}'
    line = rpc(deep_host, "dispatch", f'["deep", {job}]')
    assert raised(line).startswith("too_deep:"), line
    line = rpc(deep_host, "dispatch_batch", f'["deep", [{job}]]')
    assert raised(line).startswith("too_deep:"), line
    still_serving(deep_host)


def test_an_rpc_payload_8000_deep_is_refused_and_the_worker_keeps_serving(
    deep_host: Host,
) -> None:
    """Workers RPC structured-clones its arguments in the calling Worker: a
    value 8,000 levels deep cannot be sent, so it never reaches this Worker
    (the SDK converts what does arrive before d1queue can check it, and from
    about 1,000 levels that conversion fails on its own)."""
    job = f'{{"name": "example.echo", "payload": {nested(8000, "array")}}}'
    line = rpc(deep_host, "dispatch", f'["deep", {job}]')
    assert "the caller could not send the arguments" in line, line
    still_serving(deep_host)


def test_dispatch_json_checks_depth_before_parsing(deep_host: Host) -> None:
    """The RPC method for input the calling Worker did not make: JSON text,
    checked as an HTTP body is."""
    deep = json.dumps(f'{{"name": "example.echo", "payload": {nested(8000, "array")}}}')
    line = rpc(deep_host, "dispatch_json", f'["deep", {deep}]')
    assert raised(line).startswith("too_deep:"), line
    pushed = deep_host.rpc("dispatch_json", "deep", '{"name": "example.echo", "payload": [1]}')
    assert pushed["queue"] == "deep" and not pushed["deduplicated"]
    still_serving(deep_host)
