-- The dashboard's audit log of bulk actions, and the guard that makes each
-- step of one safe to re-send.
--
-- A bulk action (cancel, run now, retry, delete on the jobs a filter
-- matches, or on a selection) is a run: a row here on the home shard
-- (shard 0), written when its confirmation is sent, saying who (the
-- session's role), what, when, the filter, the count its confirmation
-- stated and how many it did so far. It acts in steps of at most a page of
-- jobs, each step one transaction on one shard: the step takes the run's
-- row on that shard (the record on the home shard, a guard row of the same
-- id on another) from step n-1 to n under the request's own nonce
-- (`lease`), and every write of the step checks that nonce; a re-sent step
-- finds the step taken and writes nothing. A guard row on another shard
-- has an empty `who` and is never listed.
--
-- Bounded: each new run deletes at most a few rows older than the
-- retention (bounds.AUDIT_KEEP_S), oldest first, through the index on `at`.
-- WITHOUT ROWID: the row is its key, a point read one seek.
CREATE TABLE d1queue_audit (
    id         TEXT    PRIMARY KEY NOT NULL,  -- the run's id (made by its confirmation page)
    at         INTEGER NOT NULL,              -- epoch ms: the run's start
    who        TEXT    NOT NULL,              -- the session's role ('' : a guard row)
    action     TEXT    NOT NULL,              -- cancel, run, retry, delete
    source     TEXT    NOT NULL,              -- live, failed, completed
    filter     TEXT    NOT NULL,              -- the search acted on ('' : a selection)
    selected   TEXT,                          -- the selected ids (JSON array), NULL: the filter's
    matched    INTEGER NOT NULL DEFAULT 0,    -- the count the confirmation stated
    capped     INTEGER NOT NULL DEFAULT 0,    -- 1: that count is a floor (its read was capped)
    step       INTEGER NOT NULL DEFAULT 0,    -- steps taken
    shard      INTEGER NOT NULL DEFAULT 0,    -- the shard the next step acts on
    cursor     TEXT    NOT NULL DEFAULT '~',  -- the id after which the next step reads
    finished   INTEGER NOT NULL DEFAULT 0,    -- 1: nothing left to do
    done       INTEGER NOT NULL DEFAULT 0,    -- jobs acted on, in total
    step_done  INTEGER NOT NULL DEFAULT 0,    -- jobs acted on by the last step taken here
    lease      TEXT,                          -- the nonce of the request that took the last step
    updated_at INTEGER NOT NULL               -- epoch ms: the last step
) WITHOUT ROWID;

CREATE INDEX d1queue_audit_at ON d1queue_audit (at);
