"""Recurring schedules: one cron trigger serving any number of them.

A schedule enqueues job `name` with `payload` at each slot of a cron
expression read in an IANA time zone. Schedules live in D1
(migrations/0004_schedules.sql), declared in code (`Registry.schedule`,
`@registry.job(..., schedule=...)`, synced by the cron) or over the API.

Each cron run (`Schedules.run`, called by the Worker's `scheduled` before it
drains) costs at most two D1 queries however many schedules exist:

1. one `db.batch` reading the due schedules through the next_run_at index
   (rows read ~ due schedules) and the hash of the code-declared set last
   synced; the cron's bounded prunes ride in it (old failed jobs,
   D1QUEUE_KEEP_FAILED_S; completed history; flow-control rows that hold
   nothing; the job metrics' hourly rollup and old rows), so retention
   costs no round trip of its own;
2. if anything is due or the declared set changed, one `db.batch` holding a
   single INSERT of every due slot's job, a single compare-and-set UPDATE
   advancing every due schedule, and (only when the hash differs) the sync.

Exactly once per slot: the slot's job INSERT is an INSERT ... SELECT that
finds its schedule only while it still has the next_run_at (and definition
version) this run read, and the UPDATE that advances next_run_at runs in the
same transaction. Two runs that read the same slot (overlapping crons, a
retried run, several Workers on one D1, a re-sent batch) are serialised by
D1: the second finds next_run_at moved and writes nothing. The job's unique
key `schedule:<id>:<slot>` is a second lock while the job is queued; it alone
would not do, as it is freed when the job completes.

The rules (cron expressions, zones, slots, catch-up, definitions) are
schedule.py's, which talks to no database; this module is the D1 side.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..core.bounds import MAX_PAGE_BYTES, SCHEDULE_RUNS_KEPT
from ..core.flow import declared_windows
from ..core.job import new_id
from ..core.log import event, get
from ..core.registry import Registry, spec_for
from ..core.schedule import (  # the rules, also importable from this module
    ALIASES,
    CATCH_UP_POLICIES,
    DEFAULT_CATCH_UP,
    DEFAULT_GRACE_MS,
    DEFAULT_TZ,
    EMPTY_SET,
    MAX_CATCH_UP,
    MAX_CRON,
    NEVER,
    TZ_PATTERN,
    TZ_RULE,
    CatchUp,
    Cron,
    ScheduleDef,
    ScheduleError,
    SlotPlan,
    declared_hash,
    plan_slots,
    trigger_grace_ms,
    zone_of,
)
from ..core.shards import mark_id
from . import metrics, sql
from .binding import Result, Statement
from .queue import D1Queue

DUE_LIMIT = 100
"""Due schedules one cron run reads and enqueues (soonest first); more wait
for the next run. Bounds the run's CPU and the size of its one batch."""

DUE_LIMITS = {"free": 10, "paid": 500}
"""DUE_LIMIT by Workers plan (Config.plan): each due schedule costs a few
cron evaluations, ~0.15 ms of CPU under CPython (more under Pyodide), and
the free plan allows 10 ms per invocation, the drain's included."""

CODE_META_KEY = "schedules.code"
"""d1queue_meta's key for the hash of the code-declared set last synced."""

Source = Literal["code", "api"]

log = get(__name__)


@dataclass
class Schedule:
    """A stored schedule (a d1queue_schedules row)."""

    id: str
    cron: str
    tz: str
    name: str
    queue: str | None
    payload: str
    catch_up: str
    paused: bool
    source: Source
    version: str
    next_run_at: int
    last_run_at: int | None
    created_at: int
    updated_at: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Schedule:
        fields = {k: v for k, v in row.items() if k != "fits"}  # a listing's (bytes_bounded)
        return cls(**{**fields, "paused": bool(row["paused"])})

    def as_dict(self, registry: Registry | None = None) -> dict[str, Any]:
        """As the API answers: `queue` is where its jobs go (the job's
        registered queue when the schedule names none), `payload` decoded,
        `next_run_at` null when no slot is left."""
        out = asdict(self)
        out["queue"] = spec_for(registry, self.name).stored(queue=self.queue or None).queue
        with contextlib.suppress(ValueError):  # else written by something else: as stored
            out["payload"] = json.loads(self.payload)
        out["next_run_at"] = None if self.next_run_at >= NEVER else self.next_run_at
        del out["version"]
        return out


