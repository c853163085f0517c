"""Job metrics (store/metrics.py, migrations/0012_metrics.sql): what the
settle batch counts, that a re-sent batch or a lost lease never counts
twice, what it costs, and what the reads and the Prometheus text say."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.errors import Fail, Retry
from d1queue.core.metrics import (
    BUCKETS,
    BUCKETS_S,
    Figures,
    bucket,
    prometheus,
    quantile,
    wants_prometheus,
)
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import metrics, sql

from .contract import Clock
from .test_flow_prune import run_cron


def registry(clock: Clock) -> Registry:
    reg = Registry()

    @reg.job("ok")
    async def ok(payload: Any) -> None:
        clock.advance(payload or 0)  # the handler "runs" this many seconds

    @reg.job("again")
    async def again(payload: Any) -> None:
        raise Retry("later", delay_s=600)

    @reg.job("bad")
    async def bad(payload: Any) -> None:
        raise Fail("no")

    return reg


def on(db: SqliteD1, clock: Clock) -> D1Queue:
    return D1Queue(db, clock=clock, metrics=True)


def totals(db: SqliteD1) -> dict[tuple[str, str], dict[str, Any]]:
    rows = db.query(f"SELECT * FROM d1queue_metrics WHERE period = {sql.METRIC_TOTAL}")
    return {(r["queue"], r["name"]): r for r in rows}


def counts(db: SqliteD1) -> dict[tuple[str, str], tuple[int, int, int, int]]:
    return {
        k: (r["completed"], r["retried"], r["failed"], r["cancelled"])
        for k, r in totals(db).items()
    }


async def test_a_drain_counts_each_outcome_once_with_its_wait_and_run(
    db: SqliteD1, clock: Clock
) -> None:
    queue = on(db, clock)
    for i in range(5):
        await queue.dispatch("ok", 0.2 if i < 4 else 30)
    await queue.dispatch("again", None, queue="mail")
    await queue.dispatch("bad", None, queue="mail")
    clock.advance(2)  # every job waits 2 s before it starts
    report = await drain(queue, registry(clock), Config(max_jobs=100))
    assert (report.completed, report.retried, report.failed) == (5, 1, 1)
    assert counts(db) == {
        ("default", "ok"): (5, 0, 0, 0),
        ("mail", "again"): (0, 1, 0, 0),
        ("mail", "bad"): (0, 0, 1, 0),
    }
    ok = totals(db)[("default", "ok")]
    run = [ok[f"r{i}"] for i in range(BUCKETS)]
    assert run[bucket(200)] == 4 and run[bucket(30_000)] == 1 and sum(run) == 5
    wait = [ok[f"w{i}"] for i in range(BUCKETS)]
    assert sum(wait) == 5 and ok["run_ms"] == pytest.approx(4 * 200 + 30_000)
    # Handlers run in turn: the later ones waited for the earlier ones.
    assert ok["wait_ms"] >= 5 * 2000
    # The minute's rows carry the same counts as the totals.
    minute = db.query(f"SELECT * FROM d1queue_metrics WHERE period = {sql.METRIC_MINUTE_MS}")
    assert sorted((r["queue"], r["name"], r["completed"]) for r in minute) == [
        ("default", "ok", 5),
        ("mail", "again", 0),
        ("mail", "bad", 0),
    ]


async def test_metrics_cost_no_query_and_a_row_per_name_a_round_and_off_costs_nothing(
    clock: Clock,
) -> None:
    async def run(metrics_on: bool) -> tuple[Any, Any, SqliteD1]:
        db = SqliteD1()
        db.apply_migrations()
        queue = D1Queue(db, clock=clock, metrics=metrics_on)
        for _ in range(50):
            await queue.dispatch("ok")
        config = Config(max_jobs=100, batch_size=25, stats=False)
        report = await drain(queue, registry(clock), config)
        return report, queue.binding.usage.by_name, db

    with_metrics, names, db_on = await run(True)
    without, names_off, db_off = await run(False)
    assert with_metrics.completed == without.completed == 50
    assert with_metrics.queries == without.queries  # no extra round trip
    # One guarded UPSERT after each claim batch's acknowledgement, nothing else.
    extra = {k: v for k, v in names.items() if names_off.get(k) != v}
    assert extra == {"METRICS_ACKED": with_metrics.statements - without.statements}
    assert extra["METRICS_ACKED"] <= with_metrics.rounds
    assert db_off.query("SELECT COUNT(*) AS n FROM d1queue_metrics")[0]["n"] == 0
    assert counts(db_on) == {("default", "ok"): (50, 0, 0, 0)}


@pytest.mark.parametrize("lost", [sql.DELETE_HELD_BATCH_PLAIN, sql.RETRY, sql.FAIL_RECORD])
async def test_a_settle_resent_after_a_lost_reply_counts_once(
    db: SqliteD1, clock: Clock, lost: str
) -> None:
    queue = on(db, clock)
    for _ in range(3):
        await queue.dispatch("ok")
    await queue.dispatch("again")
    await queue.dispatch("bad")
    db.lose_reply_when(lost)  # the batch commits, its reply is lost: sent again
    report = await drain(queue, registry(clock), Config(max_jobs=100))
    assert (report.completed, report.retried, report.failed) == (3, 1, 1)
    assert counts(db) == {
        ("default", "ok"): (3, 0, 0, 0),
        ("default", "again"): (0, 1, 0, 0),
        ("default", "bad"): (0, 0, 1, 0),
    }


async def test_a_settle_refused_then_sent_alone_counts_each_outcome_once(
    db: SqliteD1, clock: Clock
) -> None:
    queue = on(db, clock)
    for _ in range(3):
        await queue.dispatch("ok")
    await queue.dispatch("again")
    # The round's settle batch fails after it committed (lost reply) and
    # its re-send is refused: each outcome is then settled alone.
    db.lose_reply_when(sql.METRICS_ACKED, times=1)
    db.fail_when(sql.METRICS_ACKED, times=3)
    report = await drain(queue, registry(clock), Config(max_jobs=100))
    assert report.completed + report.retried == 4
    assert counts(db) == {("default", "ok"): (3, 0, 0, 0), ("default", "again"): (0, 1, 0, 0)}


async def test_an_outcome_whose_lease_was_lost_is_not_counted(db: SqliteD1, clock: Clock) -> None:
    queue = on(db, clock)
    await queue.dispatch("ok")
    await queue.dispatch("again")
    held = await queue.reserve_batch("default", 2)
    assert len(held) == 2
    # Another worker takes both over after the lease lapsed and settles them.
    clock.advance(queue.reservation_s + 1)
    other = await queue.reserve_batch("default", 2)
    assert len(other) == 2
    from d1queue.core.outcomes import Outcome

    marks = await queue.settle_outcomes(
        [Outcome(held[0], "complete"), Outcome(held[1], "retry", delay_s=5)]
    )
    assert marks == ["stale", "stale"]
    assert counts(db) == {}
    await queue.settle_outcomes([Outcome(other[0], "complete"), Outcome(other[1], "complete")])
    assert sum(c[0] for c in counts(db).values()) == 2


async def test_a_cancel_counts_once_even_resent(db: SqliteD1, clock: Clock) -> None:
    from d1queue.store.admin import Admin

    queue = on(db, clock)
    first = await queue.dispatch("ok", queue="mail")
    second = await queue.dispatch("ok", queue="mail")
    admin = Admin(queue)
    db.lose_reply_when(sql.METRICS_CANCELLED, times=1)
    # The lost reply is re-sent by the binding and finds the job gone.
    assert await admin.cancel(first) in ("cancelled", "missing")
    assert await admin.cancel(second) == "cancelled"
    assert await admin.cancel(second) == "missing"
    assert counts(db) == {("mail", "ok"): (0, 0, 0, 2)}


async def test_the_windows_read_bounded_rows(db: SqliteD1, clock: Clock) -> None:
    queue = on(db, clock)
    reg = registry(clock)
    # 30 hours of work, a round every 10 minutes, on two names.
    for _ in range(180):
        await queue.dispatch("ok")
        await queue.dispatch("again", queue="mail")
        await drain(queue, reg, Config(max_jobs=10, stats=False))
        clock.advance(600)
        await metrics.maintain(queue.binding, clock(), 1000)
    queue.binding.usage.rows_read = 0
    before = queue.binding.usage.rows_read
    window = await metrics.read(queue.binding, clock(), "24h", queue="default")
    read_rows = queue.binding.usage.rows_read - before
    assert read_rows <= 2000
    f = window.figures[("default", "ok")]
    assert 140 <= f.counts[0] <= 146  # 24 h of a job every 10 minutes
    assert window.totals[("default", "ok")].counts[0] == 180
    assert ("mail", "again") not in window.figures
    assert len(window.series[("default", "ok")]) >= 23
    hour = await metrics.read(queue.binding, clock(), "1h")
    again = hour.figures[("mail", "again")]
    assert again.counts[1] > 0
    series = hour.series[("mail", "again")].values()
    assert sum(f.counts[1] for f in series) == again.counts[1]


def test_quantiles_interpolate_inside_their_bucket() -> None:
    counts = [0] * BUCKETS
    counts[bucket(200)] = 100  # 200 ms: the (0.1, 0.25] bucket
    assert quantile(counts, 0.5) == pytest.approx(0.175)
    assert quantile([0] * BUCKETS, 0.5) is None
    counts[-1] = 1000
    assert quantile(counts, 0.99) == BUCKETS_S[-1]


def test_prometheus_text_parses_with_the_standard_parser() -> None:
    f = Figures()
    f.counts = [7, 2, 1, 3]
    f.run.add([0, 0, 0, 0, 0, 0, 0, 10] + [0] * (BUCKETS - 8), 2000)
    text = prometheus({("mail", 'we"ird'): f}, {"mail": {"ready": 4, "reserved": 1}})
    families = {m.name: m for m in text_string_to_metric_families(text)}
    jobs = {s.labels["outcome"]: s.value for s in families["d1queue_jobs"].samples}
    assert jobs == {"completed": 7, "retried": 2, "failed": 1, "cancelled": 3}
    assert families["d1queue_jobs"].type == "counter"
    run = families["d1queue_job_run_seconds"]
    assert run.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in run.samples if s.name.endswith("_bucket")}
    assert buckets["0.1"] == 0 and buckets["0.25"] == 10 and buckets["+Inf"] == 10
    (count,) = [s.value for s in run.samples if s.name.endswith("_count")]
    (total,) = [s.value for s in run.samples if s.name.endswith("_sum")]
    assert (count, total) == (10, 2.0)
    gauge = {s.labels["state"]: s.value for s in families["d1queue_queue_jobs"].samples}
    assert gauge == {"ready": 4, "reserved": 1}


def test_the_accept_header_picks_the_format() -> None:
    prom = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    assert wants_prometheus(prom) == "openmetrics"
    assert wants_prometheus("text/plain; version=0.0.4") == "text"
    assert wants_prometheus("application/json") is None
    assert wants_prometheus("*/*") is None
    assert wants_prometheus("") is None
    assert wants_prometheus("application/json, text/plain;q=0.5") is None


async def test_get_metrics_answers_json_or_prometheus_text_to_the_token_only(
    db: SqliteD1, clock: Clock
) -> None:
    from d1queue.interfaces.api import Api
    from d1queue.interfaces.openapi import SPEC
    from d1queue.interfaces.service import Service

    queue = on(db, clock)
    reg = registry(clock)
    for _ in range(4):
        await queue.dispatch("ok", 0.2)
    await queue.dispatch("bad", queue="mail")
    await drain(queue, reg, Config(max_jobs=100, stats=False))
    await queue.dispatch("ok")  # one waiting: the gauge shows it
    api = Api(Service(queue, reg), "t" * 32, "1", SPEC)
    auth = {"authorization": "Bearer " + "t" * 32}

    denied = await api.handle("GET", "https://q/v1/metrics", {}, b"")
    assert denied.status == 401

    reply = await api.handle("GET", "https://q/v1/metrics?window=24h&queue=default", auth, b"")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    (ok,) = reply.body["metrics"]
    assert (ok["queue"], ok["name"], ok["counts"]["completed"], ok["total"]["completed"]) == (
        "default",
        "ok",
        4,
        4,
    )
    assert 0.1 < ok["run"]["p50_s"] <= 0.25 and ok["run"]["count"] == 4
    assert reply.body["step_s"] == 3600 and sum(p["completed"] for p in ok["series"]) == 4

    bad = await api.handle("GET", "https://q/v1/metrics?window=2d", auth, b"")
    assert bad.status == 400

    prom = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    text = await api.handle("GET", "https://q/v1/metrics", {**auth, "accept": prom}, b"")
    assert text.headers["content-type"].startswith("application/openmetrics-text")
    families = {m.name: m for m in openmetrics_families(str(text.body))}
    jobs = {
        (s.labels["queue"], s.labels["name"], s.labels["outcome"]): s.value
        for s in families["d1queue_jobs"].samples
    }
    assert jobs[("default", "ok", "completed")] == 4 and jobs[("mail", "bad", "failed")] == 1
    run = families["d1queue_job_run_seconds"].samples
    count = [s.value for s in run if s.name.endswith("_count") and s.labels["name"] == "ok"]
    assert count == [4]
    gauge = {
        (s.labels["queue"], s.labels["state"]): s.value
        for s in families["d1queue_queue_jobs"].samples
    }
    assert gauge[("default", "ready")] == 1

    plain = await api.handle("GET", "https://q/v1/metrics", {**auth, "accept": "text/plain"}, b"")
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    plain_families = {m.name: m for m in text_string_to_metric_families(str(plain.body))}
    assert plain_families["d1queue_jobs"].type == "counter"


# -- the cron's rollup and prune ------------------------------------------------


def put_row(db: SqliteD1, period: int, at: int, completed: int = 1, name: str = "ok") -> None:
    db.query(
        "INSERT INTO d1queue_metrics (queue, period, at, name, completed, w0, r0) "
        "VALUES ('default', ?1, ?2, ?3, ?4, ?4, ?4)",
        period,
        at,
        name,
        completed,
    )


def series(db: SqliteD1, period: int) -> dict[int, int]:
    rows = db.query(
        "SELECT at, completed FROM d1queue_metrics WHERE period = ?1 ORDER BY at", period
    )
    return {r["at"]: r["completed"] for r in rows}


def cursor(db: SqliteD1) -> int | None:
    rows = db.query("SELECT value FROM d1queue_meta WHERE key = ?1", sql.METRICS_ROLLED_KEY)
    return int(rows[0]["value"]) if rows else None


HOUR = metrics.HOUR_MS
MINUTE = metrics.MINUTE_MS


def at_hour(clock: Clock) -> int:
    """Move `clock` to 5 minutes past an hour; return that hour's start."""
    start = clock() - clock() % HOUR + HOUR
    clock.ms = start + 5 * MINUTE
    return start


