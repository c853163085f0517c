"""The drain's steps, each alone: the cost of a round (`round_cost`), the
planner's decisions at the edge of every budget (`Budget.plan`), the choice of
which candidates a round claims (`Budget.admit`), the counting of settled
outcomes (`Drain.record`), and what a drain sends, round trip by round trip,
as the module docstring of d1queue.features.drain states it."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import Config, D1Queue, Fail, JobContext, Registry, drain
from d1queue.core.job import QueuedJob
from d1queue.core.limits import Meter
from d1queue.core.outcomes import Outcome
from d1queue.features.drain import LEAST_ROUND, SETTLE_MARGIN_S, Budget, Drain, Plan, round_cost
from d1queue.interfaces.testing import SqliteD1, SqliteStatement


def budget(**over: Any) -> Budget:
    """A paid-plan-sized budget with a long lease and no window."""
    given: dict[str, Any] = {
        "subrequests": 1000,
        "jobs": 1000,
        "time_s": 20.0,
        "batch_size": 25,
        "concurrency": 25,
        "lease_s": 300.0,
    }
    return Budget(**(given | over))


def jobs(*names: str) -> list[QueuedJob]:
    return [QueuedJob(name, id=f"j{i}") for i, name in enumerate(names)]


def registry(**timeouts_and_subrequests: tuple[float, int]) -> Registry:
    """Handlers by name: (timeout_s, subrequests)."""
    reg = Registry()
    for name, (timeout_s, subrequests) in timeouts_and_subrequests.items():

        async def handler(payload: Any) -> None:
            """Does nothing."""

        reg.job(name, timeout_s=timeout_s, subrequests=subrequests)(handler)
    return reg


# -- round_cost ---------------------------------------------------------------


def test_a_round_costs_three_queries_when_a_batch_is_one() -> None:
    # the batch of the owed settle and the SELECTs, the claim batch, the settle owed
    for k, owed, queues in [(1, 0, 1), (25, 50, 1), (100, 7, 4)]:
        assert round_cost(k, owed, queues, queues) == 3
    # with the candidates in hand (read ahead, or already read) only the claim
    # batch and the settle are left to send
    assert round_cost(25) == round_cost(25, 50, 0, 1) == 2
    assert LEAST_ROUND == 3


def test_a_round_costs_its_statements_when_a_batch_counts_them() -> None:
    # owed settle + SELECT; 25 claims + the read-ahead SELECT; 2 a job to settle
    assert round_cost(25, 10, 1, 1, per_statement=True) == (10 + 1) + (25 + 1) + 50
    assert round_cost(1, selects=1, per_statement=True) == 1 + 1 + 2
    # what admit counts: the claims and the settle they will owe
    assert round_cost(4, per_statement=True) == 4 + 8
    assert round_cost(5, 0, 3, 3, per_statement=True) == 3 + (5 + 3) + 10


def test_a_handler_gets_at_most_the_budget_less_the_cheapest_round() -> None:
    assert budget(subrequests=50).most == 50 - LEAST_ROUND == 47


def test_the_budget_is_read_from_the_config() -> None:
    config = Config(plan="free", batch_counts_as="statements")
    b = Budget.of(config, lease_s=60.0, window_s=25.0)
    assert (b.subrequests, b.jobs, b.time_s) == (config.budget, config.job_cap, 20.0)
    assert (b.batch_size, b.concurrency) == (config.batch_size, config.concurrency)
    assert (b.lease_s, b.window_s, b.per_statement) == (60.0, 25.0, True)
    assert b.reserve == config.stats_reserve


# -- Budget.plan ---------------------------------------------------------------


def plan(b: Budget, **over: Any) -> Plan | str:
    given: dict[str, Any] = {
        "active": ["a"],
        "turn": 0,
        "claimed": 0,
        "owed": 0,
        "room": 1000,
        "elapsed": 0.0,
    }
    return b.plan(**(given | over))


def test_the_plan_stops_when_no_queue_may_hold_jobs() -> None:
    assert plan(budget(), active=[]) == "empty"


def test_the_plan_stops_at_the_time_budget() -> None:
    assert plan(budget(), elapsed=20.0) == "time_budget"
    assert isinstance(plan(budget(), elapsed=19.999), Plan)


def test_the_plan_stops_at_the_job_cap_and_takes_no_more_than_is_left() -> None:
    assert plan(budget(jobs=100), claimed=100) == "max_jobs"
    last = plan(budget(jobs=100), claimed=90)
    assert isinstance(last, Plan) and last.k == 10
    assert not last.read_ahead  # nothing would use it: the cap ends the run
    before = plan(budget(jobs=100), claimed=74)
    assert isinstance(before, Plan) and (before.k, before.read_ahead) == (25, True)


def test_the_plan_needs_three_queries_when_a_batch_is_one() -> None:
    assert plan(budget(), room=2, owed=50) == "query_budget"
    fits = plan(budget(), room=3, owed=50)
    assert isinstance(fits, Plan) and fits.k == 25


def test_the_plan_shrinks_a_round_to_the_statements_left() -> None:
    b = budget(per_statement=True)
    # one queue, 10 settle statements owed: 10 + 1 + (k + 1) + 2k
    full = round_cost(25, 10, 1, 1, per_statement=True)
    got = plan(b, owed=10, room=full)
    assert isinstance(got, Plan) and got.k == 25
    got = plan(b, owed=10, room=full - 1)
    assert isinstance(got, Plan) and got.k == 24
    assert plan(b, owed=10, room=round_cost(1, 10, 1, 1, per_statement=True) - 1) == (
        "query_budget"
    )


def test_the_plan_spreads_a_round_over_the_queues_in_turn() -> None:
    got = plan(budget(batch_size=10), active=["a", "b", "c", "d"], turn=3)
    assert isinstance(got, Plan)
    assert (got.k, got.queues, got.share) == (10, ["d", "a", "b", "c"], 3)
    # never more queues than jobs: each queue it reads offers at least one
    got = plan(budget(batch_size=2), active=["a", "b", "c"], turn=1)
    assert isinstance(got, Plan) and (got.queues, got.share) == (["b", "c"], 1)


def test_a_shrunk_round_reads_fewer_queues() -> None:
    b = budget(per_statement=True)
    active = ["a", "b", "c"]
    # 3 jobs from 3 queues: 3 + (3 + 3) + 6 = 15; 2 from 2: 2 + (2 + 2) + 4 = 10
    got = plan(b, active=active, room=14)
    assert isinstance(got, Plan) and (got.k, got.queues, got.share) == (2, ["a", "b"], 1)
    got = plan(b, active=active, room=15)
    assert isinstance(got, Plan) and (got.k, len(got.queues)) == (3, 3)


# -- Budget.admit --------------------------------------------------------------


def test_admit_stops_at_the_first_job_whose_subrequests_do_not_fit() -> None:
    reg = registry(big=(10, 5), small=(10, 0))
    b = budget()
    # a batch counting as one query: the claim batch and its settle, 2
    chosen, stop = b.admit(jobs("big", "small"), reg, room=2 + 5, elapsed=0)
    assert (len(chosen), stop) == (2, "")
    chosen, stop = b.admit(jobs("small", "big", "small"), reg, room=2 + 4, elapsed=0)
    # the small job behind the big one waits: the big one is not starved
    assert ([j.name for j in chosen], stop) == (["small"], "query_budget")
    chosen, stop = b.admit(jobs("small"), reg, room=1, elapsed=0)
    assert (chosen, stop) == ([], "query_budget")


def test_admit_counts_statements_when_a_batch_counts_them() -> None:
    reg = registry(small=(10, 0))
    b = budget(per_statement=True)
    chosen, stop = b.admit(jobs(*["small"] * 5), reg, room=3 * 4, elapsed=0)
    assert (len(chosen), stop) == (4, "query_budget")
    chosen, stop = b.admit(jobs(*["small"] * 4), reg, room=3 * 4, elapsed=0)
    assert (len(chosen), stop) == (4, "")


def test_admit_takes_a_job_declaring_too_much_to_fail_it() -> None:
    # More than any drain can give: it costs nothing to claim and fails
    # when run, with an error saying why (test_limits.py).
    reg = registry(huge=(10, 48))
    chosen, stop = budget(subrequests=50).admit(jobs("huge"), reg, room=2, elapsed=0)
    assert (len(chosen), stop) == (1, "")


def test_admit_claims_only_what_finishes_inside_the_lease_waiting_for_a_slot() -> None:
    reg = registry(ten=(10, 0))
    # two slots, 10 s each: held for 10, 10, 20, 20, 30, 30, 40 ... seconds
    b = budget(concurrency=2, lease_s=30 + SETTLE_MARGIN_S)
    chosen, stop = b.admit(jobs(*["ten"] * 8), reg, room=1000, elapsed=0)
    assert (len(chosen), stop) == (6, "lease")
    b = budget(concurrency=2, lease_s=30 + SETTLE_MARGIN_S - 0.1)
    chosen, stop = b.admit(jobs(*["ten"] * 8), reg, room=1000, elapsed=0)
    assert (len(chosen), stop) == (4, "lease")


def test_admit_leaves_to_the_cron_what_would_not_finish_inside_the_window() -> None:
    reg = registry(long=(20, 0), short=(5, 0))
    b = budget(window_s=30.0, concurrency=1)
    # 10 s of the window gone: the 20 s job would end at 32 s with its settle
    chosen, stop = b.admit(jobs("long", "short", "short"), reg, room=1000, elapsed=10)
    assert ([j.name for j in chosen], stop) == (["short", "short"], "window")
    chosen, stop = b.admit(jobs("long", "short"), reg, room=1000, elapsed=8)
    assert ([j.name for j in chosen], stop) == (["long"], "window")  # short waits for long
    chosen, stop = budget(concurrency=1).admit(jobs("long"), reg, room=1000, elapsed=1e6)
    assert (len(chosen), stop) == (1, "")  # no window: elapsed does not matter


def test_the_plan_reserves_what_admit_then_finds_room_for() -> None:
    """A round planned at the edge of the statements left claims all it
    planned once its SELECT is paid: one formula for both."""
    reg = registry(small=(10, 0))
    b = budget(per_statement=True)
    owed, room = 7, round_cost(25, 7, 1, 1, per_statement=True)
    got = plan(b, owed=owed, room=room)
    assert isinstance(got, Plan) and got.k == 25
    # the owed settle and the SELECT went in their own batch: owed + 1 spent
    chosen, stop = b.admit(jobs(*["small"] * 25), reg, room=room - owed - 1, elapsed=0)
    assert (len(chosen), stop) == (25, "")


# -- Drain.record --------------------------------------------------------------


async def test_record_counts_each_settle_by_how_it_ended(queue: D1Queue) -> None:
    state = Drain(queue, Registry(), budget(), Meter(1000), stats=True)
    job = QueuedJob("x", queue="q", id="a")
    outcomes = [
        Outcome(job, "complete"),
        Outcome(job, "retry"),
        Outcome(job, "fail"),
        Outcome(job, "complete"),
        Outcome(job, "fail"),
        Outcome(QueuedJob("x", id="b"), "complete"),
    ]
    state.record(outcomes, ["written", "written", "resent", "resent", "stale", "unsettled"])
    r = state.report
    assert (r.completed, r.retried, r.failed, r.resent) == (2, 1, 1, 2)
    assert (r.stale, r.unsettled) == (1, ["b"])
    assert not state.counts.empty


# -- what a drain sends --------------------------------------------------------


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each D1 round trip SqliteD1 answers: its statements' first words."""
    sent: list[list[str]] = []
    batch, run_all = SqliteD1.batch, SqliteStatement.all

    def head(sql: str) -> str:
        return sql.split(None, 1)[0].upper()

    async def traced_batch(self: SqliteD1, statements: Any) -> Any:
        sent.append([head(s.sql) for s in statements])
        return await batch(self, statements)

    async def traced_all(self: SqliteStatement) -> Any:
        sent.append([head(self.sql)])
        return await run_all(self)

    monkeypatch.setattr(SqliteD1, "batch", traced_batch)
    monkeypatch.setattr(SqliteStatement, "all", traced_all)
    return sent


