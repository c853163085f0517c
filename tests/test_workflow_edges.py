"""Workflows at their edges: a job named by a waiter while it runs and then
failing among completed ones, a clear whose ends move waiters, a re-sent
addition to a batch, a batch with no job to run, a caller's reused id."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import Fail
from d1queue.core.outcomes import Outcome
from d1queue.testing import Kit

from .test_workflows import jobs as reg
from .test_workflows import views


async def test_clear_ends_every_workflow_job_of_the_queue() -> None:
    """A clear whose dependency's end moves a waiter of the same queue out of
    the waiting band (its key moves under the clear's UPDATE): the waiter's
    end is counted all the same, for its batch and its own waiter."""
    ran: list[str] = []
    kit = Kit(reg(ran))
    d = await kit.dispatch("step", {"id": "d"}, queue="q")
    q = kit.queue
    bid, (w,) = await q.batch(
        [q.new_job("step", {"id": "w"}, queue="q", after=[d])],
        on_finish=q.new_job("callback", "fin", queue="other"),
    )
    v = await kit.dispatch("step", {"id": "v"}, queue="r", after=[w])
    await q.clear("q")
    state = await views(kit).batch(bid)
    assert state is not None
    assert state.pending == 0, state  # W's end was counted
    vv = await views(kit).job(v)
    assert vv.state != "waiting", vv  # V learnt that W is gone


async def test_a_failure_in_a_kept_claim_batch_is_not_completed() -> None:
    """A job fails in a claim batch whose other jobs complete (history kept),
    and a waiter named it while it ran: COMPLETE_HELD_BATCH moves it to the
    done band, ended as a completion."""
    ran: list[str] = []
    kit = Kit(reg(ran))
    q = kit.queue
    a = await kit.dispatch("step", {"id": "a"})
    b = await kit.dispatch("step", {"id": "b"})
    c = await kit.dispatch("step", {"id": "c"})
    jobs = await q.reserve_batch("default", 3)
    assert len(jobs) == 3
    ja = next(j for j in jobs if j.id == a)
    jb = next(j for j in jobs if j.id == b)
    jc = next(j for j in jobs if j.id == c)
    w = await kit.dispatch("step", {"id": "w"}, after=[a])
    await q.settle(
        [
            Outcome(ja, "fail", error="boom"),
            Outcome(jb, "complete", result="1"),
            Outcome(jc, "complete"),
        ]
    )
    done = {j.id for j in kit.completed()}
    assert a not in done and {b, c} <= done
    assert {f.id for f in kit.failed()} == {a}
    wv = await views(kit).job(w)
    assert not (hasattr(wv, "state") and wv.state == "ready" and not wv.job.doomed), wv


@pytest.mark.parametrize("added", [{"unique_key": "k"}, {"group": "g"}])
async def test_add_to_batch_resent_counts_once(added: dict[str, str]) -> None:
    """A re-send after a lost reply inserts nothing again (a keyed or grouped
    insert does nothing on a conflict) and counts nothing again."""
    kit = Kit(reg([]))
    q = kit.queue
    bid, _ = await q.batch([q.new_job("step", {"id": "a"})])
    kit.db.lose_reply_when("UPDATE d1queue_batches SET total = total +")
    await q.add_to_batch(bid, [q.new_job("step", {"id": "b"}, **added)])
    st = await views(kit).batch(bid)
    assert st is not None and st.total == 2, st
    for _ in range(3):
        await kit.run_due()
    st = await views(kit).batch(bid)
    assert st is not None and st.state == "succeeded", st


async def test_a_batch_none_of_whose_jobs_is_pushed_is_refused_whole() -> None:
    """Every job's unique_key already held: a batch that could never end is
    refused, and nothing is written."""
    from d1queue.core.errors import EmptyBatch

    kit = Kit(reg([]))
    q = kit.queue
    await kit.dispatch("step", {"id": "x"}, unique_key="k")
    with pytest.raises(EmptyBatch):
        await q.batch(
            [q.new_job("step", {"id": "a"}, unique_key="k")],
            on_finish=q.new_job("callback", "fin"),
        )
    assert kit.db.query("SELECT * FROM d1queue_batches") == []
    assert kit.db.query("SELECT * FROM d1queue_batch_parts") == []
    assert len(kit.enqueued()) == 1


async def test_doomed_at_push_names_the_dependency() -> None:
    ran: list[str] = []
    kit = Kit(reg(ran))
    a = await kit.dispatch("step", {"id": "a", "fail": True})
    await kit.run_due()
    b = await kit.dispatch("step", {"id": "b"}, after=[a])
    await kit.run_due()
    f = {x.id: x.error for x in kit.failed()}
    assert f[b] == f"dependency {a} failed", f[b]


async def test_drain_a_failed_job_named_while_running_is_not_completed() -> None:
    ran: list[str] = []
    r = reg(ran)

    @r.job("parent", subrequests=5)
    async def parent(payload: Any, ctx: Any) -> None:
        await ctx.queue.dispatch("step", {"id": "w"}, after=[ctx.job.id])
        raise Fail("parent failed")

    kit = Kit(r)
    p = await kit.dispatch("parent", {})
    await kit.dispatch("step", {"id": "b"})
    await kit.dispatch("step", {"id": "c"})
    await kit.run_due()
    assert p not in {j.id for j in kit.completed()}
    assert "w" not in ran  # its dependency failed


async def test_a_refused_duplicate_id_writes_no_edges() -> None:
    from d1queue import DuplicateJobId

    ran: list[str] = []
    kit = Kit(reg(ran))
    q = kit.queue
    a = await kit.dispatch("step", {"id": "a"}, delay_s=3600)  # not due for an hour
    b = await kit.dispatch("step", {"id": "b"})
    x = await kit.dispatch("step", {"id": "x"}, after=[a])  # x waits for a
    dup = q.new_job("step", {"id": "dup"}, after=[b])
    dup.id = x  # a caller's own id, in use
    with pytest.raises(DuplicateJobId):
        await q.push(dup)
    await kit.run_due()  # b completes
    assert "x" not in ran, ran  # x must still wait for a


async def test_without_history_a_failure_named_while_running_is_no_completion() -> None:
    """A queue keeping no history, a claim batch of three: the job a waiter
    named while it ran fails, the two others complete. It is failed, and
    its waiter is failed for it; the others are deleted as completed."""
    ran: list[str] = []
    r = reg(ran)
    r.history("default", keep=False)
    kit = Kit(r)
    q = kit.queue
    a = await kit.dispatch("step", {"id": "a"})
    b = await kit.dispatch("step", {"id": "b"})
    c = await kit.dispatch("step", {"id": "c"})
    held = {j.id: j for j in await q.reserve_batch("default", 3)}
    w = await kit.dispatch("step", {"id": "w"}, after=[a])
    marks = await q.settle(
        [
            Outcome(held[a], "fail", error="boom"),
            Outcome(held[b], "complete"),
            Outcome(held[c], "complete"),
        ]
    )
    assert marks == [True, True, True]
    assert {f.id: f.error for f in kit.failed()} == {a: "boom"}
    await kit.run_due()
    failed = {f.id: f.error for f in kit.failed()}
    assert failed[w] == f"dependency {a} failed"
    assert kit.enqueued() == [] and "w" not in ran
