"""Every SQL statement d1queue sends, named and parameterised, in one place.

Only `?NNN` parameters (D1 supports no named ones), no `RETURNING`, no
`FOR UPDATE`: the claim protocol is plain conditional UPDATEs whose
`meta.changes` decides who won, so it works on any SQLite-shaped backend.
Each statement binds at most a handful of values, far below D1's limit of
100 bound parameters per query.

Each statement is an `Sql`: its text, carrying its name here (the constant's
name, or the builder's: `insert_jobs`), which the binding counts, times and
traces (`binding.Usage.by_name`, `Usage.trace`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from ..core.bounds import MAX_ERROR_CHARS, MAX_RUNS, PRIORITY_RANGE, SCHEDULE_RUNS_KEPT
from ..core.flow import LONGEST_WINDOW_MS, RATE_GUARD_MS
from ..core.metrics import BUCKETS as METRIC_BUCKETS
from ..core.metrics import HOUR_MS as METRIC_HOUR_MS
from ..core.metrics import MINUTE_MS as METRIC_MINUTE_MS
from ..core.metrics import TOTAL as METRIC_TOTAL
from .rows import JOB_COLUMN_NAMES

T = TypeVar("T")
P = ParamSpec("P")


class Sql(str):
    """A statement's text with its name in this module (`CLAIM`,
    `insert_jobs`): the binding counts, times and logs statements by it
    (Binding.usage.by_name, Binding.trace). Equal to its text as any str;
    text made from it (`+`, f-strings) is a plain str again."""

    __slots__ = ("name",)
    name: str

    def __new__(cls, text: str, name: str) -> Sql:
        made = super().__new__(cls, text)
        made.name = name
        return made


def name_of(text: str) -> str:
    """The name a statement's text carries (`Sql.name`); `unnamed` for
    text not from this module."""
    return getattr(text, "name", "unnamed")


def _named(make: Callable[P, str]) -> Callable[P, Sql]:
    """A statement builder whose text carries the builder's name."""

    @functools.wraps(make)
    def named(*args: P.args, **kwargs: P.kwargs) -> Sql:
        return Sql(make(*args, **kwargs), make.__name__)

    return named


JOB_COLUMNS = ", ".join(JOB_COLUMN_NAMES)
"""A job row's columns as a SELECT lists them, in the order rows.values_to_job
reads their values (rows.JOB_COLUMN_NAMES)."""

FAILED_COLUMNS = (
    "id, queue, name, payload, error, attempts, max_attempts, priority, created_at, failed_at, "
    "grp, batch, after, runs"
)


def bytes_bounded(
    page: str, columns: str, sized: tuple[str, ...], order: str, limit: int, budget: int
) -> str:
    """A listing's page (`page`: a SELECT of `columns` in `order`, LIMIT
    ?`limit`, the page's rows and one more) cut at ?`budget` stored bytes of
    its `sized` columns (payloads, results, errors) added up in order, so a
    page of large rows never reaches the Worker whole (bounds.MAX_PAGE_BYTES).

    A row is in the page (`fits` 1) when it is the first, or when the rows up
    to it hold at most ?budget bytes, and it is within the limit. After the
    page comes at most one more row, `fits` 0 and its sized columns NULL:
    there are more (the next page starts after the last row that fits).
    The cut is a running sum over the page's rows alone (the LIMIT applies
    first), so the rows read are the page's, as without it; the text past
    the cut is summed by SQLite, never sent. One statement, as before."""
    size = " + ".join(f"ifnull(length(CAST({c} AS BLOB)), 0)" for c in sized)
    window = f"OVER (ORDER BY {order} ROWS UNBOUNDED PRECEDING)"
    fits = f"((page_row = 1 OR page_upto <= ?{budget}) AND page_row < ?{limit})"
    shown = ", ".join(
        f"CASE WHEN {fits} THEN {c} END AS {c}" if c in sized else c
        for c in (c.strip() for c in columns.split(","))
    )
    return (
        f"SELECT {shown}, {fits} AS fits FROM (SELECT *, SUM(page_bytes) {window} AS page_upto, "
        f"ROW_NUMBER() {window} AS page_row FROM (SELECT *, {size} AS page_bytes FROM ({page}))) "
        # The rows that fit and the first that does not (the row before it
        # fitted; the second row when the first alone was past the budget).
        f"WHERE page_upto - page_bytes <= ?{budget} OR page_row <= 2 ORDER BY {order}"
    )


def bounded_page(rows: Sequence[T]) -> tuple[list[T], bool]:
    """A bytes_bounded statement's rows: the page (those that fit), and
    whether more rows follow it."""
    page = [r for r in rows if r["fits"]]  # type: ignore[index]
    return page, len(rows) > len(page)


DELAYED_BAND = PRIORITY_RANGE[0] - 1
"""The key's band for a job pushed to wait: below every priority, so per queue
the delayed band follows the ready one (see migrations/0003_claim_order.sql,
which states it as a literal)."""

LOCKED_BAND = DELAYED_BAND - 1
"""The key's band for a job that may not be claimed before a time: held by a
worker (until its lease ends) or waiting out a retry. Keyed by that time
(available_at, which locked_until mirrors), so a claim reads only the due
head of the band however many jobs are in flight (see
migrations/0007_locked_band.sql, which states it as a literal)."""

WAITING_BAND = LOCKED_BAND - 1
"""The key's band for a job waiting for others (`after`): keyed by when it
may start, never read by a claim; the completion of the last job it waits
for moves it to its band (migrations/0010_workflows.sql's triggers)."""

DONE_BAND = WAITING_BAND - 1
"""The key's band of a completed job kept as history, keyed by when it
completed: the lowest band, so every read of a queue's live jobs (a range
of the key from the top) ends before it."""

LIVE = f"band > {DONE_BAND}"
"""Every job that has not completed (the term stops a range before the
done band)."""

LISTED = f"(band > {LOCKED_BAND} OR band = {WAITING_BAND})"
"""The id index's condition since migrations/0010_workflows.sql: jobs waiting
to run, and jobs waiting for others. A statement finding such a job by id
carries this very term (or UNLOCKED alone)."""

GROUP_SHIFT = 3001
"""A grouped job due when pushed waits in the grouped band of its priority,
priority + GROUP_SHIFT (2001..4001, above every plain band), keyed by its fair
tag (migrations/0009_flow_control.sql states it as a literal)."""
TOP_PRIORITY = PRIORITY_RANGE[1]
GROUPED_BANDS = (PRIORITY_RANGE[0] + GROUP_SHIFT, TOP_PRIORITY + GROUP_SHIFT)

UNLOCKED = f"band > {LOCKED_BAND}"
"""The id index's condition (migrations/0007_locked_band.sql). SQLite uses a
partial index only for a WHERE that contains its condition: a statement
finding a job by id through the index carries this very term."""


def _held(q: int, at: int, id: int, token: int) -> str:
    """The WHERE locating a held job by its key, fenced by its token: one seek
    of the primary key, since the worker knows the queue, the lease's end (the
    key's time) and the id. A worker whose lease lapsed, and whose job was
    claimed again, finds no row: the claim moved it."""
    return (
        f"queue = ?{q} AND band = {LOCKED_BAND} AND available_at = ?{at} "
        f"AND id = ?{id} AND reservation = ?{token}"
    )


def _runs_set(entry: str) -> str:
    """The SET terms a settle keeping the job adds (migrations/0013): its
    attempt history `runs` with the attempt's entry `entry` (an SQL term
    giving its JSON text, core/history.py run_entry) appended, the oldest
    dropped past MAX_RUNS; and its `progress`, the attempt's last report if
    it made one. Keyed by the attempt's number: a settle re-sent after a
    lost reply (RETRY matches again) finds its attempt last and appends
    nothing. Scalars of the row being written: no row read, none written
    more."""
    return f"runs = {_runs_append(entry)}, " + _progress_set(entry)


def _runs_append(entry: str) -> str:
    """`runs` (the column as read) with `entry` appended, keyed by attempt
    (see _runs_set); for FAIL_RECORD's copy as for the UPDATEs."""
    grown = f"json_insert(COALESCE(runs, '[]'), '$[#]', json({entry}))"
    return (
        f"CASE WHEN json_extract(runs, '$[#-1].attempt') = json_extract({entry}, '$.attempt') "
        f"THEN runs WHEN json_array_length(runs) >= {MAX_RUNS} "
        f"THEN json_remove({grown}, '$[0]') ELSE {grown} END"
    )


def _progress_set(entry: str) -> str:
    return f"progress = COALESCE(json_extract({entry}, '$.progress'), progress)"


# A job's band: its priority if it is due as it is pushed, else the delayed band.
_BAND = "CASE WHEN {at} > {created} THEN " + str(DELAYED_BAND) + " ELSE {priority} END"

# ?1 id ?2 queue ?3 name ?4 payload ?5 attempts ?6 max_attempts ?7 priority
# ?8 available_at ?9 created_at ?10 unique_key (a job pushed with a trace
# context goes through insert_jobs(traced=True), its eleventh value)
# `ON CONFLICT DO NOTHING`: a unique_key already held by a queued job makes
# this insert nothing (changes == 0) instead of failing the request.
_INSERT_INTO = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, unique_key, band) VALUES "
)


def _job_values(base: int) -> str:
    """One row of INSERT_JOB's values, its parameters numbered from base + 1."""
    n = [f"?{base + i}" for i in range(1, 11)]
    band = _BAND.format(at=n[7], created=n[8], priority=n[6])
    return "(" + ", ".join(n) + ", " + band + ")"


INSERT_JOB = _INSERT_INTO + _job_values(0) + " ON CONFLICT DO NOTHING"

# Sent in the same batch as INSERT_JOB: the id now holding the key — ours if
# the insert won, the earlier job's if it was a duplicate. One round trip.
# The unique index leaves out a debounced job once claimed (debounce = 1 in
# the locked band): a push with its key after it started queues a new job.
# Every lookup by key carries the index's condition, so it uses the index.
KEYED = f"{LIVE} AND (debounce = 0 OR {UNLOCKED})"
SELECT_UNIQUE_HOLDER = f"SELECT id FROM d1queue_jobs WHERE unique_key = ?1 AND {KEYED}"


# Candidates: the head of the ready band, in claim order (highest priority,
# oldest, id), and the due heads of the delayed band (pushed to wait, soonest
# first) and of the locked band (lapsed leases and retries whose wait is
# over, soonest first), each a range of the primary key cut off by its LIMIT.
# Jobs waiting for a later time and jobs in flight are outside all three
# ranges and never read, however many. The driver merges the heads by
# priority. ?1 queue ?2 now ?3 limit
def _head(where: str) -> str:
    return (
        f"SELECT * FROM (SELECT {JOB_COLUMNS} FROM d1queue_jobs WHERE queue = ?1 AND {where} "
        "ORDER BY band DESC, available_at, id LIMIT ?3)"
    )


_HEADS = (
    f"band > {DELAYED_BAND}",
    f"band = {DELAYED_BAND} AND available_at <= ?2",
    f"band = {LOCKED_BAND} AND available_at <= ?2",
)
SELECT_CANDIDATES = " UNION ALL ".join(_head(where) for where in _HEADS)

# Due jobs on a queue, counted up to a cap (a wake consumer's fan-out):
# SELECT_CANDIDATES's three ranges, each cut off by the cap, so it reads at
# most about 3 x cap rows however deep the backlog. ?1 queue ?2 now ?3 cap
COUNT_DUE_CAPPED = (
    "SELECT "
    + " + ".join(
        f"(SELECT COUNT(*) FROM (SELECT 1 FROM d1queue_jobs WHERE queue = ?1 AND {where} LIMIT ?3))"
        for where in _HEADS
    )
    + " AS n"
)

# -- flow control (migrations/0009_flow_control.sql; core/flow.py) ------------

# A grouped or debounced job's push: INSERT_JOB's ten values, ?11 its group
# (NULL: none), ?12 the step between a group's tags in ms (1; the even
# spacing of a group rate declared in code, unless the queue's stored limits
# give one), ?13 whether it is debounced, ?14 its workflow batch (NULL:
# none) and ?15 its traceparent (NULL: none). Due when pushed, a grouped job
# goes to its priority's grouped band keyed by its fair tag: the later of
# the band's head (the tag claims have reached; now, with the band empty)
# and its group's last tag plus the step. A group's burst gets tags a step
# apart; another group's job pushed behind it gets the head's tag, so it is
# among the next claimed. A job pushed to wait goes to the delayed band like
# any. Reads: the band's head, the group's flow row and the queue's row (one
# each).
_HEAD_TAG = (
    "(SELECT available_at FROM d1queue_jobs WHERE queue = ?2 AND band = ?7 + "
    f"{GROUP_SHIFT} ORDER BY available_at LIMIT 1)"
)
_LAST_TAG = "(SELECT tag FROM d1queue_flow WHERE queue = ?2 AND grp = ?11)"
_RATE = "json_extract(limits, '$.group_rate.{}')"
_STORED_STEP = (
    f"(SELECT ({_RATE.format('period_s')} * 1000 + {_RATE.format('limit')} - 1) "
    f"/ {_RATE.format('limit')} FROM d1queue_queues WHERE name = ?2)"
)
INSERT_FLOW_JOB = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, unique_key, band, grp, debounce, batch, traceparent) VALUES (?1, "
    "?2, ?3, ?4, "
    "?5, ?6, ?7, CASE WHEN ?8 > ?9 OR ?11 IS NULL THEN ?8 ELSE max(COALESCE("
    f"{_HEAD_TAG}, ?9), COALESCE({_LAST_TAG}, 0) + COALESCE({_STORED_STEP}, ?12)) END, ?9, ?10, "
    f"CASE WHEN ?8 > ?9 THEN {DELAYED_BAND} WHEN ?11 IS NULL THEN ?7 ELSE ?7 + {GROUP_SHIFT} END, "
    "?11, ?13, ?14, ?15) ON CONFLICT DO NOTHING"
)

# After INSERT_FLOW_JOB, in its batch: the group's last tag becomes the
# job's (read back through the id index), if the job went to a grouped band.
# Re-sent, it writes the same tag again or nothing. One row written.
# ?1 id
BUMP_TAG = (
    "INSERT INTO d1queue_flow (queue, grp, tag) SELECT queue, grp, available_at "
    f"FROM d1queue_jobs WHERE id = ?1 AND {UNLOCKED} AND band > {TOP_PRIORITY} "
    "ON CONFLICT (queue, grp) DO UPDATE SET tag = excluded.tag "
    "WHERE excluded.tag > d1queue_flow.tag"
)

# A queue's first grouped job marks it grouped: its drains read the grouped
# bands from then on. Writes only the first time. ?1 queue ?2 now
MARK_GROUPED = (
    "INSERT INTO d1queue_queues (name, paused, updated_at, grouped) VALUES (?1, 0, ?2, 1) "
    "ON CONFLICT (name) DO UPDATE SET grouped = 1 WHERE d1queue_queues.grouped = 0"
)

# Debounce, after the push's INSERT (with debounce = 1) in its batch: the
# queued job that holds the key, if another and not started, takes the new
# payload and starts at ?3 (now + debounce_s), in the delayed band. A job
# that started (claimed, or waiting out a retry) is left alone; a debounced
# one no longer holds the key then, so the INSERT queued a new job instead.
# Re-sent, it writes the same values. ?1 unique_key ?2 payload ?3 start
# ?4 the pushed job's id
DEBOUNCE = (
    f"UPDATE d1queue_jobs SET payload = ?2, band = {DELAYED_BAND}, available_at = ?3, "
    f"locked_until = 0, debounce = 1 WHERE unique_key = ?1 AND {KEYED} AND {UNLOCKED} "
    "AND id <> ?4 AND reserved_at IS NULL"
)


def _in_window(now: int | str, window: int) -> str:
    """The starts of the row in scope within the window ending at `now` (a
    parameter's number, or an expression)."""
    at = f"?{now}" if isinstance(now, int) else now
    return (
        "SELECT value FROM json_each(d1queue_flow.starts) "
        f"WHERE json_extract(value, '$[0]') > {at} - ?{window}"
    )


# A take's time: the one given (?3: a test's clock), or with NULL the
# database's own clock as the statement runs, in epoch ms. A claim batch D1
# re-sent after a fault runs later than the Worker read its clock; counted
# at the time it commits, its starts are as late as its handlers', less the
# reply's way back (which the rate's guard covers), however long the
# re-sends took.
_NOW = "COALESCE(?3, CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER))"


def _rate_open(now: int, rate: int, window: int) -> str:
    """Whether the d1queue_flow row in scope admits one more start: fewer
    claims in its window than ?rate (0: no rate)."""
    return f"(?{rate} = 0 OR (SELECT COUNT(*) FROM ({_in_window(now, window)})) < ?{rate})"


