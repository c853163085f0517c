-- Per-queue state that is not a job: whether the queue is paused. A queue
-- with no row here is running; pausing writes a row, resuming updates it.
CREATE TABLE d1queue_queues (
    name       TEXT    PRIMARY KEY NOT NULL,
    paused     INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL
);
