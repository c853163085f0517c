"""The D1 side: the only modules that import SQL (sql.py, every statement
named with its cost and index) or the binding. Push, claim and settle
(queue.py), the failed-jobs store and its cursor (failed.py), inspection
(admin.py), shards as
composition (shardset.py, aggregate.py), schedules' rows, the run counters
and the dashboard's reads. Imports the core only."""
