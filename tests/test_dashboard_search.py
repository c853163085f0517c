"""The search (search.py, store/dashboard.py Store.search): a box on every
signed-in page; an id jumps to its job or batch; qualifiers and words find
jobs by queue, name, state, group, batch and text in payload or error,
newest first, paged with the filter in the URL; each page reads at most
SEARCH_ROWS rows a shard through an index and says when it stopped early.
Every value shown is escaped."""

from __future__ import annotations

import re
from typing import Any

import pytest

from d1queue import Config, D1Queue, drain
from d1queue.core.bounds import SEARCH_ROWS
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql
from d1queue.store.dashboard import PAGE, SEARCH_SOURCES, Store
from d1queue.store.shardset import ShardSet

from .contract import Clock
from .test_dashboard import TOKEN, Browser, fail_some, registry


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    return Service(D1Queue(db, clock=clock, keep_completed=True), registry())


@pytest.fixture
async def browser(service: Service, clock: Clock) -> Browser:
    b = Browser(Dashboard(service, TOKEN), clock)
    await b.sign_in()
    return b


def found(body: str) -> list[str]:
    """The job ids a results page lists, in order."""
    section = body.split('id="results"', 1)[-1]
    return re.findall(r'<td class="mono"><a href="/ui/jobs/([^"]+)">', section)


async def push(service: Service, queue: str, name: str, payload: Any, **more: Any) -> str:
    return str((await service.dispatch(queue, {"name": name, "payload": payload, **more}))["id"])


async def test_every_page_has_the_box(browser: Browser) -> None:
    for path in ("/ui", "/ui/failed", "/ui/schedules", "/ui/metrics", "/ui/queues/mail"):
        body = (await browser.get(path)).body
        assert '<form method="get" action="/ui/search" class="search top"' in body, path


async def test_an_id_jumps_to_its_job_or_batch_with_two_point_reads_at_most(
    browser: Browser, service: Service
) -> None:
    id = await push(service, "mail", "echo", 1)
    usage = service.queue.binding.usage
    before = usage.queries
    reply = await browser.get(f"/ui/search?q=+{id}+")
    assert (reply.status, reply.headers["location"]) == (303, f"/ui/jobs/{id}")
    assert usage.queries - before == 2, "the session's read and the job's"
    q = service.queue
    batch, _ = await q.batch([q.new_job("echo", 1, queue="mail")])
    reply = await browser.get(f"/ui/search?q={batch}")
    assert (reply.status, reply.headers["location"]) == (303, f"/ui/batches/{batch}")
    assert (await browser.get(f"/ui/search?q=batch:{batch}")).headers["location"] == (
        f"/ui/batches/{batch}"
    )
    (failed,) = await fail_some(service, 1)
    assert (await browser.get(f"/ui/search?q={failed}")).headers["location"] == f"/ui/jobs/{failed}"


async def test_qualifiers_and_words_find_jobs_across_queues(
    browser: Browser, service: Service, clock: Clock
) -> None:
    a = await push(service, "mail", "echo", {"to": "ada@example.com"}, group="acct-1")
    b = await push(service, "reports", "echo", {"to": "bob@example.com"})
    c = await push(service, "reports", "boom", {"note": "ADA again"}, delay_s=60)
    assert found((await browser.get("/ui/search?q=name:echo")).body) == [b, a]
    assert found((await browser.get("/ui/search?q=ada")).body) == [c, a], "payload, any case"
    assert found((await browser.get("/ui/search?q=queue:reports")).body) == [c, b]
    assert found((await browser.get("/ui/search?q=state:delayed")).body) == [c]
    assert found((await browser.get("/ui/search?q=group:acct-1")).body) == [a]
    assert found((await browser.get("/ui/search?q=name:echo+bob")).body) == [b]
    body = (await browser.get("/ui/search?q=nobody")).body
    assert found(body) == [] and "No job matches “nobody”" in body
    # Failed jobs by their error; completed ones kept, by their payload.
    (f,) = await fail_some(service, 1, queue="mail")
    body = (await browser.get("/ui/search?q=state:failed+bad")).body
    assert found(body) == [f] and 'badge failed">failed' in body
    assert 'href="/ui/search?q=bad"' in body  # the same words among the queued jobs
    await drain(service.queue, service.registry, Config(queues=("mail",)))
    assert found((await browser.get("/ui/search?q=state:completed+ada")).body) == [a]


