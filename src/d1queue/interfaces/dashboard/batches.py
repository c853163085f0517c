"""What the batches index shows: every batch, newest first, a page at a
time (keyset cursor), each with its state (running, succeeded, failed: a
batch with a failed job reads failed, in words and in its bar, never as
done well), its progress in words and as a bar split by outcome, and each
callback it was given with whether it was pushed. The page is the tuple of
its sections (BATCHES) over what Pages reads for it (BatchesShown)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...store.dashboard import Page
from . import html as h
from .parts import Column, badge, crumbs, empty, live, pager, table
from .request import Request
from .svg import share_bar

Batch = dict[str, Any]
"""A row of the index (store/dashboard.py's batch_row)."""


@dataclass
class BatchesShown:
    """What the batches index shows (Pages.batches_page reads it)."""

    request: Request
    cursor: str
    page: Page


def progress(b: Batch, index: int) -> str:
    """A batch's progress: its counts in words, then a bar split by outcome
    (its patterns tell completed from failed without colour)."""
    ended = b["completed"] + b["failed"]
    said = (
        f"{ended} of {b['total']} ended: {b['completed']} completed, {b['failed']} failed, "
        f"{b['pending']} pending"
    )
    parts = [("completed", b["completed"]), ("failed", b["failed"])]
    bar = share_bar(f"bb{index}", parts, b["total"], legend=False)
    return f'<div class="progress"><p class="counts">{h.e(said)}</p>{bar}</div>'


def callbacks(b: Batch) -> str:
    """Each callback the batch was given and whether it was pushed: one not
    pushed while the batch runs may still be; once it finished, its case
    did not occur (on_success after a failure, on_failure with none)."""
    if not b["callbacks"]:
        return '<span class="muted">none</span>'
    waiting = "not pushed yet" if b["state"] == "running" else "not pushed: its case did not occur"
    items = "".join(
        f"<li>{h.e(kind)}: "
        + ("<strong>pushed</strong>" if fired else f'<span class="muted">{h.e(waiting)}</span>')
        + "</li>"
        for kind, fired in b["callbacks"]
    )
    return f'<ul class="links callbacks">{items}</ul>'


def batch_columns(now: int) -> list[Column[tuple[int, Batch]]]:
    return [
        Column(
            "Batch",
            lambda r: f'<a class="mono" href="/ui/batches/{h.q(r[1]["id"])}">{h.e(r[1]["id"])}</a>',
            row_header=True,
        ),
        Column("State", lambda r: badge(r[1]["state"])),
        Column("Progress", lambda r: progress(r[1], r[0])),
        Column("Callbacks", lambda r: callbacks(r[1])),
        Column("Created", lambda r: h.when(r[1]["created_at"], now), "hide-narrow"),
        Column("Finished", lambda r: h.when(r[1]["finished_at"], now), "hide-narrow"),
    ]


def batches_heading(shown: BatchesShown) -> str:
    return crumbs([("/ui", "Overview")], "Batches") + "<h1>Batches</h1>"


def batches_list(shown: BatchesShown) -> str:
    rows = shown.page.rows
    if not rows:
        text = (
            "<strong>No batches on this page.</strong>"
            if shown.cursor
            else "<strong>No batches yet.</strong> Push one with <code>POST /v1/batches</code> "
            "(jobs, and optional on_success, on_failure and on_finish callbacks); a finished "
            "batch is kept as long as completed jobs are (D1QUEUE_KEEP_COMPLETED_S)."
        )
        return empty(text)
    listing = table("Batches, newest first", batch_columns(shown.request.now_ms), enumerate(rows))
    return listing + pager("/ui/batches", {}, shown.cursor, shown.page.next_cursor)


BATCHES = (batches_heading, live("batches", (batches_list,)))
