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

from d1queue import sql
from d1queue.queue import D1Queue
from d1queue.testing import SqliteD1

from .contract import Clock

JOB_TABLES = ("d1queue_jobs", "d1queue_failed_jobs")
SQL_START = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b")


def statements() -> dict[str, str]:
    found = {
        name: value
        for name, value in vars(sql).items()
        if name.isupper()
        and not name.startswith("_")
        and isinstance(value, str)
        and SQL_START.match(value)
    }
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
    assert {"SELECT_JOB", "CANCEL_JOB", "RECLAIM_EXPIRED", "JOB_STATS", "QUEUE_NAMES"} <= names
    assert len(names) >= 30


@pytest.mark.parametrize("name", sorted(statements()))
def test_no_statement_scans_a_jobs_table(db: SqliteD1, name: str) -> None:
    lines = plan(db, statements()[name])
    scans = [line for line in lines if re.match(rf"SCAN ({'|'.join(JOB_TABLES)})\b", line)]
    assert not scans, f"{name}: {lines}"


def test_the_claim_reads_both_bands_by_key_without_sorting(db: SqliteD1) -> None:
    lines = plan(db, sql.SELECT_CANDIDATES)
    assert sum("USING PRIMARY KEY (queue=? AND band>?)" in line for line in lines) == 1, lines
    assert sum("(queue=? AND band=? AND available_at<?)" in line for line in lines) == 1, lines
    assert not any("TEMP B-TREE" in line for line in lines), lines


@pytest.mark.parametrize("name", ["CLAIM", "DELETE_HELD", "RETRY", "SELECT_JOB", "CANCEL_JOB"])
def test_lookups_by_id_use_the_id_index(db: SqliteD1, name: str) -> None:
    lines = plan(db, statements()[name])
    assert any("USING INDEX d1queue_jobs_id (id=?)" in line for line in lines), lines


def seed(db: SqliteD1, *, delayed: int, due: int, in_flight: int = 0, levels: int = 1) -> None:
    """Jobs on `default` at clock 1,000,000: `delayed` waiting for later (over
    `levels` priorities), `due` ready, `in_flight` held by a worker."""
    insert = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
        "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, priority, band, "
        "available_at, created_at, locked_until, reserved_at, reservation) "
        "SELECT printf('%s%07d', ?2, i), 'default', 't', 'null', 3, i % ?3, "
        f"CASE WHEN ?4 THEN {sql.DELAYED_BAND} ELSE i % ?3 END, ?5 + i, 0, ?6, ?7, ?8 FROM n"
    )
    conn = db._conn
    if delayed:
        conn.execute(insert, (delayed, "d", levels, 1, 2_000_000, 0, None, None))
    if due:
        conn.execute(insert, (due, "r", levels, 0, 0, 0, None, None))
    if in_flight:
        conn.execute(insert, (in_flight, "f", levels, 0, -in_flight, 9e12, 1, "t"))


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


async def test_jobs_in_flight_cost_the_claim_one_row_each() -> None:
    """A held job sits in the key where it was claimed; the claim reads past
    it, once per SELECT: the work grows by a few steps per job in flight."""
    costs = []
    for in_flight in (0, 100, 200):
        db = SqliteD1()
        db.apply_migrations()
        seed(db, delayed=1000, due=50, in_flight=in_flight)
        steps, found = await claim_steps(db)
        assert found == 25
        costs.append(steps)
    per_job = (costs[2] - costs[1]) / 100
    assert costs[1] - costs[0] == costs[2] - costs[1], costs
    assert per_job <= 12, costs
