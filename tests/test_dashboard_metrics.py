"""The metrics page (/ui/metrics) and the charts (svg.py): charts that read
as charts (axes, units, time labels, a legend, patterns as well as
colours), per queue and per job name over 1 h, 24 h and 7 d from the
stored metrics, and the job names' table, sorted on the server; what it
costs in D1; and a batch's bar split by outcome. The same in a real
browser: tests/runtime/test_dashboard_browser.py."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from d1queue import Config, D1Queue, drain
from d1queue.core.metrics import Figures
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.dashboard.metrics import NameRow, sort_rows
from d1queue.interfaces.dashboard.svg import (
    Axis,
    bars,
    lines,
    nice_top,
    seconds_label,
    share_bar,
    time_label,
)
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1

from .contract import Clock
from .test_dashboard import TOKEN, Browser, registry

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    return Service(D1Queue(db, clock=clock, metrics=True), registry())


@pytest.fixture
async def browser(service: Service, clock: Clock) -> Browser:
    b = Browser(Dashboard(service, TOKEN), clock)
    await b.sign_in()
    return b


def svgs(body: str) -> dict[str, ET.Element]:
    """Every chart of a page, parsed (so each is well-formed), by id."""
    found = {}
    for text in re.findall(r'<svg class="chart".*?</svg>', body, re.S):
        root = ET.fromstring(text.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))
        found[root.attrib["id"]] = root
    return found


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


async def ran(service: Service, clock: Clock) -> None:
    """Jobs on two queues under three names: mail's echo completes (3),
    mail's boom fails (2), reports' echo completes (1)."""
    for i in range(3):
        await service.dispatch("mail", {"name": "echo", "payload": i})
    for i in range(2):
        await service.dispatch("mail", {"name": "boom", "payload": i})
    await service.dispatch("reports", {"name": "echo", "payload": "r"})
    clock.advance(2)  # each waited 2 s past due
    await drain(service.queue, service.registry, Config(max_jobs=100))


async def test_the_metrics_page_draws_charts_with_axes_units_and_a_legend(
    browser: Browser, service: Service, clock: Clock
) -> None:
    await ran(service, clock)
    reply = await browser.get("/ui/metrics")
    assert reply.status == 200
    charts = svgs(reply.body)
    assert set(charts) == {"chart-outcomes", "chart-wait", "chart-run"}
    outcomes = texts(charts["chart-outcomes"])
    assert "Jobs per minute" in outcomes and "Time (UTC), one minute a step" in outcomes
    assert any(re.fullmatch(r"\d\d:\d0", t) for t in outcomes), outcomes  # time labels
    # The legend says each outcome, its pattern and its count in words.
    for key in ("completed (solid): 4", "failed (cross-hatched): 2", "retried (striped): 0"):
        assert key in outcomes, outcomes
    bars_drawn = charts["chart-outcomes"].findall(f"{SVG}rect[@class='f']")
    assert bars_drawn and all(r.attrib["fill"] == "url(#chart-outcomes-f)" for r in bars_drawn)
    assert charts["chart-outcomes"].find(f"{SVG}defs/{SVG}pattern[@id='chart-outcomes-f']")
    wait = texts(charts["chart-wait"])
    assert "Seconds (p50, p95)" in wait and "p50 wait" in wait and "p95 wait" in wait
    assert any(t.endswith(" s") for t in wait), "tick labels carry their unit"
    assert "p95 wait: highest" in charts["chart-wait"].find(f"{SVG}desc").text  # type: ignore[union-attr]
    for root in charts.values():
        assert root.find(f"{SVG}title") is not None and root.attrib["role"] == "img"


@pytest.mark.parametrize(("window", "step"), [("24h", "hour"), ("7d", "hour")])
async def test_the_longer_windows_step_by_the_hour_with_dates(
    browser: Browser, service: Service, clock: Clock, window: str, step: str
) -> None:
    await ran(service, clock)
    body = (await browser.get(f"/ui/metrics?window={window}")).body
    outcomes = texts(svgs(body)["chart-outcomes"])
    assert f"Jobs per {step}" in outcomes
    assert any(re.fullmatch(r"\d\d-\d\d \d\d:00", t) for t in outcomes), outcomes
    assert "aria-current=page>Last 7 days" in body if window == "7d" else "Last 24 hours" in body


async def test_the_job_names_table_per_queue_and_overall_sorts_and_links(
    browser: Browser, service: Service, clock: Clock
) -> None:
    await ran(service, clock)
    body = (await browser.get("/ui/metrics")).body
    names = re.findall(r'<th scope="row"><a href="[^"]*" title="Charts of ([^ ]+) on (\w+)"', body)
    assert names == [("echo", "mail"), ("boom", "mail"), ("echo", "reports")], "by ended, desc"
    assert "100.0 %" in body and "0.0 %" in body  # boom's failure rate, echo's
    assert 'href="/ui/queues/mail?name=boom"' in body  # its jobs
    assert 'href="/ui/metrics?queue=mail&amp;name=boom"' in body  # its charts
    body = (await browser.get("/ui/metrics?sort=-failure")).body
    names = re.findall(r'title="Charts of ([^ ]+) on (\w+)"', body)
    assert names[0] == ("boom", "mail")
    assert "Failure rate ▼" in body
    body = (await browser.get("/ui/metrics?sort=name")).body
    names = re.findall(r'title="Charts of ([^ ]+) on (\w+)"', body)
    assert names == [("boom", "mail"), ("echo", "mail"), ("echo", "reports")]
    # Per queue: only its names; per name: its charts.
    body = (await browser.get("/ui/metrics?queue=reports")).body
    assert re.findall(r'title="Charts of ([^ ]+) on (\w+)"', body) == [("echo", "reports")]
    assert 'href="/ui/queues/reports">Queue reports</a>' in body  # the breadcrumb
    body = (await browser.get("/ui/metrics?queue=mail&name=boom")).body
    assert "completed (solid): 0" in body and "failed (cross-hatched): 2" in body
    # A job's page links to its name's metrics.
    (job,) = [
        r["id"]
        for r in (
            await service.queue.binding.run("SELECT id FROM d1queue_failed_jobs LIMIT 1")
        ).rows
    ]
    body = (await browser.get(f"/ui/jobs/{job}")).body
    assert 'href="/ui/metrics?queue=mail&amp;name=boom">(its metrics)</a>' in body
    # The queue page links to its metrics.
    assert 'href="/ui/metrics?queue=mail"' in (await browser.get("/ui/queues/mail")).body


@pytest.mark.parametrize(
    "query",
    ["window=2h", "sort=size", "sort=--ended", "queue=a%20b", "name=%3Cb%3E", "colour=red"],
)
async def test_a_bad_parameter_is_a_400(browser: Browser, query: str) -> None:
    reply = await browser.get(f"/ui/metrics?{query}")
    assert reply.status == 400
    assert "<b>" not in reply.body


async def test_the_page_costs_one_query_a_shard_whatever_the_jobs(
    browser: Browser, service: Service, clock: Clock
) -> None:
    await ran(service, clock)
    usage = service.queue.binding.usage
    for window in ("1h", "24h", "7d"):
        before = usage.queries
        await browser.get(f"/ui/metrics?window={window}")
        assert usage.queries == before + 2, "the session's read, then one batch"


async def test_metrics_under_a_prefix(service: Service, clock: Clock) -> None:
    await ran(service, clock)
    b = Browser(Dashboard(service, TOKEN, prefix="/queue"), clock)
    await b.post("/queue/ui/signin", {"token": TOKEN, "next": "/ui"})
    body = (await b.get("/queue/ui/metrics?sort=name")).body
    addresses = re.findall(r'(?:href|action|src)="(/[^"]*)"', body)
    assert addresses and all(a.startswith("/queue/ui") for a in addresses), addresses
    assert 'fill="url(#chart-outcomes-c)"' in body  # a pattern, not an address


async def test_nothing_recorded_says_so(browser: Browser) -> None:
    body = (await browser.get("/ui/metrics?window=7d")).body
    assert "No jobs recorded for every queue and job name in this window." in body
    assert "No job names recorded yet" in body and "<svg" not in body


# -- the drawing, with made-up values -----------------------------------------------------


def test_labels_and_scales() -> None:
    assert [nice_top(v) for v in (0, 1, 3, 7, 12, 0.004)] == [1, 1, 5, 10, 20, 0.005]
    assert [seconds_label(s) for s in (0, 0.0025, 1.5, 300, 9000, None)] == [
        "0 s",
        "2.5 ms",
        "1.5 s",
        "5 min",
        "2.5 h",
        "—",
    ]
    assert time_label(0, 60_000) == "00:00" and time_label(0, 3_600_000) == "01-01 00:00"


def test_a_chart_escapes_what_it_is_given() -> None:
    axis = Axis(0, 60_000, 3)
    out = bars("x", "<b>title</b>", axis, [("completed", [1, 0, 2])], step_word="minute")
    assert "<b>" not in out and "&lt;b&gt;title&lt;/b&gt;" in out
    out = lines("y", "a & b", axis, [("p50", "p50 <run>", [0.1, None, 0.2])], step_word="minute")
    assert "p50 &lt;run&gt;" in out and "<run>" not in out
    # The line breaks where nothing ran: two points, each its own run, no polyline.
    assert "<polyline" not in out and out.count('class="pt p50"') == 3  # the key's, and two


def test_a_share_bar_shows_the_failed_part_apart() -> None:
    out = share_bar("b", [("completed", 1), ("failed", 1)], 2)
    assert re.findall(r'<rect class="(c|f)" x="([0-9.]+)%" y="0" width="([0-9.]+)%"', out) == [
        ("c", "0.0", "50.0"),
        ("f", "50.0", "50.0"),
    ]
    assert "1 failed (cross-hatched)" in out and "0 not ended (empty)" in out


def test_rows_without_a_value_sort_last_either_way() -> None:
    f = Figures()
    f.counts = [2, 0, 1, 0]
    rows = [NameRow("q", "a", Figures()), NameRow("q", "b", f)]
    for sort in ("failure", "-failure"):
        assert [r.name for r in sort_rows(rows, sort)][-1] == "a", sort
    assert [r.name for r in sort_rows(rows, "-name")] == ["b", "a"]
