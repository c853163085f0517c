-- When a wake consumer last fanned out on a queue (epoch ms; 0: never). A
-- consumer woken by a push may fan out (send more wake-ups for a backlog) only
-- if no other did in the last minute, so pushes arriving together start one
-- set of consumer chains, not one per push (src/d1queue/wake.py).
ALTER TABLE d1queue_queues ADD COLUMN fanned_out_at INTEGER NOT NULL DEFAULT 0;
