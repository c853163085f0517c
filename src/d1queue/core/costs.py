"""What a drain's rounds cost in subrequests: one formula, read by the
drain's planning and its admission (features/drain.py) and by every check
of a budget's least (config, the cron's shares, wake-ups)."""

from __future__ import annotations


def round_cost(
    k: int,
    owed: int = 0,
    selects: int = 0,
    ahead: int = 0,
    *,
    per_statement: bool = False,
    metrics: bool = False,
) -> int:
    """The most subrequests a round claiming `k` jobs costs, the settle it
    will owe included:

    - a batch of the `owed` settle statements of the previous round and the
      round's `selects` candidate SELECTs (one per queue), sent before the
      claims; it is sent only with SELECTs in it (with none, the owed
      statements travel in the claim batch);
    - the claim batch: `k` UPDATEs and `ahead` SELECTs reading the next
      round's candidates;
    - the settle this round will owe: at most 2 statements a job (a failure
      is copied to the failed table, then deleted), and with `metrics` the
      UPSERT counting the jobs settled one by one (store/metrics.py; the
      one after a claim batch's acknowledgement fits in the statements
      the acknowledgement saves).

    A batch costs one subrequest, or with `per_statement` (D1QUEUE_BATCH_COUNTS_AS
    = "statements") as many as it has statements."""
    if per_statement:
        return owed + selects + (k + ahead) + 2 * k + (1 if metrics else 0)
    return (1 if selects else 0) + 1 + 1


LEAST_ROUND = round_cost(1, selects=1)
"""What the cheapest round that runs a job costs (3): its SELECT, its claim
and its settle, a batch counting as one query. A job's handler is never given
more than a drain's budget less this (`Budget.most`)."""


def least_run(stats_reserve: int) -> int:
    """The smallest budget a drain can use: one round that runs a job, and
    the run's counters (`stats_reserve`: 1 when they are recorded)."""
    return LEAST_ROUND + stats_reserve
