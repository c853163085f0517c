"""Every dashboard page at 100,000 jobs, on SqliteD1: each answers, and the
search and the metrics page read what they read at ten jobs (the search its
capped rows, through an index; the metrics page its rows per job name),
whatever the number of jobs. The index plans: test_dashboard_search.py."""

from __future__ import annotations

import re

import pytest

from d1queue import D1Queue
from d1queue.core.bounds import SEARCH_ROWS
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.dashboard import Store

from .contract import Clock
from .test_dashboard import TOKEN, Browser, registry

SEED = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, created_at, band) "
    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1) "
    "SELECT printf('b%012d', i), 'bulk', 'echo', printf('{\"i\": %d}', i), 0, 3, 0, "
    "?2 + i, ?2, 0 FROM c"
)
JOBS = 100_000


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    db.query(SEED, JOBS, clock() - JOBS - 10)
    return Service(D1Queue(db, clock=clock, metrics=True), registry())


@pytest.fixture
async def browser(service: Service, clock: Clock) -> Browser:
    b = Browser(Dashboard(service, TOKEN), clock)
    await b.sign_in()
    return b


async def test_every_page_answers_at_100_000_jobs(browser: Browser, service: Service) -> None:
    usage = service.queue.binding.usage
    for path, queries in (
        ("/ui", None),
        ("/ui/queues/bulk", None),
        ("/ui/queues/bulk?name=echo&state=ready", None),
        ("/ui/failed", None),
        ("/ui/schedules", None),
        ("/ui/metrics?window=7d", 2),
        ("/ui/search?q=name:echo", 2),
        ("/ui/running", 2),  # the session, and one query: the locked band
        ("/ui/search?q=b000000000001", 2),  # the oldest job's id: one round trip
        ("/ui/jobs/b000000000001", None),
    ):
        before = usage.queries
        reply = await browser.get(path)
        assert reply.status in (200, 303), path
        if queries is not None:
            assert usage.queries - before == queries, path
    # Every job matches: the page fills before the cap, newest first.
    body = (await browser.get("/ui/search?q=name:echo")).body
    ids = re.findall(r'<td class="mono"><a href="/ui/jobs/([^"]+)">', body)
    assert ids[0] == f"b{JOBS:012d}" and len(ids) == 50
    assert "Next page »" in body and "Stopped early" not in body
    # One job matches, the oldest: the page stops at its cap and says so.
    body = (await browser.get("/ui/search?q=%22i%22%3A+1%7D")).body
    assert "Stopped early: this page read 1,000 jobs" in body and "Next page »" in body


async def test_a_search_reads_its_cap_at_100_000_jobs(service: Service) -> None:
    store = Store(service.queue)
    page = await store.search("live", {"text": '"i": 1}'})
    assert (page.scanned, page.stopped_early, page.rows) == (SEARCH_ROWS, True, [])
    assert page.next_cursor == f"b{JOBS - SEARCH_ROWS + 1:012d}"
