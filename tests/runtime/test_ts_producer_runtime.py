"""examples/ts-producer, the TypeScript producer, run for real: compiled by
esbuild, served by workerd through Miniflare, its `Service<D1Queue>` binding
reaching the d1queue Worker in the offline host (tests/runtime/ts_producer.mjs
bridges the binding to the host's RPC test hook). What it pushes is then
read back over the host's HTTP API, and what crossed RPC was plain JSON.
Any body but the one it expects is refused there, with no RPC call."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tools import ts_types

from ..http_server import Server
from .conftest import NODE, ROOT, Host

ESBUILD = ROOT / "node_modules" / ".bin" / "esbuild"
RUNNER = Path(__file__).with_name("ts_producer.mjs")


def run_producer(host: Host, tmp_path: Path, bodies: list[str]) -> dict[str, Any]:
    """POST each of `bodies` (as is) to the compiled producer in Miniflare:
    {answers: [{status, body}], rpc: [the RPC methods it called]}."""
    out = tmp_path / "index.js"
    build = subprocess.run(
        [
            str(ESBUILD),
            str(ROOT / "examples" / "ts-producer" / "src" / "index.ts"),
            "--bundle",
            "--format=esm",
            "--platform=neutral",
            f"--outfile={out}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    methods = [m.name for m in ts_types.rpc_methods()]
    run = subprocess.run(
        [str(NODE), str(RUNNER), host.url, str(out), json.dumps(methods)],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def test_the_ts_producer_pushes_through_its_binding(clean_host: Host, tmp_path: Path) -> None:
    bodies = [
        json.dumps({"message": "hi", "unique_key": "ts-1"}),
        json.dumps({"message": "hi again", "unique_key": "ts-1"}),
        json.dumps({"queue": "ts", "name": "no.such.job"}),
    ]
    ran = run_producer(clean_host, tmp_path, bodies)
    first, again, wrong = ran["answers"]

    assert first["status"] == 201, first
    answer = first["body"]
    assert set(answer) == {"id", "deduplicated", "state"} and answer["deduplicated"] is False
    assert answer["state"] in ("ready", "reserved", "completed")  # a drain on push may run it
    assert again == {"status": 200, "body": {**answer, "deduplicated": True}}, again

    # Refused by the producer itself, naming the fields it does not take.
    assert wrong["status"] == 422 and wrong["body"]["error"]["code"] == "invalid", wrong
    assert "name, queue" in wrong["body"]["error"]["message"]
    assert ran["rpc"] == ["dispatch", "job"] * 2, "two pushes, each read back; nothing else"

    # The job is in d1queue, as its own HTTP API says.
    got = clean_host.api("GET", f"/v1/jobs/{answer['id']}").json()
    assert (got["name"], got["queue"], got["payload"]) == (
        "example.echo",
        "echo",
        {"message": "hi"},
    )
    assert got["unique_key"] == "ts-1"


def test_the_ts_producer_pushes_no_other_job(
    clean_host: Host, tmp_path: Path, server: Server
) -> None:
    """Whatever the body names, an http.request job or any other, the public
    producer refuses it with a 4xx: no RPC call, nothing pushed or sent."""
    target = {"url": f"{server.url}/hook", "method": "POST", "body": {"x": 1}}
    refused = [
        (json.dumps({"name": "http.request", "payload": target}), 422),
        (json.dumps({"name": "http.request", "message": "hi"}), 422),
        (json.dumps({"name": "example.add", "payload": {"a": 1, "b": 2}}), 422),
        (json.dumps({"message": "hi", "delay_s": 60, "priority": 9}), 422),
        (json.dumps({"message": {"text": "hi"}}), 422),
        (json.dumps({"message": "x" * 201}), 422),
        (json.dumps({"message": "hi", "unique_key": "a b"}), 422),
        ('{"message": ' + "[" * 5000 + "]" * 5000 + "}", 413),
        ("not json", 400),
        ("[]", 400),
    ]
    ran = run_producer(clean_host, tmp_path, [body for body, _ in refused])
    for (body, status), got in zip(refused, ran["answers"], strict=True):
        assert got["status"] == status, (body[:80], got)
        assert got["body"]["error"]["code"] and got["body"]["error"]["message"]
    assert ran["rpc"] == [], "no RPC call: nothing pushed"
    clean_host.scheduled()
    assert clean_host.api("GET", "/v1/queues").json() == {"queues": []}
    assert server.seen == [], "nothing sent"
