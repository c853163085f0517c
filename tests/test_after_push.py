"""What a successful push sets going (features/after_push.py): a wake-up of
the shard it wrote, then a short drain of it in the background; nothing
when the push failed."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import Config, D1Queue, Registry
from d1queue.features.after_push import PUSH_DRAIN, AfterPush
from d1queue.interfaces.service import ApiError, Service
from d1queue.store.shardset import ShardQueue, ShardSet


class Waker:
    def __init__(self) -> None:
        self.woken: list[tuple[str, int]] = []

    async def wake(self, queue: str, *, shard: int = 0) -> int:
        self.woken.append((queue, shard))
        return 1


async def test_a_push_wakes_and_drains_the_shard_it_wrote(queue: D1Queue) -> None:
    reg = Registry()

    @reg.job("t.echo")
    async def echo(payload: Any) -> None: ...

    shards = ShardSet.of(queue)
    drained: list[tuple[int, Config, float]] = []
    started: list[Any] = []

    async def drain(q: ShardQueue, config: Config, window_s: float) -> None:
        drained.append((q.shard, config, window_s))

    waker = Waker()
    config = Config(drain_on_push=True)
    after = AfterPush(config, shards, waker=waker, drain=drain, background=started.append)  # type: ignore[arg-type]
    service = Service(queue, reg, config=config, shards=shards, after_push=after)
    await service.dispatch("mail", {"name": "t.echo", "payload": 1})
    assert waker.woken == [("mail", 0)]
    assert len(started) == 1, "the drain runs in the background"
    await started[0]
    ((shard, short, window),) = drained
    assert shard == 0 and short.queues == ("mail",) and window == 30
    assert (short.time_budget_s, short.query_budget) == (
        PUSH_DRAIN["time_budget_s"],
        PUSH_DRAIN["query_budget"],
    )
    with pytest.raises(ApiError):
        await service.dispatch("mail", {"name": "nope"})
    assert waker.woken == [("mail", 0)], "a refused push sets nothing going"


async def test_without_drain_on_push_only_the_wake_up(queue: D1Queue) -> None:
    reg = Registry()

    @reg.job("t.echo")
    async def echo(payload: Any) -> None: ...

    started: list[Any] = []
    waker = Waker()
    after = AfterPush(Config(), ShardSet.of(queue), waker=waker, background=started.append)  # type: ignore[arg-type]
    await Service(queue, reg, after_push=after).dispatch("q", {"name": "t.echo"})
    assert waker.woken == [("q", 0)] and started == []
