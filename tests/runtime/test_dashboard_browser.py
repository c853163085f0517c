"""The dashboard in a real browser: Playwright for Python driving Debian's
chromium (/usr/bin/chromium; no browser of Playwright's own is downloaded)
against the Worker served by the offline host, as `make dev` serves it.

Every page is screenshotted into build/screenshots/ (gitignored)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from .conftest import ROOT, TOKEN, Host, start_host

CHROMIUM = Path("/usr/bin/chromium")
READONLY = "runtime-read-only-token-of-32-characters"
"""The D1QUEUE_READONLY_TOKEN secret the dashboard's host is started with."""
SHOTS = ROOT / "build" / "screenshots"


@pytest.fixture(scope="module")
def ui_host() -> Iterator[Host]:
    """A host of its own: these tests read the counters, which other tests'
    drains would add to."""
    h = start_host("--var", f"D1QUEUE_READONLY_TOKEN={READONLY}")
    yield h
    h.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"no {CHROMIUM}: `apt-get install -y chromium` (make setup does it)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def context(browser: Browser, ui_host: Host) -> Iterator[BrowserContext]:
    ui_host.reset()
    ui_host.python(
        """
        async def main(env):
            await env.DB.prepare("DELETE FROM d1queue_stats").run()
        """
    )
    ctx = browser.new_context(base_url=ui_host.url, viewport={"width": 1280, "height": 900})
    yield ctx
    ctx.close()


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, token: str = TOKEN) -> None:
    page.goto("/ui")
    expect(page).to_have_url(re.compile(r"/ui/signin\?next=%2Fui$"))
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()


def queue_row(page: Page, queue: str) -> object:
    return page.get_by_role("row").filter(has=page.get_by_role("link", name=queue, exact=True))


def test_sign_in_and_a_pushed_job_is_counted(context: BrowserContext, ui_host: Host) -> None:
    page = context.new_page()
    page.goto("/ui")
    shot(page, "01-sign-in")
    # Keyboard only: the token field has the focus, Enter submits.
    expect(page.get_by_label("API token")).to_be_focused()
    page.keyboard.type(TOKEN)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_text("No queues yet.")).to_be_visible()
    shot(page, "02-overview-empty")

    (cookie,) = context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    assert not cookie["secure"]  # plain HTTP on 127.0.0.1

    pushed = ui_host.api(
        "POST", "/v1/queues/mail/jobs", {"name": "example.echo", "payload": {"to": "ada"}}
    )
    assert pushed.status == 201
    page.reload()
    row = queue_row(page, "mail")
    expect(row.get_by_role("cell").nth(0)).to_have_text("1")  # ready
    shot(page, "03-overview")

    page.get_by_role("link", name="mail", exact=True).click()
    expect(page.get_by_role("heading", name="Queue mail")).to_be_visible()
    expect(page.get_by_role("link", name=pushed.json()["id"])).to_be_visible()
    shot(page, "04-queue")
    page.get_by_role("link", name=pushed.json()["id"]).click()
    expect(page.get_by_text('"to": "ada"')).to_be_visible()
    shot(page, "05-job")

    # The cron drains it; the drain's counters show it done in the last hour.
    ui_host.scheduled()
    page.goto("/ui")
    row = queue_row(page, "mail")
    expect(row.get_by_role("cell").nth(6)).to_have_text("1")  # done in the last hour
    expect(page.locator("svg.chart rect.c")).to_have_count(1)
    shot(page, "06-overview-after-a-run")

    page.set_viewport_size({"width": 375, "height": 800})  # a narrow window
    page.reload()
    assert page.evaluate("document.documentElement.scrollWidth") <= 375 + 1
    shot(page, "07-overview-narrow")


def test_a_wrong_token_is_refused(context: BrowserContext) -> None:
    page = context.new_page()
    sign_in(page, token="not-the-token")
    expect(page.get_by_role("alert")).to_have_text("That is not this Worker's API token.")
    assert context.cookies() == []
    shot(page, "08-sign-in-refused")
    page.goto("/ui/failed")
    expect(page).to_have_url(re.compile(r"/ui/signin"))


