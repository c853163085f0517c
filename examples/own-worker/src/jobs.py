"""This Worker's jobs: what its d1queue runs."""

from typing import Any

from d1queue import Registry
from d1queue.core.log import event, get

registry = Registry()
log = get("own_worker")


@registry.job("hello.greet", queue="default", subrequests=0)
async def greet(payload: Any) -> None:
    """Log a greeting: one JSON line, {"event": "hello.greet", "who": ...}."""
    event(log, "hello.greet", who=str(payload.get("name", "world")))
