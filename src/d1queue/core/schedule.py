"""A schedule's rules: cron expressions read in a time zone, the slots a
cron run enqueues by a schedule's catch-up policy, and a schedule's
definition (`ScheduleDef`) with its validation and version.

This module talks to no database: the D1 side (the cron run's statements,
the schedules' API) is schedules.py. Slots use cronsim (BSD-3-Clause, pure
Python), which follows Debian cron on daylight-saving changes: a job at a
fixed time (say 02:30) in a skipped hour runs right after the change, once;
in a repeated hour it runs once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from functools import cached_property
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .bounds import (
    MAX_JSON_DEPTH,
    MAX_PAYLOAD_BYTES,
    MAX_SAFE_INT,
    is_name,
    name_refusal,
    value_depth,
)

DEFAULT_TZ = "UTC"
"""The zone a schedule's cron is read in when it names none."""

CatchUp = Literal["none", "latest", "all"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("none", "latest", "all")
"""What a schedule does with slots missed while no cron run came (an outage):
`none` enqueues none of them, only an on-time slot; `latest` the most recent
missed one; `all` every one, at most MAX_CATCH_UP."""
DEFAULT_CATCH_UP: CatchUp = "none"
"""A schedule's catch-up policy when it names none."""

MAX_CATCH_UP = 100
"""Slots `catch_up="all"` enqueues for one schedule after an outage: the most
recent ones. Bounds the jobs (and rows written) one run can create."""

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
    def parse(cls, expr: Any, tz: Any = DEFAULT_TZ) -> Cron:
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
    tz: str = DEFAULT_TZ
    catch_up: str = DEFAULT_CATCH_UP

    def __post_init__(self) -> None:
        """Validated on construction: ScheduleError naming the field."""
        if not is_name(self.id):
            raise ScheduleError("id", name_refusal("schedule id", self.id))
        if not is_name(self.name):
            raise ScheduleError("name", name_refusal("name", self.name))
        if self.queue is not None and (not is_name(self.queue)):
            raise ScheduleError("queue", name_refusal("queue", self.queue))
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


__all__ = [
    "CATCH_UP_POLICIES",
    "DEFAULT_CATCH_UP",
    "DEFAULT_TZ",
    "MAX_CATCH_UP",
    "Cron",
    "ScheduleDef",
    "ScheduleError",
    "SlotPlan",
    "declared_hash",
    "plan_slots",
    "trigger_grace_ms",
    "zone_of",
]
