"""The dashboard's pages as tuples of sections over made-up values, with no
database: a table as its columns, a section alone, a page as its sections
in order. What the pages show over a real store: tests/test_dashboard.py."""

from __future__ import annotations

from typing import Any

from d1queue.interfaces.dashboard.jobs import JOB, JobShown, job_actions
from d1queue.interfaces.dashboard.parts import Column, render, table
from d1queue.interfaces.dashboard.queues import QUEUE, QueueShown, queue_summary
from d1queue.interfaces.dashboard.request import Request
from d1queue.store.admin import QueueStats
from d1queue.store.dashboard import Links, Page


def request(**query: str) -> Request:
    return Request(
        method="GET",
        path="/ui",
        query={k: [v] for k, v in query.items()},
        headers={"host": "127.0.0.1:8787"},
        body=b"",
        secure=False,
        now_ms=1_700_000_000_000,
        csrf="token",
    )


def test_a_table_is_its_columns_header_and_cells_in_order() -> None:
    columns: list[Column[tuple[str, int]]] = [
        Column("Name", lambda r: r[0], row_header=True),
        Column("Count", lambda r: r[1], "num"),
        Column("Note", lambda r: "-", "hide-narrow", cell_cls="muted"),
    ]
    assert table("Things", columns, [("a", 1), ("b", 2)]) == (
        '<div class="table-wrap"><table><caption class="visually-hidden">Things</caption>'
        '<thead><tr><th scope="col">Name</th><th scope="col" class="num">Count</th>'
        '<th scope="col" class="hide-narrow">Note</th></tr></thead><tbody>'
        '<tr><th scope="row">a</th><td class="num">1</td><td class="muted">-</td></tr>'
        '<tr><th scope="row">b</th><td class="num">2</td><td class="muted">-</td></tr>'
        "</tbody></table></div>"
    )


def queue_shown(**stats: Any) -> QueueShown:
    flow = {
        "limits": dict.fromkeys(("concurrency", "group_concurrency", "rate", "group_rate")),
        "source": "none",
        "running": 0,
        "running_by_group": {},
    }
    return QueueShown(
        request(state="ready"),
        "mail",
        "ready",
        "",
        "",
        QueueStats("mail", **stats),
        Page([], None),
        flow,
    )


def test_a_section_is_called_alone_with_what_its_page_shows() -> None:
    summary = queue_summary(queue_shown(ready=3, failed=2, paused=True))
    assert '<span class="n">3</span>ready' in summary
    assert '<a href="/ui/failed?queue=mail">2</a>' in summary
    # Paused: its button resumes it, and comes back to the page as filtered.
    assert 'action="/ui/queues/mail/resume"' in summary
    assert 'name="back" value="/ui/queues/mail?state=ready"' in summary


def test_a_page_is_its_sections_in_order() -> None:
    shown = queue_shown()
    assert render(shown, QUEUE) == "".join(section(shown) for section in QUEUE)
    assert [s.__name__ for s in QUEUE] == [
        "queue_heading",
        "queue_summary",
        "queue_limits",
        "jobs_filters",
        "jobs",
    ]
    assert "No jobs match this filter." in render(shown, QUEUE)


def job_shown(state: str) -> JobShown:
    job = {
        "id": "0" * 32,
        "queue": "mail",
        "name": "send",
        "state": state,
        "attempts": 1,
        "max_attempts": 3,
        "priority": 0,
        "payload": {"to": "a@example.com"},
        "after": [],
        "batch": None,
        "result": None,
    }
    return JobShown(request(), "0" * 32, job, Links([], False, {}))


def test_a_held_jobs_run_now_is_off_and_says_why_and_its_cancel_marks_it() -> None:
    actions = job_actions(job_shown("reserved"))
    assert actions.count(" disabled") == 1
    assert actions.count('title="A worker is running it now"') == 1
    assert "A worker holds this job: a cancel marks it" in actions and "/cancel" in actions
    delayed = job_actions(job_shown("delayed"))
    assert " disabled" not in delayed and "/run" in delayed
    page = render(job_shown("delayed"), JOB)
    assert page.index("<h1>Job send</h1>") < page.index('<div id="job" data-live>')
    assert page.endswith("</pre></div>")
