"""What the job and batch pages show: a job wherever it is in its life
(waiting, ready, delayed, reserved, completed and kept, failed) with its
workflow, and a batch's progress with its jobs and callbacks. Each page is
the tuple of its sections (JOB, BATCH) over what Pages reads for it
(JobShown, BatchShown)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...core.job import trace_fields
from ...store.dashboard import BATCH_PAGE, BatchPage, Links, job_fields
from ...store.failed import FailedJob
from ...store.workflows import JobView
from ..service import stored_payload
from . import html as h
from .mask import mask, scrub
from .parts import (
    GONE,
    Column,
    badge,
    button,
    crumbs,
    group,
    inline_form,
    job_link,
    linked,
    live,
    nav,
    notice,
    props,
    stats,
    table,
)
from .request import Request, csrf_field
from .svg import share_bar

RESULT_SHOWN = 20_000
"""Characters of a completed job's result its page shows (a result is at
most bounds.MAX_RESULT_BYTES as compact JSON; pretty-printed it is longer)."""


def _after_ids(text: str | None) -> list[str]:
    """A failed job's stored `after` (a JSON array, or NULL) as ids; text
    that is not one (written by something else) as none."""
    try:
        ids = json.loads(text) if text else []
    except ValueError:
        return []
    return [str(i) for i in ids] if isinstance(ids, list) else []


def shown_fields(found: JobView | FailedJob) -> dict[str, Any]:
    """What the job page shows of a job, wherever it is in its life."""
    if not isinstance(found, FailedJob):
        return job_fields(found)
    return {
        **{k: found[k] for k in ("id", "queue", "name", "group", "attempts")},
        **{k: found[k] for k in ("max_attempts", "priority", "created_at", "failed_at")},
        "state": "failed",
        "error": found.error,
        "payload": stored_payload(found.payload),
        "after": _after_ids(found.after),
        "ignore_failed": False,
        "batch": found.batch,
        "runs": found.runs,
        "progress": found.runs[-1].get("progress") if found.runs else None,
        "started_at": None,
        "traceparent": None,  # kept on the failed row for a retry; not read here
    }


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def cut(text: str, n: int) -> str:
    """`text` at most `n` characters, saying how much was left out."""
    if len(text) <= n:
        return text
    return f"{text[:n]}\n… ({len(text) - n} more characters not shown)"


# -- a job ------------------------------------------------------------------------


@dataclass
class JobShown:
    """What a job's page shows (Pages.job_page reads it)."""

    request: Request
    id: str
    job: dict[str, Any]
    """shown_fields: the job wherever it is."""
    links: Links
    """The states of the jobs it waits for and of those waiting for it."""

    @property
    def state(self) -> str:
        return str(self.job["state"])

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    @property
    def completed(self) -> bool:
        return self.state == "completed"


JOB_GONE = (
    "<strong>This job is not queued, not failed and not kept as completed:</strong> it "
    "was cancelled or removed, completed on a queue that keeps no history (or longer ago "
    "than it keeps it), or never existed."
)
"""Why a job's page finds no job."""


def job_heading(shown: JobShown) -> str:
    job = shown.job
    trail = [("/ui", "Overview"), (f"/ui/queues/{h.q(job['queue'])}", f"Queue {job['queue']}")]
    if job.get("batch"):
        trail.append((f"/ui/batches/{h.q(job['batch'])}", f"Batch {job['batch']}"))
    return (
        crumbs(trail, f"Job {job['name']} ({shown.id})")
        + f"<h1>Job {h.e(job['name'])}</h1>{notice(shown.request)}"
    )


def _when(shown: JobShown) -> list[tuple[str, str]]:
    """The times of the job's place in its life: when it failed, completed,
    or may start, and its lease's end and unique key while it is queued."""
    job, now = shown.job, shown.request.now_ms
    if shown.failed:
        return [("Failed at", h.when(job.get("failed_at"), now))]
    if shown.completed:
        return [("Completed at", h.when(job.get("completed_at"), now))]
    label = "May start at" if shown.state == "waiting" else "Available at"
    out = [(label, h.when(job.get("available_at"), now))]
    if job.get("started_at"):  # its running attempt's claim
        ran = h.age(max(0, now - int(job["started_at"])) / 1000)
        out.append(("Started", f"{h.when(job['started_at'], now)} · running for {ran}"))
    if job.get("reserved_until"):
        out.append(("Lease ends", h.when(job["reserved_until"], now)))
    if job.get("unique_key"):
        out.append(("Unique key", f'<span class="mono">{h.e(job["unique_key"])}</span>'))
    return out