@dataclass
class ScheduleReport:
    """What one cron run did with schedules, and the failed-job prune sent in
    the same read batch; logged in the cron's line."""

    due: int = 0
    """Due schedules read (at most DUE_LIMIT)."""
    enqueued: int = 0
    """Jobs inserted for due slots."""
    advanced: int = 0
    """Schedules this run moved on (won the compare-and-set)."""
    lost: int = 0
    """Due schedules another run advanced first: nothing enqueued by us."""
    skipped: int = 0
    """Schedules that skipped a missed slot (their catch-up policy)."""
    broken: int = 0
    """Rows whose cron or zone this Worker cannot read: parked (never due)."""
    synced: bool = False
    """The code-declared set changed and was written."""
    more: bool = False
    """DUE_LIMIT schedules were due: the rest wait for the next run."""
    pruned_failed: int = 0
    """Failed jobs older than the retention this run deleted (at most the
    run's prune limit; more wait for the next run)."""
    pruned_completed: int = 0
    """Completed jobs kept past D1QUEUE_KEEP_COMPLETED_S this run deleted
    (at most the run's limit; more wait for the next run)."""
    pruned_flow: int = 0
    """Flow-control rows (a group's fair tag and rate window) this run
    deleted, of those it looked at (config.PRUNE_FLOW): they held nothing."""
    rolled_metrics: int = 0
    """Hour rows of the job metrics this run's rollup wrote (one per queue
    and job name that ran jobs in the hour it rolled; 0 between hours)."""
    pruned_metrics: int = 0
    """Minute and hour rows of the job metrics past their retention this
    run deleted (at most config.PRUNE_METRICS of each)."""
    queries: int = 0
    rows_read: int = 0
    rows_written: int = 0
    resent: bool = False
    """The write (or the read batch carrying the prune) was re-sent after a
    lost reply: its counts may read 0."""
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Prunes:
    """What a cron run prunes in the batch that reads its due schedules
    (Schedules.run's arguments): failed jobs, completed history and the
    batches finished with it, flow-control rows that hold nothing."""

    failed_before: int | None = None
    failed_limit: int = 0
    completed_before: int | None = None
    completed_limit: int = 0
    batches_before: int | None = None
    flow_limit: int = 0
    metrics_limit: int = 0

    def sent(self, now: int, registry: Registry) -> dict[str, _Prune]:
        """The prunes this run sends, by what they prune: "failed",
        "completed", "flow", "metrics" (each left out when its limit is 0)."""
        out = {}
        if self.failed_before is not None and self.failed_limit > 0:
            # In the batch every cron run sends anyway: no extra round trip.
            # A batch is one transaction, so a D1 error here fails the
            # schedules' read too; the DELETE is bounded to keep it short.
            cutoff = (max(0, self.failed_before), self.failed_limit)
            out["failed"] = _Prune([(sql.PRUNE_OLDEST_FAILED, cutoff)], counted=(0,))
        if self.completed_before is not None and self.completed_limit > 0:
            # History past its retention, bounded like the failures': the
            # edges of the jobs it deletes first, then the jobs, then the
            # batches that finished before the same cutoff.
            cut = (max(0, self.completed_before), self.completed_limit)
            finished = self.completed_before if self.batches_before is None else self.batches_before
            batches = (max(0, finished), self.completed_limit)
            out["completed"] = _Prune(
                [
                    (sql.PRUNE_DONE_EDGES, cut),
                    (sql.PRUNE_DONE, cut),
                    (sql.PRUNE_BATCH_PARTS, batches),
                    (sql.PRUNE_BATCHES, batches),
                ],
                counted=(1,),
            )
        if self.flow_limit > 0:
            # Flow-control rows that hold nothing, among the next
            # flow_limit: the cursor (made with the table's first row) moves
            # first, then the DELETE reads the window it wrote.
            code = declared_windows(registry.limits())
            out["flow"] = _Prune(
                [
                    (sql.FLOW_CURSOR_ROW, (now,)),
                    (sql.FLOW_CURSOR, (now, self.flow_limit)),
                    (sql.PRUNE_FLOW, (now, code)),
                ],
                counted=(2,),
            )
        if self.metrics_limit > 0:
            # The job metrics' hourly rollup (its own count, "rolled") and
            # their prune, bounded: store/metrics.py.
            made = metrics.maintenance(now, self.metrics_limit)
            out["rolled"] = _Prune(made[:2], counted=(metrics.ROLLED,))
            out["metrics"] = _Prune(made[2:], counted=(0, 1))
        return out


