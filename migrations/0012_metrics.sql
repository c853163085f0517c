-- Job metrics (core/metrics.py, store/metrics.py): per queue and job name,
-- counts by outcome and histograms of wait (due -> started) and run
-- (started -> outcome) time, in the fixed buckets of core/metrics.py
-- BUCKETS_S (one column each, the last the overflow), with their sums.
--
-- One table, three shapes told apart by `period`:
--   0          the all-time totals (at = 0): monotonic, for scrapers;
--   60000      one row per minute (at = the minute's start, epoch ms), kept
--              3 hours;
--   3600000    one row per hour, rolled up from the minutes by the cron and
--              kept 30 days.
-- The settle batch adds to a (queue, name)'s totals row and its minute row
-- with one UPSERT per round (sql.METRICS_HELD, METRICS_ACKED): a row
-- written each, whatever the number of jobs. WITHOUT ROWID keyed by
-- (queue, period, at, name): the row is its key, no index entry to write,
-- and one queue's window is one range of the key. A new table: nothing
-- earlier moves.
CREATE TABLE d1queue_metrics (
    queue     TEXT    NOT NULL,
    period    INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    name      TEXT    NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0,
    retried   INTEGER NOT NULL DEFAULT 0,
    failed    INTEGER NOT NULL DEFAULT 0,
    cancelled INTEGER NOT NULL DEFAULT 0,
    wait_ms   REAL    NOT NULL DEFAULT 0,   -- the sum of the waits observed
    run_ms    REAL    NOT NULL DEFAULT 0,   -- the sum of the runs observed
    w0   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.001 s
    w1   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.0025 s
    w2   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.005 s
    w3   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.01 s
    w4   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.025 s
    w5   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.05 s
    w6   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.1 s
    w7   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.25 s
    w8   INTEGER NOT NULL DEFAULT 0,  -- wait <= 0.5 s
    w9   INTEGER NOT NULL DEFAULT 0,  -- wait <= 1 s
    w10  INTEGER NOT NULL DEFAULT 0,  -- wait <= 2.5 s
    w11  INTEGER NOT NULL DEFAULT 0,  -- wait <= 5 s
    w12  INTEGER NOT NULL DEFAULT 0,  -- wait <= 10 s
    w13  INTEGER NOT NULL DEFAULT 0,  -- wait <= 25 s
    w14  INTEGER NOT NULL DEFAULT 0,  -- wait <= 50 s
    w15  INTEGER NOT NULL DEFAULT 0,  -- wait <= 100 s
    w16  INTEGER NOT NULL DEFAULT 0,  -- wait <= 250 s
    w17  INTEGER NOT NULL DEFAULT 0,  -- wait <= 500 s
    w18  INTEGER NOT NULL DEFAULT 0,  -- wait <= 1000 s
    w19  INTEGER NOT NULL DEFAULT 0,  -- wait <= 2500 s
    w20  INTEGER NOT NULL DEFAULT 0,  -- wait <= 3600 s
    w21  INTEGER NOT NULL DEFAULT 0,  -- wait <= +Inf
    r0   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.001 s
    r1   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.0025 s
    r2   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.005 s
    r3   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.01 s
    r4   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.025 s
    r5   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.05 s
    r6   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.1 s
    r7   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.25 s
    r8   INTEGER NOT NULL DEFAULT 0,  -- run <= 0.5 s
    r9   INTEGER NOT NULL DEFAULT 0,  -- run <= 1 s
    r10  INTEGER NOT NULL DEFAULT 0,  -- run <= 2.5 s
    r11  INTEGER NOT NULL DEFAULT 0,  -- run <= 5 s
    r12  INTEGER NOT NULL DEFAULT 0,  -- run <= 10 s
    r13  INTEGER NOT NULL DEFAULT 0,  -- run <= 25 s
    r14  INTEGER NOT NULL DEFAULT 0,  -- run <= 50 s
    r15  INTEGER NOT NULL DEFAULT 0,  -- run <= 100 s
    r16  INTEGER NOT NULL DEFAULT 0,  -- run <= 250 s
    r17  INTEGER NOT NULL DEFAULT 0,  -- run <= 500 s
    r18  INTEGER NOT NULL DEFAULT 0,  -- run <= 1000 s
    r19  INTEGER NOT NULL DEFAULT 0,  -- run <= 2500 s
    r20  INTEGER NOT NULL DEFAULT 0,  -- run <= 3600 s
    r21  INTEGER NOT NULL DEFAULT 0,  -- run <= +Inf
    PRIMARY KEY (queue, period, at, name)
) WITHOUT ROWID;