def test_a_failed_job_appears_and_a_bulk_retry_moves_it_back(
    context: BrowserContext, ui_host: Host
) -> None:
    ids = [
        ui_host.api(
            "POST", "/v1/queues/math/jobs", {"name": "example.add", "payload": {"a": "x"}}
        ).json()["id"]
        for _ in range(2)
    ]
    ui_host.scheduled()  # a bad payload fails for good
    assert ui_host.api("GET", f"/v1/jobs/{ids[0]}").json()["state"] == "failed"

    page = context.new_page()
    sign_in(page)
    page.get_by_role("link", name="Failed jobs").click()
    expect(page.get_by_role("checkbox", name=f"Select job {ids[0]}")).to_be_visible()
    shot(page, "09-failed")
    page.get_by_label("Error contains").fill("numbers a and b")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("checkbox", name=re.compile("^Select job "))).to_have_count(2)

    page.get_by_role("checkbox", name="Select every job on this page").check()
    expect(page.get_by_text("2 of 2 selected")).to_be_visible()
    page.get_by_role("button", name="Retry").click()
    expect(page.get_by_text("Put 2 failed jobs back on their queues")).to_be_visible()
    expect(page.get_by_role("button", name="Stop auto-refresh")).to_be_hidden()  # nothing live
    shot(page, "10-confirm-retry")
    page.get_by_role("button", name="Retry 2 jobs").click()
    expect(page.get_by_role("status")).to_have_text("2 failed job(s) put back on their queues.")
    expect(page.get_by_text("No failed jobs match this filter.")).to_be_visible()
    for id in ids:
        assert ui_host.api("GET", f"/v1/jobs/{id}").json()["state"] == "ready"
    page.goto("/ui")
    expect(queue_row(page, "math").get_by_role("cell").nth(0)).to_have_text("2")

    # And Delete, after its own confirmation, from a failed job's page.
    ui_host.scheduled()
    page.goto(f"/ui/jobs/{ids[0]}")
    shot(page, "11-failed-job")
    page.get_by_role("button", name="Delete").click()
    expect(page.get_by_text("Remove 1 failed job for good?")).to_be_visible()
    page.get_by_role("button", name="Delete 1 job").click()
    expect(page.get_by_role("status")).to_have_text("1 failed job(s) removed for good.")
    assert ui_host.api("GET", f"/v1/jobs/{ids[0]}").status == 404


def test_pause_and_resume(context: BrowserContext, ui_host: Host) -> None:
    ui_host.api("POST", "/v1/queues/mail/jobs", {"name": "example.echo", "payload": 1})
    page = context.new_page()
    sign_in(page)
    expect(page.get_by_role("button", name="Stop auto-refresh")).to_be_visible()
    # Reachable by keyboard: Tab gets to the queue's Pause button, Enter presses it.
    for _ in range(30):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Pause":
            break
    else:
        pytest.fail("Tab never reached the Pause button")
    page.keyboard.press("Enter")
    expect(queue_row(page, "mail").get_by_role("button", name="Resume")).to_be_visible()
    queue_row(page, "mail").get_by_role("button", name="Resume").click()
    row = queue_row(page, "mail")
    row.get_by_role("button", name="Pause").click()
    expect(queue_row(page, "mail").get_by_text("Paused", exact=True)).to_be_visible()
    assert ui_host.api("GET", "/v1/queues/mail").json()["paused"] is True
    shot(page, "12-overview-paused")
    queue_row(page, "mail").get_by_role("button", name="Resume").click()
    expect(queue_row(page, "mail").get_by_text("Running", exact=True)).to_be_visible()
    assert ui_host.api("GET", "/v1/queues/mail").json()["paused"] is False

    page.goto("/ui/queues/mail")
    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    assert ui_host.api("GET", "/v1/queues/mail").json()["paused"] is True


