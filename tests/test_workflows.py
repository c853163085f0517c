"""Workflows on SQLite: results and history, dependencies, batches with
callbacks (migrations/0010_workflows.sql; docs/workflows.md)."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import Fail, Registry
from d1queue.core.errors import BatchNotRunning, UnknownDependency
from d1queue.store.workflows import Workflows
from d1queue.testing import Kit

T0 = 1_700_000_000_000


def jobs(ran: list[str]) -> Registry:
    reg = Registry()

    @reg.job("step")
    async def step(payload: Any) -> Any:
        ran.append(payload["id"])
        if payload.get("fail"):
            raise Fail("told to fail")
        return {"done": payload["id"]}

    @reg.job("callback")
    async def callback(payload: Any) -> None:
        ran.append(f"cb:{payload}")

    return reg


def views(kit: Kit) -> Workflows:
    return Workflows(kit.queue.binding, kit.queue.clock)


async def test_a_completed_job_is_kept_with_its_result() -> None:
    ran: list[str] = []
    kit = Kit(jobs(ran))
    id = await kit.dispatch("step", {"id": "a"})
    assert (await kit.run_due()).completed == 1
    view = await views(kit).job(id)
    assert view is not None and view.state == "completed"  # type: ignore[union-attr]
    assert view.result == {"done": "a"}  # type: ignore[union-attr]
    assert kit.enqueued() == []
    assert [j.result for j in kit.completed()] == [{"done": "a"}]


async def test_a_chain_runs_in_order_and_waits_until_then() -> None:
    ran: list[str] = []
    kit = Kit(jobs(ran))
    a = await kit.dispatch("step", {"id": "a"})
    b = await kit.dispatch("step", {"id": "b"}, after=[a])
    c = await kit.dispatch("step", {"id": "c"}, after=[b])
    w = views(kit)
    assert (await w.job(b)).state == "waiting"  # type: ignore[union-attr]
    for _ in range(4):
        await kit.run_due()
    assert ran == ["a", "b", "c"]
    assert (await w.job(c)).state == "completed"  # type: ignore[union-attr]
    assert await w.dependents(a) == [b]


async def test_a_failed_dependency_fails_its_waiters_unless_they_ignore_it() -> None:
    ran: list[str] = []
    kit = Kit(jobs(ran))
    a = await kit.dispatch("step", {"id": "a", "fail": True})
    b = await kit.dispatch("step", {"id": "b"}, after=[a])
    c = await kit.dispatch("step", {"id": "c"}, after=[b])
    d = await kit.dispatch("step", {"id": "d"}, after=[a], ignore_failed=True)
    for _ in range(5):
        await kit.run_due()
    assert ran == ["a", "d"]
    failed = {f.id: f.error for f in kit.failed()}
    assert failed[b] == f"dependency {a} failed"
    assert failed[c] == f"dependency {b} failed"
    assert d not in failed


async def test_after_an_unknown_id_writes_nothing() -> None:
    kit = Kit(jobs([]))
    a = await kit.dispatch("step", {"id": "a"})
    with pytest.raises(UnknownDependency) as err:
        await kit.dispatch("step", {"id": "b"}, after=[a, "nope"])
    assert err.value.ids == ["nope"]
    assert [j.id for j in kit.enqueued()] == [a]
    with pytest.raises(ValueError):
        await kit.dispatch("step", {"id": "b"}, after=[])
    with pytest.raises(ValueError):
        await kit.dispatch("step", {"id": "b"}, after=[f"x{i}" for i in range(101)])


async def test_a_batchs_callbacks_each_run_once() -> None:
    ran: list[str] = []
    kit = Kit(jobs(ran))
    q = kit.queue
    members = [q.new_job("step", {"id": f"m{i}", "fail": i == 2}) for i in range(5)]
    batch, ids = await q.batch(
        members,
        on_success=q.new_job("callback", "success"),
        on_failure=q.new_job("callback", "failure"),
        on_finish=q.new_job("callback", "finish"),
    )
    assert len(ids) == 5
    state = await views(kit).batch(batch)
    assert state is not None and (state.total, state.pending, state.state) == (5, 5, "running")
    for _ in range(4):
        await kit.run_due()
    state = await views(kit).batch(batch)
    assert state is not None
    assert (state.pending, state.completed, state.failed, state.state) == (0, 4, 1, "failed")
    assert sorted(r for r in ran if r.startswith("cb:")) == ["cb:failure", "cb:finish"]
    # A finished batch takes no more jobs, and nothing is written.
    with pytest.raises(BatchNotRunning):
        await q.add_to_batch(batch, [q.new_job("step", {"id": "late"})])


async def test_a_handler_adds_jobs_to_its_running_batch() -> None:
    ran: list[str] = []
    reg = jobs(ran)

    @reg.job("spawner", subrequests=2)
    async def spawner(payload: Any, ctx: Any) -> None:
        await ctx.queue.add_to_batch(
            ctx.job.batch, [ctx.queue.new_job("step", {"id": f"child{i}"}) for i in range(2)]
        )

    kit = Kit(reg)
    q = kit.queue
    batch, _ = await q.batch(
        [q.new_job("spawner", None)], on_success=q.new_job("callback", "success")
    )
    for _ in range(4):
        await kit.run_due()
    state = await views(kit).batch(batch)
    assert state is not None and (state.total, state.completed, state.state) == (
        3,
        3,
        "succeeded",
    )
    assert ran.count("cb:success") == 1


async def test_an_oversized_result_fails_the_job_with_why() -> None:
    reg = Registry()

    @reg.job("big")
    async def big(payload: Any) -> str:
        return "x" * 70_000

    kit = Kit(reg)
    await kit.dispatch("big")
    await kit.run_due()
    (f,) = kit.failed()
    assert "limit is 65536" in f.error


async def test_the_cron_prunes_history_past_its_retention_oldest_first() -> None:
    from d1queue.store.schedules import Schedules

    ran: list[str] = []
    reg = jobs(ran)
    kit = Kit(reg)
    old = [await kit.dispatch("step", {"id": f"old{i}"}) for i in range(5)]
    waiter = await kit.dispatch("step", {"id": "w"}, after=[old[0]])
    await kit.run_due()
    await kit.run_due()
    kit.advance(3600)
    young = await kit.dispatch("step", {"id": "young"})
    await kit.run_due()
    cutoff = kit.clock() - 1800 * 1000
    done = {j.id for j in kit.completed()}
    assert done == {*old, waiter, young}
    sched = Schedules(kit.queue, reg)
    report = await sched.run(prune_completed_before=cutoff, prune_completed_limit=4)
    assert report.pruned_completed == 4 and not report.error
    report = await sched.run(prune_completed_before=cutoff, prune_completed_limit=4)
    assert report.pruned_completed == 2
    assert {j.id for j in kit.completed()} == {young}, "the young one is kept"
    assert kit.db.query("SELECT * FROM d1queue_deps") == [], "edges go with their job"
    report = await sched.run(prune_completed_before=cutoff, prune_completed_limit=4)
    assert report.pruned_completed == 0


async def test_a_queue_may_keep_no_history() -> None:
    ran: list[str] = []
    reg = jobs(ran)
    reg.history("default", keep=False)
    kit = Kit(reg)
    a = await kit.dispatch("step", {"id": "a"})
    await kit.dispatch("step", {"id": "b"}, after=[a])
    for _ in range(3):
        await kit.run_due()
    assert ran == ["a", "b"]
    assert kit.completed() == [] and kit.enqueued() == []
    assert await views(kit).job(a) is None
    assert kit.db.query("SELECT * FROM d1queue_deps") == []


async def test_a_handler_reads_its_dependencies_results_and_its_batch() -> None:
    seen: dict[str, Any] = {}
    reg = Registry()

    @reg.job("make")
    async def make(payload: Any) -> Any:
        return {"n": payload}

    @reg.job("sum", subrequests=2)
    async def total(payload: Any, ctx: Any) -> int:
        results = await ctx.results()
        seen["results"] = results
        seen["batch"] = await ctx.batch()
        return sum(r["n"] for r in results.values())

    @reg.job("report", subrequests=1)
    async def report(payload: Any, ctx: Any) -> None:
        seen["callback"] = await ctx.batch()

    kit = Kit(reg)
    q = kit.queue
    a = await kit.dispatch("make", 2)
    b = await kit.dispatch("make", 3)
    batch, (s,) = await q.batch(
        [q.new_job("sum", None, after=[a, b])], on_success=q.new_job("report", None)
    )
    for _ in range(4):
        await kit.run_due()
    assert seen["results"] == {a: {"n": 2}, b: {"n": 3}}
    assert seen["batch"]["id"] == batch and seen["batch"]["pending"] == 1
    assert seen["callback"]["state"] == "succeeded" and seen["callback"]["ids"] == [s]
    (done,) = [j for j in kit.completed() if j.id == s]
    assert done.result == 5


async def test_a_chain_pushes_in_one_batch_and_a_cancel_fails_the_rest() -> None:
    ran: list[str] = []
    kit = Kit(jobs(ran))
    q = kit.queue
    _, b, c = await q.chain([q.new_job("step", {"id": x}) for x in "abc"])
    from d1queue.store.admin import Admin

    assert await Admin(q).cancel(b) == "cancelled"
    for _ in range(3):
        await kit.run_due()
    assert ran == ["a"]
    assert {f.id: f.error for f in kit.failed()} == {c: f"dependency {b} failed"}


async def test_callbacks_fire_once_and_deps_hold_under_faults_and_overlapping_drains() -> None:
    """Four drains at once on one database, 10% of statements failing (half
    of them after they commit: the reply lost): a batch's callbacks are each
    enqueued once, and no job of a dependency tree starts before its
    dependencies completed."""
    import asyncio
    import random

    rng = random.Random(25)
    started: list[str] = []
    ended: set[str] = set()
    early: list[str] = []
    deps: dict[str, list[str]] = {}
    reg = Registry()

    @reg.job("node", max_attempts=25)
    async def node(payload: Any) -> Any:
        # Recorded, not raised: a raise would only retry the job.
        early.extend(f"{payload} before {d}" for d in deps.get(payload, []) if d not in ended)
        started.append(payload)
        if payload.startswith("bad"):
            raise Fail("bad")
        ended.add(payload)
        return payload

    @reg.job("cb", max_attempts=25)
    async def cb(payload: Any) -> None:
        started.append(f"cb:{payload}")

    kit = Kit(reg)
    q = kit.queue
    members = [q.new_job("node", f"bad{i}" if i % 20 == 0 else f"m{i}") for i in range(200)]
    batch, _ = await q.batch(
        members,
        on_success=q.new_job("cb", "success"),
        on_failure=q.new_job("cb", "failure"),
        on_finish=q.new_job("cb", "finish"),
    )
    roots = [q.new_job("node", f"r{i}") for i in range(20)]
    await q.push_many(roots)
    kids = []
    for i in range(20):
        parents = rng.sample(roots, 2)
        job = q.new_job("node", f"k{i}", after=[p.id for p in parents])
        deps[f"k{i}"] = [p.payload for p in parents]
        kids.append(job)
    await q.push_many(kids)
    for i in range(20):
        parents = rng.sample(kids, 2)
        deps[f"g{i}"] = [p.payload for p in parents]
        await q.push(q.new_job("node", f"g{i}", after=[p.id for p in parents]))

    kit.db.fail_when(lambda s: rng.random() < 0.05, times=None)
    kit.db.lose_reply_when(lambda s: rng.random() < 0.05, times=None)
    for _ in range(60):
        await asyncio.gather(*(kit.run_due() for _ in range(4)))
        kit.advance(120)  # retries' backoff, lapsed leases
        if not kit.enqueued():
            break
    kit.db.clear_faults()
    assert kit.enqueued() == [], "nothing left"
    state = await views(kit).batch(batch)
    assert state is not None
    assert (state.pending, state.completed + state.failed) == (0, 200)
    assert state.failed == 10
    for kind in ("success", "failure", "finish"):
        rows = kit.db.query(
            "SELECT COUNT(*) AS n FROM d1queue_jobs WHERE id = ?", f"{batch}:on_{kind}"
        ) + kit.db.query(
            "SELECT COUNT(*) AS n FROM d1queue_failed_jobs WHERE id = ?", f"{batch}:on_{kind}"
        )
        assert sum(r["n"] for r in rows) == (0 if kind == "success" else 1), kind
    assert {f"g{i}" for i in range(20)} <= ended
    assert early == [], "a job started before a job it waits for completed"


async def test_a_job_may_wait_for_a_running_job() -> None:
    """A dependency held by a worker is found by the walk of the locked
    bands; its completion releases the waiting job, a retry does not."""
    from d1queue.core.outcomes import Outcome

    ran: list[str] = []
    kit = Kit(jobs(ran))
    q = kit.queue
    a = await kit.dispatch("step", {"id": "a"})
    held = await q.reserve("default")
    assert held is not None and held.id == a
    b = await kit.dispatch("step", {"id": "b"}, after=[a])
    assert (await views(kit).job(b)).state == "waiting"  # type: ignore[union-attr]
    await q.settle([Outcome(held, "retry", delay_s=0)])
    assert (await views(kit).job(b)).state == "waiting"  # type: ignore[union-attr]
    again = await q.reserve("default")
    assert again is not None and again.id == a
    assert await q.settle([Outcome(again, "complete", result='{"ok":1}')]) == [True]
    assert (await views(kit).job(b)).state == "ready"  # type: ignore[union-attr]
    await kit.run_due()
    assert ran == ["b"]


@pytest.mark.parametrize("jobs_in_claim", [1, 3])
async def test_a_job_named_while_it_runs_on_a_queue_keeping_no_history(
    jobs_in_claim: int,
) -> None:
    """Without history a completion deletes only jobs no workflow has; a job a
    waiter named while it ran is ended and deleted by the follow-up, and its
    waiter released: alone, or among its claim batch's jobs."""
    from d1queue.core.outcomes import Outcome

    ran: list[str] = []
    reg = jobs(ran)
    reg.history("default", keep=False)
    kit = Kit(reg)
    q = kit.queue
    ids = [await kit.dispatch("step", {"id": f"a{i}"}) for i in range(jobs_in_claim)]
    held = await q.reserve_batch("default", jobs_in_claim)
    assert sorted(j.id for j in held) == sorted(ids)
    waiter = await kit.dispatch("step", {"id": "w"}, after=[ids[0]])
    assert await q.settle([Outcome(j, "complete") for j in held]) == [True] * jobs_in_claim
    assert (await views(kit).job(waiter)).state == "ready"  # type: ignore[union-attr]
    assert [j.id for j in kit.enqueued()] == [waiter]
    await kit.run_due()
    assert ran == ["w"]


async def test_completing_or_failing_a_job_others_wait_for_is_written_not_stale() -> None:
    """D1's `changes` counts the rows the schema's triggers changed too (the
    waiters a completion frees, the batch it counts in): a settle that
    landed is written, however many rows its triggers touched."""
    ran: list[str] = []
    kit = Kit(jobs(ran))
    q = kit.queue
    a = await kit.dispatch("step", {"id": "a"})
    await kit.dispatch("step", {"id": "b"}, after=[a])
    held = await q.reserve("default")
    assert held is not None and held.id == a
    assert await q.complete(held), "its own row moved to the done band"
    f = await kit.dispatch("step", {"id": "f", "fail": True})
    await kit.dispatch("step", {"id": "g"}, after=[f])
    completed = stale = failed = 0
    for _ in range(3):
        report = await kit.run_due()
        completed, stale, failed = (
            completed + report.completed,
            stale + report.stale,
            failed + report.failed,
        )
    assert (completed, failed, stale) == (1, 2, 0), (ran, completed, failed, stale)