def _places_open(queue: str, n: int) -> str:
    """Whether queue `queue` has a place free under a concurrency of ?n (0:
    none): fewer than N slots held, counted through the slot index and cut
    off at N (at most N entries read)."""
    return (
        f"(?{n} = 0 OR (SELECT COUNT(*) FROM (SELECT 1 FROM d1queue_jobs WHERE queue = {queue} "
        f"AND slot IS NOT NULL LIMIT ?{n})) < ?{n})"
    )


# A claim's start under one d1queue_flow row's rate, taken in the claim's
# batch just before its CLAIM_LIMITED (statements in a batch run one after
# another in one transaction: nothing comes between the check and the take).
# The row is made on first use. Admitted, the claim's start is added to the
# row's (those in the window kept) and `last` names the claim; refused,
# nothing changes and the CLAIM_LIMITED that follows finds another claim in
# `last` and changes nothing. Re-sent after a lost reply, it finds its own
# start and admits it again without adding it twice.
#
# A start is the claim of one attempt: [claimed at, id, attempt as read].
# The same job claimed again for a later attempt (after a retry, or its
# lease lapsed) is a start of its own, counted again; two drains racing for
# one candidate read the same attempt, and only one claim of it can land.
#
# The first take of a claim batch on a row keeps the starts in the window;
# a later take of the same batch (its token in `last`) keeps the row's
# starts as they are: nothing outside the batch's transaction changed them
# since. Cost, as D1 counts rows read: json_each counts a row per entry, so
# the first take of a batch on a row reads its starts (at most the rate's
# limit, twice when the row is full); a later take reads none. Written: the
# row, when admitted.
# ?1 queue ?2 row ('*' or the group) ?3 now (NULL: the database's) ?4 id
# ?5 token ?6 rate limit
# ?7 rate window (ms) ?8 the job's attempts as read (before this claim)
_SAME_BATCH = "substr(d1queue_flow.last, instr(d1queue_flow.last, ' ') + 1) = ?5"
_STARTS = (
    f"CASE WHEN {_SAME_BATCH} THEN d1queue_flow.starts ELSE (SELECT json_group_array(json(value)) "
    f"FROM ({_in_window(_NOW, 7)})) END"
)
# The attempt as an integer: D1 may bind a number as REAL, and the entry's
# text must read the same when it is looked for.
_ATTEMPT = "CAST(?8 AS INTEGER)"
# The claim's own start, found in the row's text (json_array and
# json_group_array write it so: [time,"id",attempt]).
_MINE_STARTED = f"instr(d1queue_flow.starts, ',' || json_quote(?4) || ',' || {_ATTEMPT} || ']')"
_TAKE_VALUES = f"?1, ?2, json_array(json_array({_NOW}, ?4, {_ATTEMPT})), ?4 || ' ' || ?5"
_TAKE_UPDATE = (
    " ON CONFLICT (queue, grp) DO UPDATE SET "
    f"starts = CASE WHEN {_MINE_STARTED} THEN d1queue_flow.starts "
    f"ELSE json_insert({_STARTS}, '$[#]', json_array({_NOW}, ?4, {_ATTEMPT})) END, "
    "last = excluded.last "
    f"WHERE json_array_length(d1queue_flow.starts) < ?6 OR {_MINE_STARTED} "
    f"OR json_array_length({_STARTS}) < ?6"
)
_INTO_FLOW = "INSERT INTO d1queue_flow (queue, grp, starts, last) "
TAKE_FLOW = _INTO_FLOW + f"VALUES ({_TAKE_VALUES})" + _TAKE_UPDATE

# TAKE_FLOW of a claim's second rate row (the queue's, after its group's):
# taken only if the first admitted this claim (its `last` names it), else
# nothing is written, so a claim its group refuses (a busy group's next
# job) spends no start of the queue's window, which would hold back every
# other group's jobs. The other way round, a claim the queue's row refuses
# after its group's admitted it leaves a start in the group's window:
# rarer, as a queue at its limit is seldom read at all (the candidates'
# guard). TAKE_FLOW's parameters, then ?9 the first row's key. (INSERT ...
# SELECT ... WHERE: the WHERE tells SQLite's parser that ON CONFLICT begins
# the upsert.)
TAKE_FLOW_AFTER = (
    _INTO_FLOW
    + f"SELECT {_TAKE_VALUES} WHERE (SELECT last FROM d1queue_flow "
    + "WHERE queue = ?1 AND grp = ?9) = ?4 || ' ' || ?5"
    + _TAKE_UPDATE
)

# The places a queue's held jobs hold under its concurrency: the slot
# index's entries (index only, one read each: at most about N). ?1 queue
OCCUPIED_SLOTS = "SELECT slot FROM d1queue_jobs WHERE queue = ?1 AND slot IS NOT NULL"


def _admitted(grp: int) -> str:
    return (
        f" AND (SELECT last FROM d1queue_flow WHERE queue = ?6 AND grp = ?{grp}) = ?4 || ' ' || ?3"
    )


def _free_gslot(queue: int, n: int, group: int) -> str:
    """The group's free place under a group_concurrency of ?n: the least of
    0..N-1 no held job of the group holds (through the gslot index: at most
    N entries read; none when the group holds none). ?group: '' for none."""
    return (
        f"(WITH RECURSIVE n(v) AS (SELECT 0 UNION ALL SELECT v + 1 FROM n WHERE v + 1 < ?{n}) "
        "SELECT MIN(v) FROM n WHERE v NOT IN (SELECT gslot FROM d1queue_jobs "
        f"WHERE queue = ?{queue} AND COALESCE(grp, '') = ?{group} AND gslot IS NOT NULL))"
    )


_FREE_GSLOT = _free_gslot(6, 10, 11)

# TAKE_FLOW of a claim whose group has a concurrency limit: taken only if
# the group has a place free now, so a busy group's next job spends no
# start of any rate. TAKE_FLOW's parameters, then ?9 group_concurrency
# ?10 the group ('' for none).
TAKE_FLOW_GATED = (
    _INTO_FLOW + f"SELECT {_TAKE_VALUES} WHERE {_free_gslot(1, 9, 10)} IS NOT NULL" + _TAKE_UPDATE
)


@_named
def claim_limited(*, lapsed: bool, rate_rows: int) -> str:
    """CLAIM (or CLAIM_LAPSED) of a job under its queue's flow limits.

    The places are the unique indexes d1queue_jobs_slot (per queue) and
    d1queue_jobs_gslot (per group): the claim sets the job's `slot` to ?9
    (a place the round read free; NULL: no concurrency limit) and its
    `gslot` to the group's least free place (?10 the group_concurrency, 0:
    none), and is an UPDATE OR IGNORE: a place another claim took since
    (the index refuses the row) or no free place in the group make it change
    nothing, whatever the interleaving. A job reclaimed after its lease
    lapsed keeps the places it held. With rates, it lands only if every
    TAKE_FLOW just before it admitted this very claim (?12, ?13 the rows'
    keys). CLAIM's parameters, then ?9 slot ?10 group_concurrency ?11 the
    job's group ('' for none)."""
    # With a group_concurrency of 1 the group's one place is 0: the index
    # alone says whether it is free, and nothing is read to choose it.
    free = f"CASE WHEN ?10 = 1 THEN 0 ELSE {_FREE_GSLOT} END"
    places = (
        ", slot = COALESCE(slot, ?9), "
        f"gslot = CASE WHEN ?10 = 0 THEN NULL ELSE COALESCE(gslot, {free}) END"
    )
    text = (
        "UPDATE OR IGNORE"
        + _CLAIM_SET.removeprefix("UPDATE")
        + places
        + (f", last_error = {_NOTED}" if lapsed else "")
        + _CLAIM_WHERE
        + ("NOT NULL" if lapsed else "NULL")
        + f" AND (?10 <= 1 OR gslot IS NOT NULL OR {_FREE_GSLOT} IS NOT NULL)"
    )
    return text + "".join(_admitted(12 + i) for i in range(rate_rows))


@_named
def select_flow_candidates(*, grouped: bool, guarded: bool, spaced: bool = False) -> str:
    """SELECT_CANDIDATES for a queue with flow control. `grouped`: a fourth
    range, the head of the grouped bands (by priority, then fair tag).
    `guarded`: the ranges are read only while the queue has a place free
    (its held slots counted, cut off at the limit) and room in its rate's
    window, a check SQLite runs once before reading any job, so a round
    that finds the queue at its limit reads no job; the locked band's due
    head is read all the same (a lapsed lease's job takes its place back).
    SELECT_CANDIDATES's parameters, then ?4
    concurrency ?5 rate limit ?6 rate window (ms), the queue's (0: none).
    `spaced`: the grouped bands are read only up to now: a group rate
    spaces its group's tags over time, so a group's jobs not yet allowed
    lie past now and are not read again and again."""
    # With groups, the ready band's head is read apart from the grouped
    # bands' (which sort above it in the key), so the two take turns. A
    # queue without groups reads them as one range: SELECT_CANDIDATES's,
    # which sees a grouped job too (one pushed since the drain's survey).
    grouped_head = f"band > {TOP_PRIORITY}" + (" AND available_at <= ?2" if spaced else "")
    heads = (
        (f"{_HEADS[0]} AND band <= {TOP_PRIORITY}", *_HEADS[1:], grouped_head)
        if grouped
        else _HEADS
    )
    text = " UNION ALL ".join(_head(where) for where in heads)
    if not guarded:
        return text
    # The guard is the queue's name itself: the key's first column is
    # sought for the value of `g`, evaluated once, which holds no row when
    # the queue is at its limit, and no key equals NULL. (A guard as a term
    # of its own would be tested row by row, reading the whole range when
    # every row fails it.) A last row of NULLs (no id) says the guard held
    # the round back: the drain counts the queue as limited. The locked
    # band's due head is read all the same: a lapsed lease's job holds its
    # place, and takes it back when it is claimed again.
    guard = (
        f"WITH g(q) AS MATERIALIZED (SELECT ?1 WHERE {_places_open('?1', 4)} AND COALESCE("
        f"(SELECT {_rate_open(2, 5, 6)} FROM d1queue_flow WHERE queue = ?1 AND grp = '*'), 1)) "
    )
    locked = _head(_HEADS[2])
    guarded_text = " UNION ALL ".join(
        part
        if part == locked
        else part.replace("WHERE queue = ?1 AND", "WHERE queue = (SELECT q FROM g) AND")
        for part in text.split(" UNION ALL ")
    )
    nulls = ", ".join(["NULL"] * len(JOB_COLUMN_NAMES))
    return guard + guarded_text + f" UNION ALL SELECT {nulls} WHERE NOT EXISTS (SELECT 1 FROM g)"


# What a drain reads of d1queue_queues (with its survey, in one round trip):
# the paused queues, the limits set over the API, and which queues have had
# grouped jobs. The same rows PAUSED_QUEUES reads (the table is small: a row
# per queue ever paused, fanned out to, limited or grouped).
QUEUE_FLOWS = (
    "SELECT name, paused, limits, grouped FROM d1queue_queues "
    "WHERE paused = 1 OR limits IS NOT NULL OR grouped = 1"
)

# Setting a queue's limits (PUT /v1/queues/{queue}/limits): a queue with no
# row yet gets one. ?1 queue ?2 now ?3 limits (JSON)
SET_LIMITS = (
    "INSERT INTO d1queue_queues (name, paused, updated_at, limits) VALUES (?1, 0, ?2, ?3) "
    "ON CONFLICT (name) DO UPDATE SET limits = ?3, updated_at = ?2"
)
# ?1 queue
SELECT_LIMITS = "SELECT limits, grouped FROM d1queue_queues WHERE name = ?1"

# A queue's jobs held now, in all and by group (the busiest ?3 groups): the
# queue's locked band, past the lapsed leases (jobs in flight, and retries
# waiting there, which are read and not counted). An operator's read.
# ?1 queue ?2 now ?3 groups
_HELD_NOW = (
    f"FROM d1queue_jobs WHERE queue = ?1 AND band = {LOCKED_BAND} AND available_at > ?2 "
    "AND reserved_at IS NOT NULL"
)
RUNNING = f"SELECT COUNT(*) AS n {_HELD_NOW}"
RUNNING_BY_GROUP = (
    f"SELECT COALESCE(grp, '') AS grp, COUNT(*) AS n {_HELD_NOW} GROUP BY grp "
    "ORDER BY n DESC, grp LIMIT ?3"
)

# -- the cron's prune of d1queue_flow (core/config.py PRUNE_FLOW) -------------
#
# A row per (queue, group) a push or a claim ever used: a table that grows
# with every group named, from user data too, unless rows that hold nothing
# go. A row holds nothing when
# - its rate window has passed: no start within the longest window that may
#   apply to it (the rate stored over the API, the one declared in code,
#   whichever is longer; a day and RATE_GUARD_MS when neither is known, for
#   a rate another Worker's code may declare), so no claim would count one;
# - its fair tag no longer orders a job: the tag plus the group's step is
#   no later than now and than the head of every grouped band of its queue.
#   A push reads the tag as max(head, tag + step) (INSERT_FLOW_JOB), so the
#   row's absence (tag 0) then gives the same tag; a group with a job in a
#   grouped band has its tag at or past that job, and the band's head at or
#   before it, so its row stays.
# Nothing else lives there: a group's running count is its held jobs' gslot
# entries, on their own rows, and `last` speaks only to the statements of
# the claim batch that wrote it (one transaction). Each condition is read
# by the DELETE itself, so a push (BUMP_TAG) or a claim (TAKE_FLOW) into the
# group, each one transaction, lands wholly before it (the row is then in
# use and stays) or after it (and makes the row anew, as for a group never
# seen).
#
# The rows looked at are the next ?2 after where the last run stopped, in
# key order (a cursor in d1queue_meta), round and round: a run's cost is
# bounded however many groups are in use, and every row is looked at in
# turn. In the cron's read batch: FLOW_CURSOR_ROW makes the cursor with the
# table's first row, FLOW_CURSOR moves the window on, PRUNE_FLOW deletes in
# it. Re-sent after a lost reply, the batch moves the window on again and
# looks at the next rows: windows follow each other, so none is passed
# over.

FLOW_CURSOR_KEY = "flow_prune"
_NO_WINDOW = '["","",null]'
"""The window before any: from the table's start, to its end."""
_PAST_KEYS = "'~'"
"""A queue name after every name (NAME_RULE's characters sort below `~`):
the end of a window that runs to the table's last row."""
# The cursor's row, made the first time the table has a row (so an empty
# table costs no write): where the next window starts. ?1 now. Reads a row
# of each table.
FLOW_CURSOR_ROW = (
    f"INSERT INTO d1queue_meta (key, value, updated_at) SELECT '{FLOW_CURSOR_KEY}', "
    f"'{_NO_WINDOW}', ?1 WHERE EXISTS (SELECT 1 FROM d1queue_flow) ON CONFLICT (key) DO NOTHING"
)
# The window moves on: its value is [start queue, start group, [end queue,
# end group]], the end the ?2-th key after the last window's end (null: the
# table has fewer, and the window runs to its last row), the start the last
# window's end (its start when that was null: round again). It stays, and
# nothing is written, only when the table fits one window from its start
# and the window says so already. ?1 now ?2 rows a run. Reads the row and
# ?2 keys of d1queue_flow (the table's first ?2 when it stays; both, once a
# turn of the table, when it moves from its start).
_NEXT_Q = "COALESCE(json_extract(d1queue_meta.value, '$[2][0]'), '')"
_NEXT_G = "COALESCE(json_extract(d1queue_meta.value, '$[2][1]'), '')"
FLOW_CURSOR = (
    f"UPDATE d1queue_meta SET value = json_array({_NEXT_Q}, {_NEXT_G}, json((SELECT "
    f"json_array(queue, grp) FROM d1queue_flow WHERE (queue, grp) > ({_NEXT_Q}, {_NEXT_G}) "
    "ORDER BY queue, grp LIMIT 1 OFFSET ?2 - 1))), updated_at = ?1 "
    f"WHERE key = '{FLOW_CURSOR_KEY}' AND NOT (value = '{_NO_WINDOW}' AND (SELECT 1 "
    "FROM d1queue_flow ORDER BY queue, grp LIMIT 1 OFFSET ?2 - 1) IS NULL)"
)


def _window(ends: str) -> str:
    """The key at one end of the window FLOW_CURSOR wrote (a seek; NULLs,
    which no key passes, with no window written: the table is empty)."""
    return f"(SELECT {ends} FROM d1queue_meta WHERE key = '{FLOW_CURSOR_KEY}')"


def _declared(index: str) -> str:
    """Item `index` of the row's queue in ?2 (core/flow.py declared_windows)."""
    return f"json_extract(?2, '$.\"' || w.queue || '\"[' || {index} || ']')"


def _stored(value: str) -> str:
    """`value` (of `limits`) read from the row's queue's stored limits: a
    seek; NULL without any (or with ones that do not parse)."""
    return (
        f"(SELECT {value} FROM d1queue_queues WHERE name = w.queue AND limits IS NOT NULL "
        "AND json_valid(limits))"
    )


