"""Flow control's rules: a queue's limits, what each promises, and how they
are read from a request, a row or code.

A queue's limits hold across every invocation that claims from its
database (cron runs, Queues consumers, drains after pushes), because a
claim takes its place under them in the claim's own D1 batch, never by a
read before it: its concurrency places are unique indexes its own row
enters (store/sql.py, claim_limited), its rates' starts a window it takes
a start in (TAKE_FLOW):

- `concurrency`: at most N of the queue's jobs held by workers at once;
- `group_concurrency`: at most N per group;
- `rate`: at most `limit` claims in any window of `period_s` seconds (a
  sliding window over the claims' times, kept per row, so no fixed-window
  burst of twice the limit across a boundary), and `group_rate` per group.

A job holds its place from its claim until it is settled or its lease
lapses: a worker that dies frees it when its lease ends, never later.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .bounds import LIMIT_RANGE, PERIOD_RANGE, check_group

QUEUE_ROW = "*"
"""The d1queue_flow row of the queue-wide limits ("*" is no group's name)."""
NO_GROUP = ""
"""The d1queue_flow row, and the fair turn, of a queue's jobs that carry no
group: they form one group of their own."""

RATE_GUARD_MS = 1000
"""How much longer than its period a rate's window is counted. A claim's
time is read before its batch is sent; its handler starts after the reply.
Counting each window a second longer keeps the limit on handlers' starts
(what a rate protects: the calls they make), not only on claims, as long as
a handler starts within a second of its claim (a drain claims for a limited
queue no more than it can start at once)."""

LONGEST_WINDOW_MS = PERIOD_RANGE[1] * 1000 + RATE_GUARD_MS
"""The longest window any rate counts starts in: a row's starts older than
it count for no rate there may be (the flow prune's bound, store/sql.py
PRUNE_FLOW, where no rate of the row is known)."""

LIMIT_FIELDS = ("concurrency", "group_concurrency", "rate", "group_rate")
"""A limits body's fields: PUT /v1/queues/{queue}/limits, GET's `limits`,
the stats' `limits`, the dashboard's form, the OpenAPI schema."""


class LimitsError(ValueError):
    """A limits body or declaration that cannot be stored."""


def _whole(value: object) -> object:
    """An integral float as the int it is: JSON Schema's integer takes 3.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _count(field: str, value: object) -> int:
    lo, hi = LIMIT_RANGE
    value = _whole(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise LimitsError(f"{field} must be an integer from {lo} to {hi}, got {value!r}")
    return value


@dataclass(frozen=True)
class Rate:
    """At most `limit` claims in any window of `period_s` seconds."""

    limit: int
    period_s: int

    def __post_init__(self) -> None:
        _count("rate limit", self.limit)
        lo, hi = PERIOD_RANGE
        p = self.period_s
        if isinstance(p, bool) or not isinstance(p, int) or not lo <= p <= hi:
            raise LimitsError(f"period_s must be an integer from {lo} to {hi}, got {p!r}")

    @property
    def window_ms(self) -> int:
        """The window a claim counts earlier claims in (RATE_GUARD_MS)."""
        return self.period_s * 1000 + RATE_GUARD_MS

    @property
    def spacing_ms(self) -> int:
        """The even spacing of `limit` starts over the period."""
        return -(-self.period_s * 1000 // self.limit)

    @classmethod
    def parse(cls, field: str, value: object) -> Rate | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise LimitsError(f"{field} must be null or {{limit, period_s}}, got {value!r}")
        extra = sorted(set(value) - {"limit", "period_s"})
        if extra:
            raise LimitsError(f"{field}: unknown fields {', '.join(extra)}")
        if "limit" not in value or "period_s" not in value:
            raise LimitsError(f"{field} needs limit and period_s")
        period = _whole(value["period_s"])
        return cls(_count(f"{field}.limit", value["limit"]), period)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, int]:
        return {"limit": self.limit, "period_s": self.period_s}


@dataclass(frozen=True)
class Limits:
    """A queue's limits; None is no limit of that kind."""

    concurrency: int | None = None
    group_concurrency: int | None = None
    rate: Rate | None = None
    group_rate: Rate | None = None

    def __post_init__(self) -> None:
        for name in ("concurrency", "group_concurrency"):
            value = getattr(self, name)
            if value is not None:
                _count(name, value)

    @property
    def none(self) -> bool:
        """No limit at all: the queue claims as a queue without limits."""
        return self == NO_LIMITS

    @property
    def queue_wide(self) -> bool:
        return self.concurrency is not None or self.rate is not None

    @property
    def per_group(self) -> bool:
        return self.group_concurrency is not None or self.group_rate is not None

    @property
    def rated(self) -> bool:
        return self.rate is not None or self.group_rate is not None

    @property
    def rows(self) -> int:
        """The statements a claim carries besides its own: a TAKE_FLOW per
        rate (its group's, its queue's). Concurrency places cost none: the
        claim sets them on its row."""
        return int(self.rate is not None) + int(self.group_rate is not None)

    @classmethod
    def parse(cls, body: object) -> Limits:
        """The limits of a PUT body (every field optional, null meaning none);
        LimitsError naming what is wrong."""
        if not isinstance(body, Mapping):
            raise LimitsError("limits must be a JSON object")
        extra = sorted(set(body) - set(LIMIT_FIELDS))
        if extra:
            raise LimitsError(f"unknown fields: {', '.join(map(str, extra))}")
        counts = {}
        for name in ("concurrency", "group_concurrency"):
            value = body.get(name)
            counts[name] = None if value is None else _count(name, value)
        return cls(
            counts["concurrency"],
            counts["group_concurrency"],
            Rate.parse("rate", body.get("rate")),
            Rate.parse("group_rate", body.get("group_rate")),
        )

    def as_dict(self) -> dict[str, Any]:
        """The PUT body's shape, every field present."""
        return {
            "concurrency": self.concurrency,
            "group_concurrency": self.group_concurrency,
            "rate": self.rate.as_dict() if self.rate else None,
            "group_rate": self.group_rate.as_dict() if self.group_rate else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: object) -> Limits | None:
        """A d1queue_queues.limits value: None for no row or NULL (the code's
        limits apply), else what was stored (one that no longer parses is no
        limit, never an error in a drain)."""
        if not isinstance(text, str):
            return None
        try:
            return cls.parse(json.loads(text))
        except (ValueError, TypeError):
            return NO_LIMITS

    def row(self, grp: str) -> tuple[int, int, int]:
        """The (concurrency, rate limit, window ms) a d1queue_flow row
        enforces: the queue's for QUEUE_ROW, a group's for any other; 0 for
        none."""
        n, rate = (
            (self.concurrency, self.rate)
            if grp == QUEUE_ROW
            else (self.group_concurrency, self.group_rate)
        )
        return (n or 0, rate.limit if rate else 0, rate.window_ms if rate else 0)


NO_LIMITS = Limits()


def declared_windows(declared: Mapping[str, Limits]) -> str:
    """The limits declared in code as the flow prune reads them (store/sql.py
    PRUNE_FLOW): a JSON object {queue: [rate window ms, group rate window
    ms, group step ms]}, 0 for no rate and null for no group rate's step (a
    push's step is then the default, 1 ms)."""
    out = {
        q: [
            limits.rate.window_ms if limits.rate else 0,
            limits.group_rate.window_ms if limits.group_rate else 0,
            limits.group_rate.spacing_ms if limits.group_rate else None,
        ]
        for q, limits in declared.items()
        if limits.rated
    }
    return json.dumps(out, separators=(",", ":"), sort_keys=True)


GroupRule = Callable[[Any], Any]
"""How a job's registration derives its group from its payload."""


def derive_group(rule: GroupRule | None, payload: Any) -> str | None:
    """The group a registration's rule gives `payload` (None: no group). A
    rule that fails or gives something that is not a group raises
    ValueError, so a bad payload is a clear 4xx at push, never a job stuck
    in a group it cannot be found by."""
    if rule is None:
        return None
    try:
        value = rule(payload)
    except Exception as exc:
        raise ValueError(f"the job's group rule failed on its payload: {exc!r}") from exc
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # an account number is a fine group
    return check_group(value)


@dataclass(frozen=True)
class Flow:
    """What a drain knows of a queue's flow control when it claims: its
    limits (stored, else declared in code) and whether its jobs carry groups
    (then claims take groups in turn)."""

    limits: Limits = NO_LIMITS
    grouped: bool = False

    @property
    def active(self) -> bool:
        """Whether claims on the queue differ from a plain queue's."""
        return self.grouped or not self.limits.none


def flows_of(
    rows: list[tuple[str, object, bool]], declared: Mapping[str, Limits]
) -> dict[str, Flow]:
    """Each queue's Flow from its d1queue_queues row (name, stored limits,
    grouped) and the limits declared in code: stored limits win, code's
    apply where none are stored."""
    out: dict[str, Flow] = {q: Flow(limits) for q, limits in declared.items() if not limits.none}
    for name, stored, grouped in rows:
        limits = Limits.from_json(stored)
        if limits is None:
            limits = declared.get(name, NO_LIMITS)
        flow = Flow(limits, bool(grouped))
        if flow.active:
            out[name] = flow
        else:
            out.pop(name, None)
    return out
