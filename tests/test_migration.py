"""Migrations 0003 (the claim-ordered table) and 0007 (the locked band) move a
live deployment's jobs with nothing lost: every row, every lease and token,
every unique lock, and the queue then runs them as it would have."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from d1queue import QueuedJob
from d1queue.interfaces.testing import MIGRATIONS, SqliteD1
from d1queue.store import sql
from d1queue.store.bulk import Bulk
from d1queue.store.dashboard import Store
from d1queue.store.queue import D1Queue

from .contract import Clock

NOW = 1_700_000_000_000
"""The test's clock. Migration 0003 reads the wall clock to tell delayed jobs
from due ones, so times here are far in the past or far in the future."""
FUTURE = 4_000_000_000_000  # year 2096

OLD_INSERT = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, reserved_at, reserved_until, reservation, created_at, unique_key, "
    "last_error) VALUES (?1, ?2, 't', ?3, ?4, 3, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
)


def old_rows() -> list[tuple[Any, ...]]:
    """Jobs in every state the 0001 schema held, on two queues."""
    rows: list[tuple[Any, ...]] = []
    for i in range(300):
        # Per state: attempts, available_at, reserved_at, reserved_until,
        # reservation, created_at, unique_key, last_error.
        states: list[tuple[Any, ...]] = [
            (0, NOW - 10_000 + i, None, None, None, NOW - 20_000, None, None),  # ready
            (0, FUTURE + i, None, None, None, NOW - 20_000, None, None),  # delayed
            # held, lease running
            (1, NOW - 5_000, NOW - 1_000, NOW + 60_000, f"tok{i}", NOW - 20_000, None, None),
            # released for a retry later, token kept
            (1, FUTURE + i, None, None, f"tok{i}", NOW - 20_000, None, "boom"),
            (0, NOW - 9_000 + i, None, None, None, NOW - 20_000, f"key{i}", None),  # unique
            # held, lease lapsed
            (2, NOW - 8_000, NOW - 200_000, NOW - 100_000, f"tok{i}", NOW - 300_000, None, "x"),
        ]
        attempts, *rest = states[i % 6]
        queue = "default" if i % 3 else "mail"
        priority = (i % 5) - 2
        rows.append((f"j{i:04d}", queue, f'{{"i":{i}}}', attempts, priority, *rest))
    return rows


def populated_v2(tmp_path: Path) -> SqliteD1:
    before = tmp_path / "before"
    before.mkdir()
    for name in ("0001_init.sql", "0002_queue_state.sql"):
        shutil.copy(MIGRATIONS / name, before / name)
    db = SqliteD1(tmp_path / "d1.sqlite")
    assert db.apply_migrations(before) == ["0001_init.sql", "0002_queue_state.sql"]
    conn = db._conn
    conn.executemany(OLD_INSERT, old_rows())
    conn.execute(
        "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, attempts, "
        "max_attempts, priority, created_at, failed_at) "
        "VALUES ('gone', 'mail', 't', 'null', 'bad', 3, 3, 0, 1, 2)"
    )
    conn.execute("INSERT INTO d1queue_queues (name, paused, updated_at) VALUES ('x', 1, 5)")
    return db


def test_the_migration_states_the_delayed_band_the_code_uses() -> None:
    text = (MIGRATIONS / "0003_claim_order.sql").read_text()
    assert f"THEN {sql.DELAYED_BAND} ELSE priority END" in text


def up_to(tmp_path: Path, last: str) -> Path:
    """A folder of d1queue's migrations up to `last`, as a deployment that
    stopped there had them."""
    folder = tmp_path / f"up_to_{last}"
    folder.mkdir(exist_ok=True)
    for path in sorted(MIGRATIONS.glob("*.sql")):
        if path.name <= last:
            shutil.copy(path, folder / path.name)
    return folder


async def test_every_row_moves_over_unchanged(tmp_path: Path) -> None:
    db = populated_v2(tmp_path)
    before = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert db.apply_migrations(up_to(tmp_path, "0006_fan_out.sql"))[0] == "0003_claim_order.sql"
    after = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert after.keys() == before.keys() and len(after) == 300
    for id, old in before.items():
        new = after[id]
        for column in (
            "queue",
            "name",
            "payload",
            "attempts",
            "max_attempts",
            "priority",
            "available_at",
            "reserved_at",
            "reservation",
            "created_at",
            "unique_key",
            "last_error",
        ):
            assert new[column] == old[column], (id, column)
        held = old["reserved_at"] is not None
        assert new["locked_until"] == (old["reserved_until"] if held else 0), id
        delayed = old["available_at"] > NOW
        assert new["band"] == (sql.DELAYED_BAND if delayed else old["priority"]), id
    assert [r["id"] for r in db.query("SELECT id FROM d1queue_failed_jobs")] == ["gone"]
    assert db.query("SELECT name, paused FROM d1queue_queues") == [{"name": "x", "paused": 1}]
    assert db.apply_migrations(up_to(tmp_path, "0006_fan_out.sql")) == [], "applied once"


async def test_held_and_retrying_jobs_move_to_the_locked_band(tmp_path: Path) -> None:
    """0007: a job with a lock (a lease, running or lapsed, or a retry's wait)
    moves to the locked band keyed by that lock; nothing else moves and no
    column but the key's changes."""
    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0006_fan_out.sql"))
    # A job waiting out a retry in place, as the 0003 layout kept it.
    db._conn.execute(
        "UPDATE d1queue_jobs SET locked_until = ?1, reservation = 'r' WHERE id = 'j0000'",
        (NOW + 5_000,),
    )
    before = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert db.apply_migrations(up_to(tmp_path, "0007_locked_band.sql")) == ["0007_locked_band.sql"]
    after = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert after.keys() == before.keys() and len(after) == 300
    moved = 0
    for id, old in before.items():
        new = after[id]
        locked = old["locked_until"] > 0
        moved += locked
        assert new["band"] == (sql.LOCKED_BAND if locked else old["band"]), id
        assert new["available_at"] == (old["locked_until"] if locked else old["available_at"])
        for column in set(old) - {"band", "available_at"}:
            assert new[column] == old[column], (id, column)
    assert moved == 101  # the held and lapsed jobs (100), and j0000
    # Every job is still found by id, locked or not (by today's driver,
    # once the later migrations have run).
    db.apply_migrations(MIGRATIONS)
    queue = D1Queue(db, clock=Clock(NOW))
    for id in ("j0000", "j0001", "j0002", "j0005"):
        found = await queue.job(id)
        assert found is not None and found.id == id
    # The id index holds the unlocked jobs only.
    indexed = db.query(
        f"SELECT COUNT(*) AS n FROM d1queue_jobs INDEXED BY d1queue_jobs_id WHERE {sql.UNLOCKED}"
    )
    assert indexed == [{"n": 300 - moved}]
    assert db.apply_migrations(up_to(tmp_path, "0007_locked_band.sql")) == [], "applied once"


def test_the_migration_states_the_locked_band_the_code_uses() -> None:
    text = (MIGRATIONS / "0007_locked_band.sql").read_text()
    assert f"SET band = {sql.LOCKED_BAND}, available_at = locked_until" in text
    assert f"ON d1queue_jobs (id) WHERE {sql.UNLOCKED};" in text


async def test_the_queue_runs_the_moved_jobs_as_before(tmp_path: Path) -> None:
    db = populated_v2(tmp_path)
    db.apply_migrations()
    clock = Clock(NOW)
    queue = D1Queue(db, clock=clock)
    expected = {
        row[0]
        for row in old_rows()
        if row[1] == "default" and (row[5] <= NOW and (row[7] is None or row[7] < NOW))
    }
    got = await queue.reserve_batch("default", 200)
    assert {j.id for j in got} == expected, "ready and lapsed jobs; not delayed or held ones"
    priorities = [j.priority for j in got]
    assert priorities == sorted(priorities, reverse=True), "highest priority first"
    lapsed = [j for j in got if j.held]
    assert lapsed and all("lease expired" in (j.last_error or "") for j in lapsed)
    # A held job's lease and token still fence it; unique locks still hold.
    held = db.query("SELECT * FROM d1queue_jobs WHERE id = 'j0002'")[0]
    assert held["reservation"] == "tok2" and held["locked_until"] == NOW + 60_000
    assert await queue.dispatch("t", unique_key="key10") == "j0010"
    found = await queue.job("j0001")
    assert found is not None and found.available_at == FUTURE + 1, "looked up by id"


async def test_0009_keeps_every_row_and_the_unique_lock(tmp_path: Path) -> None:
    """Flow control adds columns, a table and a narrower unique index: every
    job, failure and queue row is kept as it was, with no group and not
    debounced, and a held unique key still refuses a second job."""
    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0008_dashboard_signouts.sql"))
    before = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    failed = db.query("SELECT * FROM d1queue_failed_jobs")
    queues = db.query("SELECT * FROM d1queue_queues")
    assert db.apply_migrations(up_to(tmp_path, "0009_flow_control.sql")) == [
        "0009_flow_control.sql"
    ]
    after = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert after.keys() == before.keys() and len(after) == 300
    for id, old in before.items():
        new = after[id]
        assert {k: new[k] for k in old} == old, id
        assert (new["grp"], new["debounce"]) == (None, 0), id
    assert [
        {k: r[k] for k in failed[0]} for r in db.query("SELECT * FROM d1queue_failed_jobs")
    ] == (failed)
    assert [
        {k: r[k] for k in queues[0]} for r in db.query("SELECT * FROM d1queue_queues")
    ] == queues
    keyed = next(r for r in before.values() if r["unique_key"] is not None)
    queue = D1Queue(db, clock=Clock(NOW))
    job = QueuedJob.new("t", 1, queue=keyed["queue"], unique_key=keyed["unique_key"])
    assert await queue.push(job) == keyed["id"], "the key is still held"


async def test_0010_keeps_every_row_and_finds_each_by_id_and_key(tmp_path: Path) -> None:
    """Workflows add columns, tables and triggers and rebuild the id and
    unique indexes: every job and failure is kept as it was, none waits or
    belongs to a batch, each is found by id, a held unique key still
    refuses a second job, and a job of the old rows completes as before."""
    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0009_flow_control.sql"))
    before = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    failed = db.query("SELECT * FROM d1queue_failed_jobs")
    assert db.apply_migrations(up_to(tmp_path, "0010_workflows.sql")) == ["0010_workflows.sql"]
    after = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert after.keys() == before.keys() and len(after) == 300
    for id, old in before.items():
        new = after[id]
        assert {k: new[k] for k in old} == old, id
        assert (new["waiting"], new["batch"], new["dependents"], new["result"]) == (
            0,
            None,
            0,
            None,
        ), id
    assert [
        {k: r[k] for k in failed[0]} for r in db.query("SELECT * FROM d1queue_failed_jobs")
    ] == failed
    db.apply_migrations(MIGRATIONS)  # the driver reads the latest schema
    queue = D1Queue(db, clock=Clock(NOW))
    for id in list(before)[:20]:
        found = await queue.job(id)
        assert found is not None and found.id == id
    keyed = next(r for r in before.values() if r["unique_key"] is not None)
    job = QueuedJob.new("t", 1, queue=keyed["queue"], unique_key=keyed["unique_key"])
    assert await queue.push(job) == keyed["id"], "the key is still held"


async def test_0011_keeps_every_row_and_a_batch_made_before_still_fires(tmp_path: Path) -> None:
    """Trace context adds a nullable column to jobs and failures and
    re-creates the trigger that enqueues callbacks: every row is kept as it
    was with no trace, and a batch pushed before (its callback a row of
    seven values) still enqueues its callback, with no trace."""
    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0010_workflows.sql"))
    old = D1Queue(db, clock=Clock(NOW))
    batch_id, (member,) = await old.batch(
        [QueuedJob.new("t", 1, queue="wf")], on_finish=QueuedJob.new("cb", 2, queue="wf")
    )
    # A callback row as 0010's push wrote it: seven values, no trace.
    db.query(
        "UPDATE d1queue_batch_parts SET on_finish = json_remove(on_finish, '$[7]') WHERE id = ?",
        batch_id,
    )
    (spec,) = db.query("SELECT on_finish FROM d1queue_batch_parts WHERE id = ?", batch_id)
    assert len(json.loads(spec["on_finish"])) == 7
    before = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    failed = db.query("SELECT * FROM d1queue_failed_jobs")
    assert db.apply_migrations(up_to(tmp_path, "0011_trace_context.sql")) == [
        "0011_trace_context.sql"
    ]
    after = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert after.keys() == before.keys()
    for id, row in before.items():
        assert after[id] == row | {"traceparent": None}, id
    assert db.query("SELECT * FROM d1queue_failed_jobs") == [
        row | {"traceparent": None} for row in failed
    ]
    db.apply_migrations(MIGRATIONS)  # the later ones, whose columns the code reads
    queue = D1Queue(db, clock=Clock(NOW))
    (job,) = await queue.reserve_batch("wf", 1)
    assert job.id == member and job.traceparent is None
    await queue.complete(job)
    (callback,) = db.query(
        "SELECT id, traceparent FROM d1queue_jobs WHERE id = ?", f"{batch_id}:on_finish"
    )
    assert callback["traceparent"] is None


async def test_0012_on_a_0011_schema_counts_the_jobs_it_finds_traced(tmp_path: Path) -> None:
    """Job metrics add a table and move nothing: on a 0011 schema whose
    jobs carry traces, every row is kept as it was, and a job pushed
    before then runs, keeps its trace and is counted."""
    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0011_trace_context.sql"))
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    old = D1Queue(db, clock=Clock(NOW))
    job_id = await old.push(QueuedJob.new("m", 1, queue="metered", traceparent=trace))
    before = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert db.apply_migrations(up_to(tmp_path, "0012_metrics.sql")) == ["0012_metrics.sql"]
    assert {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")} == before
    assert db.query("SELECT * FROM d1queue_metrics") == []
    db.apply_migrations(MIGRATIONS)  # the later ones, whose columns the code reads
    queue = D1Queue(db, clock=Clock(NOW), metrics=True)
    (job,) = await queue.reserve_batch("metered", 1)
    assert (job.id, job.traceparent) == (job_id, trace)
    await queue.complete(job)
    (total,) = db.query(
        f"SELECT queue, name, completed FROM d1queue_metrics WHERE period = {sql.METRIC_TOTAL}"
    )
    assert total == {"queue": "metered", "name": "m", "completed": 1}


async def test_0014_keeps_every_row_unmarked_and_a_held_job_runs_on(tmp_path: Path) -> None:
    """The cancel mark is a nullable column: every job (held ones too) is
    kept as it was, unmarked, and the queue then runs them as before."""
    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0012_metrics.sql"))
    before = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert any(r["reserved_at"] is not None for r in before.values())
    applied = db.apply_migrations(MIGRATIONS)
    assert "0014_cancel.sql" in applied
    after = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    # 0013 (attempt history) comes with it: its columns are NULL too.
    new = {"cancel_at": None, "runs": None, "progress": None}
    assert after == {id: row | new for id, row in before.items()}
    queue = D1Queue(db, clock=Clock(NOW))
    jobs = await queue.reserve_batch("default", 5)
    assert jobs and not any(j.cancelling for j in jobs)


async def test_0013_on_a_0012_schema_keeps_every_row_and_starts_each_history(
    tmp_path: Path,
) -> None:
    """Attempt history adds columns and moves nothing: on a 0012 schema,
    every job and failure is kept as it was (with no history), and a job
    pushed before then starts its history with its next settle."""
    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0012_metrics.sql"))
    old = D1Queue(db, clock=Clock(NOW))
    job_id = await old.push(QueuedJob.new("m", 1, queue="hist"))
    before = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    failed = db.query("SELECT * FROM d1queue_failed_jobs")
    assert db.apply_migrations(up_to(tmp_path, "0013_attempt_history.sql")) == [
        "0013_attempt_history.sql"
    ]
    after = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    assert after == {k: r | {"runs": None, "progress": None} for k, r in before.items()}
    assert db.query("SELECT * FROM d1queue_failed_jobs") == [r | {"runs": None} for r in failed]
    db.apply_migrations(MIGRATIONS)  # the later ones, which today's code needs too
    queue = D1Queue(db, clock=Clock(NOW))
    (job,) = await queue.reserve_batch("hist", 1)
    assert job.id == job_id
    await queue.retry(job, 10, "boom")
    (row,) = db.query("SELECT runs FROM d1queue_jobs WHERE id = ?", job_id)
    (entry,) = json.loads(row["runs"])
    assert (entry["attempt"], entry["outcome"], entry["error"]) == (1, "retried", "boom")


async def test_0015_adds_the_audit_log_and_moves_no_row(tmp_path: Path) -> None:
    """The audit log is a new table: every job and failure stays as it was,
    and a bulk action then writes its record there."""
    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0014_cancel.sql"))
    jobs = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    failed = db.query("SELECT * FROM d1queue_failed_jobs")
    assert db.apply_migrations(up_to(tmp_path, "0015_audit.sql")) == ["0015_audit.sql"]
    assert {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")} == jobs
    assert db.query("SELECT * FROM d1queue_failed_jobs") == failed
    assert db.query("SELECT * FROM d1queue_audit") == []
    db.apply_migrations(MIGRATIONS)  # the later ones, which today's code needs too
    bulk = Bulk(Store(D1Queue(db, clock=Clock(NOW))))
    count = await bulk.count("live", {})
    run = await bulk.start(
        "7" * 32,
        who="full",
        action="run",
        source="live",
        filter="",
        selected=None,
        count=count,
        now=NOW,
    )
    assert (await bulk.step(run, 1, {}, NOW)).step == 1


async def test_0016_keeps_every_schedule_and_records_runs_from_the_next_slot(
    tmp_path: Path,
) -> None:
    """A schedule's last runs are a nullable column: every schedule is kept
    as it was, with none recorded, and its next cron run records its job."""
    from d1queue.core.registry import Registry
    from d1queue.store.schedules import ScheduleDef, Schedules

    db = populated_v2(tmp_path)
    db.apply_migrations(up_to(tmp_path, "0014_cancel.sql"))
    clock = Clock(NOW)
    reg = Registry()

    async def handler(payload: Any) -> None: ...

    reg.register("m", handler)
    old = D1Queue(db, clock=clock, registry=reg)
    await Schedules(old, reg).put(ScheduleDef(id="each", cron="* * * * *", name="m"))
    before = db.query("SELECT * FROM d1queue_schedules")
    applied = db.apply_migrations(MIGRATIONS)
    assert "0016_schedule_runs.sql" in applied
    assert db.query("SELECT * FROM d1queue_schedules") == [r | {"runs": None} for r in before]
    clock.advance(60)
    report = await Schedules(D1Queue(db, clock=clock, registry=reg), reg).run()
    assert report.enqueued == 1
    (row,) = db.query("SELECT runs FROM d1queue_schedules")
    (job,) = db.query("SELECT id FROM d1queue_jobs WHERE name = 'm'")
    assert [r[1] for r in json.loads(row["runs"])] == [job["id"]]
