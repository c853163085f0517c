"""examples/python-producer in the host: a Python Worker pushing to d1queue
with d1queue's client over HTTP (Pyodide's fetch, the token), built from
this repository's wheel; the d1queue Worker it pushes to is the session's
host. What crosses: a JSON body in, the client's answer out."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
    pushed = producer.post(
        "/", json={"queue": "py", "name": "example.echo", "payload": {"n": 1}, "unique_key": "k1"}
    )
    assert pushed.status == 201, pushed.text
    body = pushed.json()
    job_id = body["pushed"]["id"]
    assert body["state"]["payload"] == {"n": 1} and body["state"]["unique_key"] == "k1"
    stored = clean_host.api("GET", f"/v1/jobs/{job_id}").json()
    assert stored["queue"] == "py" and stored["payload"] == {"n": 1}
    refused = producer.post("/", json={"queue": "py", "name": "nope"})
    assert refused.status == 422 and refused.json()["error"]["code"] == "invalid"
    assert TOKEN not in refused.text
