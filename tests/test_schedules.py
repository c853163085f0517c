"""Recurring schedules under CPython with a fake clock, on SqliteD1: cron
fields and time zones, daylight-saving days, month ends and leap days,
outages under each catch-up policy, exactly once per slot under racing cron
runs and re-sent writes, syncing code-declared schedules, what a run costs in
D1 queries, and the HTTP API."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from d1queue import D1Queue, Registry, drain
from d1queue.core.limits import Meter
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import document
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1, database
from d1queue.store.binding import Binding, RetryPolicy
from d1queue.store.schedules import (
    MAX_CATCH_UP,
    NEVER,
    Cron,
    ScheduleDef,
    ScheduleError,
    Schedules,
    plan_slots,
    trigger_grace_ms,
)

from .contract import Clock
from .test_api import TOKEN, Client

MINUTE = 60_000
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, tz: Any = UTC) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=tz).timestamp()) * 1000


def local(at: int, tz: Any) -> datetime:
    return datetime.fromtimestamp(at / 1000, UTC).astimezone(tz)


def registry(*schedules: dict[str, Any]) -> Registry:
    reg = Registry()

    @reg.job("t.tick", max_attempts=2, priority=5, queue="ticks")
    async def tick(payload: Any) -> None: ...

    @reg.job("t.other")
    async def other(payload: Any) -> None: ...

    for s in schedules:
        reg.schedule(**s)
    return reg


class World:
    """A D1 (SqliteD1), a fake clock and a registry: cron runs on demand."""

    def __init__(self, reg: Registry, at: int, db: SqliteD1 | None = None) -> None:
        self.db = db or database()
        self.clock = Clock(at)
        self.reg = reg
        self.queue = D1Queue(self.db, clock=self.clock, registry=reg)
        self.store = Schedules(self.queue, reg)

    async def run(self, **kwargs: Any) -> Any:
        return await self.store.run(**kwargs)

    async def every_minute(self, until: int, **kwargs: Any) -> None:
        """A cron run each minute from the clock's minute up to `until`."""
        self.clock.ms -= self.clock.ms % MINUTE
        while self.clock.ms <= until:
            report = await self.run(**kwargs)
            assert not report.error, report
            self.clock.advance(60)

    def jobs(self) -> list[dict[str, Any]]:
        return self.db.query("SELECT * FROM d1queue_jobs ORDER BY available_at")

    def slots(self) -> list[int]:
        return [int(j["available_at"]) for j in self.jobs()]

    def row(self, id: str) -> dict[str, Any]:
        (row,) = self.db.query("SELECT * FROM d1queue_schedules WHERE id = ?", id)
        return row


# -- cron expressions and zones ---------------------------------------------------


def nexts(expr: str, start: int, n: int, tz: str = "UTC") -> list[str]:
    cron, out, at = Cron.parse(expr, tz), [], start
    for _ in range(n):
        at = cron.next_after(at)
        out.append(local(at, cron.zone).strftime("%a %Y-%m-%d %H:%M"))
    return out


START = ms(2026, 1, 1)  # a Thursday


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (
            "*/20 9-10 * * *",
            ["Thu 2026-01-01 09:00", "Thu 2026-01-01 09:20", "Thu 2026-01-01 09:40"],
        ),
        (
            "0 9 * * MON-FRI",
            ["Thu 2026-01-01 09:00", "Fri 2026-01-02 09:00", "Mon 2026-01-05 09:00"],
        ),
        ("15 8 1,15 * *", ["Thu 2026-01-01 08:15", "Thu 2026-01-15 08:15", "Sun 2026-02-01 08:15"]),
        (
            "0 12 * jan,jul sun",
            ["Sun 2026-01-04 12:00", "Sun 2026-01-11 12:00", "Sun 2026-01-18 12:00"],
        ),
        ("0 0 * * 7", ["Sun 2026-01-04 00:00", "Sun 2026-01-11 00:00", "Sun 2026-01-18 00:00"]),
        ("@hourly", ["Thu 2026-01-01 01:00", "Thu 2026-01-01 02:00", "Thu 2026-01-01 03:00"]),
        ("@daily", ["Fri 2026-01-02 00:00", "Sat 2026-01-03 00:00", "Sun 2026-01-04 00:00"]),
        ("@weekly", ["Sun 2026-01-04 00:00", "Sun 2026-01-11 00:00", "Sun 2026-01-18 00:00"]),
        ("@monthly", ["Sun 2026-02-01 00:00", "Sun 2026-03-01 00:00", "Wed 2026-04-01 00:00"]),
        ("@YEARLY", ["Fri 2027-01-01 00:00", "Sat 2028-01-01 00:00", "Mon 2029-01-01 00:00"]),
    ],
)
def test_fields_ranges_steps_lists_names_and_nicknames(expr: str, expected: list[str]) -> None:
    assert nexts(expr, START, 3) == expected


