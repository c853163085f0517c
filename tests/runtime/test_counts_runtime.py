"""What D1 bills, counted by Miniflare's D1: rows read and rows written, for
d1queue's design and the seed's (bench/seed_driver.py), in the Worker's own
Pyodide with the workers SDK. The deterministic half of `make bench`
(bench/README.md); timings are never asserted.

Reads: a claimed job costs its candidate SELECT, its claim UPDATE and its
acknowledging DELETE one row each, plus a row a round for the probes of the
delayed and locked bands, whatever the backlog holds: delayed jobs and jobs
in flight are never read. Writes: a job's life is 4 rows (push 2, claim 1,
acknowledge 1), a failed one 7, a retry 1.

Workflows (wf_* at the end): a life without history writes 4 rows, with
history 5 and 1 more when pruned; a completion writes 2 rows per dependent
released (3 unkept) plus a constant; waiting jobs cost a claim nothing; the
last job of a batch costs the same at 10 or 1,000; a prune reads in
proportion to what it deletes.
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
    (37 rounds of 25: after the first, a round is one query), the seed for 61
    (20 jobs)."""
    return {
        design: bench_host.call(
            bench, "invocation", design=design, backlog_n=BACKLOG, query_budget=budget
        )
        for design, budget in (("d1queue", 41), ("seed", 61))
    }


@pytest.fixture(scope="module")
def lives(bench: Host) -> dict[str, dict[str, Any]]:
    return {
        f"{design}/{'fail' if fail else 'complete'}": bench_host.call(
            bench, "job_life", design=design, n=20, fail=fail
        )
        for design in ("d1queue", "seed")
        for fail in (False, True)
    }


def per_job(run: dict[str, Any], key: str) -> float:
    return float(run[key]) / run["claimed"]


def test_the_drain_claims_what_its_budget_allows(drains: dict[str, dict[str, Any]]) -> None:
    assert drains["d1queue"]["claimed"] == 37 * 25
    assert drains["seed"]["claimed"] == 20


def test_a_claimed_job_reads_one_row_per_statement(drains: dict[str, dict[str, Any]]) -> None:
    """The candidate SELECT, the claim UPDATE and the acknowledging DELETE read
    about one row each, however deep the backlog (the delayed band's probe and the
    paused-queue read add a few rows per invocation)."""
    ours = drains["d1queue"]
    by_kind = {k: v["rows_read"] / ours["claimed"] for k, v in ours["rows_by_kind"].items()}
    # The ready band's 25 rows and the probes of the delayed and locked bands,
    # a round; and the last round's read-ahead, whose candidates the budget
    # leaves unclaimed.
    assert 1 + 2 / 25 <= by_kind["SELECT"] <= 1 + 3 / 25
    assert by_kind["UPDATE"] == pytest.approx(1, abs=0.02)
    # A round's completed jobs in one DELETE of their range of the key: their
    # rows, in one pass (no trigger on the table's DELETE: a workflow's job
    # is ended by an UPDATE first), and at most one past the range.
    assert by_kind["DELETE"] == pytest.approx(1, abs=1 / 25)
    assert per_job(ours, "rows_read") <= 3.15


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
    """push 2 (the row, keyed in claim order, and its id-index entry), claim 1
    and acknowledge 1 (neither touches a key): 4. Failing copies the row into
    the failed table (the row and its two indexes) before the delete: 7."""
    assert all(life["done"] == life["jobs"] for life in lives.values())
    assert life_written(lives["d1queue/complete"]) == 4
    assert life_written(lives["d1queue/fail"]) == 7
    assert life_written(lives["d1queue/complete"]) < life_written(lives["seed/complete"])


@pytest.mark.parametrize("delay_s", [5.0, 3600.0])
def test_a_retry_writes_one_row(bench: Host, delay_s: float) -> None:
    """A retry, short or long, moves the job within the locked band to its
    retry time: the row, no index entry."""
    cost = bench_host.call(bench, "retry_cost", n=20, delay_s=delay_s)
    assert cost["retried"] == 20
    assert cost["rows_written"] == 20