async def test_a_page_reads_at_most_its_cap_and_says_it_stopped_early(
    browser: Browser, service: Service
) -> None:
    ids = [await push(service, "bulk", "echo", {"i": i}) for i in range(SEARCH_ROWS + 60)]
    needle = await push(service, "bulk", "echo", {"needle": True})
    store = Store(service.queue)
    page = await store.search("live", {"text": "needle"})
    assert [r["id"] for r in page.rows] == [needle]
    assert (page.scanned, page.stopped_early) == (SEARCH_ROWS, True)
    assert page.next_cursor is not None
    rest = await store.search("live", {"text": "needle"}, page.next_cursor)
    assert (rest.rows, rest.scanned, rest.stopped_early) == ([], 61, False)
    assert rest.next_cursor is None
    # Every match is listed once over the pages, newest first.
    seen: list[str] = []
    cursor = "~"
    while True:
        got = await store.search("live", {"name": "echo"}, cursor, cap=70)
        seen += [str(r["id"]) for r in got.rows]
        assert len(got.rows) <= PAGE and got.scanned <= 70
        if got.next_cursor is None:
            break
        cursor = got.next_cursor
    assert seen == [needle, *reversed(ids)]
    body = (await browser.get("/ui/search?q=needle")).body
    assert "Stopped early: this page read 1,000 jobs" in body and "Next page »" in body
    nxt = re.search(r'href="(/ui/search\?q=needle&amp;cursor=[^"]+)">Next page', body)
    assert nxt
    body = (await browser.get(nxt.group(1).replace("&amp;", "&"))).body
    assert "Stopped early" not in body and "« First page" in body


async def test_a_search_page_costs_one_query_a_shard(browser: Browser, service: Service) -> None:
    await push(service, "mail", "echo", 1)
    usage = service.queue.binding.usage
    before = usage.queries
    await browser.get("/ui/search?q=name:echo+state:ready")
    assert usage.queries == before + 2, "the session's read, then the search's batch"


@pytest.mark.parametrize("source", sorted(SEARCH_SOURCES))
def test_each_search_reads_through_an_index(db: SqliteD1, source: str) -> None:
    matches, span = SEARCH_SOURCES[source]
    index = {
        "live": "INDEX d1queue_jobs_id (id<?)",
        "completed": "INDEX d1queue_jobs_done (id<?)",
        "failed": "USING PRIMARY KEY (id<?)",
    }[source]
    for statement, args in (
        (matches, ("~", SEARCH_ROWS, "q", "n", "ready", "g", "b", "text", 0, PAGE + 1)),
        (span, ("~", SEARCH_ROWS)),
    ):
        plan = [str(r["detail"]) for r in db.query("EXPLAIN QUERY PLAN " + statement, *args)]
        assert any(index in line for line in plan), plan
        assert not any(re.match(r"SCAN d1queue_", line) for line in plan), plan
        assert sql.name_of(statement).startswith("SEARCH_")
    # The span reads the index alone (the live and completed ones: a covering index).
    if source != "failed":
        plan = [str(r["detail"]) for r in db.query("EXPLAIN QUERY PLAN " + span, "~", 1)]
        assert any("COVERING INDEX" in line for line in plan), plan


async def test_pages_over_shards_miss_nothing_and_repeat_nothing(
    sharded: ShardSet, clock: Clock
) -> None:
    ids = []
    for i in range(150):
        ids.append(str(await sharded.queue(i % 3 % 2).dispatch("echo", {"i": i}, queue="q")))
        clock.advance(0.001)
    store = Store(sharded.home, sharded)
    seen: list[str] = []
    cursor, pages = "~", 0
    while True:
        got = await store.search("live", {"queue": "q"}, cursor, cap=40)
        seen += [str(r["id"]) for r in got.rows]
        pages += 1
        if got.next_cursor is None:
            break
        cursor = got.next_cursor
    assert seen == sorted(ids, reverse=True) and pages > 3


async def test_what_a_search_shows_is_escaped_and_bad_input_is_a_400(browser: Browser) -> None:
    reply = await browser.get("/ui/search?q=%3Cscript%3Ex%3C/script%3E")
    assert reply.status == 200 and "<script>x" not in reply.body
    assert "&lt;script&gt;x&lt;/script&gt;" in reply.body
    reply = await browser.get("/ui/search?q=queue:%3Cb%3E")
    assert reply.status == 200 and "<b>" not in reply.body and 'role="alert"' in reply.body
    assert 'role="alert"' in (await browser.get("/ui/search?q=state:gone")).body
    assert (await browser.get("/ui/search?q=" + "x" * 301)).status == 400
    assert (await browser.get("/ui/search?q=x&cursor=%3Cb%3E")).status == 400
    assert (await browser.get("/ui/search?query=x")).status == 400
    assert "Words are looked for in payloads and errors" in (await browser.get("/ui/search")).body


async def test_search_under_a_prefix(service: Service, clock: Clock) -> None:
    await push(service, "mail", "echo", {"w": "needle"})
    b = Browser(Dashboard(service, TOKEN, prefix="/queue"), clock)
    await b.post("/queue/ui/signin", {"token": TOKEN, "next": "/ui"})
    body = (await b.get("/queue/ui/search?q=needle")).body
    addresses = re.findall(r'(?:href|action|src)="(/[^"]*)"', body)
    assert addresses and all(a.startswith("/queue/ui") for a in addresses), addresses
    assert len(found(body.replace('href="/queue/ui/jobs/', 'href="/ui/jobs/'))) == 1
    reply = await b.get("/queue/ui/search?q=state:reserved")
    assert "Jobs a worker holds now are not searched" in reply.body