def job_props(shown: JobShown) -> str:
    job = shown.job
    items = [
        ("Id", f'<span class="mono">{h.e(job["id"])}</span>'),
        ("Queue", f'<a href="/ui/queues/{h.q(job["queue"])}">{h.e(job["queue"])}</a>'),
        (
            "Name",
            f'{h.e(job["name"])} <a class="muted" href="'
            f'{h.e("/ui/metrics" + h.qs({"queue": job["queue"], "name": job["name"]}))}">'
            "(its metrics)</a>",
        ),
        ("Group", group(job.get("group"))),
        ("State", badge(shown.state)),
        ("Attempts", f"{job['attempts']} of {job['max_attempts']}"),
        ("Priority", h.e(job["priority"])),
        ("Created", h.when(job.get("created_at"), shown.request.now_ms)),
        *_when(shown),
    ]
    if job["batch"]:
        items.append(("Batch", job_link(job["batch"], "/ui/batches/")))
    trace = trace_fields(job.get("traceparent"))
    if trace:
        items.append(
            (
                "Trace id",
                f'<span class="mono" title="{h.e(job["traceparent"])}">'
                f"{h.e(trace['trace_id'])}</span>",
            )
        )
    if job["after"] and not shown.failed:  # a failure's row does not keep the flag
        items.append(("Ignores failed dependencies", "yes" if job["ignore_failed"] else "no"))
    return props(items)


def _failed_actions(id: str, csrf: str) -> str:
    """A failed job's buttons: retry it, delete it (the failed list's bulk action)."""
    sent = csrf + h.hidden("ids", id)
    back = h.hidden("back", "/ui/failed")
    return inline_form(
        "/ui/failed/bulk", sent + h.hidden("action", "retry") + back, button("Retry")
    ) + inline_form(
        "/ui/failed/bulk",
        sent + h.hidden("action", "delete") + back,
        button("Delete", cls="danger"),
    )


def _queued_actions(shown: JobShown, csrf: str) -> str:
    """A queued job's buttons, run now (a delayed job) and cancel, and why
    one is off. A held job's cancel marks it, and its drain ends it."""
    state = shown.state
    held, delayed = state == "reserved", state == "delayed"
    why = "A worker is running it now" if held else ""
    here = f"/ui/jobs/{h.q(shown.id)}"
    out = inline_form(
        f"{here}/run", csrf, button("Run now", disabled=not delayed, title=why)
    ) + inline_form(f"{here}/cancel", csrf, button("Cancel job", cls="danger"))
    if held:
        return out + (
            '<span class="muted">A worker holds this job: a cancel marks it, and its '
            "drain ends it cancelled.</span>"
        )
    if state == "cancelling":
        return out + (
            '<span class="muted">Cancelling: its drain (or the next claim) ends it; it '
            "will not run again.</span>"
        )
    if state == "waiting":
        return out + (
            '<span class="muted">It waits for its dependencies: the last one to '
            "complete makes it ready.</span>"
        )
    if not delayed:
        return out + '<span class="muted">It is due: the next drain runs it.</span>'
    return out


def job_actions(shown: JobShown) -> str:
    if shown.request.readonly:
        return ""
    csrf = csrf_field(shown.request)
    if shown.failed:
        actions = _failed_actions(shown.id, csrf)
    elif shown.completed:
        actions = '<span class="muted">It completed: nothing is left to do.</span>'
    else:
        actions = _queued_actions(shown, csrf)
    return f'<div class="actions">{actions}</div>'


def job_result(shown: JobShown) -> str:
    """A completed job's result, masked and cut short."""
    if not shown.completed:
        return ""
    result = shown.job["result"]
    return "<h2>Result</h2>" + (
        '<p class="muted">None (the handler returned nothing).</p>'
        if result is None
        else f"<pre>{h.e(cut(pretty(mask(result)), RESULT_SHOWN))}</pre>"
    )