DELAYED = 100_000


@pytest.fixture(scope="module")
def backlog_costs(bench: Host) -> dict[tuple[int, int, int], dict[str, Any]]:
    """One claim round of 25 at 100k delayed jobs, by (due, levels, in flight)."""
    out = {}
    for due, levels, in_flight in (
        (0, 1, 0),
        (10, 1, 0),
        (1000, 1, 0),
        (0, 5, 0),
        (1000, 5, 0),
        (1000, 1, 100),
        (1000, 1, 1000),
        (0, 1, 1000),
        (10, 1, 1000),
        (10, 5, 1000),
    ):
        bench_host.call(
            bench, "seed_jobs", delayed=DELAYED, due=due, levels=levels, in_flight=in_flight
        )
        out[(due, levels, in_flight)] = bench_host.call(bench, "claim_cost", n=25)
    bench_host.call(bench, "seed_jobs")  # and empty the queue again
    return out


def read_per_claimed(cost: dict[str, Any]) -> float:
    rows = cost["select_rows_read"] + cost["claim_rows_read"] + cost["ack_rows_read"]
    return float(rows) / cost["claimed"]


def test_delayed_jobs_are_never_read(
    backlog_costs: dict[tuple[int, int, int], dict[str, Any]],
) -> None:
    for (due, levels, in_flight), cost in backlog_costs.items():
        assert cost["claimed"] == min(due, 25), (due, levels, in_flight)
        if due:
            assert read_per_claimed(cost) <= 4, (due, levels, in_flight, cost)
        if not due:
            # The SELECT that finds nothing: a probe of each band.
            assert cost["select_rows_read"] <= levels + 2, (levels, cost)


def test_a_claim_and_its_ack_write_one_row_each(
    backlog_costs: dict[tuple[int, int, int], dict[str, Any]],
) -> None:
    cost = backlog_costs[(1000, 5, 0)]
    assert cost["claim_rows_written"] == cost["ack_rows_written"] == 25
    assert cost["claim_rows_read"] == cost["ack_rows_read"] == 25


def test_jobs_in_flight_cost_the_claim_nothing(
    backlog_costs: dict[tuple[int, int, int], dict[str, Any]],
) -> None:
    """Held jobs wait in the locked band, keyed by their leases' ends: the
    SELECT reads that band up to now, a probe of one row however many are in
    flight (the target allows one extra row per claimed job per 25)."""
    for due in (10, 1000):
        base = backlog_costs[(due, 1, 0)]
        for in_flight in (100, 1000) if due == 1000 else (1000,):
            cost = backlog_costs[(due, 1, in_flight)]
            assert cost["claimed"] == min(due, 25)
            extra = read_per_claimed(cost) - read_per_claimed(base)
            assert extra <= 1 / cost["claimed"], (due, in_flight, extra)
    assert backlog_costs[(0, 1, 1000)]["select_rows_read"] <= 3


def test_a_job_reserved_alone_reads_five_rows(bench: Host) -> None:
    """`reserve()` (the seed's one-job surface) behind 100k delayed jobs and
    1,000 in flight: the head of each band (3 rows), the claim and the
    acknowledgement."""
    bench_host.call(bench, "seed_jobs", delayed=DELAYED, due=100, in_flight=1000)
    cost = bench_host.call(bench, "reserve_cost", n=10)
    bench_host.call(bench, "seed_jobs")
    assert cost["reserved"] == 10
    assert cost["rows_read"] <= 5 * 10, cost


