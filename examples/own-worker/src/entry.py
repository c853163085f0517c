"""A Worker of one's own with d1queue inside it, under /queue.

Its own handlers call d1queue's: a request outside /queue (wrangler.toml's
D1QUEUE_PREFIX) is this Worker's (d1queue_fetch answers None), the cron and
the wake-up consumer are d1queue's. The other way, `class
Default(d1queue_entrypoint(registry))`, also gives callers d1queue's RPC
methods (docs/library.md).
"""

from typing import Any
from urllib.parse import urlparse

from workers import Response, WorkerEntrypoint

from d1queue.interfaces.cloudflare import d1queue_fetch, d1queue_queue, d1queue_scheduled
from jobs import registry


class Default(WorkerEntrypoint):
    async def fetch(self, request: Any) -> Response:
        answer = await d1queue_fetch(request, self.env, self.ctx, registry)
        if answer is not None:  # /queue/health, /queue/v1/..., /queue/ui...
            return answer
        path = urlparse(str(request.url)).path
        if path == "/hello":
            return Response("hello from my own Worker\n", headers={"content-type": "text/plain"})
        return Response("not found\n", status=404, headers={"content-type": "text/plain"})

    async def scheduled(self, controller: Any, env: Any = None, ctx: Any = None) -> None:
        # workerd calls a class's scheduled with env and ctx unset: they are on self.
        await d1queue_scheduled(controller, self.env, self.ctx, registry)

    async def queue(self, batch: Any, env: Any = None, ctx: Any = None) -> None:
        await d1queue_queue(batch, self.env, self.ctx, registry)  # d1queue's wake-ups
