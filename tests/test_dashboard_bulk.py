"""Bulk actions on what a filter matches, or on a selection (dashboard/bulk.py,
store/bulk.py): the confirmation states the count; each step acts on at most
a page of jobs and the next step carries on until done, with the total;
every step is safe to send again; each run is in the audit log; CSRF and
the read-only token are refused; filters shown back are escaped."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from d1queue import Config, D1Queue, drain
from d1queue.core.bounds import BULK_COUNT_ROWS, SEARCH_ROWS
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.dashboard.search import parse
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql
from d1queue.store.bulk import AUDIT_PAGE, Bulk, Count
from d1queue.store.dashboard import PAGE, Store
from d1queue.store.shardset import ShardSet

from .contract import Clock
from .test_dashboard import TOKEN, Browser, failed_ids, registry
from .test_readonly import READONLY, signed_in


@pytest.fixture
def service(db: SqliteD1, clock: Clock) -> Service:
    return Service(D1Queue(db, clock=clock, keep_completed=True, metrics=True), registry())


@pytest.fixture
def board(service: Service) -> Dashboard:
    return Dashboard(service, TOKEN, readonly_token=READONLY)


@pytest.fixture
async def browser(board: Dashboard, clock: Clock) -> Browser:
    b = Browser(board, clock)
    await b.sign_in()
    return b


async def fail_some(service: Service, n: int, queue: str = "mail") -> list[str]:
    """`n` failed jobs (each drain takes a bounded number: drained until none is left)."""
    ids = [(await service.dispatch(queue, {"name": "boom", "payload": i}))["id"] for i in range(n)]
    for _ in range(n):
        await drain(service.queue, service.registry, Config(queues=(queue,)))
        if len(failed_ids(service.queue.binding.db)) == n:  # type: ignore[attr-defined]
            break
    return ids


def field(body: str, name: str) -> str:
    """A field of the page's bulk form (the confirmation's or the step's)."""
    body = re.split(r'<form method="post" action="(?:/queue)?/ui/bulk', body, maxsplit=1)[-1]
    m = re.search(rf'name="{name}" value="([^"]*)"', body)
    assert m, f"no field {name}"
    return html.unescape(m.group(1))


async def ask(browser: Browser, q: str, do: str, **more: Any) -> Any:
    await browser.get("/ui/search")
    return await browser.post(
        "/ui/bulk", {"csrf": browser.csrf(), "q": q, "do": do, "back": "/ui/failed", **more}
    )


async def confirm(browser: Browser, page: str) -> Any:
    """Send the confirmation page's form back, confirmed."""
    form = {k: field(page, k) for k in ("q", "do", "run", "matched", "capped", "back", "confirm")}
    ids = re.findall(r'name="ids" value="([^"]*)"', page.split("<main", 1)[-1])
    ids = [html.unescape(i) for i in ids]
    return await browser.post("/ui/bulk", {"csrf": browser.csrf(), **form, "ids": ids})


async def carry_on(browser: Browser, page: str, most: int = 100) -> str:
    """Send each step's Continue form until the run says it is done."""
    for _ in range(most):
        if 'id="bulk-done"' in page:
            return page
        form = {k: field(page, k) for k in ("run", "step", "back")}
        reply = await browser.post("/ui/bulk/step", {"csrf": browser.csrf(), **form})
        assert reply.status == 200, reply.body
        page = reply.body
    raise AssertionError("the run did not finish")