def test_finding_the_queues_reads_about_two_rows_each(bench: Host) -> None:
    """A drain on "*" finds every queue by a walk of the key: one seek per
    queue (and a row of the walk's own), whatever each queue holds; the
    paused-queue read rides in the same statement batch."""
    small = bench_host.call(bench, "queue_walk_cost", queues=5, jobs_per_queue=10)
    big = bench_host.call(bench, "queue_walk_cost", queues=5, jobs_per_queue=2000)
    assert small["queues"] == big["queues"] == 5
    assert small["rows_read"] == big["rows_read"] <= 2 * 5 + 3


# -- flow control (bench/inside.py, flow_*) ---------------------------------------------

LIMITS = {"concurrency": 10, "group_concurrency": 1}
FLOW_BACKLOG = 2_000


@pytest.fixture(scope="module")
def flow_drains(bench: Host) -> dict[tuple[str, int], dict[str, Any]]:
    """One invocation of 41 queries on a queue of 2,000 grouped jobs, by
    (fair turns alone or under LIMITS, number of groups)."""
    return {
        (kind, groups): bench_host.call(
            bench,
            "flow_drain",
            n=FLOW_BACKLOG,
            groups=groups,
            limits=limits,
            query_budget=41,
        )
        for kind, limits in (("fair", None), ("limits", LIMITS))
        for groups in (10, 10_000)
    }


def by_statement(run: dict[str, Any], prefix: str, key: str = "rows_read") -> float:
    """`key` of the statements whose name starts with `prefix`, per claimed job."""
    total = sum(v[key] for k, v in run["by_statement"].items() if k.startswith(prefix))
    return float(total) / run["claimed"]


def test_fair_groups_cost_a_claim_what_a_plain_queue_does(
    drains: dict[str, dict[str, Any]], flow_drains: dict[tuple[str, int], dict[str, Any]]
) -> None:
    """Grouped jobs without limits: the grouped bands' head is a fourth range
    of the same SELECT (its probe a row a round), claimed and acknowledged as
    any job, and a round is still one query."""
    plain = drains["d1queue"]
    for groups in (10, 10_000):
        run = flow_drains[("fair", groups)]
        assert run["claimed"] == plain["claimed"] == 37 * 25
        assert run["queries"] == plain["queries"]
        # A row a round each: the grouped range's probe, and the batch
        # delete's row past its range (another queue's, after this one's).
        assert by_statement(run, "select_flow_candidates") <= 1 + 4 / 25 + 0.01
        assert by_statement(run, "CLAIM") == 1
        assert by_statement(run, "DELETE_HELD") <= 1 + 1 / 25
        extra = per_job(run, "rows_read") - per_job(plain, "rows_read")
        assert 0 <= extra <= 2 / 25 + 0.01, (groups, extra)
        assert run["rows_written"] == plain["rows_written"] == 2 * run["claimed"]


def test_limits_cost_a_claimed_job_its_places_and_no_more(
    drains: dict[str, dict[str, Any]], flow_drains: dict[tuple[str, int], dict[str, Any]]
) -> None:
    """concurrency 10 and group_concurrency 1: rounds of 10 (one query
    each). A claim takes its places as index entries of its own row (one
    row written each, nothing read to check them: a unique index's probe
    that finds no entry reads no row); a round reads the queue's held
    places (one index entry each) and twice the limit in candidates."""
    plain = drains["d1queue"]
    for groups in (10, 10_000):
        run = flow_drains[("limits", groups)]
        assert run["claimed"] == 37 * 10, groups
        assert run["rows_written"] == 4 * run["claimed"]
        assert by_statement(run, "claim_limited") == 1
        assert by_statement(run, "claim_limited", "rows_written") == 3
        assert by_statement(run, "OCCUPIED_SLOTS") <= 1 + 1 / 10
        assert by_statement(run, "DELETE_HELD") <= 1 + 1 / 10
        assert by_statement(run, "select_flow_candidates") <= (20 + 4) / 10 + 0.1
        extra = per_job(run, "rows_read") - per_job(plain, "rows_read")
        assert extra <= 3, (groups, extra)


