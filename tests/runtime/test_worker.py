"""The real Worker (src/entry.py) in Pyodide with the workers SDK and
Miniflare's D1, over real HTTP: pushes, scheduled drains, crashes, overlapping
runs, RPC, and the http.request job through the Workers fetch."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from ..http_server import Server
from .conftest import TOKEN, Host, RpcError, echo_attempts, echo_runs, start_host


def drain_reports(host: Host, since: int) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in host.output()[since:]
        if line.startswith("{") and '"d1queue.drain"' in line
    ]


def wait_reports(host: Host, since: int, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The drain reports printed since `since`, once there are `n` (a line the
    Worker printed may arrive after the HTTP reply that ended its run)."""
    deadline = time.monotonic() + timeout
    while len(reports := drain_reports(host, since)) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(reports) == n, reports
    return reports


def test_a_pushed_job_runs_at_the_next_scheduled_run(clean_host: Host) -> None:
    since = len(clean_host.output())
    reply = clean_host.api(
        "POST", "/v1/queues/default/jobs", {"name": "example.echo", "payload": {"i": 7}}
    )
    assert reply.status == 201
    job_id = reply.json()["id"]
    assert clean_host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "ready"
    clean_host.scheduled()
    (report,) = wait_reports(clean_host, since, 1)
    assert (report["claimed"], report["completed"], report["stopped"]) == (1, 1, "empty")
    assert report["queries"] == 5, (
        "paused + queue names, SELECT, claim batch, settle batch, the run's counters"
    )
    assert echo_runs(clean_host.output()[since:]) == Counter([job_id])
    assert clean_host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "completed"


def test_the_echo_jobs_log_line_carries_its_id_and_no_payload(clean_host: Host) -> None:
    """Payloads may carry secrets: example.echo logs one JSON line a run,
    through `logging` on stdout, naming the job and never its payload."""
    marker = uuid.uuid4().hex
    since = len(clean_host.output())
    reply = clean_host.api(
        "POST",
        "/v1/queues/mail/jobs",
        {"name": "example.echo", "payload": {"api_key": marker, marker: [marker]}},
    )
    assert reply.status == 201, reply.text
    job_id = reply.json()["id"]
    clean_host.scheduled()
    wait_reports(clean_host, since, 1)  # printed after the run's lines
    (logged,) = [line for line in clean_host.output()[since:] if job_id in line]
    assert json.loads(logged) == {
        "event": "example.echo",
        "id": job_id,
        "queue": "mail",
        "attempt": 1,
        "level": "info",
    }
    assert not [line for line in clean_host.output() if marker in line], "the payload was logged"


def test_a_job_whose_worker_died_is_recovered_by_a_later_run(clean_host: Host) -> None:
    job_id = clean_host.api(
        "POST", "/v1/queues/default/jobs", {"name": "example.echo", "payload": {"i": 1}}
    ).json()["id"]
    # A worker claims it and dies: its lease (1 ms long, so that the test
    # need not wait 90 s) lapses and nobody settles it.
    clean_host.python(
        """
        from d1queue import D1Queue

        async def main(env):
            dead = D1Queue(env.DB, reservation_s=0.001)
            assert await dead.reserve("default") is not None
        """
    )
    since = len(clean_host.output())
    clean_host.scheduled()
    (report,) = wait_reports(clean_host, since, 1)
    assert (report["reclaimed"], report["completed"]) == (1, 1)
    assert echo_attempts(clean_host.output()[since:]) == Counter([(job_id, 2)]), (
        "run once, as its second attempt (the dead worker's claim was the first)"
    )


