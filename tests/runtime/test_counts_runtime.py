"""What D1 bills, counted by Miniflare's D1: rows read and rows written, for
d1queue's design and the seed's (bench/seed_driver.py), in the Worker's own
Pyodide with the workers SDK. The deterministic half of `make bench`
(bench/README.md); timings are never asserted.

The issue's target of at most 2 rows read per claimed job is not met: 3 is
the floor of a claim protocol whose SELECT, claim UPDATE and acknowledging
DELETE each find the job's row (bench/README.md, "Performance"). The figure
the design does reach is asserted, so it cannot get worse unseen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bench import host as bench_host

from .conftest import Host

BACKLOG = 5_000


@pytest.fixture(scope="module")
def bench(host: Host) -> Iterator[Host]:
    """The session host with bench/ loaded and the seed's tables beside
    d1queue's; every table emptied (and the seed's dropped) afterwards."""
    bench_host.load(host)
    bench_host.call(host, "setup")
    bench_host.call(host, "clear")
    yield host
    bench_host.call(host, "clear")
    bench_host.call(host, "drop_seed_tables")


@pytest.fixture(scope="module")
def drains(bench: Host) -> dict[str, dict[str, Any]]:
    """One invocation of each design at a 5k backlog: d1queue for 41 queries
    (19 rounds of 25), the seed for 61 (20 jobs)."""
    return {
        design: bench_host.call(
            bench, "invocation", design=design, backlog_n=BACKLOG, query_budget=budget
        )
        for design, budget in (("d1queue", 41), ("seed", 61))
    }


@pytest.fixture(scope="module")
def lives(bench: Host) -> dict[str, dict[str, Any]]:
    return {
        f"{design}/{'fail' if fail else 'ack'}": bench_host.call(
            bench, "job_life", design=design, n=20, fail=fail
        )
        for design in ("d1queue", "seed")
        for fail in (False, True)
    }


def per_job(run: dict[str, Any], key: str) -> float:
    return float(run[key]) / run["claimed"]


def test_the_drain_claims_what_its_budget_allows(drains: dict[str, dict[str, Any]]) -> None:
    assert drains["d1queue"]["claimed"] == 19 * 25
    assert drains["seed"]["claimed"] == 20


def test_a_claimed_job_reads_one_row_per_statement(drains: dict[str, dict[str, Any]]) -> None:
    """The candidate SELECT, the claim UPDATE and the acknowledging DELETE read
    one row each, however deep the backlog (the reclaim and the paused-queue
    read add a few rows per invocation)."""
    ours = drains["d1queue"]
    assert per_job(ours, "rows_read") <= 3.05
    by_kind = {k: v["rows_read"] / ours["claimed"] for k, v in ours["rows_by_kind"].items()}
    assert by_kind["SELECT"] == pytest.approx(1, abs=0.02)
    assert by_kind["UPDATE"] == pytest.approx(1, abs=0.02)
    assert by_kind["DELETE"] == 1


def test_the_seed_design_reads_the_whole_backlog_per_claim(
    drains: dict[str, dict[str, Any]],
) -> None:
    """Its (queue, reserved_at) index finds every unreserved row, and ORDER BY
    available_at sorts them all, for each job claimed."""
    seed, ours = drains["seed"], drains["d1queue"]
    assert per_job(seed, "rows_read") >= BACKLOG
    assert per_job(seed, "rows_read") >= 1000 * per_job(ours, "rows_read")


def life_written(life: dict[str, Any]) -> float:
    return float(life["rows_written"]) / life["jobs"]


def test_rows_written_per_job_life(lives: dict[str, dict[str, Any]]) -> None:
    """push 2 (the row, in its WITHOUT ROWID primary key, and its ready-index
    entry), claim 2, acknowledge 1: the target of at most 5. Failing copies
    the row into the failed table (the row and two indexes) before the
    delete."""
    assert all(life["done"] == life["jobs"] for life in lives.values())
    assert life_written(lives["d1queue/ack"]) <= 5
    assert life_written(lives["d1queue/fail"]) <= 9
    assert life_written(lives["d1queue/ack"]) < life_written(lives["seed/ack"])
