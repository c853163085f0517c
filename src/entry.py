"""d1queue's Worker: the glue between Cloudflare's runtime and the library.

The only module that imports the `workers` SDK (and `js`), so everything in
d1queue/ and jobs.py imports and tests under plain CPython.
"""

import json
from typing import Any
from urllib.parse import urlparse

from workers import Response, WorkerEntrypoint

from d1queue import Config, D1Queue, __version__, drain
from jobs import registry


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, headers={"content-type": "application/json"})


def settings(env: Any) -> Config:
    """The drain's Config from the Worker's D1QUEUE_* vars. The SDK's env
    wrapper proxies attribute reads but cannot list names, so the names come
    from the JS object underneath: an unknown (mistyped) name must be seen
    to be refused."""
    from js import Object  # only exists inside the Worker

    raw = getattr(env, "_env", env)
    names = [str(k) for k in Object.keys(raw) if str(k).startswith("D1QUEUE_")]
    return Config.from_vars({k: str(getattr(raw, k)) for k in names})


class Default(WorkerEntrypoint):
    async def fetch(self, request: Any) -> Response:
        path = urlparse(str(request.url)).path
        if path == "/health" and request.method == "GET":
            return _json({"ok": True, "version": __version__})
        return _json({"error": {"code": "not_found", "message": f"no route {path}"}}, 404)

    async def scheduled(self, controller: Any, env: Any, ctx: Any) -> None:
        """The cron: reclaim leases that lapsed, then drain within the budgets.
        The report is logged as one JSON line, for `wrangler tail` and Logpush."""
        config = settings(self.env)
        queue = D1Queue(self.env.DB, reservation_s=config.reservation_s)
        report = await drain(queue, registry, config, env=self.env)
        print(
            json.dumps({"event": "d1queue.drain", "cron": str(controller.cron), **report.as_dict()})
        )
