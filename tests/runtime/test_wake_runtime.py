"""Wake-ups through Cloudflare Queues in the real Worker: the host runs
Miniflare's own Queues (relay.mjs, queues.mjs) for wrangler.toml's wake block
turned on (tools/wake_config.py), and the Worker's `queue()` consumes them.
No cron runs in these hosts unless a test calls one.

Checked from the Worker's output (example.echo logs each run's job id) and D1:
a push wakes a consumer that runs the job; a batch push sends one message;
duplicated messages run no job twice; a lost wake-up (a failed send) leaves
the job to the cron; a backlog fans out over more consumers; a consumer
killed mid-batch loses nothing; the driver contract holds on this host."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tools.wake_config import write as write_wake_config

from ..contract import CASES
from .conftest import ROOT, Host, echo_runs, start_host
from .test_chaos_runtime import age_leases
from .test_contract_runtime import run_case

WAKE_VARS = ("--var", "D1QUEUE_WAKE_PER_JOBS=5", "--var", "D1QUEUE_WAKE_MAX=2")
"""The free plan's 5 jobs per run (wrangler.toml's D1QUEUE_PLAN), one more
consumer per 5 due jobs, at most 2 per consumer: a 30-job backlog fans out."""
QUIET_S = 2.5
"""Longer than the consumer's max_batch_timeout (0 s) and a drain: after it
with nothing printed, no delivery is on its way."""


def wake_args(*extra: str) -> tuple[str, ...]:
    return ("--config", str(write_wake_config(ROOT)), *WAKE_VARS, *extra)


@pytest.fixture(scope="module")
def wake_host() -> Iterator[Host]:
    h = start_host(*wake_args())
    yield h
    h.stop()


@pytest.fixture
def clean_wake_host(wake_host: Host) -> Host:
    wait_quiet(wake_host)
    wake_host.reset()
    return wake_host


def runs(host: Host, since: int = 0) -> Counter[str]:
    """example.echo's runs since output line `since`, by job id."""
    return echo_runs(host.output()[since:])


def lines(host: Host, event: str, since: int = 0) -> list[dict[str, Any]]:
    found = []
    for line in host.output()[since:]:
        if line.startswith("{") and f'"{event}"' in line:
            found.append(json.loads(line))
    return found


def wait_runs(host: Host, want: set[str], since: int, timeout: float = 30.0) -> Counter[str]:
    """Wait until every job id in `want` has run at least once."""
    deadline = time.monotonic() + timeout
    while not want <= set(runs(host, since)):
        if time.monotonic() > deadline:
            missing = sorted(want - set(runs(host, since)))
            raise AssertionError(
                f"never ran: {missing[:10]} ({len(missing)})\n" + "\n".join(host.output()[-40:])
            )
        time.sleep(0.05)
    return runs(host, since)


def wait_quiet(host: Host) -> None:
    """Until the host has printed nothing for QUIET_S (no delivery running)."""
    seen, since = len(host.output()), time.monotonic()
    while time.monotonic() - since < QUIET_S:
        time.sleep(0.1)
        if len(host.output()) != seen:
            seen, since = len(host.output()), time.monotonic()


def queue_sends(host: Host, fail_sends: int | None = None) -> dict[str, int]:
    body = None if fail_sends is None else json.dumps({"fail_sends": fail_sends})
    reply = host.request("POST" if body else "GET", "/__test/queue-faults", body=body)
    assert reply.status == 200, reply.text
    answer: dict[str, int] = reply.json()
    return answer


def push_batch(host: Host, jobs: list[dict[str, Any]], queue: str = "default") -> list[str]:
    """Push `jobs` in one batch call; their ids, in order."""
    reply = host.api("POST", f"/v1/queues/{queue}/jobs/batch", {"jobs": jobs})
    assert reply.status == 201, reply.text
    ids: list[str] = reply.json()["ids"]
    assert len(set(ids)) == len(jobs)
    return ids


def push(host: Host, w: str, queue: str = "default") -> str:
    reply = host.api(
        "POST", f"/v1/queues/{queue}/jobs", {"name": "example.echo", "payload": {"w": w}}
    )
    assert reply.status == 201, reply.text
    job_id: str = reply.json()["id"]
    return job_id


def test_a_push_wakes_a_consumer_that_runs_the_job_without_a_cron(clean_wake_host: Host) -> None:
    host = clean_wake_host
    start, sends = len(host.output()), queue_sends(host)["sends"]
    job_id = push(host, "http")
    assert wait_runs(host, {job_id}, start) == Counter([job_id])
    assert queue_sends(host)["sends"] == sends + 1, "one message for one push"
    wait_quiet(host)
    assert host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "completed"
    kinds = Counter(line["kind"] for line in lines(host, "d1queue.invocation", start))
    assert kinds["scheduled"] == 0 and kinds["queue"] >= 1
    push_line = next(x for x in lines(host, "d1queue.invocation", start) if x["kind"] == "fetch")
    assert push_line["subrequests"] == 2, "the push's D1 batch and its one queue send"
    drained = [
        x for x in lines(host, "d1queue.drain", start) if x["trigger"] == "queue d1queue-wake"
    ]
    assert drained and drained[0]["wake"]["queues"] == ["default"]


def test_a_batch_push_and_an_rpc_push_send_one_message_each(clean_wake_host: Host) -> None:
    host = clean_wake_host
    start, sends = len(host.output()), queue_sends(host)["sends"]
    jobs = [{"name": "example.echo", "payload": {"w": f"b{i}"}} for i in range(10)]
    batch = push_batch(host, jobs)
    rpc = host.rpc("dispatch", "default", {"name": "example.echo", "payload": {"w": "rpc"}})
    want = {*batch, rpc["id"]}
    assert len(want) == 11
    assert set(wait_runs(host, want, start)) == want
    wait_quiet(host)
    assert runs(host, start) == Counter(want), "each job once"
    # Two pushes: two send calls; each consumer left with a backlog (10 jobs
    # over the free plan's 5 per run) made one sendBatch call of its own.
    fanned = [x for x in lines(host, "d1queue.drain", start) if x.get("wake", {}).get("follow_ups")]
    assert queue_sends(host)["sends"] - sends == 2 + len(fanned)


