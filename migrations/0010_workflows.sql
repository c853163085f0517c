-- Workflows: results and completed history, dependencies, batches.
--
-- A completed job is kept: its row moves to the done band (-1004, below
-- every other band, sql.DONE_BAND), keyed by when it completed, with the
-- handler's return value in `result`. Moving the row is the one row a
-- completion wrote before (the DELETE); the done index's entry is one more.
-- The cron deletes the band's rows past D1QUEUE_KEEP_COMPLETED_S. A queue
-- whose history is off deletes as before.
--
-- A job pushed with `after` waits in the waiting band (-1003,
-- sql.WAITING_BAND) with `waiting` = how many of its dependencies have not
-- ended; -1 says one failed: the drain fails the job instead of running it.
-- d1queue_deps holds an edge per (dependency, waiter), keyed by the
-- dependency, and a dependency's row says it has waiters (`dependents`).
--
-- A batch's counters live in d1queue_batches (one small row), its members'
-- ids and callbacks in d1queue_batch_parts (read only when a callback fires
-- or someone asks).
--
-- The end of a job with waiters or a batch is counted by the trigger below,
-- in the statement that marks it ended (`ended`: 1 completed and kept, 3
-- completed and deleted next, 2 failed, cancelled or cleared), sent in the
-- same transaction as the statement that moves or deletes it. So it is
-- counted exactly once, whatever re-sends D1 makes: a re-sent settle finds
-- the job gone from its held key and changes nothing, so nothing fires
-- again. Every other job is moved or deleted by statements that do not set
-- `ended`: a DELETE has no trigger, so SQLite deletes a claim batch's jobs
-- in one pass as before, reading one row each.
--
-- Existing rows: nothing moves. The id index is rebuilt to hold the
-- waiting band too, and the unique index leaves out the done band (a
-- completed job releases its key, as the DELETE did).

ALTER TABLE d1queue_jobs ADD COLUMN result TEXT;
ALTER TABLE d1queue_jobs ADD COLUMN after TEXT;
ALTER TABLE d1queue_jobs ADD COLUMN waiting INTEGER NOT NULL DEFAULT 0;
ALTER TABLE d1queue_jobs ADD COLUMN ignore_failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE d1queue_jobs ADD COLUMN dependents INTEGER NOT NULL DEFAULT 0;
ALTER TABLE d1queue_jobs ADD COLUMN batch TEXT;
ALTER TABLE d1queue_jobs ADD COLUMN ended INTEGER NOT NULL DEFAULT 0;
ALTER TABLE d1queue_failed_jobs ADD COLUMN batch TEXT;
ALTER TABLE d1queue_failed_jobs ADD COLUMN after TEXT;

DROP INDEX d1queue_jobs_id;
CREATE UNIQUE INDEX d1queue_jobs_id ON d1queue_jobs (id) WHERE band > -1002 OR band = -1003;

