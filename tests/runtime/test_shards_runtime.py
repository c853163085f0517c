"""Shards in the real Worker: the host serves a config with two D1 databases
(tools/shard_config.py: DB and DB_1, D1QUEUE_SHARDS = "DB,DB_1"), each a
Miniflare D1 of its own with the migrations applied.

With two shards, queue `mail` hashes to shard 0 and `reports` (and
`default`) to shard 1 (CRC-32 mod 2). Checked from the API, the Worker's
output and each database: pushes land on their queue's shard with ids that
say so, lookups and cancels find them, stats add up both, one cron run
drains both shards within the free plan's 50 subrequests, and a wake-up
names the shard its push wrote to and its consumer drains that shard."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from tools.shard_config import write as write_shards_config

from .conftest import ROOT, Host, echo_runs, start_host

SHARDS = ("DB", "DB_1")


def shards_args(*extra: str, wake: bool = False) -> tuple[str, ...]:
    name = f"wrangler.shards-test{'-wake' if wake else ''}.toml"
    config = write_shards_config(ROOT, len(SHARDS), wake=wake, name=name)
    return ("--config", str(config), *extra)


@pytest.fixture(scope="module")
def shard_host() -> Iterator[Host]:
    h = start_host(*shards_args())
    yield h
    h.stop()


@pytest.fixture(scope="module")
def shard_wake_host() -> Iterator[Host]:
    h = start_host(*shards_args("--var", "D1QUEUE_WAKE_MAX=1", wake=True))
    yield h
    h.stop()


def reset(host: Host) -> None:
    """Empty every shard's tables."""
    host.python(
        f"""
        async def main(env):
            for name in {list(SHARDS)!r}:
                db = getattr(env, name)
                for table in ("d1queue_jobs", "d1queue_failed_jobs", "d1queue_queues",
                              "d1queue_stats"):
                    await db.prepare(f"DELETE FROM {{table}}").run()
                await db.prepare("DELETE FROM d1queue_schedules WHERE source = 'api'").run()
        """
    )


@pytest.fixture
def host(shard_host: Host) -> Host:
    reset(shard_host)
    return shard_host


def rows(host: Host) -> dict[str, list[str]]:
    """Each shard's live job ids (completed ones kept as history aside), by
    binding."""
    answer: dict[str, list[str]] = host.python(
        f"""
        async def main(env):
            out = {{}}
            for name in {list(SHARDS)!r}:
                db = getattr(env, name)
                r = await db.prepare(
                    "SELECT id FROM d1queue_jobs WHERE band != -1004 ORDER BY id"
                ).all()
                out[name] = [row.id for row in r.results]
            return out
        """
    )
    return answer


def push(host: Host, w: str, queue: str) -> str:
    reply = host.api(
        "POST", f"/v1/queues/{queue}/jobs", {"name": "example.echo", "payload": {"w": w}}
    )
    assert reply.status == 201, reply.text
    job_id: str = reply.json()["id"]
    return job_id


def runs(host: Host, since: int = 0) -> Counter[str]:
    """example.echo's runs since output line `since`, by job id."""
    return echo_runs(host.output()[since:])


def lines(host: Host, event: str, since: int = 0) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in host.output()[since:]
        if line.startswith("{") and f'"{event}"' in line
    ]


def test_pushes_land_on_their_queues_shard_and_lookups_find_them(host: Host) -> None:
    mail = push(host, "m", "mail")
    reports = push(host, "r", "reports")
    assert len(mail) == 32 and reports.startswith("s1-")
    assert rows(host) == {"DB": [mail], "DB_1": [reports]}
    for job_id, queue in ((mail, "mail"), (reports, "reports")):
        got = host.api("GET", f"/v1/jobs/{job_id}")
        assert got.status == 200 and got.json()["queue"] == queue
    assert host.rpc("job", reports)["id"] == reports
    stats = {s["queue"]: s["ready"] for s in host.api("GET", "/v1/queues").json()["queues"]}
    assert stats == {"mail": 1, "reports": 1}
    assert {s["queue"] for s in host.rpc("stats")["queues"]} == {"mail", "reports"}
    # A partition key puts a job of `mail` on shard 1; an id naming a shard
    # this Worker lacks is not found; a bad partition writes nothing.
    hot = host.api("POST", "/v1/queues/mail/jobs", {"name": "example.echo", "partition": "reports"})
    assert hot.status == 201 and hot.json()["id"].startswith("s1-")
    assert host.api("GET", f"/v1/jobs/s7-{mail}").status == 404
    bad = host.api("POST", "/v1/queues/mail/jobs", {"name": "example.echo", "partition": 5})
    assert bad.status == 422
    assert host.api("DELETE", f"/v1/jobs/{reports}").json() == {"id": reports, "cancelled": True}
    assert rows(host) == {"DB": [mail], "DB_1": [hot.json()["id"]]}
    paused = host.api("POST", "/v1/queues/reports/pause").json()
    assert paused["paused"] is True
    states = host.python(
        """
        async def main(env):
            out = []
            for db in (env.DB, env.DB_1):
                sql = "SELECT paused FROM d1queue_queues WHERE name = 'reports'"
                r = await db.prepare(sql).all()
                out.append([row.paused for row in r.results])
            return out
        """
    )
    assert states == [[1], [1]], "a pause is written on every shard"