def test_limits_are_set_through_the_queue_page_after_confirming(
    context: BrowserContext, ui_host: Host
) -> None:
    job = {"name": "example.echo", "payload": 1, "group": "acct:7", "delay_s": 3600}
    pushed = ui_host.api("POST", "/v1/queues/flow/jobs", job)  # delayed: no drain runs it
    assert pushed.status == 201, pushed.text
    page = context.new_page()
    sign_in(page)
    expect(queue_row(page, "flow")).to_contain_text("none")
    page.get_by_role("link", name="flow", exact=True).click()
    expect(page.get_by_text("None: drains claim this queue's jobs")).to_be_visible()
    expect(page.get_by_role("cell", name="acct:7")).to_be_visible()  # the job list's Group
    page.get_by_label("Concurrency", exact=True).fill("3")
    page.get_by_label("Group concurrency").fill("1")
    page.get_by_label("Rate: claims", exact=True).fill("5")
    page.get_by_label("Rate: per seconds", exact=True).fill("10")
    page.get_by_role("button", name="Change limits").click()
    expect(page.get_by_text("Set the flow limits of queue flow to")).to_contain_text(
        "concurrency 3, group concurrency 1, rate 5 per 10 s"
    )
    shot(page, "14-confirm-limits")
    # Nothing is stored before confirming.
    assert ui_host.api("GET", "/v1/queues/flow/limits").json()["source"] == "none"
    page.get_by_role("button", name="Set limits").click()
    expect(page.get_by_role("status")).to_have_text(
        "Limits saved: every drain claims under them from its next claim."
    )
    expect(page.get_by_text("0 of 3 running")).to_be_visible()
    expect(page.get_by_text("5 claims per 10 s")).to_be_visible()
    expect(page.get_by_label("Concurrency", exact=True)).to_have_value("3")
    shot(page, "15-queue-limits")
    got = ui_host.api("GET", "/v1/queues/flow/limits").json()
    assert got["source"] == "api"
    assert got["limits"] == {
        "concurrency": 3,
        "group_concurrency": 1,
        "rate": {"limit": 5, "period_s": 10},
        "group_rate": None,
    }
    page.goto("/ui")
    expect(queue_row(page, "flow")).to_contain_text(
        "concurrency 0/3 running, group concurrency 1, rate 5 per 10 s"
    )


def test_a_state_change_without_its_csrf_token_is_refused(
    context: BrowserContext, ui_host: Host
) -> None:
    page = context.new_page()
    sign_in(page)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    # A direct POST carrying the session cookie (the context's) but no token.
    reply = page.request.post("/ui/queues/mail/pause", form={"back": "/ui"})
    assert reply.status == 403
    assert "security token" in reply.text()
    assert ui_host.api("GET", "/v1/queues/mail").json()["paused"] is False
    reply = page.request.post("/ui/queues/mail/pause", form={"csrf": "forged" * 7 + "x"})
    assert reply.status == 403
    assert ui_host.api("GET", "/v1/queues/mail").json()["paused"] is False


def test_the_page_refreshes_itself_keeping_the_selection(
    context: BrowserContext, ui_host: Host
) -> None:
    for _ in range(2):
        ui_host.api("POST", "/v1/queues/math/jobs", {"name": "example.add", "payload": {}})
    ui_host.scheduled()
    page = context.new_page()
    sign_in(page)
    page.goto("/ui/failed")
    boxes = page.get_by_role("checkbox", name=re.compile("^Select job "))
    boxes.first.check()
    ui_host.api("POST", "/v1/queues/math/jobs", {"name": "example.add", "payload": {}})
    ui_host.scheduled()
    # The page's script refreshes every 15 s: the third failure appears with
    # the first still selected, and the URL is unchanged.
    expect(boxes).to_have_count(3, timeout=25_000)
    expect(page.get_by_text("1 of 3 selected")).to_be_visible()
    assert page.url.endswith("/ui/failed")


def test_the_schedules_page_and_the_csp(context: BrowserContext, ui_host: Host) -> None:
    made = ui_host.api(
        "POST", "/v1/schedules", {"id": "ui.digest", "cron": "*/5 * * * *", "name": "example.echo"}
    )
    assert made.status in (200, 201), made.text
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    sign_in(page)
    page.get_by_role("link", name="Schedules").click()
    expect(page.get_by_role("heading", name="Schedules")).to_be_visible()
    row = page.get_by_role("row").filter(has_text="ui.digest")
    expect(row).to_contain_text("*/5 * * * *")
    shot(page, "13-schedules")
    row.get_by_role("button", name="Pause").click()
    expect(page.get_by_text("Schedule paused")).to_be_visible()
    assert ui_host.api("GET", "/v1/schedules/ui.digest").json()["paused"] is True
    page.get_by_role("row").filter(has_text="ui.digest").get_by_role(
        "button", name="Resume"
    ).click()
    expect(page.get_by_text("Schedule running again")).to_be_visible()
    assert ui_host.api("GET", "/v1/schedules/ui.digest").json()["paused"] is False
    assert ui_host.api("DELETE", "/v1/schedules/ui.digest").status == 200
    reply = page.request.get("/ui/schedules")
    assert "script-src 'self'" in reply.headers["content-security-policy"]
    assert errors == [], errors  # no CSP violation, no script error


# -- workflows: completed jobs, dependencies, batches ------------------------------------


