"""Failed jobs pruned by the cron (D1QUEUE_KEEP_FAILED_S): past the
retention and no younger, at most the plan's bound a run, oldest first, in
the read batch each shard's schedules send anyway (no extra query)."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import Config, ConfigError, D1Queue, Fail, Registry, drain
from d1queue.core.config import KEEP_FAILED_S, PRUNE_FAILED
from d1queue.features.cron import ShardRun, cron
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.shardset import ShardQueue, ShardSet

from .conftest import MIGRATIONS, Clock

DAY_MS = 86_400_000


def registry() -> Registry:
    reg = Registry()

    @reg.job("t.boom")
    async def boom(payload: Any) -> None:
        raise Fail("boom")

    return reg


def add_failed(db: SqliteD1, failed_at: list[int], prefix: str = "f") -> None:
    """Failed-job rows as FAIL_RECORD writes them, one per `failed_at`."""
    for i, at in enumerate(failed_at):
        db.query(
            "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, attempts, "
            "max_attempts, priority, created_at, failed_at) "
            "VALUES (?1, 'default', 't.boom', 'null', 'boom', 1, 1, 0, ?2, ?2)",
            f"{prefix}{i:05d}",
            at,
        )


def failed_ids(db: SqliteD1) -> list[str]:
    return [str(r["id"]) for r in db.query("SELECT id FROM d1queue_failed_jobs ORDER BY id")]


async def run_cron(
    shards: ShardSet, config: Config, now: int, reg: Registry | None = None
) -> list[ShardRun]:
    reg = reg or registry()

    async def run_drain(queue: ShardQueue, c: Config) -> Any:
        return await drain(queue, reg, c)

    return await cron(shards, reg, config, now=now, grace_ms=0, due_limit=10, run_drain=run_drain)


async def test_the_cron_prunes_failures_past_the_retention_and_keeps_younger_ones(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    reg = registry()
    await queue.dispatch("t.boom", 1)
    assert (await drain(queue, reg, Config())).failed == 1
    (failed,) = failed_ids(db)
    clock.advance(KEEP_FAILED_S - 60)
    add_failed(db, [clock() - 1000], prefix="young")
    shards = ShardSet.of(queue)

    (run,) = await run_cron(shards, Config(), clock(), reg)
    assert run.schedules.pruned_failed == 0 and failed in failed_ids(db)

    clock.advance(61)  # the first failure is now 30 days and a second old
    (run,) = await run_cron(shards, Config(), clock(), reg)
    assert run.schedules.pruned_failed == 1 and not run.schedules.error
    assert failed_ids(db) == ["young00000"]
    assert run.schedules.as_dict()["pruned_failed"] == 1  # in the cron's log line


async def test_a_backlog_of_old_failures_takes_several_runs_each_within_the_bound(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    bound = PRUNE_FAILED["free"]
    old = clock() - KEEP_FAILED_S * 1000 - DAY_MS
    # 2.5 runs' worth, the newest first in id order: oldest go first.
    add_failed(db, [old - i for i in range(bound * 5 // 2)])
    add_failed(db, [clock() - DAY_MS], prefix="young")
    shards, config = ShardSet.of(queue), Config()
    pruned = []
    for _ in range(4):
        (run,) = await run_cron(shards, config, clock())
        pruned.append(run.schedules.pruned_failed)
        clock.advance(60)
    assert pruned == [bound, bound, bound // 2, 0]
    assert failed_ids(db) == ["young00000"]


async def test_each_run_deletes_the_oldest_first(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    bound = PRUNE_FAILED["free"]
    old = clock() - KEEP_FAILED_S * 1000 - 1
    add_failed(db, [old - i * 1000 for i in range(bound + 3)])  # f00000 the newest
    (run,) = await run_cron(ShardSet.of(queue), Config(), clock())
    assert run.schedules.pruned_failed == bound
    assert failed_ids(db) == ["f00000", "f00001", "f00002"]


async def test_the_paid_plan_prunes_more_a_run(queue: D1Queue, db: SqliteD1, clock: Clock) -> None:
    old = clock() - KEEP_FAILED_S * 1000 - 1
    add_failed(db, [old] * (PRUNE_FAILED["paid"] + 5))
    (run,) = await run_cron(ShardSet.of(queue), Config(plan="paid"), clock())
    assert run.schedules.pruned_failed == PRUNE_FAILED["paid"]
    assert len(failed_ids(db)) == 5


async def test_zero_keeps_failures_forever_and_sends_no_delete(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    add_failed(db, [0, clock() - 10 * 365 * DAY_MS])
    config = Config.from_vars({"D1QUEUE_KEEP_FAILED_S": "0"})
    assert config.keep_failed_s == 0 and config.prune_failed == 0
    db.statements.clear()
    (run,) = await run_cron(ShardSet.of(queue), config, clock())
    assert run.schedules.pruned_failed == 0 and len(failed_ids(db)) == 2
    assert not any("d1queue_failed_jobs" in s for s in db.statements)


async def test_a_short_retention_from_the_vars(queue: D1Queue, db: SqliteD1, clock: Clock) -> None:
    add_failed(db, [clock() - 3_601_000, clock() - 3_599_000])
    config = Config.from_vars({"D1QUEUE_KEEP_FAILED_S": "3600"})
    (run,) = await run_cron(ShardSet.of(queue), config, clock())
    assert run.schedules.pruned_failed == 1 and failed_ids(db) == ["f00001"]


@pytest.mark.parametrize("raw", ["-1", "1.5", "forever", "", "30d", str(10**12 + 1)])
def test_a_bad_retention_fails_loudly(raw: str) -> None:
    with pytest.raises(ConfigError, match="D1QUEUE_KEEP_FAILED_S"):
        Config.from_vars({"D1QUEUE_KEEP_FAILED_S": raw})


def test_the_default_retention_is_thirty_days() -> None:
    assert Config().keep_failed_s == Config.from_vars({}).keep_failed_s == 30 * 86_400
    assert Config().prune_failed == PRUNE_FAILED["free"]


async def test_the_prune_costs_a_cron_run_no_query(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    """The same cron run with pruning on (old failures to delete) and off:
    the same D1 queries, for the schedules (1: the read batch) and in all;
    one statement more, the bounded DELETE in that batch."""
    shards = ShardSet.of(queue)
    usage = queue.binding.usage
    costs = []
    for config in (Config(keep_failed_s=0), Config()):
        add_failed(db, [0] * 25)
        before = (usage.queries, usage.statements)
        (run,) = await run_cron(shards, config, clock())
        costs.append(
            (
                run.schedules.queries,
                usage.queries - before[0],
                usage.statements - before[1],
                run.schedules.pruned_failed,
            )
        )
        db.query("DELETE FROM d1queue_failed_jobs")
    off, on = costs
    assert off[0] == on[0] == 1, costs
    assert on[1] == off[1], costs
    assert on[2] == off[2] + 1, costs
    assert (off[3], on[3]) == (0, PRUNE_FAILED["free"])


async def test_a_re_sent_read_batch_prunes_only_failures_past_the_retention(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    """D1 commits the batch and loses its reply; the binding sends it again,
    which deletes the next oldest past the cutoff, never a younger one."""
    bound = PRUNE_FAILED["free"]
    old = clock() - KEEP_FAILED_S * 1000 - 1
    add_failed(db, [old] * (bound + 3))
    add_failed(db, [clock() - DAY_MS] * 3, prefix="young")
    db.lose_reply_when("DELETE FROM d1queue_failed_jobs WHERE id IN")
    (run,) = await run_cron(ShardSet.of(queue), Config(), clock())
    assert run.schedules.resent and not run.schedules.error
    assert failed_ids(db) == ["young00000", "young00001", "young00002"]


async def test_every_shard_prunes_its_share_of_the_bound(clock: Clock) -> None:
    dbs = []
    for _ in range(2):
        d = SqliteD1()
        d.apply_migrations(MIGRATIONS)
        dbs.append(d)
    config = Config(shards=("DB", "DB_1"))
    shards = ShardSet([D1Queue(d, clock=clock) for d in dbs], config.routing)
    old = clock() - KEEP_FAILED_S * 1000 - 1
    for d in dbs:
        add_failed(d, [old] * PRUNE_FAILED["free"])
    runs = await run_cron(shards, config, clock())
    share = PRUNE_FAILED["free"] // 2
    assert sorted(r.schedules.pruned_failed for r in runs) == [share, share]
    assert all(r.schedules.queries == 1 for r in runs)
    assert [len(failed_ids(d)) for d in dbs] == [share, share]
    for d in dbs:
        d.close()
