"""The dashboard's batches index and its schedule actions under CPython,
against SqliteD1: the index's states (a failed batch reads failed), progress
in words, callbacks, keyset paging over shards and its bounded read; a
schedule's page with its last runs, "Run now" (CSRF-checked, pushed once
however often the click is sent) and "Edit" (the API's rules: a bad value is
a clear 422 and writes nothing); read-only sessions get neither (403); the
cron's cost unchanged by the runs it records. The same in a real browser:
tests/runtime/test_dashboard_browser.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.bounds import SCHEDULE_RUNS_KEPT
from d1queue.core.errors import Fail
from d1queue.core.shards import Routing
from d1queue.interfaces.dashboard import Dashboard
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.dashboard import PAGE, Store
from d1queue.store.schedules import Schedules
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


# -- schedules: the page, its last runs, Run now, Edit --------------------------------


def jobs_named(db: SqliteD1, name: str) -> list[dict[str, Any]]:
    return db.query("SELECT id, queue, payload, band FROM d1queue_jobs WHERE name = ?1", name)


def schedule_row(db: SqliteD1, id: str) -> dict[str, Any]:
    (row,) = db.query("SELECT * FROM d1queue_schedules WHERE id = ?1", id)
    return dict(row)


def run_nonce(body: str) -> str:
    m = re.search(r'name="run" value="([0-9a-f]{32})"', body)
    assert m, "no Run now form"
    return m.group(1)


async def test_a_schedules_page_shows_it_escaped_and_masked_with_its_actions(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    payload = {"note": "<script>alert(1)</script>", "api_key": "sk-live-123456"}
    await service.put_schedule(
        {"id": "night", "cron": "0 3 * * *", "name": "tick", "payload": payload}
    )
    reply = await browser.get("/ui/schedules/night")
    assert reply.status == 200
    body = reply.body
    assert "<script>alert" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "sk-live-123456" not in body
    assert 'action="/ui/schedules/night/run"' in body
    assert (
        'action="/ui/schedules/night/edit"' in body and 'action="/ui/schedules/night/pause"' in body
    )
    # A payload with a secret is not put in the form: empty keeps it.
    assert re.search(r'<textarea id="e-payload" name="payload" rows="6"></textarea>', body)
    assert "None yet" in body
    assert (await browser.get("/ui/schedules/nope")).status == 404
    assert (await browser.get("/ui/schedules/bad%20id")).status == 400
    assert (await browser.get("/ui/schedules/night?x=1")).status == 400
    listing = (await browser.get("/ui/schedules")).body
    assert 'href="/ui/schedules/night"' in listing and 'action="/ui/schedules/night/run"' in listing


async def test_run_now_pushes_once_however_often_the_click_is_sent(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    await service.put_schedule({"id": "night", "cron": "0 3 * * *", "name": "tick", "payload": [1]})
    nonce = run_nonce((await browser.get("/ui/schedules/night")).body)
    form = {"csrf": browser.csrf(), "run": nonce, "back": "/ui/schedules/night"}
    reply = await browser.post("/ui/schedules/night/run", form)
    assert reply.status == 303
    assert reply.headers["location"] == "/ui/schedules/night?notice=schedule_run"
    (job,) = jobs_named(db, "tick")
    assert job["id"] == nonce and job["queue"] == "ticks" and job["payload"] == "[1]"
    assert job["band"] == 2  # ready now, at the job's priority
    # The same click again (a double click, a re-send after a lost reply):
    reply = await browser.post("/ui/schedules/night/run", form)
    assert reply.headers["location"] == "/ui/schedules/night?notice=schedule_run_again"
    assert len(jobs_named(db, "tick")) == 1
    # Even once its job ran and left the table, the click pushes nothing more.
    await run(service, "ticks")
    assert jobs_named(db, "tick") == [] or all(r["band"] == -1004 for r in jobs_named(db, "tick"))
    kept = len(jobs_named(db, "tick"))
    await browser.post("/ui/schedules/night/run", form)
    assert len(jobs_named(db, "tick")) == kept
    body = (await browser.get("/ui/schedules/night")).body
    assert f'href="/ui/jobs/{nonce}"' in body and "Run now</td>" in body
    # A new page's click is a new run.
    second = run_nonce(body)
    assert second != nonce
    await browser.post("/ui/schedules/night/run", {**form, "run": second})
    assert {r["id"] for r in jobs_named(db, "tick")} >= {second}
    runs = json.loads(schedule_row(db, "night")["runs"])
    assert [r[1] for r in runs] == [second, nonce] and runs[0][2] == "now"


async def test_run_now_is_csrf_checked_and_refuses_a_made_up_form(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    await service.put_schedule({"id": "night", "cron": "0 3 * * *", "name": "tick"})
    await browser.get("/ui/schedules/night")
    for form, status in (
        ({"run": "a" * 32}, 403),
        ({"csrf": "forged", "run": "a" * 32}, 403),
        ({"csrf": browser.csrf(), "run": "not-an-id"}, 400),
        ({"csrf": browser.csrf()}, 400),
    ):
        reply = await browser.post("/ui/schedules/night/run", form)
        assert reply.status == status, form
    reply = await browser.post("/ui/schedules/gone/run", {"csrf": browser.csrf(), "run": "a" * 32})
    assert reply.status == 404
    assert jobs_named(db, "tick") == []
    assert schedule_row(db, "night")["runs"] is None


async def test_edit_saves_by_the_apis_rules_and_a_bad_value_writes_nothing(
    browser: Browser, service: Service, db: SqliteD1
) -> None:
    await service.put_schedule(
        {
            "id": "night",
            "cron": "0 3 * * *",
            "name": "tick",
            "payload": {"a": 1},
            "catch_up": "latest",
        }
    )
    await browser.get("/ui/schedules/night")
    csrf = browser.csrf()
    before = schedule_row(db, "night")
    for form, status, said in (
        ({"cron": "61 * * * *", "tz": "UTC", "payload": "{}"}, 422, "cron"),
        ({"cron": "0 3 * * *", "tz": "Mars/Base", "payload": "{}"}, 422, "tz"),
        ({"cron": "0 3 * * *", "tz": "UTC", "payload": "{not json"}, 422, "not JSON"),
        ({"cron": "", "tz": "UTC", "payload": "{}"}, 422, "cron"),
        (
            {"cron": "0 3 * * *", "tz": "UTC", "payload": "[" * 65 + "]" * 65},
            422,
            "deeper",
        ),
    ):
        reply = await browser.post("/ui/schedules/night/edit", {"csrf": csrf, **form})
        assert reply.status == status, (form, reply.body)
        assert "Nothing was changed" in reply.body and said in reply.body
        assert 'role="alert"' in reply.body
        assert schedule_row(db, "night") == before
    reply = await browser.post(
        "/ui/schedules/night/edit",
        {"csrf": csrf, "cron": "30 6 * * 1", "tz": "Europe/Berlin", "payload": '{"b": [2]}'},
    )
    assert reply.status == 303
    assert reply.headers["location"] == "/ui/schedules/night?notice=schedule_edited"
    got = await service.schedule("night")
    assert (got["cron"], got["tz"], got["payload"]) == ("30 6 * * 1", "Europe/Berlin", {"b": [2]})
    assert (got["name"], got["catch_up"], got["queue"]) == ("tick", "latest", "ticks")
    assert schedule_row(db, "night")["queue"] is None  # still the job's registered queue
    # An empty payload keeps it; an empty zone is UTC, the API's default.
    await browser.post(
        "/ui/schedules/night/edit", {"csrf": csrf, "cron": "@daily", "tz": "", "payload": " "}
    )
    got = await service.schedule("night")
    assert (got["cron"], got["tz"], got["payload"]) == ("@daily", "UTC", {"b": [2]})
    # Without the CSRF token: refused, nothing written.
    before = schedule_row(db, "night")
    reply = await browser.post("/ui/schedules/night/edit", {"cron": "* * * * *", "tz": "UTC"})
    assert reply.status == 403 and schedule_row(db, "night") == before


async def test_a_code_declared_schedule_is_not_edited_here(clock: Clock, db: SqliteD1) -> None:
    reg = registry()
    reg.schedule("t.code", "0 * * * *", "tick")
    service = Service(D1Queue(db, clock=clock, registry=reg), reg)
    await Schedules(service.queue, reg).run()  # syncs the declared set
    browser = Browser(Dashboard(service, TOKEN), clock)
    await browser.sign_in()
    body = (await browser.get("/ui/schedules/t.code")).body
    assert "Declared in the Worker" in body and "/edit" not in body
    assert 'action="/ui/schedules/t.code/run"' in body  # run now still works
    before = schedule_row(db, "t.code")
    reply = await browser.post(
        "/ui/schedules/t.code/edit", {"csrf": browser.csrf(), "cron": "* * * * *", "tz": "UTC"}
    )
    assert reply.status == 409 and schedule_row(db, "t.code") == before


async def test_the_cron_records_each_schedules_last_runs_in_its_advance(
    browser: Browser, service: Service, db: SqliteD1, clock: Clock
) -> None:
    await service.put_schedule({"id": "every", "cron": "* * * * *", "name": "tick"})
    store = Schedules(service.queue, service.registry)
    pushed = []
    for _ in range(SCHEDULE_RUNS_KEPT + 3):
        clock.advance(60)
        report = await store.run()
        assert report.queries == 2 and report.enqueued == 1
        (newest,) = [r for r in jobs_named(db, "tick") if r["id"] not in pushed]
        pushed.append(newest["id"])
    runs = json.loads(schedule_row(db, "every")["runs"])
    assert [r[1] for r in runs] == pushed[::-1][:SCHEDULE_RUNS_KEPT]
    slots = [r[0] for r in runs]
    assert (
        slots == sorted(slots, reverse=True)
        and slots[0] == schedule_row(db, "every")["last_run_at"]
    )
    body = (await browser.get("/ui/schedules/every")).body
    assert body.count("its cron</td>") == SCHEDULE_RUNS_KEPT
    assert f'href="/ui/jobs/{pushed[-1]}"' in (await browser.get("/ui/schedules")).body


async def test_a_catch_up_records_its_newest_runs_only(
    service: Service, db: SqliteD1, clock: Clock
) -> None:
    await service.put_schedule(
        {"id": "all", "cron": "* * * * *", "name": "tick", "catch_up": "all"}
    )
    store = Schedules(service.queue, service.registry)
    clock.advance(60)
    await store.run()
    clock.advance(60 * 30)  # an outage: 30 missed slots, all caught up
    report = await store.run()
    assert report.enqueued == 30
    runs = json.loads(schedule_row(db, "all")["runs"])
    assert len(runs) == SCHEDULE_RUNS_KEPT
    ids = {r["id"] for r in jobs_named(db, "tick")}
    assert {r[1] for r in runs} <= ids
    assert [r[0] for r in runs] == sorted((r[0] for r in runs), reverse=True)


async def test_a_schedule_on_another_shard_runs_now_there(sharded: ShardSet, clock: Clock) -> None:
    reg = registry()
    service = Service(sharded.home, reg, shards=sharded)
    queue = next(f"q{i}" for i in range(20) if sharded.routing.shard_of(f"q{i}") == 1)
    await service.put_schedule({"id": "far", "cron": "0 3 * * *", "name": "tick", "queue": queue})
    done = await service.run_schedule_now("far", "b" * 32)
    assert done == {"id": "s1-" + "b" * 32, "queue": queue, "pushed": True}
    again = await service.run_schedule_now("far", "b" * 32)
    assert again["pushed"] is False
    assert await sharded.queue(1).job(done["id"]) is not None
    assert (await service.schedule_runs(["far"]))["far"][0][1] == done["id"]


async def test_the_pages_work_under_a_prefix(service: Service, db: SqliteD1, clock: Clock) -> None:
    q = service.queue
    batch, _ = await q.batch([q.new_job("step", 1, queue="mail")])
    await service.put_schedule({"id": "night", "cron": "0 3 * * *", "name": "tick"})
    board = Dashboard(service, TOKEN, prefix="/queue")
    b = Browser(board, clock)
    reply = await b.post("/queue/ui/signin", {"token": TOKEN, "next": "/ui"})
    assert reply.status == 303
    body = (await b.get("/queue/ui/batches")).body
    assert f'href="/queue/ui/batches/{batch}"' in body and 'href="/queue/ui/batches"' in body
    body = (await b.get("/queue/ui/schedules/night")).body
    assert 'action="/queue/ui/schedules/night/run"' in body
    assert 'action="/queue/ui/schedules/night/edit"' in body
    form = {"csrf": b.csrf(), "run": run_nonce(body), "back": "/ui/schedules/night"}
    reply = await b.post("/queue/ui/schedules/night/run", form)
    assert reply.headers["location"] == "/queue/ui/schedules/night?notice=schedule_run"
    assert len(jobs_named(db, "tick")) == 1


@pytest.mark.parametrize("stored", ["not json", '{"a": 1}', "[]", '"text"'])
async def test_runs_written_by_something_else_never_stop_the_cron(
    service: Service, db: SqliteD1, clock: Clock, browser: Browser, stored: str
) -> None:
    await service.put_schedule({"id": "odd", "cron": "* * * * *", "name": "tick"})
    db.query("UPDATE d1queue_schedules SET runs = ?1 WHERE id = 'odd'", stored)
    assert schedule_row(db, "odd")["runs"] == stored
    assert (await browser.get("/ui/schedules/odd")).status == 200  # shown as none
    clock.advance(60)
    report = await Schedules(service.queue, service.registry).run()
    assert report.enqueued == 1 and report.advanced == 1 and not report.error
    (job,) = jobs_named(db, "tick")
    runs = json.loads(schedule_row(db, "odd")["runs"])
    assert [r[1] for r in runs] == [job["id"]]


async def test_a_runs_time_stored_as_a_real_reads_as_its_ms(service: Service, db: SqliteD1) -> None:
    """A JS number bound from Pyodide arrives as a REAL: a time kept as
    1.7e12 reads as the same ms; entries of another shape are left out."""
    await service.put_schedule({"id": "r", "cron": "* * * * *", "name": "tick"})
    stored = '[[1700000000000.0,"a","now"],[true,"b"],["x","c"],[5],[1700000000001,"d"]]'
    db.query("UPDATE d1queue_schedules SET runs = ?1 WHERE id = 'r'", stored)
    assert await service.schedule_runs(["r", "none"]) == {
        "r": [[1_700_000_000_000, "a", "now"], [1_700_000_000_001, "d"]]
    }