def test_month_ends_and_leap_days() -> None:
    # The 31st exists in 7 months; the 30th in every month but February.
    assert [d[4:14] for d in nexts("0 0 31 * *", START, 4)] == [
        "2026-01-31",
        "2026-03-31",
        "2026-05-31",
        "2026-07-31",
    ]
    assert "2026-02" not in " ".join(nexts("0 0 30 * *", START, 12))
    # 29 February: only in leap years.
    assert [d[4:14] for d in nexts("0 12 29 2 *", START, 2)] == ["2028-02-29", "2032-02-29"]
    # The last day of each month, including a leap February (cronsim's L).
    assert [d[4:14] for d in nexts("0 0 L * *", ms(2028, 1, 1), 3)] == [
        "2028-01-31",
        "2028-02-29",
        "2028-03-31",
    ]


@pytest.mark.parametrize(
    "expr", ["61 * * * *", "* * *", "* * * * * *", "@reboot", "", "0 0 30 2 *", "x", 5, None]
)
def test_a_bad_cron_expression_says_cron(expr: Any) -> None:
    with pytest.raises(ScheduleError) as e:
        Cron.parse(expr)
    assert e.value.field == "cron"


@pytest.mark.parametrize("tz", ["Mars/Olympus", "../../etc/passwd", "", "Europe/", 7, "/etc/x"])
def test_an_unknown_time_zone_says_tz(tz: Any) -> None:
    with pytest.raises(ScheduleError) as e:
        Cron.parse("0 0 * * *", tz)
    assert e.value.field == "tz"


def test_the_trigger_period_sets_how_late_a_slot_may_be_found() -> None:
    at = ms(2026, 5, 1, 12, 0) + 5_000
    assert trigger_grace_ms("* * * * *", at) == 2 * MINUTE
    assert trigger_grace_ms("*/5 * * * *", at) == 6 * MINUTE
    assert trigger_grace_ms("", at) == trigger_grace_ms("nonsense", at) == 2 * MINUTE


# -- daylight saving, through cron runs every minute ------------------------------------


def per_local_day(slots: list[int], tz: Any) -> dict[str, list[str]]:
    days: dict[str, list[str]] = {}
    for at in slots:
        t = local(at, tz)
        days.setdefault(t.strftime("%m-%d"), []).append(t.strftime("%H:%M%z"))
    return days


@pytest.mark.parametrize(
    ("tz", "spring", "fall"),
    [
        # Berlin: 02:00 -> 03:00 on 29 March, 03:00 -> 02:00 on 25 October 2026.
        (BERLIN, (2026, 3, 29), (2026, 10, 25)),
        # New York: 02:00 -> 03:00 on 8 March, 02:00 -> 01:00 on 1 November 2026.
        (NEW_YORK, (2026, 3, 8), (2026, 11, 1)),
    ],
    ids=["Europe/Berlin", "America/New_York"],
)
async def test_a_0230_schedule_runs_once_on_each_daylight_saving_day(
    tz: ZoneInfo, spring: tuple[int, int, int], fall: tuple[int, int, int]
) -> None:
    for y, m, d in (spring, fall):
        reg = registry({"id": "s", "cron": "30 2 * * *", "name": "t.tick", "tz": tz.key})
        day = datetime(y, m, d, tzinfo=tz)
        w = World(reg, ms(y, m, d, tz=tz) - 24 * 3600_000)
        await w.every_minute(until=int((day + timedelta(days=2)).timestamp() * 1000))
        days = per_local_day(w.slots(), tz)
        before, on, after = ((day + timedelta(days=i)).strftime("%m-%d") for i in (-1, 0, 1))
        assert len(days[on]) == 1, days
        assert len(days[before]) == len(days[after]) == 1, days
        if (y, m, d) == spring:  # 02:30 does not exist: right after the change
            assert days[on][0].startswith("03:00"), days
        else:  # 02:30 happens twice: the first one only
            assert days[on][0].startswith("02:30"), days


