"""The search box (search.py): on every signed-in page; an id jumps to its
job or batch (a point read each, no scan); qualifiers lead to the paged
view that answers them, the filter in its URL; anything else lists what it
may mean. Every value shown is escaped."""

from __future__ import annotations

import pytest

from d1queue import D1Queue
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1

from .contract import Clock
from .test_dashboard import TOKEN, Browser, fail_some, registry


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    return Service(D1Queue(db, clock=clock), registry())


@pytest.fixture
async def browser(service: Service, clock: Clock) -> Browser:
    b = Browser(Dashboard(service, TOKEN), clock)
    await b.sign_in()
    return b


async def test_every_page_has_the_box(browser: Browser) -> None:
    for path in ("/ui", "/ui/failed", "/ui/schedules", "/ui/metrics", "/ui/queues/mail"):
        body = (await browser.get(path)).body
        assert '<form method="get" action="/ui/search" class="search top"' in body, path


async def test_an_id_jumps_to_its_job_or_batch_with_two_point_reads_at_most(
    browser: Browser, service: Service
) -> None:
    id = (await service.dispatch("mail", {"name": "echo"}))["id"]
    usage = service.queue.binding.usage
    before = usage.queries
    reply = await browser.get(f"/ui/search?q=+{id}+")
    assert (reply.status, reply.headers["location"]) == (303, f"/ui/jobs/{id}")
    assert usage.queries - before <= 2, "the session's read and the job's"
    q = service.queue
    batch, _ = await q.batch([q.new_job("echo", 1, queue="mail")])
    reply = await browser.get(f"/ui/search?q={batch}")
    assert (reply.status, reply.headers["location"]) == (303, f"/ui/batches/{batch}")
    (failed,) = await fail_some(service, 1)
    assert (await browser.get(f"/ui/search?q={failed}")).headers["location"] == f"/ui/jobs/{failed}"


@pytest.mark.parametrize(
    ("q", "location"),
    [
        ("queue:mail", "/ui/queues/mail"),
        ("queue:mail state:delayed name:echo", "/ui/queues/mail?state=delayed&name=echo"),
        ("state:failed queue:mail", "/ui/failed?queue=mail"),
        ("state:failed timed out", "/ui/failed?error=timed+out"),
        ("error:boom name:boom", "/ui/failed?name=boom&error=boom"),
        ("name:mail.send", "/ui/metrics?name=mail.send"),
        ("batch:abc", "/ui/batches/abc"),
    ],
)
async def test_qualifiers_lead_to_the_view_that_answers_them(
    browser: Browser, q: str, location: str
) -> None:
    reply = await browser.get("/ui/search?" + f"q={q}".replace(" ", "+"))
    assert (reply.status, reply.headers["location"]) == (303, location)


async def test_a_word_found_nowhere_lists_what_it_may_mean_escaped(browser: Browser) -> None:
    reply = await browser.get("/ui/search?q=mail")
    assert reply.status == 200
    assert 'href="/ui/queues/mail"' in reply.body and 'href="/ui/metrics?name=mail"' in reply.body
    assert "No job or batch has the id “mail”" in reply.body
    reply = await browser.get("/ui/search?q=%3Cscript%3Ex%3C/script%3E")
    assert reply.status == 200 and "<script>x" not in reply.body
    assert "&lt;script&gt;x&lt;/script&gt;" in reply.body
    reply = await browser.get("/ui/search?q=queue:%3Cb%3E")
    assert reply.status == 200 and "<b>" not in reply.body and 'role="alert"' in reply.body
    reply = await browser.get("/ui/search?q=state:gone")
    assert 'role="alert"' in reply.body
    assert (await browser.get("/ui/search?q=" + "x" * 301)).status == 400
    assert (await browser.get("/ui/search?query=x")).status == 400
    assert "Payload text is not searched" in (await browser.get("/ui/search")).body