def test_two_scheduled_runs_at_once_never_run_a_job_twice(clean_host: Host) -> None:
    jobs = [{"name": "example.echo", "payload": {"i": i}} for i in range(90)]
    pushed = clean_host.api("POST", "/v1/queues/default/jobs/batch", {"jobs": jobs})
    assert pushed.status == 201
    ids = pushed.json()["ids"]
    assert len(set(ids)) == 90
    since = len(clean_host.output())
    # Pairs of overlapping cron runs until the queue is empty: each run
    # claims at most D1QUEUE_MAX_JOBS (5 on the free plan).
    for pair in range(1, 15):
        threads = [threading.Thread(target=clean_host.scheduled) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        clean_host.idle()
        reports = wait_reports(clean_host, since, 2 * pair)
        if sum(r["completed"] for r in reports) == 90:
            break
    assert sum(r["completed"] for r in reports) == 90 and sum(r["stale"] for r in reports) == 0
    assert all(r["claimed"] <= 5 for r in reports)
    assert echo_runs(clean_host.output()[since:]) == Counter(ids), "each job exactly once"


def test_rpc_methods_as_a_js_worker_calls_them(clean_host: Host) -> None:
    pushed = clean_host.rpc(
        "dispatch", "mail", {"name": "example.echo", "payload": {"i": 1}, "unique_key": "u"}
    )
    assert pushed["queue"] == "mail" and pushed["deduplicated"] is False
    again = clean_host.rpc("dispatch", "mail", {"name": "example.echo", "unique_key": "u"})
    assert again == {**pushed, "deduplicated": True}
    batch = clean_host.rpc("dispatch_batch", "mail", [{"name": "example.echo", "delay_s": 60}] * 3)
    assert len(batch["ids"]) == 3
    stats = clean_host.rpc("stats", "mail")
    assert (stats["ready"], stats["delayed"], stats["paused"]) == (1, 3, False)
    assert [q["queue"] for q in clean_host.rpc("stats")["queues"]] == ["mail"]
    assert clean_host.rpc("job", pushed["id"])["state"] == "ready"
    assert clean_host.rpc("cancel", batch["ids"][0]) == {"id": batch["ids"][0], "cancelled": True}
    with pytest.raises(RpcError, match="not_found"):
        clean_host.rpc("job", batch["ids"][0])
    with pytest.raises(RpcError, match="invalid: no job is registered"):
        clean_host.rpc("dispatch", "mail", {"name": "nope"})
    with pytest.raises(RpcError, match="invalid_queue"):
        clean_host.rpc("dispatch", "bad queue", {"name": "example.echo"})
    with pytest.raises(RpcError, match="not_found"):
        clean_host.rpc("retry_failed", "nope")


def test_workflow_rpc_methods_as_a_js_worker_calls_them(clean_host: Host) -> None:
    """Dependencies, batches, additions, the completed page and a job's
    states over RPC, and the same batch read over HTTP, in the real Worker
    (which keeps completed jobs by default)."""
    h = clean_host
    first = h.rpc("dispatch", "wf", {"name": "example.echo", "payload": 1})
    waiter = h.rpc("dispatch_job", {"name": "example.echo", "queue": "wf", "after": [first["id"]]})
    assert h.rpc("job", waiter["id"])["state"] == "waiting"
    assert h.rpc("job", first["id"])["dependents"] == [waiter["id"]]
    with pytest.raises(RpcError, match="unknown_dependency"):
        h.rpc("dispatch", "wf", {"name": "example.echo", "after": ["0" * 32]})
    made = h.rpc(
        "batch",
        {
            "jobs": [{"name": "example.echo", "queue": "wf", "payload": i} for i in range(3)],
            "on_finish": {"name": "example.echo", "queue": "wf", "payload": "done"},
        },
    )
    assert len(made["ids"]) == 3
    added = h.rpc("add_to_batch", made["batch"], [{"name": "example.echo", "queue": "wf"}])
    assert len(added["ids"]) == 1
    state = h.rpc("batch_state", made["batch"])
    assert (state["total"], state["state"]) == (4, "running")
    assert h.api("GET", f"/v1/batches/{made['batch']}").json() == state
    for _ in range(3):
        h.scheduled()
    state = h.rpc("batch_state", made["batch"])
    assert (state["completed"], state["state"]) == (4, "succeeded"), state
    with pytest.raises(RpcError, match="batch_not_running"):
        h.rpc("add_to_batch", made["batch"], [{"name": "example.echo"}])
    assert h.rpc("job", waiter["id"])["state"] == "completed"
    page = h.rpc("completed", "wf", 100)
    ids = {j["id"] for j in page["jobs"]}
    assert {first["id"], waiter["id"], f"{made['batch']}:on_finish"} <= ids
    assert len(ids) == 7 and page["next_cursor"] is None
    assert h.rpc("limits", "wf")["source"] == "none"
    assert h.rpc("set_limits", "wf", {"concurrency": 2})["limits"]["concurrency"] == 2


def test_a_push_by_name_and_what_a_push_says_about_its_queue(clean_host: Host) -> None:
    """In the real Worker (wrangler.toml drains "*", every queue): a push by
    name alone lands on the job's registered queue, over HTTP and RPC; a push
    to a queue of the caller's own name is drained; a push to a paused queue
    says so. (A queue an explicit D1QUEUE_QUEUES leaves out: tests/test_api.py.)"""
    h = clean_host
    by_http = h.api("POST", "/v1/jobs", {"name": "example.echo", "payload": 1})
    assert by_http.status == 201, by_http.text
    assert by_http.json()["queue"] == "default" and by_http.json()["warnings"] == []
    by_rpc = h.rpc("dispatch_job", {"name": "example.echo", "payload": 2, "queue": "side"})
    assert (by_rpc["queue"], by_rpc["runs_here"], by_rpc["paused"]) == ("side", True, False)
    assert by_rpc["drained"] is True, "the older name stays in RPC answers"
    assert by_rpc["warnings"] == []
    assert h.api("POST", "/v1/queues/default/pause").status == 200
    paused = h.api("POST", "/v1/queues/default/jobs", {"name": "example.echo"}).json()
    assert (paused["paused"], paused["runs_here"]) == (True, True)
    assert "paused" in paused["warnings"][0]
    assert h.api("POST", "/v1/jobs", {"name": "example.echo", "queue": "a b"}).status == 422
    assert h.rpc("stats", "default")["ready"] == 2 and h.rpc("stats", "side")["ready"] == 1


def test_a_job_on_a_queue_of_the_callers_own_name_runs(clean_host: Host) -> None:
    """With the shipped configuration (D1QUEUE_QUEUES = "*"), the cron drains
    every queue holding jobs: nothing to declare for a new queue. Two queues
    run in one round."""
    since = len(clean_host.output())
    ids = []
    for queue, i in (("acc-3f9e2", 1), ("default", 2)):
        reply = clean_host.api(
            "POST", f"/v1/queues/{queue}/jobs", {"name": "example.echo", "payload": {"i": i}}
        )
        assert reply.status == 201 and reply.json()["runs_here"] is True
        ids.append(reply.json()["id"])
    clean_host.scheduled()
    (report,) = wait_reports(clean_host, since, 1)
    assert (report["claimed"], report["completed"], report["rounds"]) == (2, 2, 1)
    assert echo_runs(clean_host.output()[since:]) == Counter(ids)
    assert all(clean_host.api("GET", f"/v1/jobs/{i}").json()["state"] == "completed" for i in ids)


def test_api_over_http_errors_and_nothing_written(clean_host: Host) -> None:
    h = clean_host
    assert h.api("GET", "/v1/queues", token=None).status == 401
    assert h.api("GET", "/v1/queues", token="wrong").status == 401
    bad = h.request(
        "POST",
        "/v1/queues/q/jobs",
        body="{nope",
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    assert bad.status == 400 and bad.json()["error"]["code"] == "malformed_json"
    assert h.api("POST", "/v1/queues/q/jobs", {"name": "nope"}).status == 422
    assert (
        h.api(
            "POST", "/v1/queues/q/jobs", {"name": "example.echo", "payload": "x" * 200_000}
        ).status
        == 413
    )
    big = h.request(
        "POST",
        "/v1/queues/q/jobs",
        body=" " * (1024 * 1024 + 1),
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    assert big.status == 413
    assert (
        h.api(
            "POST", "/v1/queues/q/jobs/batch", {"jobs": [{"name": "example.echo"}, {"name": "x"}]}
        ).status
        == 422
    )
    assert h.api("GET", "/v1/queues").json() == {"queues": []}, "nothing was written"
    doc = h.api("GET", "/v1/openapi.json").json()
    assert doc["openapi"] == "3.1.0"


def test_http_request_job_through_the_workers_fetch(clean_host: Host, server: Server) -> None:
    server.script["/ok"] = [(200, {}, "fine", 0)]
    server.script["/flaky"] = [(503, {"Retry-After": "0"}, "busy", 0), (200, {}, "ok", 0)]
    server.script["/gone"] = [(404, {}, "no such hook", 0)]
    server.script["/slow"] = [(200, {}, "late", 3.0)]
    push = lambda path, **kw: clean_host.api(  # noqa: E731
        "POST",
        "/v1/queues/default/jobs",
        {"name": "http.request", "payload": {"url": server.url + path, **kw}},
    ).json()["id"]
    ok = push("/ok", body={"hello": "world"}, headers={"x-k": "v"})
    flaky = push("/flaky")
    gone = push("/gone")
    slow = push("/slow", timeout_s=0.5)
    clean_host.scheduled()
    ok_state = clean_host.api("GET", f"/v1/jobs/{ok}").json()
    assert ok_state["state"] == "completed", "delivered and acknowledged"
    assert ok_state["result"]["status"] == 200
    assert ("POST", "/ok", '{"hello": "world"}', "v") in server.seen
    f = clean_host.api("GET", f"/v1/jobs/{flaky}").json()
    assert f["state"] == "ready" and "answered 503: busy" in f["last_error"]
    g = clean_host.api("GET", f"/v1/jobs/{gone}").json()
    assert g["state"] == "failed" and "answered 404: no such hook" in g["error"]
    s = clean_host.api("GET", f"/v1/jobs/{slow}").json()
    assert s["state"] in ("ready", "delayed") and "no response within 0.5s" in s["last_error"]
    clean_host.scheduled()  # Retry-After: 0, so the 503 job is due again
    assert clean_host.api("GET", f"/v1/jobs/{flaky}").json()["state"] == "completed"
    assert sum(1 for m, p, *_ in server.seen if p == "/ok") == 1, "delivered exactly once"


@pytest.fixture(scope="module")
def push_host() -> Iterator[Host]:
    h = start_host("--var", "D1QUEUE_DRAIN_ON_PUSH=true")
    yield h
    h.stop()


def test_drain_on_push_runs_the_job_without_waiting_for_cron(push_host: Host) -> None:
    push_host.reset()
    since = len(push_host.output())
    reply = push_host.api(
        "POST", "/v1/queues/default/jobs", {"name": "example.echo", "payload": {"i": 5}}
    )
    assert reply.status == 201
    push_host.idle()
    (report,) = wait_reports(push_host, since, 1)
    assert echo_runs(push_host.output()[since:]) == Counter([reply.json()["id"]])
    assert report["trigger"] == "push" and report["queries"] <= 10


def test_a_mistyped_setting_fails_loudly() -> None:
    h = start_host("--var", "D1QUEUE_BATCHSIZE=10")
    try:
        reply = h.get("/__scheduled?cron=*+*+*+*+*")
        assert reply.status == 500
        h.wait_for_output("unknown setting D1QUEUE_BATCHSIZE")
        api = h.api("GET", "/v1/queues")
        assert api.status == 500 and api.json()["error"]["code"] == "misconfigured"
    finally:
        h.stop()


def test_the_entrypoint_defines_every_handler_and_rpc_method_itself(host: Host) -> None:
    """workerd offers callers only the methods a Worker's class defines in its
    own __dict__ (introspection.py collect_methods), not its bases': the
    class d1queue_entrypoint makes, and Default below it, have them all."""
    names = host.python(
        """
        async def main(env):
            from d1queue.interfaces.cloudflare import _RPC_METHODS, _HANDLERS
            own = vars(type(worker))
            return [n for n in (*_HANDLERS, *_RPC_METHODS) if not callable(own.get(n))]
        """
    )
    assert names == []