def workflow_python(ui_host: Host, body: str) -> Any:
    """Run `body` (the inside of `async def main(env)`, with `q` a D1Queue on
    env.DB that keeps history) in the Worker, after emptying the workflow
    tables the host's reset leaves alone."""
    lines = "\n".join("    " + line for line in body.strip().splitlines())
    return ui_host.python(
        "import json\n"
        "from d1queue import D1Queue\n"
        "from d1queue import Outcome\n"
        "async def main(env):\n"
        "    for t in ('d1queue_deps', 'd1queue_batches', 'd1queue_batch_parts'):\n"
        "        await env.DB.prepare(f'DELETE FROM {t}').run()\n"
        "    q = D1Queue(env.DB, keep_completed=True)\n"
        f"{lines}\n"
    )


def test_completed_jobs_are_listed_paged_with_their_results(
    context: BrowserContext, ui_host: Host
) -> None:
    # Completed here with a result (the example handlers return nothing).
    workflow_python(
        ui_host,
        """
for i in range(55):
    await q.dispatch("example.echo", {"i": i}, queue="hist")
while jobs := await q.reserve_batch("hist", 20):
    await q.settle([
        Outcome(j, "complete", result=json.dumps({"i": j.payload["i"], "<b>": "x",
                "token": "hunter2-secret"}))
        for j in jobs
    ])
""",
    )
    page = context.new_page()
    sign_in(page)
    page.goto("/ui/queues/hist")
    page.locator("#queue-summary").get_by_role("link", name="Completed jobs").click()
    expect(page.get_by_role("heading", name="Completed jobs of hist")).to_be_visible()
    rows = page.locator("#completed tbody tr")
    expect(rows).to_have_count(50)
    expect(rows.first).to_contain_text('"<b>": "x"')  # shown as text, escaped
    expect(rows.first).to_contain_text('"token": "••••••"')  # masked
    assert "hunter2-secret" not in page.content()
    shot(page, "16-completed")
    page.get_by_role("link", name="Next page »").click()
    expect(rows).to_have_count(5)
    expect(page.get_by_role("link", name="Next page »")).to_have_count(0)
    page.get_by_role("link", name="« First page").click()
    expect(rows).to_have_count(50)
    # A completed job's page: its state, when, and its whole result.
    rows.first.get_by_role("link").first.click()
    expect(page.locator(".badge.completed")).to_be_visible()
    expect(page.get_by_text("Completed at")).to_be_visible()
    expect(page.get_by_role("heading", name="Result")).to_be_visible()
    shot(page, "17-completed-job")


def test_a_jobs_dependencies_and_dependents_are_linked(
    context: BrowserContext, ui_host: Host
) -> None:
    a, b, c = workflow_python(
        ui_host,
        """
a = await q.dispatch("example.echo", 1, queue="flow")
b = await q.dispatch("example.echo", 2, queue="flow", after=[a])
c = await q.dispatch("example.echo", 3, queue="flow", after=[a, b], ignore_failed=True)
return [a, b, c]
""",
    )
    page = context.new_page()
    sign_in(page)
    page.goto(f"/ui/jobs/{c}")
    expect(page.locator("dd .badge.waiting")).to_have_text("waiting")
    deps = page.get_by_role("list", name="Dependencies")
    expect(deps.get_by_role("link")).to_have_text([a, b])
    expect(deps.locator("li").filter(has_text=a).locator(".badge")).to_have_text("ready")
    expect(deps.locator("li").filter(has_text=b).locator(".badge")).to_have_text("waiting")
    expect(page.get_by_text("Ignores failed dependencies")).to_be_visible()
    shot(page, "18-job-dependencies")
    deps.get_by_role("link", name=a).click()
    expect(page).to_have_url(re.compile(f"/ui/jobs/{a}$"))
    dependents = page.get_by_role("list", name="Dependents")
    expect(dependents.get_by_role("link")).to_have_text(sorted([b, c]))
    dependents.get_by_role("link", name=b).click()
    expect(page.get_by_role("list", name="Dependents").get_by_role("link")).to_have_text([c])

    for _ in range(3):  # a, then b, then c
        ui_host.scheduled()
    page.goto(f"/ui/jobs/{c}")
    expect(page.locator("dd .badge.completed")).to_be_visible()
    expect(deps.locator(".badge.completed")).to_have_count(2)
    expect(page.get_by_text("(2 completed)")).to_be_visible()