async def test_the_cron_rolls_up_an_hour_a_run_and_prunes_in_its_read_batch(
    db: SqliteD1, clock: Clock
) -> None:
    """Each run sums the next hour that has minutes into its hour row, and
    deletes minute rows past 3 hours (of hours rolled) and hour rows past
    30 days, in the batch that reads the due schedules: no query of its
    own, the counts in the cron's report. An idle run writes nothing."""
    reg = registry(clock)
    queue = on(db, clock)
    now_hour = at_hour(clock)
    last, old = now_hour - HOUR, now_hour - 4 * HOUR
    for m in range(60):
        put_row(db, MINUTE, last + m * MINUTE)
    for m in range(5):  # past 3 hours
        put_row(db, MINUTE, old + m * MINUTE)
    for d in (31, 32, 40):
        put_row(db, HOUR, now_hour - d * 24 * HOUR)
    put_row(db, HOUR, now_hour - 29 * 24 * HOUR)  # kept
    run = await run_cron(queue, reg, Config(stats=False))
    s = run.schedules
    assert (s.rolled_metrics, s.pruned_metrics, s.queries) == (1, 5 + 3, 1), s
    assert {"rolled_metrics": 1, "pruned_metrics": 8}.items() <= s.as_dict().items()
    assert series(db, HOUR) == {now_hour - 29 * 24 * HOUR: 1, old: 5}
    assert len(series(db, MINUTE)) == 60 and cursor(db) == old
    # The next run: the next hour with minutes, skipping the empty ones.
    s = (await run_cron(queue, reg, Config(stats=False))).schedules
    assert (s.rolled_metrics, s.pruned_metrics, s.queries) == (1, 0, 1), s
    assert series(db, HOUR)[last] == 60 and cursor(db) == last

    # Then nothing is due: nothing written, the cursor stays.
    def tables() -> list[Any]:
        return [db.query(f"SELECT * FROM {t}") for t in ("d1queue_metrics", "d1queue_meta")]

    before = tables()
    s = (await run_cron(queue, reg, Config(stats=False))).schedules
    assert (s.rolled_metrics, s.pruned_metrics, s.queries) == (0, 0, 1), s
    assert tables() == before and cursor(db) == last
    # Three hours on, the last hour's minutes go; its hour row stays.
    clock.advance(3 * 3600)
    s = (await run_cron(queue, reg, Config(stats=False))).schedules
    assert s.pruned_metrics == 60 and series(db, MINUTE) == {}, s
    assert series(db, HOUR)[last] == 60 and cursor(db) == last


