"""JobContext: what a handler may use besides its payload, every call that
reaches the network counted against the job's declared subrequests."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .job import QueuedJob
from .limits import Meter, MeteredEnv
from .log import event
from .outbound import Outbound, Reply, send
from .runs import Notes, jlog

Fetch = Callable[..., Awaitable[Any]]
"""The Worker's outbound HTTP: fetch(url, *, method, headers, body, service, env)
sends one request without following redirects and returns a response with
`status`, `header(name)`, `async read(limit)` (at most `limit` bytes of the
body) and `async cancel()`; `service` names a service binding in `env` to
send the request through. Test doubles may offer `async text()` instead of
`read`."""


ProgressWriter = Callable[[Any, QueuedJob, str, int], Awaitable[Any]]
"""Writes a held job's progress report: (queue, job, progress JSON, its
sequence number), through the queue given (the ctx's, metered)."""


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
    write_progress: ProgressWriter | None = None
    """How `progress` writes to the held job (the drain's: store/settle.py
    record_progress, through `queue`); None: reports are kept for the settle."""

    @property
    def attempt(self) -> int:
        """Which attempt this is, from 1."""
        return self.job.attempts

    def _notes(self) -> Notes:
        notes: Notes | None = self.__dict__.get("_run_notes")
        if notes is None:
            notes = self.__dict__["_run_notes"] = Notes(self.job)
        return notes

    @property
    def log(self) -> logging.Logger:
        """This attempt's logger: what a handler logs through it (INFO and
        up, unless it sets another level) is kept with the attempt in its
        job's history (at most MAX_LOG_LINES lines and MAX_LOG_BYTES, the
        rest counted as `logs_truncated`), written with its settle and with
        its progress reports, never a write per line; and each record is
        also a JSON log line (`d1queue.job.log`) with the job's id and
        trace. Nothing is sent to D1 for it."""
        return self._notes().log

    async def progress(self, value: float, note: str | None = None) -> None:
        """Report how far this attempt got: `value` a fraction (0 to 1) or a
        count, `note` at most MAX_PROGRESS_NOTE characters (ValueError or
        TypeError for anything else, nothing written). The first report is
        written to the job at once, then at most one per
        runs.PROGRESS_INTERVAL_S (those in between are coalesced: the
        latest is written by the next that is due), each with the log lines
        so far; the last is written with the attempt's settle whatever
        happens. Each write is one D1 query counted in the subrequests the
        job declared; with none left it is skipped (the settle still
        writes the last). A write D1 fails is logged, never raised: the
        handler's work does not depend on it."""
        notes = self._notes()
        if not notes.report(value, note):
            return  # coalesced: written by the next due report, or the settle
        job, writer = self.job, self.write_progress
        if job.reservation is None or job.reserved_until is None or writer is None:
            return  # not held by a drain (a context made by hand): the settle has it
        meter = self.meter
        if meter is not None and meter.left() < 1:
            return  # its declared subrequests are spent: the settle writes it
        text, seq = notes.live()
        try:
            await writer(self.queue, job, text, seq)
        except Exception as exc:
            event(
                jlog,
                "d1queue.job.progress_failed",
                logging.WARNING,
                id=job.id,
                queue=job.queue,
                error=f"{type(exc).__name__}: {exc}",
            )

    @property
    def kept(self) -> dict[str, Any] | None:
        """What this attempt's entry in its job's history carries from its
        handler: its last progress, its log lines (None: it used neither)."""
        notes: Notes | None = self.__dict__.get("_run_notes")
        return None if notes is None else notes.kept()

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
        write_progress: ProgressWriter | None = None,
    ) -> None:
        self.job = job
        self.write_progress = write_progress
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
