"""Recurring schedules: one cron trigger serving any number of them.

A schedule enqueues job `name` with `payload` at each slot of a cron
expression read in an IANA time zone. Schedules live in D1
(migrations/0004_schedules.sql), declared in code (`Registry.schedule`,
`@registry.job(..., schedule=...)`, synced by the cron) or over the API.

Each cron run (`Schedules.run`, called by the Worker's `scheduled` before it
drains) costs at most two D1 queries however many schedules exist:

1. one `db.batch` reading the due schedules through the next_run_at index
   (rows read ~ due schedules) and the hash of the code-declared set last
   synced; the cron's bounded prune of old failed jobs rides in it
   (D1QUEUE_KEEP_FAILED_S), so retention costs no round trip of its own;
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

Slots use cronsim (BSD-3-Clause, pure Python), which follows Debian cron on
daylight-saving changes: a job at a fixed time (say 02:30) in a skipped hour
runs right after the change, once; in a repeated hour it runs once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, tzinfo
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from . import sql
from .binding import Result, Statement
from .bounds import (
    MAX_JSON_DEPTH,
    MAX_PAYLOAD_BYTES,
    MAX_SAFE_INT,
    NAME_RULE,
    is_name,
    value_depth,
)
from .job import new_id
from .log import event, get
from .shards import mark_id

if TYPE_CHECKING:  # both import registry.py, which imports this module
    from .queue import D1Queue
    from .registry import Registry

CatchUp = Literal["none", "latest", "all"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("none", "latest", "all")
"""What a schedule does with slots missed while no cron run came (an outage):
`none` enqueues none of them, only an on-time slot; `latest` the most recent
missed one; `all` every one, at most MAX_CATCH_UP."""

MAX_CATCH_UP = 100
"""Slots `catch_up="all"` enqueues for one schedule after an outage: the most
recent ones. Bounds the jobs (and rows written) one run can create."""

DUE_LIMIT = 100
"""Due schedules one cron run reads and enqueues (soonest first); more wait
for the next run. Bounds the run's CPU and the size of its one batch."""

DUE_LIMITS = {"free": 10, "paid": 500}
"""DUE_LIMIT by Workers plan (Config.plan): each due schedule costs a few
cron evaluations, ~0.15 ms of CPU under CPython (more under Pyodide), and
the free plan allows 10 ms per invocation, the drain's included."""

DEFAULT_GRACE_MS = 120_000
"""How late a slot may be found and still count as on time (not missed) when
the trigger's own period is unknown: one minute's trigger period plus a
minute for a run that starts late or failed once."""

NEVER = MAX_SAFE_INT
"""next_run_at of a schedule with no slot left (cronsim finds none within 50
years): never due."""

MAX_CRON = 100
"""Characters of a cron expression."""
TZ_RULE = r"[A-Za-z][A-Za-z0-9_+\-/]{0,63}"
"""The shape of an IANA zone name; checked before zoneinfo looks for a file."""
TZ_PATTERN = re.compile(TZ_RULE)

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""Vixie cron's nicknames (cronsim reads the five fields only)."""

CODE_META_KEY = "schedules.code"
"""d1queue_meta's key for the hash of the code-declared set last synced."""

Source = Literal["code", "api"]

log = get(__name__)


