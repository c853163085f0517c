"""The "Running now" page (running.py, store/dashboard.py Store.running):
every job a worker holds, across queues and shards, with its name, queue,
group, attempt, time running and progress, and a Cancel button that goes
through the job's cancel action (CSRF-checked; none for the read-only
token, whose POST is refused). Each page reads at most RUNNING_ROWS rows
of the locked band a shard, through the primary key, and says when it
stopped early; pages over shards miss nothing and repeat nothing."""

from __future__ import annotations

import json
import re

import pytest

from d1queue import Config, D1Queue, drain
from d1queue.core.bounds import RUNNING_ROWS
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql
from d1queue.store.dashboard import PAGE, Store
from d1queue.store.shardset import ShardSet

from .contract import Clock
from .test_dashboard import TOKEN, Browser, registry
from .test_readonly import READONLY, signed_in

ROW_ID = re.compile(r'<td class="mono"><a href="/ui/jobs/([^"]+)">')


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    return Service(D1Queue(db, clock=clock), registry())


@pytest.fixture
def board(service: Service) -> Dashboard:
    return Dashboard(service, TOKEN, readonly_token=READONLY)


@pytest.fixture
async def browser(board: Dashboard, clock: Clock) -> Browser:
    b = Browser(board, clock)
    await b.sign_in()
    return b


async def push(service: Service, queue: str, **more: object) -> str:
    return str((await service.dispatch(queue, {"name": "echo", "payload": {}, **more}))["id"])


def report(db: SqliteD1, id: str, value: object, note: str, attempt: int, at: int) -> None:
    """A progress report as ctx.progress writes it (sql.SET_PROGRESS)."""
    progress = {"value": value, "note": note, "attempt": attempt, "at": at, "seq": 1}
    db.query("UPDATE d1queue_jobs SET progress = ?1 WHERE id = ?2", json.dumps(progress), id)


