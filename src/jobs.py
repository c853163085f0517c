"""This deployment's jobs. Register a handler here and it can be queued by name.

A handler is an async function of `(payload)` or `(payload, ctx)`. Return
normally to succeed; raise `Retry(delay_s=...)` to run again later, `Fail(...)`
to give up now; any other exception retries with the job's backoff until its
attempts run out.
"""

from __future__ import annotations

from typing import Any

from d1queue import Backoff, Fail, JobContext, Registry
from d1queue.core.log import event, install

registry = Registry()


log = install("jobs")
"""The example jobs' log: one JSON line per event on stdout (console.log in
a Worker; the host prints it), as d1queue's own. Payloads are never logged:
they may carry secrets, and a log has more readers than the queue."""


@registry.job("example.echo", max_attempts=3, timeout_s=10)
async def echo(payload: Any, ctx: JobContext) -> None:
    """Logs that it ran, one JSON line with the job's id, queue and attempt
    (never the payload): the smallest job, for trying the queue out."""
    event(log, "example.echo", id=ctx.job.id, queue=ctx.job.queue, attempt=ctx.attempt)


@registry.job("example.add", max_attempts=5, timeout_s=10, backoff=Backoff(base_s=2), subrequests=1)
async def add(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Adds two numbers and queues the sum on as a follow-up echo job: shows
    validation (Fail), a handler dispatching more work, and a result (its
    return value, kept with the completed job)."""
    if not isinstance(payload, dict) or not all(
        isinstance(payload.get(k), int | float) for k in ("a", "b")
    ):
        raise Fail("payload must be an object with numbers a and b")
    total = payload["a"] + payload["b"]
    await ctx.queue.dispatch("example.echo", {"sum": total}, queue=ctx.job.queue)
    return {"sum": total}


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