async def test_an_hourly_schedule_follows_the_clock_through_both_changes() -> None:
    """Jobs more frequent than hourly run on real time: 23 slots on the
    spring day, 25 on the autumn one (the repeated hour runs twice)."""
    for (y, m, d), count in (((2026, 3, 29), 23), ((2026, 10, 25), 25)):
        reg = registry({"id": "h", "cron": "0 * * * *", "name": "t.tick", "tz": "Europe/Berlin"})
        start = ms(y, m, d, tz=BERLIN)
        w = World(reg, start - 2 * MINUTE)
        await w.every_minute(until=start + 26 * 3600_000)
        days = per_local_day(w.slots(), BERLIN)
        assert len(days[f"{m:02d}-{d:02d}"]) == count, days


# -- on time: the first run at or after a slot --------------------------------------------


async def test_a_slot_is_enqueued_by_the_first_run_at_its_time_and_starts_in_that_run() -> None:
    ran: list[Any] = []
    reg = Registry()

    @reg.job("t.report")
    async def report_job(payload: Any) -> None:
        ran.append(payload)

    reg.schedule("daily", "0 6 * * *", "t.report", payload={"k": 1}, tz="Europe/Berlin")
    w = World(reg, ms(2026, 6, 1, 5, 59, tz=BERLIN))
    assert (await w.run()).enqueued == 0  # 05:59: syncs, nothing due
    w.clock.ms = ms(2026, 6, 1, 6, 0, tz=BERLIN) + 300  # the 06:00 run, 0.3 s in
    report = await w.run()
    assert (report.due, report.enqueued, report.advanced) == (1, 1, 1)
    (job,) = w.jobs()
    slot = ms(2026, 6, 1, 6, 0, tz=BERLIN)
    assert job["available_at"] == slot
    assert job["created_at"] == w.clock.ms
    assert job["unique_key"] == f"schedule:daily:{slot}"
    assert job["band"] == 0, "due: in the ready band"
    assert w.row("daily")["next_run_at"] == ms(2026, 6, 2, 6, 0, tz=BERLIN)
    assert w.row("daily")["last_run_at"] == slot
    # The drain the cron runs next starts it.
    done = await drain(w.queue, reg, queues=["*"])
    assert (done.claimed, done.completed, ran) == (1, 1, [{"k": 1}])


async def test_the_jobs_defaults_apply_and_the_schedule_can_name_a_queue() -> None:
    reg = registry(
        {"id": "a", "cron": "* * * * *", "name": "t.tick"},
        {"id": "b", "cron": "* * * * *", "name": "t.tick", "queue": "elsewhere"},
    )
    w = World(reg, ms(2026, 6, 1, 12, 0))
    await w.run()
    w.clock.advance(60)
    await w.run()
    jobs = {j["unique_key"].split(":")[1]: j for j in w.jobs()}
    assert (jobs["a"]["queue"], jobs["a"]["max_attempts"], jobs["a"]["priority"]) == (
        "ticks",
        2,
        5,
    )
    assert jobs["b"]["queue"] == "elsewhere"


# -- outages and catch-up -------------------------------------------------------------------


async def outage(catch_up: str, resume_at: int, *, cron: str = "*/10 * * * *") -> World:
    """A schedule created at 10:00, last run at 10:00, then no cron run
    until `resume_at`."""
    reg = registry({"id": "s", "cron": cron, "name": "t.tick", "catch_up": catch_up})
    w = World(reg, ms(2026, 6, 1, 9, 59))
    await w.run()  # next_run_at = 10:00
    w.clock.ms = ms(2026, 6, 1, 10, 0)
    assert (await w.run()).enqueued == 1
    w.db.query("DELETE FROM d1queue_jobs")  # it ran
    w.clock.ms = resume_at
    return w


@pytest.mark.parametrize(
    ("catch_up", "resume", "expected"),
    [
        # Back at 12:01: 10:10 ... 12:00 came due while nothing ran.
        ("none", (12, 1), [(12, 0)]),  # 12:00 is on time (1 minute old): it runs
        ("none", (12, 5), []),  # 12:00 is 5 minutes late: missed, like the rest
        ("latest", (12, 5), [(12, 0)]),
        ("all", (12, 5), [(h, m) for h in (10, 11, 12) for m in range(0, 60, 10)][1:-5]),
    ],
)
async def test_an_outage_is_caught_up_by_the_schedules_policy(
    catch_up: str, resume: tuple[int, int], expected: list[tuple[int, int]]
) -> None:
    w = await outage(catch_up, ms(2026, 6, 1, *resume))
    report = await w.run()
    assert w.slots() == [ms(2026, 6, 1, h, m) for h, m in expected]
    assert report.skipped == (catch_up != "all")
    # Whatever the policy, the schedule goes on from the next slot.
    assert w.row("s")["next_run_at"] == ms(2026, 6, 1, 12, 10)
    assert (await w.run()).enqueued == 0, "nothing twice"


