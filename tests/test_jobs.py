"""The deployment's example jobs (src/jobs.py) under CPython: what they log.
(In the real Worker: tests/runtime/test_worker.py.)"""

from __future__ import annotations

import json
import uuid

import pytest

from d1queue import Config, D1Queue, drain
from jobs import registry


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