_STORED_SPAN = _stored(
    "json_extract(limits, CASE WHEN w.grp = '*' THEN '$.rate.period_s' "
    f"ELSE '$.group_rate.period_s' END) * 1000 + {RATE_GUARD_MS}"
)
_ROW_RATE = "CASE WHEN w.grp = '*' THEN 0 ELSE 1 END"
_SINCE = (
    f"?1 - COALESCE(NULLIF(max(COALESCE({_STORED_SPAN}, 0), "
    f"COALESCE({_declared(_ROW_RATE)}, 0)), 0), {LONGEST_WINDOW_MS})"
)
# A group's step, as INSERT_FLOW_JOB reads it (_STORED_STEP, else the code's).
_STEP = (
    "COALESCE("
    + _stored(
        "(json_extract(limits, '$.group_rate.period_s') * 1000 "
        "+ json_extract(limits, '$.group_rate.limit') - 1) "
        "/ json_extract(limits, '$.group_rate.limit')"
    )
    + f", {_declared('2')}, 1)"
)
# The earliest fair tag of any grouped band of the row's queue: the head of
# each band present, found band by band (two seeks a band, whatever the
# bands hold), the least of them (NULL: no grouped job).
_GROUPED_HEAD = (
    "(WITH RECURSIVE b(band) AS (SELECT (SELECT band FROM d1queue_jobs WHERE queue = w.queue "
    f"AND band > {TOP_PRIORITY} ORDER BY band LIMIT 1) UNION ALL SELECT (SELECT band "
    "FROM d1queue_jobs WHERE queue = w.queue AND band > b.band ORDER BY band LIMIT 1) FROM b "
    "WHERE b.band IS NOT NULL) SELECT MIN((SELECT available_at FROM d1queue_jobs "
    "WHERE queue = w.queue AND band = b.band ORDER BY available_at LIMIT 1)) FROM b "
    "WHERE b.band IS NOT NULL)"
)
# Whether row w holds nothing, each step asked only of a row that passed the
# one before (CASE: SQLite evaluates its branches lazily), so a row in use
# costs the read of its own row: its tag's time; its last start (the starts
# are in time order), then all of them (at most its rate's limit); then the
# grouped bands' heads of its queue, only for a tag that has passed.
_HOLDS_NOTHING = (
    "CASE WHEN w.tag + 1 > ?1 THEN 0 "
    "WHEN json_array_length(w.starts) > 0 AND (json_extract(w.starts, '$[#-1][0]') > "
    f"{_SINCE} OR EXISTS (SELECT 1 FROM json_each(w.starts) "
    f"WHERE json_extract(value, '$[0]') > {_SINCE})) THEN 0 "
    f"WHEN w.tag = 0 THEN 1 ELSE w.tag + {_STEP} <= min(?1, COALESCE({_GROUPED_HEAD}, ?1)) END"
)
# After FLOW_CURSOR in its batch: the window's rows that hold nothing go.
# The window holds at most the rows a run looks at: its end is the last of
# them, found in this transaction. ?1 now ?2 the limits declared in code (a
# JSON object). Reads the window's ends (two seeks), its
# rows, what _HOLDS_NOTHING reads of each, and the rows deleted; nothing
# with the table empty. Writes the rows deleted.
PRUNE_FLOW = (
    "DELETE FROM d1queue_flow AS w WHERE (w.queue, w.grp) > "
    + _window("json_extract(value, '$[0]'), json_extract(value, '$[1]')")
    + " AND (w.queue, w.grp) <= "
    + _window(
        f"COALESCE(json_extract(value, '$[2][0]'), {_PAST_KEYS}), "
        "COALESCE(json_extract(value, '$[2][1]'), '')"
    )
    + f" AND {_HOLDS_NOTHING}"
)


RECLAIM_NOTE = "lease expired before the job was settled (worker died or overran)"
_NOTE = "'" + RECLAIM_NOTE.replace("'", "''") + "'"
# The note a reclaimed job's last_error gets, before the error it had (cut at
# 4,000 characters), so the failure record of a job that also crashed still
# names its real cause; written once however often the lease lapses.
_NOTED = (
    f"CASE WHEN last_error IS NULL THEN {_NOTE} "
    f"WHEN substr(last_error, 1, {len(RECLAIM_NOTE)}) = {_NOTE} THEN last_error "
    f"ELSE substr({_NOTE} || '; before that: ' || last_error, 1, {MAX_ERROR_CHARS}) END"
)

# The claim: the job moves from where it was read to the locked band, keyed
# by its lease's end. Moving the row is one row written, as an update in
# place would be, and its id-index entry is dropped (free): the index holds
# only unlocked jobs. The row is found by the key it was read at, with the
# attempts read (attempts only ever grows, once per claim; an undone claim
# puts the job back where it was): of several racing workers exactly one
# finds it there, and the rest change nothing. A re-send after a lost reply
# finds nothing (the row moved); the driver then looks for its token at the
# new key (CLAIM_LANDED). Short, since a claim batch carries its text once
# per job. ?1 now ?2 lease end ?3 reservation ?4 id ?5 attempts as read
# ?6 queue ?7 band as read ?8 available_at as read
_CLAIM_SET = (
    f"UPDATE d1queue_jobs SET band = {LOCKED_BAND}, available_at = ?2, locked_until = ?2, "
    "attempts = ?5 + 1, reserved_at = ?1, reservation = ?3"
)
_CLAIM_WHERE = (
    " WHERE queue = ?6 AND band = ?7 AND available_at = ?8 AND id = ?4 AND attempts = ?5 "
    "AND reserved_at IS "
)
CLAIM = _CLAIM_SET + _CLAIM_WHERE + "NULL"

# The claim of a job read still marked held (reserved_at): a lease that
# lapsed. It reclaims the job and notes why in last_error. Same parameters.
CLAIM_LAPSED = _CLAIM_SET + f", last_error = {_NOTED}" + _CLAIM_WHERE + "NOT NULL"

# Whether a claim whose reply was lost landed: its token at the key it set.
# ?1 queue ?2 lease end ?3 id ?4 reservation
CLAIM_LANDED = "SELECT id FROM d1queue_jobs WHERE " + _held(1, 2, 3, 4)

# Undoing a claim whose reply never came (the batch failed after it may have
# committed): the job goes back where it was read, free, its attempt not
# spent. ?1 attempts as read ?2 id ?3 reservation ?4 queue ?5 lease end
# ?6 band as read ?7 available_at as read
UNCLAIM = (
    "UPDATE d1queue_jobs SET attempts = ?1, band = ?6, available_at = ?7, "
    f"locked_until = CASE WHEN ?6 = {LOCKED_BAND} THEN ?7 ELSE 0 END, reserved_at = NULL, "
    "reservation = NULL WHERE " + _held(4, 5, 2, 3)
)

# UNCLAIM of a job holding flow places: they are freed with it.
UNCLAIM_FREEING = UNCLAIM.replace(
    "reservation = NULL WHERE", "reservation = NULL, slot = NULL, gslot = NULL WHERE"
)

# Every step after the claim finds the job at its held key and is fenced by
# the reservation token. ?1 id ?2 reservation ?3 queue ?4 lease end
DELETE_HELD = "DELETE FROM d1queue_jobs WHERE " + _held(3, 4, 1, 2)

# Acknowledging every completed job of one claim batch at once: a claim
# batch gives its jobs on a queue one key prefix (queue, locked band, lease
# end) and one token, so the jobs still held under it are one range of the
# key. Sent only when the settle carries every job the batch won on the
# queue, after the batch's retries (which clear reserved_at) and failures
# (deleted on their own): what is left held under the token is exactly the
# completed jobs. One statement instead of one a job (a batch costs the
# Worker CPU per statement), reading one row a job and one past the range;
# meta.changes says how many landed. ?1 queue ?2 lease end ?3 reservation
DELETE_HELD_BATCH = (
    f"DELETE FROM d1queue_jobs WHERE queue = ?1 AND band = {LOCKED_BAND} AND available_at = ?2 "
    "AND reservation = ?3 AND reserved_at IS NOT NULL"
)

# A retry: the job stays in the locked band, keyed by its retry time, so a
# claim reads it only once that time has come, however long the wait. One
# row written, no index entry. The token stays on the row (reserved_at alone
# says whether a job is held), and the key may be either the lease's end or
# the retry time: a release re-sent after its reply was lost matches again
# and reports the job as released by us; the next claim replaces the token.
# A job a cancel marked while it ran (cancel_at) stays keyed at its lease's
# end instead of its retry time: due then (not after its backoff), the next
# claim ends it cancelled without running it (outcomes.decided), and a
# re-send still matches it there. Read from the row the statement writes
# anyway: no row read more (a third key to probe would be one a retry).
# The attempt joins the job's history (_runs_set): a re-send matching again
# appends nothing more.
# ?1 retry time ?2 last_error (NULL keeps the previous one) ?3 id ?4 reservation
# ?5 queue ?6 lease end ?7 the attempt's entry (JSON, core/history.py)
_RETRY_AT = "CASE WHEN cancel_at IS NULL THEN ?1 ELSE ?6 END"
RETRY = (
    f"UPDATE d1queue_jobs SET available_at = {_RETRY_AT}, locked_until = {_RETRY_AT}, "
    f"reserved_at = NULL, last_error = COALESCE(?2, last_error), {_runs_set('?7')} "
    f"WHERE queue = ?5 AND band = {LOCKED_BAND} AND available_at IN (?6, ?1) AND id = ?3 "
    "AND reservation = ?4"
)

# RETRY of a job holding flow places: they are freed for the wait (a job
# waiting out a retry runs nothing). Same parameters.
RETRY_FREEING = RETRY.replace(
    "reserved_at = NULL,", "reserved_at = NULL, slot = NULL, gslot = NULL,"
)

# Failing is FAIL_RECORD then DELETE_HELD in one db.batch (a transaction):
# the copy is read from the fenced row itself, so a stale holder records
# nothing, and a fault in either statement leaves the job where it was.
# OR REPLACE: a job id that failed before (and was pushed again under the same
# id) keeps one failure record, the latest. The record keeps the job's
# attempt history with this attempt appended (_runs_append).
# ?1 error ?2 failed_at ?3 id ?4 reservation ?5 queue ?6 lease end
# ?7 the attempt's entry (JSON, core/history.py)
FAIL_RECORD = (
    f"INSERT OR REPLACE INTO d1queue_failed_jobs ({FAILED_COLUMNS}, traceparent) "
    "SELECT id, queue, name, payload, ?1, attempts, max_attempts, priority, created_at, ?2, grp, "
    f"batch, after, {_runs_append('?7')}, traceparent "
    "FROM d1queue_jobs WHERE " + _held(5, 6, 3, 4)
)

# Unreserved jobs on a queue (delayed ones included): D1Queue.size.
# ?1 queue
COUNT_UNRESERVED = (
    f"SELECT COUNT(*) AS n FROM d1queue_jobs WHERE queue = ?1 AND {LIVE} AND reserved_at IS NULL"
)

CLEAR_QUEUE = f"DELETE FROM d1queue_jobs WHERE queue = ?1 AND {LIVE}"


def _walk_queues(table: str) -> str:
    """A recursive CTE `q(name)`: the distinct queues of `table`, each found
    by one seek past the last (a skip scan of the key's first column), so it
    reads about one row per queue, not one per job."""
    return (
        f"WITH RECURSIVE q(name) AS (SELECT MIN(queue) FROM {table} UNION ALL "
        f"SELECT (SELECT MIN(queue) FROM {table} WHERE queue > q.name) FROM q "
        "WHERE q.name IS NOT NULL) "
    )


# The queues holding jobs, in name order. Rows read: about two per queue.
QUEUE_NAMES = _walk_queues("d1queue_jobs") + "SELECT name FROM q WHERE name IS NOT NULL"

# Freeing every lapsed lease at once (D1Queue.reclaim_expired). The drain
# never sends it: a claim reclaims a lapsed lease when it meets one. Reads
# the lapsed part of each queue's locked band; for maintenance only.
# ?1 now
RECLAIM_EXPIRED = (
    "UPDATE d1queue_jobs SET reserved_at = NULL, reservation = NULL, slot = NULL, gslot = NULL, "
    f"last_error = {_NOTED} WHERE queue IN ({QUEUE_NAMES}) AND band = {LOCKED_BAND} "
    "AND available_at < ?1 AND reserved_at IS NOT NULL"
)


def _by_id(select: str, id_term: str) -> str:
    """`select` (a statement up to its FROM d1queue_jobs) for the jobs whose
    id meets `id_term`: a job waiting to run through the id index, a locked
    one (in flight, or waiting out a retry) by a walk of every queue's locked
    band, which the index leaves out. That walk reads every locked job, so
    these are the lookups of the API and of rare paths, never of the drain:
    a worker settles what it holds by its key."""
    return (
        f"{select} WHERE {id_term} AND {LISTED} UNION ALL "
        f"{select} WHERE queue IN ({QUEUE_NAMES}) AND band = {LOCKED_BAND} AND {id_term}"
    )


# A job by id. LIMIT 1: a job found through the index ends the statement
# before the walk starts. ?1 id
SELECT_JOB = _by_id(f"SELECT {JOB_COLUMNS} FROM d1queue_jobs", "id = ?1") + " LIMIT 1"

# Retrying a failure is RETRY_FAILED_INSERT then RETRY_FAILED_DELETE in one
# batch. The job keeps what it went through: `attempts` stays the count of
# claims so far and `last_error` is the failure's error, and it gets as many
# fresh attempts as its registration gives (max_attempts = attempts + the
# registered max_attempts; ?4 for a name ?3 does not hold). ?3 is a JSON
# object {name: max_attempts} of the registry, read by json_extract: a scalar,
# so a job's allowance costs no row read and the retry needs no read of its
# name first. It does not take its uniqueness lock again: the lock was
# released when it failed, and re-taking it could make the retry lose to a
# fresh dispatch made in between. Its attempt history comes back with it.
# Cost: 1 row read (the failure by its key),
# 2 rows written (the job's row and its id-index entry); the DELETE 1 read and
# 1 written. Re-sent after a lost reply, the copy finds the failure gone and
# inserts nothing: the job is queued once, with the attempts the first send
# gave it. ?1 now ?2 id ?3 allowances (JSON) ?4 the default allowance
RETRY_FAILED_INSERT = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, unique_key, last_error, band, grp, traceparent, runs) "
    "SELECT id, queue, name, payload, attempts, "
    "attempts + COALESCE(json_extract(?3, '$.\"' || name || '\"'), ?4), "
    "priority, ?1, ?1, NULL, error, priority, grp, traceparent, runs "
    "FROM d1queue_failed_jobs WHERE id = ?2"
)
RETRY_FAILED_DELETE = "DELETE FROM d1queue_failed_jobs WHERE id = ?1"

# -- the API's statements ----------------------------------------------------

JOB_PARAMS = 10
INSERT_ROWS_PER_STATEMENT = 100 // JOB_PARAMS
"""D1 binds at most 100 parameters per statement: ten 10-value rows."""


BATCH_ROWS_PER_STATEMENT = 100 // (JOB_PARAMS + 1)
"""Rows of jobs that join a batch (an eleventh value each): nine."""


def rows_per_insert(*, batch: bool, traced: bool) -> int:
    """Rows of `insert_jobs` per statement, within D1's 100 bound parameters:
    ten values a row, one more for a batch's jobs and one more for jobs
    carrying a trace context (so untraced rows pack as before: ten, nine)."""
    return 100 // (JOB_PARAMS + batch + traced)


@_named
def insert_jobs(n: int, *, unique: bool, batch: bool = False, traced: bool = False) -> str:
    """A multi-row INSERT_JOB for `n` (<= rows_per_insert) jobs.
    `unique`: the rows carry unique keys and a held key skips its row;
    otherwise any conflict (a reused id) fails the statement and its batch,
    so a batch is stored whole or not at all. `batch`: each row has one more
    value, the workflow batch it joins; `traced`: one more after it, the
    push's W3C traceparent."""
    most = rows_per_insert(batch=batch, traced=traced)
    if not 1 <= n <= most:
        raise ValueError(f"1..{most} rows per statement, not {n}")
    if not batch and not traced:
        rows = ", ".join(_job_values(JOB_PARAMS * k) for k in range(n))
        return _INSERT_INTO + rows + (" ON CONFLICT DO NOTHING" if unique else "")
    extras = [c for c, on in (("batch", batch), ("traceparent", traced)) if on]
    width = JOB_PARAMS + len(extras)
    rows = ", ".join(
        _job_values(width * k)[:-1]
        + "".join(f", ?{width * k + JOB_PARAMS + i + 1}" for i in range(len(extras)))
        + ")"
        for k in range(n)
    )
    into = _INSERT_INTO.replace("band) VALUES", f"band, {', '.join(extras)}) VALUES")
    return into + rows + (" ON CONFLICT DO NOTHING" if unique else "")


