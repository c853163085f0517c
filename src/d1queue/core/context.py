"""JobContext: what a handler may use besides its payload, every call that
reaches the network counted against the job's declared subrequests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .job import QueuedJob
from .limits import Meter, MeteredEnv
from .outbound import Outbound, Reply, send

Fetch = Callable[..., Awaitable[Any]]
"""The Worker's outbound HTTP: fetch(url, *, method, headers, body, service, env)
sends one request without following redirects and returns a response with
`status`, `header(name)`, `async read(limit)` (at most `limit` bytes of the
body) and `async cancel()`; `service` names a service binding in `env` to
send the request through. Test doubles may offer `async text()` instead of
`read`."""


CALLBACKS = ("on_success", "on_failure", "on_finish")
"""A batch's callbacks, by the name their id ends with (`<batch>:<name>`)."""


@dataclass
class JobContext:
    """What a handler may use besides its payload.

    Everything here that reaches the network counts against the job's
    declared subrequests (`registry.job(..., subrequests=N)`): `queue`,
    bindings read from `env`, and `fetch`. A call past that budget raises
    SubrequestLimitExceeded before it is sent, and the attempt is retried, so
    one handler cannot make the whole invocation cross Cloudflare's cap."""

    job: QueuedJob
    queue: Any  # the D1Queue, to dispatch follow-up jobs (typed Any: no import cycle)
    env: Any = None  # the Worker's env, bindings metered, when run by a Worker
    meter: Meter | None = None
    """This attempt's subrequest budget (None: not metered, as in unit tests)."""
    http: Fetch | None = None
    """The Worker's fetch, as given to `drain(fetch=...)`."""
    raw_env: Any = None
    """The env underneath `env`, for the service bindings `fetch` sends through."""
    outbound: Outbound = field(default_factory=Outbound)
    """What `fetch` may reach (Config.outbound: D1QUEUE_HTTP_ALLOW, D1QUEUE_HTTP_SERVICES)."""
    cancelled: bool = False
    """A cancel marked this job while it ran, and the drain's watch found
    it (`cancel_watch_s`): the handler's task is being cancelled. A
    cooperative handler that catches asyncio.CancelledError to clean up
    may read it; the job ends cancelled whatever the handler then does."""

    @property
    def attempt(self) -> int:
        """Which attempt this is, from 1."""
        return self.job.attempts

    @property
    def batch_id(self) -> str | None:
        """The workflow batch of this job, or, for a batch's callback
        (`<batch>:on_success`, `:on_failure`, `:on_finish`), the batch it was
        enqueued for; None for neither."""
        if self.job.batch is not None:
            return self.job.batch
        head, sep, kind = self.job.id.rpartition(":")
        return head if sep and kind in CALLBACKS else None

    @property
    def keeps_result(self) -> bool:
        """Whether this job's queue keeps completed jobs, and so its result:
        a drain's context says (outcomes.history_kept); one made by hand
        keeps it."""
        return True

    async def results(self) -> dict[str, Any]:
        """The results of the jobs this one waited for (`after`), by id: each
        one's return value while it is kept as completed (a dependency
        ignored as failed, or pruned, is absent). One D1 query."""
        if not self.job.after:
            return {}
        found: dict[str, Any] = await self.queue.workflows.results(self.job.after)
        return found

    async def batch(self) -> dict[str, Any] | None:
        """This job's batch (see `batch_id`): `{id, total, pending, completed,
        failed, state, created_at, finished_at, ids}`; None if it has none.
        A callback reads the counts its batch ended with. One D1 query."""
        if self.batch_id is None:
            return None
        found = await self.queue.workflows.batch(self.batch_id)
        return None if found is None else dict(found.as_dict(ids=True))

    async def add_to_batch(self, name: str, payload: Any = None, **overrides: Any) -> str:
        """Add a job to this job's batch (which runs while this job does):
        its callbacks then wait for the new job too. Returns its id. One D1
        query."""
        if self.job.batch is None:
            raise ValueError("this job belongs to no batch")
        job = self.queue.new_job(name, payload, **overrides)
        (id,) = await self.queue.add_to_batch(self.job.batch, [job])
        return str(id)

    async def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: str | None = None,
        service: str | None = None,
    ) -> Reply:
        """An HTTP request through the Worker's fetch (or the service binding
        `service`) under the deployment's outbound rules (outbound.send):
        one subrequest, and one more for each redirect it follows. A target
        the rules refuse raises OutboundRefused, which fails the job."""
        if self.http is None:
            raise RuntimeError("this drain was given no fetch: pass drain(..., fetch=...)")
        meter = self.meter
        return await send(
            self.http,
            self.outbound,
            url,
            method=method,
            headers=headers or {},
            body=body,
            service=service,
            env=self.raw_env if self.raw_env is not None else self.env,
            spend=None if meter is None else meter.spend,
        )


class DrainContext(JobContext):
    """The JobContext a drain hands each job: the same interface, but the
    attempt's budget (a child of the invocation's meter holding the
    subrequests the handler declared) and the queue and env metered by it
    are made when the handler first reaches for them. Most handlers touch
    none, and making all three cost about a third of a no-op job's CPU in
    Pyodide (the free plan allows 10 ms per invocation)."""

    def __init__(
        self,
        job: QueuedJob,
        *,
        parent: Meter,
        declared: int,
        queue: Any,
        env: Any = None,
        http: Fetch | None = None,
        outbound: Outbound | None = None,
        keeps: Callable[[str], bool] | None = None,
    ) -> None:
        self.job = job
        self.http = http
        self.cancelled = False
        self.outbound = outbound or Outbound()
        self.raw_env = env
        self._parent = parent
        self._declared = declared
        self._queue_source = queue
        self._keeps = keeps
        self._budget: Meter | None = None
        self._queue: Any = None
        self._env: Any = None

    @property
    def meter(self) -> Meter:
        """This attempt's budget, counted into the invocation's meter."""
        if self._budget is None:
            declared = self._declared
            self._budget = self._parent.child(
                declared,
                label=f"job {self.job.name!r}, which declared subrequests={declared},",
                hint="; register it with a larger subrequests=",
            )
        return self._budget

    @meter.setter
    def meter(self, value: Meter) -> None:
        self._budget = value

    @property
    def queue(self) -> Any:
        if self._queue is None:
            # The drain's queue, its D1 calls counted into this job's budget.
            source = self._queue_source
            # ... and carrying its trace: what it pushes joins its producer's.
            self._queue = source.derive(
                binding=source.binding.metered(self.meter), traceparent=self.job.traceparent
            )
        return self._queue

    @queue.setter
    def queue(self, value: Any) -> None:
        self._queue = value

    @property
    def keeps_result(self) -> bool:
        # Asked of the drain (its queues' history rule): no metered twin
        # of the queue made for it.
        return True if self._keeps is None else self._keeps(self.job.queue)

    @property
    def env(self) -> Any:
        if self._env is None and self.raw_env is not None:
            self._env = MeteredEnv(self.raw_env, self.meter)
        return self._env

    @env.setter
    def env(self, value: Any) -> None:
        self._env = value

    @property
    def refused(self) -> BaseException | None:
        """The first subrequest this attempt was refused, if any (None when
        it never reached for its budget)."""
        return None if self._budget is None else self._budget.refused