@dataclass
class _Prune:
    """One prune riding in the read batch: its statements, in order, and
    which of them deletes what it counts (the others move a cursor or
    delete what hangs on those rows)."""

    statements: list[Statement]
    counted: tuple[int, ...]


def _pruned(sent: dict[str, _Prune], results: list[Result]) -> dict[str, int]:
    """What each prune sent deleted, by what it prunes, from the batch's
    results past the two reads (in the prunes' order)."""
    out = {}
    for kind, prune in sent.items():
        mine, results = results[: len(prune.statements)], results[len(prune.statements) :]
        out[kind] = sum(mine[i].changes for i in prune.counted)
    return out


@dataclass
class _Run:
    """A cron run's writes for its due schedules: a job a due slot, and a
    compare-and-set advancing each schedule past what it enqueued."""

    slots: list[list[Any]] = field(default_factory=list)
    advance: list[list[Any]] = field(default_factory=list)

    def statements(self, now: int) -> list[Statement]:
        """A single INSERT of every slot's job and a single UPDATE advancing
        every schedule (each left out when it has nothing to write)."""
        out: list[Statement] = []
        if self.slots:
            out.append((sql.INSERT_SCHEDULED_JOBS, (json.dumps(self.slots), now)))
        if self.advance:
            out.append((sql.UPDATE_SCHEDULES_RAN, (json.dumps(self.advance),)))
        return out

    def count(self, report: ScheduleReport, results: list[Result]) -> None:
        """What `statements` did, from their results in the same order."""
        written = list(results)
        if self.slots:
            report.enqueued = written.pop(0).changes
        if self.advance:
            report.advanced = written.pop(0).changes
        report.lost = len(self.advance) - report.advanced


def _sync(declared: list[ScheduleDef], digest: str, now: int) -> list[Statement]:
    """A deployment changed the declared set: write it (only rows whose
    version differs are written), delete what code no longer declares, and
    remember the hash, so later runs send nothing."""
    entries = [d.sync_entry(now) for d in declared]
    return [
        (sql.SYNC_CODE_SCHEDULES, (json.dumps(entries), now)),
        (sql.DELETE_UNDECLARED_SCHEDULES, (json.dumps([d.id for d in declared]),)),
        (sql.SET_META, (CODE_META_KEY, digest, now)),
    ]


def _runs(text: Any) -> list[list[Any]]:
    """A schedule's `runs` column as read (NULL: none yet)."""
    if not text:
        return []
    try:
        runs = json.loads(text)
    except ValueError:  # written by something else: shown as none
        return []
    if not isinstance(runs, list):
        return []
    return [
        [int(r[0]), *r[1:]]
        for r in runs
        if isinstance(r, list)
        and len(r) >= 2
        and isinstance(r[0], int | float)
        and not isinstance(r[0], bool)
        and 0 <= r[0] < 2**53
        and isinstance(r[1], str)
    ]


