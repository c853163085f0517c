"""examples/ts-producer, the TypeScript producer, run for real: compiled by
esbuild, served by workerd through Miniflare, its `Service<D1Queue>` binding
reaching the d1queue Worker in the offline host (tests/runtime/ts_producer.mjs
bridges the binding to the host's RPC test hook). What it pushes is then
read back over the host's HTTP API, and what crossed RPC was plain JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tools import ts_types

from .conftest import NODE, ROOT, Host

ESBUILD = ROOT / "node_modules" / ".bin" / "esbuild"
RUNNER = Path(__file__).with_name("ts_producer.mjs")


def test_the_ts_producer_pushes_through_its_binding(clean_host: Host, tmp_path: Path) -> None:
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
    requests = [
        {"queue": "ts", "name": "example.echo", "payload": {"n": 1}, "unique_key": "ts-1"},
        {"queue": "ts", "name": "example.echo", "payload": {"n": 2}, "unique_key": "ts-1"},
        {"queue": "ts", "name": "no.such.job"},
    ]
    run = subprocess.run(
        [str(NODE), str(RUNNER), clean_host.url, str(out), json.dumps(methods)],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    first, again, wrong = json.loads(run.stdout)

    assert first["status"] == 201, first
    pushed, state = first["body"]["pushed"], first["body"]["state"]
    assert pushed["queue"] == "ts" and pushed["deduplicated"] is False
    assert isinstance(pushed["warnings"], list)
    assert state["id"] == pushed["id"] and state["payload"] == {"n": 1}
    assert state["state"] in ("ready", "reserved")  # a drain on push may hold it already
    assert again["body"]["pushed"] == {**pushed, "deduplicated": True}

    # A refusal crosses RPC as an Error whose message starts with the code.
    assert wrong["status"] == 422 and "invalid" in wrong["body"]["error"], wrong

    # The job is in d1queue, as its own HTTP API says.
    got = clean_host.api("GET", f"/v1/jobs/{pushed['id']}")
    if got.status == 404:  # a drain on push already ran it: only a drained queue's can
        assert pushed["drained"] is True, got.text
    else:
        assert got.status == 200 and got.json()["payload"] == {"n": 1}, got.text
    stats = clean_host.api("GET", "/v1/queues/ts").json()
    assert stats["queue"] == "ts"
