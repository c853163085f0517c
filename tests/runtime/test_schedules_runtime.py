"""Recurring schedules in the real Worker (Pyodide, the workers SDK,
Miniflare's D1), through its cron handler: zone data in the upload, a
schedule created over HTTP and RPC, racing cron runs delivering each slot
once, and what a cron run costs D1."""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid
from collections import Counter
from typing import Any

import pytest

from .conftest import Host, echo_lines
from .test_worker import drain_reports, wait_reports

METRICS_CRON_READ = 30
"""Rows the job metrics' rollup and prune read in the cron's read batch
with nothing to roll or prune (the walks of an empty or idle metrics
table, the cursor; docs/operations.md "Job metrics"): a run with none due
read 48 rows with them, against the bound of 26 kept from before them."""

MINUTE = 60_000


@pytest.fixture
def fresh(clean_host: Host) -> Host:
    clean_host.python(
        """
        async def main(env):
            await env.DB.prepare("DELETE FROM d1queue_schedules").run()
        """
    )
    return clean_host


def fire(host: Host, at_ms: int, n: int = 1) -> None:
    """`n` cron runs at once, each told the trigger fired at `at_ms` (the
    host's `time` parameter: controller.scheduledTime). The Worker evaluates
    schedules at the later of its clock and that time, so a test can stand
    at a slot without waiting for it."""
    path = "/__scheduled?cron=" + urllib.parse.quote("* * * * *") + f"&time={at_ms}"
    errors: list[str] = []

    def one() -> None:
        reply = host.get(path)
        if reply.status != 200:
            errors.append(reply.text)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    host.idle()
    assert not errors, errors


