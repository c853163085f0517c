"""Attempt history, progress and per-job log lines in the real Worker
(Pyodide, Miniflare's D1) through its HTTP API: example.steps shows its
progress and log lines while it runs, and a job failing twice then
succeeding shows its three attempts with their errors and durations."""

from __future__ import annotations

import threading
import time
from typing import Any

from .conftest import Host


def job(host: Host, id: str) -> dict[str, Any]:
    reply = host.api("GET", f"/v1/jobs/{id}")
    assert reply.status == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def push_steps(host: Host, payload: dict[str, Any]) -> str:
    reply = host.api(
        "POST", "/v1/queues/default/jobs", {"name": "example.steps", "payload": payload}
    )
    assert reply.status == 201, reply.text
    return str(reply.json()["id"])


def test_steps_shows_progress_and_log_lines_while_it_runs(clean_host: Host) -> None:
    job_id = push_steps(clean_host, {"steps": 4, "sleep_ms": 1500})
    since = len(clean_host.output())
    run = threading.Thread(target=clean_host.scheduled)
    run.start()
    seen: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            view = job(clean_host, job_id)
            if view["state"] == "completed":
                break
            if view["state"] == "reserved" and view["progress"] is not None:
                seen.append(view)
            time.sleep(0.2)
    finally:
        run.join(30)
    assert seen, "the running job never showed its progress"
    running = seen[0]
    assert running["started_at"] is not None and running["runs"] == []
    assert 0 < running["progress"]["value"] < 1
    assert running["progress"]["note"].startswith("step ")
    assert running["logs"] and running["logs"][0]["message"] == "step 1 of 4 done"
    done = job(clean_host, job_id)
    assert done["state"] == "completed" and done["result"] == {"steps": 4}
    assert done["progress"]["value"] == 1 and done["logs"] is None
    (entry,) = done["runs"]
    assert entry["outcome"] == "completed" and entry["duration_ms"] >= 6000
    assert [x["message"] for x in entry["logs"]] == [f"step {i} of 4 done" for i in range(1, 5)]
    # Each line is also a JSON log line with the job's id.
    lines = clean_host.events("d1queue.job.log", since)
    assert [x["message"] for x in lines if x["id"] == job_id] == [
        f"step {i} of 4 done" for i in range(1, 5)
    ]


def test_failing_twice_then_succeeding_shows_three_attempts(clean_host: Host) -> None:
    job_id = push_steps(clean_host, {"steps": 2, "sleep_ms": 100, "fail_at": 1})
    for attempt in (1, 2, 3):
        deadline = time.monotonic() + 10
        while job(clean_host, job_id)["state"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.2)  # its backoff: at most 2 s
        clean_host.scheduled()
        assert job(clean_host, job_id)["attempts"] == attempt
    done = job(clean_host, job_id)
    assert done["state"] == "completed"
    runs = done["runs"]
    assert [(r["attempt"], r["outcome"]) for r in runs] == [
        (1, "retried"),
        (2, "retried"),
        (3, "completed"),
    ]
    for n, r in enumerate(runs[:2], 1):
        assert r["error"].startswith(f"RuntimeError: example.steps failed at step 1 on attempt {n}")
        assert "in steps" in r["error"], "the traceback's last frames"
    assert all(r["duration_ms"] >= 100 for r in runs[2:]) and runs[0]["duration_ms"] >= 100
    assert runs[0]["started_at"] < runs[1]["started_at"] < runs[2]["started_at"]
    # RPC job() shows the same history.
    assert clean_host.rpc("job", job_id)["runs"] == runs
