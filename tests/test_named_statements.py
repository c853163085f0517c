"""Every statement d1queue sends carries its name from store/sql.py, so the
binding counts (`Usage.by_name`), times and traces (`Usage.trace`) them by
name; a traced drain's round trips read as the claim protocol describes."""

from __future__ import annotations

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.flow import Limits
from d1queue.store import sql
from d1queue.store.binding import Binding

from .contract import Clock

LOCAL = Config(plan="paid")


def _traced(queue: D1Queue) -> Binding:
    binding = queue.binding
    binding.usage.trace = []
    return binding


async def test_a_drain_is_traced_by_statement_name(queue: D1Queue) -> None:
    reg = Registry()

    @reg.job("t.ok")
    async def ok(payload: object) -> None:
        return None

    for i in range(3):
        await queue.dispatch("t.ok", {"i": i})
    binding = _traced(queue)
    report = await drain(queue, reg, LOCAL)
    assert report.completed == 3
    calls = [c.names for c in binding.usage.trace or []]
    # The survey (every queue: the paused ones and their names); the
    # candidates; the claims with the next round's read; the three
    # completions acknowledged by one statement; the drain's stats row.
    assert calls == [
        ("QUEUE_FLOWS", "QUEUE_NAMES"),
        ("SELECT_CANDIDATES",),
        ("CLAIM", "CLAIM", "CLAIM", "SELECT_CANDIDATES"),
        ("DELETE_HELD_BATCH_PLAIN",),
        ("RECORD_STATS",),
    ]
    assert binding.usage.by_name["CLAIM"] == 3
    assert all(c.seconds >= 0 for c in binding.usage.trace or [])


async def test_every_statement_of_a_varied_workload_is_named(queue: D1Queue, clock: Clock) -> None:
    reg = Registry()

    @reg.job("t.ok", queue="q")
    async def ok(payload: object) -> str:
        return "done"

    @reg.job("t.bad", queue="q", max_attempts=2)
    async def bad(payload: object) -> None:
        raise ValueError("no")

    binding = _traced(queue)
    first = await queue.dispatch("t.ok", {}, unique_key="k")
    await queue.dispatch("t.ok", {}, unique_key="k")
    await queue.push_many([queue.new_job("t.ok", {"i": i}) for i in range(3)])
    await queue.push(queue.new_job("t.ok", {}, after=[first]))
    await queue.batch(
        [queue.new_job("t.ok", {}), queue.new_job("t.bad", {})],
        on_finish=queue.new_job("t.ok", {}),
    )
    await queue.chain([queue.new_job("t.ok", {}), queue.new_job("t.ok", {})])
    await queue.set_limits("q", Limits(concurrency=2))
    await queue.push(queue.new_job("t.ok", {}, group="g"))
    for _ in range(4):
        await drain(queue.derive(keep_completed=True), reg, LOCAL)
        clock.advance(60)
    await queue.size("q")
    await queue.failed_jobs()
    await queue.clear("q")
    await queue.reclaim_expired()
    names = binding.usage.by_name
    assert "unnamed" not in names, names
    for name in ("INSERT_JOB", "INSERT_WAITER", "INSERT_BATCH", "FAIL_RECORD", "insert_jobs"):
        assert names[name] > 0, (name, names)
    assert sum(names.values()) == binding.usage.statements


def test_each_statement_is_named_by_its_constant_or_builder() -> None:
    named = {k: v for k, v in vars(sql).items() if isinstance(v, sql.Sql)}
    assert len(named) > 90
    for key, text in named.items():
        assert text.name == key
    assert sql.insert_jobs(2, unique=False).name == "insert_jobs"
    assert sql.name_of("SELECT 1") == "unnamed"
