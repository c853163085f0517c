"""Flow control on real SQLite: the rules (limits, groups, debounce), the
limits under injected faults, and what a limited round costs. The driver's
behaviours are in tests/contract.py (run here and in Pyodide)."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from typing import Any

import pytest

from d1queue import Config, D1Queue, QueuedJob, Registry, drain
from d1queue.core.bounds import InvalidName, check_group
from d1queue.core.flow import (
    NO_LIMITS,
    RATE_GUARD_MS,
    Flow,
    Limits,
    LimitsError,
    Rate,
    flows_of,
)
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import admission, sql

from .conftest import Clock
from .contract import Recorder, recorded

# -- the rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"concurrency": 0},
        {"concurrency": -1},
        {"concurrency": 1.5},
        {"concurrency": float("inf")},
        {"concurrency": True},
        {"concurrency": "3"},
        {"group_concurrency": 1001},
        {"rate": {"limit": 5}},
        {"rate": {"limit": 5, "period_s": 0}},
        {"rate": {"limit": 5, "period_s": 86_401}},
        {"rate": {"limit": 0, "period_s": 10}},
        {"rate": {"limit": 5, "period_s": 10, "burst": 2}},
        {"rate": [5, 10]},
        {"group_rate": {"limit": 5, "period_s": 1.5}},
        {"concurrency": 3, "max": 4},
        [],
    ],
)
def test_bad_limits_are_refused_with_the_reason(body: Any) -> None:
    with pytest.raises(LimitsError):
        Limits.parse(body)


def test_limits_round_trip_through_their_body() -> None:
    body = {
        "concurrency": 3,
        "group_concurrency": 1,
        "rate": {"limit": 5, "period_s": 10},
        "group_rate": None,
    }
    limits = Limits.parse(body)
    assert limits.as_dict() == body
    assert Limits.from_json(limits.to_json()) == limits
    assert Limits.parse({}) == NO_LIMITS and NO_LIMITS.none
    assert Limits.from_json(None) is None, "no stored limits: the code's apply"
    assert Limits.from_json("{not json") == NO_LIMITS
    assert limits.row("*") == (3, 5, 10_000 + RATE_GUARD_MS)
    assert limits.row("tenant") == (1, 0, 0)
    assert Rate(5, 10).spacing_ms == 2_000 and Rate(3, 10).spacing_ms == 3_334


@pytest.mark.parametrize("group", ["", "a" * 256, "a b", "é", "a/b", 7, None])
def test_a_group_has_the_names_alphabet(group: Any) -> None:
    with pytest.raises(InvalidName):
        check_group(group)
    assert check_group("a" * 255) and check_group("acct:42.eu-1_x")


def test_stored_limits_win_over_the_codes() -> None:
    code = {"a": Limits(concurrency=2), "b": Limits(concurrency=5)}
    flows = flows_of(
        [("a", Limits(concurrency=9).to_json(), False), ("b", "{}", True), ("c", None, True)],
        code,
    )
    assert flows["a"] == Flow(Limits(concurrency=9))
    assert flows["b"] == Flow(NO_LIMITS, True), "stored 'none' wins over the code's 5"
    assert flows["c"] == Flow(NO_LIMITS, True)
    assert flows_of([], code)["b"].limits.concurrency == 5


def test_a_registration_derives_the_group_and_declares_limits() -> None:
    reg = Registry()

    @reg.job("acct.sync", queue="sync", group=lambda p: p["account"], limits=Limits(2, 1))
    async def sync(payload: Any) -> None: ...

    spec = reg.get("acct.sync")
    assert spec is not None
    assert spec.new({"account": 42}).group == "42"
    assert spec.new({"account": "x"}, group="given").group == "given"
    assert reg.limits() == {"sync": Limits(2, 1)}
    with pytest.raises(ValueError, match="group"):
        spec.new({"account": "a b"})
    with pytest.raises(ValueError, match="group rule failed"):
        spec.new({})
    with pytest.raises(ValueError, match="other limits"):
        reg.limit("sync", concurrency=3)


@pytest.mark.parametrize("debounce", [0, -1, float("nan"), True, "5", 10**9])
def test_a_bad_debounce_is_refused(debounce: Any) -> None:
    with pytest.raises(ValueError, match="debounce_s"):
        QueuedJob.new("d", unique_key="k", debounce_s=debounce)


def test_debounce_needs_a_unique_key() -> None:
    with pytest.raises(ValueError, match="unique_key"):
        QueuedJob.new("d", debounce_s=5)


# -- the limits under faults ------------------------------------------------------------


async def test_limits_hold_under_faults_and_lost_replies(db: SqliteD1, clock: Clock) -> None:
    """8 drains at once, again and again, with one call in ten failing before
    it commits or losing its reply after: never more than 3 running nor 2 of
    a group, and every job runs, once."""
    queue = D1Queue(db, clock=clock)
    await queue.set_limits("lim", Limits(concurrency=3, group_concurrency=1))
    rec = Recorder(clock)
    reg = recorded(rec)
    queue = D1Queue(db, clock=clock, registry=reg)
    for i in range(40):
        await queue.dispatch("flow.work", {"g": "abcd"[i % 4], "i": i})
    rng = random.Random(20261204)
    db.fail_when(lambda s: rng.random() < 0.05, times=None)
    db.lose_reply_when(lambda s: rng.random() < 0.05, times=None)
    config = Config(plan="paid", batch_size=4, concurrency=4, queues=("lim",))
    for _ in range(400):
        if len(rec.runs) >= 40:
            break
        await asyncio.gather(*(drain(queue, reg, config) for _ in range(8)))
        clock.advance(1)  # leases (90 s) lapse only for claims left unsettled
    db.clear_faults()
    for _ in range(5):
        clock.advance(120)
        await drain(queue, reg, config)
    assert set(rec.runs) == set(range(40)), sorted(set(range(40)) - set(rec.runs))
    assert rec.most["*"] <= 3, rec.most
    assert all(rec.most[g] <= 1 for g in "abcd"), rec.most
    twice = [p for p, n in rec.runs.items() if n > 1]
    # A settle whose every send failed leaves its job to run again when its
    # lease lapses: the only way a job runs twice, and never at once.
    assert len(twice) <= 4, rec.runs


# -- what a limited round costs -----------------------------------------------------------


async def limited_round_steps(db: SqliteD1, clock: Clock, backlog: int) -> tuple[int, int]:
    """VM steps and queries of a drain that finds its queue at its limit,
    with `backlog` jobs queued behind."""
    queue = D1Queue(db, clock=clock)
    await queue.set_limits("lim", Limits(concurrency=2))
    await queue.push_many(
        [QueuedJob.new("flow.work", {"g": "a", "i": i}, queue="lim") for i in range(2)]
    )
    _, _, flows = await queue.survey()
    held = await queue.settle_and_claim((), "lim", 2, flows=flows)
    assert len(held.jobs) == 2
    for start in range(0, backlog, 100):
        await queue.push_many(
            [
                QueuedJob.new("flow.work", {"g": "a", "i": i}, queue="lim")
                for i in range(start, min(backlog, start + 100))
            ]
        )
    queries = queue.binding.usage.queries
    db.count_vm_steps()
    report = await drain(queue, Registry(), Config(queues=("lim",)))
    steps = db.vm_steps
    db.count_vm_steps(False)
    assert report.claimed == 0 and report.limited == 1 and report.stopped == "empty"
    return steps, queue.binding.usage.queries - queries


async def test_a_round_that_finds_the_queue_at_its_limit_is_one_query_reading_no_job(
    clock: Clock,
) -> None:
    results = []
    for backlog in (10, 2_000):
        db = SqliteD1()
        db.apply_migrations()
        results.append(await limited_round_steps(db, clock, backlog))
    (small, q1), (large, q2) = results
    assert q1 == q2 == 2, "the survey, and the SELECT its guard keeps from reading"
    assert large == small, (small, large)


async def test_a_queue_without_limits_or_groups_claims_as_before(
    db: SqliteD1, clock: Clock
) -> None:
    """Not one statement more: the survey's read is the same rows, and the
    candidates are read by SELECT_CANDIDATES itself."""
    queue = D1Queue(db, clock=clock)
    await queue.push_many([QueuedJob.new("x", i) for i in range(20)])
    db.statements.clear()
    reg = Registry()

    @reg.job("x")
    async def x(payload: Any) -> None: ...

    report = await drain(queue, reg, Config(plan="paid", batch_size=10))
    assert report.completed == 20
    texts = [s for s in db.statements if "d1queue_flow" in s or "d1queue_jobs" in s]
    assert not any("d1queue_flow" in s for s in texts), texts
    assert any(s == sql.SELECT_CANDIDATES for s in db.statements)


async def test_a_grouped_push_keeps_its_groups_tag_and_marks_the_queue(
    db: SqliteD1, clock: Clock
) -> None:
    queue = D1Queue(db, clock=clock)
    ids = [
        await queue.push(QueuedJob.new("x", i, queue="g", group="a", at_ms=clock()))
        for i in range(3)
    ]
    other = await queue.push(QueuedJob.new("x", 9, queue="g", group="b", at_ms=clock()))
    rows = {r["id"]: r for r in db.query("SELECT * FROM d1queue_jobs")}
    tags = [rows[i]["available_at"] for i in ids]
    assert tags == [clock(), clock() + 1, clock() + 2], "a group's jobs a step apart"
    assert rows[other]["available_at"] == clock(), "another group's job goes to the head"
    assert {r["band"] for r in rows.values()} == {sql.GROUP_SHIFT}
    flow = {r["grp"]: r["tag"] for r in db.query("SELECT * FROM d1queue_flow")}
    assert flow == {"a": clock() + 2, "b": clock()}
    assert db.query("SELECT grouped FROM d1queue_queues WHERE name = 'g'") == [{"grouped": 1}]
    job = await queue.job(ids[0])
    assert job is not None and job.group == "a"


async def test_a_group_rate_in_code_spaces_its_groups_jobs(db: SqliteD1, clock: Clock) -> None:
    reg = Registry()
    reg.limit("g", group_rate=Rate(2, 10))
    queue = D1Queue(db, clock=clock, registry=reg)
    for i in range(3):
        await queue.push(QueuedJob.new("x", i, queue="g", group="a", at_ms=clock()))
    tags = sorted(r["available_at"] for r in db.query("SELECT available_at FROM d1queue_jobs"))
    assert tags == [clock(), clock() + 5_000, clock() + 10_000]
    # Stored limits give the spacing too.
    await queue.set_limits("h", Limits(group_rate=Rate(4, 10)))
    queue = D1Queue(db, clock=clock)
    for i in range(2):
        await queue.push(QueuedJob.new("x", i, queue="h", group="a", at_ms=clock()))
    tags = sorted(
        r["available_at"] for r in db.query("SELECT available_at FROM d1queue_jobs WHERE queue='h'")
    )
    assert tags == [clock(), clock() + 2_500]


async def test_a_batch_push_mixes_groups_debounces_and_plain_jobs(
    db: SqliteD1, clock: Clock
) -> None:
    queue = D1Queue(db, clock=clock)
    held = await queue.push(QueuedJob.new("x", "old", unique_key="k", debounce_s=5))
    jobs = [
        QueuedJob.new("x", 1),
        QueuedJob.new("x", 2, group="a"),
        QueuedJob.new("x", "new", unique_key="k", debounce_s=5),
        QueuedJob.new("x", 3, unique_key="u"),
    ]
    out = await queue.push_many(jobs)
    assert out[2] == (held, True) and jobs[2].debounced
    assert [dedup for _, dedup in out] == [False, False, True, False]
    job = await queue.job(held)
    assert job is not None and job.payload == "new"
    assert json.loads(db.query("SELECT payload FROM d1queue_jobs WHERE id = ?", held)[0]["payload"])


async def test_the_grouped_bands_are_read_by_a_plain_reserve(db: SqliteD1, clock: Clock) -> None:
    queue = D1Queue(db, clock=clock)
    await queue.push(QueuedJob.new("x", 1, group="a"))
    job = await queue.reserve("default")
    assert job is not None and job.group == "a"
    assert await queue.complete(job)
    assert Counter(r["grp"] for r in db.query("SELECT grp FROM d1queue_jobs")) == Counter()


def test_jobs_without_a_group_take_one_place_in_each_turn_of_the_groups() -> None:
    from d1queue.store.admission import _order
    from d1queue.store.rows import JOB_COLUMN_NAMES

    def row(id: str, group: str | None, at: int, priority: int = 0) -> list[Any]:
        band = priority + sql.GROUP_SHIFT if group else priority
        values = {
            "id": id, "queue": "q", "name": "x", "payload": "1", "attempts": 0,
            "max_attempts": 3, "priority": priority, "available_at": at, "reserved_at": None,
            "locked_until": 0, "reservation": None, "created_at": 0, "unique_key": None,
            "last_error": None, "band": band, "grp": group, "slot": None, "gslot": None,
            "after": None, "waiting": 0, "batch": None, "dependents": 0,
            "traceparent": None, "cancel_at": None,
        }  # fmt: skip
        return [values[c] for c in JOB_COLUMN_NAMES]

    rows = [row(f"{g}{i}", g, 10 * i + k) for i in range(2) for k, g in enumerate("abc")]
    rows += [row(f"r{i}", None, 100 + i) for i in range(3)]
    rows.append(row("urgent", None, 500, priority=5))
    order = [j.id for j in _order(rows, 20, Flow(grouped=True))]
    assert order == ["urgent", "r0", "a0", "b0", "c0", "r1", "a1", "b1", "c1", "r2"]
    assert [j.id for j in _order(rows, 4, Flow(grouped=True))] == order[:4]


async def test_a_start_is_counted_at_the_databases_time_with_the_walls_clock(
    db: SqliteD1,
) -> None:
    """A claim batch D1 re-sent after a fault commits later than the Worker
    read its clock: with the wall's clock, a rate counts its start at the
    time the batch runs in the database, not the time read before it."""
    from d1queue.core.job import now_ms

    queue = D1Queue(db)  # the wall's clock
    await queue.set_limits("lim", Limits(rate=Rate(5, 10)))
    await queue.push(QueuedJob.new("x", 1, queue="lim"))
    _, _, flows = await queue.survey()
    before = now_ms()
    db.count_vm_steps()  # (slow: the batch runs measurably after `before`)
    done = await queue.settle_and_claim((), "lim", 1, flows=flows)
    db.count_vm_steps(False)
    assert len(done.jobs) == 1
    (flow,) = db.query("SELECT starts FROM d1queue_flow WHERE grp = '*'")
    ((at, _, _),) = json.loads(flow["starts"])
    # SQLite's clock is kept in ms and read through a day count: within a ms.
    assert before - 1 <= at <= now_ms() + 5, (before, at)
    # A test's clock is used as given.
    clock = Clock()
    queue = D1Queue(db, clock=clock)
    await queue.push(QueuedJob.new("x", 2, queue="lim", at_ms=clock()))
    done = await queue.settle_and_claim((), "lim", 1, flows=flows)
    (flow,) = db.query("SELECT starts FROM d1queue_flow WHERE grp = '*'")
    assert [s[0] for s in json.loads(flow["starts"])][-1] == clock()


async def test_a_limited_queue_drains_whole_in_rounds_of_its_limit(
    db: SqliteD1, clock: Clock
) -> None:
    """A read cut to the limit that comes back full is not a queue run dry."""
    reg = Registry()
    ran: list[int] = []

    @reg.job("x", queue="lim")
    async def x(payload: int) -> None:
        ran.append(payload)

    queue = D1Queue(db, clock=clock, registry=reg)
    await queue.set_limits("lim", Limits(concurrency=2))
    for i in range(9):
        await queue.dispatch("x", i)
    report = await drain(queue, reg, Config(plan="paid", queues=("lim",)))
    assert sorted(ran) == list(range(9)) and report.stopped == "empty"
    assert report.rounds == 5
    ran.clear()
    for i in range(9):
        await queue.dispatch("x", i)
    report = await drain(queue, reg, Config(plan="paid", queues=("lim",), max_jobs=4))
    assert len(ran) == 4 and report.stopped == "max_jobs"


async def test_places_are_the_unique_indexes_themselves(db: SqliteD1, clock: Clock) -> None:
    """A drain whose knowledge of the held places is stale (candidates read
    ahead, before another drain claimed) cannot take a place twice: the
    claim into a place another claim holds changes nothing (UPDATE OR
    IGNORE on the slot index), and a claim of a job another drain took
    takes no place."""
    queue = D1Queue(db, clock=clock)
    await queue.set_limits("lim", Limits(concurrency=2))
    ids = [await queue.push(QueuedJob.new("x", i, queue="lim")) for i in range(4)]
    stale = [j for j in [await queue.job(i) for i in ids[:2]] if j is not None]  # read by X
    _, _, flows = await queue.survey()
    y = queue.derive(_occupied={})
    taken = await y.settle_and_claim((), "lim", 1, flows=flows)  # Y takes the first, place 0
    assert [j.id for j in taken.jobs] == ids[:1] and taken.jobs[0].slot == 0
    x = queue.derive(_occupied={})  # X has read no place held
    late = await x.settle_and_claim((), "lim", 2, flows=flows, ahead={"lim": stale})
    # X gives the first job place 0 (held by Y: its job is gone anyway) and
    # the second place 1.
    assert [j.id for j in late.jobs] == ids[1:2] and late.jobs[0].slot == 1
    slots = db.query("SELECT slot FROM d1queue_jobs WHERE slot IS NOT NULL ORDER BY slot")
    assert slots == [{"slot": 0}, {"slot": 1}]
    # Stale again: X believes place 0 free; the index refuses it.
    x2 = queue.derive(_occupied={})
    (rest,) = [j for j in [await queue.job(ids[2])] if j is not None]
    refused = await x2.settle_and_claim((), "lim", 1, flows=flows, ahead={"lim": [rest]})
    assert refused.jobs == [] and refused.limited == 1
    assert len(db.query("SELECT 1 FROM d1queue_jobs WHERE slot IS NOT NULL")) == 2


@pytest.mark.parametrize(
    ("limits", "grouped", "reads"),
    [
        (NO_LIMITS, True, 25),
        (Limits(concurrency=10), False, 10),
        (Limits(rate=Rate(4, 60)), True, 4),
        (Limits(concurrency=10, rate=Rate(4, 60)), True, 4),
        (Limits(concurrency=10, group_concurrency=1), True, 20),
        (Limits(concurrency=10, group_concurrency=2), False, 2),
        (Limits(group_concurrency=1), True, 25),
        (Limits(group_concurrency=3), False, 3),
        (Limits(concurrency=40), True, 25),
    ],
)
def test_a_round_reads_no_more_candidates_than_its_limits_let_it_claim(
    limits: Limits, grouped: bool, reads: int
) -> None:
    assert admission._reads(25, Flow(limits, grouped)) == reads
    assert admission._reads(25, None) == 25
