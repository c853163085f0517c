-- Jobs in flight out of the claim's way: a third band in the key.
--
-- Until now a claimed job stayed where it was in the key, held by its
-- lease, and every claim read past the jobs in flight ahead of the ready
-- ones. Now a claim moves the job to the locked band (-1002, below the
-- delayed band: see sql.LOCKED_BAND), keyed by when it may next be claimed:
-- its lease's end while a worker holds it, its retry time while it waits out
-- a retry. A claim reads the due head of that band (lapsed leases, retries
-- whose time came) as it reads the delayed band's, so jobs in flight and
-- retries waiting are never read before their time, however many.
--
-- Moving a row costs what updating it in place did (one row written) as
-- long as no index entry has to follow it, and every index of a WITHOUT
-- ROWID table holds the row's key. So the id index now holds only the jobs
-- outside the locked band: a claim drops the job's entry (dropping is
-- free), and a job's life stays at 4 rows written. A worker settles the job
-- it holds by its key (queue, band, lease end, id), which it knows; lookups
-- by id of a locked job walk the queues' locked bands (sql._by_id).
--
-- Existing rows: a job held or waiting out a retry (locked_until > 0) moves
-- to the locked band, keyed by its locked_until; its lease, token and
-- attempts are kept. Every other row stays where it is.

DROP INDEX d1queue_jobs_id;

UPDATE d1queue_jobs SET band = -1002, available_at = locked_until WHERE locked_until > 0;

CREATE UNIQUE INDEX d1queue_jobs_id ON d1queue_jobs (id) WHERE band > -1002;
