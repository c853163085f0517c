"""The dashboard's Running now page and its live refresh in Debian's
chromium (Playwright, as test_dashboard_browser.py) against the Worker in
the offline host: a running example.steps shows in Running now with its
progress and is cancelled there; the refresh interval is chosen, kept
across pages, stopped and started, and nothing is fetched while the tab is
hidden; no page logs a console error."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from playwright.sync_api import BrowserContext, Page, Request, expect

from .conftest import Host
from .test_dashboard_browser import (  # noqa: F401 (fixtures)
    browser,
    console_errors,
    context,
    shot,
    sign_in,
    ui_host,
)


def refreshes(page: Page) -> list[str]:
    """The live refreshes the page's script sends (its x-d1queue-refresh
    header), as they are sent."""
    sent: list[str] = []

    def seen(request: Request) -> None:
        if request.headers.get("x-d1queue-refresh") == "1":
            sent.append(request.url)

    page.on("request", seen)
    return sent


def wait_state(host: Host, id: str, state: str, seconds: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        job: dict[str, Any] = host.api("GET", f"/v1/jobs/{id}").json()
        if job["state"] == state or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def test_a_running_job_shows_in_running_now_and_is_cancelled_there(
    context: BrowserContext,  # noqa: F811 (the fixture imported above)
    ui_host: Host,  # noqa: F811
) -> None:
    pushed = ui_host.api(
        "POST",
        "/v1/queues/steps/jobs",
        {"name": "example.steps", "payload": {"steps": 40, "sleep_ms": 1000}},
    )
    job_id = pushed.json()["id"]
    ran: list[int] = []
    cron = threading.Thread(target=lambda: ran.append(ui_host.scheduled().status))
    cron.start()
    assert wait_state(ui_host, job_id, "reserved")["state"] == "reserved"

    page = context.new_page()
    errors = console_errors(page)
    sign_in(page)
    page.get_by_role("link", name="Running now").click()
    expect(page.get_by_role("heading", name="Running now", exact=True)).to_be_visible()
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=job_id))
    expect(row).to_contain_text("example.steps")
    expect(row).to_contain_text("1 of 3")
    # Its progress, as the page refreshes itself (at most every 2 s here).
    page.get_by_label("Refresh every").select_option("2000")
    expect(row).to_contain_text(re.compile(r"step \d+ of 40"), timeout=15_000)
    shot(page, "30-running-now")

    row.get_by_role("button", name="Cancel").click()
    expect(page).to_have_url(re.compile(r"/ui/running\?notice=cancelling$"))
    expect(page.get_by_role("status")).to_contain_text("Job running: marked")
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=job_id))
    expect(row).to_contain_text("cancelling")
    expect(row.get_by_role("button", name="Cancel")).to_have_count(0)
    shot(page, "31-running-now-cancelling")

    cron.join(90)
    assert ran == [200]
    assert wait_state(ui_host, job_id, "cancelled")["state"] == "cancelled"
    page.reload()
    expect(page.get_by_text("No job is running now")).to_be_visible()
    assert errors == [], errors


def test_the_live_control_sets_stops_and_pauses_the_refresh(
    context: BrowserContext,  # noqa: F811 (the fixture imported above)
    ui_host: Host,  # noqa: F811
) -> None:
    ui_host.api("POST", "/v1/queues/mail/jobs", {"name": "example.echo", "payload": 1})
    page = context.new_page()
    errors = console_errors(page)
    sent = refreshes(page)
    sign_in(page)
    pick = page.get_by_label("Refresh every")
    expect(pick).to_have_value("15000")
    pick.select_option("2000")
    expect(page.locator("#refresh-status")).to_contain_text("every 2 s")
    page.wait_for_timeout(5_000)
    assert len(sent) >= 1, "refreshed at its interval"

    # Kept for the next page, in this browser.
    page.goto("/ui/running")
    expect(page.get_by_label("Refresh every")).to_have_value("2000")

    # Stopped: nothing is fetched, and the choice is kept too.
    page.get_by_role("button", name="Stop auto-refresh").click()
    expect(page.locator("#refresh-status")).to_have_text("Auto-refresh is off")
    before = len(sent)
    page.wait_for_timeout(5_000)
    assert len(sent) == before, "stopped"
    page.reload()
    expect(page.get_by_role("button", name="Start auto-refresh")).to_be_visible()

    # Started again: at once, then at its interval.
    page.get_by_role("button", name="Start auto-refresh").click()
    expect(page.get_by_role("button", name="Stop auto-refresh")).to_be_visible()
    page.wait_for_timeout(3_000)
    assert len(sent) > before, "started"

    # Hidden: the timer stops; shown again after its interval, it refreshes at once.
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});"
        "document.dispatchEvent(new Event('visibilitychange'));"
    )
    expect(page.locator("#refresh-status")).to_have_text("Paused while the tab is hidden")
    hidden_at = len(sent)
    page.wait_for_timeout(5_000)
    assert len(sent) == hidden_at, "nothing fetched while hidden"
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});"
        "document.dispatchEvent(new Event('visibilitychange'));"
    )
    page.wait_for_timeout(1_500)
    assert len(sent) > hidden_at, "refreshed when shown again"
    shot(page, "32-live-control")
    assert errors == [], errors
