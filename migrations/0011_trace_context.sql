-- Trace context: a job keeps the W3C `traceparent` of the push that made it
-- (55 characters, checked by bounds.TRACEPARENT_RULE before it is sent), so
-- its runs' log lines name the producer's trace and span
-- (core/telemetry.py). The push's own INSERT carries it: no statement more
-- on push, claim or settle; a retry keeps its row and so its trace.
--
-- A failed job keeps it too (FAIL_RECORD copies it; a retry of the failure
-- copies it back). A batch's callback keeps the batch push's: its row in
-- d1queue_batch_parts holds it as its eighth value, which the trigger that
-- enqueues the callback now inserts (the trigger below is 0010's with that
-- one column more).
--
-- Existing rows: nothing moves; every job and failure has NULL (no trace),
-- and a callback row of seven values inserts NULL (json_extract of a
-- missing index).

ALTER TABLE d1queue_jobs ADD COLUMN traceparent TEXT;
ALTER TABLE d1queue_failed_jobs ADD COLUMN traceparent TEXT;

DROP TRIGGER d1queue_jobs_ended;
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
        priority, available_at, created_at, unique_key, band, traceparent)
    SELECT json_extract(c.spec, '$[0]'), json_extract(c.spec, '$[1]'),
        json_extract(c.spec, '$[2]'), json_extract(c.spec, '$[3]'), 0,
        json_extract(c.spec, '$[4]'), json_extract(c.spec, '$[5]'),
        CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER),
        CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER),
        json_extract(c.spec, '$[6]'), json_extract(c.spec, '$[5]'),
        json_extract(c.spec, '$[7]')
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