def test_a_batch_page_shows_its_progress_and_links_its_jobs(
    context: BrowserContext, ui_host: Host
) -> None:
    batch, ids = workflow_python(
        ui_host,
        """
members = [q.new_job("example.echo", i, queue="batch") for i in range(3)]
batch, ids = await q.batch(members, on_success=q.new_job("example.echo", "ok",
                                queue="batch"))
return [batch, ids]
""",
    )
    page = context.new_page()
    sign_in(page)
    page.goto(f"/ui/batches/{batch}")
    expect(page.get_by_role("heading", name=f"Batch {batch}")).to_be_visible()
    bar = page.get_by_role("progressbar")
    expect(bar).to_have_attribute("aria-valuenow", "0")
    expect(bar).to_have_attribute("aria-valuemax", "3")
    expect(page.get_by_text("0 of 3 ended")).to_be_visible()
    expect(page.get_by_role("list", name="Jobs of the batch").get_by_role("link")).to_have_text(ids)
    callbacks = page.get_by_role("list", name="Callbacks")
    expect(callbacks).to_contain_text("not enqueued yet")
    shot(page, "19-batch-running")

    ui_host.scheduled()
    page.reload()
    expect(page.locator(".stats .badge")).to_have_text("succeeded")
    expect(bar).to_have_attribute("aria-valuenow", "3")
    expect(page.get_by_text("3 of 3 ended (3 completed, 0 failed)")).to_be_visible()
    expect(callbacks.get_by_role("link")).to_have_text([f"{batch}:on_success"])
    expect(callbacks.locator(".badge")).to_have_count(1)  # enqueued: ready, or done by now
    shot(page, "20-batch-done")
    page.set_viewport_size({"width": 375, "height": 800})
    page.reload()
    assert page.evaluate("document.documentElement.scrollWidth") <= 375 + 1
    # A member's page links back to its batch.
    page.get_by_role("link", name=ids[0]).click()
    page.get_by_role("link", name=batch, exact=True).click()
    expect(page).to_have_url(re.compile(f"/ui/batches/{batch}$"))


# -- charts, read-only, a failed batch -------------------------------------------------


