"""Shards: which D1 database holds a job, and how a job id says so.

One D1 database runs one query at a time (about 1,000 queries/s) and holds
10 GB at most. A deployment that outgrows it lists several D1 bindings
(`D1QUEUE_SHARDS = "DB,DB_1,DB_2"`); shard i is the i-th binding listed,
so the list may grow at its end but must never be reordered (ids name
shards by position).

Routing is pure and stable (it must give the same answer in every Worker
instance, across deploys and Python versions, so never Python's `hash()`):
a queue pinned in `D1QUEUE_SHARD_MAP` lives on its shard; any other job goes
by CRC-32 of its partition key mod the shard count, the key being the
queue's name unless the job carries an explicit `partition`. Routing by
queue keeps each queue on one database: its claim order (priority, then
age) and its unique keys hold for the whole queue. A partition key spreads
one hot queue over shards, at the price of both (unique keys are then per
shard).

A job's id says which shard holds it: shard 0's ids are what they always
were (32 hex digits, time-ordered), so every id made before sharding stays
valid; shard k >= 1 prefixes `s<k>-`. All ids of one shard share their
prefix, so they still sort in creation order (FIFO ties) within the shard.

This module talks to no database: the D1 side is shardset.py.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

MAX_SHARDS = 100
"""D1 bindings one deployment may use as shards (ids carry up to 2 digits)."""

BINDING_RULE = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
"""A D1 binding's name as wrangler.toml's `binding` may spell it."""
BINDING_PATTERN = re.compile(BINDING_RULE)

_MARK = re.compile(r"s([1-9][0-9]?)-")
"""The shard marker at the start of an id: `s1-` ... `s99-`. `s0-` is never
made (shard 0's ids carry no marker) and means nothing."""


def mark_id(id: str, shard: int) -> str:
    """`id` (made by job.new_id) as an id of `shard`."""
    return id if shard == 0 else f"s{shard}-{id}"


def shard_of_id(id: str) -> int:
    """The shard an id names: its `s<k>-` marker, else 0 (every id made
    before sharding, and any id a caller chose without a marker)."""
    m = _MARK.match(id)
    return int(m.group(1)) if m else 0


def hash_shard(key: str, shards: int) -> int:
    """A stable shard for `key`: CRC-32 of its UTF-8 bytes mod `shards`."""
    return zlib.crc32(key.encode()) % shards if shards > 1 else 0


@dataclass(frozen=True)
class Routing:
    """Where jobs go: `count` shards, `pinned` queues on fixed shards."""

    count: int = 1
    pinned: Mapping[str, int] = field(default_factory=dict)

    def shard_of(self, queue: str, partition: str | None = None) -> int:
        """The shard of a job on `queue` with `partition` (None: by queue)."""
        pinned = self.pinned.get(queue)
        if pinned is not None:
            return pinned
        return hash_shard(queue if partition is None else partition, self.count)


def split(total: int, parts: int) -> list[int]:
    """`total` in `parts` shares as equal as integers allow, the larger
    first; they add up to `total` exactly."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@dataclass
class Shares:
    """An invocation's budgets of queries and jobs over shards drained one
    after another (the cron's turn, a wake-up naming several): each turn
    gets its equal share (`split`) plus what the turns before it left
    unspent, so the drains' budgets add up to the whole and an idle shard
    gives its share to a busy one. The one rule for both."""

    queries: list[int]
    jobs: list[int]
    carried_queries: int = 0
    carried_jobs: int = 0

    @classmethod
    def of(cls, queries: int, jobs: int, parts: int) -> Shares:
        return cls(split(queries, parts), split(jobs, parts))

    def turn(self, i: int, spent: int = 0) -> tuple[int, int]:
        """Turn `i`'s budget of queries and jobs: its share and what the
        turns before left, less `spent` queries already made for it (its
        schedules' query, say)."""
        return self.queries[i] + self.carried_queries - spent, self.jobs[i] + self.carried_jobs

    def used(self, queries: int, jobs: int, spent_queries: int, spent_jobs: int) -> None:
        """A turn given `queries` and `jobs` spent that much: the rest
        carries to the next turn."""
        self.carried_queries = max(0, queries - spent_queries)
        self.carried_jobs = max(0, jobs - spent_jobs)


def rotation(count: int, start: int) -> list[int]:
    """Shards in turn from `start` (mod count): the cron starts each run at
    a different shard, so a shard late in the turn is not always the one a
    short budget or a slow run leaves out."""
    return [(start + i) % count for i in range(count)]


def parse_shards(raw: str) -> tuple[str, ...]:
    """D1QUEUE_SHARDS: comma-separated binding names (validated by Config)."""
    return tuple(b.strip() for b in raw.split(","))


def parse_shard_map(raw: str) -> tuple[tuple[str, int], ...]:
    """D1QUEUE_SHARD_MAP: `queue=shard,...`; ValueError for another shape."""
    pairs = []
    for entry in raw.split(","):
        if not entry.strip():
            continue
        queue, sep, shard = entry.partition("=")
        if not sep or not shard.strip().isdigit():
            raise ValueError(entry)
        pairs.append((queue.strip(), int(shard.strip())))
    return tuple(pairs)


def check(bindings: Sequence[str], shard_map: Sequence[tuple[str, int]]) -> str | None:
    """What is wrong with a shard configuration, in words (None: nothing)."""
    if not 1 <= len(bindings) <= MAX_SHARDS:
        return f"D1QUEUE_SHARDS must name 1 to {MAX_SHARDS} D1 bindings"
    for b in bindings:
        if not BINDING_PATTERN.fullmatch(b):
            return f"D1QUEUE_SHARDS: {b!r} is not a binding name ({BINDING_RULE})"
    repeated = sorted({b for b in bindings if list(bindings).count(b) > 1})
    if repeated:
        return f"D1QUEUE_SHARDS names {', '.join(repeated)} more than once"
    queues = [q for q, _ in shard_map]
    repeated = sorted({q for q in queues if queues.count(q) > 1})
    if repeated:
        return f"D1QUEUE_SHARD_MAP pins {', '.join(repeated)} more than once"
    for queue, shard in shard_map:
        if not 0 <= shard < len(bindings):
            return (
                f"D1QUEUE_SHARD_MAP: {queue}={shard}, but D1QUEUE_SHARDS has "
                f"{len(bindings)} shard(s), 0 to {len(bindings) - 1}"
            )
    return None


__all__ = [
    "MAX_SHARDS",
    "Routing",
    "hash_shard",
    "mark_id",
    "rotation",
    "shard_of_id",
    "split",
]


def merge_pages(
    pages: Sequence[tuple[Sequence[T], bool]],
    key: Callable[[T], Any],
    limit: int,
    reverse: bool = False,
) -> tuple[list[T], bool]:
    """One page of a list kept on several shards, from each shard's page
    (rows, whether that shard has more) read after the same cursor: a
    position in the list's order, not a shard's. Returns the first `limit`
    rows of them all in the list's order (`key`, `reverse`), up to the
    earliest last row of a shard that has more, and whether the list goes
    on past them: some shard has more, or the shards' pages hold more than
    `limit` rows together. The next page's cursor is the last row returned,
    on every shard at once, so a page costs one query a shard and no row is
    skipped or shown twice."""
    rows = sorted((row for page, _ in pages for row in page), key=key, reverse=reverse)
    # A shard's page cut short (at its bytes, bounds.page_bytes) may end
    # before the others': its rows after its last one are unread, so no row
    # past that one may be shown, or the next page would start after them.
    ends = [key(page[-1]) for page, has_more in pages if has_more and page]
    if ends:
        end = max(ends) if reverse else min(ends)
        rows = [r for r in rows if (key(r) >= end if reverse else key(r) <= end)]
    more = len(rows) > limit or any(has_more for _, has_more in pages)
    return rows[:limit], more