def test_duplicated_wake_messages_run_no_job_twice(clean_wake_host: Host) -> None:
    host = clean_wake_host
    start = len(host.output())
    jobs = [{"name": "example.echo", "payload": {"w": f"d{i}"}} for i in range(20)]
    want = set(push_batch(host, jobs))
    # The same wake-up delivered again and again (at least once), through the
    # real producer binding, while the first consumer may still be draining.
    host.python(
        """
        async def main(env):
            for _ in range(3):
                await env.WAKE.send({"shard": 0, "queue": "default"})
            await env.WAKE.sendBatch([{"body": {"shard": 0, "queue": "default"}}] * 5)
        """
    )
    wait_runs(host, want, start)
    wait_quiet(host)
    assert runs(host, start) == Counter(want), "every job exactly once"
    consumers = [x for x in lines(host, "d1queue.drain", start) if "wake" in x]
    assert sum(x["wake"]["messages"] for x in consumers) >= 9


def test_a_lost_wake_up_leaves_the_job_to_the_cron(clean_wake_host: Host) -> None:
    host = clean_wake_host
    start = len(host.output())
    queue_sends(host, fail_sends=1)
    job_id = push(host, "lost")  # the send fails: the push still succeeds
    host.wait_for_output('"event":"d1queue.wake"', since=start)
    (logged,) = lines(host, "d1queue.wake", start)
    assert logged["sent"] == 0 and "Queue send failed" in logged["error"]
    wait_quiet(host)
    assert runs(host, start) == Counter(), "no consumer was woken"
    assert host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "ready"
    host.scheduled()  # the safety net
    assert runs(host, start) == Counter([job_id])
    assert host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "completed"


def test_a_backlog_fans_out_over_more_consumers(clean_wake_host: Host) -> None:
    host = clean_wake_host
    start = len(host.output())
    jobs = [{"name": "example.echo", "payload": {"w": f"f{i}"}} for i in range(30)]
    want = set(push_batch(host, jobs))
    wait_runs(host, want, start)
    wait_quiet(host)
    assert runs(host, start) == Counter(want)
    consumers = [x for x in lines(host, "d1queue.drain", start) if "wake" in x]
    assert all(x["claimed"] <= 5 for x in consumers), "the free plan's 5 jobs per run"
    assert len(consumers) >= 6, "30 jobs, 5 a consumer: one push message fanned out"
    assert max(x["wake"]["follow_ups"] for x in consumers) == 2, "D1QUEUE_WAKE_MAX"
    kinds = Counter(y["kind"] for y in lines(host, "d1queue.invocation", start))
    assert kinds["scheduled"] == 0, "no cron ran"


def test_consumer_lanes_deliver_batches_side_by_side_under_the_queues_own_name() -> None:
    """--consumer-lanes 3 (the host's stand-in for Cloudflare running several
    consumer invocations at once, which Miniflare alone does not): three
    push calls' messages go out on three lanes, so three batches of one are
    delivered (one lane would fold them into one batch), each named by the
    queue's own name, and each job runs once."""
    host = start_host(*wake_args("--consumer-lanes", "3"))
    try:
        start = len(host.output())
        ids = {push(host, w) for w in ("l0", "l1", "l2")}
        wait_runs(host, ids, start)
        wait_quiet(host)
        assert runs(host, start) == Counter(ids)
        consumers = [x for x in lines(host, "d1queue.drain", start) if "wake" in x]
        assert [x["wake"]["messages"] for x in consumers] == [1, 1, 1]
        assert {x["trigger"] for x in consumers} == {"queue d1queue-wake"}
    finally:
        host.stop()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_driver_contract_holds_with_the_transport_on(wake_host: Host, case: str) -> None:
    wait_quiet(wake_host)
    run_case(wake_host, case)


def test_a_consumer_killed_mid_batch_loses_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    # D1 latency, so the consumers are mid-drain when the host dies.
    first = start_host(*wake_args("--d1-latency-ms", "150"), persist_to=state, own_group=True)
    try:
        jobs = [{"name": "example.echo", "payload": {"w": f"k{i}"}} for i in range(30)]
        pushed = set(push_batch(first, jobs))
        first.wait_for_output('"event":"example.echo"', timeout=30)
        first.kill()  # SIGKILL: Node, Miniflare's workerd, its Queues and the consumer
    finally:
        first.stop()
    killed = runs(first)
    assert sum(killed.values()) < 30, "killed before the backlog was done"

    second = start_host(*wake_args(), persist_to=state)
    try:
        held = age_leases(second)  # as waiting out the dead consumer's leases would
        for _ in range(12):  # the cron (5 jobs a run on the free plan)
            second.scheduled()
            left = second.python(
                """
                async def main(env):
                    r = await env.DB.prepare("SELECT COUNT(*) AS n FROM d1queue_jobs").first()
                    return r["n"]
                """
            )
            if left == 0:
                break
        wait_quiet(second)
        total = runs(first) + runs(second)
        assert set(total) == pushed, "no job lost"
        # A job runs twice only if the killed host ran it and died before
        # settling it (its lease was held, then aged).
        twice = {job_id for job_id, n in total.items() if n > 1}
        assert twice <= set(killed) and len(twice) <= held
        failed = second.api("GET", "/v1/failed").json()["jobs"]
        assert failed == []
    finally:
        second.stop()
