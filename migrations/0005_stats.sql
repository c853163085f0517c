-- Per-minute counters the drain records for the dashboard's chart and its
-- "done in the last hour / day" figures: what each cron run completed,
-- retried and failed, in total and per queue.
--
-- A ring of 1,440 rows, one per minute of the last day, keyed by
-- minute % 1440: a run adds its counts to its minute's row with one UPSERT
-- (one row written, at most), and the row of the same slot a day earlier is
-- overwritten rather than deleted, so the table never grows and needs no
-- pruning. INTEGER PRIMARY KEY: the row is its key, no index entry to write.
-- (0004 is the recurring schedules' migration.)
CREATE TABLE d1queue_stats (
    slot      INTEGER PRIMARY KEY NOT NULL,  -- minute % 1440
    minute    INTEGER NOT NULL,              -- epoch minutes of the counts below
    completed INTEGER NOT NULL DEFAULT 0,
    retried   INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0,
    queues    TEXT    NOT NULL DEFAULT '{}', -- {"queue": [completed, retried, failed]}
    run       TEXT    NOT NULL               -- the last run that added to this row
);