@_named
def select_job_ids(n: int) -> str:
    """Which of `n` job ids are still queued (n <= 100, D1's parameter limit):
    after a re-sent settle, a row gone is a write of ours that landed."""
    if not 1 <= n <= 100:
        raise ValueError(f"1..100 ids per statement, not {n}")
    ids = ", ".join(f"?{i}" for i in range(1, n + 1))
    return _by_id("SELECT id FROM d1queue_jobs", f"id IN ({ids})")


@_named
def select_unique_holders(n: int) -> str:
    """The ids holding `n` unique keys (n <= 100, D1's parameter limit)."""
    if not 1 <= n <= 100:
        raise ValueError(f"1..100 keys per statement, not {n}")
    return (
        "SELECT id, unique_key FROM d1queue_jobs WHERE unique_key IN ("
        + ", ".join(["?"] * n)
        + f") AND {KEYED}"
    )


# Counts per queue by state: a job is reserved while its lease runs, ready
# when claimable now, delayed otherwise (pushed to wait, or waiting out a
# retry). The queues are walked by seeks and each is read by its key range:
# every job is read once, as counting needs, and no table is scanned.
# ?1 now
_RESERVED = "(j.reserved_at IS NOT NULL AND j.locked_until > ?1)"
# A grouped job waiting its turn is ready whatever its fair tag says.
_READY = (
    f"(j.band <> {WAITING_BAND} AND j.locked_until <= ?1 "
    "AND (j.available_at <= ?1 OR j.band > 1000))"
)
_WAITING = f"(j.band = {WAITING_BAND})"
_JOB_STATS = (
    f"SELECT j.queue AS queue, SUM({_RESERVED}) AS reserved, SUM({_READY}) AS ready, "
    f"SUM(NOT {_RESERVED} AND NOT {_READY} AND NOT {_WAITING}) AS delayed, "
    f"SUM({_WAITING}) AS waiting, "
    f"MIN(CASE WHEN {_READY} THEN max(j.available_at, j.locked_until) END) AS oldest_ready_at "
)
JOB_STATS = (
    _walk_queues("d1queue_jobs")
    + _JOB_STATS
    + f"FROM q JOIN d1queue_jobs j ON j.queue = q.name AND j.{LIVE} GROUP BY j.queue"
)
# ?1 now ?2 queue
JOB_STATS_ONE = _JOB_STATS + f"FROM d1queue_jobs j WHERE j.queue = ?2 AND j.{LIVE} GROUP BY j.queue"
FAILED_COUNTS = (
    _walk_queues("d1queue_failed_jobs")
    + "SELECT q.name AS queue, (SELECT COUNT(*) FROM d1queue_failed_jobs f "
    "WHERE f.queue = q.name) AS failed FROM q WHERE q.name IS NOT NULL"
)
FAILED_COUNT_ONE = "SELECT queue, COUNT(*) AS failed FROM d1queue_failed_jobs WHERE queue = ?1"
QUEUE_STATES = "SELECT name, paused, limits FROM d1queue_queues"
PAUSED_QUEUES = "SELECT name FROM d1queue_queues WHERE paused = 1"

# ?1 name ?2 paused (0/1) ?3 now
SET_PAUSED = (
    "INSERT INTO d1queue_queues (name, paused, updated_at) VALUES (?1, ?2, ?3) "
    "ON CONFLICT (name) DO UPDATE SET paused = ?2, updated_at = ?3"
)

# A wake consumer's fan-out lease (wake.py): taken, by one writer, only if no
# fan-out on the queue took it since ?3; a queue with no row gets one
# (running). A lost reply's re-send finds it taken, and that consumer only
# relays: latency, never a job. ?1 name ?2 now ?3 cutoff (now - window)
TAKE_FAN_OUT = (
    "INSERT INTO d1queue_queues (name, paused, updated_at, fanned_out_at) VALUES (?1, 0, ?2, ?2) "
    "ON CONFLICT (name) DO UPDATE SET fanned_out_at = ?2 "
    "WHERE d1queue_queues.fanned_out_at <= ?3"
)

# Cancelling: only a job no worker holds, waiting to run (through the id
# index) or waiting out a retry (in the locked band). Sent with SELECT_JOB in
# one batch, so a miss can say whether the job is running (409) or gone
# (404). ?1 id
CANCEL_JOBS = (
    f"DELETE FROM d1queue_jobs WHERE id = ?1 AND {LISTED} AND reserved_at IS NULL",
    f"DELETE FROM d1queue_jobs WHERE queue IN ({QUEUE_NAMES}) AND band = {LOCKED_BAND} "
    "AND id = ?1 AND reserved_at IS NULL",
)

# Cancelling a running job: a job a worker holds (or held: its lease lapsed
# and no claim took it over yet) is not deleted under it but marked, once:
# a re-send finds the mark set and changes nothing, and SELECT_JOB in the
# same batch says the job is marked. The drain holding it ends it
# (WATCH_CANCEL, RETRY, outcomes.decided). The walk of the locked bands, as
# CANCEL_JOBS's second; 1 row written (the column is in no index).
# ?1 id ?2 now
MARK_CANCEL = (
    f"UPDATE d1queue_jobs SET cancel_at = ?2 WHERE queue IN ({QUEUE_NAMES}) "
    f"AND band = {LOCKED_BAND} AND id = ?1 AND reserved_at IS NOT NULL AND cancel_at IS NULL"
)

# The watch of a running job whose handler declares one (cancel_watch_s):
# its mark, where its worker holds it (key and token). One seek of the key,
# 1 row read; nothing when the lease moved on. ?1 id ?2 reservation ?3 queue
# ?4 lease end
WATCH_CANCEL = "SELECT cancel_at FROM d1queue_jobs WHERE " + _held(3, 4, 1, 2)

# Newest first, paged by (failed_at, id) so a page boundary never skips or
# repeats a row; cut at ?4 bytes of payloads and errors (bytes_bounded).
# ?1 cursor failed_at ?2 cursor id ?3 limit (a page and one) ?4 bytes [?5 queue]
_FAILED_ORDER = "failed_at DESC, id DESC"
_FAILED_SIZED = ("payload", "error", "after", "runs")
_FAILED_PAGE = (
    f"SELECT {FAILED_COLUMNS} FROM d1queue_failed_jobs "
    f"WHERE (failed_at, id) < (?1, ?2) ORDER BY {_FAILED_ORDER} LIMIT ?3"
)
LIST_FAILED_PAGE = bytes_bounded(_FAILED_PAGE, FAILED_COLUMNS, _FAILED_SIZED, _FAILED_ORDER, 3, 4)
LIST_FAILED_PAGE_IN_QUEUE = bytes_bounded(
    _FAILED_PAGE.replace("WHERE ", "WHERE queue = ?5 AND "),
    FAILED_COLUMNS,
    _FAILED_SIZED,
    _FAILED_ORDER,
    3,
    4,
)
SELECT_FAILED = f"SELECT {FAILED_COLUMNS} FROM d1queue_failed_jobs WHERE id = ?1"
DELETE_FAILED = RETRY_FAILED_DELETE
# ?1 cutoff
PRUNE_FAILED = "DELETE FROM d1queue_failed_jobs WHERE failed_at < ?1"
# The cron's retention prune (D1QUEUE_KEEP_FAILED_S), bounded: the ?2 oldest
# failures from before ?1, oldest first. D1's SQLite has no DELETE ... LIMIT,
# so the bound is the subquery's, which walks the failed_at index
# (failed_at, id) and needs no sort. Cost (measured on Miniflare's D1): 4 rows
# read per row deleted (its index entry, the IN list built and read, the row
# by its key) and 3 with nothing to prune, however many failures are young;
# rows written = rows deleted (removing index entries is free). Sent in
# the cron's read batch (schedules.py), so it adds no round trip. Re-sent
# after a lost reply, it deletes the next oldest, if any are past the cutoff:
# never a failure younger than the retention.
# ?1 cutoff ?2 limit
PRUNE_OLDEST_FAILED = (
    "DELETE FROM d1queue_failed_jobs WHERE id IN (SELECT id FROM d1queue_failed_jobs "
    "WHERE failed_at < ?1 ORDER BY failed_at, id LIMIT ?2)"
)

# -- schedules (migrations/0004_schedules.sql; driven by schedules.py) --------

SCHEDULE_COLUMNS = (
    "id, cron, tz, name, queue, payload, catch_up, paused, source, version, next_run_at, "
    "last_run_at, created_at, updated_at"
)

# What a cron run reads, in one db.batch (one round trip): the hash of the
# code-declared set last synced, and the due schedules, soonest first,
# through the partial due index: rows read ~ due schedules, not all of them.
# ?1 meta key
SELECT_META = "SELECT value FROM d1queue_meta WHERE key = ?1"
# ?1 now ?2 limit
SELECT_DUE_SCHEDULES = (
    "SELECT id, cron, tz, name, queue, payload, catch_up, version, next_run_at "
    "FROM d1queue_schedules WHERE paused = 0 AND next_run_at <= ?1 "
    "ORDER BY next_run_at LIMIT ?2"
)


def _slot(i: int) -> str:
    return f"json_extract(j.value, '$[{i}]')"


# Every due slot of a cron run in one statement, whatever the number of
# schedules: ?1 is a JSON array of [schedule id, next_run_at as read, version
# as read, job id, slot, queue, max_attempts, priority]; ?2 now.
# The compare-and-set half of exactly-once: a slot's job is inserted only
# while its schedule still has the next_run_at and version this run read. A
# second run that read the same slot (overlapping crons, another Worker on
# the same D1, a re-sent batch) finds next_run_at already advanced by the
# first run's UPDATE_SCHEDULES_RAN, sent in the same transaction, and
# inserts nothing, even once the first job completed and freed its unique
# key. The unique key (schedule:<id>:<slot>) is the second lock: while the
# slot's job is queued, nothing else can insert it. available_at is the
# slot and created_at now, so a due slot goes to the ready band.
INSERT_SCHEDULED_JOBS = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, unique_key, band) "
    f"SELECT {_slot(3)}, {_slot(5)}, s.name, s.payload, 0, {_slot(6)}, {_slot(7)}, {_slot(4)}, "
    f"?2, 'schedule:' || s.id || ':' || {_slot(4)}, "
    f"CASE WHEN {_slot(4)} > ?2 THEN {DELAYED_BAND} ELSE {_slot(7)} END "
    "FROM json_each(?1) AS j JOIN d1queue_schedules AS s ON s.id = "
    f"{_slot(0)} WHERE s.next_run_at = {_slot(1)} AND s.version = {_slot(2)} "
    "AND s.paused = 0 ON CONFLICT DO NOTHING"
)


def _runs_kept(entries: str, runs: str) -> str:
    """A schedule's `runs` (migrations/0016_schedule_runs.sql) with
    `entries` (an SQL term: a non-empty JSON array of [time, job id, ...],
    newest first, at most SCHEDULE_RUNS_KEPT) before the runs it held
    (`runs`, the column as read), cut to the newest SCHEDULE_RUNS_KEPT: the
    row stays small however long it runs.

    Scalar JSON functions only, no json_each: D1 bills a table-valued
    function's rows as rows read, so the cron's advance reads no row more
    than it did. The two arrays are joined as text (both are compact JSON
    arrays made by JSON functions), then the entries past the kept ones are
    removed: each '$[K]' path removes the then K+1-th element, and one past
    the end removes nothing. A `runs` that is not a JSON array (written by
    something else) is replaced, never an error that would stop the cron's
    write."""
    k = SCHEDULE_RUNS_KEPT
    joined = (
        f"CASE WHEN {runs} IS NULL THEN {entries} WHEN NOT json_valid({runs}) THEN {entries} "
        f"WHEN json_type({runs}) != 'array' THEN {entries} "
        f"WHEN json_array_length({runs}) = 0 THEN {entries} "
        f"ELSE substr({entries}, 1, length({entries}) - 1) || ',' || substr({runs}, 2) END"
    )
    return f"json_remove({joined}, {', '.join([repr(f'$[{k}]')] * k)})"


# The advance, after INSERT_SCHEDULED_JOBS in the same batch: ?1 is a JSON
# array of [schedule id, next_run_at as read, version as read, new
# next_run_at, last slot enqueued or null, the slots' [slot, job id] newest
# first (at most SCHEDULE_RUNS_KEPT)]. meta.changes counts the schedules
# this run won; a loser (or a re-send of a batch that landed) changes
# nothing. The runs enqueued join the schedule's `runs` in this statement
# (_runs_kept): the same row written, no statement more per cron run.
UPDATE_SCHEDULES_RAN = (
    f"UPDATE d1queue_schedules SET next_run_at = {_slot(3)}, "
    f"last_run_at = COALESCE({_slot(4)}, last_run_at), "
    "runs = CASE WHEN json_array_length(j.value, '$[5]') > 0 THEN "
    + _runs_kept("json_extract(j.value, '$[5]')", "d1queue_schedules.runs")
    + " ELSE d1queue_schedules.runs END "
    "FROM json_each(?1) AS j WHERE d1queue_schedules.id = "
    f"{_slot(0)} AND d1queue_schedules.next_run_at = {_slot(1)} "
    f"AND d1queue_schedules.version = {_slot(2)} AND d1queue_schedules.paused = 0"
)


def _field(name: str) -> str:
    return f"json_extract(value, '$.{name}')"


_DEFINITION = ("cron", "tz", "name", "queue", "payload", "catch_up", "version")

# Syncing code-declared schedules, sent only when the declared set's hash
# differs from the one in d1queue_meta (a deployment changed it). ?1 JSON
# array of {id, cron, tz, name, queue, payload (JSON text), catch_up,
# version, next_run_at}; ?2 now. A row is written only when it is new or its
# version changed (D1 bills rows written); an API-created row with the same
# id is never touched (`source = 'code'`).
SYNC_CODE_SCHEDULES = (
    f"INSERT INTO d1queue_schedules ({SCHEDULE_COLUMNS}) "
    f"SELECT {_field('id')}, "
    + ", ".join(_field(f) for f in _DEFINITION[:-1])
    + ", 0, 'code', "
    + f"{_field('version')}, {_field('next_run_at')}, NULL, ?2, ?2 "
    "FROM json_each(?1) WHERE 1 ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{f} = excluded.{f}" for f in _DEFINITION)
    + ", next_run_at = excluded.next_run_at, updated_at = excluded.updated_at "
    "WHERE d1queue_schedules.source = 'code' AND d1queue_schedules.version != excluded.version"
)
# Code-declared schedules no longer declared. ?1 JSON array of the declared ids.
# Reads every schedule row (no index on source): it runs only when a
# deployment changed the declared set.
DELETE_UNDECLARED_SCHEDULES = (
    "DELETE FROM d1queue_schedules WHERE source = 'code' "
    "AND id NOT IN (SELECT value FROM json_each(?1))"
)
# ?1 key ?2 value ?3 now; writes nothing when the value is unchanged.
SET_META = (
    "INSERT INTO d1queue_meta (key, value, updated_at) VALUES (?1, ?2, ?3) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at "
    "WHERE d1queue_meta.value != excluded.value"
)

# -- the schedules API ------------------------------------------------------