def wait_echoes(host: Host, since: int, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """example.echo's run lines since output line `since`, once there are
    `n` (the Worker's lines may arrive after the HTTP reply ending its run)."""
    deadline = time.monotonic() + timeout
    while len(found := echo_lines(host.output()[since:])) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def test_the_upload_carries_the_zone_database(host: Host) -> None:
    """Pyodide has no /usr/share/zoneinfo: the vendored tzdata package is
    what makes IANA zones work in the Worker."""
    answer = host.python(
        """
        async def main(env):
            import tzdata
            from zoneinfo import ZoneInfo
            from datetime import datetime, timezone
            at = datetime(2026, 7, 1, 12, tzinfo=timezone.utc)
            return [str(at.astimezone(ZoneInfo(z)).utcoffset()) for z in
                    ("Europe/Berlin", "America/New_York", "Asia/Kolkata")]
        """
    )
    assert answer == ["2:00:00", "-1 day, 20:00:00", "5:30:00"]


def test_racing_cron_runs_deliver_each_slot_of_an_http_schedule_once(fresh: Host) -> None:
    marker = uuid.uuid4().hex
    reply = fresh.api(
        "POST",
        "/v1/schedules",
        {
            "id": "rt.minutely",
            "cron": "* * * * *",
            "name": "example.echo",
            "payload": {"marker": marker},
        },
    )
    assert reply.status == 201, reply.text
    first = reply.json()["next_run_at"]
    assert first % MINUTE == 0
    same = fresh.api(
        "POST",
        "/v1/schedules",
        {
            "id": "rt.minutely",
            "cron": "* * * * *",
            "name": "example.echo",
            "payload": {"marker": marker},
        },
    )
    assert same.status == 200, "the same id replaces"
    since = len(fresh.output())
    slots = [first + k * MINUTE for k in range(3)]
    for i, slot in enumerate(slots):
        fire(fresh, slot + 400, n=8)
        reports = wait_reports(fresh, since, 8 * (i + 1))
    enqueued = Counter[int]()
    for r in reports:
        assert not r["schedules"]["error"], r["schedules"]
        assert r["schedules"]["queries"] <= 2
        enqueued[r["schedules"]["enqueued"]] += 1
    assert enqueued == Counter({1: 3, 0: 21}), "one run of eight enqueued each slot"
    assert sum(r["completed"] for r in reports) == 3, "and each started in its own run"
    # The schedule is the only source of jobs here (`fresh`: no job, no other
    # schedule): every echo run since is one of its slots' jobs.
    ran = wait_echoes(fresh, since, 3)
    assert len({x["id"] for x in ran}) == len(ran) == 3, f"three jobs, each run once: {ran}"
    assert all((x["queue"], x["attempt"]) == ("default", 1) for x in ran), ran
    assert not [line for line in fresh.output()[since:] if marker in line], "payload logged"
    got = fresh.api("GET", "/v1/schedules/rt.minutely").json()
    assert (got["last_run_at"], got["next_run_at"]) == (slots[-1], slots[-1] + MINUTE)


def test_a_paused_schedule_enqueues_nothing_until_resumed(fresh: Host) -> None:
    reply = fresh.api(
        "POST", "/v1/schedules", {"id": "rt.p", "cron": "* * * * *", "name": "example.echo"}
    )
    slot = reply.json()["next_run_at"]
    assert fresh.api("POST", "/v1/schedules/rt.p/pause").json()["paused"] is True
    since = len(fresh.output())
    fire(fresh, slot + 400)
    (report,) = wait_reports(fresh, since, 1)
    assert (report["schedules"]["due"], report["schedules"]["enqueued"]) == (0, 0)
    assert fresh.api("POST", "/v1/schedules/rt.p/resume").json()["paused"] is False
    assert fresh.api("DELETE", "/v1/schedules/rt.p").json() == {"id": "rt.p", "deleted": True}


def test_schedules_over_rpc_and_the_422s_that_say_which(fresh: Host) -> None:
    made = fresh.rpc(
        "put_schedule",
        {"id": "rt.rpc", "cron": "@daily", "name": "example.echo", "tz": "Europe/Berlin"},
    )
    assert made["created"] is True and made["tz"] == "Europe/Berlin"
    listed = fresh.rpc("schedules")
    assert [s["id"] for s in listed["schedules"]] == ["rt.rpc"]
    assert fresh.rpc("schedule", "rt.rpc")["cron"] == "@daily"
    for body, code in [
        ({"cron": "99 * * * *", "name": "example.echo"}, "invalid_cron"),
        ({"cron": "* * * * *", "name": "example.echo", "tz": "Nowhere/Land"}, "unknown_timezone"),
        ({"cron": "* * * * *", "name": "no.such.job"}, "unknown_job"),
    ]:
        reply = fresh.api("POST", "/v1/schedules", body)
        assert (reply.status, reply.json()["error"]["code"]) == (422, code), reply.text
    assert fresh.rpc("delete_schedule", "rt.rpc")["deleted"] is True


def schedules_report(host: Host, at_ms: int) -> dict[str, Any]:
    since = len(host.output())
    fire(host, at_ms)
    (report,) = wait_reports(host, since, 1)
    schedules: dict[str, Any] = report["schedules"]
    assert not schedules["error"], schedules
    return schedules


def test_a_cron_run_reads_the_due_schedules_only(fresh: Host) -> None:
    """Counted by Miniflare's D1: with 300 schedules none of which is due, a
    run is one query reading a row or two (and 3 more for the failed-job
    prune in the same batch, with nothing to prune, and 20 for the history
    prune's four statements: 7 each for the completed jobs and their edges,
    3 each for the finished batches); with one of them due, two queries,
    reading a few rows more."""
    at = fresh.python(
        """
        async def main(env):
            import time
            now = int(time.time() * 1000)
            minute = now - now % 60000 + 120000
            await env.DB.prepare(
                "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < 300) "
                "INSERT INTO d1queue_schedules (id, cron, tz, name, payload, source, version, "
                "next_run_at, created_at, updated_at) SELECT printf('rt.s%03d', i), "
                "'* * * * *', 'UTC', 'example.echo', 'null', 'api', 'v', "
                "CASE WHEN i = 1 THEN ?1 ELSE ?1 + 3600000 END, 0, 0 FROM k"
            ).bind(minute).run()
            return minute
        """
    )
    none_due = schedules_report(fresh, at - 30_000)
    assert (none_due["queries"], none_due["due"]) == (1, 0)
    assert none_due["rows_read"] <= 3 + 3 + 20 + METRICS_CRON_READ, none_due
    assert none_due["rows_written"] == 0
    one_due = schedules_report(fresh, at + 400)
    assert (one_due["queries"], one_due["due"], one_due["enqueued"]) == (2, 1, 1)
    assert one_due["rows_read"] <= 10 + 3 + 20 + METRICS_CRON_READ, one_due
    # The job (row, id index, unique index) and the schedule (row, due index).
    assert one_due["rows_written"] <= 6, one_due
    print("schedules: none due", none_due, "one due", one_due)
    assert drain_reports(fresh, 0)


def test_recording_a_schedules_last_runs_costs_the_cron_nothing(fresh: Host) -> None:
    """Counted by Miniflare's D1: the advance records the job it pushed in
    the schedule's last runs, and evaluating a schedule whose runs are full
    (10 kept, the oldest dropped) reads and writes what evaluating one with
    none recorded does, in as many queries (Schedules.run without the
    prunes that ride in the cron's read batch, so only the schedules'
    statements are counted)."""
    out = fresh.python(
        """
        from d1queue import D1Queue, Registry
        from d1queue.store.schedules import Schedules

        async def main(env):
            import json, time
            now = int(time.time() * 1000)
            minute = now - now % 60000 + 120000
            full = json.dumps([[minute - 60000 * i, f"old{i}"] for i in range(1, 11)])
            for id, at, runs in (("rt.full", minute, full), ("rt.none", minute + 60000, None)):
                await env.DB.prepare(
                    "INSERT INTO d1queue_schedules (id, cron, tz, name, payload, source, "
                    "version, next_run_at, created_at, updated_at, runs) VALUES "
                    "(?1, '0 0 1 1 *', 'UTC', 'example.echo', 'null', 'api', 'v', ?2, 0, 0, ?3)"
                ).bind(id, at, runs).run()
            reg = Registry()
            reports = []
            for at in (minute, minute + 60000):
                store = Schedules(D1Queue(env.DB, clock=lambda at=at: at + 400), reg)
                r = await store.run()
                reports.append([r.enqueued, r.queries, r.rows_read, r.rows_written, r.error])
            found = await env.DB.prepare("SELECT id, runs FROM d1queue_schedules ORDER BY id").all()
            return {"minute": minute, "reports": reports,
                    "runs": {r.id: json.loads(r.runs) for r in found.results}}
        """
    )
    full, none = out["reports"]
    assert full == none and full[0] == 1 and full[4] == "", out
    print("schedules: a run advancing one, its runs full and none recorded", full, none)
    at, kept = out["minute"], out["runs"]
    assert len(kept["rt.full"]) == 10 and kept["rt.full"][0][0] == at
    assert [r[1] for r in kept["rt.full"][1:]] == [f"old{i}" for i in range(1, 10)]
    assert len(kept["rt.none"]) == 1 and kept["rt.none"][0][0] == at + 60_000


def test_a_cron_run_prunes_old_failures_in_its_read_batch(fresh: Host) -> None:
    """Counted by Miniflare's D1: 15 failures older than the default 30 days
    and 3 younger ones. The free plan's cron prunes at most 10 a run, oldest
    first, with no query beyond the schedules' one read: rows written are
    the rows deleted, none with nothing left to prune. Rows read, besides
    the schedules' own: 4 a row pruned (its index entry, the IN list built
    and read, the row by its key), 3 with nothing to prune."""
    at = fresh.python(
        """
        async def main(env):
            import time
            now = int(time.time() * 1000)
            month = 30 * 86400 * 1000
            stmt = env.DB.prepare(
                "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, attempts, "
                "max_attempts, priority, created_at, failed_at) "
                "VALUES (?1, 'default', 'example.echo', 'null', 'boom', 1, 1, 0, ?2, ?2)"
            )
            await env.DB.batch(
                [stmt.bind(f"rt.old{i:02d}", now - month - 60000 - i) for i in range(15)]
                + [stmt.bind(f"rt.young{i}", now - 86400000) for i in range(3)]
            )
            return now
        """
    )

    def left() -> list[str]:
        return fresh.python(
            """
            async def main(env):
                found = await env.DB.prepare(
                    "SELECT id FROM d1queue_failed_jobs ORDER BY id"
                ).all()
                return [r.id for r in found.results]
            """
        )

    reports = [schedules_report(fresh, at + i * MINUTE) for i in range(3)]
    assert [r["pruned_failed"] for r in reports] == [10, 5, 0], reports
    assert all(r["queries"] == 1 and r["due"] == 0 for r in reports), reports
    assert [r["rows_written"] for r in reports] == [10, 5, 0], reports
    # + 20: the history prune's statements in the same batch, finding none;
    # and the job metrics' rollup and prune, likewise.
    assert reports[0]["rows_read"] <= 4 * 10 + 3 + 3 + 20 + METRICS_CRON_READ, reports[0]
    assert reports[2]["rows_read"] <= 3 + 3 + 20 + METRICS_CRON_READ, reports[2]
    assert left() == ["rt.young0", "rt.young1", "rt.young2"]
    print("prune: 10 / 5 / none", reports)
