"""Every SQL statement d1queue sends, named and parameterised, in one place.

Only `?NNN` parameters (D1 supports no named ones), no `RETURNING`, no
`FOR UPDATE`: the claim protocol is plain conditional UPDATEs whose
`meta.changes` decides who won, so it works on any SQLite-shaped backend.
Each statement binds at most a handful of values, far below D1's limit of
100 bound parameters per query.
"""

from __future__ import annotations

JOB_COLUMNS = (
    "id, queue, name, payload, attempts, max_attempts, priority, available_at, "
    "reserved_at, reserved_until, reservation, created_at, unique_key, last_error"
)

FAILED_COLUMNS = (
    "id, queue, name, payload, error, attempts, max_attempts, priority, created_at, failed_at"
)

# ?1 id ?2 queue ?3 name ?4 payload ?5 attempts ?6 max_attempts ?7 priority
# ?8 available_at ?9 created_at ?10 unique_key
# `ON CONFLICT DO NOTHING`: a unique_key already held by a queued job makes
# this insert nothing (changes == 0) instead of failing the request.
INSERT_JOB = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, unique_key) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING"
)

# Sent in the same batch as INSERT_JOB: the id now holding the key — ours if
# the insert won, the earlier job's if it was a duplicate. One round trip.
SELECT_UNIQUE_HOLDER = "SELECT id FROM d1queue_jobs WHERE unique_key = ?1"

# Candidates, read from the partial ready index in its own order, so SQLite
# stops after ?3 matching entries and needs no temporary B-tree to sort.
# ?1 queue ?2 now ?3 limit
SELECT_CANDIDATES = (
    f"SELECT {JOB_COLUMNS} FROM d1queue_jobs "
    "WHERE queue = ?1 AND reserved_at IS NULL AND available_at <= ?2 "
    "ORDER BY priority DESC, available_at, id LIMIT ?3"
)

# The claim. `reserved_at IS NULL` makes exactly one of several racing
# workers change the row; `attempts = ?5` (attempts only ever grows, once per
# claim) makes the claim fail if the row was claimed and released again since
# we read it, so the job we hand out is exactly the row we read. Re-sent after
# a reply was lost, it finds its own fresh token (`reservation = ?3`) and sets
# the same values again: one attempt, not two, and the claim is still ours.
# ?1 now ?2 reserved_until ?3 reservation ?4 id ?5 attempts as read
CLAIM = (
    "UPDATE d1queue_jobs SET attempts = ?5 + 1, reserved_at = ?1, "
    "reserved_until = ?2, reservation = ?3 "
    "WHERE id = ?4 AND ((reserved_at IS NULL AND attempts = ?5) OR reservation = ?3)"
)

# Undoing a claim whose reply never came (the batch failed after it may have
# committed): the job goes back as it was read, its attempt not spent.
# ?1 attempts as read ?2 id ?3 reservation
UNCLAIM = (
    "UPDATE d1queue_jobs SET attempts = ?1, reserved_at = NULL, reserved_until = NULL, "
    "reservation = NULL WHERE id = ?2 AND reservation = ?3"
)

# Every step after the claim is fenced by the reservation token: a worker
# whose lease lapsed, and whose job was reclaimed and claimed again, matches
# no row and changes nothing.
# ?1 id ?2 reservation
ACKNOWLEDGE = "DELETE FROM d1queue_jobs WHERE id = ?1 AND reservation = ?2"

# The token stays on a released row (reserved_at alone says whether a job is
# held), so a release re-sent after its reply was lost matches again and
# reports the job as released by us; the next claim replaces the token.
# ?1 available_at ?2 last_error (NULL keeps the previous one) ?3 id ?4 reservation
RELEASE = (
    "UPDATE d1queue_jobs SET reserved_at = NULL, reserved_until = NULL, "
    "available_at = ?1, last_error = COALESCE(?2, last_error) "
    "WHERE id = ?3 AND reservation = ?4"
)

# Failing is FAIL_RECORD then ACKNOWLEDGE in one db.batch (a transaction):
# the copy is read from the fenced row itself, so a stale holder records
# nothing, and a fault in either statement leaves the job where it was.
# OR REPLACE: a job id that failed before (and was pushed again under the same
# id) keeps one failure record, the latest.
# ?1 error ?2 failed_at ?3 id ?4 reservation
FAIL_RECORD = (
    f"INSERT OR REPLACE INTO d1queue_failed_jobs ({FAILED_COLUMNS}) "
    "SELECT id, queue, name, payload, ?1, attempts, max_attempts, priority, created_at, ?2 "
    "FROM d1queue_jobs WHERE id = ?3 AND reservation = ?4"
)

# Unreserved jobs on a queue (delayed ones included), as the seed counts
# size. Answered from the ready index alone.
COUNT_UNRESERVED = "SELECT COUNT(*) AS n FROM d1queue_jobs WHERE queue = ?1 AND reserved_at IS NULL"

CLEAR_QUEUE = "DELETE FROM d1queue_jobs WHERE queue = ?1"

# One UPDATE over the lease index frees every lease that lapsed: its worker
# died or overran. attempts is left as it is, so a job that keeps killing
# its worker runs out of attempts (see D1Queue.reserve_batch). The note goes
# before the error the job had, which is kept (cut at 4,000 characters), so
# the failure record of a job that also crashed still names its real cause.
# ?1 now ?2 the note
RECLAIM_EXPIRED = (
    "UPDATE d1queue_jobs SET reserved_at = NULL, reserved_until = NULL, reservation = NULL, "
    "last_error = CASE "
    "WHEN last_error IS NULL THEN ?2 "
    "WHEN substr(last_error, 1, length(?2)) = ?2 THEN last_error "
    "ELSE substr(?2 || '; before that: ' || last_error, 1, 4000) END "
    "WHERE reserved_at IS NOT NULL AND reserved_until < ?1"
)