SELECT_SCHEDULE = f"SELECT {SCHEDULE_COLUMNS} FROM d1queue_schedules WHERE id = ?1"
# Paged by id, cut at ?3 bytes of payloads (bytes_bounded). ?1 cursor (the
# last id of the previous page, '' first) ?2 limit (a page and one) ?3 bytes
LIST_SCHEDULES = bytes_bounded(
    f"SELECT {SCHEDULE_COLUMNS} FROM d1queue_schedules WHERE id > ?1 ORDER BY id LIMIT ?2",
    SCHEDULE_COLUMNS,
    ("payload",),
    "id",
    2,
    3,
)
# Create or replace an API schedule. A replace writes only when the
# definition changed (its version), and then restarts it from the next slot
# after now; pausing is kept. A code-declared row is never replaced here.
# ?1 id ?2 cron ?3 tz ?4 name ?5 queue ?6 payload ?7 catch_up ?8 version
# ?9 next_run_at ?10 now
PUT_API_SCHEDULE = (
    f"INSERT INTO d1queue_schedules ({SCHEDULE_COLUMNS}) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, 'api', ?8, ?9, NULL, ?10, ?10) "
    "ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{f} = excluded.{f}" for f in _DEFINITION)
    + ", next_run_at = excluded.next_run_at, updated_at = excluded.updated_at "
    "WHERE d1queue_schedules.source = 'api' AND d1queue_schedules.version != excluded.version"
)
# A schedule's last runs (the dashboard's schedule pages): a primary-key
# seek an id, 1 row read each. ?1 JSON array of ids
SCHEDULE_RUNS = (
    "SELECT id, runs FROM d1queue_schedules WHERE id IN (SELECT value FROM json_each(?1))"
)
# "Run now" (the dashboard): the schedule's job pushed once now, with the id
# the click chose. Safe to re-send: a job id already in the schedule's runs
# (SCHEDULE_RUN_NOW_RECORD, sent after it in the same transaction) inserts
# nothing, even once that job completed and left the table; while it is
# queued its id is a second lock (ON CONFLICT). A primary-key seek of the
# schedule, 1 row read; the job's row written (and its index entries).
# ?1 schedule id ?2 job id ?3 queue ?4 max_attempts ?5 priority ?6 now
_NOT_RUN = "instr(COALESCE({runs}, ''), '\"' || ?2 || '\"') = 0"
"""The job id ?2 is in none of the runs: its quoted text is not in the
column (an id is letters, digits and dashes: nothing JSON escapes)."""
SCHEDULE_RUN_NOW_JOB = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, band) "
    "SELECT ?2, ?3, s.name, s.payload, 0, ?4, ?5, ?6, ?6, ?5 FROM d1queue_schedules AS s "
    f"WHERE s.id = ?1 AND {_NOT_RUN.format(runs='s.runs')} ON CONFLICT DO NOTHING"
)
# The run joins the schedule's runs, marked "now"; nothing when its job id
# is there already (a re-send). 1 row written. ?1 schedule id ?2 job id ?3
# now (CAST: a JS number arrives as a REAL, which JSON would write as 1.0)
SCHEDULE_RUN_NOW_RECORD = (
    "UPDATE d1queue_schedules SET runs = "
    + _runs_kept("json_array(json_array(CAST(?3 AS INTEGER), ?2, 'now'))", "runs")
    + f" WHERE id = ?1 AND {_NOT_RUN.format(runs='runs')}"
)
# ?1 id
DELETE_API_SCHEDULE = "DELETE FROM d1queue_schedules WHERE id = ?1 AND source = 'api'"
# ?1 id ?2 now
PAUSE_SCHEDULE = (
    "UPDATE d1queue_schedules SET paused = 1, updated_at = ?2 WHERE id = ?1 AND paused = 0"
)
# Resuming restarts from the next slot after now (slots while paused are
# skipped, whatever catch_up says); conditional on the version read, so a
# definition changed in between is not given the old definition's slot.
# ?1 id ?2 next_run_at ?3 now ?4 version as read
RESUME_SCHEDULE = (
    "UPDATE d1queue_schedules SET paused = 0, next_run_at = ?2, updated_at = ?3 "
    "WHERE id = ?1 AND paused = 1 AND version = ?4"
)

# -- the drain's per-minute counters (migrations/0005_stats.sql) --------------

STATS_SLOTS = 1440
"""The counters' ring: one row per minute of the last day."""

_MERGE_QUEUES = (
    "(SELECT json_group_object(k, json_array(c, r, f)) FROM (SELECT k, SUM(c) AS c, "
    "SUM(r) AS r, SUM(f) AS f FROM (SELECT key AS k, json_extract(value, '$[0]') AS c, "
    "json_extract(value, '$[1]') AS r, json_extract(value, '$[2]') AS f "
    "FROM json_each(d1queue_stats.queues) UNION ALL SELECT key, json_extract(value, '$[0]'), "
    "json_extract(value, '$[1]'), json_extract(value, '$[2]') FROM json_each(excluded.queues)) "
    "GROUP BY k))"
)


def _add(column: str) -> str:
    return (
        f"{column} = CASE WHEN minute = excluded.minute THEN {column} + excluded.{column} "
        f"ELSE excluded.{column} END"
    )


# One run's counts added to its minute's row: one statement, one row written.
# A slot still holding the same minute a day ago is overwritten, not added to.
# `run <> excluded.run`: re-sent after a lost reply, the UPSERT finds its own
# run token on the row and adds nothing a second time (unless another run's
# counts landed in between: then the re-send counts twice; these are
# counters for a chart, never a job's state).
# ?1 epoch minute ?2 completed ?3 retried ?4 failed ?5 per-queue JSON ?6 run token
RECORD_STATS = (
    "INSERT INTO d1queue_stats (slot, minute, completed, retried, failed, queues, run) "
    f"VALUES (?1 % {STATS_SLOTS}, ?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (slot) DO UPDATE SET "
    + ", ".join(_add(c) for c in ("completed", "retried", "failed"))
    + f", queues = CASE WHEN minute = excluded.minute THEN {_MERGE_QUEUES} "
    "ELSE excluded.queues END, minute = excluded.minute, run = excluded.run "
    "WHERE run <> excluded.run"
)

# The chart: the last hour's minutes, read by their slots (one range, or two
# where the hour wraps the ring), so it reads at most 60 rows.
# ?1 ?2 first slot range ?3 ?4 second ?5 the minute before the first
STATS_MINUTES = (
    "SELECT minute, completed, retried, failed FROM d1queue_stats "
    "WHERE (slot BETWEEN ?1 AND ?2 OR slot BETWEEN ?3 AND ?4) AND minute > ?5 ORDER BY minute"
)

# Jobs done per queue in the last hour and day: reads the ring (at most
# 1,440 rows, fewer when the queues were idle), never a jobs table.
# ?1 the minute before the hour ?2 the minute before the day
STATS_BY_QUEUE = (
    "SELECT j.key AS queue, "
    "SUM(CASE WHEN s.minute > ?1 THEN json_extract(j.value, '$[0]') ELSE 0 END) AS done_hour, "
    "SUM(json_extract(j.value, '$[0]')) AS done_day, "
    "SUM(CASE WHEN s.minute > ?1 THEN json_extract(j.value, '$[2]') ELSE 0 END) AS failed_hour, "
    "SUM(json_extract(j.value, '$[2]')) AS failed_day "
    "FROM d1queue_stats s, json_each(s.queues) j WHERE s.minute > ?2 GROUP BY j.key"
)

# -- the dashboard's reads and actions (d1queue/interfaces/dashboard/) --------------------


def _job_state(now: str) -> str:
    """A live job's state as of the parameter `now`: cancelling (marked
    while held), waiting, reserved, ready or delayed (as workflows.state_of
    says it)."""
    return (
        "CASE WHEN cancel_at IS NOT NULL THEN 'cancelling' "
        f"WHEN band = {WAITING_BAND} THEN 'waiting' "
        f"WHEN reserved_at IS NOT NULL AND locked_until > {now} THEN 'reserved' "
        f"WHEN locked_until <= {now} AND (available_at <= {now} OR band > {TOP_PRIORITY}) "
        "THEN 'ready' ELSE 'delayed' END"
    )


_JOB_STATE = _job_state("?7")

# A page of one queue's jobs in claim order (the key's order: ready band by
# priority and age, then the delayed band, soonest first), after the cursor
# (band, available_at, id), optionally of one state and one job name. A range
# of the primary key (queue = ?1): the filters are checked as rows are read,
# so a rare state or name reads further into the queue, never another queue.
# Cut at ?9 bytes of payloads and errors (bytes_bounded).
# ?1 queue ?2 cursor band ?3 cursor available_at ?4 cursor id ?5 name or ''
# ?6 state or '' ?7 now ?8 limit (a page and one) ?9 bytes
_CLAIM_ORDER = "band DESC, available_at, id"
LIST_QUEUE_JOBS = bytes_bounded(
    f"SELECT {JOB_COLUMNS}, {_JOB_STATE} AS state FROM d1queue_jobs "
    f"WHERE queue = ?1 AND {LIVE} AND (band < ?2 OR (band = ?2 AND (available_at > ?3 "
    "OR (available_at = ?3 AND id > ?4)))) AND (?5 = '' OR name = ?5) "
    f"AND (?6 = '' OR ?6 = {_JOB_STATE}) ORDER BY {_CLAIM_ORDER} LIMIT ?8",
    f"{JOB_COLUMNS}, state",
    ("payload", "last_error", "after"),
    _CLAIM_ORDER,
    8,
    9,
)

# "Run now": a job no worker holds, waiting (pushed with a delay, or out on a
# retry's backoff), made due now and moved to the ready band of its priority.
# A job already ready is left where it is (it would only lose its place).
# The delayed job through the id index, the retrying one by the walk of
# locked bands. ?1 now ?2 id
_RUN_NOW = "UPDATE d1queue_jobs SET band = priority, available_at = ?1, locked_until = 0 WHERE "
RUN_NOW = (
    _RUN_NOW + f"id = ?2 AND {UNLOCKED} AND reserved_at IS NULL AND available_at > ?1",
    _RUN_NOW + f"queue IN ({QUEUE_NAMES}) AND band = {LOCKED_BAND} AND id = ?2 "
    "AND reserved_at IS NULL AND available_at > ?1",
)

# Failed jobs, newest first, filtered: keyset paging on (failed_at, id) as
# LIST_FAILED_PAGE, bounded below by an age (`failed_at >= ?3`), with name and
# error text checked as rows are read. The age's upper bound is the cursor.
# Cut at ?7 bytes of payloads and errors (bytes_bounded).
# ?1 cursor failed_at ?2 cursor id ?3 oldest failed_at ?4 name or ''
# ?5 error text or '' (case-insensitive substring) ?6 limit (a page and one)
# ?7 bytes [?8 queue]
_FAILED_FILTERED = (
    f"SELECT {FAILED_COLUMNS} FROM d1queue_failed_jobs "
    "WHERE (failed_at, id) < (?1, ?2) AND failed_at >= ?3 AND (?4 = '' OR name = ?4) "
    "AND (?5 = '' OR instr(lower(error), lower(?5)) > 0) "
    f"ORDER BY {_FAILED_ORDER} LIMIT ?6"
)
LIST_FAILED_FILTERED = bytes_bounded(
    _FAILED_FILTERED, FAILED_COLUMNS, _FAILED_SIZED, _FAILED_ORDER, 6, 7
)
LIST_FAILED_FILTERED_IN_QUEUE = bytes_bounded(
    _FAILED_FILTERED.replace("WHERE ", "WHERE queue = ?8 AND "),
    FAILED_COLUMNS,
    _FAILED_SIZED,
    _FAILED_ORDER,
    6,
    7,
)

# The dashboard's search (interfaces/dashboard/search.py): one source a
# page, read newest id first (ids sort by creation time) after the cursor
# ?1 (an id; "~" sorts after every id for the first page), at most ?2 rows,
# whatever matches: each pair below goes in one batch, the matches and
# where the read ends (its SPAN), each reading at most ?2 rows of one index
# (D1 counts an index entry and its row as one), so a page reads at most
# 2 x ?2 rows at 1,000 jobs or 100,000; the matches stop early once ?10
# (a page and one) are found. Filters, '' for any: ?3 queue ?4 name ?5 state
# ?6 group ?7 batch ?8 text in the payload or error (case-insensitive for
# ASCII); ?9 now (a live job's state). They are checked on the rows read,
# so a rare filter over many jobs stops at ?2 rows ("stopped early") and
# pages on from the SPAN's `last`, rather than read further.
_SEARCH_HIT = (
    "(?3 = '' OR queue = ?3) AND (?4 = '' OR name = ?4) AND (?5 = '' OR state = ?5) "
    "AND (?6 = '' OR grp = ?6) AND (?7 = '' OR batch = ?7) AND (?8 = '' "
    "OR instr(lower(payload), lower(?8)) > 0 OR instr(lower(ifnull(err, '')), lower(?8)) > 0)"
)
_SEARCH_COLUMNS = "id, queue, name, grp, batch, attempts, max_attempts, state, at"


def _search(read: str) -> str:
    """The matches among the rows `read` yields (each with `state`, `at`
    and `err`; at most ?2 of them, newest id first), at most ?10."""
    return f"SELECT {_SEARCH_COLUMNS} FROM ({read}) WHERE {_SEARCH_HIT} ORDER BY id DESC LIMIT ?10"


def _span(table: str, where: str) -> str:
    """Where a search's read ends: the last (oldest) id of the ?2 it reads
    after ?1, and how many it reads (?2: more may follow)."""
    return (
        "SELECT MIN(id) AS last, COUNT(*) AS scanned FROM (SELECT id FROM "
        f"{table} WHERE id < ?1 AND {where} ORDER BY id DESC LIMIT ?2)"
    )


# Live jobs but those a worker holds or that wait out a retry (the locked
# band has no id index): through the id index (d1queue_jobs_id, id<?).
_LIVE_READ = (
    f"SELECT *, {_job_state('?9')} AS state, available_at AS at, last_error AS err "
    f"FROM d1queue_jobs WHERE id < ?1 AND {LISTED} ORDER BY id DESC LIMIT ?2"
)
SEARCH_LIVE = _search(_LIVE_READ)
SEARCH_LIVE_SPAN = _span("d1queue_jobs", LISTED)
# Completed jobs kept as history: through the done index (d1queue_jobs_done, id<?).
_COMPLETED_READ = (
    "SELECT *, 'completed' AS state, available_at AS at, last_error AS err "
    f"FROM d1queue_jobs WHERE id < ?1 AND band = {DONE_BAND} ORDER BY id DESC LIMIT ?2"
)
SEARCH_COMPLETED = _search(_COMPLETED_READ)
SEARCH_COMPLETED_SPAN = _span("d1queue_jobs", f"band = {DONE_BAND}")
# Failed jobs: their table's primary key (id<?).
_FAILED_READ = (
    "SELECT *, 'failed' AS state, failed_at AS at, error AS err "
    "FROM d1queue_failed_jobs WHERE id < ?1 ORDER BY id DESC LIMIT ?2"
)
SEARCH_FAILED = _search(_FAILED_READ)
SEARCH_FAILED_SPAN = _span("d1queue_failed_jobs", "1")

# -- the dashboard's sign-outs (migrations/0008_dashboard_signouts.sql) ---------

# Which of a request's session nonces were signed out: one seek of the
# primary key a nonce (a request carries one session cookie, rarely two), at
# most one row read each. Sent on the home shard for every dashboard request
# carrying a session whose MAC and expiry checked out. ?1 the nonces as a
# JSON array of strings
SIGNED_OUT = "SELECT nonce FROM d1queue_signouts WHERE nonce IN (SELECT value FROM json_each(?1))"

# A sign-out: the session's nonce, kept until the session would have
# expired. One row and its expiry index entry written; `OR IGNORE`: a
# re-send after a lost reply (or a second sign-out racing the first) finds
# the row there and writes nothing. ?1 nonce ?2 the session's expiry (ms)
SIGN_OUT = "INSERT OR IGNORE INTO d1queue_signouts (nonce, expires_at) VALUES (?1, ?2)"

# Sent in the same batch as SIGN_OUT: at most ?2 (bounds.SIGNOUT_PRUNE)
# expired sign-outs deleted, oldest first, found through the expiry index
# (reads at most ?2 + 1 index entries, writes at most ?2 rows and their index
# entries). Deleting what is already gone is nothing: safe to re-send.
# ?1 now (ms) ?2 limit
PRUNE_SIGNOUTS = (
    "DELETE FROM d1queue_signouts WHERE nonce IN (SELECT nonce FROM d1queue_signouts "
    "WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)"
)

# -- workflows: history, dependencies, batches (migrations/0010_workflows.sql) --

# A completion that keeps the job: the row moves to the done band, keyed by
# now, with its result (JSON text, or NULL). One row written, as the DELETE
# it replaces, and one done-index entry. The places it held are freed (the
# slot indexes drop their entries: free) and so is its unique key (the
# unique index leaves the done band out). The token stays on the row: a
# re-send after a lost reply finds nothing at the held key, and the driver
# looks for the job among the live ones (_marks), where it no longer is.
# A workflow's job is marked ended in the same statement, which fires the
# trigger d1queue_jobs_ended (its waiters and batch count it); any other
# job's `ended` stays 0 and fires nothing.
# The attempt joins the job's history in the same statement (_runs_set).
# ?1 id ?2 reservation ?3 queue ?4 lease end ?5 now ?6 result ?7 the
# attempt's entry (JSON, core/history.py)
WORKFLOW = "(dependents = 1 OR batch IS NOT NULL)"
"""A job whose end the trigger d1queue_jobs_ended must count: some job waits
for it, or it is a batch's."""

ENDED_KEPT, ENDED_FAILED, ENDED_DELETED = 1, 2, 3
"""`ended` as the trigger reads it: completed and kept; failed, cancelled or
cleared; completed on a queue that keeps no history (deleted next)."""

_DONE_SET = (
    f"UPDATE d1queue_jobs SET band = {DONE_BAND}, available_at = ?5, locked_until = 0, "
    f"reserved_at = NULL, slot = NULL, gslot = NULL, ended = CASE WHEN {WORKFLOW} THEN "
    f"{ENDED_KEPT} ELSE 0 END, result = "
)
COMPLETE_HELD = _DONE_SET + f"?6, {_runs_set('?7')} WHERE " + _held(3, 4, 1, 2)

