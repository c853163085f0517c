"""Job metrics in the real Worker (Pyodide, the workers SDK, Miniflare's D1):
GET /v1/metrics as JSON and as the Prometheus text a scraper reads (parsed
with prometheus_client's parser) after the cron drained, and the cron's
rollup and prune riding in its schedules' read batch, their counts in the
cron's report. Counts are asserted, never timings. That the guards count
once under lost replies is the driver contract's (tests/contract.py, run
here by test_contract_runtime.py) and the chaos test's."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .conftest import TOKEN, Host


def drain_all(host: Host) -> list[dict[str, Any]]:
    """Cron runs until one claims nothing; their reports."""
    reports: list[dict[str, Any]] = []
    for _ in range(10):
        since = len(host.output())
        host.scheduled()
        host.wait_for_output('"d1queue.drain"', since)
        (report,) = host.events("d1queue.drain", since)
        reports.append(report)
        if report["claimed"] == 0:
            return reports
    raise AssertionError(f"still claiming after 10 cron runs: {reports}")


def test_get_metrics_shows_a_drains_counts_and_percentiles(clean_host: Host) -> None:
    host = clean_host
    pushed = [{"name": "example.echo", "payload": {"i": i}} for i in range(5)]
    pushed += [{"name": "example.add", "payload": {"a": "x"}} for _ in range(2)]  # fail
    pushed.append({"name": "example.add", "payload": {"a": 2, "b": 3}})  # and its echo
    for job in pushed:
        assert host.api("POST", "/v1/queues/default/jobs", job).status == 201
    cancelled = host.api(
        "POST", "/v1/queues/default/jobs", {"name": "example.echo", "delay_s": 3600}
    ).json()["id"]
    assert host.api("DELETE", f"/v1/jobs/{cancelled}").status == 200
    reports = drain_all(host)
    assert sum(r["completed"] for r in reports) == 7
    assert sum(r["failed"] for r in reports) == 2

    reply = host.api("GET", "/v1/metrics?window=1h")
    assert reply.status == 200, reply.text
    got = {(m["queue"], m["name"]): m for m in reply.json()["metrics"]}
    echo, add = got[("default", "example.echo")], got[("default", "example.add")]
    assert echo["counts"] == {"completed": 6, "retried": 0, "failed": 0, "cancelled": 1}
    assert add["counts"] == {"completed": 1, "retried": 0, "failed": 2, "cancelled": 0}
    assert echo["total"] == echo["counts"] and add["total"] == add["counts"]
    for figures, ran in ((echo, 6), (add, 3)):
        for kind in ("wait", "run"):
            summary = figures[kind]
            assert summary["count"] == ran, (kind, summary)
            assert 0 <= summary["p50_s"] <= summary["p95_s"] <= summary["p99_s"], summary
    assert sum(p["completed"] for p in echo["series"]) == 6

    reply = host.request(
        "GET",
        "/v1/metrics",
        headers={"authorization": f"Bearer {TOKEN}", "accept": "text/plain"},
    )
    content_type = {k.lower(): v for k, v in reply.headers.items()}["content-type"]
    assert reply.status == 200 and content_type.startswith("text/plain"), reply.headers
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }

    def sample(metric: str, /, **labels: str) -> float:
        return samples[(metric, tuple(sorted(labels.items())))]

    echo_labels = {"queue": "default", "name": "example.echo"}
    assert sample("d1queue_jobs_total", **echo_labels, outcome="completed") == 6
    assert sample("d1queue_jobs_total", **echo_labels, outcome="cancelled") == 1
    add_labels = {"queue": "default", "name": "example.add"}
    assert sample("d1queue_jobs_total", **add_labels, outcome="failed") == 2
    assert sample("d1queue_job_run_seconds_count", **echo_labels) == 6
    assert sample("d1queue_job_wait_seconds_bucket", **add_labels, le="+Inf") == 3
    assert sample("d1queue_queue_jobs", queue="default", state="failed") == 2


def test_the_cron_rolls_up_and_prunes_in_its_read_batch(clean_host: Host) -> None:
    """Minute rows of the last hour and of 4 hours ago, and an hour row past
    30 days: one cron run rolls up the oldest hour with minutes and prunes
    what is past retention, in its schedules' one query; the next rolls the
    last hour; then an idle run writes nothing."""
    host = clean_host
    now = int(time.time() * 1000)
    hour = 3_600_000
    this_hour = now - now % hour
    if now - this_hour < 3 * 60_000:  # inside the rollup's margin: the last hour is not due
        this_hour -= hour
    last, old = this_hour - hour, this_hour - 4 * hour
    rows = [(60_000, last + m * 60_000) for m in range(0, 60, 5)]
    rows += [(60_000, old + m * 60_000) for m in range(3)]
    rows.append((hour, this_hour - 31 * 24 * hour))
    host.python(
        f"""
        async def main(env):
            for period, at in {rows!r}:
                await env.DB.prepare(
                    "INSERT INTO d1queue_metrics (queue, period, at, name, completed) "
                    "VALUES ('rt-metrics', ?1, ?2, 'job', 1)"
                ).bind(period, at).run()
        """
    )
    reports = []
    for _ in range(3):
        since = len(host.output())
        host.scheduled()
        host.wait_for_output('"d1queue.drain"', since)
        (report,) = host.events("d1queue.drain", since)
        reports.append(report["schedules"])
    figures = [
        (s["rolled_metrics"], s["pruned_metrics"], s["queries"], s["rows_written"]) for s in reports
    ]
    # 1: the hour of 4 h ago rolled (an hour row, the cursor's row), its 3
    # minutes and the old hour row pruned; 2: the last hour rolled (the
    # hour row, the cursor moved); 3: nothing.
    assert figures == [(1, 4, 1, 1 + 1 + 4), (1, 0, 1, 2), (0, 0, 1, 0)], reports
    assert all(not s["error"] for s in reports), reports
    hours = host.python(
        """
        async def main(env):
            r = await env.DB.prepare(
                "SELECT at, completed FROM d1queue_metrics WHERE period = 3600000 ORDER BY at"
            ).all()
            return [[x["at"], x["completed"]] for x in r["results"]]
        """
    )
    assert hours == [[old, 3], [last, 12]]
