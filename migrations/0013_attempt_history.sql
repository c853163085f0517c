-- Attempt history and progress (core/runs.py).
--
-- `runs`: the job's attempts as a JSON array, the latest MAX_RUNS (10) of
-- them, each {attempt, started_at, duration_ms, outcome, error?, progress?,
-- logs?, logs_truncated?} and at most MAX_RUN_BYTES (core/bounds.py). The
-- settle that already writes the job appends its attempt in the same
-- statement (sql.RETRY, COMPLETE_HELD, COMPLETE_HELD_BATCH, FAIL_RECORD),
-- keyed by the attempt's number so a re-sent settle appends nothing more:
-- no statement more and no row more. A failure keeps its history (the
-- failed row's own `runs`), and a retry of the failure copies it back.
--
-- `progress`: a running job's latest progress report, with its attempt's
-- log lines so far (sql.SET_PROGRESS, written only by a handler calling
-- ctx.progress, fenced by its lease's token), then the settled attempt's
-- last report. Neither column is in an index: writing them writes the row
-- only, and no claim reads them.
--
-- Existing rows: nothing moves; every job and failure has NULL (no history
-- kept from before), and the first settle after this starts it.

ALTER TABLE d1queue_jobs ADD COLUMN runs TEXT;
ALTER TABLE d1queue_jobs ADD COLUMN progress TEXT;
ALTER TABLE d1queue_failed_jobs ADD COLUMN runs TEXT;
