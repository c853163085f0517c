"""Every statement d1queue sends is answered from an index, and the claim's
work does not grow with the jobs it does not claim.

The plan test reads EXPLAIN QUERY PLAN for each statement in sql.py (every
module-level SQL string, and each builder at a small size) and fails on any
SCAN of a jobs table. The work tests count SQLite VM instructions on SqliteD1,
which are deterministic: rows read on Miniflare's D1 are counted in
tests/runtime/test_counts_runtime.py."""

from __future__ import annotations

import re

import pytest

from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql
from d1queue.store.queue import D1Queue

from .contract import Clock

JOB_TABLES = ("d1queue_jobs", "d1queue_failed_jobs")
SQL_START = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b")


def statements() -> dict[str, str]:
    found = {}
    for name, value in vars(sql).items():
        if not name.isupper() or name.startswith("_"):
            continue
        if isinstance(value, str) and SQL_START.match(value):
            found[name] = value
        elif isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
            # a pair of statements sent together (CANCEL_JOBS, RUN_NOW)
            for i, part in enumerate(value):
                if SQL_START.match(part):
                    found[f"{name}[{i}]"] = part
    found["insert_jobs(3, unique=False)"] = sql.insert_jobs(3, unique=False)
    found["insert_jobs(3, unique=True)"] = sql.insert_jobs(3, unique=True)
    found["select_job_ids(3)"] = sql.select_job_ids(3)
    found["select_unique_holders(3)"] = sql.select_unique_holders(3)
    return found


def params(statement: str) -> list[int]:
    numbered = [int(n) for n in re.findall(r"\?(\d+)", statement)]
    return [1] * (max(numbered) if numbered else statement.count("?"))


def plan(db: SqliteD1, statement: str) -> list[str]:
    rows = db.query(f"EXPLAIN QUERY PLAN {statement}", *params(statement))
    return [str(r["detail"]) for r in rows]


def test_every_statement_is_covered() -> None:
    """The walk over sql.py finds the statements the driver sends."""
    names = set(statements())
    assert {"SELECT_CANDIDATES", "CLAIM", "DELETE_HELD", "RETRY", "FAIL_RECORD"} <= names
    assert {"SELECT_JOB", "CANCEL_JOBS[1]", "RECLAIM_EXPIRED", "JOB_STATS", "QUEUE_NAMES"} <= names
    assert {"UNCLAIM", "CLAIM_LANDED", "RUN_NOW[0]", "RUN_NOW[1]"} <= names
    assert len(names) >= 30


@pytest.mark.parametrize("name", sorted(statements()))
def test_no_statement_scans_a_jobs_table(db: SqliteD1, name: str) -> None:
    lines = plan(db, statements()[name])
    scans = [line for line in lines if re.match(rf"SCAN ({'|'.join(JOB_TABLES)})\b", line)]
    assert not scans, f"{name}: {lines}"


def test_the_claim_reads_three_heads_by_key_without_sorting(db: SqliteD1) -> None:
    """The ready band from its head; the delayed and locked bands up to now."""
    lines = plan(db, sql.SELECT_CANDIDATES)
    ready = "USING PRIMARY KEY (queue=? AND band>?)"
    assert sum(ready in line for line in lines) == 1, lines
    assert sum("(queue=? AND band=? AND available_at<?)" in line for line in lines) == 2, lines
    assert not any("TEMP B-TREE" in line for line in lines), lines


HELD_KEY = "USING PRIMARY KEY (queue=? AND band=? AND available_at=? AND id=?)"


@pytest.mark.parametrize(
    "name", ["CLAIM", "CLAIM_LAPSED", "CLAIM_LANDED", "UNCLAIM", "DELETE_HELD", "FAIL_RECORD"]
)
def test_a_worker_finds_what_it_holds_by_its_whole_key(db: SqliteD1, name: str) -> None:
    """The drain's statements seek the primary key: queue, band, time and id."""
    lines = plan(db, statements()[name])
    assert any(HELD_KEY in line for line in lines), lines
    assert not any("d1queue_jobs_id" in line for line in lines), lines