async def test_catching_up_all_is_capped_at_the_most_recent_100() -> None:
    w = await outage("all", ms(2026, 6, 3, 10, 0) + 30_000, cron="* * * * *")
    report = await w.run()
    slots = w.slots()
    assert len(slots) == report.enqueued == MAX_CATCH_UP
    assert slots[-1] == ms(2026, 6, 3, 10, 0)
    assert slots[0] == ms(2026, 6, 3, 10, 0) - 99 * MINUTE
    assert report.skipped == 1


def test_plan_slots_keeps_the_due_slot_when_the_cron_finds_none_between() -> None:
    cron = Cron.parse("0 0 1 1 *")
    due = ms(2026, 1, 1)
    plan = plan_slots(cron, "latest", due, due + 1000, 120_000)
    assert plan.slots == [due] and plan.next_run_at == ms(2027, 1, 1) and not plan.skipped


# -- exactly once ------------------------------------------------------------------------------


async def test_eight_cron_runs_racing_on_one_slot_enqueue_it_once(shared_file: Path) -> None:
    """Eight Workers (eight SqliteD1 connections to one file) run the cron at
    once, for three slots in a row; each slot is delivered once. Every
    Worker's job completes as soon as its batch commits (before the other
    runs' batches), so the slot's unique key is already free again when they
    write: only the compare-and-set on next_run_at stops a second enqueue."""
    reg = registry({"id": "s", "cron": "* * * * *", "name": "t.tick"})
    clock = Clock(ms(2026, 6, 1, 11, 59) + 30_000)
    worlds = [World(reg, 0, db=SqliteD1(shared_file)) for _ in range(8)]
    delivered: dict[int, int] = {}
    for w in worlds:
        w.clock = w.queue.clock = clock
        real = w.db.batch

        async def batch_then_run(statements: Any, db: SqliteD1 = w.db, real: Any = real) -> Any:
            results = await real(statements)
            for job in db.query("SELECT available_at FROM d1queue_jobs"):
                delivered[job["available_at"]] = delivered.get(job["available_at"], 0) + 1
            db.query("DELETE FROM d1queue_jobs")  # the job ran at once: its key is free
            return results

        w.db.batch = batch_then_run  # type: ignore[method-assign]
    await worlds[0].run()  # the sync: next_run_at = 12:00
    for minute in range(3):
        clock.ms = ms(2026, 6, 1, 12, minute) + 200
        reports = await asyncio.gather(*(w.run() for w in worlds))
        assert all(not r.error for r in reports), reports
        assert sum(r.due for r in reports) == 8, "all eight read the same due slot"
        assert (sum(r.advanced for r in reports), sum(r.lost for r in reports)) == (1, 7)
        assert sum(r.enqueued for r in reports) == 1
        late = await worlds[1].run()  # a retried run of the same minute
        assert (late.due, late.enqueued) == (0, 0)
    assert delivered == {ms(2026, 6, 1, 12, m): 1 for m in range(3)}


async def test_a_resent_batch_after_a_lost_reply_enqueues_nothing_twice() -> None:
    reg = registry({"id": "s", "cron": "* * * * *", "name": "t.tick"})
    w = World(reg, ms(2026, 6, 1, 11, 59))
    await w.run()
    w.clock.ms = ms(2026, 6, 1, 12, 0)
    # The batch commits, then its reply is lost; the binding sends it again.
    w.db.lose_reply_when("INSERT INTO d1queue_jobs")
    w.queue.binding = Binding(w.db, retry=RetryPolicy(base_s=0))
    w.store = Schedules(w.queue, reg)
    report = await w.run()
    assert report.resent and not report.error
    assert w.slots() == [ms(2026, 6, 1, 12, 0)]
    assert w.row("s")["next_run_at"] == ms(2026, 6, 1, 12, 1)


