"""What a handler raises to decide its job's outcome (besides returning, which
acknowledges it, and any other exception, which retries it with its backoff)."""

from __future__ import annotations


class Retry(Exception):
    """Raised by a handler to be run again after `delay_s` seconds (None: the
    job's backoff decides). Counts as an attempt."""

    def __init__(self, reason: str = "retry requested", *, delay_s: float | None = None):
        super().__init__(reason)
        self.delay_s = delay_s


class Fail(Exception):
    """Raised by a handler to fail the job now, whatever attempts remain: the
    input is wrong and running it again cannot help."""


class UnknownDependency(ValueError):
    """A push named in `after` a job that is neither queued, running, failed
    nor kept as completed (on the job's database): nothing was written."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(
            "after names no job that is queued, running, failed or kept as completed: "
            + ", ".join(ids)
        )
        self.ids = ids


class EmptyBatch(ValueError):
    """A batch none of whose jobs was pushed (each one's unique_key already
    held by a queued job): it could never end, so nothing was written."""


class BatchNotRunning(Exception):
    """Jobs were added to a batch that finished (every job of it ended and
    its callbacks fired) or never existed: nothing was written."""
