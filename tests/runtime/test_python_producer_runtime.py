"""examples/python-producer in the host: a Python Worker pushing to d1queue
with d1queue's client over HTTP (Pyodide's fetch, the token), built from
this repository's wheel; the d1queue Worker it pushes to is the session's
host. What crosses: a checked JSON body in, the job's id and state out;
any other body is refused there and pushes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from ..http_server import Server
from .conftest import TOKEN, Host, example_worker, start_host


@pytest.fixture(scope="module")
def producer(host: Host, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root, bundle = example_worker("python-producer", tmp_path_factory.mktemp("producer"))
    # No service binding reaches another host: the client goes over HTTP.
    config = root / "wrangler.http.toml"
    text = (root / "wrangler.toml").read_text()
    config.write_text(
        text.replace("[[services]]", "#")
        .replace('binding = "QUEUE"', "#")
        .replace('service = "d1queue"', "#")
    )
    h = start_host(
        "--config", str(config),
        "--var", f"D1QUEUE_URL={host.url}",
        root=root, bundle=bundle,
    )  # fmt: skip
    yield h
    h.stop()


def test_the_producer_pushes_over_http_and_reads_the_job_back(
    producer: Host, clean_host: Host
) -> None:
    pushed = producer.post("/", json={"message": "hi", "unique_key": "k1"})
    assert pushed.status == 201, pushed.text
    body = pushed.json()
    assert set(body) == {"id", "deduplicated", "state"} and body["deduplicated"] is False
    stored = clean_host.api("GET", f"/v1/jobs/{body['id']}").json()
    assert (stored["name"], stored["queue"]) == ("example.echo", "echo")
    assert (stored["payload"], stored["unique_key"]) == ({"message": "hi"}, "k1")
    again = producer.post("/", json={"message": "hi", "unique_key": "k1"})
    assert again.status == 200 and again.json() == {**body, "deduplicated": True}
    refused = producer.post("/", json={"queue": "py", "name": "nope"})
    assert refused.status == 422 and refused.json()["error"]["code"] == "invalid"
    assert "queue" in refused.json()["error"]["message"]
    assert TOKEN not in refused.text
    assert producer.request("GET", "/").status == 405


def test_the_producer_pushes_no_other_job(producer: Host, clean_host: Host, server: Server) -> None:
    """Whatever the body names, an http.request job or any other, the public
    producer refuses it with a 4xx: nothing is pushed, nothing is sent."""
    target = {"url": f"{server.url}/hook", "method": "POST", "body": {"x": 1}}
    bodies: list[tuple[bytes | str, int]] = [
        (json.dumps({"name": "http.request", "payload": target}), 422),
        (json.dumps({"name": "http.request", "message": "hi"}), 422),
        (json.dumps({"name": "example.add", "payload": {"a": 1, "b": 2}}), 422),
        (json.dumps({"message": "hi", "delay_s": 60, "priority": 9}), 422),
        (b'{"message": ' + b"[" * 5000 + b"]" * 5000 + b"}", 413),
        (b'{"message": ' + b"[" * 400 + b"]" * 400 + b"}", 422),
        ("not json", 400),
    ]
    for raw, status in bodies:
        reply = producer.post("/", body=raw, headers={"content-type": "application/json"})
        assert reply.status == status, reply.text
        assert reply.json()["error"]["code"]
    clean_host.scheduled()
    assert clean_host.api("GET", "/v1/queues").json() == {"queues": []}, "nothing pushed"
    assert server.seen == [], "nothing sent"
    assert producer.post("/", json={"message": "still fine"}).status == 201
