"""The drain's per-minute counters (stats.py, migrations/0005_stats.sql):
what a run records, what it costs (one query, at most one row written, inside
the run's budget), and what the dashboard reads back."""

from __future__ import annotations

from typing import Any

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.errors import Fail, Retry
from d1queue.core.limits import PLANS, Meter
from d1queue.core.log import fields_of
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql
from d1queue.store.binding import Binding
from d1queue.store.stats import RunCounts, per_minute, read, record

from .contract import Clock


def registry() -> Registry:
    reg = Registry()

    @reg.job("ok")
    async def ok(payload: Any) -> None: ...

    @reg.job("again")
    async def again(payload: Any) -> None:
        raise Retry("later", delay_s=600)

    @reg.job("bad")
    async def bad(payload: Any) -> None:
        raise Fail("no")

    return reg


def rows(db: SqliteD1) -> list[Any]:
    return db.query("SELECT * FROM d1queue_stats ORDER BY slot")


async def push(queue: D1Queue, name: str, n: int, on: str = "default") -> None:
    for i in range(n):
        await queue.dispatch(name, i, queue=on)


async def test_a_run_records_its_counts_in_one_row_and_one_query(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    await push(queue, "ok", 3)
    await push(queue, "again", 2, on="mail")
    await push(queue, "bad", 1, on="mail")
    with_stats = await drain(queue, registry(), Config(max_jobs=100))
    (row,) = rows(db)
    assert (row["completed"], row["retried"], row["failed"]) == (3, 2, 1)
    assert row["minute"] == clock() // 60_000 and row["slot"] == row["minute"] % 1440
    assert row["queues"] == '{"default":[3,0,0],"mail":[0,2,1]}'

    # The same work without counters: exactly one query, one statement and
    # one row written fewer.
    other = SqliteD1()
    other.apply_migrations()
    q2 = D1Queue(other, clock=clock)
    await push(q2, "ok", 3)
    await push(q2, "again", 2, on="mail")
    await push(q2, "bad", 1, on="mail")
    without = await drain(q2, registry(), Config(stats=False, max_jobs=100))
    assert rows(other) == []
    assert with_stats.queries == without.queries + 1
    assert with_stats.statements == without.statements + 1
    # (SqliteD1 reports no rows_written; the one row above is the write. On
    # Miniflare's D1: tests/runtime/test_dashboard_browser.py.)
    assert with_stats.subrequests == without.subrequests + 1


async def test_runs_in_one_minute_add_up_and_a_day_later_replace(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    reg = registry()
    await push(queue, "ok", 2)
    await drain(queue, reg, Config())
    await push(queue, "ok", 1)
    await push(queue, "bad", 1, on="mail")
    await drain(queue, reg, Config())
    (row,) = rows(db)
    assert (row["completed"], row["failed"]) == (3, 1)
    assert row["queues"] == '{"default":[3,0,0],"mail":[0,0,1]}'
    clock.advance(24 * 3600)  # the same slot, a day later: overwritten
    await push(queue, "ok", 1)
    await drain(queue, reg, Config())
    (row,) = rows(db)
    assert (row["completed"], row["failed"], row["queues"]) == (1, 0, '{"default":[1,0,0]}')


async def test_a_run_that_settles_nothing_writes_nothing(queue: D1Queue, db: SqliteD1) -> None:
    report = await drain(queue, registry(), Config())
    assert rows(db) == [] and report.rows_written == 0


async def test_a_resent_record_adds_nothing_twice(db: SqliteD1, clock: Clock) -> None:
    counts = RunCounts()
    counts.add("default", "complete")
    binding = Binding(db)
    db.lose_reply_when(lambda s: s.startswith("INSERT INTO d1queue_stats"), times=1)
    assert await record(binding, counts, clock())
    (row,) = rows(db)
    assert row["completed"] == 1  # the lost reply's write, and not the re-send's


async def test_a_failing_record_never_fails_the_drain(
    queue: D1Queue, db: SqliteD1, caplog: Any
) -> None:
    await push(queue, "ok", 2)
    db.fail_when(lambda s: s.startswith("INSERT INTO d1queue_stats"), "D1_ERROR: no such table")
    with caplog.at_level("WARNING", logger="d1queue"):
        report = await drain(queue, registry(), Config())
    assert report.completed == 2 and report.stopped == "empty"
    (lost,) = [r for r in caplog.records if r.getMessage() == "d1queue.stats.lost"]
    assert "no such table" in fields_of(lost)["error"]


async def test_the_counters_fit_inside_the_run_budget(db: SqliteD1, clock: Clock) -> None:
    """A budget just big enough for one round: the round runs and the counters
    are written, and the run spends exactly its budget, never more."""
    queue = D1Queue(db, clock=clock)
    await push(queue, "ok", 100)
    for budget in (5, 6, 9):
        meter = Meter.for_plan(PLANS["free"])
        report = await drain(
            queue.derive(binding=queue.binding.metered(meter)),
            registry(),
            Config(query_budget=budget, max_jobs=1000),
        )
        assert report.completed > 0
        assert meter.used == report.subrequests <= budget, budget
    assert sum(r["completed"] for r in rows(db)) == 100 - await queue.size("default")


def test_a_budget_with_no_room_for_the_counters_is_refused() -> None:
    import pytest

    from d1queue.core.config import ConfigError

    with pytest.raises(ConfigError, match="must be >= 4"):
        Config(query_budget=3)
    assert Config(query_budget=3, stats=False).budget == 3
    assert Config.from_vars({"D1QUEUE_STATS": "false"}).stats is False


async def test_the_dashboard_reads_the_hour_and_the_day(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    reg = registry()
    binding = Binding(db)
    await push(queue, "ok", 2, on="mail")
    await drain(queue, reg, Config())  # two hours ago
    clock.advance(3600 + 60)
    await push(queue, "ok", 3, on="mail")
    await push(queue, "bad", 1, on="mail")
    await drain(queue, reg, Config())  # in the last hour
    clock.advance(60)
    chart, done = await read(binding, clock())
    assert [(m.completed, m.failed) for m in chart] == [(3, 1)]
    assert (done["mail"].hour, done["mail"].day, done["mail"].failed_hour) == (3, 5, 1)
    series = per_minute(chart, clock())
    assert len(series) == 60 and series[-2].completed == 3 and series[-1].completed == 0
    clock.advance(86400)
    chart, done = await read(binding, clock())
    assert chart == [] and done == {}


async def test_the_chart_reads_the_last_hour_only_by_its_slots(db: SqliteD1) -> None:
    """Where the hour wraps the ring, both ranges are read; nothing else is."""
    for minute in (1430, 1439, 1440, 1445, 1500, 2000):
        await Binding(db).run(sql.RECORD_STATS, minute, 1, 0, 0, "{}", f"r{minute}")
    chart, _ = await read(Binding(db), 1490 * 60_000)
    assert [m.minute for m in chart] == [1439, 1440, 1445]
    plan = db.query("EXPLAIN QUERY PLAN " + sql.STATS_MINUTES, 0, 1, 2, 3, 4)
    assert all("SCAN" not in str(r["detail"]) for r in plan), plan