def test_a_retry_seeks_its_two_possible_keys(db: SqliteD1) -> None:
    """The lease's end, or (a re-send) the retry time it already moved to."""
    lines = plan(db, sql.RETRY)
    assert any(
        "USING PRIMARY KEY (queue=? AND band=? AND available_at=? AND id=?)" in line
        for line in lines
    ), lines


@pytest.mark.parametrize("name", ["SELECT_JOB", "CANCEL_JOBS[0]", "RUN_NOW[0]"])
def test_lookups_by_id_use_the_id_index(db: SqliteD1, name: str) -> None:
    lines = plan(db, statements()[name])
    assert any("USING INDEX d1queue_jobs_id (id=?)" in line for line in lines), lines


@pytest.mark.parametrize("name", ["SELECT_JOB", "CANCEL_JOBS[1]", "RUN_NOW[1]"])
def test_lookups_of_locked_jobs_walk_the_locked_bands(db: SqliteD1, name: str) -> None:
    lines = plan(db, statements()[name])
    assert any("USING PRIMARY KEY (queue=? AND band=?" in line for line in lines), lines


def seed(db: SqliteD1, *, delayed: int, due: int, in_flight: int = 0, levels: int = 1) -> None:
    """Jobs on `default` at clock 1,000,000: `delayed` waiting for later (over
    `levels` priorities), `due` ready, `in_flight` held by a worker (in the
    locked band, their leases ending later)."""
    insert = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
        "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, priority, band, "
        "available_at, created_at, locked_until, reserved_at, reservation) "
        "SELECT printf('%s%07d', ?2, i), 'default', 't', 'null', 3, i % ?3, "
        "CASE ?4 WHEN 'ready' THEN i % ?3 WHEN 'delayed' THEN "
        f"{sql.DELAYED_BAND} ELSE {sql.LOCKED_BAND} END, ?5 + i, 0, "
        "CASE ?4 WHEN 'held' THEN ?5 + i ELSE 0 END, ?6, ?7 FROM n"
    )
    conn = db._conn
    if delayed:
        conn.execute(insert, (delayed, "d", levels, "delayed", 2_000_000, None, None))
    if due:
        conn.execute(insert, (due, "r", levels, "ready", 0, None, None))
    if in_flight:
        conn.execute(insert, (in_flight, "f", levels, "held", 2_000_000, 1, "t"))


async def claim_steps(db: SqliteD1, n: int = 25) -> tuple[int, int]:
    """VM steps of one candidate SELECT of `n`, and how many it found."""
    queue = D1Queue(db, clock=Clock(1_000_000))
    db.count_vm_steps()
    found = await queue.binding.run(sql.SELECT_CANDIDATES, "default", queue.clock(), n)
    steps = db.vm_steps
    db.count_vm_steps(False)
    return steps, len(found.rows)


@pytest.mark.parametrize("due", [0, 10, 1000])
@pytest.mark.parametrize("levels", [1, 5])
async def test_delayed_jobs_cost_the_claim_nothing(due: int, levels: int) -> None:
    """100k jobs waiting for later, at one or five priorities: the candidate
    SELECT does the same work as with none."""
    bare, deep = SqliteD1(), SqliteD1()
    for db in (bare, deep):
        db.apply_migrations()
        seed(db, delayed=0, due=due, levels=levels)
    seed(deep, delayed=100_000, due=0, levels=levels)
    (base, found), (steps, found_deep) = await claim_steps(bare), await claim_steps(deep)
    assert found == found_deep == min(due, 25)
    assert steps <= base + 10, (base, steps)


async def test_jobs_in_flight_cost_the_claim_nothing() -> None:
    """A held job waits in the locked band, keyed by its lease's end: the
    claim reads that band only up to now, so jobs in flight, however many,
    cost it no work."""
    costs = []
    for in_flight in (0, 100, 1000):
        db = SqliteD1()
        db.apply_migrations()
        seed(db, delayed=1000, due=10, in_flight=in_flight)
        steps, found = await claim_steps(db)
        assert found == 10
        costs.append(steps)
    assert max(costs) <= costs[0] + 10, costs
