-- The jobs table keyed in the order the claim reads it, so a job's life
-- writes 4 rows (D1 bills each row changed and each index entry inserted):
-- the push writes the row and its id-index entry, the claim and the
-- completion one row each. Nothing a claim or a retry within a lease changes
-- is in a key, so neither moves the row or touches an index.
--
-- The key: (queue, band DESC, available_at, id).
--   band is the job's priority when it was due as it was pushed, and -1001
--   (below every priority, see bounds.PRIORITY_RANGE and sql.DELAYED_BAND)
--   when it was pushed to wait. So per queue the key holds the ready band,
--   highest priority first, oldest first, and after it the delayed band,
--   soonest first. A claim reads the head of each: however many jobs wait for
--   a later time, none of them is read (the delayed band is read as a range,
--   `available_at <= now`, and the ready band holds no future jobs).
--   locked_until says when a row may be claimed: 0 for a free job, the
--   lease's end while a worker holds it, the retry time after a short retry.
--   A claim skips locked rows as it reads them, so a lapsed lease is
--   reclaimed by the next claim that meets it, with no lease index to keep.
--
-- Existing rows move over unchanged: a delayed job (available_at in the
-- future) goes to the delayed band, a held one keeps its lease and token.

CREATE TABLE d1queue_jobs_v3 (
    queue          TEXT    NOT NULL,
    band           INTEGER NOT NULL,           -- priority, or -1001: pushed to wait
    available_at   INTEGER NOT NULL,           -- when it was (or will be) due
    id             TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    payload        TEXT    NOT NULL,           -- JSON text
    attempts       INTEGER NOT NULL DEFAULT 0, -- claims so far; also the row's version for claims
    max_attempts   INTEGER NOT NULL,
    priority       INTEGER NOT NULL DEFAULT 0, -- higher runs first
    locked_until   INTEGER NOT NULL DEFAULT 0, -- not claimable before (lease end, retry time)
    reserved_at    INTEGER,                    -- set while a worker holds the job
    reservation    TEXT,                       -- fencing token of the current (or last) lease
    created_at     INTEGER NOT NULL,
    unique_key     TEXT,                       -- the uniqueness lock this job holds
    last_error     TEXT,
    PRIMARY KEY (queue, band DESC, available_at, id)
) WITHOUT ROWID;

INSERT INTO d1queue_jobs_v3 (queue, band, available_at, id, name, payload, attempts,
    max_attempts, priority, locked_until, reserved_at, reservation, created_at, unique_key,
    last_error)
SELECT queue,
       CASE WHEN available_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
            THEN -1001 ELSE priority END,
       available_at, id, name, payload, attempts, max_attempts, priority,
       CASE WHEN reserved_at IS NOT NULL THEN COALESCE(reserved_until, 0) ELSE 0 END,
       reserved_at, reservation, created_at, unique_key, last_error
FROM d1queue_jobs;

DROP TABLE d1queue_jobs;
ALTER TABLE d1queue_jobs_v3 RENAME TO d1queue_jobs;

-- Lookup by id (status, cancel, settling a held job): one index entry per
-- job, written at push and never again, since an id's key does not change
-- while the job stays where it was pushed.
CREATE UNIQUE INDEX d1queue_jobs_id ON d1queue_jobs (id);

-- The uniqueness lock. A second dispatch with a key held by a queued job
-- inserts nothing; the lock goes when the row goes (acknowledged or failed).
CREATE UNIQUE INDEX d1queue_jobs_unique
    ON d1queue_jobs (unique_key)
    WHERE unique_key IS NOT NULL;
