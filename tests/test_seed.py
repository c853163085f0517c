"""The seed's tests (rainier-queue DatabaseQueue), translated one by one.

The seed checked the SQL its fake connection received; here the same
properties are checked against a real SQLite database, by behaviour first and
by the statement text where the seed's point was the statement itself.
"""

from __future__ import annotations

from d1queue import D1Queue, QueuedJob
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql

from .conftest import MIGRATIONS, Clock


def ping(**kw: object) -> QueuedJob:
    return QueuedJob.new("test.ping", None, at_ms=1_700_000_000_000, **kw)  # type: ignore[arg-type]


def test_the_row_entities_describe_their_tables(db: SqliteD1) -> None:
    tables = {r["name"] for r in db.query("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"d1queue_jobs", "d1queue_failed_jobs"} <= tables

    def key(table: str) -> list[str]:
        cols = [r for r in db.query(f"PRAGMA table_info({table})") if r["pk"]]
        return [r["name"] for r in sorted(cols, key=lambda r: r["pk"])]

    # The failed table by id; the queue in claim order, with ids unique by index.
    assert key("d1queue_failed_jobs") == ["id"]
    assert key("d1queue_jobs") == ["queue", "band", "available_at", "id"]
    (by_id,) = [r for r in db.query("PRAGMA index_list(d1queue_jobs)") if r["name"].endswith("_id")]
    assert by_id["unique"] == 1


def test_the_driver_ships_its_own_migrations() -> None:
    names = sorted(p.name for p in MIGRATIONS.glob("*.sql"))
    assert names == [
        "0001_init.sql",
        "0002_queue_state.sql",
        "0003_claim_order.sql",
        "0004_schedules.sql",
        "0005_stats.sql",
        "0006_fan_out.sql",
        "0007_locked_band.sql",
        "0008_dashboard_signouts.sql",
        "0009_flow_control.sql",
        "0010_workflows.sql",
        "0011_trace_context.sql",
        "0012_metrics.sql",
        "0013_attempt_history.sql",
        "0014_cancel.sql",
        "0015_audit.sql",
        "0016_schedule_runs.sql",
    ]
    fresh = SqliteD1()
    assert fresh.apply_migrations(MIGRATIONS) == names
    assert fresh.apply_migrations(MIGRATIONS) == [], "applying twice is a no-op"


async def test_a_queued_job_round_trips_through_a_row(queue: D1Queue) -> None:
    queued = QueuedJob.new("test.ping", {"to": "a@b.c", "n": [1, 2]}, queue="mail", at_ms=5)
    await queue.push(queued)
    back = await queue.job(queued.id)
    assert back is not None
    assert back.queue == "mail"
    assert back.name == "test.ping"
    assert back.reservation is None
    assert (back.id, back.payload, back.max_attempts) == (queued.id, queued.payload, 3)
    assert (back.available_at, back.created_at) == (5, 5)


async def test_pushing_writes_a_row(db: SqliteD1, queue: D1Queue) -> None:
    job_id = await queue.push(ping())
    assert db.statements[-1].startswith("INSERT INTO d1queue_jobs")
    assert [r["id"] for r in db.query("SELECT id FROM d1queue_jobs")] == [job_id]


async def test_reserving_selects_only_free_available_jobs(
    db: SqliteD1, queue: D1Queue, clock: Clock
) -> None:
    held = await queue.dispatch("test.ping")
    assert (await queue.reserve("default")).id == held  # type: ignore[union-attr]
    await queue.dispatch("test.ping", delay_s=60)
    await queue.dispatch("test.ping", queue="other")
    assert await queue.reserve("default") is None, "reserved, delayed or elsewhere"
    select = next(s for s in db.statements if s.startswith("SELECT"))
    # Held (and retrying) jobs wait in the locked band, read only up to now.
    assert f"band = {sql.LOCKED_BAND} AND available_at <= ?2" in select
    assert "available_at <=" in select
    assert "ORDER BY" in select
    clock.advance(60)
    assert await queue.reserve("default") is not None, "the delay has passed"


async def test_a_claim_is_conditional_on_the_job_still_being_free(
    db: SqliteD1, queue: D1Queue
) -> None:
    # The race guard: the UPDATE finds the row only at the key it was read at,
    # with the attempts read; the claim moves the row, so two workers cannot
    # both believe they claimed the job.
    await queue.push(ping())
    row = db.query("SELECT id, attempts, band, available_at FROM d1queue_jobs")[0]
    assert await queue.reserve("default") is not None
    update = next(s for s in db.statements if s.startswith("UPDATE"))
    assert "band = ?7 AND available_at = ?8 AND id = ?4 AND attempts = ?5" in update
    # And the guard holds: an UPDATE for the now-reserved row changes nothing.
    again = (
        await db.prepare(update)
        .bind(1, 2, "x", row["id"], row["attempts"], "default", row["band"], row["available_at"])
        .run()
    )
    assert again["meta"]["changes"] == 0


async def test_losing_the_claim_race_yields_no_job(shared_file, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    # Two workers read the same single candidate; `changes == 0` tells the
    # loser another worker got there first.
    a = D1Queue(SqliteD1(shared_file), clock=clock)
    b = D1Queue(SqliteD1(shared_file), clock=clock)
    await a.push(ping())
    import asyncio

    got = await asyncio.gather(a.reserve("default"), b.reserve("default"))
    assert sum(j is not None for j in got) == 1
    sqls = a.binding.db.statements + b.binding.db.statements
    # Both read the candidate; the loser reads again and finds the queue empty.
    assert sum(s.startswith("SELECT") for s in sqls) == 3
    assert sum(s.startswith("UPDATE") for s in sqls) == 2, "both tried to claim it"


async def test_a_reserved_job_reports_the_attempt_the_row_now_holds(
    db: SqliteD1, queue: D1Queue
) -> None:
    await queue.push(ping())
    reserved = await queue.reserve("default")
    assert reserved is not None
    assert reserved.attempts == 1, "the claim incremented it"
    assert db.query("SELECT attempts FROM d1queue_jobs")[0]["attempts"] == 1


async def test_acknowledging_deletes_the_row(db: SqliteD1, queue: D1Queue) -> None:
    await queue.push(ping())
    job = await queue.reserve("default")
    assert job is not None
    assert await queue.complete(job) is True
    assert db.statements[-1].startswith("DELETE FROM d1queue_jobs")
    assert db.query("SELECT * FROM d1queue_jobs") == []


async def test_releasing_clears_the_reservation_and_pushes_availability_out(
    db: SqliteD1, queue: D1Queue, clock: Clock
) -> None:
    await queue.push(ping())
    job = await queue.reserve("default")
    assert job is not None
    assert await queue.retry(job, 30) is True
    row = db.query("SELECT * FROM d1queue_jobs")[0]
    assert (
        row["reserved_at"] is None and row["reservation"] == job.reservation
    )  # kept: see sql.RETRY
    assert row["locked_until"] == row["available_at"] == clock() + 30_000, "keyed by its time"
    assert await queue.reserve("default") is None
    clock.advance(30)
    assert (await queue.reserve("default")).attempts == 2  # type: ignore[union-attr]


async def test_failing_records_the_row_before_removing_the_job(
    db: SqliteD1, queue: D1Queue
) -> None:
    await queue.push(ping())
    job = await queue.reserve("default")
    assert job is not None
    assert await queue.fail(job, "exploded") is True
    insert = next(i for i, s in enumerate(db.statements) if "d1queue_failed_jobs" in s)
    delete = next(i for i, s in enumerate(db.statements) if s.startswith("DELETE FROM"))
    assert insert < delete, "record the failure before dropping the job"
    assert db.query("SELECT * FROM d1queue_jobs") == []
    (failed,) = await queue.failed_jobs()
    assert (failed.id, failed.error, failed.attempts) == (job.id, "exploded", 1)
    assert failed["error"] == "exploded", "rows read as mappings too"


async def test_size_counts_only_unreserved_jobs(db: SqliteD1, queue: D1Queue) -> None:
    for _ in range(7):
        await queue.push(ping())
    await queue.push(ping(delay_s=60))
    assert await queue.size("default") == 8, "delayed jobs are unreserved too"
    await queue.reserve("default")
    assert await queue.size("default") == 7
    assert "COUNT" in db.statements[-1] and "IS NULL" in db.statements[-1]


async def test_reclaiming_releases_jobs_held_past_their_deadline(
    db: SqliteD1, queue: D1Queue, clock: Clock
) -> None:
    await queue.push(ping())
    await queue.push(ping())
    assert await queue.reserve("default") is not None
    clock.advance(queue.reservation_s - 1)
    assert await queue.reclaim_expired() == 0, "still within its lease"
    assert await queue.reserve("default") is not None
    clock.advance(2)
    assert await queue.reclaim_expired() == 1, "the first lease lapsed"
    assert "available_at < ?1" in db.statements[-1] and "IS NOT NULL" in db.statements[-1]
    again = await queue.reserve("default")
    assert again is not None and again.attempts == 2
    assert again.last_error is not None and "lease expired" in again.last_error
