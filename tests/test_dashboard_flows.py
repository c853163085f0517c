"""The dashboard's batches index and its schedule actions under CPython,
against SqliteD1: the index's states (a failed batch reads failed), progress
in words, callbacks, keyset paging over shards and its bounded read; a
schedule's page with its last runs, "Run now" (CSRF-checked, pushed once
however often the click is sent) and "Edit" (the API's rules: a bad value is
a clear 422 and writes nothing); read-only sessions get neither (403); the
cron's cost unchanged by the runs it records. The same in a real browser:
tests/runtime/test_dashboard_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.errors import Fail
from d1queue.core.shards import Routing
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.dashboard import PAGE, Store
from d1queue.store.shardset import ShardSet

from .conftest import MIGRATIONS
from .contract import Clock
from .test_dashboard import TOKEN, Browser

READONLY = "read-only-token-for-tests-0123456789"
MINUTE = 60_000


def registry() -> Registry:
    reg = Registry()

    @reg.job("step")
    async def step(payload: Any) -> Any:
        return payload

    @reg.job("boom", max_attempts=1)
    async def boom(payload: Any) -> None:
        raise Fail("told to fail")

    @reg.job("tick", queue="ticks", max_attempts=3, priority=2)
    async def tick(payload: Any) -> None: ...

    return reg


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    reg = registry()
    return Service(D1Queue(db, clock=clock, registry=reg, keep_completed=True), reg)


@pytest.fixture
async def browser(service: Service, clock: Clock) -> Browser:
    b = Browser(Dashboard(service, TOKEN, readonly_token=READONLY), clock)
    await b.sign_in()
    return b


async def run(service: Service, *queues: str) -> None:
    for _ in range(3):
        await drain(service.queue, service.registry, Config(queues=queues or ("mail",)))


# -- the batches index ------------------------------------------------------------------


async def test_the_batches_index_shows_a_failed_batch_as_failed(
    browser: Browser, service: Service
) -> None:
    q = service.queue
    good, _ = await q.batch(
        [q.new_job("step", 1, queue="mail")], on_success=q.new_job("step", "s", queue="mail")
    )
    bad, _ = await q.batch(
        [q.new_job("step", 1, queue="mail"), q.new_job("boom", 2, queue="mail")],
        on_success=q.new_job("step", "s", queue="mail"),
        on_failure=q.new_job("step", "f", queue="mail"),
    )
    body = (await browser.get("/ui/batches")).body
    assert 'href="/ui/batches"' in body  # in the navigation
    assert body.count('badge running">running') == 2
    assert "not pushed yet" in body
    await run(service)
    reply = await browser.get("/ui/batches")
    assert reply.status == 200
    body = reply.body
    rows = re.findall(r"<tr>.*?</tr>", body, re.S)[1:]
    assert [re.search(r'href="/ui/batches/([^"]+)"', r).group(1) for r in rows] == [bad, good]
    failed, succeeded = rows
    assert 'badge failed">failed' in failed and "succeeded" not in failed
    assert "2 of 2 ended: 1 completed, 1 failed, 0 pending" in failed
    # The bar is split by outcome: half solid, half cross-hatched.
    parts = re.findall(r'<rect class="(c|f)" x="[0-9.]+%" y="0" width="([0-9.]+)%"', failed)
    assert parts == [("c", "50.0"), ("f", "50.0")]
    assert "on_failure: <strong>pushed</strong>" in failed
    assert "on_success: " in failed and "its case did not occur" in failed
    assert 'badge succeeded">succeeded' in succeeded
    assert "on_success: <strong>pushed</strong>" in succeeded
    assert "1 of 1 ended: 1 completed, 0 failed" in succeeded


async def test_the_batches_index_is_paged_newest_first_and_costs_one_bounded_query(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    q = service.queue
    made = []
    for i in range(PAGE + 5):
        clock.advance(0.001)
        made.append((await q.batch([q.new_job("step", i, queue="mail")]))[0])
    usage = q.binding.usage
    before = (usage.queries, usage.rows_read)
    page = await Store(q).batches()
    assert usage.queries - before[0] == 1
    assert usage.rows_read - before[1] <= 2 * (PAGE + 1)
    assert [r["id"] for r in page.rows] == made[::-1][:PAGE]
    body = (await browser.get("/ui/batches")).body
    nxt = re.search(r'href="(/ui/batches\?cursor=[0-9a-f]{32})">Next page', body)
    assert nxt, body
    body = (await browser.get(nxt.group(1))).body
    shown = re.findall(r'<th scope="row"><a class="mono" href="/ui/batches/([^"]+)"', body)
    assert shown == made[::-1][PAGE:]
    assert "Next page" not in body and "First page" in body
    for bad in ("?cursor=zz", "?cursor=%3Cx%3E", "?page=2"):
        reply = await browser.get("/ui/batches" + bad)
        assert reply.status == 400 and 'role="alert"' in reply.body


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


async def test_batches_are_merged_over_shards_newest_first(sharded: ShardSet, clock: Clock) -> None:
    made = []
    for i in range(60):
        clock.advance(0.001)
        queue = f"q{i % 7}"
        q = sharded.home
        job = q.new_job("step", i, queue=queue)
        job.id = ""  # placed by its queue's shard
        made.append((await q.batch([job]))[0])
    # The queues' routing put batches on both shards.
    assert any(b.startswith("s1-") for b in made) and not all(b.startswith("s1-") for b in made)
    store = Store(sharded.home, sharded)
    page = await store.batches()
    rest = await store.batches(page.next_cursor)
    assert rest.next_cursor is None
    assert [r["id"] for r in page.rows + rest.rows] == made[::-1]
