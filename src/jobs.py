"""This deployment's jobs. Register a handler here and it can be queued by name.

A handler is an async function of `(payload)` or `(payload, ctx)`. Return
normally to succeed; raise `Retry(delay_s=...)` to run again later, `Fail(...)`
to give up now; any other exception retries with the job's backoff until its
attempts run out.
"""

from __future__ import annotations

import asyncio
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


STEPS_MAX_MS = 60_000
"""example.steps' whole run, at most (steps * sleep_ms): inside its timeout,
which is http.request's, so the lease already covers it."""


STEPS_CANCEL_WATCH_S = 5.0
"""How often a running example.steps reads whether a cancel marked it (12
watches in its 65 s, subrequests of their own beside its 20 progress
writes), so a cancel of a running one ends it within this."""


@registry.job(
    "example.steps",
    max_attempts=3,
    timeout_s=65,
    backoff=Backoff(base_s=1),
    subrequests=20,
    cancel_watch_s=STEPS_CANCEL_WATCH_S,
)
async def steps(payload: Any, ctx: JobContext) -> dict[str, Any]:
    """Runs `steps` steps of `sleep_ms` each, reporting its progress and
    logging a line at every step (shown by GET /v1/jobs/{id} while it runs,
    and kept in its attempt history): `{"steps": n, "sleep_ms": t,
    "fail_at": k?}`. With `fail_at`, step k raises on every attempt but the
    job's last: with its 3 attempts it fails twice, then completes, and its
    history shows the three. Cancelled while it runs, its drain's watch
    finds the mark within STEPS_CANCEL_WATCH_S and cancels its task, and it
    ends cancelled, with a log line saying at which step. Its progress
    writes (at most one per two seconds) are the 20 subrequests it declares
    besides its watches: past the twentieth, its progress waits for its
    settle."""
    if not isinstance(payload, dict):
        raise Fail('payload must be an object {"steps": n, "sleep_ms": t, "fail_at": k?}')
    n, sleep_ms, fail_at = payload.get("steps"), payload.get("sleep_ms", 0), payload.get("fail_at")
    if not (type(n) is int and 1 <= n <= 1000):
        raise Fail("steps must be an integer from 1 to 1000")
    if not (type(sleep_ms) is int and sleep_ms >= 0 and n * sleep_ms <= STEPS_MAX_MS):
        raise Fail(f"sleep_ms must be an integer from 0, and steps * sleep_ms <= {STEPS_MAX_MS}")
    if fail_at is not None and not (type(fail_at) is int and 1 <= fail_at <= n):
        raise Fail("fail_at must be a step number from 1 to steps")
    last_attempt = ctx.attempt >= ctx.job.max_attempts
    for i in range(1, n + 1):
        if ctx.cancelled:  # a cancel of the running job, found by its watch
            ctx.log.warning("cancelled before step %d of %d", i, n)
            return {"steps": i - 1, "cancelled": True}
        if sleep_ms:
            try:
                await asyncio.sleep(sleep_ms / 1000)
            except asyncio.CancelledError:
                # Its watch found the job cancelled: say where, then stop.
                ctx.log.warning("cancelled during step %d of %d", i, n)
                raise
        if i == fail_at and not last_attempt:
            ctx.log.error("step %d of %d failed (attempt %d)", i, n, ctx.attempt)
            raise RuntimeError(f"example.steps failed at step {i} on attempt {ctx.attempt}")
        ctx.log.info("step %d of %d done", i, n)
        await ctx.progress(i / n, note=f"step {i} of {n}")
    return {"steps": n}
