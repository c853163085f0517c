"""What a workflow's reads see: a job wherever it is in its life (waiting,
queued, running, completed and kept, failed), a queue's completed jobs, a
job's dependents, a batch's progress, the results a handler waited for.
Pushing and settling them is push.py's and settle.py's (workflow_ends.py);
counting their ends is the schema's (migrations/0010_workflows.sql)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.bounds import MAX_PAGE_BYTES, NAME_ALPHABET, json_loads
from ..core.job import QueuedJob
from . import sql
from .binding import Binding, Result, Statement
from .failed import FailedJob
from .rows import row_to_job, stored_progress, stored_runs

JobState = Literal[
    "waiting", "ready", "delayed", "reserved", "cancelling", "completed", "failed", "cancelled"
]

COMPLETED_CURSOR_RULE = rf"[0-9]{{1,15}}:{NAME_ALPHABET}{{0,128}}"
"""A page cursor of completed jobs: `<completed_at>:<id>`, the position after
which the next page starts, newest first."""


def stored(text: str | None) -> Any:
    """A stored JSON value (a result) as Python, or the text itself if it
    does not decode (written by something else)."""
    if text is None:
        return None
    try:
        return json_loads(text)
    except ValueError:
        return text


@dataclass
class JobView:
    """A job as the API and the dashboard show it."""

    job: QueuedJob
    state: JobState
    result: Any = None
    completed_at: int | None = None
    ignore_failed: bool = False
    runs: list[dict[str, Any]] = field(default_factory=list)
    """Its attempt history, oldest first (core/history.py)."""
    progress: dict[str, Any] | None = None
    """Its latest progress report (ctx.progress), while it runs with its
    attempt's log lines so far (`logs`); None: none made."""
    started_at: int | None = None
    """When its running attempt was claimed (None: not running)."""


@dataclass
class BatchState:
    """A batch's progress: `state` is running while a job is pending, then
    succeeded if none failed, else failed."""

    id: str
    total: int
    pending: int
    completed: int
    failed: int
    created_at: int
    finished_at: int | None = None
    ids: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, r: Mapping[str, Any]) -> BatchState:
        """A d1queue_batches row joined with its parts' `ids` (sql.SELECT_BATCH)."""
        ids = json.loads(r["ids"]) if r["ids"] else []
        return cls(
            id=str(r["id"]),
            total=int(r["total"]),
            pending=int(r["pending"]),
            completed=int(r["completed"]),
            failed=int(r["failed"]),
            created_at=int(r["created_at"]),
            finished_at=None if r["finished_at"] is None else int(r["finished_at"]),
            ids=[str(i) for i in ids],
        )

    @property
    def state(self) -> Literal["running", "succeeded", "failed"]:
        if self.pending > 0:
            return "running"
        return "failed" if self.failed else "succeeded"

    def as_dict(self, *, ids: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "total": self.total,
            "pending": self.pending,
            "completed": self.completed,
            "failed": self.failed,
            "state": self.state,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }
        if ids:
            out["ids"] = self.ids
        return out


def state_of(job: QueuedJob, now: int) -> JobState:
    """Where a live job is in its life, as of `now`."""
    if job.cancel_at is not None:
        return "cancelling"  # marked while held: its drain (or the next claim) ends it
    if job.band == sql.WAITING_BAND:
        return "waiting"
    if job.reserved_until is not None and job.reserved_until > now:
        return "reserved"  # a lapsed lease is ready: the next claim takes it over
    # A grouped job waiting its turn is ready whatever its fair tag says.
    return "ready" if job.available_at <= now or job.waiting_turn else "delayed"


