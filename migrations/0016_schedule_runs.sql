-- A schedule's last runs: `runs` holds the newest sql.SCHEDULE_RUNS_KEPT
-- jobs it pushed, newest first, a JSON array of [slot or push time (epoch
-- ms), job id] (a third element "now" marks one pushed by the dashboard's
-- "Run now"). The cron writes it in the UPDATE that already advances a due
-- schedule (sql.UPDATE_SCHEDULES_RAN): the same row, no statement or row
-- written more per cron run. Bounded, so a schedule's row stays small
-- however long it runs.
--
-- Not indexed: read only with the schedule's row. Existing rows: nothing
-- moves; every schedule has NULL (no run recorded yet) until its next run.

ALTER TABLE d1queue_schedules ADD COLUMN runs TEXT;