@pytest.fixture(scope="module")
def flow_lives(bench: Host) -> dict[str, dict[str, Any]]:
    """20 jobs pushed one at a time then drained, by (limits or not, groups)."""
    return {
        f"{kind}/{groups}": bench_host.call(bench, "flow_life", n=20, groups=groups, limits=limits)
        for kind, limits, groups in (
            ("limits", LIMITS, 0),
            ("fair", None, 10),
            ("limits", LIMITS, 10),
        )
    }


def test_limits_write_two_rows_more_per_job_life(
    lives: dict[str, dict[str, Any]], flow_lives: dict[str, dict[str, Any]]
) -> None:
    """A claim under a queue's and a group's concurrency writes its two
    places (an index entry each) with its own row, and its settle frees them
    at no cost; a grouped push writes its group's fair tag (and the queue's
    mark, once: its d1queue_queues row and that table's name index)."""
    assert all(life["done"] == life["jobs"] for life in flow_lives.values())
    plain = life_written(lives["d1queue/complete"])
    assert life_written(flow_lives["limits/0"]) == plain + 2
    fair, limited = flow_lives["fair/10"], flow_lives["limits/10"]
    assert fair["push_rows_written"] == 3 * 20 + 2
    assert limited["push_rows_written"] == 3 * 20 + 1  # the row exists (its limits)
    assert fair["drain_rows_written"] == 2 * 20
    assert limited["drain_rows_written"] == 4 * 20
    assert life_written(limited) == life_written(fair) + 2 - 1 / 20


def test_a_drain_meeting_its_queues_limit_reads_no_job_of_the_backlog(bench: Host) -> None:
    """10 places held by another drain: one query after the survey, whose
    guard counts the 10 held places (index entries, cut off at the limit)
    and whose read of the places reads them again, plus a row of the guard
    per range (and the locked band's due head, which a lapsed lease's job
    would be in), whatever waits behind."""
    runs = [
        bench_host.call(bench, "limited_round", backlog=backlog, concurrency=10)
        for backlog in (100, 5_000)
    ]
    for run in runs:
        assert run["claimed"] == 0 and run["limited"] == 1, run
        assert run["queries"] == 2
        select = {k: v for k, v in run["by_statement"].items() if k != "QUEUE_FLOWS"}
        assert sum(v["statements"] for v in select.values()) == 2
        assert sum(v["rows_read"] for v in select.values()) <= 2 * 10 + 5
        assert run["rows_written"] == 0
    assert runs[0]["rows_read"] == runs[1]["rows_read"]


# -- workflows: history, dependencies, batches (bench/inside.py, wf_*) ------------------


@pytest.fixture(scope="module")
def wf_lives(bench: Host) -> dict[str, dict[str, Any]]:
    """20 jobs pushed one by one then drained, by history: "off"
    (D1QUEUE_KEEP_COMPLETED_S = 0), "opted_out" (registry.history(q,
    keep=False)), "kept"; each followed by the prune of what it kept."""
    return {
        history: bench_host.call(bench, "wf_life", n=20, history=history)
        for history in ("off", "opted_out", "kept")
    }


def test_a_life_without_history_writes_four_rows(wf_lives: dict[str, dict[str, Any]]) -> None:
    """Opted out either way, a job's life writes what it did before
    workflows: push 2, claim 1, the acknowledging DELETE 1; nothing kept,
    nothing for the prune."""
    for history in ("off", "opted_out"):
        life = wf_lives[history]
        assert life["done"] == life["jobs"] and life["kept"] == 0, history
        assert life_written(life) == 4, history
        assert life["by_statement"]["DELETE_HELD_BATCH_PLAIN"]["rows_written"] == life["jobs"]
        assert life["prune_deleted"] == life["prune_rows_written"] == 0


