-- Cancelling a running job: a job a worker holds cannot be deleted under
-- it, so a cancel marks it instead, `cancel_at` (epoch ms, NULL: never
-- asked). The drain holding the job ends it cancelled when it learns of
-- the mark (a watch the job declares, or its settle), and every claim
-- reads the column with the job (rows.JOB_COLUMN_NAMES): a marked job met
-- again after its lease lapsed is ended cancelled without running.
--
-- Not indexed: the mark is written to the row alone, one row written, and
-- read only with rows read anyway. Existing rows: nothing moves; every job
-- has NULL (not marked).

ALTER TABLE d1queue_jobs ADD COLUMN cancel_at INTEGER;
