"""Workflows on SQLite: results and history, dependencies, batches with
callbacks (migrations/0010_workflows.sql; docs/workflows.md)."""

from __future__ import annotations

from typing import Any

import pytest
from d1queue.testing import Kit

from d1queue import Fail, Registry
from d1queue.core.errors import BatchNotRunning, UnknownDependency
from d1queue.store.workflows import Workflows

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
    batch, ids = await q.push_batch(
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
    batch, _ = await q.push_batch(
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