class Workflows:
    """The workflow reads of one database (`binding`), at `clock`'s time."""

    def __init__(self, binding: Binding, clock: Callable[[], int]) -> None:
        self.binding = binding
        self.clock = clock

    async def job(self, id: str) -> JobView | FailedJob | None:
        """Job `id` wherever it is: live, completed and kept (with its
        result), failed (a FailedJob), or None (never pushed, cancelled, or
        completed on a queue that keeps no history, or pruned). One round
        trip."""
        found, _ = await self.job_and_dependents(id, 0)
        return found

    async def job_and_dependents(
        self, id: str, limit: int = 100
    ) -> tuple[JobView | FailedJob | None, list[str]]:
        """`job(id)` and `dependents(id, limit)` in one round trip (no
        dependents read when `limit` is 0)."""
        reads: list[Statement] = [
            (sql.SELECT_JOB_VIEW, (id,)),
            (sql.SELECT_FAILED, (id,)),
        ]
        if limit > 0:
            reads.append((sql.DEPENDENTS, (id, limit)))
        found, failed, *edges = await self.binding.batch(reads)
        waiters = [str(r["waiter"]) for e in edges for r in e.rows]
        return self._view(found, failed), waiters

    def _view(self, found: Result, failed: Result) -> JobView | FailedJob | None:
        if found.rows:
            row = found.rows[0]
            job = row_to_job(row)
            runs, progress = stored_runs(row.get("runs")), stored_progress(row.get("progress"))
            if job.band == sql.DONE_BAND:
                return JobView(
                    job,
                    "completed",
                    stored(row["result"]),
                    int(row["available_at"]),
                    bool(row["ignore_failed"]),
                    runs,
                    progress,
                )
            state = state_of(job, self.clock())
            # A lapsed lease's attempt is over: the next claim runs it again.
            started = row.get("reserved_at") if state == "reserved" else None
            return JobView(
                job, state, None, None, bool(row["ignore_failed"]), runs, progress, started
            )
        return FailedJob.of(failed.rows[0]) if failed.rows else None

    async def completed(
        self,
        queue: str,
        limit: int = 50,
        cursor: str | None = None,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> tuple[list[JobView], str | None]:
        """A page of `queue`'s completed jobs kept, newest first, and the next
        page's cursor (None: the last page): at most `limit` jobs, and at
        most `max_bytes` of their payloads, results and errors (one job at
        least), cut in the SQL (sql.bytes_bounded)."""
        if cursor:
            at_text, _, after_id = cursor.partition(":")
            at, last = int(at_text), after_id
        else:
            at, last = sql.MAX_SAFE_TIME, ""
        result = await self.binding.run(sql.LIST_COMPLETED, queue, at, last, limit + 1, max_bytes)
        rows, more = sql.bounded_page(result.rows)
        views = [
            JobView(
                row_to_job(r),
                "completed",
                stored(r["result"]),
                int(r["available_at"]),
                bool(r["ignore_failed"]),
                stored_runs(r.get("runs")),
                stored_progress(r.get("progress")),
            )
            for r in rows
        ]
        nxt = f"{views[-1].completed_at}:{views[-1].job.id}" if more and views else None
        return views, nxt

    async def dependents(self, id: str, limit: int = 100) -> list[str]:
        """The ids of the jobs waiting (or that waited) for job `id`, at most
        `limit`: the edges kept while `id` is live or kept as completed."""
        result = await self.binding.run(sql.DEPENDENTS, id, limit)
        return [str(r["waiter"]) for r in result.rows]

    async def results(self, ids: Sequence[str]) -> dict[str, Any]:
        """The results of the completed jobs among `ids` that are kept (one
        query per 100 ids)."""
        out: dict[str, Any] = {}
        for i in range(0, len(ids), 100):
            found = await self.binding.run(
                sql.DEPENDENCY_RESULTS, json.dumps(list(ids[i : i + 100]))
            )
            out.update({str(r["id"]): stored(r["result"]) for r in found.rows})
        return out

    async def batch(self, id: str) -> BatchState | None:
        """Batch `id`'s progress and its jobs' ids; None if there is no such
        batch (never made, or pruned after it finished)."""
        found = await self.binding.run(sql.SELECT_BATCH, id)
        if not found.rows:
            return None
        return BatchState.of(found.rows[0])
