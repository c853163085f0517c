"""This deployment's jobs. Register a handler here and it can be queued by name.

A handler is an async function of `(payload)` or `(payload, ctx)`. Return
normally to succeed; raise `Retry(delay_s=...)` to run again later, `Fail(...)`
to give up now; any other exception retries with the job's backoff until its
attempts run out.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from d1queue import Backoff, Fail, JobContext, Registry

registry = Registry()


class _Stdout(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each record to sys.stdout as it is at that moment (where print
    writes: console.log in a Worker), not the stream of import time."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout
        super().emit(record)


log = logging.getLogger("jobs")
"""The example jobs' log: JSON lines at INFO on stdout (console.log in a
Worker, level "log" in Workers Logs; the host prints them). Left alone,
Python's logging would drop INFO and write WARNING and above to stderr
(console.error, an error in Workers Logs); a job's run is neither, so this
logger has a handler of its own and does not propagate (a root handler a
deployment adds would print each line twice). Payloads are never logged:
they may carry secrets."""
if not log.handlers:  # once, whichever module name imported this file first
    _handler = _Stdout()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False


@registry.job("example.echo", max_attempts=3, timeout_s=10)
async def echo(payload: Any, ctx: JobContext) -> None:
    """Logs that it ran, one JSON line with the job's id, queue and attempt
    (never the payload): the smallest job, for trying the queue out."""
    line = {"event": "example.echo", "id": ctx.job.id, "queue": ctx.job.queue}
    log.info(json.dumps({**line, "attempt": ctx.attempt}, separators=(",", ":")))


@registry.job("example.add", max_attempts=5, timeout_s=10, backoff=Backoff(base_s=2), subrequests=1)
async def add(payload: Any, ctx: JobContext) -> None:
    """Adds two numbers and queues the sum on as a follow-up echo job: shows
    validation (Fail) and a handler dispatching more work."""
    if not isinstance(payload, dict) or not all(
        isinstance(payload.get(k), int | float) for k in ("a", "b")
    ):
        raise Fail("payload must be an object with numbers a and b")
    await ctx.queue.dispatch(
        "example.echo", {"sum": payload["a"] + payload["b"]}, queue=ctx.job.queue
    )


@registry.job("example.ping", max_attempts=3, timeout_s=15, subrequests=2)
async def ping(payload: Any, ctx: JobContext) -> None:
    """Fetches a URL and queues an echo job with the status it answered: a
    handler making subrequests (one fetch, one D1 query), declared up front so
    the drain can plan its invocation with them."""
    url = payload.get("url") if isinstance(payload, dict) else None
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise Fail("payload must be an object with an http(s) url")
    response = await ctx.fetch(url)
    await ctx.queue.dispatch(
        "example.echo", {"url": url, "status": response.status}, queue=ctx.job.queue
    )