def console_errors(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def test_charts_carry_axis_labels_units_and_a_legend(
    context: BrowserContext, ui_host: Host
) -> None:
    for i in range(3):
        ui_host.api("POST", "/v1/queues/mail/jobs", {"name": "example.echo", "payload": i})
    ui_host.api("POST", "/v1/queues/math/jobs", {"name": "example.add", "payload": {}})
    ui_host.scheduled()
    page = context.new_page()
    errors = console_errors(page)
    sign_in(page)
    # The overview's chart has its axes now.
    hour = page.locator("svg#chart-hour")
    expect(hour.locator("text.at")).to_have_text(["Jobs per minute", re.compile("^Time \\(UTC\\)")])
    page.get_by_role("link", name="Metrics").click()
    expect(page.get_by_role("heading", name="Metrics", exact=True)).to_be_visible()
    outcomes = page.locator("svg#chart-outcomes")
    expect(outcomes.locator("text.at")).to_have_text(
        ["Jobs per minute", "Time (UTC), one minute a step"]
    )
    expect(
        outcomes.locator("text.tl").filter(has_text=re.compile(r"^\d\d:\d0$")).first
    ).to_be_visible()
    expect(outcomes.locator("text.kl")).to_contain_text(
        ["completed (solid): 3", "retried (striped): 0", "failed (cross-hatched): 1"]
    )
    wait = page.locator("svg#chart-wait")
    expect(wait.locator("text.at").first).to_have_text("Seconds (p50, p95)")
    expect(wait.locator("text.kl")).to_have_text(["p50 wait", "p95 wait"])
    assert re.search(
        r"(ms|s|min|h)$", wait.locator('text.tl[text-anchor="end"]').last.text_content() or ""
    )
    shot(page, "21-metrics")
    # The job names' table, sorted on the server by failure rate.
    page.get_by_role("link", name=re.compile("^Failure rate")).click()
    expect(page).to_have_url(re.compile(r"/ui/metrics\?sort=-failure$"))
    first = page.locator("#names tbody tr").first
    expect(first.get_by_role("rowheader")).to_have_text("example.add")
    expect(first).to_contain_text("100.0 %")
    # Its row links to its charts, and its charts say whose they are.
    first.get_by_role("link", name="example.add", exact=True).click()
    expect(page.get_by_role("heading", name="Metrics of example.add")).to_be_visible()
    page.get_by_role("link", name="Last 7 days").click()
    expect(page.locator("svg#chart-outcomes text.at").first).to_have_text("Jobs per hour")
    shot(page, "22-metrics-name-7d")
    assert errors == [], errors


def test_the_readonly_token_sees_pages_but_gets_no_action(
    context: BrowserContext, ui_host: Host
) -> None:
    pushed = ui_host.api("POST", "/v1/queues/mail/jobs", {"name": "example.echo", "payload": 1})
    ui_host.api("POST", "/v1/queues/math/jobs", {"name": "example.add", "payload": {}})
    ui_host.scheduled()
    page = context.new_page()
    errors = console_errors(page)
    sign_in(page, token=READONLY)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_text("Read-only", exact=True)).to_be_visible()
    for path in ("/ui", "/ui/queues/mail", "/ui/failed", "/ui/schedules", "/ui/metrics"):
        page.goto(path)
        for name in ("Pause", "Resume", "Retry", "Delete", "Change limits"):
            expect(page.get_by_role("button", name=name, exact=True)).to_have_count(0)
    failed = ui_host.api("GET", "/v1/failed?queue=math").json()["jobs"][0]["id"]
    page.goto(f"/ui/jobs/{failed}")
    expect(page.get_by_role("heading", name="Job example.add")).to_be_visible()
    expect(page.get_by_role("button")).to_have_text(["Search", "Stop auto-refresh", "Sign out"])
    shot(page, "23-read-only-job")
    # The server refuses an action sent anyway, with the session's own CSRF token.
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value") or ""
    reply = page.request.post("/ui/queues/mail/pause", form={"csrf": csrf, "back": "/ui"})
    assert reply.status == 403 and "read-only token" in reply.text()
    assert ui_host.api("GET", "/v1/queues/mail").json()["paused"] is False
    # And the API: reads pass, writes are refused.
    assert ui_host.api("GET", f"/v1/jobs/{pushed.json()['id']}", token=READONLY).status == 200
    refused = ui_host.api("POST", "/v1/queues/mail/pause", token=READONLY)
    assert refused.status == 403 and refused.json()["error"]["code"] == "read_only"
    assert ui_host.api("GET", "/v1/queues/mail").json()["paused"] is False
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/ui/signin"))
    assert errors == [], errors


def test_a_failed_batch_does_not_show_as_success(context: BrowserContext, ui_host: Host) -> None:
    batch, ids = workflow_python(
        ui_host,
        """
members = [q.new_job("example.echo", 1, queue="batch"), q.new_job("example.add", {},
           queue="batch")]
batch, ids = await q.batch(members)
return [batch, ids]
""",
    )
    ui_host.scheduled()
    page = context.new_page()
    sign_in(page)
    page.goto(f"/ui/batches/{batch}")
    expect(page.locator(".stats .badge")).to_have_text("failed")
    bar = page.get_by_role("progressbar")
    expect(bar).to_have_attribute("aria-valuetext", "2 of 2 ended (1 completed, 1 failed)")
    # Half the bar is the failed share, cross-hatched, beside the completed half.
    parts = bar.locator("svg.share")
    expect(parts.locator("rect.c")).to_have_attribute("width", "50.0%")
    expect(parts.locator("rect.f")).to_have_attribute("width", "50.0%")
    expect(parts.locator("rect.f")).to_have_attribute("fill", "url(#batch-bar-f)")
    expect(page.get_by_text("1 failed (cross-hatched)")).to_be_visible()
    # The breadcrumbs name the batch, and a member's its queue and its name.
    expect(page.get_by_role("navigation", name="Breadcrumb")).to_have_text(
        f"Overview › Batch {batch}"
    )
    shot(page, "24-batch-failed")
    page.get_by_role("link", name=ids[1]).click()
    expect(page.get_by_role("navigation", name="Breadcrumb")).to_have_text(
        f"Overview › Queue batch › Batch {batch} › Job example.add ({ids[1]})"
    )


