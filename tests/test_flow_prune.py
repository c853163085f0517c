"""The cron prunes d1queue_flow (core/config.py PRUNE_FLOW; store/sql.py
PRUNE_FLOW): a group's row goes once it holds nothing (no start within its
rate window, a fair tag that orders no job any more), at a bounded cost a
run, in the cron's one read batch; a row still in use stays, and a push
racing the prune keeps its group's tag."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from d1queue import Config, D1Queue, QueuedJob, Registry, drain
from d1queue.core.config import PRUNE_FLOW
from d1queue.core.flow import LONGEST_WINDOW_MS, Limits, Rate
from d1queue.features.cron import ShardRun, cron
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql
from d1queue.store.schedules import Schedules
from d1queue.store.shardset import ShardQueue, ShardSet

from .conftest import Clock


def registry() -> Registry:
    reg = Registry()

    @reg.job("x")
    async def x(payload: Any) -> None:
        return None

    return reg


async def run_cron(queue: D1Queue, reg: Registry, config: Config | None = None) -> ShardRun:
    async def run_drain(q: ShardQueue, c: Config) -> Any:
        return await drain(q, reg, c)

    (run,) = await cron(
        ShardSet.of(queue),
        reg,
        config or Config(),
        now=queue.clock(),
        grace_ms=0,
        due_limit=10,
        run_drain=run_drain,
    )
    assert not run.schedules.error, run.schedules
    return run


def flow_rows(db: SqliteD1, queue: str | None = None) -> dict[tuple[str, str], int]:
    rows = db.query("SELECT queue, grp, tag FROM d1queue_flow ORDER BY queue, grp")
    return {(r["queue"], r["grp"]): r["tag"] for r in rows if queue in (None, r["queue"])}


def add_rows(db: SqliteD1, queue: str, groups: list[str], starts: list[Any], tag: int) -> None:
    for g in groups:
        db.query(
            "INSERT INTO d1queue_flow (queue, grp, starts, tag) VALUES (?1, ?2, ?3, ?4)",
            queue,
            g,
            json.dumps(starts),
            tag,
        )


async def test_the_rows_of_groups_whose_jobs_are_gone_are_pruned_by_one_cron_run(
    db: SqliteD1, clock: Clock
) -> None:
    """100 groups pushed, their jobs deleted: one cron run of the free plan
    deletes their 100 rows, in its one read batch, and logs the count."""
    reg = registry()
    queue = D1Queue(db, clock=clock, registry=reg)
    for i in range(100):
        await queue.dispatch("x", i, group=f"user-{i}")
    assert len(flow_rows(db)) == 100
    assert await queue.clear("default") == 100
    clock.advance(1)
    run = await run_cron(queue, reg)
    assert run.schedules.pruned_flow == 100 and run.schedules.queries == 1
    assert run.schedules.as_dict()["pruned_flow"] == 100  # in the cron's log line
    assert flow_rows(db) == {}
    # A group pushed again starts afresh: its row and tag come back.
    await queue.dispatch("x", "again", group="user-7")
    assert flow_rows(db) == {("default", "user-7"): clock()}


async def test_a_groups_row_stays_while_its_tag_orders_a_job(db: SqliteD1, clock: Clock) -> None:
    """Group a has jobs waiting their turn. Group b's one job, pushed behind
    them, took the band's head for its tag, and was deleted: b's next job
    goes behind a's oldest, which only b's row says. Group c's job, alone
    on its queue, was deleted too: c holds nothing. Only c's row goes, and
    each group's next push gets the tag it would have got with every row
    kept."""
    reg = registry()
    queue = D1Queue(db, clock=clock, registry=reg)
    t0 = clock()
    for i in range(3):
        await queue.push(QueuedJob.new("x", i, queue="g", group="a", at_ms=clock()))
    clock.advance(5)
    b = await queue.push(QueuedJob.new("x", "b", queue="g", group="b", at_ms=clock()))
    c = await queue.push(QueuedJob.new("x", "c", queue="h", group="c", at_ms=clock()))
    db.query("DELETE FROM d1queue_jobs WHERE id IN (?1, ?2)", b, c)
    clock.advance(5)
    before = flow_rows(db)
    assert before == {("g", "a"): t0 + 2, ("g", "b"): t0, ("h", "c"): t0 + 5000}
    report = await Schedules(queue, reg).run(prune_flow_limit=100)
    assert report.pruned_flow == 1, report
    assert flow_rows(db) == {("g", "a"): t0 + 2, ("g", "b"): t0}
    a2 = await queue.push(QueuedJob.new("x", "a2", queue="g", group="a", at_ms=clock()))
    b2 = await queue.push(QueuedJob.new("x", "b2", queue="g", group="b", at_ms=clock()))
    c2 = await queue.push(QueuedJob.new("x", "c2", queue="h", group="c", at_ms=clock()))
    tags = {
        r["id"]: r["available_at"]
        for r in db.query("SELECT id, available_at FROM d1queue_jobs WHERE band > 1000")
    }
    assert (tags[a2], tags[b2]) == (t0 + 3, t0 + 1), "behind the head, as the rows say"
    assert tags[c2] == clock(), "an empty band's head is now, with or without c's row"


async def test_a_groups_row_stays_while_a_start_is_in_its_rate_window(
    db: SqliteD1, clock: Clock
) -> None:
    """A group rate declared in code (1 a second: a window of 2 s with the
    guard) and one stored over the API (1 in 5 s: 6 s): a start counts for
    its window, then its row goes."""
    reg = registry()
    reg.limit("coded", group_rate=Rate(1, 1))
    queue = D1Queue(db, clock=clock, registry=reg)
    await queue.set_limits("stored", Limits(group_rate=Rate(1, 5)))
    for name in ("coded", "stored"):
        await queue.push(QueuedJob.new("x", name, queue=name, group="t", at_ms=clock()))
    report = await drain(queue, reg, Config())
    assert report.completed == 2
    starts = {r["queue"]: json.loads(r["starts"]) for r in db.query("SELECT * FROM d1queue_flow")}
    assert all(len(s) == 1 for s in starts.values()), starts
    pruned = []
    for step_s in (0.5, 1.0, 1.0, 2.0, 2.0):
        clock.advance(step_s)
        report = await Schedules(queue, reg).run(prune_flow_limit=100)
        pruned.append(sorted(q for q, _ in flow_rows(db)))
    # At 0.5 and 1.5 s both stay; past 2 s the coded one goes; past 6 s both.
    assert pruned == [
        ["coded", "stored"],
        ["coded", "stored"],
        ["stored"],
        ["stored"],
        [],
    ], pruned


async def test_starts_under_a_rate_this_worker_does_not_know_stay_a_day(
    db: SqliteD1, clock: Clock
) -> None:
    """Starts on a queue with no rate stored or declared here (another
    Worker's code may declare one) count for the longest window a rate may
    have."""
    reg = registry()
    queue = D1Queue(db, clock=clock, registry=reg)
    add_rows(db, "elsewhere", ["t", "*"], [[clock(), "j", 0]], 0)
    clock.advance((LONGEST_WINDOW_MS - 1000) / 1000)
    assert (await Schedules(queue, reg).run(prune_flow_limit=100)).pruned_flow == 0
    clock.advance(1.001)
    assert (await Schedules(queue, reg).run(prune_flow_limit=100)).pruned_flow == 2
    assert flow_rows(db) == {}


async def test_a_run_looks_at_a_bounded_window_and_every_row_in_turn(
    db: SqliteD1, clock: Clock
) -> None:
    """Rows in use ahead of the rows that hold nothing in key order: each run
    looks at its limit's worth from where the last stopped (the cursor in
    d1queue_meta), so the idle ones all go within a turn of the table, and a
    run costs the same on a table ten times larger."""
    reg = registry()
    queue = D1Queue(db, clock=clock, registry=reg)
    limit = 20

    async def run() -> tuple[int, int]:
        db.count_vm_steps()
        report = await Schedules(queue, reg).run(prune_flow_limit=limit)
        steps = db.vm_steps
        db.count_vm_steps(False)
        assert not report.error, report
        return report.pruned_flow, steps

    add_rows(db, "q", [f"busy{i:04d}" for i in range(100)], [], clock() + 60_000)
    add_rows(db, "q", [f"idle{i:04d}" for i in range(30)], [], clock() - 60_000)
    runs = [await run() for _ in range(130 // limit + 1)]
    assert [n for n, _ in runs] == [0, 0, 0, 0, 0, 20, 10], runs
    assert set(flow_rows(db)) == {("q", f"busy{i:04d}") for i in range(100)}
    small = max(s for _, s in runs[:5])

    add_rows(db, "q", [f"busz{i:04d}" for i in range(2_000)], [], clock() + 60_000)
    runs = [await run() for _ in range(3)]
    assert all(n == 0 for n, _ in runs)
    assert max(s for _, s in runs) < 1.5 * small, (runs, small)


async def test_a_table_within_one_window_writes_its_cursor_once(db: SqliteD1, clock: Clock) -> None:
    """An empty table writes no cursor; a table of fewer rows than a run
    looks at writes it once, with its first row, and never moves it."""
    reg = registry()
    queue = D1Queue(db, clock=clock, registry=reg)

    def cursor() -> list[Any]:
        return [
            dict(r)
            for r in db.query("SELECT * FROM d1queue_meta WHERE key = ?1", sql.FLOW_CURSOR_KEY)
        ]

    await Schedules(queue, reg).run(prune_flow_limit=PRUNE_FLOW["free"])
    assert cursor() == []
    add_rows(db, "q", ["busy"], [], clock() + 3_600_000)
    first = clock()
    for _ in range(3):
        report = await Schedules(queue, reg).run(prune_flow_limit=PRUNE_FLOW["free"])
        assert report.pruned_flow == 0 and not report.error, report
        clock.advance(60)
    assert cursor() == [{"key": sql.FLOW_CURSOR_KEY, "value": '["","",null]', "updated_at": first}]


async def test_a_push_racing_the_prune_keeps_its_groups_tag(
    shared_file: Path, clock: Clock
) -> None:
    """Two Workers on one database: one runs the cron while the other pushes
    into groups whose rows the prune would delete. Whichever lands first,
    every group pushed ends with its row, holding its new job's tag."""
    reg = registry()
    a, b = SqliteD1(shared_file), SqliteD1(shared_file)
    qa, qb = D1Queue(a, clock=clock, registry=reg), D1Queue(b, clock=clock, registry=reg)
    groups = [f"g{i}" for i in range(40)]
    for g in groups:
        await qa.push(QueuedJob.new("x", g, group=g, at_ms=clock()))
    await qa.clear("default")
    clock.advance(1)

    async def push(g: str) -> str:
        await asyncio.sleep(0)
        return await qb.push(QueuedJob.new("x", g, group=g, at_ms=clock()))

    async def prune() -> int:
        return (await Schedules(qa, reg).run(prune_flow_limit=100)).pruned_flow

    results = await asyncio.gather(*(push(g) for g in groups[::2]), prune(), return_exceptions=True)
    assert not any(isinstance(r, BaseException) for r in results), results
    pushed = {
        r["grp"]: r["available_at"] for r in a.query("SELECT grp, available_at FROM d1queue_jobs")
    }
    assert set(pushed) == set(groups[::2])
    rows = flow_rows(a)
    assert {g: rows[("default", g)] for g in pushed} == pushed
    # The rest held nothing and went, in this run or the next.
    await prune()
    assert set(flow_rows(a)) == {("default", g) for g in pushed}


@pytest.mark.parametrize("plan", ["free", "paid"])
async def test_the_cron_shares_the_plans_bound_over_the_shards(
    db: SqliteD1, clock: Clock, plan: str
) -> None:
    reg = registry()
    queue = D1Queue(db, clock=clock, registry=reg)
    add_rows(db, "q", [f"idle{i:05d}" for i in range(PRUNE_FLOW[plan] + 5)], [], 0)
    run = await run_cron(queue, reg, Config(plan=plan))  # type: ignore[arg-type]
    assert run.schedules.pruned_flow == PRUNE_FLOW[plan]
    run = await run_cron(queue, reg, Config(plan=plan))  # type: ignore[arg-type]
    assert run.schedules.pruned_flow == 5