# DELETE_HELD_BATCH's twin for a queue that keeps history: every completed
# job of a claim batch moves to the done band in one statement, each with
# its own result read from ?4, a JSON object {id: result as JSON text}, by
# json_extract (a scalar: no row read). Ids match ID_RULE, which needs no
# escaping in a JSON path. Each attempt's history entry likewise from ?6.
# ?1 queue ?2 lease end ?3 reservation ?4 results ?5 now ?6 the attempts'
# entries, a JSON object {id: entry}
_BATCH_ENTRY = "json_extract(?6, '$.\"' || id || '\"')"
COMPLETE_HELD_BATCH = (
    _DONE_SET
    + "json_extract(?4, '$.\"' || id || '\"'), "
    + _runs_set(_BATCH_ENTRY)
    + " "
    + f"WHERE queue = ?1 AND band = {LOCKED_BAND} AND available_at = ?2 "
    "AND reservation = ?3 AND reserved_at IS NOT NULL "
    "AND json_type(?4, '$.\"' || id || '\"') IS NOT NULL"
)

_VIEW_COLUMNS = f"{JOB_COLUMNS}, result, ignore_failed, runs, progress"

# A job by id for the API and dashboard, wherever it is: live (through the id
# index, or the walk of the locked bands), or completed and kept (the done
# index; the latest, if its id ran twice). ?1 id
SELECT_JOB_VIEW = (
    f"SELECT * FROM (SELECT {_VIEW_COLUMNS} FROM d1queue_jobs WHERE id = ?1 AND {LISTED}) "
    f"UNION ALL SELECT * FROM (SELECT {_VIEW_COLUMNS} FROM d1queue_jobs WHERE id = ?1 "
    f"AND band = {DONE_BAND} ORDER BY available_at DESC LIMIT 1) "
    f"UNION ALL SELECT * FROM (SELECT {_VIEW_COLUMNS} FROM d1queue_jobs WHERE queue IN "
    f"({QUEUE_NAMES}) AND band = {LOCKED_BAND} AND id = ?1) LIMIT 1"
)

# A queue's completed jobs, newest first, after the cursor (completed_at,
# id): a range of the key read backwards, a page's rows and no more, cut at
# ?5 bytes of payloads, results and errors (bytes_bounded).
# ?1 queue ?2 cursor completed_at ?3 cursor id ?4 limit (a page and one) ?5 bytes
_COMPLETED_ORDER = "available_at DESC, id DESC"
LIST_COMPLETED = bytes_bounded(
    f"SELECT {_VIEW_COLUMNS} FROM d1queue_jobs WHERE queue = ?1 AND band = {DONE_BAND} "
    "AND (available_at < ?2 OR (available_at = ?2 AND id < ?3)) "
    f"ORDER BY {_COMPLETED_ORDER} LIMIT ?4",
    _VIEW_COLUMNS,
    ("payload", "result", "last_error", "after", "runs", "progress"),
    _COMPLETED_ORDER,
    4,
    5,
)

# The results of the completed jobs among ?1 (a JSON array of ids): a
# handler's dependencies. Through the done index, a row each.
DEPENDENCY_RESULTS = (
    "SELECT id, result FROM d1queue_jobs WHERE id IN (SELECT value FROM json_each(?1)) "
    f"AND band = {DONE_BAND}"
)

# The jobs waiting for ?1, by the edges' key (at most ?2). Edges outlive a
# dependency's completion while it is kept; a job's edges go when it is
# deleted (failed, cancelled, pruned).
DEPENDENTS = "SELECT waiter FROM d1queue_deps WHERE dep = ?1 ORDER BY waiter LIMIT ?2"


def _ids_in(param: int) -> str:
    return f"(SELECT value FROM json_each(?{param}))"


def _unlocated(param: int) -> str:
    """Whether some id of ?param's is found by no index: neither waiting to
    run or for others, nor completed and kept, nor failed. A constant term
    (it names no row of the statement's loop), which SQLite tests once
    before the loop: false, the walk it guards reads nothing."""
    ids = _ids_in(param)
    return (
        f"(SELECT COUNT(*) FROM d1queue_jobs WHERE id IN {ids} AND {LISTED}) + "
        f"(SELECT COUNT(*) FROM d1queue_jobs WHERE id IN {ids} AND band = {DONE_BAND}) + "
        f"(SELECT COUNT(*) FROM d1queue_failed_jobs WHERE id IN {ids}) "
        f"< json_array_length(?{param})"
    )


def _running(param: int) -> str:
    """WHERE of the jobs among ?param's ids that are held or waiting out a
    retry: a walk of the locked bands (the id index leaves them out), which
    reads the jobs in flight, so it runs only when some id is found by no
    index (_unlocated): the usual dependencies, queued or waiting, cost
    point reads alone."""
    return (
        f"queue IN ({QUEUE_NAMES}) AND band = {LOCKED_BAND} AND id IN {_ids_in(param)} "
        f"AND {_unlocated(param)}"
    )


def _live_ids(param: int) -> str:
    """The ids among ?param's that are live jobs: waiting to run or for
    others (the id index), or held or waiting out a retry (_running)."""
    return (
        f"(SELECT id FROM d1queue_jobs WHERE id IN {_ids_in(param)} AND {LISTED} UNION ALL "
        f"SELECT id FROM d1queue_jobs WHERE {_running(param)})"
    )


def _known_ids(param: int) -> str:
    """The ids among ?param's a job may wait for: live, failed, or completed
    and kept."""
    ids = _ids_in(param)
    return (
        f"({_live_ids(param)[1:-1]} UNION ALL SELECT id FROM d1queue_jobs WHERE id IN {ids} "
        f"AND band = {DONE_BAND} UNION ALL SELECT id FROM d1queue_failed_jobs WHERE id IN {ids})"
    )


_FAILED_IDS = "(SELECT id FROM d1queue_failed_jobs WHERE id IN (SELECT value FROM json_each(?12)))"

# The push of a job that waits for others: INSERT_JOB's ten values, then
# ?11 its group (NULL: none) ?12 `after` (a JSON array of distinct ids)
# ?13 ignore_failed (0/1) ?14 its batch (NULL: none) ?15 the most jobs one
# job may be waited for by (bounds.MAX_DEPENDENTS) ?16 its traceparent
# (NULL: none). The same statement
# checks and counts its dependencies, in the push's transaction:
# - waiting: those still live (queued, waiting, running or retrying); a
#   completion since has moved on and counted already, one to come will
#   count (the dependency's `dependents` flag, set below in this batch);
# - a dependency failed (its failure still kept) without ignore_failed:
#   waiting -1, the job is failed by the drain instead of run;
# - any id neither live, failed nor kept as completed, or a live one that
#   already has ?15 edges (a job earlier in this batch added its own): waiting
#   NULL, which the NOT NULL column refuses, and the push's whole db.batch
#   fails: nothing is written (the driver then reads which ids,
#   UNKNOWN_AFTER and DEPENDENT_COUNTS). Counted here, in the transaction
#   that adds the edge, two pushes racing for a dependency's last place
#   cannot both take it: D1 runs one transaction at a time.
# It waits in the waiting band, or, with nothing to wait for, goes where any
# push goes. Reads: a point read per id (three indexes and the failed
# table), its edges by their key (cut off at ?15), and the jobs in flight
# once. ON CONFLICT: a unique key already held, as INSERT_JOB.
_LIVE_N = f"(SELECT COUNT(*) FROM json_each(?12) WHERE value IN {_live_ids(12)})"
_KNOWN_N = f"(SELECT COUNT(*) FROM json_each(?12) WHERE value IN {_known_ids(12)})"
_FAILED_DEP = (
    f"(SELECT value FROM json_each(?12) WHERE ?13 = 0 AND value IN {_FAILED_IDS} "
    f"AND value NOT IN {_live_ids(12)} LIMIT 1)"
)
_DOOMED = f"({_FAILED_DEP} IS NOT NULL)"


def _edges(dep: str, most: int, besides: str | None = None) -> str:
    """The edges of job `dep` (an expression), but waiter `besides`'s,
    counted by their key and cut off at ?most: at most that many read (one
    more when the waiter's own is among them)."""
    other = "" if besides is None else f" AND waiter <> {besides}"
    return (
        f"(SELECT COUNT(*) FROM (SELECT 1 FROM d1queue_deps WHERE dep = {dep}{other} "
        f"LIMIT ?{most}))"
    )


# A live dependency already waited for by ?15 jobs other than this one (a
# push re-sent after a lost reply finds its own edge: not counted, so the
# job that took the last place is not refused for it). Whether an id is live
# is asked only of one at the cap (CASE: SQLite evaluates its branches
# lazily), so the usual push reads its edges and nothing more; a completed
# one kept takes no edge, whatever it had.
_FULL_DEP = (
    f"(SELECT 1 FROM json_each(?12) AS a WHERE CASE WHEN {_edges('a.value', 15, '?1')} >= ?15 "
    f"THEN a.value IN {_live_ids(12)} ELSE 0 END LIMIT 1)"
)
_RUN_BAND = f"CASE WHEN ?11 IS NULL THEN ?7 ELSE ?7 + {GROUP_SHIFT} END"
INSERT_WAITER = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, unique_key, grp, after, ignore_failed, batch, traceparent, "
    "last_error, waiting, band) "
    "SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?16, "
    "CASE WHEN s.doomed THEN 'dependency ' || s.failed || ' failed' END, "
    "CASE WHEN s.known < json_array_length(?12) OR s.at_cap IS NOT NULL THEN NULL "
    "WHEN s.doomed THEN -1 ELSE s.live END, "
    f"CASE WHEN s.doomed THEN {_RUN_BAND} WHEN s.live > 0 THEN {WAITING_BAND} "
    f"WHEN ?8 > ?9 THEN {DELAYED_BAND} ELSE {_RUN_BAND} END "
    f"FROM (SELECT {_KNOWN_N} AS known, {_LIVE_N} AS live, {_FAILED_DEP} AS failed, "
    f"{_DOOMED} AS doomed, {_FULL_DEP} AS at_cap) AS s "
    "WHERE 1 ON CONFLICT DO NOTHING"
)

# After INSERT_WAITER, in its batch: an edge per live dependency, if the job
# was inserted (a unique key held by another job inserts none), and each
# live dependency marked as waited for, so its end fires the trigger
# (one row written each, the first time; running jobs are found by the walk
# of the locked bands). ?1 the waiter's id ?2 `after`
INSERT_EDGES = (
    f"INSERT OR IGNORE INTO d1queue_deps (dep, waiter) SELECT value, ?1 FROM json_each(?2) "
    f"WHERE value IN {_live_ids(2)} AND EXISTS (SELECT 1 FROM d1queue_jobs WHERE id = ?1 "
    f"AND {LISTED} AND after = ?2)"
)
MARK_WAITED = (
    f"UPDATE d1queue_jobs SET dependents = 1 WHERE id IN {_ids_in(1)} AND {LISTED} "
    "AND dependents = 0"
)
MARK_WAITED_RUNNING = (
    f"UPDATE d1queue_jobs SET dependents = 1 WHERE {_running(1)} AND dependents = 0"
)

# Which of ?1's ids (a JSON array) no job may wait for: after a push whose
# INSERT_WAITER was refused, what its error names.
UNKNOWN_AFTER = f"SELECT value AS id FROM json_each(?1) WHERE value NOT IN {_known_ids(1)}"
# Then, if none is unknown: each of ?1's ids, whether it is live, and its
# edges (cut off at ?2, bounds.MAX_DEPENDENTS), which with the edges the
# refused push would have added say which one it would have taken past ?2.
DEPENDENT_COUNTS = (
    f"SELECT a.value AS id, a.value IN {_live_ids(1)} AS live, {_edges('a.value', 2)} AS edges "
    "FROM json_each(?1) AS a"
)

# A batch's rows, written first in the batch creating it (one transaction
# with its jobs). The counters start at the jobs' number: each job's end
# counts down (the trigger d1queue_jobs_ended). A re-send after a lost reply meets the row
# (PRIMARY KEY) and fails whole: the driver then finds the batch there.
# ?1 id ?2 jobs ?3 now
INSERT_BATCH = (
    "INSERT INTO d1queue_batches (id, total, pending, created_at) VALUES (?1, ?2, ?2, ?3)"
)
# ?1 id ?2 ids (JSON array) ?3 ?4 ?5 on_success, on_failure, on_finish (each
# a callback's row as a JSON array, or NULL)
INSERT_BATCH_PARTS = (
    "INSERT INTO d1queue_batch_parts (id, ids, on_success, on_failure, on_finish) "
    "VALUES (?1, ?2, ?3, ?4, ?5)"
)

# Jobs added to a running batch: counted before they are inserted (in the
# same db.batch), only while a job of it is pending. A batch that finished
# is left alone, and the insert of its first job then fails the whole
# db.batch (the trigger d1queue_jobs_join): nothing is added. Re-sent after
# a lost reply, the inserts meet their ids and fail it whole as well.
# ?1 batch ?2 jobs added ?3 their ids (JSON array)
_NOT_GROWN = "(SELECT instr(ids, json_quote(?3)) FROM d1queue_batch_parts WHERE id = ?1) = 0"
# ?1 batch ?2 the added ids (JSON array) ?3 the first of them
GROW_BATCH = (
    "UPDATE d1queue_batches SET total = total + k.n, pending = pending + k.n "
    "FROM (SELECT COUNT(*) AS n FROM d1queue_jobs WHERE id IN (SELECT value FROM json_each(?2)) "
    f"AND {LISTED} AND batch = ?1) AS k WHERE d1queue_batches.id = ?1 AND {_NOT_GROWN}"
)
GROW_BATCH_IDS = (
    "UPDATE d1queue_batch_parts SET ids = (SELECT json_group_array(value) FROM "
    "(SELECT value FROM json_each(d1queue_batch_parts.ids) UNION ALL "
    f"SELECT value FROM json_each(?2))) WHERE id = ?1 AND {_NOT_GROWN}"
)

# A batch's counters, and its parts (the ids of its jobs). ?1 id
SELECT_BATCH = (
    "SELECT b.id, b.total, b.pending, b.completed, b.failed, b.fired, b.created_at, "
    "b.finished_at, p.ids FROM d1queue_batches b LEFT JOIN d1queue_batch_parts p ON p.id = b.id "
    "WHERE b.id = ?1"
)

# The cron's history prune, bounded like PRUNE_OLDEST_FAILED: at most ?2
# completed jobs from before ?1, found by a walk of each queue's done band
# from its oldest (about two rows read per queue to find them, then a row
# per row deleted: the reads follow the deletes, not the history's size).
# Their edges go first (a dependency kept is what its dependents' page
# links to). Rows written: the rows deleted. Re-sent, it deletes the next
# oldest past the cutoff, never a younger one. ?1 cutoff ?2 limit
_PRUNED = (
    f"SELECT queue, band, available_at, id FROM d1queue_jobs WHERE queue IN ({QUEUE_NAMES}) "
    f"AND band = {DONE_BAND} AND available_at < ?1 LIMIT ?2"
)
PRUNE_DONE_EDGES = f"DELETE FROM d1queue_deps WHERE dep IN (SELECT id FROM ({_PRUNED}))"
PRUNE_DONE = (
    "DELETE FROM d1queue_jobs WHERE (queue, band, available_at, id) IN "
    f"(SELECT queue, band, available_at, id FROM ({_PRUNED}))"
)
# Finished batches past the same cutoff, through their finished index.
# ?1 cutoff ?2 limit
PRUNE_BATCH_PARTS = (
    "DELETE FROM d1queue_batch_parts WHERE id IN (SELECT id FROM d1queue_batches "
    "WHERE finished_at IS NOT NULL AND finished_at < ?1 ORDER BY finished_at LIMIT ?2)"
)
PRUNE_BATCHES = (
    "DELETE FROM d1queue_batches WHERE id IN (SELECT id FROM d1queue_batches "
    "WHERE finished_at IS NOT NULL AND finished_at < ?1 ORDER BY finished_at LIMIT ?2)"
)

# After a batch's (or an addition's) inserts, when some of its jobs carry a
# unique key: a key already held inserts no job, which is then no job of
# the batch, so the counters take the jobs that were inserted instead of
# the ?3 counted before (point reads through the id index). None inserted:
# a batch that could never end; total NULL, which the NOT NULL column
# refuses, fails the push's whole db.batch (EmptyBatch).
# ?1 batch ?2 the jobs' ids (JSON array) ?3 how many were counted
RECOUNT_BATCH = (
    "UPDATE d1queue_batches SET total = NULLIF(total - ?3 + k.n, 0), pending = pending - ?3 + k.n "
    "FROM (SELECT COUNT(*) AS n FROM d1queue_jobs WHERE id IN (SELECT value FROM json_each(?2)) "
    f"AND {LISTED} AND batch = ?1) AS k WHERE d1queue_batches.id = ?1"
)

MAX_SAFE_TIME = 2**53 - 2
"""A completed_at past every real one: the first page's cursor."""


# -- the dashboard's workflow reads (d1queue/interfaces/dashboard/) ------------