async def test_a_failed_batch_writes_nothing_and_the_next_run_enqueues_the_slot() -> None:
    reg = registry({"id": "s", "cron": "* * * * *", "name": "t.tick"})
    w = World(reg, ms(2026, 6, 1, 11, 59))
    await w.run()
    w.clock.ms = ms(2026, 6, 1, 12, 0)
    w.db.fail_when("UPDATE d1queue_schedules")
    report = await w.run()
    assert "injected fault" in report.error
    assert w.jobs() == [], "the insert rolled back with the update"
    w.clock.advance(30)
    assert (await w.run()).enqueued == 1
    assert w.slots() == [ms(2026, 6, 1, 12, 0)]


# -- pausing -----------------------------------------------------------------------------------


async def test_a_paused_schedule_enqueues_nothing_and_resumes_from_its_next_slot() -> None:
    reg = registry()
    w = World(reg, ms(2026, 6, 1, 11, 59))
    service = Service(w.queue, reg)
    created, _ = await service.put_schedule({"id": "p", "cron": "*/5 * * * *", "name": "t.tick"})
    assert created
    assert (await service.pause_schedule("p"))["paused"] is True
    w.clock.ms = ms(2026, 6, 1, 12, 31)
    report = await w.run()
    assert (report.due, report.enqueued) == (0, 0), "a paused schedule is not even read"
    resumed = await service.resume_schedule("p")
    assert resumed["paused"] is False
    assert resumed["next_run_at"] == ms(2026, 6, 1, 12, 35), "slots while paused are skipped"
    w.clock.ms = ms(2026, 6, 1, 12, 35)
    assert (await w.run()).enqueued == 1


# -- syncing code-declared schedules -------------------------------------------------------


async def test_sync_adds_changes_and_removes_code_schedules_and_leaves_api_ones(
    shared_file: Path,
) -> None:
    at = ms(2026, 6, 1, 12, 0) + 30_000
    first = registry(
        {"id": "keep", "cron": "0 * * * *", "name": "t.tick"},
        {"id": "change", "cron": "0 * * * *", "name": "t.tick"},
        {"id": "drop", "cron": "0 * * * *", "name": "t.tick"},
    )
    w = World(first, at, db=SqliteD1(shared_file))
    await Service(w.queue, first).put_schedule({"id": "api", "cron": "0 * * * *", "name": "t.tick"})
    report = await w.run()
    assert report.synced
    ids = {r["id"]: r["source"] for r in w.db.query("SELECT id, source FROM d1queue_schedules")}
    assert ids == {"keep": "code", "change": "code", "drop": "code", "api": "api"}
    keep_before = w.row("keep")

    # Nothing changed: the run sends its one read and writes nothing.
    w.db.statements.clear()
    report = await w.run()
    assert (report.synced, report.queries) == (False, 1)
    assert not any(s.startswith(("INSERT", "UPDATE", "DELETE")) for s in w.db.statements)

    # A deployment changes one, removes one, adds one.
    second = registry(
        {"id": "keep", "cron": "0 * * * *", "name": "t.tick"},
        {"id": "change", "cron": "30 * * * *", "name": "t.tick", "payload": [1]},
        {"id": "new", "cron": "15 * * * *", "name": "t.other"},
    )
    w2 = World(second, at, db=SqliteD1(shared_file))
    report = await w2.run()
    assert report.synced and report.queries == 2
    rows = {r["id"]: r for r in w2.db.query("SELECT * FROM d1queue_schedules")}
    assert set(rows) == {"keep", "change", "new", "api"}
    assert rows["keep"] == keep_before, "an unchanged schedule is not rewritten"
    assert (rows["change"]["cron"], rows["change"]["payload"]) == ("30 * * * *", "[1]")
    assert rows["change"]["next_run_at"] == ms(2026, 6, 1, 12, 30)
    assert rows["new"]["next_run_at"] == ms(2026, 6, 1, 12, 15)
    assert rows["api"]["source"] == "api"

    # A code schedule with the id of an API one never replaces it.
    third = registry({"id": "api", "cron": "45 * * * *", "name": "t.other"})
    w3 = World(third, at, db=SqliteD1(shared_file))
    assert (await w3.run()).synced
    assert w3.row("api")["cron"] == "0 * * * *" and w3.row("api")["source"] == "api"
    assert {r["id"] for r in w3.db.query("SELECT id FROM d1queue_schedules")} == {"api"}