async def test_a_resent_rollup_counts_its_hour_once(db: SqliteD1, clock: Clock) -> None:
    reg = registry(clock)
    queue = on(db, clock)
    last = at_hour(clock) - HOUR
    for m in range(0, 60, 10):
        put_row(db, MINUTE, last + m * MINUTE, completed=2)
    db.lose_reply_when(sql.ROLL_METRICS)  # committed, reply lost: sent again
    run = await run_cron(queue, reg, Config(stats=False))
    assert run.schedules.resent, run.schedules
    assert series(db, HOUR) == {last: 12} and cursor(db) == last
    await run_cron(queue, reg, Config(stats=False))
    assert series(db, HOUR) == {last: 12}


async def test_a_cursor_behind_catches_up_an_hour_a_run_and_keeps_minutes_not_rolled(
    db: SqliteD1, clock: Clock
) -> None:
    """The cron stopped for hours while drains went on: the minutes of the
    hours not rolled up stay past 3 hours until their hour is rolled, one
    hour a run, each counted once."""
    reg = registry(clock)
    queue = on(db, clock)
    now_hour = at_hour(clock)
    db.query(
        "INSERT INTO d1queue_meta (key, value, updated_at) VALUES (?1, ?2, 0)",
        sql.METRICS_ROLLED_KEY,
        str(now_hour - 6 * HOUR),
    )
    hours = [now_hour - h * HOUR for h in (5, 4, 3, 2, 1)]
    for i, hour in enumerate(hours):
        for m in (0, 30):
            put_row(db, MINUTE, hour + m * MINUTE, completed=i + 1)
    rolled = []
    for _ in range(len(hours) + 1):
        s = (await run_cron(queue, reg, Config(stats=False))).schedules
        assert s.queries == 1, s
        rolled.append((s.rolled_metrics, s.pruned_metrics))
    # Each run rolls the next hour with minutes, and prunes the minutes of the hours
    # rolled that are past 3 hours: the 5th and 4th hours back, and the
    # first minute of the 3rd (3 h 5 min ago).
    assert rolled == [(1, 2), (1, 2), (1, 1), (1, 0), (1, 0), (0, 0)]
    assert series(db, HOUR) == {hour: 2 * (i + 1) for i, hour in enumerate(hours)}
    kept = [hours[2] + 30 * MINUTE] + [h + m * MINUTE for h in hours[3:] for m in (0, 30)]
    assert sorted(series(db, MINUTE)) == kept