class Schedules:
    """The schedules table, through a D1Queue's binding (the driver layer:
    statements from sql.py, counted against the invocation's meter).

    On a sharded deployment there is one per shard (aggregate.py): `shard`
    marks the ids of the jobs its slots enqueue, and `declared` picks the
    code-declared schedules that live on this shard (default: all)."""

    def __init__(
        self,
        queue: D1Queue,
        registry: Registry,
        *,
        shard: int = 0,
        declared: Callable[[ScheduleDef], bool] | None = None,
    ) -> None:
        self.queue, self.registry = queue, registry
        self.binding = queue.binding
        self.shard = shard
        self.declared = declared

    # -- the cron --------------------------------------------------------------

    async def run(
        self,
        *,
        now: int | None = None,
        grace_ms: int = DEFAULT_GRACE_MS,
        limit: int = DUE_LIMIT,
        prune_before: int | None = None,
        prune_limit: int = 0,
        prune_completed_before: int | None = None,
        prune_completed_limit: int = 0,
        prune_batches_before: int | None = None,
        prune_flow_limit: int = 0,
        prune_metrics_limit: int = 0,
    ) -> ScheduleReport:
        """Enqueue every due slot and sync code-declared schedules, in at most
        two D1 queries. With `prune_before` (epoch ms) and `prune_limit`, the
        first query also deletes up to that many failed jobs that failed
        before it, oldest first; with `prune_completed_before` and
        `prune_completed_limit`, up to that many completed jobs kept from
        before it (and the batches finished before it); with
        `prune_flow_limit`, the flow-control rows that hold nothing among
        the next that many (sql.PRUNE_FLOW); with `prune_metrics_limit`,
        the job metrics' hourly rollup and up to that many of their minute
        rows and of their hour rows past retention (store/metrics.py).
        Never raises for a D1 error (it is in the report): the drain that
        follows must run all the same."""
        now = self.queue.clock() if now is None else now
        usage = self.binding.usage
        base = (usage.queries, usage.rows_read, usage.rows_written)
        report = ScheduleReport()
        prunes = _Prunes(
            prune_before,
            prune_limit,
            prune_completed_before,
            prune_completed_limit,
            prune_batches_before,
            prune_flow_limit,
            prune_metrics_limit,
        )
        try:
            await self._run(report, now, grace_ms, limit, prunes)
        except Exception as exc:
            report.error = f"{type(exc).__name__}: {exc}"[:1000]
        report.queries = usage.queries - base[0]
        report.rows_read = usage.rows_read - base[1]
        report.rows_written = usage.rows_written - base[2]
        return report

    async def _run(
        self, report: ScheduleReport, now: int, grace_ms: int, limit: int, prunes: _Prunes
    ) -> None:
        """The run's two batches: the read (with the prunes), then the
        writes, if the due schedules or a changed declared set need any."""
        declared = [
            d for d in self.registry.schedules() if self.declared is None or self.declared(d)
        ]
        digest = declared_hash(declared)
        stored, due = await self._read(report, now, limit, prunes)
        run = _Run()
        for row in due:
            self._plan(row, now, grace_ms, run, report)
        statements = run.statements(now)
        counted = len(statements)
        if stored != digest:
            statements += _sync(declared, digest, now)
        if not statements:
            return
        results = await self.binding.batch(statements)
        report.resent = report.resent or any(r.resent for r in results)
        report.synced = len(statements) > counted
        run.count(report, results[:counted])

    async def _read(
        self, report: ScheduleReport, now: int, limit: int, prunes: _Prunes
    ) -> tuple[str, list[dict[str, Any]]]:
        """One batch: the hash of the declared set last synced, the due
        schedules (soonest first, at most `limit`) and the prunes riding
        with them, whose counts go in the report."""
        sent = prunes.sent(now, self.registry)
        reads: list[Statement] = [
            (sql.SELECT_META, (CODE_META_KEY,)),
            (sql.SELECT_DUE_SCHEDULES, (now, limit)),
            *(statement for prune in sent.values() for statement in prune.statements),
        ]
        meta, due, *pruned = await self.binding.batch(reads)
        counts = _pruned(sent, pruned)
        report.pruned_failed = counts.get("failed", 0)
        report.pruned_completed = counts.get("completed", 0)
        report.pruned_flow = counts.get("flow", 0)
        report.rolled_metrics = counts.get("rolled", 0)
        report.pruned_metrics = counts.get("metrics", 0)
        report.resent = any(r.resent for r in pruned)
        report.due, report.more = len(due.rows), len(due.rows) >= limit
        return (str(meta.rows[0]["value"]) if meta.rows else EMPTY_SET), due.rows

    def _plan(
        self, row: dict[str, Any], now: int, grace_ms: int, run: _Run, report: ScheduleReport
    ) -> None:
        read = [row["id"], row["next_run_at"], row["version"]]
        try:
            cron = Cron.parse(row["cron"], row["tz"])
        except ScheduleError as exc:
            # Written by something else, or a zone this runtime lacks: parked,
            # or it would be read (and fill the LIMIT) on every run.
            event(log, "d1queue.schedule.parked", logging.WARNING, id=row["id"], error=str(exc))
            report.broken += 1
            run.advance.append([*read, NEVER, None])
            return
        plan = plan_slots(cron, str(row["catch_up"]), int(row["next_run_at"]), now, grace_ms)
        report.skipped += plan.skipped
        # A name this Worker does not know is still enqueued, with the
        # library's defaults (registry.spec_for).
        spec = spec_for(self.registry, str(row["name"]))
        queue, attempts, priority = spec.stored(queue=row["queue"] or None)
        ran = []
        for slot in plan.slots:
            job_id = mark_id(new_id(now), self.shard)
            run.slots.append([*read, job_id, slot, queue, attempts, priority])
            ran.append([slot, job_id])
        # The runs it keeps, newest first, written by the advance itself.
        kept = ran[::-1][:SCHEDULE_RUNS_KEPT]
        run.advance.append([*read, plan.next_run_at, plan.slots[-1] if plan.slots else None, kept])

    # -- the API ---------------------------------------------------------------

    async def put(self, d: ScheduleDef) -> tuple[bool, Schedule | None]:
        """Create or replace API schedule `d`, in one round trip. Returns
        (created, the stored row); the row is a code-declared one, left as
        it was, if `d.id` is declared in code (the caller refuses that)."""
        now = self.queue.clock()
        params = (
            d.id,
            d.cron,
            d.tz,
            d.name,
            d.queue,
            d.payload_json,
            d.catch_up,
            d.version,
            d.parsed.next_after(now),
            now,
        )
        before, _, after = await self.binding.batch(
            [
                (sql.SELECT_SCHEDULE, (d.id,)),
                (sql.PUT_API_SCHEDULE, params),
                (sql.SELECT_SCHEDULE, (d.id,)),
            ]
        )
        row = Schedule.from_row(after.rows[0]) if after.rows else None
        # A re-send after a lost reply sees its own row in `before`: it
        # answers "replaced", which is what the second request did.
        return not before.rows, row

    async def get(self, id: str) -> Schedule | None:
        found = await self.binding.run(sql.SELECT_SCHEDULE, id)
        return Schedule.from_row(found.rows[0]) if found.rows else None

    async def page(
        self, limit: int, cursor: str | None, max_bytes: int = MAX_PAGE_BYTES
    ) -> tuple[list[Schedule], str | None]:
        """Schedules by id, `limit` at a time after `cursor` (an id), and at
        most `max_bytes` of their payloads a page (one schedule at least)."""
        found = await self.binding.run(sql.LIST_SCHEDULES, cursor or "", limit + 1, max_bytes)
        page, more = sql.bounded_page(found.rows)
        rows = [Schedule.from_row(r) for r in page]
        return rows, (rows[-1].id if more and rows else None)

    async def runs(self, ids: list[str]) -> dict[str, list[list[Any]]]:
        """The last runs of each of `ids` found here, newest first, each
        [time, job id] (a third element "now": pushed by "Run now"); a
        schedule that has not run yet has none. One query, a seek an id."""
        if not ids:
            return {}
        found = await self.binding.run(sql.SCHEDULE_RUNS, json.dumps(ids))
        return {str(r["id"]): _runs(r["runs"]) for r in found.rows}

    async def run_now(self, row: Schedule, job_id: str) -> tuple[bool, str]:
        """Push schedule `row`'s job once now, with id `job_id` (the caller's
        choice, so that sending it again pushes nothing), and record it in
        the schedule's runs: one batch, one transaction. Returns (pushed by
        this call, the job's queue). A re-send after a lost reply finds the
        id in the runs and writes nothing: (False, queue)."""
        now = self.queue.clock()
        queue, attempts, priority = spec_for(self.registry, row.name).stored(
            queue=row.queue or None
        )
        pushed, _ = await self.binding.batch(
            [
                (sql.SCHEDULE_RUN_NOW_JOB, (row.id, job_id, queue, attempts, priority, now)),
                (sql.SCHEDULE_RUN_NOW_RECORD, (row.id, job_id, now)),
            ]
        )
        return bool(pushed.changes), queue

    async def delete(self, id: str) -> Literal["deleted", "missing", "code"]:
        """Delete API schedule `id`; a code-declared one is not deleted here
        (it would come back at the next change of the declared set)."""
        deleted, still = await self.binding.batch(
            [(sql.DELETE_API_SCHEDULE, (id,)), (sql.SELECT_SCHEDULE, (id,))]
        )
        if still.rows:
            return "code"
        return "deleted" if deleted.changes or deleted.resent else "missing"

    async def set_paused(self, id: str, paused: bool) -> Schedule | None:
        """Pause or resume `id` (None: no such schedule). Resuming restarts
        from the next slot after now: slots while paused are skipped."""
        now = self.queue.clock()
        if paused:
            _, found = await self.binding.batch(
                [(sql.PAUSE_SCHEDULE, (id, now)), (sql.SELECT_SCHEDULE, (id,))]
            )
            return Schedule.from_row(found.rows[0]) if found.rows else None
        row = await self.get(id)
        if row is None or not row.paused:
            return row
        try:
            next_run_at = Cron.parse(row.cron, row.tz).next_after(now)
        except ScheduleError:
            next_run_at = NEVER
        _, found = await self.binding.batch(
            [
                (sql.RESUME_SCHEDULE, (id, next_run_at, now, row.version)),
                (sql.SELECT_SCHEDULE, (id,)),
            ]
        )
        return Schedule.from_row(found.rows[0]) if found.rows else None


__all__ = [
    "ALIASES",
    "CATCH_UP_POLICIES",
    "CODE_META_KEY",
    "DEFAULT_CATCH_UP",
    "DEFAULT_GRACE_MS",
    "DEFAULT_TZ",
    "DUE_LIMIT",
    "DUE_LIMITS",
    "EMPTY_SET",
    "MAX_CATCH_UP",
    "MAX_CRON",
    "NEVER",
    "TZ_PATTERN",
    "TZ_RULE",
    "CatchUp",
    "Cron",
    "Schedule",
    "ScheduleDef",
    "ScheduleError",
    "ScheduleReport",
    "Schedules",
    "SlotPlan",
    "declared_hash",
    "plan_slots",
    "trigger_grace_ms",
    "zone_of",
]