async def test_a_schedule_due_as_its_definition_changes_runs_the_old_slot_once() -> None:
    first = registry({"id": "s", "cron": "0 * * * *", "name": "t.tick"})
    w = World(first, ms(2026, 6, 1, 11, 59))
    await w.run()
    second = registry({"id": "s", "cron": "30 * * * *", "name": "t.tick"})
    w2 = World(second, ms(2026, 6, 1, 12, 0), db=w.db)
    report = await w2.run()
    assert (report.enqueued, report.synced) == (1, True)
    assert w2.row("s")["next_run_at"] == ms(2026, 6, 1, 12, 30)


async def test_declaring_schedules_in_code() -> None:
    reg = Registry()

    @reg.job("report.daily", schedule="0 6 * * *", tz="Europe/Berlin", catch_up="latest")
    async def daily(payload: Any) -> None: ...

    (d,) = reg.schedules()
    assert (d.id, d.cron, d.name, d.tz, d.catch_up, d.payload) == (
        "report.daily",
        "0 6 * * *",
        "report.daily",
        "Europe/Berlin",
        "latest",
        None,
    )
    with pytest.raises(ValueError, match="register job 'nope' before"):
        reg.schedule("x", "* * * * *", "nope")
    with pytest.raises(ValueError, match="already declared"):
        reg.schedule("report.daily", "* * * * *", "report.daily")
    with pytest.raises(ScheduleError) as e:
        reg.schedule("y", "* * * * *", "report.daily", catch_up="some")
    assert e.value.field == "catch_up"
    with pytest.raises(ScheduleError) as e:
        reg.schedule("z", "0 25 * * *", "report.daily")
    assert e.value.field == "cron"


async def test_a_row_this_worker_cannot_read_is_parked() -> None:
    reg = registry()
    w = World(reg, ms(2026, 6, 1, 12, 0))
    w.db.query(
        "INSERT INTO d1queue_schedules (id, cron, tz, name, payload, source, version, "
        "next_run_at, created_at, updated_at) VALUES ('bad', 'nonsense', 'UTC', 't.tick', "
        "'null', 'api', 'v', 1, 0, 0)"
    )
    report = await w.run()
    assert (report.broken, report.enqueued, report.advanced) == (1, 0, 1)
    assert w.row("bad")["next_run_at"] == NEVER
    assert (await w.run()).due == 0


# -- cost ------------------------------------------------------------------------------------------


async def many(n: int, due: int, limit: int = 500) -> tuple[World, Any, int]:
    """`n` API schedules, `due` of them due now; one cron run's report and
    the SQLite VM steps its due SELECT took."""
    reg = registry()
    w = World(reg, ms(2026, 6, 1, 12, 0))
    w.db.query(
        "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?1) "
        "INSERT INTO d1queue_schedules (id, cron, tz, name, payload, source, version, "
        "next_run_at, created_at, updated_at) SELECT printf('s%05d', i), '0 * * * *', 'UTC', "
        "'t.tick', 'null', 'api', 'v', CASE WHEN i <= ?2 THEN ?3 ELSE ?4 END, 0, 0 FROM k",
        n,
        due,
        ms(2026, 6, 1, 12, 0),
        ms(2026, 6, 1, 13, 0),
    )
    await w.run()  # the first run writes the (empty) declared set's hash: no
    w.db.query("DELETE FROM d1queue_jobs")
    w.db.query(
        "UPDATE d1queue_schedules SET next_run_at = ?1 WHERE id <= printf('s%05d', ?2)",
        ms(2026, 6, 1, 12, 0),
        due,
    )
    binding = w.queue.binding
    before = binding.usage.queries
    w.db.count_vm_steps()
    found = await binding.run(
        "SELECT id FROM d1queue_schedules WHERE paused = 0 AND next_run_at <= ?1 "
        "ORDER BY next_run_at LIMIT ?2",
        w.clock(),
        limit,
    )
    steps = w.db.vm_steps
    w.db.count_vm_steps(False)
    assert len(found.rows) == min(due, limit)
    binding.usage.queries = before
    report = await w.run(limit=limit)
    return w, report, steps


@pytest.mark.parametrize(
    ("n", "due", "queries"),
    [(0, 0, 1), (1, 0, 1), (1, 1, 2), (500, 0, 1), (500, 1, 2), (500, 500, 2)],
)
async def test_a_cron_run_costs_at_most_two_queries_however_many_schedules(
    n: int, due: int, queries: int
) -> None:
    w, report, _ = await many(n, due)
    assert report.queries == queries, report
    assert (report.due, report.enqueued, report.advanced) == (due, due, due)
    assert len(w.jobs()) == due