-- Completed jobs by id (GET /v1/jobs/{id}, a dependency's result). Not
-- unique: an id pushed again after its job completed completes again.
CREATE INDEX d1queue_jobs_done ON d1queue_jobs (id) WHERE band = -1004;

DROP INDEX d1queue_jobs_unique;
CREATE UNIQUE INDEX d1queue_jobs_unique
    ON d1queue_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND band > -1004 AND (debounce = 0 OR band > -1002);

CREATE TABLE d1queue_deps (
    dep     TEXT NOT NULL,  -- the job waited for
    waiter  TEXT NOT NULL,  -- the job waiting
    PRIMARY KEY (dep, waiter)
) WITHOUT ROWID;

CREATE TABLE d1queue_batches (
    id          TEXT    PRIMARY KEY NOT NULL,
    total       INTEGER NOT NULL,
    pending     INTEGER NOT NULL,
    completed   INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    fired       INTEGER NOT NULL DEFAULT 0,  -- callbacks enqueued: 1 on_success, 2 on_failure, 4 on_finish
    created_at  INTEGER NOT NULL,
    finished_at INTEGER                      -- when pending reached 0
) WITHOUT ROWID;

CREATE INDEX d1queue_batches_finished ON d1queue_batches (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE d1queue_batch_parts (
    id          TEXT PRIMARY KEY NOT NULL,   -- the batch's id
    ids         TEXT NOT NULL,               -- its jobs' ids, a JSON array
    on_success  TEXT,                        -- a callback's row: [id, queue, name, payload, max_attempts, priority, unique_key]
    on_failure  TEXT,
    on_finish   TEXT
) WITHOUT ROWID;

-- A job joins a batch only while the batch runs (a job of it is pending):
-- a finished batch has fired its callbacks, and a job added then would
-- never be counted. RAISE aborts the push's whole db.batch: nothing is
-- written.
CREATE TRIGGER d1queue_jobs_join BEFORE INSERT ON d1queue_jobs
WHEN NEW.batch IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM d1queue_batches WHERE id = NEW.batch AND pending > 0)
BEGIN
    SELECT RAISE(ABORT, 'd1queue: batch not running');
END;

-- A job with waiters or a batch ended. Its waiters count a completion, and
-- a failure too with ignore_failed (one row each, found by key; the last
-- it waited for moves to its band: ready, delayed or grouped); otherwise a
-- waiter is doomed (waiting -1, ready now, its error said) and the drain
-- fails it, which dooms its own waiters in turn. Its edges go with it,
-- unless it is kept as completed (a dependent's page links to it). Its
-- batch counts it, and a callback whose condition now holds is enqueued,
-- once: `fired` records it in the same statement (on_failure at the first
-- failure, on_success and on_finish when none is pending).
CREATE TRIGGER d1queue_jobs_ended AFTER UPDATE OF ended ON d1queue_jobs
WHEN OLD.ended = 0 AND NEW.ended > 0
BEGIN
    UPDATE d1queue_jobs SET waiting = waiting - 1,
        band = CASE WHEN waiting > 1 THEN -1003
            WHEN available_at > created_at THEN -1001
            WHEN grp IS NOT NULL THEN priority + 3001 ELSE priority END
    WHERE id IN (SELECT waiter FROM d1queue_deps WHERE dep = OLD.id) AND band = -1003
        AND (NEW.ended <> 2 OR ignore_failed = 1);
    UPDATE d1queue_jobs SET waiting = -1, last_error = 'dependency ' || OLD.id || ' failed',
        band = CASE WHEN grp IS NOT NULL THEN priority + 3001 ELSE priority END
    WHERE id IN (SELECT waiter FROM d1queue_deps WHERE dep = OLD.id) AND band = -1003
        AND NEW.ended = 2 AND ignore_failed = 0;
    DELETE FROM d1queue_deps WHERE dep = OLD.id AND NEW.ended <> 1;
    UPDATE d1queue_batches SET pending = pending - 1, completed = completed + (NEW.ended <> 2),
        failed = failed + (NEW.ended = 2)
    WHERE id = OLD.batch;
    INSERT OR IGNORE INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts,
        priority, available_at, created_at, unique_key, band)
    SELECT json_extract(c.spec, '$[0]'), json_extract(c.spec, '$[1]'),
        json_extract(c.spec, '$[2]'), json_extract(c.spec, '$[3]'), 0,
        json_extract(c.spec, '$[4]'), json_extract(c.spec, '$[5]'),
        CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER),
        CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER),
        json_extract(c.spec, '$[6]'), json_extract(c.spec, '$[5]')
    FROM d1queue_batches b JOIN (
        SELECT 1 AS bit, on_success AS spec FROM d1queue_batch_parts WHERE id = OLD.batch
        UNION ALL SELECT 2, on_failure FROM d1queue_batch_parts WHERE id = OLD.batch
        UNION ALL SELECT 4, on_finish FROM d1queue_batch_parts WHERE id = OLD.batch
    ) c ON c.spec IS NOT NULL
    WHERE b.id = OLD.batch AND b.fired & c.bit = 0 AND (
        (c.bit = 1 AND b.pending = 0 AND b.failed = 0)
        OR (c.bit = 2 AND b.failed > 0)
        OR (c.bit = 4 AND b.pending = 0));
    UPDATE d1queue_batches SET
        fired = fired | CASE WHEN failed > 0 THEN 2 ELSE 0 END
            | CASE WHEN pending = 0 AND failed = 0 THEN 1 ELSE 0 END
            | CASE WHEN pending = 0 THEN 4 ELSE 0 END,
        finished_at = CASE WHEN pending = 0 AND finished_at IS NULL
            THEN CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)
            ELSE finished_at END
    WHERE id = OLD.batch;
END;
