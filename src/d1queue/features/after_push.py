"""What a successful push sets going, in the push's own invocation.

- A wake-up (D1QUEUE_WAKE = "queues"): one message per push call, naming
  the shard written to, so a consumer drains it at once. A failed send is
  logged by the Waker and never fails the push: D1 holds the job, the cron
  runs it.
- A short drain of that shard (D1QUEUE_DRAIN_ON_PUSH), within PUSH_DRAIN's
  bounds, handed to `background` (the Worker's `ctx.waitUntil`) so the
  push's answer does not wait for it.

Both run only after the push's D1 write succeeded (Service calls `pushed`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from ..core.config import Config
from ..core.limits import PLANS
from ..store.shardset import ShardQueue, ShardSet
from .wake import Waker

PUSH_DRAIN: dict[str, Any] = {"time_budget_s": 5.0, "query_budget": 10}
"""Bounds of the drain a push starts: three rounds at most, within the same
invocation as the push, so it can never starve the request or exhaust the
invocation's subrequests. It runs in `waitUntil`, which Cloudflare cuts 30 s
after the response: it claims only jobs whose timeout fits in that window,
and leaves the rest to the cron."""

DrainShard = Callable[[ShardQueue, Config, float], Awaitable[Any]]
"""How the Worker drains one shard: `(queue, config, window_s)`."""


class AfterPush:
    def __init__(
        self,
        config: Config,
        shards: ShardSet,
        *,
        waker: Waker | None = None,
        drain: DrainShard | None = None,
        background: Callable[[Awaitable[Any]], None] | None = None,
    ) -> None:
        self.config, self.shards = config, shards
        self.waker, self.drain, self.background = waker, drain, background

    async def pushed(self, queue: str, shard: int) -> None:
        """Queue `queue` got jobs on shard `shard`: wake it, then drain it soon."""
        if self.waker is not None:
            await self.waker.wake(queue, shard=shard)
        if self.config.drain_on_push and self.drain is not None and self.background is not None:
            short = replace(self.config, queues=(queue,), **PUSH_DRAIN)
            window = PLANS[self.config.plan].wait_until_s
            self.background(self.drain(self.shards.queue(shard), short, window))