async def test_the_due_read_does_work_for_due_schedules_only() -> None:
    """VM steps of the due SELECT (deterministic, as rows read are on D1):
    499 schedules not due add nothing to reading one that is."""
    _, _, one = await many(1, 1)
    _, _, among_500 = await many(500, 1)
    assert among_500 <= one + 5, (one, among_500)
    _, _, ten = await many(500, 10)
    assert ten > among_500


async def test_the_run_counts_on_the_invocations_meter() -> None:
    reg = registry({"id": "s", "cron": "* * * * *", "name": "t.tick"})
    w = World(reg, ms(2026, 6, 1, 12, 0))
    meter = Meter(50)
    w.queue.binding = Binding(w.db, meter=meter)
    w.store = Schedules(w.queue, reg)
    await w.run()
    assert meter.used == 2  # the read, and the sync
    w.clock.advance(60)
    await w.run()
    assert meter.used == 4  # the read, and the slot's insert + advance
    tight = Meter(4)
    tight.used = 4
    w.queue.binding = Binding(w.db, meter=tight)
    w.store = Schedules(w.queue, reg)
    w.clock.advance(60)
    report = await w.run()
    assert "SubrequestLimitExceeded" in report.error and report.queries == 0


# -- the API ------------------------------------------------------------------------------------


@pytest.fixture
def api_world() -> tuple[World, Client]:
    reg = registry({"id": "code.one", "cron": "0 * * * *", "name": "t.tick"})
    w = World(reg, ms(2026, 6, 1, 11, 59) + 30_000)
    api = Api(Service(w.queue, reg), TOKEN, "1", document(reg.names()))
    return w, Client(api, w.db)


def schedule_rows(w: World) -> list[dict[str, Any]]:
    return w.db.query("SELECT * FROM d1queue_schedules ORDER BY id")


async def test_api_create_replace_get_list_pause_resume_delete(
    api_world: tuple[World, Client],
) -> None:
    w, client = api_world
    body = {"id": "nightly", "cron": "0 3 * * *", "name": "t.tick", "tz": "America/New_York"}
    r = await client("POST", "/v1/schedules", body)
    assert r.status == 201, r.body
    assert r.body["id"] == "nightly" and r.body["created"] is True
    assert r.body["next_run_at"] == ms(2026, 6, 2, 3, 0, tz=NEW_YORK)
    assert (r.body["queue"], r.body["source"], r.body["catch_up"]) == ("ticks", "api", "none")
    assert (await client("POST", "/v1/schedules", body)).status == 200, "the same id replaces"
    r = await client("POST", "/v1/schedules", {**body, "cron": "@hourly", "payload": {"a": 1}})
    assert (r.status, r.body["cron"], r.body["payload"]) == (200, "@hourly", {"a": 1})
    assert r.body["next_run_at"] == ms(2026, 6, 1, 12, 0)
    r = await client("POST", "/v1/schedules", {"cron": "*/5 * * * *", "name": "t.other"})
    assert r.status == 201 and len(r.body["id"]) == 32, "an id is made when none is given"

    r = await client("GET", "/v1/schedules")
    assert r.status == 200
    assert [s["id"] for s in r.body["schedules"]] == sorted([r_["id"] for r_ in schedule_rows(w)])
    assert r.body["next_cursor"] is None
    page = await client("GET", "/v1/schedules?limit=1")
    assert len(page.body["schedules"]) == 1 and page.body["next_cursor"]
    rest = await client("GET", f"/v1/schedules?limit=10&cursor={page.body['next_cursor']}")
    assert len(rest.body["schedules"]) == len(schedule_rows(w)) - 1

    r = await client("GET", "/v1/schedules/nightly")
    assert (r.status, r.body["tz"], r.body["paused"]) == (200, "America/New_York", False)
    assert (await client("POST", "/v1/schedules/nightly/pause")).body["paused"] is True
    assert (await client("POST", "/v1/schedules/nightly/resume")).body["paused"] is False
    r = await client("DELETE", "/v1/schedules/nightly")
    assert (r.status, r.body) == (200, {"id": "nightly", "deleted": True})
    assert (await client("GET", "/v1/schedules/nightly")).status == 404
    assert (await client("DELETE", "/v1/schedules/nightly")).status == 404
    assert (await client("POST", "/v1/schedules/nightly/pause")).status == 404


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        ({"cron": "61 * * * *", "name": "t.tick"}, 422, "invalid_cron", "cron"),
        ({"cron": "@reboot", "name": "t.tick"}, 422, "invalid_cron", "nickname"),
        (
            {"cron": "* * * * *", "name": "t.tick", "tz": "Mars/Base"},
            422,
            "unknown_timezone",
            "Mars",
        ),
        ({"cron": "* * * * *", "name": "t.nope"}, 422, "unknown_job", "t.nope"),
        ({"cron": "* * * * *", "name": "t.tick", "catch_up": "most"}, 422, "invalid", "catch_up"),
        ({"cron": "* * * * *", "name": "t.tick", "queue": "a b"}, 422, "invalid", "queue"),
        ({"cron": "* * * * *", "name": "t.tick", "id": "a/b"}, 422, "invalid", "id"),
        ({"cron": "* * * * *", "name": "t.tick", "every": 1}, 422, "invalid", "every"),
        ({"cron": "* * * * *", "name": "t.tick", "id": ["x"]}, 422, "invalid", "id"),
        ({"cron": ["* * * * *"], "name": "t.tick"}, 422, "invalid_cron", "cron"),
        ({"cron": "* * * * *", "name": "t.tick", "tz": 3}, 422, "unknown_timezone", "tz"),
        ({"name": "t.tick"}, 422, "invalid", "cron is required"),
        (
            {"cron": "* * * * *", "name": "t.tick", "id": "code.one"},
            409,
            "declared_in_code",
            "code",
        ),
        (
            {"cron": "* * * * *", "name": "t.tick", "payload": "x" * 200_000},
            413,
            "payload_too_large",
            "bytes",
        ),
    ],
)
async def test_api_refusals_say_which_and_write_nothing(
    api_world: tuple[World, Client], body: dict[str, Any], status: int, code: str, says: str
) -> None:
    w, client = api_world
    before = schedule_rows(w)
    r = await client("POST", "/v1/schedules", body)
    assert (r.status, r.body["error"]["code"]) == (status, code), r.body
    assert says in r.body["error"]["message"]
    assert schedule_rows(w) == before


