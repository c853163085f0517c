-- Flow control: groups, limits across invocations, fair turns, debounce.
--
-- A job may carry a group (grp). A grouped job that is due when pushed
-- waits in its priority's grouped band (priority + 3001, sql.GROUP_SHIFT),
-- keyed by a fair tag instead of its push time: the later of the band's head
-- and its group's last tag plus a step (d1queue_flow.tag), so the band's
-- order takes the groups in turn and a group's burst never holds back
-- another group's job by more than one round. Jobs without a group keep the
-- plain bands and their push times: a queue without groups pays nothing.
--
-- d1queue_flow holds, per queue ('*') and per (queue, group), the claims'
-- times within a rate's window, and a group's last fair tag. A claim takes
-- its start in the claim's own batch (sql.TAKE_FLOW), so no read-then-claim
-- race exists.
--
-- d1queue_queues.limits holds the limits set over the API (NULL: the code's
-- apply); grouped says a queue has had grouped jobs (its drains read the
-- grouped bands too).
--
-- debounce: a debounced job leaves the unique index once claimed, so a push
-- with its key after it started queues a new job. Existing rows: no group,
-- not debounced; nothing moves.

ALTER TABLE d1queue_jobs ADD COLUMN grp TEXT;
ALTER TABLE d1queue_jobs ADD COLUMN debounce INTEGER NOT NULL DEFAULT 0;
ALTER TABLE d1queue_jobs ADD COLUMN slot INTEGER;
ALTER TABLE d1queue_jobs ADD COLUMN gslot INTEGER;
ALTER TABLE d1queue_failed_jobs ADD COLUMN grp TEXT;
ALTER TABLE d1queue_queues ADD COLUMN limits TEXT;
ALTER TABLE d1queue_queues ADD COLUMN grouped INTEGER NOT NULL DEFAULT 0;

CREATE TABLE d1queue_flow (
    queue   TEXT    NOT NULL,
    grp     TEXT    NOT NULL,               -- '*': the queue's; '': jobs with no group
    starts  TEXT    NOT NULL DEFAULT '[]',  -- [[claimed at, id, attempt], ...] within the window
    tag     INTEGER NOT NULL DEFAULT 0,     -- the group's last fair tag
    last    TEXT    NOT NULL DEFAULT '',    -- 'id token' of the last claim admitted
    PRIMARY KEY (queue, grp)
) WITHOUT ROWID;

-- A held job of a queue with a concurrency limit holds a place: its slot,
-- one of 0..N-1, unique per queue; under a group_concurrency limit its
-- gslot, one of 0..N-1, unique per (queue, group). The claim sets them
-- (UPDATE OR IGNORE: a place another claim took makes the claim change
-- nothing), so the unique indexes themselves are the limits: no count is
-- read and no row but the job's is written (an index entry each). A
-- settle deletes the row or clears them (a retry), which frees the places
-- at no cost (dropping an index entry is free); a lapsed lease's job keeps
-- its places and takes them back when it is claimed again.
CREATE UNIQUE INDEX d1queue_jobs_slot ON d1queue_jobs (queue, slot) WHERE slot IS NOT NULL;
CREATE UNIQUE INDEX d1queue_jobs_gslot
    ON d1queue_jobs (queue, COALESCE(grp, ''), gslot) WHERE gslot IS NOT NULL;

DROP INDEX d1queue_jobs_unique;
CREATE UNIQUE INDEX d1queue_jobs_unique
    ON d1queue_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND (debounce = 0 OR band > -1002);