def test_a_life_with_history_writes_six_rows(wf_lives: dict[str, dict[str, Any]]) -> None:
    """Kept: the completion moves the row to the done band (1) and enters
    the done index (1): 5 rows a life, then 1 when the prune deletes it:
    6, today's 4 + 2."""
    life = wf_lives["kept"]
    n = life["jobs"]
    assert life["done"] == life["kept"] == n
    assert life_written(life) == 5
    assert life["by_statement"]["COMPLETE_HELD_BATCH"]["rows_written"] == 2 * n
    assert life["prune_deleted"] == n
    assert life["prune_rows_written"] == n
    assert life_written(life) + life["prune_rows_written"] / n == 4 + 2


@pytest.fixture(scope="module")
def wf_dependents(bench: Host) -> dict[tuple[int, bool], dict[str, Any]]:
    """A job completing with k dependents (each waiting for it alone), by
    (k, history kept)."""
    return {
        (k, keep): bench_host.call(bench, "wf_dependents", k=k, keep=keep)
        for k in (1, 10, 100)
        for keep in (True, False)
    }


def test_a_completion_writes_a_constant_and_a_few_rows_per_dependent(
    wf_dependents: dict[tuple[int, bool], dict[str, Any]],
) -> None:
    """Kept, the settle is one statement whatever the dependents; its
    trigger releases each (the row moves from the waiting band to its ready
    band: the row, and its id-index entry, which holds the key); unkept, the
    dependency's edges are deleted too (a row each). Linear in the
    dependents, never in anything else: per dependent 2 rows written kept,
    3 unkept (the target of 1 a dependent is not met: the released row's
    id-index entry is the second)."""
    for (k, keep), cost in wf_dependents.items():
        assert cost["landed"] is True and cost["released"] == k, (k, keep, cost)
        # Unkept, a job read as waited for is ended (the trigger) and deleted:
        # two statements of one batch.
        assert (cost["queries"], cost["statements"]) == ((1, 1) if keep else (1, 2))
        per, const = (2, 2) if keep else (3, 2)
        assert cost["rows_written"] == per * k + const, (k, keep, cost)
        assert cost["rows_read"] <= (4 if keep else 8) * k + 3, (k, keep, cost)


def test_waiting_jobs_cost_a_claim_and_its_settle_nothing(bench: Host) -> None:
    """100,000 jobs waiting for others on the queue (their own band, below
    the ready and delayed ones): a claim round of 25 and its settles read
    and write what they do on a queue without them."""
    costs = {w: bench_host.call(bench, "wf_waiting_claim", waiting=w) for w in (0, 100_000)}
    assert costs[0]["claimed"] == costs[100_000]["claimed"] == 25
    assert costs[0] == costs[100_000]
    assert read_per_claimed(costs[100_000]) <= 3.1
    assert costs[100_000]["ack_rows_written"] == 2 * 25  # kept: the move and the done index


def test_the_last_job_of_a_batch_costs_the_same_for_10_or_1000(bench: Host) -> None:
    """Its settle counts it on the batch's row, reads the callbacks from the
    parts row, enqueues on_success and on_finish and marks them fired: a
    constant, whatever the batch's size."""
    small = bench_host.call(bench, "wf_batch_last", size=10)
    big = bench_host.call(bench, "wf_batch_last", size=1000)
    for cost in (small, big):
        assert cost["state"] == "succeeded" and cost["callbacks"] == 2, cost
        assert cost["queries"] == 1
    keys = ("rows_read", "rows_written")
    assert {k: small[k] for k in keys} == {k: big[k] for k in keys}
    assert big["rows_written"] <= 10 and big["rows_read"] <= 14, big


