"""Cancelling a running http.request in the Worker (Pyodide, the workers
SDK's fetch, Miniflare's D1): the target holding the connection open sees
it closed, the job ends cancelled and never runs again."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Host, start_host


class Holder:
    """A target that reads a request, never answers, and notes when its
    client closes the connection (recv reads end of stream)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connected = threading.Event()
        self.closed = threading.Event()
        self.requests: list[bytes] = []
        """The first bytes of each connection that carried a request."""
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(120)
            try:
                first = conn.recv(65536)
                if first:
                    self.requests.append(first)
                    self.connected.set()
                while conn.recv(65536):
                    pass  # the client sends nothing more; b"" is its close
            except OSError:
                pass  # reset by the client: closed too
            self.closed.set()

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def holder() -> Iterator[Holder]:
    h = Holder()
    yield h
    h.stop()


def test_a_running_http_request_is_cancelled_and_its_connection_closed(
    clean_host: Host, holder: Holder
) -> None:
    job_id = clean_host.api(
        "POST",
        "/v1/queues/default/jobs",
        {"name": "http.request", "payload": {"url": holder.url + "/hold", "timeout_s": 60}},
    ).json()["id"]
    ran: list[Any] = []
    cron = threading.Thread(target=lambda: ran.append(clean_host.scheduled().status))
    cron.start()
    assert holder.connected.wait(30), "the job's request reached the target"
    assert clean_host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "reserved"

    r = clean_host.api("DELETE", f"/v1/jobs/{job_id}")
    assert (r.status, r.json()) == (202, {"id": job_id, "cancelled": False, "state": "cancelling"})
    assert clean_host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "cancelling"
    # The watch (every 13 s) finds the mark; the fetch is aborted.
    assert holder.closed.wait(40), "the target saw its connection closed"
    cron.join(60)
    assert ran == [200]

    job = clean_host.api("GET", f"/v1/jobs/{job_id}").json()
    assert job["state"] == "cancelled", job
    assert job["error"].startswith("cancelled while it ran"), job["error"]
    again = clean_host.api("DELETE", f"/v1/jobs/{job_id}")
    assert again.status == 409 and again.json()["error"]["state"] == "cancelled"
    clean_host.scheduled()
    # Requests, not connections: the runtime's HTTP client may open a spare
    # connection that never carries one.
    assert len(holder.requests) == 1, "never run again"
    assert clean_host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "cancelled"


CRON = "/__scheduled?cron=" + urllib.parse.quote("* * * * *")
"""A cron run, whatever it answers (under D1 faults, a run may end early)."""


def _scheduled_until_killed(host: Host) -> None:
    """A cron run on a host the test kills while the run holds its job."""
    with contextlib.suppress(AssertionError):  # the host died under it
        host.request("GET", CRON, timeout=60)


def _answer(host: Host, method: str, path: str) -> Any:
    """An API answer, re-sent while injected D1 faults make it 503."""
    for _ in range(30):
        reply = host.api(method, path)
        if reply.status != 503:
            return reply
    raise AssertionError(f"{method} {path}: 503 every time")


def test_a_job_marked_on_a_host_that_dies_never_runs_again(tmp_path: Path, holder: Holder) -> None:
    """The host is killed while the job runs, just after the cancel marked
    it (before any watch): a host on the same D1, with D1 faults (lost
    replies included), takes the job over once its lease lapsed and ends it
    cancelled without sending its request again."""
    state = tmp_path / "state"
    first = start_host(persist_to=state, own_group=True)
    try:
        job_id = first.api(
            "POST",
            "/v1/queues/default/jobs",
            {"name": "http.request", "payload": {"url": holder.url + "/hold", "timeout_s": 60}},
        ).json()["id"]
        cron = threading.Thread(target=_scheduled_until_killed, args=(first,))
        cron.start()
        assert holder.connected.wait(30), "the job's request reached the target"
        assert first.api("DELETE", f"/v1/jobs/{job_id}").status == 202
        first.kill()
        cron.join(10)
    finally:
        first.stop()

    second = start_host("--d1-fault", "0.2", "--d1-seed", "36", persist_to=state)
    try:
        assert _answer(second, "GET", f"/v1/jobs/{job_id}").json()["state"] == "cancelling"
        second.python(
            """
            async def main(env):
                # The dead host's lease, lapsed as waiting for it would.
                await env.DB.prepare(
                    "UPDATE d1queue_jobs SET available_at = 0, locked_until = 0 "
                    "WHERE reserved_at IS NOT NULL"
                ).run()
            """
        )
        for _ in range(20):
            second.request("GET", CRON)
            second.idle()
            job = _answer(second, "GET", f"/v1/jobs/{job_id}").json()
            if job["state"] == "cancelled":
                break
        assert job["state"] == "cancelled", job
        assert job["error"].startswith("cancelled while it ran"), job["error"]
        for _ in range(3):
            second.request("GET", CRON)
        assert len(holder.requests) == 1, "never run again"
        assert _answer(second, "GET", f"/v1/jobs/{job_id}").json()["state"] == "cancelled"
    finally:
        second.stop()