async def test_it_lists_every_held_job_with_its_progress_and_nothing_else(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    mail = await push(service, "mail", group="acct-7")
    await push(service, "mail")  # stays ready: not listed
    reports = await push(service, "reports")
    (held_mail,) = await service.queue.reserve_batch("mail", 1)
    (held_reports,) = await service.queue.reserve_batch("reports", 1)
    assert {held_mail.id, held_reports.id} == {mail, reports}
    report(db, mail, 40, "<b>step</b> 2 of 5", 1, clock())
    clock.advance(75)
    reply = await browser.get("/ui/running")
    assert reply.status == 200
    body = reply.body
    assert ROW_ID.findall(body) == [mail, reports]  # queue order
    assert "acct-7" in body and "1 of 3" in body
    assert "1 min" in body  # running for, since its claim
    # Which drain holds each: its claim's token, shortened.
    for id in (mail, reports):
        (row,) = db.query("SELECT reservation FROM d1queue_jobs WHERE id = ?", id)
        assert f">{row['reservation'][:8]}</span>" in body
    assert "&lt;b&gt;step&lt;/b&gt; 2 of 5" in body and "<b>step" not in body
    forms = re.findall(r'<form method="post" action="/ui/jobs/([^"]+)/cancel"', body)
    assert forms == [mail, reports]
    assert body.count('name="csrf"') >= 3 and 'name="back" value="/ui/running"' in body
    assert 'href="/ui/running" aria-current=page' in body  # in the top nav, marked here


async def test_a_report_of_an_earlier_attempt_is_not_shown_as_this_ones(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    id = await push(service, "mail")
    await service.queue.reserve_batch("mail", 1)
    report(db, id, "old-attempt-value", "", 0, clock())
    body = (await browser.get("/ui/running")).body
    assert ROW_ID.findall(body) == [id] and "old-attempt-value" not in body


async def test_cancel_from_the_page_marks_the_job_and_comes_back(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    id = await push(service, "mail")
    await service.queue.reserve_batch("mail", 1)
    await browser.get("/ui/running")
    # Without the session's CSRF token: refused, nothing written.
    reply = await browser.post(f"/ui/jobs/{id}/cancel", {"back": "/ui/running"})
    assert reply.status == 403
    assert db.query("SELECT cancel_at FROM d1queue_jobs")[0]["cancel_at"] is None
    reply = await browser.post(
        f"/ui/jobs/{id}/cancel", {"csrf": browser.csrf(), "back": "/ui/running"}
    )
    assert reply.status == 303
    assert reply.headers["location"] == "/ui/running?notice=cancelling"
    body = (await browser.get(reply.headers["location"])).body
    assert "Job running: marked, and its drain ends it cancelled." in body
    assert ROW_ID.findall(body) == [id] and "cancelling" in body
    assert f'action="/ui/jobs/{id}/cancel"' not in body  # asked once: no button again
    # A back that leaves the dashboard is not followed.
    other = await push(service, "mail")
    await service.queue.reserve_batch("mail", 1)
    reply = await browser.post(
        f"/ui/jobs/{other}/cancel", {"csrf": browser.csrf(), "back": "https://evil.example/"}
    )
    assert reply.headers["location"] == "/ui/queues/mail?notice=cancelling"


async def test_the_readonly_token_sees_the_page_without_cancel_and_is_refused(
    board: Dashboard, service: Service, db: SqliteD1, clock: Clock
) -> None:
    id = await push(service, "mail")
    await service.queue.reserve_batch("mail", 1)
    b = await signed_in(board, clock, READONLY)
    body = (await b.get("/ui/running")).body
    assert ROW_ID.findall(body) == [id]
    assert "/cancel" not in body and "Action" not in body
    reply = await b.post(f"/ui/jobs/{id}/cancel", {"csrf": b.csrf(), "back": "/ui/running"})
    assert reply.status == 403
    assert db.query("SELECT cancel_at FROM d1queue_jobs")[0]["cancel_at"] is None


async def test_nothing_running_and_bad_input(browser: Browser) -> None:
    reply = await browser.get("/ui/running")
    assert reply.status == 200 and "No job is running now" in reply.body
    assert (await browser.get("/ui/running?cursor=%3Cb%3E")).status == 400
    assert (await browser.get("/ui/running?cursor=q~1~%3Cb%3E")).status == 400
    assert (await browser.get("/ui/running?page=2")).status == 400


async def test_a_page_costs_one_query_and_reads_the_band_through_its_key(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    for q in ("a", "b", "c"):
        await push(service, q)
        await service.queue.reserve_batch(q, 1)
    usage = service.queue.binding.usage
    before = usage.queries
    await browser.get("/ui/running")
    assert usage.queries - before == 1 + 1  # the session's point read, then the page's
    assert usage.by_name["RUNNING_NOW"] == 1
    assert usage.by_name["RUNNING_SPAN"] == 1  # in the same batch
    for statement, args in (
        (sql.RUNNING_NOW, ("a", 0, "", 10, 0, 51)),
        (sql.RUNNING_SPAN, ("a", 0, "", 10)),
    ):
        plan = [str(r["detail"]) for r in db.query("EXPLAIN QUERY PLAN " + statement, *args)]
        assert sum("USING PRIMARY KEY (queue=? AND band=?" in line for line in plan) == 2, plan
        assert not any(re.match(r"SCAN d1queue_", line) for line in plan), plan


RETRYING = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, attempts, max_attempts, priority, "
    "available_at, locked_until, created_at, band) "
    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1) "
    "SELECT printf('r%012d', i), ?3, 'echo', '{}', 1, 3, 0, ?2 + i, ?2 + i, ?2, "
    f"{sql.LOCKED_BAND} FROM c"
)
"""?1 jobs waiting out a retry in queue ?3 (the locked band, not held), due after ?2."""


async def test_at_100_000_retrying_jobs_a_page_reads_its_cap_and_says_so(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    held = await push(service, "zz")  # after every retrying job, in queue order
    await service.queue.reserve_batch("zz", 1)
    db.query(RETRYING, 100_000, clock() + 1_000, "bulk")
    page = await Store(service.queue).running()
    assert (page.rows, page.scanned, page.stopped_early) == ([], RUNNING_ROWS, True)
    assert page.next_cursor == f"bulk~{clock() + 1_000 + RUNNING_ROWS}~r{RUNNING_ROWS:012d}"
    usage = service.queue.binding.usage
    before = usage.queries
    body = (await browser.get("/ui/running")).body
    assert usage.queries - before == 2  # the session's read and one batch
    assert f"Stopped early: this page read {RUNNING_ROWS:,} jobs" in body
    assert "Next page »" in body
    # A cursor past the retrying jobs reads on to the held one.
    last = f"bulk~{clock() + 1_000 + 100_000}~r{100_000:012d}"
    page = await Store(service.queue).running(last)
    assert [r["id"] for r in page.rows] == [held] and page.next_cursor is None


async def test_pages_follow_each_other_through_the_cap(
    service: Service, db: SqliteD1, clock: Clock
) -> None:
    ids = []
    for q in ("a", "b"):
        for _ in range(60):
            ids.append(await push(service, q))
        await service.queue.reserve_batch(q, 60)
    db.query(RETRYING, 70, clock() + 500_000, "a")  # read and passed over
    store = Store(service.queue)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        got = await store.running(cursor, cap=45)
        assert len(got.rows) <= PAGE
        seen += [str(r["id"]) for r in got.rows]
        pages += 1
        if got.next_cursor is None:
            break
        cursor = got.next_cursor
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen)) and pages > 3


async def test_pages_over_shards_miss_nothing_and_repeat_nothing(
    sharded: ShardSet, clock: Clock
) -> None:
    ids = []
    for i in range(130):
        queue = f"q{i % 7}"  # queues go to shards by their name's hash
        ids.append(str(await sharded.home.dispatch("echo", {"i": i}, queue=queue)))
        held = [await s.reserve_batch(queue, 1) for s in sharded.queues]
        assert sum(map(len, held)) == 1
        clock.advance(0.001)
    assert {sharded.for_id(i).shard for i in ids} == {0, 1}  # type: ignore[union-attr]
    store = Store(sharded.home, sharded)
    seen: list[str] = []
    cursor: str | None = None
    while True:
        got = await store.running(cursor, cap=30)
        keys = [(r["queue"], r["available_at"], r["id"]) for r in got.rows]
        assert keys == sorted(keys)
        seen += [str(r["id"]) for r in got.rows]
        if got.next_cursor is None:
            break
        cursor = got.next_cursor
    assert sorted(seen) == sorted(ids) and len(seen) == len(ids)


async def test_running_now_under_a_prefix(service: Service, clock: Clock) -> None:
    id = await push(service, "mail")
    await service.queue.reserve_batch("mail", 1)
    b = Browser(Dashboard(service, TOKEN, prefix="/queue"), clock)
    await b.post("/queue/ui/signin", {"token": TOKEN, "next": "/ui"})
    body = (await b.get("/queue/ui/running")).body
    addresses = re.findall(r'(?:href|action|src)="(/[^"]*)"', body)
    assert addresses and all(a.startswith("/queue/ui") for a in addresses), addresses
    assert f'action="/queue/ui/jobs/{id}/cancel"' in body
    reply = await b.post(f"/queue/ui/jobs/{id}/cancel", {"csrf": b.csrf(), "back": "/ui/running"})
    assert reply.headers["location"] == "/queue/ui/running?notice=cancelling"


# -- a job's story on its page ---------------------------------------------------------

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_a_job_page_shows_its_trace_id_and_its_running_attempt(
    browser: Browser, service: Service, clock: Clock
) -> None:
    traced = await push(service, "mail", traceparent=TP)
    plain = await push(service, "mail")
    await service.queue.reserve_batch("mail", 2)
    clock.advance(75)  # inside its 90 s lease
    body = (await browser.get(f"/ui/jobs/{traced}")).body
    assert "<dt>Trace id</dt>" in body and "4bf92f3577b34da6a3ce929d0e0e4736</span>" in body
    assert "<dt>Started</dt>" in body and "running for 1 min" in body
    assert "<dt>Trace id</dt>" not in (await browser.get(f"/ui/jobs/{plain}")).body


async def test_a_job_page_links_its_dependencies_and_dependents_both_ways(
    browser: Browser, service: Service
) -> None:
    first = await push(service, "mail")
    then = str(
        (await service.dispatch("mail", {"name": "echo", "payload": {}, "after": [first]}))["id"]
    )
    body = (await browser.get(f"/ui/jobs/{first}")).body
    assert "Waited for by" in body and f'href="/ui/jobs/{then}"' in body
    body = (await browser.get(f"/ui/jobs/{then}")).body
    assert "Waits for 1 job" in body and f'href="/ui/jobs/{first}"' in body


async def test_an_attempts_long_error_is_shown_whole_and_escaped(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    await service.dispatch("mail", {"name": "boom", "payload": "x" * 300})
    await drain(service.queue, service.registry, Config(queues=("mail",)))
    (failed,) = [r["id"] for r in db.query("SELECT id FROM d1queue_failed_jobs")]
    body = (await browser.get(f"/ui/jobs/{failed}")).body
    attempts = body[body.index("<h2>Attempts</h2>") :]
    assert "<pre>failed by the handler: &lt;b&gt;bad&lt;/b&gt; input " + "x" * 300 in attempts
    assert "<b>bad</b>" not in body