def _states(ids: str, now: str, running: str) -> str:
    """The state of each job among `ids` (a subquery of ids), as of `now`:
    live jobs through the id index, plus those held or waiting out a retry
    (`running`: a WHERE walking the locked bands), completed ones through
    the done index, failed ones by their key. An id found nowhere
    (cancelled, pruned, or never inserted) has no row; an id completed
    twice has a row each time."""
    return (
        f"SELECT id, {_job_state(now)} AS state FROM d1queue_jobs WHERE id IN {ids} "
        f"AND {LISTED} UNION ALL "
        f"SELECT id, {_job_state(now)} AS state FROM d1queue_jobs WHERE {running} UNION ALL "
        f"SELECT id, 'completed' AS state FROM d1queue_jobs WHERE id IN {ids} "
        f"AND band = {DONE_BAND} UNION ALL "
        f"SELECT id, 'failed' AS state FROM d1queue_failed_jobs WHERE id IN {ids}"
    )


# The state of each of ?1's ids (a JSON array of at most STATES_CHUNK ids): a
# job's dependencies, or a page of a batch's jobs, each shown as a link with
# its state. A point read an id in each of three indexes and the failed
# table; the walk of the locked bands (the jobs in flight) only when some id
# is found by none of them (_running). Rows read: about 1 an id found, plus
# the jobs in flight when one of the ids is running or gone. ?1 ids ?2 now
JOB_STATES = _states(_ids_in(1), "?2", _running(1))

# The same for the first ?3 jobs waiting for ?1 (DEPENDENTS' edges, by the
# edges' key): a job page's dependents. The edges are read by each of the
# four parts (at most 4 x ?3 rows of d1queue_deps), then a point read a
# waiter as JOB_STATES, and the jobs in flight once (a dependent running or
# retrying is found by no index; without a JSON list of the ids there is
# no count to skip the walk by). ?1 the job waited for ?2 now ?3 limit
_WAITERS = "(SELECT waiter FROM d1queue_deps WHERE dep = ?1 ORDER BY waiter LIMIT ?3)"
DEPENDENT_STATES = _states(
    _WAITERS,
    "?2",
    f"queue IN ({QUEUE_NAMES}) AND band = {LOCKED_BAND} AND id IN {_WAITERS}",
)
STATES_CHUNK = 100
"""Ids in one JOB_STATES: a job's `after` (bounds.MAX_AFTER) fits one."""

# A batch's page: SELECT_BATCH's counters and ids, and which callbacks it
# was given (not their rows: the page links to the callback jobs by id).
# Two primary-key seeks, 2 rows read. ?1 id
SELECT_BATCH_VIEW = (
    "SELECT b.id, b.total, b.pending, b.completed, b.failed, b.fired, b.created_at, "
    "b.finished_at, p.ids, p.on_success IS NOT NULL AS has_on_success, "
    "p.on_failure IS NOT NULL AS has_on_failure, p.on_finish IS NOT NULL AS has_on_finish "
    "FROM d1queue_batches b LEFT JOIN d1queue_batch_parts p ON p.id = b.id WHERE b.id = ?1"
)

# The batches index (the dashboard's): a shard's batches newest first (a
# batch id is a job.new_id, which sorts by creation time, behind the
# shard's mark), each with its counters and which callbacks it was given,
# after a keyset cursor. A walk of the primary key down from ?1, at most ?3
# batches, and a primary-key seek of each one's parts: about 2 x ?3 rows
# read, however many batches are kept. ?1 the id to start below (the
# shard's mark before the cursor, or before '~' for the first page) ?2 the
# shard's mark ('' for shard 0: the ids that sort at or after it) ?3 limit
LIST_BATCHES = (
    "SELECT b.id, b.total, b.pending, b.completed, b.failed, b.fired, b.created_at, "
    "b.finished_at, NULL AS ids, p.on_success IS NOT NULL AS has_on_success, "
    "p.on_failure IS NOT NULL AS has_on_failure, p.on_finish IS NOT NULL AS has_on_finish "
    "FROM d1queue_batches b LEFT JOIN d1queue_batch_parts p ON p.id = b.id "
    "WHERE b.id < ?1 AND b.id >= ?2 ORDER BY b.id DESC LIMIT ?3"
)

# Ending a workflow's job that is deleted next (a failure, or a completion on
# a queue that keeps no history): its `ended` set in place, which fires the
# trigger d1queue_jobs_ended, before the DELETE in the same transaction. A
# job that is no workflow's is left alone (nothing written; the DELETE
# before it in the batch, DELETE_HELD_PLAIN, took it). ?1 id ?2 reservation
# ?3 queue ?4 lease end ?5 ended
END_HELD = f"UPDATE d1queue_jobs SET ended = ?5 WHERE {_held(3, 4, 1, 2)} AND {WORKFLOW}"
# DELETE_HELD of a job that is no workflow's. No trigger fires on a DELETE
# of the jobs table, so a settle that deletes (DELETE_HELD_BATCH_PLAIN
# too) reads each row once, in one pass, and the workflow's jobs of the
# range are ended and deleted by the two statements after it, which find
# none in the usual batch: a seek each. Same parameters as DELETE_HELD.
DELETE_HELD_PLAIN = DELETE_HELD + f" AND NOT {WORKFLOW}"
# The completed jobs of a claim batch's range a waiter named since (the
# ids given: a failed job of the range is another's to end). ?1 queue
# ?2 lease end ?3 reservation ?4 ended ?5 the completed jobs' ids (JSON array)
END_HELD_BATCH = (
    f"UPDATE d1queue_jobs SET ended = ?4 WHERE queue = ?1 AND band = {LOCKED_BAND} "
    f"AND available_at = ?2 AND reservation = ?3 AND reserved_at IS NOT NULL AND {WORKFLOW} "
    "AND id IN (SELECT value FROM json_each(?5))"
)
# Then those, and only those (a job END_HELD_BATCH did not end stays held
# for its own settle). ?1 queue ?2 lease end ?3 reservation
DELETE_ENDED_BATCH = DELETE_HELD_BATCH + f" AND ended = {ENDED_DELETED}"
DELETE_HELD_BATCH_PLAIN = DELETE_HELD_BATCH + f" AND NOT {WORKFLOW}"

# A cancel's end of a workflow's job, before CANCEL_JOBS deletes it (the
# id index, then the walk of the locked bands). ?1 id
END_CANCELLED = (
    f"UPDATE d1queue_jobs SET ended = {ENDED_FAILED} WHERE id = ?1 AND {LISTED} "
    f"AND reserved_at IS NULL AND {WORKFLOW}",
    f"UPDATE d1queue_jobs SET ended = {ENDED_FAILED} WHERE queue IN ({QUEUE_NAMES}) "
    f"AND band = {LOCKED_BAND} AND id = ?1 AND reserved_at IS NULL AND {WORKFLOW}",
)
# A clear's end of the queue's workflow jobs, before CLEAR_QUEUE. ?1 queue
END_CLEARED = (
    f"UPDATE d1queue_jobs SET ended = {ENDED_FAILED} WHERE queue = ?1 AND band = {WAITING_BAND} "
    f"AND {WORKFLOW} AND ended = 0",
    f"UPDATE d1queue_jobs SET ended = {ENDED_FAILED} WHERE queue = ?1 AND {LIVE} AND {WORKFLOW} "
    "AND ended = 0",
)


# -- job metrics (migrations/0012_metrics.sql; store/metrics.py) ---------------
#
# Each settle batch adds its round's outcomes to the (queue, name) rows of
# the all-time totals and of the settle's minute: one UPSERT per guard site,
# one row written per (queue, name) and shape whatever the number of jobs.
# What it adds is the jobs of ?1, a JSON array of one entry per attempt,
# [queue, name, outcome (0 completed, 1 retried, 2 failed, 3 cancelled while
# it ran), wait bucket,
# wait ms, run bucket, run ms, id, lease end, token]; ?2 the minute (ms).
# A job is counted only where its settle lands, and only once however often
# the batch is sent (D1 may commit it and lose the reply): see the guards.

_M_BUCKETS = tuple(range(METRIC_BUCKETS))
_M_COUNTS = (
    "completed",
    "retried",
    "failed",
    "cancelled",
    "wait_ms",
    "run_ms",
    *(f"w{i}" for i in _M_BUCKETS),
    *(f"r{i}" for i in _M_BUCKETS),
)
"""A metrics row's counting columns, in table order: added to on upsert,
summed by the rollup."""
METRICS_COLUMNS = "queue, period, at, name, " + ", ".join(_M_COUNTS)
_M_JOBS = (
    "(SELECT json_extract(value, '$[0]') AS queue, json_extract(value, '$[1]') AS name, "
    "json_extract(value, '$[2]') AS k, json_extract(value, '$[3]') AS wb, "
    "json_extract(value, '$[4]') AS ws, json_extract(value, '$[5]') AS rb, "
    "json_extract(value, '$[6]') AS rs, json_extract(value, '$[7]') AS id, "
    "json_extract(value, '$[8]') AS until, json_extract(value, '$[9]') AS token "
    "FROM json_each(?1))"
)
_M_SHAPES = f"(SELECT {METRIC_TOTAL} AS period, 0 AS at UNION ALL SELECT {METRIC_MINUTE_MS}, ?2)"
_M_SUMS = (
    "SUM(j.k = 0), SUM(j.k = 1), SUM(j.k = 2), SUM(j.k = 3), SUM(j.ws), SUM(j.rs), "
    + ", ".join(f"SUM(j.wb = {i})" for i in _M_BUCKETS)
    + ", "
    + ", ".join(f"SUM(j.rb = {i})" for i in _M_BUCKETS)
)
_M_ADD = ", ".join(f"{c} = {c} + excluded.{c}" for c in _M_COUNTS)
_M_UPSERT = " ON CONFLICT (queue, period, at, name) DO UPDATE SET " + _M_ADD


def _metrics_insert(where: str) -> str:
    return (
        f"INSERT INTO d1queue_metrics ({METRICS_COLUMNS}) SELECT j.queue, p.period, p.at, "
        f"j.name, {_M_SUMS} FROM {_M_JOBS} AS j, {_M_SHAPES} AS p WHERE {where} "
        "GROUP BY j.queue, p.period, p.at, j.name" + _M_UPSERT
    )


# Sent first in a settle batch, before the statements settling the jobs it
# counts (each of which settles a job by its held key and token): it counts
# the jobs still held under their claim's token now, which the statements
# after it in the same transaction then settle. A job whose lease lapsed
# and was claimed again is not held under our token, and its settle
# changes nothing: neither counts. A re-send after a lost reply finds each
# job already settled (deleted, moved to the done band, or released by its
# retry: reserved_at NULL) and counts nothing, where a guard on the settle's
# own changes would not do for a retry, whose re-send matches again. Reads
# one row per job (a seek of the primary key); writes a row per (queue,
# name) and shape, none when no job was held.
METRICS_HELD = _metrics_insert(
    "EXISTS (SELECT 1 FROM d1queue_jobs h WHERE h.queue = j.queue "
    f"AND h.band = {LOCKED_BAND} AND h.available_at = j.until AND h.id = j.id "
    "AND h.reservation = j.token AND h.reserved_at IS NOT NULL)"
)

# Sent right after a statement acknowledging a claim batch's completed jobs
# at once (DELETE_HELD_BATCH_PLAIN, COMPLETE_HELD_BATCH): it counts them
# only if that statement changed exactly as many rows (?3). SQLite's
# changes() is the rows the connection's last INSERT, UPDATE or DELETE
# changed (not counting rows its triggers changed), and D1 runs a batch's
# statements in order on one connection in one transaction (the contract's
# case_changes_in_a_batch_is_the_row_count_of_the_statement_before holds it
# on Miniflare's D1 as on SQLite; production D1 runs the same SQLite, but no
# test here reaches it). A re-send finds
# the jobs gone and changes none: nothing is counted twice. One that fell
# short (a lease lost) counts nothing: which jobs landed is not known, and a
# count must never exceed what happened. Reads nothing from a table; writes
# a row per (queue, name) and shape.
METRICS_ACKED = _metrics_insert("changes() = ?3")

# A cancel's count, before the statements deleting the job (CANCEL_JOBS, in
# the same batch), read from the job's row where they find it: a re-send
# finds it gone. ?1 id ?2 the minute (ms). Reads the job (as CANCEL_JOBS
# does); writes its (queue, name)'s totals and minute rows.
_CANCELLED_JOB = (
    f"SELECT queue, name FROM d1queue_jobs WHERE id = ?1 AND {LISTED} AND reserved_at IS NULL "
    f"UNION ALL SELECT queue, name FROM d1queue_jobs WHERE queue IN ({QUEUE_NAMES}) "
    f"AND band = {LOCKED_BAND} AND id = ?1 AND reserved_at IS NULL"
)
METRICS_CANCELLED = (
    "INSERT INTO d1queue_metrics (queue, period, at, name, cancelled) "
    f"SELECT c.queue, p.period, p.at, c.name, 1 FROM ({_CANCELLED_JOB}) AS c, {_M_SHAPES} AS p "
    "WHERE true ON CONFLICT (queue, period, at, name) DO UPDATE SET cancelled = cancelled + 1"
)

# A clear's count: every job CLEAR_QUEUE (after it in the same batch) then
# deletes, counted as cancelled per job name, reserved ones too (their
# settle then finds nothing and counts nothing). A re-send finds them gone
# and counts only what it deletes itself. ?1 queue ?2 the minute (ms).
# Reads the queue's live jobs (as the DELETE does); writes a row per job
# name and shape.
METRICS_CLEARED = (
    "INSERT INTO d1queue_metrics (queue, period, at, name, cancelled) "
    f"SELECT j.queue, p.period, p.at, j.name, COUNT(*) FROM d1queue_jobs j, {_M_SHAPES} AS p "
    f"WHERE j.queue = ?1 AND {LIVE} GROUP BY j.queue, p.period, p.at, j.name "
    "ON CONFLICT (queue, period, at, name) DO UPDATE SET cancelled = cancelled + excluded.cancelled"
)

# The all-time totals of every queue (or of ?1 alone; '' for all) and job
# name (?2; '' for all): the queues walked by seeks, each queue's totals
# one range of the key. Reads one row per (queue, name) and about one per
# queue.
METRICS_TOTALS = (
    _walk_queues("d1queue_metrics")
    + f"SELECT m.{METRICS_COLUMNS.replace(', ', ', m.')} FROM q JOIN d1queue_metrics m "
    f"ON m.queue = q.name AND m.period = {METRIC_TOTAL} AND m.at = 0 "
    "WHERE (?1 = '' OR q.name = ?1) AND (?2 = '' OR m.name = ?2)"
)

# A window's series rows of one shape: period ?3, at from ?4 to before ?5,
# one queue (?1; '' for all) and name (?2; '' for all). Each queue's rows
# are one range of the key (queue, period, at): reads the window's rows of
# the queues asked for, and about one per queue for the walk.
METRICS_SERIES = (
    _walk_queues("d1queue_metrics")
    + f"SELECT m.{METRICS_COLUMNS.replace(', ', ', m.')} FROM q JOIN d1queue_metrics m "
    "ON m.queue = q.name AND m.period = ?3 AND m.at >= ?4 AND m.at < ?5 "
    "WHERE (?1 = '' OR q.name = ?1) AND (?2 = '' OR m.name = ?2)"
)

# The cron's rollup and prune ride in the batch that reads its due
# schedules (schedules.py), so they cost no D1 query: none reads the
# cursor first. The cursor in d1queue_meta (METRICS_ROLLED_KEY) names the
# last hour rolled up; each statement reads it where it runs.
METRICS_ROLLED_KEY = "metrics_rolled"
_ROLL_CURSOR = (
    f"(SELECT CAST(value AS INTEGER) FROM d1queue_meta WHERE key = '{METRICS_ROLLED_KEY}')"
)
# The hour a run rolls, a CTE h(at) after the queues' walk q: the hour of
# the oldest minute row at or after the cursor's next hour (with no cursor
# yet, or one older than ?2, the hour rows kept: from ?2), up to the last
# hour that ended (?1, a margin past its end: a settle's minute is keyed
# by the Worker's clock, which reaches D1 a moment later). Empty hours are
# skipped; NULL when no minute row waits, and nothing is written. Reads one
# row per queue (a seek of the key each) and the cursor's.
_ROLL_FROM = f"MAX(COALESCE({_ROLL_CURSOR} + {METRIC_HOUR_MS}, ?2), ?2)"
_ROLL_HOUR = (
    f", h(at) AS (SELECT MIN(f) - MIN(f) % {METRIC_HOUR_MS} FROM (SELECT (SELECT at "
    f"FROM d1queue_metrics WHERE queue = q.name AND period = {METRIC_MINUTE_MS} "
    f"AND at >= {_ROLL_FROM} AND at < ?1 + {METRIC_HOUR_MS} ORDER BY at LIMIT 1) AS f "
    "FROM q WHERE q.name IS NOT NULL)) "
)
_ROLL_SUMS = ", ".join(f"SUM({c})" for c in _M_COUNTS)