def test_a_prune_reads_in_proportion_to_what_it_deletes(bench: Host) -> None:
    """10,000 young completed jobs over two queues, and 0, 100 or 1,000
    expired: a prune reads a few rows per queue to find nothing, and a
    bounded number of rows per row it deletes (the edges' probe, the walk,
    the delete's two passes), never the young history."""
    runs = {e: bench_host.call(bench, "wf_prune", expired=e, young=10_000) for e in (0, 100, 1000)}
    base = runs[0]["rows_read"]
    assert runs[0]["deleted"] == 0 and base <= 40, runs[0]
    for e in (100, 1000):
        run = runs[e]
        assert run["deleted"] == run["rows_written"] == e and run["left"] == 10_000, run
        assert run["rows_read"] - base <= 6 * e, run
    young = bench_host.call(bench, "wf_prune", expired=0, young=50_000)
    assert young["rows_read"] == base


def test_statements_keep_their_names_inside_the_worker(clean_host: Host) -> None:
    """The binding traces statements by their sql.py names in Pyodide too,
    on the SDK's wrapper and on the raw binding, and D1 runs them as text."""
    calls = clean_host.python(
        """
        from d1queue import Config, D1Queue, Registry, drain

        async def main(env):
            reg = Registry()

            @reg.job("t.ok")
            async def ok(payload):
                return None

            queue = D1Queue(env.DB)
            for i in range(2):
                await queue.dispatch("t.ok", {"i": i})
            queue.binding.usage.trace = []
            report = await drain(queue, reg, Config(plan="paid"))
            assert report.completed == 2, report
            return [list(c.names) for c in queue.binding.usage.trace]
        """
    )
    assert calls[:4] == [
        ["QUEUE_FLOWS", "QUEUE_NAMES"],
        ["SELECT_CANDIDATES"],
        ["CLAIM", "CLAIM", "SELECT_CANDIDATES"],
        ["DELETE_HELD_BATCH_PLAIN"],
    ]


def test_job_metrics_cost_a_tenth_of_a_row_a_job_and_no_query(bench: Host) -> None:
    """The job metrics (D1QUEUE_METRICS), off as in every figure above, and
    on: the same invocation claims the same jobs in the same rounds and
    queries, and writes at most 0.1 more rows a job at the batch of 25 (a
    totals row and a minute row a round); job lives likewise, completed
    or failed. Off, no metrics row is written."""
    runs = {}
    for on in (False, True):
        bench_host.call(bench, "clear")
        bench_host.call(bench, "top_up", design="d1queue", n=1_000)
        inv = bench_host.call(bench, "invocation", design="d1queue", query_budget=41, metrics=on)
        lives = {
            fail: bench_host.call(bench, "job_life", design="d1queue", n=100, fail=fail, metrics=on)
            for fail in (False, True)
        }
        runs[on] = (inv, lives)
    bench_host.call(bench, "clear")
    (off, off_lives), (on, on_lives) = runs[False], runs[True]
    assert (on["claimed"], on["rounds"], on["queries"]) == (
        off["claimed"],
        off["rounds"],
        off["queries"],
    )
    assert off["rows_by_kind"].get("INSERT", {}).get("rows_written", 0) == 0
    added = (on["rows_written"] - off["rows_written"]) / on["claimed"]
    assert 0 < added <= 0.1, added
    assert on["rows_by_kind"]["INSERT"]["rows_written"] == 2 * on["rounds"]
    for fail in (False, True):
        life_on, life_off = on_lives[fail], off_lives[fail]
        assert life_on["drain_queries"] == life_off["drain_queries"]
        added_life = (life_on["rows_written"] - life_off["rows_written"]) / life_on["jobs"]
        assert 0 < added_life <= 0.1, (fail, added_life)
    print(
        f"\njob metrics: +{added:.3f} rows written / claimed job ({on['claimed']} jobs, "
        f"{on['rounds']} rounds, {on['queries']} queries either way); job lives "
        + ", ".join(
            f"{'fail' if f else 'complete'} "
            f"{off_lives[f]['rows_written'] / 100:.2f} -> {on_lives[f]['rows_written'] / 100:.2f}"
            for f in (False, True)
        )
    )
