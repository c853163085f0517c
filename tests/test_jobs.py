"""The deployment's example jobs (src/jobs.py) under CPython: what they log.
(In the real Worker: tests/runtime/test_worker.py.)"""

from __future__ import annotations

import json
import uuid

import pytest

from d1queue import Config, D1Queue, drain
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.workflows import JobView
from jobs import registry

from .conftest import Clock


async def test_echo_logs_its_jobs_id_on_stdout_and_never_its_payload(
    queue: D1Queue, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = uuid.uuid4().hex
    job_id = await queue.dispatch("example.echo", {"token": secret}, queue="mail")
    report = await drain(queue, registry, Config())
    assert report.completed == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {
        "event": "example.echo",
        "id": job_id,
        "queue": "mail",
        "attempt": 1,
        "level": "info",
    }
    assert secret not in out + err and err == ""


async def test_steps_reports_progress_and_logs_and_tells_three_attempts(
    db: SqliteD1, clock: Clock
) -> None:
    """example.steps with fail_at: step 2 raises on its first two attempts,
    the third completes; its history shows the three, each with its log
    lines, and its progress is the last step's."""
    queue = D1Queue(db, clock=clock, keep_completed=True)
    job_id = await queue.derive(registry=registry).dispatch(
        "example.steps", {"steps": 3, "sleep_ms": 0, "fail_at": 2}
    )
    for _ in range(3):
        await drain(queue, registry, Config(plan="paid"))
        clock.advance(60)
    view = await queue.workflows.job(job_id)
    assert isinstance(view, JobView) and view.state == "completed"
    assert view.result == {"steps": 3}
    assert [(r["attempt"], r["outcome"]) for r in view.runs] == [
        (1, "retried"),
        (2, "retried"),
        (3, "completed"),
    ]
    assert "RuntimeError: example.steps failed at step 2 on attempt 1" in view.runs[0]["error"]
    assert [line["message"] for line in view.runs[0]["logs"]] == [
        "step 1 of 3 done",
        "step 2 of 3 failed (attempt 1)",
    ]
    assert [line["message"] for line in view.runs[2]["logs"]] == [
        f"step {i} of 3 done" for i in (1, 2, 3)
    ]
    assert view.progress is not None and view.progress["value"] == 1
    assert view.progress["note"] == "step 3 of 3"


@pytest.mark.parametrize(
    "payload",
    [None, {"steps": 0}, {"steps": 2, "sleep_ms": 30_001}, {"steps": 2, "fail_at": 3}],
)
async def test_steps_refuses_a_bad_payload(db: SqliteD1, clock: Clock, payload: object) -> None:
    queue = D1Queue(db, clock=clock)
    await queue.derive(registry=registry).dispatch("example.steps", payload)
    report = await drain(queue, registry, Config(plan="paid"))
    assert report.failed == 1