async def test_the_prune_keeps_to_the_plans_bound_and_off_sends_nothing(
    db: SqliteD1, clock: Clock
) -> None:
    from d1queue.core.config import PRUNE_METRICS

    reg = registry(clock)
    queue = on(db, clock)
    now_hour = at_hour(clock)
    for m in range(PRUNE_METRICS["free"] + 5):
        put_row(db, HOUR, now_hour - 40 * 24 * HOUR + m * HOUR)
    before = dict(queue.binding.usage.by_name)
    s = (await run_cron(queue, reg, Config(stats=False, metrics=False))).schedules
    used = {k for k, v in queue.binding.usage.by_name.items() if v != before.get(k)}
    assert not used & {"ROLL_METRICS", "ROLL_METRICS_MARK", "PRUNE_METRICS"}, used
    assert (s.rolled_metrics, s.pruned_metrics) == (0, 0)
    s = (await run_cron(queue, reg, Config(stats=False))).schedules
    assert s.pruned_metrics == PRUNE_METRICS["free"]
    s = (await run_cron(queue, reg, Config(stats=False))).schedules
    assert s.pruned_metrics == 5


async def test_a_clear_counts_its_jobs_as_cancelled_once_even_resent(
    db: SqliteD1, clock: Clock
) -> None:
    queue = on(db, clock)
    for _ in range(3):
        await queue.dispatch("ok", queue="mail")
    await queue.dispatch("again", queue="mail")
    await queue.reserve_batch("mail", 1)  # a held job is cleared and counted too
    db.lose_reply_when(sql.METRICS_CLEARED, times=1)
    assert await queue.clear("mail") in (0, 4)  # the re-send deletes nothing
    assert counts(db) == {("mail", "ok"): (0, 0, 0, 3), ("mail", "again"): (0, 0, 0, 1)}
    assert await queue.clear("mail") == 0
    assert await D1Queue(db, clock=clock).clear("mail") == 0
    assert sum(c[3] for c in counts(db).values()) == 4
