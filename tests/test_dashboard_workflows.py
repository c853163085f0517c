"""The dashboard's workflow pages under CPython, against SqliteD1: a queue's
completed jobs with their results, a job's dependencies and dependents, a
batch's progress; and the store reads behind them (store/dashboard.py). The
same pages in a real browser: tests/runtime/test_dashboard_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlencode

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.errors import Fail
from d1queue.core.shards import Routing
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.dashboard.app import CSP
from d1queue.interfaces.dashboard.mask import MASK
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import dashboard as dashboard_store
from d1queue.store.dashboard import BATCH_PAGE, ShardStore, Store
from d1queue.store.shardset import ShardSet

from .conftest import MIGRATIONS
from .contract import Clock
from .test_dashboard import TOKEN, Browser


def registry() -> Registry:
    reg = Registry()

    @reg.job("step")
    async def step(payload: Any) -> Any:
        return {"n": payload, "html": "<b>done</b>", "api_key": "sk-live-123456", "pad": "y" * 300}

    @reg.job("quiet")
    async def quiet(payload: Any) -> None: ...

    @reg.job("boom", max_attempts=1)
    async def boom(payload: Any) -> None:
        raise Fail("told to fail")

    reg.history("nohist", keep=False)
    return reg


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    reg = registry()
    return Service(D1Queue(db, clock=clock, registry=reg, keep_completed=True), reg)


@pytest.fixture
async def browser(service: Service, clock: Clock) -> Browser:
    b = Browser(Dashboard(service, TOKEN), clock)
    await b.sign_in()
    return b


async def run(service: Service, *queues: str) -> None:
    for _ in range(3):  # waiters become ready as their dependencies complete
        await drain(service.queue, service.registry, Config(queues=queues or ("mail",)))


def links(body: str, base: str = "/ui/jobs/") -> list[str]:
    return [unquote(i) for i in re.findall(rf'href="{re.escape(base)}([^"]+)"', body)]


# -- the pages are signed in, strict, and refuse bad input ----------------------------

NEW_PAGES = ["/ui/queues/mail/completed", "/ui/batches/abc"]


@pytest.mark.parametrize("path", NEW_PAGES)
async def test_the_new_pages_are_not_readable_signed_out(
    service: Service, clock: Clock, path: str
) -> None:
    reply = await Browser(Dashboard(service, TOKEN), clock).get(path)
    assert reply.status == 303
    assert reply.headers["location"] == "/ui/signin?" + urlencode({"next": path})


async def test_the_new_pages_carry_the_csp_and_no_inline_code(
    browser: Browser, service: Service
) -> None:
    q = service.queue
    batch, _ = await q.batch([q.new_job("step", 1, queue="mail")])
    await run(service)
    for path in ("/ui/queues/mail/completed", f"/ui/batches/{batch}"):
        reply = await browser.get(path)
        assert reply.status == 200, path
        assert reply.headers["content-security-policy"] == CSP
        assert reply.headers["cache-control"] == "no-store"
        assert not re.search(r"<script(?![^>]*\bsrc=)", reply.body), "inline script"
        assert " style=" not in reply.body and "<style" not in reply.body
        assert "<form" in reply.body  # sign-out only: a read-only page has no action


@pytest.mark.parametrize(
    "path,status",
    [
        ("/ui/queues/mail/completed?cursor=zzz", 400),
        ("/ui/queues/mail/completed?cursor=1%3A%3Cx%3E", 400),
        ("/ui/queues/mail/completed?limit=5", 400),
        ("/ui/queues/bad%20name/completed", 400),
        ("/ui/batches/%3Cscript%3E", 400),
        ("/ui/batches/abc?page=0", 400),
        ("/ui/batches/abc?page=x", 400),
        ("/ui/batches/abc?pg=1", 400),
        ("/ui/batches/abc", 404),
        ("/ui/batches/s9-abc", 404),  # a shard not configured
        ("/ui/jobs/s9-abc", 404),
    ],
)
async def test_bad_ids_and_parameters_are_a_clear_4xx(
    browser: Browser, path: str, status: int
) -> None:
    reply = await browser.get(path)
    assert reply.status == status, reply.body
    assert 'role="alert"' in reply.body if status == 400 else 'class="empty"' in reply.body


# -- completed jobs --------------------------------------------------------------------


async def test_completed_jobs_are_listed_newest_first_paged_with_results_masked(
    browser: Browser, service: Service, clock: Clock
) -> None:
    ids = []
    for i in range(55):
        ids.append((await service.dispatch("mail", {"name": "step", "payload": i}))["id"])
    ids.append((await service.dispatch("mail", {"name": "quiet"}))["id"])
    for _ in range(56):  # one a drain, so each completes at its own ms
        clock.advance(0.01)
        await drain(service.queue, service.registry, Config(queues=("mail",), batch_size=1))
    queue_page = (await browser.get("/ui/queues/mail")).body
    assert 'href="/ui/queues/mail/completed"' in queue_page
    body = (await browser.get("/ui/queues/mail/completed")).body
    first = links(body)
    assert len(first) == 50
    assert MASK in body and "sk-live-123456" not in body  # the result's secret
    assert "&lt;b&gt;done&lt;/b&gt;" in body and "<b>done" not in body
    assert "…" in body  # a long result is cut short
    nxt = re.search(r'href="(/ui/queues/mail/completed\?cursor=[^"]+)">Next page', body)
    assert nxt
    body = (await browser.get(nxt.group(1).replace("&amp;", "&"))).body
    second = links(body)
    assert len(second) == 6 and "Next page" not in body and "First page" in body
    # Newest first: the jobs completed in the order they were pushed.
    assert first + second == ids[::-1]


async def test_a_queue_without_history_says_so(browser: Browser, service: Service) -> None:
    await service.dispatch("nohist", {"name": "step", "payload": 1})
    await run(service, "nohist")
    body = (await browser.get("/ui/queues/nohist/completed")).body
    assert "keeps no history" in body and not links(body)
    body = (await browser.get("/ui/queues/mail/completed")).body
    assert "No completed jobs kept." in body


async def test_a_completed_jobs_page_shows_its_result_and_when(
    browser: Browser, service: Service
) -> None:
    id = (await service.dispatch("mail", {"name": "step", "payload": 7}))["id"]
    quiet = (await service.dispatch("mail", {"name": "quiet"}))["id"]
    await run(service)
    reply = await browser.get(f"/ui/jobs/{id}")
    assert reply.status == 200, reply.body
    body = reply.body
    assert 'badge completed">completed' in body and "Completed at" in body
    assert "<h2>Result</h2>" in body and "&quot;n&quot;: 7" in body
    assert MASK in body and "sk-live" not in body
    assert "Cancel job" not in body and "Run now" not in body
    assert "the handler returned nothing" in (await browser.get(f"/ui/jobs/{quiet}")).body


# -- dependencies and dependents -----------------------------------------------------


async def test_a_jobs_page_links_its_dependencies_and_dependents_with_their_states(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    q = service.queue
    a = await q.dispatch("step", 1, queue="mail")
    b = await q.dispatch("step", 2, queue="mail", after=[a])
    c = await q.dispatch("step", 3, queue="mail", after=[a, b], ignore_failed=True)
    body = (await browser.get(f"/ui/jobs/{c}")).body
    assert 'badge waiting">waiting' in body and "May start at" in body
    assert "Waits for 2 jobs" in body and "(0 completed)" in body
    assert links(body) == [a, b]
    assert re.search(rf'{a}</a> <span class="badge ready">', body)
    assert re.search(rf'{b}</a> <span class="badge waiting">', body)
    assert "Ignores failed dependencies</dt><dd>yes" in body
    assert "It waits for its dependencies" in body
    body = (await browser.get(f"/ui/jobs/{a}")).body
    assert "Waited for by" in body and {b, c} <= set(links(body))
    assert "Waits for" not in body and "Ignores failed" not in body
    body = (await browser.get(f"/ui/jobs/{b}")).body
    assert "Ignores failed dependencies</dt><dd>no" in body
    assert a in links(body) and c in links(body)

    await run(service)
    body = (await browser.get(f"/ui/jobs/{c}")).body
    assert 'badge completed">completed' in body and "(2 completed)" in body
    body = (await browser.get(f"/ui/jobs/{a}")).body
    assert re.search(rf'{c}</a> <span class="badge completed">', body), body


async def test_a_failed_jobs_page_shows_what_it_waited_for_and_its_batch(
    browser: Browser, service: Service
) -> None:
    q = service.queue
    a = await q.dispatch("boom", 1, queue="mail")
    batch, (b,) = await q.batch([q.new_job("step", 2, queue="mail", after=[a])])
    await run(service)
    body = (await browser.get(f"/ui/jobs/{b}")).body
    assert 'badge failed">failed' in body and f"dependency {a} failed" in body
    assert f'href="/ui/batches/{batch}"' in body
    assert re.search(rf'{a}</a> <span class="badge failed">', body)
    assert ">Retry</button>" in body


async def test_a_cancelled_dependent_is_shown_as_not_kept(
    browser: Browser, service: Service
) -> None:
    q = service.queue
    a = await q.dispatch("step", 1, queue="mail", delay_s=60)
    b = await q.dispatch("step", 2, queue="mail", after=[a])
    await browser.get(f"/ui/jobs/{b}")
    reply = await browser.post(f"/ui/jobs/{b}/cancel", {"csrf": browser.csrf()})
    assert reply.status == 303
    body = (await browser.get(f"/ui/jobs/{a}")).body
    assert b in links(body) and "not kept" in body


async def test_the_job_page_costs_two_round_trips(browser: Browser, service: Service) -> None:
    q = service.queue
    a = await q.dispatch("step", 1, queue="mail")
    after = [a, *[await q.dispatch("step", i, queue="mail") for i in range(99)]]
    c = await q.dispatch("step", 3, queue="mail", after=after)
    usage = service.queue.binding.usage
    before = usage.queries
    body = (await browser.get(f"/ui/jobs/{c}")).body
    assert usage.queries == before + 3, "the session, the job, its links"
    assert "Waits for 100 jobs" in body and body.count('badge ready">ready') == 100


# -- batches --------------------------------------------------------------------------


async def test_a_batch_page_shows_its_progress_jobs_and_callbacks(
    browser: Browser, service: Service
) -> None:
    q = service.queue
    members = [q.new_job("boom" if i == 2 else "step", i, queue="mail") for i in range(5)]
    batch, ids = await q.batch(
        members,
        on_success=q.new_job("quiet", "s", queue="mail"),
        on_failure=q.new_job("quiet", "f", queue="mail"),
    )
    body = (await browser.get(f"/ui/batches/{batch}")).body
    assert 'badge running">running' in body
    assert 'aria-valuemax="5" aria-valuenow="0"' in body
    assert "0 of 5 ended" in body
    assert links(body) == [f"{batch}:on_success", f"{batch}:on_failure", *ids]
    assert body.count("not enqueued yet") == 2 and "on_finish" not in body
    await run(service)
    body = (await browser.get(f"/ui/batches/{batch}")).body
    assert 'badge failed">failed' in body
    assert 'aria-valuemax="5" aria-valuenow="5"' in body
    assert "(4 completed, 1 failed)" in body
    # Not one green fill: the failed share is its own cross-hatched part.
    bar = re.search(r'<svg class="share".*?</svg>', body, re.S)
    assert bar is not None
    parts = re.findall(r'<rect class="(c|f)" x="[0-9.]+%" y="0" width="([0-9.]+)%"', bar.group())
    assert parts == [("c", "80.0"), ("f", "20.0")], parts
    assert 'fill="url(#batch-bar-f)"' in bar.group()
    assert "1 failed (cross-hatched)" in body and "4 completed (solid)" in body
    assert re.search(rf'{batch}:on_failure</a> <span class="badge completed">', body), body
    assert "on_success" in body and "its case did not occur" in body
    assert re.search(rf'{ids[2]}</a> <span class="badge failed">', body)
    job = (await browser.get(f"/ui/jobs/{ids[0]}")).body
    assert f'href="/ui/batches/{batch}"' in job


async def test_a_large_batch_is_paged(browser: Browser, service: Service) -> None:
    q = service.queue
    n = BATCH_PAGE + 50
    batch, ids = await q.batch([q.new_job("quiet", i, queue="mail") for i in range(n)])
    body = (await browser.get(f"/ui/batches/{batch}")).body
    assert links(body) == ids[:BATCH_PAGE] and f"Jobs 1 to {BATCH_PAGE} of {n}" in body
    assert body.count('badge ready">ready') == BATCH_PAGE
    nxt = re.search(r'href="(/ui/batches/[^"]+\?page=2)">Next page', body)
    assert nxt
    body = (await browser.get(nxt.group(1))).body
    assert links(body) == ids[BATCH_PAGE:] and "« Previous" in body and "Next page" not in body
    assert (await browser.get(f"/ui/batches/{batch}?page=3")).status == 400


# -- the store's reads -------------------------------------------------------------------


async def test_store_links_and_batch_reads(
    service: Service, db: SqliteD1, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A page lists LINKS dependents and says there are more: fewer than a job
    # may have (bounds.MAX_DEPENDENTS), to see the page run over.
    links = 10
    monkeypatch.setattr(dashboard_store, "LINKS", links)
    store = ShardStore(service.queue)
    q = service.queue
    a = await q.dispatch("step", 1, queue="mail")
    waiters = [await q.dispatch("step", i, queue="mail", after=[a]) for i in range(links + 2)]
    got = await store.links(a, [])
    assert got.dependents == sorted(waiters)[:links] and got.more_dependents
    assert set(got.states) == set(got.dependents) and set(got.states.values()) == {"waiting"}
    got = await store.links(waiters[0], [a, "gone"])
    assert got.states == {a: "ready"} and got.dependents == []
    # A running job is found by no index: the walk of the locked bands finds it.
    held = await q.reserve("mail")
    assert held is not None and held.id == a
    got = await store.links(waiters[0], [a])
    assert got.states == {a: "reserved"}
    b = await q.dispatch("step", 2, queue="mail", after=[waiters[0]])
    assert (await store.links(waiters[0], [a])).states == {a: "reserved", b: "waiting"}
    assert await store.batch("nope") is None
    batch, ids = await q.batch([q.new_job("step", 1, queue="mail")])
    page = await store.batch(batch)
    assert page is not None and page.ids == ids and page.pages == 1 and page.callbacks == []
    assert page.batch.state == "running" and page.states == {ids[0]: "ready"}
    with pytest.raises(ValueError):
        await store.batch(batch, 2)
    with pytest.raises(ValueError):
        await store.completed("mail", "not-a-cursor")


@pytest.fixture
def sharded(clock: Clock) -> Iterator[ShardSet]:
    dbs = []
    for _ in range(2):
        d = SqliteD1()
        d.apply_migrations(MIGRATIONS)
        dbs.append(d)
    yield ShardSet([D1Queue(d, clock=clock, keep_completed=True) for d in dbs], Routing(2))
    for d in dbs:
        d.close()


async def test_completed_jobs_are_merged_over_shards_newest_first(
    sharded: ShardSet, clock: Clock
) -> None:
    reg = registry()
    for i in range(60):
        await sharded.queue(i % 2).dispatch("quiet", i, queue="hot")
    for _ in range(60):
        clock.advance(0.01)
        for k in (0, 1):
            await drain(sharded.queue(k), reg, Config(queues=("hot",), batch_size=1))
    store = Store(sharded.home, sharded)
    page = await store.completed("hot")
    assert len(page.rows) == 50 and page.next_cursor
    rest = await store.completed("hot", page.next_cursor)
    rows = page.rows + rest.rows
    assert len(rows) == 60 and rest.next_cursor is None
    assert len({r["id"] for r in rows}) == 60
    times = [(r["completed_at"], r["id"]) for r in rows]
    assert times == sorted(times, reverse=True)
