-- Recurring schedules: one row per schedule, whether declared in
-- code (source 'code', synced by the cron) or created over the API ('api').
--
-- next_run_at is the schedule's next slot (epoch ms): the cron reads the due
-- ones through d1queue_schedules_due, so evaluating schedules reads about as
-- many rows as are due, however many schedules exist. Advancing it is a
-- compare-and-set on its old value (and on version), in the same transaction
-- as the slot's job insert: two cron runs that read the same slot cannot
-- both enqueue it, even after the first one's job has completed and released
-- its unique key.
CREATE TABLE d1queue_schedules (
    id          TEXT    PRIMARY KEY NOT NULL,
    cron        TEXT    NOT NULL,                -- 5 fields, or @hourly, @daily...
    tz          TEXT    NOT NULL DEFAULT 'UTC',  -- IANA zone the cron is read in
    name        TEXT    NOT NULL,                -- the job name each slot enqueues
    queue       TEXT,                            -- NULL: the job's registered queue
    payload     TEXT    NOT NULL,                -- JSON text
    catch_up    TEXT    NOT NULL DEFAULT 'none', -- 'none' | 'latest' | 'all'
    paused      INTEGER NOT NULL DEFAULT 0,
    source      TEXT    NOT NULL,                -- 'code' | 'api'
    version     TEXT    NOT NULL,                -- hash of the definition above
    next_run_at INTEGER NOT NULL,
    last_run_at INTEGER,                         -- the last slot enqueued
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
) WITHOUT ROWID;

-- The due index. Partial, so a paused schedule is never read by the cron.
-- Advancing a schedule rewrites its entry: 2 rows written per slot (the row
-- and the entry), beside the job's own.
CREATE INDEX d1queue_schedules_due ON d1queue_schedules (next_run_at) WHERE paused = 0;

-- Small facts the cron reads beside the due schedules, in the same round
-- trip: 'schedules.code' holds the hash of the code-declared set last synced,
-- so a cron run writes nothing for code-declared schedules unless the set a
-- deployment declares changed.
CREATE TABLE d1queue_meta (
    key        TEXT    PRIMARY KEY NOT NULL,
    value      TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
