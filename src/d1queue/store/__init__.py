"""The D1 side: the only modules that import SQL (sql.py, every statement
named with its cost and index) or the binding. D1Queue (queue.py), a
front with one method per transition of a job: push (push.py), claim
(claim.py; flow admission, admission.py), settle (settle.py; a workflow's
ends, workflow_ends.py), inspection and maintenance; the failed-jobs store
and its cursor (failed.py), operating queues (admin.py), shards as
composition (shardset.py, aggregate.py), schedules' rows, the run counters
and the dashboard's reads. Imports the core only."""