async def test_api_code_declared_schedules_are_listed_pausable_and_not_deletable(
    api_world: tuple[World, Client],
) -> None:
    w, client = api_world
    await w.run()  # the sync
    r = await client("GET", "/v1/schedules/code.one")
    assert (r.status, r.body["source"]) == (200, "code")
    r = await client("DELETE", "/v1/schedules/code.one")
    assert (r.status, r.body["error"]["code"]) == (409, "declared_in_code")
    assert (await client("POST", "/v1/schedules/code.one/pause")).body["paused"] is True
    assert w.row("code.one")["paused"] == 1


async def test_api_schedules_need_the_token(api_world: tuple[World, Client]) -> None:
    _, client = api_world
    for method, path in [("GET", "/v1/schedules"), ("POST", "/v1/schedules")]:
        r = await client(method, path, {"cron": "* * * * *", "name": "t.tick"}, auth=False)
        assert (r.status, r.body["error"]["code"]) == (401, "unauthorized")


def test_the_definition_version_changes_with_what_a_slot_depends_on() -> None:
    base = ScheduleDef("s", "0 * * * *", "t.tick")
    assert base.version == ScheduleDef("s", "0  *  * * *", "t.tick").version  # whitespace
    for other in (
        ScheduleDef("s", "1 * * * *", "t.tick"),
        ScheduleDef("s", "0 * * * *", "t.other"),
        ScheduleDef("s", "0 * * * *", "t.tick", payload=1),
        ScheduleDef("s", "0 * * * *", "t.tick", queue="q"),
        ScheduleDef("s", "0 * * * *", "t.tick", tz="Europe/Berlin"),
        ScheduleDef("s", "0 * * * *", "t.tick", catch_up="all"),
    ):
        assert other.version != base.version
    assert json.loads(base.payload_json) is None


async def test_a_time_in_new_yorks_repeated_hour_runs_once() -> None:
    """On 1 November 2026 New York's 01:00-02:00 happens twice (EDT, then
    EST): a 01:30 schedule runs at the first one only."""
    reg = registry({"id": "s", "cron": "30 1 * * *", "name": "t.tick", "tz": "America/New_York"})
    w = World(reg, ms(2026, 10, 31, 12, tz=NEW_YORK))
    await w.every_minute(until=ms(2026, 11, 2, 12, tz=NEW_YORK))
    days = per_local_day(w.slots(), NEW_YORK)
    assert days == {"11-01": ["01:30-0400"], "11-02": ["01:30-0500"]}