class ScheduleError(ValueError):
    """A schedule that cannot be stored; `field` names what is wrong (cron, tz,
    name, queue, payload, catch_up, id)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _ms(dt: datetime) -> int:
    return int(dt.timestamp()) * 1000


@dataclass(frozen=True)
class Cron:
    """A cron expression read in a time zone, answering in epoch ms."""

    expr: str
    """As given (whitespace normalised)."""
    fields: str
    """The five fields cronsim reads (a nickname expanded)."""
    zone: tzinfo

    @classmethod
    def parse(cls, expr: Any, tz: Any = "UTC") -> Cron:
        """ScheduleError("cron" | "tz") for anything that is not a standard
        5-field expression (ranges, steps, lists, month and day names, and
        cronsim's L, W and # extras) or a nickname, or an unknown zone."""
        zone = zone_of(tz)
        if not isinstance(expr, str) or not 0 < len(expr) <= MAX_CRON:
            raise ScheduleError("cron", f"cron must be a string of 1 to {MAX_CRON} characters")
        text = " ".join(expr.split())
        fields = ALIASES.get(text.lower(), text)
        if fields.startswith("@"):
            raise ScheduleError(
                "cron",
                f"cron {text!r}: unknown nickname; known: {', '.join(sorted(ALIASES))}",
            )
        if len(fields.split()) != 5:
            # cronsim also reads a 6th (seconds) field; the cron trigger
            # fires once a minute, so a seconds field would promise too much.
            raise ScheduleError(
                "cron", f"cron {text!r} must have 5 fields (minute hour day month weekday)"
            )
        try:
            CronSim(fields, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as exc:
            raise ScheduleError("cron", f"cron {text!r} is not valid: {exc}") from None
        return cls(text, fields, zone)

    def _iter(self, ms: int, reverse: bool) -> CronSim:
        return CronSim(
            self.fields,
            datetime.fromtimestamp(ms / 1000, UTC).astimezone(self.zone),
            reverse=reverse,
        )

    def next_after(self, ms: int) -> int:
        """The first slot strictly after `ms` (NEVER if none in 50 years)."""
        it = self._iter(ms, reverse=False)
        while True:
            try:
                slot = _ms(next(it))
            except StopIteration:
                return NEVER
            # cronsim reads fixed-time expressions in local wall time: started
            # inside a repeated (fall-back) hour it can answer the first
            # occurrence, which is before `ms`. Such an answer is skipped.
            if slot > ms:
                return slot

    def slots_back(self, newest: int, oldest: int, limit: int) -> list[int]:
        """Up to `limit` slots in [oldest, newest], newest first."""
        # Reverse iteration starts one second past `newest`, so a slot at
        # `newest` itself is found; answers past it are skipped.
        it = self._iter(newest + 1000, reverse=True)
        out: list[int] = []
        while len(out) < limit:
            try:
                slot = _ms(next(it))
            except StopIteration:
                break
            if slot > newest:
                continue
            if slot < oldest:
                break
            if not out or slot < out[-1]:
                out.append(slot)
        return out


def zone_of(tz: Any) -> tzinfo:
    """The zone named `tz` (ScheduleError("tz") if there is none). Pyodide
    has no zone files: the tzdata package vendored into the upload holds
    them."""
    if not isinstance(tz, str) or not TZ_PATTERN.fullmatch(tz) or ".." in tz:
        raise ScheduleError(
            "tz", f"tz must be an IANA time zone name such as Europe/Berlin: {tz!r}"
        )
    if tz == "UTC":
        return UTC
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError("tz", f"unknown time zone {tz!r}") from None


def trigger_grace_ms(trigger: str | None, at_ms: int) -> int:
    """How late a slot may be found and still be on time, for a run of cron
    trigger `trigger` (controller.cron) at `at_ms`: the trigger's period
    there (a slot younger than that is one this run is the first to see) plus
    a minute, for a run that started late. DEFAULT_GRACE_MS if unknown."""
    if not trigger:
        return DEFAULT_GRACE_MS
    try:
        cron = Cron.parse(trigger, "UTC")
    except ScheduleError:
        return DEFAULT_GRACE_MS
    (last,) = cron.slots_back(at_ms, 0, 1) or (at_ms,)
    after = cron.next_after(last)
    return DEFAULT_GRACE_MS if after == NEVER else after - last + 60_000


@dataclass(frozen=True)
class SlotPlan:
    """What one run does for one due schedule."""

    slots: list[int]
    """Slots to enqueue, oldest first."""
    next_run_at: int
    skipped: bool
    """Some due slot was left out by the catch-up policy."""


def plan_slots(cron: Cron, catch_up: str, due_at: int, now: int, grace_ms: int) -> SlotPlan:
    """The slots a run at `now` enqueues for a schedule whose next_run_at is
    `due_at` (<= now), by its catch-up policy, and its next slot after now.
    A slot is missed when it is more than `grace_ms` old: no run came while
    it was on time."""
    want = MAX_CATCH_UP if catch_up == "all" else 1
    newest = cron.slots_back(now, due_at, want) or [due_at]
    latest = newest[0]
    if catch_up == "all":
        slots = sorted(newest)
    elif catch_up == "latest" or now - latest <= grace_ms:
        slots = [latest]
    else:
        slots = []  # "none": the latest due slot is itself missed
    return SlotPlan(slots, cron.next_after(now), not slots or slots[0] != due_at)


@dataclass(frozen=True)
class ScheduleDef:
    """A schedule's definition: what the API and `Registry.schedule` take.
    `queue` None: the job's registered queue at each slot."""

    id: str
    cron: str
    name: str
    payload: Any = None
    queue: str | None = None
    tz: str = "UTC"
    catch_up: str = "none"

    def __post_init__(self) -> None:
        """Validated on construction: ScheduleError naming the field."""
        if not is_name(self.id):
            raise ScheduleError("id", f"schedule id must match {NAME_RULE}, got {self.id!r}")
        if not is_name(self.name):
            raise ScheduleError("name", f"name must match {NAME_RULE}, got {self.name!r}")
        if self.queue is not None and (not is_name(self.queue)):
            raise ScheduleError("queue", f"queue must match {NAME_RULE}, got {self.queue!r}")
        if self.catch_up not in CATCH_UP_POLICIES:
            raise ScheduleError(
                "catch_up",
                f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, got {self.catch_up!r}",
            )
        object.__setattr__(self, "cron", self.parsed.expr)
        size = len(self.payload_json.encode())
        if size > MAX_PAYLOAD_BYTES:
            raise ScheduleError(
                "payload", f"payload is {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}"
            )

    @cached_property
    def parsed(self) -> Cron:
        return Cron.parse(self.cron, self.tz)

    @cached_property
    def payload_json(self) -> str:
        if value_depth(self.payload) > MAX_JSON_DEPTH:
            raise ScheduleError("payload", f"payload nests deeper than {MAX_JSON_DEPTH} levels")
        try:
            return json.dumps(self.payload, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ScheduleError("payload", f"payload is not JSON-serialisable: {exc}") from None

    @cached_property
    def version(self) -> str:
        """A hash of everything a slot's job depends on: the cron run
        advances a schedule only while its row has the version it read, and
        a replace or sync writes only when it differs (rows written cost)."""
        text = json.dumps(
            [self.cron, self.tz, self.name, self.queue, self.payload_json, self.catch_up],
            separators=(",", ":"),
        )
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def sync_entry(self, now: int) -> dict[str, Any]:
        """This definition as SYNC_CODE_SCHEDULES reads it from its JSON."""
        return {
            "id": self.id,
            "cron": self.cron,
            "tz": self.tz,
            "name": self.name,
            "queue": self.queue,
            "payload": self.payload_json,
            "catch_up": self.catch_up,
            "version": self.version,
            "next_run_at": self.parsed.next_after(now),
        }


def declared_hash(defs: Sequence[ScheduleDef]) -> str:
    """The code-declared set as one value: ids and versions, sorted."""
    text = json.dumps(sorted([d.id, d.version] for d in defs), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


EMPTY_SET = declared_hash([])


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
        return cls(**{**row, "paused": bool(row["paused"])})

    def as_dict(self, registry: Registry | None = None) -> dict[str, Any]:
        """As the API answers: `queue` is where its jobs go (the job's
        registered queue when the schedule names none), `payload` decoded,
        `next_run_at` null when no slot is left."""
        out = asdict(self)
        spec = registry.get(self.name) if registry is not None else None
        out["queue"] = self.queue or (spec.queue if spec is not None else "default")
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
class _Run:
    slots: list[list[Any]] = field(default_factory=list)
    advance: list[list[Any]] = field(default_factory=list)


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
    ) -> ScheduleReport:
        """Enqueue every due slot and sync code-declared schedules, in at most
        two D1 queries. With `prune_before` (epoch ms) and `prune_limit`, the
        first query also deletes up to that many failed jobs that failed
        before it, oldest first. Never raises for a D1 error (it is in the
        report): the drain that follows must run all the same."""
        now = self.queue.clock() if now is None else now
        usage = self.binding.usage
        base = (usage.queries, usage.rows_read, usage.rows_written)
        report = ScheduleReport()
        try:
            await self._run(report, now, grace_ms, limit, prune_before, prune_limit)
        except Exception as exc:
            report.error = f"{type(exc).__name__}: {exc}"[:1000]
        report.queries = usage.queries - base[0]
        report.rows_read = usage.rows_read - base[1]
        report.rows_written = usage.rows_written - base[2]
        return report

    async def _run(
        self,
        report: ScheduleReport,
        now: int,
        grace_ms: int,
        limit: int,
        prune_before: int | None,
        prune_limit: int,
    ) -> None:
        declared = [
            d for d in self.registry.schedules() if self.declared is None or self.declared(d)
        ]
        digest = declared_hash(declared)
        reads: list[Statement] = [
            (sql.SELECT_META, (CODE_META_KEY,)),
            (sql.SELECT_DUE_SCHEDULES, (now, limit)),
        ]
        if prune_before is not None and prune_limit > 0:
            # In the batch every cron run sends anyway: no extra round trip.
            # A batch is one transaction, so a D1 error here fails the
            # schedules' read too; the DELETE is bounded to keep it short.
            reads.append((sql.PRUNE_OLDEST_FAILED, (max(0, prune_before), prune_limit)))
        meta, due, *pruned = await self.binding.batch(reads)
        report.pruned_failed = sum(r.changes for r in pruned)
        report.resent = any(r.resent for r in pruned)
        stored = str(meta.rows[0]["value"]) if meta.rows else EMPTY_SET
        report.due, report.more = len(due.rows), len(due.rows) >= limit
        run = _Run()
        for row in due.rows:
            self._plan(row, now, grace_ms, run, report)
        statements: list[Statement] = []
        if run.slots:
            statements.append((sql.INSERT_SCHEDULED_JOBS, (json.dumps(run.slots), now)))
        if run.advance:
            statements.append((sql.UPDATE_SCHEDULES_RAN, (json.dumps(run.advance),)))
        counted = len(statements)
        if stored != digest:
            # A deployment changed the declared set: write it (only rows whose
            # version differs are written), delete what code no longer
            # declares, and remember the hash, so later runs send nothing.
            entries = [d.sync_entry(now) for d in declared]
            statements += [
                (sql.SYNC_CODE_SCHEDULES, (json.dumps(entries), now)),
                (sql.DELETE_UNDECLARED_SCHEDULES, (json.dumps([d.id for d in declared]),)),
                (sql.SET_META, (CODE_META_KEY, digest, now)),
            ]
        if not statements:
            return
        results = await self.binding.batch(statements)
        report.resent = report.resent or any(r.resent for r in results)
        report.synced = len(statements) > counted
        written: list[Result] = results[:counted]
        if run.slots:
            report.enqueued = written.pop(0).changes
        if run.advance:
            report.advanced = written.pop(0).changes
        report.lost = len(run.advance) - report.advanced

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
        spec = self.registry.get(str(row["name"]))
        # A name this Worker does not know is still enqueued (another Worker
        # on the same D1 may run it; else the drain fails it, visibly).
        queue = row["queue"] or (spec.queue if spec is not None else "default")
        attempts = spec.max_attempts if spec is not None else 3
        priority = spec.priority if spec is not None else 0
        for slot in plan.slots:
            run.slots.append(
                [*read, mark_id(new_id(now), self.shard), slot, queue, attempts, priority]
            )
        run.advance.append([*read, plan.next_run_at, plan.slots[-1] if plan.slots else None])

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

    async def page(self, limit: int, cursor: str | None) -> tuple[list[Schedule], str | None]:
        """Schedules by id, `limit` at a time after `cursor` (an id)."""
        found = await self.binding.run(sql.LIST_SCHEDULES, cursor or "", limit)
        rows = [Schedule.from_row(r) for r in found.rows]
        return rows, (rows[-1].id if len(rows) == limit else None)

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
    "CATCH_UP_POLICIES",
    "MAX_CATCH_UP",
    "Cron",
    "Schedule",
    "ScheduleDef",
    "ScheduleError",
    "ScheduleReport",
    "Schedules",
    "plan_slots",
    "trigger_grace_ms",
]