def test_a_pushed_job_is_found_by_its_id_its_name_and_a_payload_word(
    context: BrowserContext, ui_host: Host
) -> None:
    pushed = ui_host.api(
        "POST", "/v1/queues/mail/jobs", {"name": "example.echo", "payload": {"to": "zebrafish"}}
    ).json()["id"]
    ui_host.api("POST", "/v1/queues/other/jobs", {"name": "example.echo", "payload": {"to": "x"}})
    page = context.new_page()
    errors = console_errors(page)
    sign_in(page)
    box = page.get_by_role("search", name="Search jobs").get_by_role("searchbox")
    box.fill(pushed)
    box.press("Enter")
    expect(page).to_have_url(re.compile(f"/ui/jobs/{pushed}$"))
    expect(page.get_by_role("heading", name="Job example.echo")).to_be_visible()
    # By a payload word, from the job's page: the box is on every page.
    box = page.get_by_role("search", name="Search jobs").first.get_by_role("searchbox")
    box.fill("ZebraFish")
    box.press("Enter")
    expect(page).to_have_url(re.compile(r"/ui/search\?q=ZebraFish$"))
    results = page.get_by_role("region", name="Jobs found")
    expect(results.get_by_role("link", name=pushed)).to_be_visible()
    expect(results.locator("tbody tr")).to_have_count(1)
    shot(page, "25-search-payload")
    # By its name and queue: the filter is in the URL, to share.
    page.goto("/ui/search?q=name:example.echo+queue:mail")
    expect(page.get_by_role("region", name="Jobs found").locator("tbody tr")).to_have_count(1)
    page.goto("/ui/search?q=name:example.echo")
    expect(page.get_by_role("region", name="Jobs found").locator("tbody tr")).to_have_count(2)
    assert errors == [], errors


def test_the_batches_index_shows_a_failed_batch_as_failed(
    context: BrowserContext, ui_host: Host
) -> None:
    bad, good = workflow_python(
        ui_host,
        """
bad, _ = await q.batch([q.new_job("example.echo", 1, queue="batch"),
                        q.new_job("example.add", {}, queue="batch")],
                       on_failure=q.new_job("example.echo", "f", queue="batch"))
good, _ = await q.batch([q.new_job("example.echo", 2, queue="batch")])
return [bad, good]
""",
    )
    ui_host.scheduled()
    page = context.new_page()
    errors = console_errors(page)
    sign_in(page)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Batches").click()
    expect(page.get_by_role("heading", name="Batches")).to_be_visible()
    failed = page.get_by_role("row").filter(has=page.get_by_role("link", name=bad))
    expect(failed.locator(".badge")).to_have_text("failed")
    expect(failed).to_contain_text("2 of 2 ended: 1 completed, 1 failed, 0 pending")
    expect(failed).to_contain_text("on_failure: pushed")
    expect(failed.locator("svg.share rect.f")).to_have_attribute("width", "50.0%")
    succeeded = page.get_by_role("row").filter(has=page.get_by_role("link", name=good))
    expect(succeeded.locator(".badge")).to_have_text("succeeded")
    shot(page, "26-batches")
    failed.get_by_role("link", name=bad).click()
    expect(page.locator(".stats .badge")).to_have_text("failed")
    assert errors == [], errors


def test_a_schedule_runs_now_once_and_is_edited(context: BrowserContext, ui_host: Host) -> None:
    made = ui_host.api(
        "POST", "/v1/schedules", {"id": "ui.runs", "cron": "0 3 * * *", "name": "example.echo"}
    )
    assert made.status in (200, 201), made.text
    page = context.new_page()
    errors = console_errors(page)
    sign_in(page)
    page.goto("/ui/schedules")
    page.get_by_role("link", name="ui.runs").click()
    expect(page.get_by_role("heading", name="Schedule ui.runs")).to_be_visible()
    expect(page.get_by_text("None yet")).to_be_visible()
    form = page.locator('form[action="/ui/schedules/ui.runs/run"]')
    sent = {
        name: form.locator(f'input[name="{name}"]').get_attribute("value") or ""
        for name in ("csrf", "run", "back")
    }
    form.get_by_role("button", name="Run now").click()
    expect(page.get_by_text("The schedule's job was pushed now")).to_be_visible()
    runs = page.get_by_role("table", name="Last runs, newest first")
    expect(runs.locator("tbody tr")).to_have_count(1)
    expect(runs).to_contain_text(sent["run"])
    expect(runs).not_to_contain_text("1970")  # its time read as ms, not as 1.79e12 s
    assert ui_host.api("GET", f"/v1/jobs/{sent['run']}").status == 200
    # The same click sent again pushes nothing more.
    again = page.request.post("/ui/schedules/ui.runs/run", form=sent, max_redirects=0)
    assert again.status == 303 and "schedule_run_again" in again.headers["location"]
    page.reload()
    expect(runs.locator("tbody tr")).to_have_count(1)
    shot(page, "27-schedule")
    # A bad cron is a clear error, and nothing is written.
    page.get_by_label("Cron (5 fields or @daily…)").fill("61 * * * *")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("alert")).to_contain_text("Nothing was changed")
    assert ui_host.api("GET", "/v1/schedules/ui.runs").json()["cron"] == "0 3 * * *"
    page.goto("/ui/schedules/ui.runs")
    page.get_by_label("Cron (5 fields or @daily…)").fill("30 6 * * 1")
    page.get_by_label("Time zone (IANA)").fill("Europe/Berlin")
    page.get_by_label("Payload (JSON)").fill('{"to": "edited"}')
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_text("Schedule saved")).to_be_visible()
    got = ui_host.api("GET", "/v1/schedules/ui.runs").json()
    assert (got["cron"], got["tz"], got["payload"]) == (
        "30 6 * * 1",
        "Europe/Berlin",
        {"to": "edited"},
    )
    assert ui_host.api("DELETE", "/v1/schedules/ui.runs").status == 200
    # The one error: chromium logs the refused edit's 422 page, as it should.
    assert [e for e in errors if "status of 422" not in e] == [], errors
    assert len(errors) == 1, errors