async def test_a_drain_sends_what_its_docstring_says(
    queue: D1Queue, trips: list[list[str]]
) -> None:
    reg = registry(ok=(10, 0))
    for i in range(5):
        await queue.dispatch("ok", i)
    trips.clear()
    report = await drain(queue, reg, Config(plan="paid", batch_size=2, stats=True))
    assert report.completed == 5 and report.stopped == "empty"
    assert trips == [
        ["SELECT", "WITH"],  # survey: the paused queues and (with "*") the queues holding jobs
        ["SELECT"],  # round 1: its candidates, on their own
        ["UPDATE", "UPDATE", "SELECT"],  # round 1's claims, round 2's candidates
        ["DELETE", "UPDATE", "UPDATE", "SELECT"],  # round 1's settle, round 2's claims ...
        ["DELETE", "UPDATE", "SELECT"],  # ... round 3 finds one job, then none
        ["DELETE"],  # the last round's settle, alone
        ["INSERT"],  # the run's counters (an UPSERT)
    ]
    assert report.queries == len(trips) and report.rounds == 3


async def test_a_drain_counting_statements_stays_inside_its_budget(
    queue: D1Queue, db: SqliteD1
) -> None:
    reg = Registry()

    @reg.job("fan", subrequests=9, max_attempts=1)
    async def fan(payload: Any, ctx: JobContext) -> None:
        for _ in range(9):
            await ctx.queue.dispatch("other", None, queue="elsewhere")
        raise Fail("every job failing: its settle is two statements")

    for i in range(20):
        await queue.dispatch("fan", i)
    sent = len(db.statements)
    config = Config(
        plan="free",
        query_budget=50,
        max_jobs=100,
        batch_counts_as="statements",
        stats=False,
        queues=("default",),
    )
    report = await drain(queue, reg, config)
    # the survey, the SELECT, 4 claims and the read-ahead SELECT, 36
    # dispatches and 8 settle statements: 51
    assert len(db.statements) - sent <= 50, report
