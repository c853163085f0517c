"""What a drain sends, counted: the deterministic half of `make bench`
(bench/README.md), as ordinary tests on SqliteD1.

Queries are round trips (a db.batch is one); statements count every statement,
batched or not. The numbers below follow from the drain's design, derived in
each comment; a change to the design that changes them should change them
here on purpose. Rows read and written need D1's meta, which SqliteD1 does not
report: tests/runtime/test_counts_runtime.py checks those on Miniflare's D1.
Timings are never asserted.
"""

from __future__ import annotations

from typing import Any

import pytest
from bench import inside

from d1queue.interfaces.testing import SqliteD1

BATCH = 25

# A drain of 200 queued jobs at batch 25, the queue emptied. A round's 25
# completed jobs are acknowledged by one statement (sql.DELETE_HELD_BATCH),
# and each claim batch reads the next round's candidates, so a round after
# the first is one round trip:
#   paused queues                                     1 query   1 statement
#   round 1: candidate SELECT; [claims + SELECT]      2         1 + 26
#   rounds 2-8: [ack + claims + SELECT]               1 each    27 each
#     (round 8's SELECT finds the queue empty)
#   the last round's ack                              1         1
DRAIN_200 = {"queries": 11, "statements": 218, "rounds": 8}

# One invocation, a batch counting as one query: paused queues (1), the
# first round (2), then rounds of one query while the worst a round can cost
# (3, its settle included) still fits, then the last round's settle (1).
# 50 queries: 46 rounds of 25; 1,000: 996.
JOBS_PER_INVOCATION_QUERY = {50: 46 * BATCH, 1000: 996 * BATCH}

# A batch counting as its statements: a round needs the owed settle + SELECT,
# 25 claims and up to 50 settle statements (every job failing) in what is
# left, so rounds shrink as the budget runs down. The settles are reserved at
# their worst, a statement or two a job; a round whose jobs all complete
# costs one (sql.DELETE_HELD_BATCH), which leaves room for more rounds.
JOBS_PER_INVOCATION_STATEMENTS = {50: 32, 1000: 910}

# The seed's design: reclaim's SELECT, then SELECT + UPDATE + DELETE a job,
# one job at a time, a job started only while its three queries fit.
SEED_JOBS_PER_INVOCATION = {50: 16, 1000: 333}


@pytest.fixture
async def bench_db(db: SqliteD1) -> SqliteD1:
    await inside.setup(db)
    return db


async def drain_of(db: SqliteD1, design: str, backlog: int, **kwargs: Any) -> dict[str, Any]:
    await inside.clear(db)
    run = await inside.invocation(db, design, backlog_n=backlog, **kwargs)
    assert isinstance(run, dict)
    return run


async def test_a_200_job_drain_at_batch_25_costs_18_queries(bench_db: SqliteD1) -> None:
    run = await drain_of(bench_db, "d1queue", 200, query_budget=1000)
    assert run["claimed"] == run["completed"] == 200
    assert {k: run[k] for k in DRAIN_200} == DRAIN_200
    assert run["queries"] / run["claimed"] <= 0.15  # docs/performance.md's target at batch 25
    assert run["stopped"] == "empty"


async def test_each_job_costs_one_claim_and_a_round_one_delete(bench_db: SqliteD1) -> None:
    run = await drain_of(bench_db, "d1queue", 200, query_budget=1000)
    statements = {kind: r["statements"] for kind, r in run["rows_by_kind"].items()}
    # SELECTs: one a round, and the paused-queues read. UPDATEs: a claim a
    # job (a claim takes over lapsed leases: no reclaim). DELETEs: one a
    # round, acknowledging its 25 completed jobs.
    assert statements == {"SELECT": 9 + 1, "UPDATE": 200, "DELETE": 8}


@pytest.mark.parametrize("budget", [50, 1000])
async def test_jobs_per_invocation_when_a_batch_is_one_query(
    bench_db: SqliteD1, budget: int
) -> None:
    run = await drain_of(bench_db, "d1queue", 25_000, query_budget=budget)
    assert run["claimed"] == JOBS_PER_INVOCATION_QUERY[budget]
    assert run["queries"] == budget - 1  # the worst case reserved a query it did not need
    assert run["stopped"] == "query_budget"
    if budget == 50:
        assert run["claimed"] >= 400  # docs/performance.md's target for the free plan


@pytest.mark.parametrize("budget", [50, 1000])
async def test_jobs_per_invocation_when_a_batch_counts_its_statements(
    bench_db: SqliteD1, budget: int
) -> None:
    run = await drain_of(
        bench_db, "d1queue", 2_000, query_budget=budget, batch_counts_as="statements"
    )
    assert run["claimed"] == JOBS_PER_INVOCATION_STATEMENTS[budget]
    assert run["statements"] <= budget


@pytest.mark.parametrize("budget", [50, 1000])
@pytest.mark.parametrize("counts_as", ["query", "statements"])
async def test_the_seed_design_drains_a_job_per_three_queries(
    bench_db: SqliteD1, budget: int, counts_as: str
) -> None:
    run = await drain_of(bench_db, "seed", 2_000, query_budget=budget, batch_counts_as=counts_as)
    assert run["claimed"] == SEED_JOBS_PER_INVOCATION[budget]
    assert run["queries"] == run["statements"] == 1 + 3 * run["claimed"]


async def test_the_seed_design_costs_three_queries_a_job(bench_db: SqliteD1) -> None:
    run = await drain_of(bench_db, "seed", 20, query_budget=1000)
    # reclaim's SELECT, 20 × (SELECT + UPDATE + DELETE), the SELECT that finds
    # the queue empty.
    assert (run["claimed"], run["queries"], run["stopped"]) == (20, 1 + 3 * 20 + 1, "empty")


@pytest.mark.parametrize("fail", [False, True])
async def test_a_job_life_in_statements(bench_db: SqliteD1, fail: bool) -> None:
    life = await inside.job_life(bench_db, "d1queue", 10, fail=fail)
    assert life["done"] == 10
    assert life["push_queries"] == 10  # dispatch: one INSERT, one round trip
    # paused queues; SELECT; the claim batch, reading ahead (it finds the
    # queue empty); the settle batch, alone.
    assert life["drain_queries"] == 4
    statements = {kind: r["statements"] for kind, r in life["rows_by_kind"].items()}
    assert statements == {
        # push, and failing copies the row into the failed table first
        "INSERT": 20 if fail else 10,
        "UPDATE": 10,  # the claims
        "SELECT": 3,  # paused queues, candidates, the read-ahead
        # one acknowledging the batch's 10 completed jobs, or each failure's
        # delete half
        "DELETE": 10 if fail else 1,
    }


def test_the_benchs_cpython_comparison_runs() -> None:
    """`make bench`'s CPython part, at a size that only proves it still runs
    (its timings are the bench's, never asserted)."""
    from bench import cpython

    result = cpython.compare(30)
    assert result["jobs"] == 30 and result["d1queue"]["claim_ack_s"] > 0