def test_a_bulk_retry_of_a_filter_reports_its_count_and_does_it(
    context: BrowserContext, ui_host: Host
) -> None:
    ids = [
        ui_host.api(
            "POST", "/v1/queues/bulkq/jobs", {"name": "example.add", "payload": {"a": "x"}}
        ).json()["id"]
        for _ in range(3)
    ]
    ui_host.scheduled()  # a bad payload fails for good
    page = context.new_page()
    errors = console_errors(page)
    sign_in(page)
    page.goto("/ui/failed?queue=bulkq")
    page.get_by_role("link", name="Bulk actions on every failed job matching this filter").click()
    expect(page).to_have_url(re.compile(r"/ui/search\?q=state%3Afailed\+queue%3Abulkq$"))
    expect(page.get_by_role("region", name="Jobs found").locator("tbody tr")).to_have_count(3)
    page.get_by_role("button", name="Retry all matching…").click()
    expect(page.get_by_text("Retry 3 failed jobs matching queue:bulkq?")).to_be_visible()
    shot(page, "27-bulk-confirm")
    for id in ids:
        assert ui_host.api("GET", f"/v1/jobs/{id}").json()["state"] == "failed"
    page.get_by_role("button", name="Retry 3 jobs").click()
    expect(page.locator("#bulk-done")).to_contain_text("Done: 3 failed jobs retried in total")
    shot(page, "28-bulk-done")
    for id in ids:
        assert ui_host.api("GET", f"/v1/jobs/{id}").json()["state"] == "ready"
    page.get_by_role("link", name="Audit log").click()
    audit = page.get_by_role("region", name="Bulk actions")
    expect(audit.locator("tbody tr").first).to_contain_text("state:failed queue:bulkq")
    shot(page, "29-audit")
    assert errors == [], errors


def test_a_bulk_retry_past_one_step_carries_on_by_itself(
    context: BrowserContext, ui_host: Host
) -> None:
    """120 failed jobs: three steps of at most 50, the next sent by the
    page's script, then the total."""
    ui_host.python(
        """
        async def main(env):
            await env.DB.prepare(
                "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, attempts, "
                "max_attempts, priority, created_at, failed_at) "
                "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 120) "
                "SELECT printf('manyfail%04d', i), 'many', 'example.echo', '{}', 'boom', 1, 1, "
                "0, 1000 + i, 1000 + i FROM c"
            ).run()
        """
    )
    page = context.new_page()
    errors = console_errors(page)
    sign_in(page)
    page.goto("/ui/search?q=state:failed+queue:many")
    page.get_by_role("button", name="Retry all matching…").click()
    expect(page.get_by_text("Retry 120 failed jobs matching queue:many?")).to_be_visible()
    page.get_by_role("button", name="Retry 120 jobs").click()
    expect(page.locator("#bulk-done")).to_contain_text(
        "Done: 120 failed jobs retried in total, in 3 steps", timeout=20_000
    )
    assert ui_host.api("GET", "/v1/jobs/manyfail0001").json()["state"] == "ready"
    assert ui_host.api("GET", "/v1/jobs/manyfail0120").json()["state"] == "ready"
    assert errors == [], errors
