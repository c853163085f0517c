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


class TooManyDependents(ValueError):
    """A push would make more jobs wait for each job of `ids` than
    bounds.MAX_DEPENDENTS (the jobs waiting for it already, with those of
    this push that name it): nothing was written."""

    def __init__(self, ids: list[str], most: int) -> None:
        super().__init__(
            f"a job may be waited for by at most {most} jobs (MAX_DEPENDENTS), and this push "
            f"would pass it for: {', '.join(ids)}; nothing was written (fan out through a "
            "batch a handler pushes instead)"
        )
        self.ids, self.most = ids, most


class TooManyEdges(ValueError):
    """The jobs of one push name more ids in `after`, in all, than
    bounds.MAX_EDGES: refused before anything is sent."""

    def __init__(self, edges: int, most: int) -> None:
        super().__init__(
            f"the jobs name {edges} ids in after in all; one push may name at most {most} "
            "(MAX_EDGES): split it"
        )
        self.edges, self.most = edges, most


class EmptyBatch(ValueError):
    """A batch none of whose jobs was pushed (each one's unique_key already
    held by a queued job): it could never end, so nothing was written."""


class BatchNotRunning(Exception):
    """Jobs were added to a batch that finished (every job of it ended and
    its callbacks fired) or never existed: nothing was written."""