async def test_a_bulk_retry_of_a_filter_states_its_count_then_does_it_in_steps(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    ids = await fail_some(service, 2 * PAGE + 7)
    asked = await ask(browser, "state:failed name:boom", "retry:all")
    assert asked.status == 200
    assert f"Retry {2 * PAGE + 7:,} failed jobs matching name:boom?" in asked.body
    assert failed_ids(db) == set(ids), "a confirmation changes nothing"
    first = await confirm(browser, asked.body)
    assert first.status == 200 and 'id="bulk-working"' in first.body
    assert f"{PAGE} failed jobs retried so far" in first.body
    assert len(failed_ids(db)) == PAGE + 7
    done = await carry_on(browser, first.body)
    assert f"Done: {2 * PAGE + 7:,} failed jobs retried in total, in 3 steps" in done
    assert failed_ids(db) == set()
    assert len(db.query("SELECT id FROM d1queue_jobs WHERE band > ?1", sql.DONE_BAND)) == len(ids)
    (record,) = db.query("SELECT * FROM d1queue_audit")
    assert (record["who"], record["action"], record["source"]) == ("full", "retry", "failed")
    assert (record["filter"], record["matched"], record["done"]) == (
        "state:failed name:boom",
        2 * PAGE + 7,
        2 * PAGE + 7,
    )
    assert record["finished"] == 1 and record["step"] == 3
    audit = (await browser.get("/ui/audit")).body
    assert "<code>state:failed name:boom</code>" in audit and "finished" in audit


async def test_a_step_sent_again_does_nothing_twice(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    await fail_some(service, PAGE + 5)
    asked = await ask(browser, "state:failed", "delete:all")
    first = await confirm(browser, asked.body)
    # The confirmation sent again (its reply lost): the same run, its first
    # step already taken, so nothing more is deleted.
    again = await confirm(browser, asked.body)
    assert len(failed_ids(db)) == 5
    assert f"{PAGE} failed jobs deleted so far" in again.body
    step = {k: field(first.body, k) for k in ("run", "step", "back")}
    second = await browser.post("/ui/bulk/step", {"csrf": browser.csrf(), **step})
    assert "Done: 55 failed jobs deleted in total" in second.body
    # Step 2 sent again: answered as it stands, nothing acted on.
    twice = await browser.post("/ui/bulk/step", {"csrf": browser.csrf(), **step})
    assert twice.status == 200 and "Done: 55 failed jobs deleted in total" in twice.body
    assert len(db.query("SELECT id FROM d1queue_audit")) == 1
    assert db.query("SELECT done, step FROM d1queue_audit")[0] == {"done": 55, "step": 2}


async def test_a_step_whose_nonce_is_not_the_lease_writes_nothing(
    service: Service, db: SqliteD1, clock: Clock
) -> None:
    """The binding re-sending a step's batch (same nonce) or a racing copy
    (another nonce) finds the step taken: each write checks the lease."""
    ids = await fail_some(service, 3)
    bulk = Bulk(Store(service.queue))
    count = await bulk.count("failed", {})
    run = await bulk.start(
        "a" * 32,
        who="full",
        action="delete",
        source="failed",
        filter="state:failed",
        selected=None,
        count=count,
        now=clock(),
    )
    done = await bulk.step(run, 1, {}, clock(), nonce="n1")
    assert done.done == 3 and done.finished
    await service.dispatch("mail", {"name": "boom", "payload": 9})
    await drain(service.queue, service.registry, Config(queues=("mail",)))
    late = await bulk.step(run, 1, {}, clock(), nonce="n2")  # `run` as read before step 1
    assert late.done == 3 and len(failed_ids(db)) == 1 and not set(ids) & failed_ids(db)


async def test_live_jobs_cancel_and_run_now_by_filter_and_by_selection(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    delayed = [
        (await service.dispatch("mail", {"name": "echo", "payload": i, "delay_s": 3600}))["id"]
        for i in range(3)
    ]
    other = (await service.dispatch("sms", {"name": "echo", "payload": 1}))["id"]
    asked = await ask(browser, "queue:mail", "run:all")
    assert "Run now 3 queued jobs matching queue:mail?" in asked.body
    done = await confirm(browser, asked.body)
    assert "Done: 3 queued jobs made due now in total" in done.body
    due = db.query(
        "SELECT id FROM d1queue_jobs WHERE queue = 'mail' AND available_at <= ?1", clock()
    )
    assert {r["id"] for r in due} == set(delayed)
    asked = await ask(browser, "queue:mail", "cancel:selected", ids=delayed[:2])
    assert "Cancel the 2 queued jobs selected?" in asked.body
    done = await confirm(browser, asked.body)
    assert "Done: 2 queued jobs cancelled in total" in done.body
    left = {r["id"] for r in db.query(f"SELECT id FROM d1queue_jobs WHERE {sql.LIVE}")}
    assert left == {delayed[2], other}


async def test_completed_jobs_are_pushed_again_or_deleted(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    ids = [(await service.dispatch("mail", {"name": "echo", "payload": i}))["id"] for i in range(4)]
    await drain(service.queue, service.registry, Config(queues=("mail",)))
    asked = await ask(browser, "state:completed queue:mail", "retry:all")
    assert "Push again 4 completed jobs matching queue:mail?" in asked.body
    done = await confirm(browser, asked.body)
    assert "Done: 4 completed jobs pushed again in total" in done.body
    live = db.query(f"SELECT id, attempts FROM d1queue_jobs WHERE {sql.LIVE}")
    assert {r["id"] for r in live} == set(ids) and {r["attempts"] for r in live} == {0}
    asked = await ask(browser, "state:completed", "delete:all")
    done = await confirm(browser, asked.body)
    assert "Done: 4 completed jobs deleted in total" in done.body
    kept = db.query("SELECT id FROM d1queue_jobs WHERE band = ?1", sql.DONE_BAND)
    assert kept == []


async def test_the_count_reads_at_most_its_cap_and_says_at_least(
    service: Service, db: SqliteD1
) -> None:
    await fail_some(service, 5)
    bulk = Bulk(Store(service.queue))
    assert (await bulk.count("failed", {}, cap=3)).capped
    exact = await bulk.count("failed", {"name": "boom"})
    assert (exact.matched, exact.capped) == (5, False)
    assert BULK_COUNT_ROWS >= 1_000


async def test_a_capped_count_is_stated_as_a_floor(
    browser: Browser, service: Service, board: Dashboard, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fail_some(service, 4)
    count = board.bulk.bulk.count

    async def capped(source: str, filters: Any, cap: int = 0) -> Any:
        return await count(source, filters, cap=2)

    monkeypatch.setattr(board.bulk.bulk, "count", capped)
    asked = await ask(browser, "state:failed", "retry:all")
    assert "Retry at least 2 failed jobs (every one)?" in asked.body
    assert "more may match further on" in asked.body


async def test_csrf_and_the_readonly_token_are_refused_and_nothing_is_written(
    board: Dashboard, service: Service, db: SqliteD1, clock: Clock
) -> None:
    ids = await fail_some(service, 2)
    admin = await signed_in(board, clock, TOKEN)
    forged = await admin.post("/ui/bulk", {"q": "state:failed", "do": "delete:all"})
    assert forged.status == 403
    viewer = await signed_in(board, clock, READONLY)
    for path in ("/ui/search?q=state:failed", "/ui/failed", "/ui/queues/mail", "/ui/audit"):
        seen = (await viewer.get(path)).body
        assert 'action="/ui/bulk' not in seen and 'name="do"' not in seen, path
        assert 'type="checkbox"' not in seen.split("<main", 1)[-1], path
    token = viewer.csrf()
    for path, form in (
        ("/ui/bulk", {"q": "state:failed", "do": "delete:all"}),
        ("/ui/bulk/step", {"run": "b" * 32, "step": "1"}),
    ):
        refused = await viewer.post(path, {"csrf": token, **form})
        assert refused.status == 403, path
    assert failed_ids(db) == set(ids)
    assert db.query("SELECT id FROM d1queue_audit") == []


async def test_bad_input_is_a_400_and_writes_nothing(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    await fail_some(service, 1)
    for form in (
        {"q": "state:failed", "do": "cancel:all"},
        {"q": "state:failed", "do": "retry:some"},
        {"q": "state:nope", "do": "retry:all"},
        {"q": "state:failed", "do": "retry:selected"},
        {"q": "state:failed", "do": "retry:all", "confirm": "yes", "run": "x"},
    ):
        reply = await ask(browser, form.pop("q"), form.pop("do"), **form)
        assert reply.status == 400, form
    step = await browser.post(
        "/ui/bulk/step", {"csrf": browser.csrf(), "run": "c" * 32, "step": "1"}
    )
    assert step.status == 404
    assert db.query("SELECT id FROM d1queue_audit") == [] and len(failed_ids(db)) == 1


async def test_filters_shown_back_are_escaped(browser: Browser, service: Service) -> None:
    nasty = "<script>alert(1)</script>"
    await service.dispatch("mail", {"name": "echo", "payload": {"t": nasty}})
    asked = await ask(browser, f"queue:mail {nasty}", "cancel:all")
    assert asked.status == 200 and "<script>alert" not in asked.body
    assert "Cancel 1 queued job matching queue:mail &lt;script&gt;alert(1)&lt;/script&gt;?" in (
        asked.body
    )
    done = await confirm(browser, asked.body)
    assert "<script>alert" not in done.body
    audit = (await browser.get("/ui/audit")).body
    assert "<script>alert" not in audit and "&lt;script&gt;" in audit


async def test_the_lists_and_the_search_offer_the_actions(
    browser: Browser, service: Service
) -> None:
    await fail_some(service, 2)
    await service.dispatch("mail", {"name": "echo", "payload": 1})
    search = (await browser.get("/ui/search?q=state:failed")).body
    assert 'id="bulk-form"' in search and 'form="bulk-form"' in search
    assert 'value="retry:all"' in search and 'value="delete:selected"' in search
    failed = (await browser.get("/ui/failed?name=boom")).body
    assert 'href="/ui/search?q=state%3Afailed+name%3Aboom"' in failed
    assert 'value="retry:all"' not in failed, "the search page has the buttons"
    assert "clear the age" in (await browser.get("/ui/failed?age=1d")).body
    queue = (await browser.get("/ui/queues/mail")).body
    assert 'href="/ui/search?q=queue%3Amail"' in queue


async def test_the_audit_log_pages(browser: Browser, service: Service, db: SqliteD1) -> None:
    for i in range(3):
        db.query(
            "INSERT INTO d1queue_audit (id, at, who, action, source, filter, updated_at) "
            "VALUES (?1, ?2, 'full', 'retry', 'failed', 'state:failed', ?2)",
            f"{i:032x}",
            1000 + i,
        )
    store = Bulk(Store(service.queue))
    page, nxt = await store.audit()
    assert [r.id for r in page] == [f"{i:032x}" for i in (2, 1, 0)] and nxt is None
    assert (await browser.get("/ui/audit?cursor=bad")).status == 400
    for i in range(3, AUDIT_PAGE + 3):  # a page and three more, the same time for many
        db.query(
            "INSERT INTO d1queue_audit (id, at, who, action, source, filter, updated_at) "
            "VALUES (?1, ?2, 'full', 'delete', 'failed', '', ?2)",
            f"{i:032x}",
            1000 + min(i, 10),
        )
    first = (await browser.get("/ui/audit")).body
    older = re.search(r'href="(/ui/audit\?cursor=[^"]+)">Older', first)
    assert older and first.count("<tr>") == AUDIT_PAGE + 1  # and the header's
    second = (await browser.get(html.unescape(older.group(1)))).body
    assert second.count("<tr>") == 3 + 1 and "Older" not in second and "« Newest" in second
    one, cursor = await store.audit()
    two, last = await store.audit(cursor)
    assert last is None and len({r.id for r in one + two}) == len(one + two) == AUDIT_PAGE + 3


async def test_works_under_a_prefix(service: Service, clock: Clock, db: SqliteD1) -> None:
    await fail_some(service, 2)
    b = Browser(Dashboard(service, TOKEN, prefix="/queue"), clock)
    reply = await b.post("/queue/ui/signin", {"token": TOKEN, "next": "/ui"})
    assert reply.headers["location"] == "/queue/ui"
    await b.get("/queue/ui/search?q=state:failed")
    assert 'action="/queue/ui/bulk"' in b.last
    asked = await b.post(
        "/queue/ui/bulk", {"csrf": b.csrf(), "q": "state:failed", "do": "retry:all"}
    )
    assert 'action="/queue/ui/bulk"' in asked.body
    form = {k: field(asked.body, k) for k in ("q", "do", "run", "matched", "capped", "back")}
    done = await b.post("/queue/ui/bulk", {"csrf": b.csrf(), **form, "confirm": "yes"})
    assert "Done: 2 failed jobs retried in total" in done.body
    assert failed_ids(db) == set()


def live_ids(shards: ShardSet) -> set[str]:
    return {
        str(r["id"])
        for q in shards.queues
        for r in q.binding.db.query(f"SELECT id FROM d1queue_jobs WHERE {sql.LIVE}")  # type: ignore[attr-defined]
    }


async def test_over_shards_a_filter_and_a_selection_act_on_each_once(
    sharded: ShardSet, clock: Clock
) -> None:
    ids = []
    for i in range(2 * PAGE + 10):
        # Queue "d" lives on shard 0, "q" on shard 1 (Routing(2)).
        ids.append(str(await sharded.queue(0).dispatch("echo", {"i": i}, queue="dq"[i % 2])))
        clock.advance(0.001)
    bulk = Bulk(Store(sharded.home, sharded))
    count = await bulk.count("live", {"name": "echo"})
    assert (count.matched, count.capped) == (len(ids), False)
    run = await bulk.start(
        "d" * 32,
        who="full",
        action="cancel",
        source="live",
        filter="name:echo",
        selected=None,
        count=count,
        now=clock(),
    )
    steps = 0
    while not run.finished:
        steps += 1
        before = run
        run = await bulk.step(run, run.step + 1, {"name": "echo"}, clock())
        # Each step sent again (as the run was before it) does nothing twice.
        assert await bulk.step(before, before.step + 1, {"name": "echo"}, clock()) == run
    assert run.done == len(ids) and live_ids(sharded) == set()
    assert steps == 2 + 2, "each shard's 55 jobs in two steps of at most 50"
    # The record is on the home shard; the other holds a guard row only.
    guard = sharded.queues[1].binding.db.query("SELECT who FROM d1queue_audit")  # type: ignore[attr-defined]
    assert guard == [{"who": ""}]
    # A selection spanning both shards: a step a shard.
    picked = [str(await sharded.queue(i).dispatch("echo", {}, queue=("d", "q")[i])) for i in (0, 1)]
    sel = await bulk.start(
        "e" * 32,
        who="full",
        action="cancel",
        source="live",
        filter="",
        selected=picked,
        count=Count(2, 2, False),
        now=clock(),
    )
    assert {sharded.for_id(i).shard for i in picked} == {0, 1}  # type: ignore[union-attr]
    sel = await bulk.step(sel, 1, {}, clock())
    assert not sel.finished and sel.done == 1 and sel.shard == 1
    sel = await bulk.step(sel, 2, {}, clock())
    assert sel.finished and sel.done == 2 and live_ids(sharded) == set()
    runs, _ = await bulk.audit()
    assert [r.id for r in runs] == ["e" * 32, "d" * 32]


SEED = (
    "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, attempts, max_attempts, "
    "priority, created_at, failed_at) "
    "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1) "
    "SELECT printf('f%012d', i), 'big', CASE WHEN i % 1000 = 0 THEN 'rare' ELSE 'echo' END, "
    "'{}', 'boom', 1, 1, 0, i, i FROM c"
)


async def test_at_100_000_failed_jobs_the_count_and_each_step_read_their_caps(
    db: SqliteD1, clock: Clock
) -> None:
    db.query(SEED, 100_000)
    queue = D1Queue(db, clock=clock)
    bulk = Bulk(Store(queue))
    usage = queue.binding.usage
    read = usage.rows_read
    count = await bulk.count("failed", {"name": "rare"})
    assert count.capped and count.matched == BULK_COUNT_ROWS // 1000
    assert usage.rows_read - read <= BULK_COUNT_ROWS + 1
    run = await bulk.start(
        "f" * 32,
        who="full",
        action="delete",
        source="failed",
        filter="state:failed name:rare",
        selected=None,
        count=count,
        now=clock(),
    )
    queries, read = usage.queries, usage.rows_read
    run = await bulk.step(run, 1, {"name": "rare"}, clock())
    assert usage.queries - queries == 2, "the search page, then the write batch"
    assert usage.rows_read - read <= 2 * SEARCH_ROWS + 10 * run.done + 10
    assert run.done == 1 and not run.finished, "one match in the first 1,000 read"


async def test_a_filter_matching_nothing_offers_nothing(browser: Browser, db: SqliteD1) -> None:
    asked = await ask(browser, "state:failed name:none <b>", "retry:all")
    assert asked.status == 200 and "No failed job matches “name:none &lt;b&gt;”" in asked.body
    assert 'name="confirm"' not in asked.body


async def test_the_failed_lists_selection_is_in_the_audit_log_once(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    ids = await fail_some(service, 3)
    await browser.get("/ui/failed")
    form = {"csrf": browser.csrf(), "action": "retry", "ids": ids[:2], "back": "/ui/failed"}
    asked = await browser.post("/ui/failed/bulk", form)
    run = field_of(asked.body, "run")
    for _ in range(2):  # the confirmation sent again: one run, done once
        reply = await browser.post(
            "/ui/failed/bulk", {**form, "csrf": browser.csrf(), "confirm": "yes", "run": run}
        )
        assert reply.headers["location"] == "/ui/failed?notice=retried&n=2"
    assert failed_ids(db) == {ids[2]}
    (record,) = db.query("SELECT action, source, selected, done, finished FROM d1queue_audit")
    assert record["done"] == 2 and record["finished"] == 1 and record["action"] == "retry"
    bad = await browser.post(
        "/ui/failed/bulk", {**form, "csrf": browser.csrf(), "confirm": "yes", "run": "x"}
    )
    assert bad.status == 400


def field_of(body: str, name: str) -> str:
    m = re.search(rf'name="{name}" value="([^"]*)"', body)
    assert m, f"no field {name}"
    return m.group(1)


@pytest.mark.parametrize(
    ("source", "action", "q"),
    [
        ("failed", "retry", "state:failed"),
        ("failed", "delete", "state:failed"),
        ("completed", "retry", "state:completed"),
        ("completed", "delete", "state:completed"),
        ("live", "cancel", "name:echo"),
        ("live", "run", "name:echo"),
    ],
)
async def test_a_step_re_sent_by_the_binding_after_a_lost_reply_acts_once(
    service: Service, db: SqliteD1, clock: Clock, source: str, action: str, q: str
) -> None:
    await fail_some(service, 3)
    for i in range(3):
        await service.dispatch("mail", {"name": "echo", "payload": i, "delay_s": 60})
    await service.dispatch("done", {"name": "echo", "payload": 0})
    await drain(service.queue, service.registry, Config(queues=("done",)))
    bulk = Bulk(Store(service.queue))
    filters = parse(q).filters()
    count = await bulk.count(source, filters)
    run = await bulk.start(
        "9" * 32,
        who="full",
        action=action,
        source=source,
        filter=q,
        selected=None,
        count=count,
        now=clock(),
    )
    before = db.query(f"SELECT COUNT(*) AS n FROM d1queue_jobs WHERE {sql.LIVE}")[0]["n"]
    fault = db.lose_reply_when(lambda text: text == sql.AUDIT_DROP_LEASE)
    run = await bulk.step(run, 1, filters, clock())
    assert fault.times == 0, "the step's batch committed, its reply lost, and it was re-sent"
    assert run.finished and run.done == count.matched > 0
    live = db.query(f"SELECT COUNT(*) AS n FROM d1queue_jobs WHERE {sql.LIVE}")[0]["n"]
    expected = {
        ("failed", "retry"): before + 3,
        ("completed", "retry"): before + 1,
        ("live", "cancel"): before - 3,
    }.get((source, action), before)
    assert live == expected
    if (source, action) == ("live", "cancel"):
        cancelled = db.query("SELECT SUM(cancelled) AS n FROM d1queue_metrics WHERE period = 0")
        assert cancelled[0]["n"] == 3, "each cancel counted once"


async def test_the_same_batch_again_pushes_nothing_again_once_the_copy_is_claimed(
    service: Service, db: SqliteD1, clock: Clock
) -> None:
    """The binding's re-send is the same batch, nonce and all: were the
    pushed-again job claimed meanwhile (out of the id index that refuses a
    second copy), only the dropped lease stops a second push."""
    done = (await service.dispatch("done", {"name": "echo", "payload": 0}))["id"]
    await drain(service.queue, service.registry, Config(queues=("done",)))
    bulk = Bulk(Store(service.queue))
    filters = parse("state:completed").filters()
    run = await bulk.start(
        "8" * 32,
        who="full",
        action="retry",
        source="completed",
        filter="state:completed",
        selected=None,
        count=await bulk.count("completed", filters),
        now=clock(),
    )
    after = await bulk.step(run, 1, filters, clock(), nonce="same")
    assert after.done == 1
    db.query(
        f"UPDATE d1queue_jobs SET band = ?1, reserved_at = 1 WHERE id = ?2 AND {sql.LIVE}",
        sql.LOCKED_BAND,
        done,
    )
    again = await bulk.step(run, 1, filters, clock(), nonce="same")
    assert again.done == 1
    copies = db.query(f"SELECT COUNT(*) AS n FROM d1queue_jobs WHERE id = ?1 AND {sql.LIVE}", done)
    assert copies[0]["n"] == 1


async def test_a_run_stopped_midway_goes_on_from_the_audit_page(
    board: Dashboard, browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    await fail_some(service, PAGE + 2)
    asked = await ask(browser, "state:failed", "delete:all")
    await confirm(browser, asked.body)  # the first step; the tab is closed then
    audit = (await browser.get("/ui/audit")).body
    assert "stopped after step 1" in audit and ">Continue</button>" in audit
    viewer = await signed_in(board, clock, READONLY)
    seen = (await viewer.get("/ui/audit")).body
    assert "stopped after step 1" in seen and "<button" not in seen.split("<main", 1)[-1]
    form = {k: field_of(audit.split("<main", 1)[-1], k) for k in ("run", "step", "back")}
    done = await browser.post("/ui/bulk/step", {"csrf": browser.csrf(), **form})
    assert "Done: 52 failed jobs deleted in total, in 2 steps" in done.body
    assert failed_ids(db) == set()