# The minute rows of one hour (_ROLL_HOUR), summed per (queue, name) into
# that hour's row, once: ROLL_METRICS_MARK, after it in the same batch,
# moves the cursor to that hour, so a re-send or an overlapping run rolls
# the next hour that has minutes, if it is due, and never this one again
# (and an hour row already there is left as it is). One hour a run: a
# cursor behind by n hours with minutes catches up in n runs, and the
# minutes of an hour not rolled yet are never pruned (PRUNE_METRICS).
# ?1 the last hour due ?2 the oldest hour worth rolling. Reads the hour's
# minute rows (at most 60 per (queue, name)) and _ROLL_HOUR's; writes one
# row per (queue, name) that ran jobs in that hour. It starts with INSERT,
# its WITH inside: its changes are what the cron reports.
ROLL_METRICS = (
    f"INSERT INTO d1queue_metrics ({METRICS_COLUMNS}) "
    + _walk_queues("d1queue_metrics")
    + _ROLL_HOUR
    + f"SELECT m.queue, {METRIC_HOUR_MS}, h.at, "
    f"m.name, {_ROLL_SUMS} FROM h, q JOIN d1queue_metrics m ON m.queue = q.name "
    f"AND m.period = {METRIC_MINUTE_MS} AND m.at >= h.at AND m.at < h.at + {METRIC_HOUR_MS} "
    "WHERE h.at <= ?1 GROUP BY m.queue, m.name "
    "ON CONFLICT (queue, period, at, name) DO NOTHING"
)
# After ROLL_METRICS in its batch: the cursor moves to the hour it rolled,
# if one was due. ?1 ?2 as ROLL_METRICS ?3 now. Reads as _ROLL_HOUR;
# writes the cursor's row at most once an hour, and never while no minute
# row waits (an idle queue's cron writes nothing).
ROLL_METRICS_MARK = (
    "INSERT INTO d1queue_meta (key, value, updated_at) "
    + _walk_queues("d1queue_metrics")
    + _ROLL_HOUR
    + f"SELECT '{METRICS_ROLLED_KEY}', CAST(h.at AS TEXT), ?3 FROM h WHERE h.at <= ?1 "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at"
)

# The cron's prune, bounded: at most ?3 series rows of period ?1 from
# before ?2, oldest first within each queue (the queues walked by seeks,
# each queue's rows of the period one range of the key), and none of an
# hour the rollup has not reached (past the cursor, read after
# ROLL_METRICS_MARK moved it; with no cursor, ?2 alone). D1 has no
# DELETE ... LIMIT: the bound is the subquery's. Reads the rows deleted
# and a few per queue; writes the rows deleted. A re-send deletes the next
# rows past the cutoff, if any: never a row younger than it.
PRUNE_METRICS = (
    "DELETE FROM d1queue_metrics WHERE (queue, period, at, name) IN ("
    + _walk_queues("d1queue_metrics")
    + "SELECT m.queue, m.period, m.at, m.name FROM q JOIN d1queue_metrics m "
    f"ON m.queue = q.name AND m.period = ?1 AND m.at < ?2 "
    f"AND m.at < COALESCE({_ROLL_CURSOR} + {METRIC_HOUR_MS}, ?2) LIMIT ?3)"
)

# -- a running job's progress (migrations/0013_attempt_history.sql) ----------
#
# A handler's progress report (ctx.progress, core/runs.py), with its
# attempt's log lines so far: written to the job it holds, found by its
# held key and fenced by its lease's token (a drain whose lease lapsed, its
# job claimed again, writes nothing), and only over a lower sequence number
# (the attempt's, times 2^20, plus its count of reports), so a write re-sent
# after a lost reply never moves the progress back. One seek: 1 row read,
# 1 row written (the column is in no index). Sent at most once per
# runs.PROGRESS_INTERVAL_S per job, and never by a handler that does not
# report progress. ?1 id ?2 reservation ?3 queue ?4 lease end ?5 progress
# (JSON) ?6 its sequence number
SET_PROGRESS = (
    f"UPDATE d1queue_jobs SET progress = ?5 WHERE {_held(3, 4, 1, 2)} "
    "AND reserved_at IS NOT NULL AND COALESCE(json_extract(progress, '$.seq') < ?6, 1)"
)

# -- the dashboard's "Running now" (d1queue/interfaces/dashboard/running.py) --------

_RUNNING_KEY = "queue, available_at, id"
_RUNNING_READ_COLUMNS = (
    "queue, available_at, id, name, grp, attempts, max_attempts, reserved_at, locked_until, "
    "cancel_at, progress, reservation"
)
# Held: a worker holds it (its lease not ended), or it is marked cancelling
# (_job_state's `reserved` and `cancelling`). ?5 now
_RUNNING_HELD = "reserved_at IS NOT NULL AND (locked_until > ?5 OR cancel_at IS NOT NULL)"
RUNNING_COLUMNS = (
    "queue, available_at, id, name, grp, attempts, max_attempts, reserved_at, cancel_at, "
    "substr(reservation, 1, 8) AS claim, "
    "json_extract(progress, '$.value') AS progress_value, "
    "json_extract(progress, '$.note') AS progress_note, "
    "json_extract(progress, '$.attempt') AS progress_attempt, "
    "json_extract(progress, '$.at') AS progress_at"
)

# The jobs in flight across queues, a page at a time, in the key's order
# (queue, lease end, id) after the cursor (?1 queue, ?2 lease end, ?3 id):
# the locked band read through the primary key, the cursor's queue from the
# cursor on, then each later queue's band (the queues found by a walk of
# the key's first column, about two rows read a queue). The band also holds
# the jobs waiting out a retry, which are read and passed over, so the read
# stops at ?4 rows (bounds.RUNNING_ROWS): a page reads at most that many
# jobs however many wait in the band.
_QUEUES_AFTER = (
    "WITH RECURSIVE q(name) AS (SELECT MIN(queue) FROM d1queue_jobs WHERE queue > ?1 "
    "UNION ALL SELECT (SELECT MIN(queue) FROM d1queue_jobs WHERE queue > q.name) FROM q "
    "WHERE q.name IS NOT NULL) SELECT name FROM q WHERE name IS NOT NULL"
)


def _locked_after(columns: str) -> str:
    """The capped read of the locked band after the cursor, in key order."""
    return (
        f"SELECT {columns} FROM (SELECT {columns} FROM d1queue_jobs WHERE queue = ?1 "
        f"AND band = {LOCKED_BAND} AND available_at >= ?2 AND (available_at > ?2 OR id > ?3) "
        f"UNION ALL SELECT {columns} FROM d1queue_jobs WHERE queue IN ({_QUEUES_AFTER}) "
        f"AND band = {LOCKED_BAND} ORDER BY {_RUNNING_KEY} LIMIT ?4)"
    )


# The held jobs read (at most ?6), with the progress report's value, note,
# attempt and time only, never its log lines. ?4 cap ?5 now ?6 limit
RUNNING_NOW = (
    f"SELECT {RUNNING_COLUMNS} FROM ({_locked_after(_RUNNING_READ_COLUMNS)}) "
    f"WHERE {_RUNNING_HELD} ORDER BY {_RUNNING_KEY} LIMIT ?6"
)
# Where the same read ends, and how many rows it reads (?4: more may
# follow): its last key as one text, each part sorting as the key does (a
# tab sorts before every character of a name; the time zero-padded). The
# key's columns alone: the primary key's entries, no row. ?1 ?2 ?3 ?4
RUNNING_SPAN = (
    "SELECT MAX(queue || char(9) || printf('%016d', available_at) || char(9) || id) AS last, "
    f"COUNT(*) AS scanned FROM ({_locked_after(_RUNNING_KEY)})"
)


# -- the dashboard's bulk actions and audit log (migrations/0015_audit.sql) ----


def _count(read: str) -> str:
    """How many of the rows `read` yields (at most ?2, newest id first,
    after ?1) match the search's filters (?3 to ?8 as _SEARCH_HIT; ?9 now):
    a bulk action's confirmation states it. Reads at most ?2 rows of one
    index, as the search's page does; `scanned` = ?2 says the read stopped
    before the end, so `matched` is a floor."""
    return (
        "SELECT COUNT(*) AS scanned, COALESCE(SUM(CASE WHEN "
        f"{_SEARCH_HIT} THEN 1 ELSE 0 END), 0) AS matched, ?9 AS now FROM ({read})"
    )


BULK_COUNT_LIVE = _count(_LIVE_READ)
BULK_COUNT_COMPLETED = _count(_COMPLETED_READ)
BULK_COUNT_FAILED = _count(_FAILED_READ)

# A run's record, on the home shard, written when its confirmation is sent.
# `OR IGNORE`: the confirmation re-sent after a lost reply finds its run's
# row (the run's id is made by the confirmation page) and writes nothing.
# One row and its `at` index entry written. ?1 run ?2 now ?3 who ?4 action
# ?5 source ?6 filter ?7 selected (JSON or NULL) ?8 matched ?9 capped
AUDIT_START = (
    "INSERT OR IGNORE INTO d1queue_audit (id, at, who, action, source, filter, selected, "
    "matched, capped, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?2)"
)
# Sent with AUDIT_START: at most ?2 runs (and guard rows) older than ?1
# deleted, oldest first, through the `at` index (reads at most ?2 + 1
# entries, writes at most ?2 rows). Safe to re-send. ?1 cutoff ?2 limit
PRUNE_AUDIT = (
    "DELETE FROM d1queue_audit WHERE id IN (SELECT id FROM d1queue_audit "
    "WHERE at < ?1 ORDER BY at LIMIT ?2)"
)
# A run's row on one shard: a point read. ?1 run
AUDIT_RUN = "SELECT * FROM d1queue_audit WHERE id = ?1"
# The first statement of a step's batch on the shard it acts on: the run's
# row there (the record on the home shard; a guard row, made here, on
# another) taken to step ?3 under the request's nonce ?4, with where the
# next step reads (?5 shard ?6 cursor ?7 finished), only from an earlier
# step: a step sent again (a lost reply, a second click) finds it taken
# and changes nothing, so no write of its batch (each checks the nonce,
# _LEASED) does anything. One row written. ?1 run ?2 now ?3 step ?4 nonce
# ?5 next shard ?6 next cursor ?7 finished
# Sent before AUDIT_TAKE_STEP: the lease dropped where the step is taken
# already. A batch re-sent as it was (the binding's own re-send after a lost
# reply, the same nonce) so finds no lease of its own, and writes nothing
# again, whatever happened meanwhile to its jobs (a job pushed again and
# claimed since is no longer in the id index that would refuse a second
# copy). One row read, at most one written. ?1 run ?2 step
AUDIT_DROP_LEASE = "UPDATE d1queue_audit SET lease = NULL WHERE id = ?1 AND step >= ?2"
AUDIT_TAKE_STEP = (
    "INSERT INTO d1queue_audit (id, at, who, action, source, filter, updated_at, step, lease, "
    "shard, cursor, finished, step_done) VALUES (?1, ?2, '', '', '', '', ?2, ?3, ?4, ?5, ?6, "
    "?7, 0) ON CONFLICT (id) DO UPDATE SET step = excluded.step, lease = excluded.lease, "
    "shard = excluded.shard, cursor = excluded.cursor, finished = excluded.finished, "
    "step_done = 0, updated_at = excluded.updated_at WHERE d1queue_audit.step < excluded.step"
)
# Right after each counted write of a step: what it changed (changes(): the
# statement before, in the same batch) added to the step's count, under
# the step's nonce. One row written. ?1 run ?2 nonce
AUDIT_COUNT = (
    "UPDATE d1queue_audit SET step_done = step_done + changes() WHERE id = ?1 AND lease = ?2"
)
# The step's end on the home shard: the run's total, the one before the
# step (?3, read at its start) and the step's count, so a copy of the same
# batch sets the same total. ?1 run ?2 nonce ?3 the total before
AUDIT_TOTAL = "UPDATE d1queue_audit SET done = ?3 + step_done WHERE id = ?1 AND lease = ?2"
# A step taken on another shard, recorded on the home shard from that
# shard's guard row (its count and where the next step reads, as the step
# that took it wrote them): only over step ?2 - 1, so a re-send records
# nothing twice. ?1 run ?2 step ?3 total ?4 next shard ?5 next cursor
# ?6 finished ?7 now
AUDIT_RECORD_STEP = (
    "UPDATE d1queue_audit SET step = ?2, done = ?3, shard = ?4, cursor = ?5, finished = ?6, "
    "updated_at = ?7 WHERE id = ?1 AND step = ?2 - 1"
)
# The Audit page: the runs newest first, keyset paged on (at, id) through
# the `at` index (its entries carry the key). ?1 cursor at ?2 cursor id
# ?3 limit (a page and one)
AUDIT_PAGE = (
    "SELECT * FROM d1queue_audit WHERE who <> '' AND (at < ?1 OR (at = ?1 AND id < ?2)) "
    "ORDER BY at DESC, id DESC LIMIT ?3"
)


def _leased(run: int) -> str:
    """A step's write goes ahead only for the request that took the step:
    its run's row here carries its nonce (?run the run, the next its nonce)."""
    return f"EXISTS (SELECT 1 FROM d1queue_audit WHERE id = ?{run} AND lease = ?{run + 1})"


# Each write of a step is one job's, by id, as the single actions' are,
# with _leased added. Run now: RUN_NOW's first (the id index; a job waiting
# out a retry is in no search). ?1 now ?2 id ?3 run ?4 nonce
BULK_RUN_NOW = RUN_NOW[0] + " AND " + _leased(3)
# Cancel: counted, ended (a workflow's job), deleted, as Admin.cancel does,
# but only a job no worker holds (a held one is left to its drain; the
# count says how many were cancelled). ?1 id [?2 minute] then the run, nonce
# The count reads the job through the id index only (a job waiting out a
# retry, in the locked band, is not cancelled by a bulk action: no walk of
# the locked bands a job).
BULK_METRICS_CANCELLED = METRICS_CANCELLED.replace(
    "WHERE true ON CONFLICT", f"WHERE {_leased(3)} ON CONFLICT"
).replace(_CANCELLED_JOB, CANCEL_JOBS[0].replace("DELETE FROM", "SELECT queue, name FROM"))
BULK_END_CANCELLED = END_CANCELLED[0] + " AND " + _leased(2)
BULK_CANCEL = CANCEL_JOBS[0] + " AND " + _leased(2)
# Retry a failure: RETRY_FAILED_INSERT, but an id queued again meanwhile
# inserts nothing (rather than failing the step's whole batch), and the
# failure is deleted only when its insert was done (changes(), the
# statement before). ?1 now ?2 id ?3 allowances ?4 default ?5 run ?6 nonce
BULK_RETRY_FAILED = RETRY_FAILED_INSERT + " AND " + _leased(5) + " ON CONFLICT DO NOTHING"
# ?1 id ?2 run ?3 nonce
BULK_RETRY_FAILED_DELETE = RETRY_FAILED_DELETE + " AND changes() = 1 AND " + _leased(2)
BULK_DELETE_FAILED = DELETE_FAILED + " AND " + _leased(2)
# Push a completed job again: a fresh job of its id, queue, name, payload,
# priority and group, due now, outside any workflow (no `after`, no batch,
# no unique key), its attempts from zero; the kept completion stays as
# history. The done index finds the row (1 read); 2 rows written (the row
# and its id-index entry). An id queued meanwhile inserts nothing.
# ?1 now ?2 id ?3 run ?4 nonce
BULK_PUSH_AGAIN = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, unique_key, last_error, band, grp, traceparent) "
    "SELECT id, queue, name, payload, 0, max_attempts, priority, ?1, ?1, NULL, NULL, priority, "
    f"grp, traceparent FROM d1queue_jobs WHERE id = ?2 AND band = {DONE_BAND} AND "
    + _leased(3)
    + " LIMIT 1 ON CONFLICT DO NOTHING"
)
# Delete a completed job kept as history, as the cron's prune does: its
# edges (but while a job of its id is queued again, through the id index,
# whose waiters they may be), then its row (through the done index).
# ?1 id ?2 run ?3 nonce
BULK_DELETE_DONE_EDGES = (
    "DELETE FROM d1queue_deps WHERE dep = ?1 AND NOT EXISTS (SELECT 1 FROM d1queue_jobs "
    f"WHERE id = ?1 AND {LISTED}) AND " + _leased(2)
)
BULK_DELETE_DONE = f"DELETE FROM d1queue_jobs WHERE id = ?1 AND band = {DONE_BAND} AND " + _leased(
    2
)

_VERBS = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "REPLACE")


def _name_statements(scope: dict[str, Any]) -> None:
    """Every statement constant above (a str, or a tuple of them, whose text
    is a statement) made an Sql carrying its name. Run last: the constants
    built from others were built from the plain text, which is the same."""
    for key, value in list(scope.items()):
        if not key.isupper() or key.startswith("_"):
            continue
        if isinstance(value, str) and value.lstrip().upper().startswith(_VERBS):
            scope[key] = Sql(value, key)
        elif (
            isinstance(value, tuple)
            and value
            and all(isinstance(v, str) and v.lstrip().upper().startswith(_VERBS) for v in value)
        ):
            scope[key] = tuple(Sql(v, f"{key}[{i}]") for i, v in enumerate(value))


_name_statements(globals())