def test_one_cron_run_drains_both_shards_within_the_free_plans_subrequests(host: Host) -> None:
    start = len(host.output())
    ids = []
    for i in range(2):
        ids += [push(host, f"m{i}", "mail"), push(host, f"r{i}", "reports")]
    host.scheduled()
    assert runs(host, start) == Counter(ids), "each job once"
    assert rows(host) == {"DB": [], "DB_1": []}
    drained = [x for x in lines(host, "d1queue.drain", start) if x["trigger"].startswith("cron")]
    assert sorted(x["shard"] for x in drained) == [0, 1]
    assert {x["shard"]: x["completed"] for x in drained} == {0: 2, 1: 2}
    (run,) = [x for x in lines(host, "d1queue.invocation", start) if x["kind"] == "scheduled"]
    assert run["outcome"] == "ok" and run["subrequests"] <= 50
    # Each shard's drain recorded its own counters (the dashboard adds them).
    counted = host.python(
        """
        async def main(env):
            out = []
            for db in (env.DB, env.DB_1):
                r = await db.prepare("SELECT SUM(completed) AS n FROM d1queue_stats").all()
                out.append(r.results[0].n)
            return out
        """
    )
    assert counted == [2, 2]


def test_a_wake_up_names_its_shard_and_the_consumer_drains_that_shard(
    shard_wake_host: Host,
) -> None:
    host = shard_wake_host
    reset(host)
    start = len(host.output())
    job_id = push(host, "woken", "reports")
    assert job_id.startswith("s1-")
    deadline = time.monotonic() + 30

    def consumers() -> list[dict[str, Any]]:
        return [x for x in lines(host, "d1queue.drain", start) if "wake" in x]

    while runs(host, start)[job_id] < 1 or not consumers():
        assert time.monotonic() < deadline, "\n".join(host.output()[-40:])
        time.sleep(0.05)
    assert consumers()[0]["wake"]["shards"] == {"1": ["reports"]}
    assert consumers()[0]["claimed"] == 1
    kinds = Counter(x["kind"] for x in lines(host, "d1queue.invocation", start))
    assert kinds["scheduled"] == 0, "no cron ran"
    mail_id = push(host, "mail-woken", "mail")
    while {"0": ["mail"]} not in [x["wake"]["shards"] for x in consumers()]:
        assert time.monotonic() < deadline, "\n".join(host.output()[-40:])
        time.sleep(0.05)
    assert runs(host, start) == Counter([job_id, mail_id]), "each job once"
    # Each answered by its own shard, kept there as completed.
    assert host.api("GET", f"/v1/jobs/{mail_id}").json()["state"] == "completed"
    assert host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "completed"


def test_drain_on_push_drains_the_shard_it_pushed_to() -> None:
    host = start_host(*shards_args("--var", "D1QUEUE_DRAIN_ON_PUSH=true"))
    try:
        start = len(host.output())
        job_id = push(host, "pushed", "reports")
        host.idle()
        assert runs(host, start) == Counter([job_id])
        (line,) = [x for x in lines(host, "d1queue.drain", start) if x["trigger"] == "push"]
        assert (line["shard"], line["completed"]) == (1, 1)
        assert host.api("GET", f"/v1/jobs/{job_id}").json()["state"] == "completed"
    finally:
        host.stop()