SELECT_JOB = f"SELECT {JOB_COLUMNS} FROM d1queue_jobs WHERE id = ?1"

# ?1 limit
LIST_FAILED = (
    f"SELECT {FAILED_COLUMNS} FROM d1queue_failed_jobs ORDER BY failed_at DESC, id DESC LIMIT ?1"
)

# Retrying a failure is RETRY_FAILED_INSERT then RETRY_FAILED_DELETE in one
# batch. As in the seed, the job gets one fresh attempt and does not take its
# uniqueness lock again: the lock was released when it failed, and re-taking
# it could make the retry lose to a fresh dispatch made in between.
# ?1 now ?2 id
RETRY_FAILED_INSERT = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, unique_key, last_error) "
    "SELECT id, queue, name, payload, 0, 1, priority, ?1, ?1, NULL, error "
    "FROM d1queue_failed_jobs WHERE id = ?2"
)
RETRY_FAILED_DELETE = "DELETE FROM d1queue_failed_jobs WHERE id = ?1"

# -- the API's statements ----------------------------------------------------

JOB_VALUES = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
JOB_PARAMS = 10
INSERT_ROWS_PER_STATEMENT = 100 // JOB_PARAMS
"""D1 binds at most 100 parameters per statement: ten 10-value rows."""


def insert_jobs(n: int, *, unique: bool) -> str:
    """A multi-row INSERT_JOB for `n` (<= INSERT_ROWS_PER_STATEMENT) jobs.
    `unique`: the rows carry unique keys and a held key skips its row;
    otherwise any conflict (a reused id) fails the statement and its batch,
    so a batch is stored whole or not at all."""
    if not 1 <= n <= INSERT_ROWS_PER_STATEMENT:
        raise ValueError(f"1..{INSERT_ROWS_PER_STATEMENT} rows per statement, not {n}")
    return (
        "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
        "available_at, created_at, unique_key) VALUES "
        + ", ".join([JOB_VALUES] * n)
        + (" ON CONFLICT DO NOTHING" if unique else "")
    )


def select_job_ids(n: int) -> str:
    """Which of `n` job ids are still queued (n <= 100, D1's parameter limit):
    after a re-sent settle, a row gone is a write of ours that landed."""
    if not 1 <= n <= 100:
        raise ValueError(f"1..100 ids per statement, not {n}")
    return "SELECT id FROM d1queue_jobs WHERE id IN (" + ", ".join(["?"] * n) + ")"


def select_unique_holders(n: int) -> str:
    """The ids holding `n` unique keys (n <= 100, D1's parameter limit)."""
    if not 1 <= n <= 100:
        raise ValueError(f"1..100 keys per statement, not {n}")
    return (
        "SELECT id, unique_key FROM d1queue_jobs WHERE unique_key IN (" + ", ".join(["?"] * n) + ")"
    )


# Counts per queue by state, from the indexes: the ready index for unreserved
# jobs (reads every unreserved row of the queue — counting cannot do less),
# the lease index for jobs in flight. ?1 now
UNRESERVED_STATS = (
    "SELECT queue, SUM(available_at <= ?1) AS ready, SUM(available_at > ?1) AS delayed, "
    "MIN(CASE WHEN available_at <= ?1 THEN available_at END) AS oldest_ready_at "
    "FROM d1queue_jobs WHERE reserved_at IS NULL GROUP BY queue"
)
# ?1 now ?2 queue
UNRESERVED_STATS_ONE = UNRESERVED_STATS.replace("WHERE ", "WHERE queue = ?2 AND ")
RESERVED_COUNTS = (
    "SELECT queue, COUNT(*) AS reserved FROM d1queue_jobs "
    "WHERE reserved_at IS NOT NULL GROUP BY queue"
)
FAILED_COUNTS = "SELECT queue, COUNT(*) AS failed FROM d1queue_failed_jobs GROUP BY queue"
FAILED_COUNT_ONE = "SELECT queue, COUNT(*) AS failed FROM d1queue_failed_jobs WHERE queue = ?1"
QUEUE_STATES = "SELECT name, paused FROM d1queue_queues"
PAUSED_QUEUES = "SELECT name FROM d1queue_queues WHERE paused = 1"

# ?1 name ?2 paused (0/1) ?3 now
SET_PAUSED = (
    "INSERT INTO d1queue_queues (name, paused, updated_at) VALUES (?1, ?2, ?3) "
    "ON CONFLICT (name) DO UPDATE SET paused = ?2, updated_at = ?3"
)

# Cancelling: only a job no worker holds. Sent with SELECT_JOB in one batch,
# so a miss can say whether the job is running (409) or gone (404).
CANCEL_JOB = "DELETE FROM d1queue_jobs WHERE id = ?1 AND reserved_at IS NULL"

# Newest first, paged by (failed_at, id) so a page boundary never skips or
# repeats a row. ?1 cursor failed_at ?2 cursor id ?3 limit [?4 queue]
LIST_FAILED_PAGE = (
    f"SELECT {FAILED_COLUMNS} FROM d1queue_failed_jobs "
    "WHERE (failed_at, id) < (?1, ?2) ORDER BY failed_at DESC, id DESC LIMIT ?3"
)
LIST_FAILED_PAGE_IN_QUEUE = LIST_FAILED_PAGE.replace("WHERE ", "WHERE queue = ?4 AND ")
SELECT_FAILED = f"SELECT {FAILED_COLUMNS} FROM d1queue_failed_jobs WHERE id = ?1"
DELETE_FAILED = RETRY_FAILED_DELETE
# ?1 cutoff
PRUNE_FAILED = "DELETE FROM d1queue_failed_jobs WHERE failed_at < ?1"
