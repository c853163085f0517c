"""Cancelling a running http.request in the Worker (Pyodide, the workers
SDK's fetch, Miniflare's D1): the target holding the connection open sees
it closed, the job ends cancelled and never runs again."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Host


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