def job_error(shown: JobShown) -> str:
    """Why it failed, or its last attempt's error, scrubbed of its payload's secrets."""
    job = shown.job
    error = scrub(job.get("error") if shown.failed else job.get("last_error"), job["payload"])
    return f"<h2>{'Error' if shown.failed else 'Last error'}</h2>" + (
        f"<pre>{h.e(error)}</pre>" if error else '<p class="muted">None.</p>'
    )


def job_progress(shown: JobShown) -> str:
    """Its latest progress report and, while it runs, the log lines its
    attempt has written with it so far."""
    job = shown.job
    progress = job.get("progress")
    if not progress:
        return ""
    note = f" — {h.e(progress['note'])}" if progress.get("note") else ""
    parts = [
        "<h2>Progress</h2>",
        f'<p>{h.e(progress.get("value"))}{note} <span class="muted">(attempt '
        f"{h.e(progress.get('attempt'))}, "
        f"{h.when(progress.get('at'), shown.request.now_ms)})</span></p>",
    ]
    logs = progress.get("logs") if shown.state in ("reserved", "cancelling") else None
    if logs:
        parts.append(_log_lines(logs, job["payload"]))
    return "".join(parts)


def _log_lines(lines: list[dict[str, Any]], payload: Any) -> str:
    text = "\n".join(f"{x.get('level', '')}: {x.get('message', '')}" for x in lines)
    return f"<pre>{h.e(scrub(text, payload))}</pre>"


RUN_ERROR_SHOWN = 2_000
"""Characters of an attempt's error its row shows in full (beyond: cut,
saying how much was left out)."""


def _run_error(error: str | None, payload: Any) -> str:
    """An attempt's error, scrubbed of its payload's secrets: on one line
    when short, else whole (up to RUN_ERROR_SHOWN) in a block."""
    text = scrub(error, payload)
    if not text:
        return ""
    if len(text) <= 120 and "\n" not in text:
        return h.e(text)
    return f"<pre>{h.e(cut(text, RUN_ERROR_SHOWN))}</pre>"


def job_runs(shown: JobShown) -> str:
    """Its attempts, newest first: start, run time, outcome, error and
    what its handler logged."""
    runs = shown.job.get("runs") or []
    if not runs:
        return ""
    now, payload = shown.request.now_ms, shown.job["payload"]
    columns: list[Column[dict[str, Any]]] = [
        Column("Attempt", lambda r: h.e(r.get("attempt")), "num", row_header=True),
        Column("Started", lambda r: h.when(r.get("started_at"), now)),
        Column("Ran", lambda r: f"{h.e(r.get('duration_ms'))} ms", "num"),
        Column("Outcome", lambda r: h.e(r.get("outcome"))),
        Column("Error", lambda r: _run_error(r.get("error"), payload)),
        Column(
            "Log",
            lambda r: _log_lines(r["logs"], payload) if r.get("logs") else "",
        ),
    ]
    return "<h2>Attempts</h2>" + table("Attempts", columns, list(reversed(runs)))


def job_workflow(shown: JobShown) -> str:
    """The job's dependencies (`after`) and dependents, each linked."""
    after, links = shown.job["after"], shown.links
    if not after and not links.dependents:
        return ""
    parts = ["<h2>Workflow</h2>"]
    if after:
        done = sum(links.states.get(i) == "completed" for i in after)
        parts.append(
            f"<h3>Waits for {len(after)} job{'s' if len(after) != 1 else ''} "
            f'<span class="muted">({done} completed)</span></h3>'
            + linked(after, links.states, "Dependencies")
        )
    if links.dependents:
        more = (
            f'<p class="muted">Only the first {len(links.dependents)} are listed.</p>'
            if links.more_dependents
            else ""
        )
        parts.append(
            "<h3>Waited for by</h3>" + linked(links.dependents, links.states, "Dependents") + more
        )
    return "".join(parts)


def job_payload(shown: JobShown) -> str:
    # A failed job's stored text is decoded as the API does; text that is
    # not JSON comes as a string, shown quoted as what it is.
    return f"<h2>Payload</h2><pre>{h.e(pretty(mask(shown.job['payload'])))}</pre>"


JOB = (
    job_heading,
    live(
        "job",
        (
            job_props,
            job_actions,
            job_progress,
            job_result,
            job_error,
            job_runs,
            job_workflow,
            job_payload,
        ),
    ),
)


