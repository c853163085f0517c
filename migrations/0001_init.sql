-- d1queue's tables. Prefixed so they can live in the application's own D1
-- database. Timestamps are integer epoch milliseconds: sortable, compact and
-- exact in JavaScript (far below 2^53).

CREATE TABLE d1queue_jobs (
    id             TEXT    PRIMARY KEY NOT NULL,
    queue          TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    payload        TEXT    NOT NULL,           -- JSON text
    attempts       INTEGER NOT NULL DEFAULT 0, -- claims so far; also the row's version for claims
    max_attempts   INTEGER NOT NULL,
    priority       INTEGER NOT NULL DEFAULT 0, -- higher runs first
    available_at   INTEGER NOT NULL,
    reserved_at    INTEGER,                    -- NULL while the job is free
    reserved_until INTEGER,                    -- when the current lease lapses
    reservation    TEXT,                       -- fencing token of the current lease
    created_at     INTEGER NOT NULL,
    unique_key     TEXT,                       -- the uniqueness lock this job holds
    last_error     TEXT
) WITHOUT ROWID;
-- WITHOUT ROWID: the row lives in the primary key's B-tree, so a TEXT id
-- needs no second index beside it. A push writes the row and its ready-index
-- entry, 2 rows instead of 3 (D1 bills index entries as rows written).

-- The ready index. Partial, so a reserved row has no entry in it: selecting
-- candidates reads about as many rows as it returns however deep the backlog
-- of claimed work, and a claim or release writes one entry, not a reshuffle.
-- Ordered as the claim query reads it: highest priority, then oldest, then
-- id (the primary key every entry carries; ids sort by creation).
CREATE INDEX d1queue_jobs_ready
    ON d1queue_jobs (queue, priority DESC, available_at)
    WHERE reserved_at IS NULL;

-- The lease index: only reserved rows, so reclaiming expired leases reads the
-- jobs in flight, not the backlog.
CREATE INDEX d1queue_jobs_lease
    ON d1queue_jobs (reserved_until)
    WHERE reserved_at IS NOT NULL;

-- The uniqueness lock. A second dispatch with a key held by a queued job
-- inserts nothing; the lock goes when the row goes (acknowledged or failed).
CREATE UNIQUE INDEX d1queue_jobs_unique
    ON d1queue_jobs (unique_key)
    WHERE unique_key IS NOT NULL;

CREATE TABLE d1queue_failed_jobs (
    id           TEXT    PRIMARY KEY NOT NULL, -- the id it had while queued
    queue        TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    error        TEXT    NOT NULL,
    attempts     INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    priority     INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    failed_at    INTEGER NOT NULL
) WITHOUT ROWID;

-- Newest-first listing, overall and per queue, and pruning by age.
-- id is in the key so pages ordered by (failed_at, id) need no sort.
CREATE INDEX d1queue_failed_jobs_failed_at ON d1queue_failed_jobs (failed_at, id);
CREATE INDEX d1queue_failed_jobs_queue ON d1queue_failed_jobs (queue, failed_at, id);
