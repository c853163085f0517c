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
-- d1queue_flow holds, per queue ('*') and per (queue, group), the claims
-- that hold a place under a concurrency limit (their lease's end, id and
-- token, so a place lapses with the lease or when the job is settled) and
-- the claims' times within a rate's window. A claim takes its place in the
-- claim's own batch (sql.TAKE_FLOW), so no read-then-claim race exists.
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
ALTER TABLE d1queue_failed_jobs ADD COLUMN grp TEXT;
ALTER TABLE d1queue_queues ADD COLUMN limits TEXT;
ALTER TABLE d1queue_queues ADD COLUMN grouped INTEGER NOT NULL DEFAULT 0;

CREATE TABLE d1queue_flow (
    queue   TEXT    NOT NULL,
    grp     TEXT    NOT NULL,               -- '*': the queue's; '': jobs with no group
    holders TEXT    NOT NULL DEFAULT '[]',  -- [[lease end, id, token], ...]
    starts  TEXT    NOT NULL DEFAULT '[]',  -- [[claimed at, id, attempt], ...] within the window
    tag     INTEGER NOT NULL DEFAULT 0,     -- the group's last fair tag
    last    TEXT    NOT NULL DEFAULT '',    -- 'id token' of the last claim admitted
    PRIMARY KEY (queue, grp)
) WITHOUT ROWID;

DROP INDEX d1queue_jobs_unique;
CREATE UNIQUE INDEX d1queue_jobs_unique
    ON d1queue_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND (debounce = 0 OR band > -1002);