# -- a batch ----------------------------------------------------------------------


@dataclass
class BatchShown:
    """What a batch's page shows (Pages.batch_page reads it)."""

    request: Request
    id: str
    found: BatchPage
    """The batch, a page of its jobs, its callbacks, and their states."""


BATCH_GONE = (
    "<strong>There is no such batch:</strong> it never existed, or it finished longer "
    "ago than completed jobs are kept (D1QUEUE_KEEP_COMPLETED_S) and was pruned."
)
"""Why a batch's page finds no batch."""


def batch_heading(shown: BatchShown) -> str:
    return crumbs([("/ui", "Overview")], f"Batch {shown.id}") + f"<h1>Batch {h.e(shown.id)}</h1>"


def batch_summary(shown: BatchShown) -> str:
    """The batch's counters, a progress bar, and its times."""
    b, now = shown.found.batch, shown.request.now_ms
    done = b.completed + b.failed
    counts = stats(
        [
            (b.total, "total"),
            (b.pending, "pending"),
            (b.completed, "completed"),
            (b.failed, "failed"),
            (badge(b.state), "state"),
        ]
    )
    # A bar split by outcome, not one `done` fill: a batch with a failure
    # must not read as all done well. Each part has its pattern and its
    # count in words; the progressbar's value is the share ended.
    said = f"{done} of {b.total} ended ({b.completed} completed, {b.failed} failed)"
    bar = share_bar("batch-bar", [("completed", b.completed), ("failed", b.failed)], b.total)
    return (
        f'{counts}<div class="progress"><p id="batch-progress-l">{h.e(said)}</p>'
        f'<div id="batch-progress" role="progressbar" aria-labelledby="batch-progress-l" '
        f'aria-valuemin="0" aria-valuemax="{max(b.total, 1)}" aria-valuenow="{done}" '
        f'aria-valuetext="{h.e(said)}">{bar}</div></div>'
        + props([("Created", h.when(b.created_at, now)), ("Finished", h.when(b.finished_at, now))])
    )


def batch_callbacks(shown: BatchShown) -> str:
    """Each callback with its state, or why it was not enqueued."""
    found = shown.found
    if not found.callbacks:
        listed = '<p class="muted">None: the batch was pushed without callbacks.</p>'
        return f'<h2 id="callbacks-h">Callbacks</h2>{listed}'
    # A callback not enqueued while the batch runs may still be; once it
    # finished, its condition did not hold (on_success after a failure,
    # on_failure when none failed).
    not_yet = (
        "not enqueued yet"
        if found.batch.state == "running"
        else "not enqueued: its case did not occur"
    )
    items = "".join(
        f"<li>{h.e(kind)}: {job_link(cid)} "
        + (
            badge(found.states[cid])
            if cid in found.states
            else GONE
            if fired
            else f'<span class="muted">{h.e(not_yet)}</span>'
        )
        + "</li>"
        for kind, cid, fired in found.callbacks
    )
    return (
        f'<h2 id="callbacks-h">Callbacks</h2><ul class="links" aria-label="Callbacks">{items}</ul>'
    )


def _batch_pager(shown: BatchShown) -> str:
    found = shown.found
    base = f"/ui/batches/{h.q(shown.id)}"
    links = []
    if found.page > 1:
        links.append(f'<a href="{h.e(base + h.qs({"page": found.page - 1}))}">« Previous</a>')
    if found.page < found.pages:
        links.append(f'<a href="{h.e(base + h.qs({"page": found.page + 1}))}">Next page »</a>')
    return nav(links)


def batch_jobs(shown: BatchShown) -> str:
    """A page of the batch's jobs, each with its state."""
    found = shown.found
    first, total = (found.page - 1) * BATCH_PAGE + 1, len(found.batch.ids)
    which = (
        f'<p class="muted">Jobs {first} to {first + len(found.ids) - 1} of {total}.</p>'
        if found.pages > 1
        else ""
    )
    listed = (
        linked(found.ids, found.states, "Jobs of the batch")
        if found.ids
        else '<p class="muted">No jobs.</p>'
    )
    return f'<h2 id="batch-jobs-h">Jobs</h2>{which}{listed}{_batch_pager(shown)}'


BATCH = (batch_heading, live("batch", (batch_summary, batch_callbacks, batch_jobs)))
