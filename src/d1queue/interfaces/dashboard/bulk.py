"""Bulk actions on the jobs a filter matches, or on a selection, and the
audit log of them (store/bulk.py does them).

- The search results, and the failed, queue and completed lists, carry a
  form posting to /ui/bulk: an action and its scope (`do`: `retry:all`,
  `cancel:selected`...), the filter as a search (`q`, search.py's words:
  `state:` says which jobs) and, for a selection, the ids.
- Without `confirm=yes` the answer is a confirmation stating the count
  ("Retry 1,234 failed jobs matching name:mail.send?"): counted by a read
  of at most bounds.BULK_COUNT_ROWS jobs a shard, "at least" past it. It
  carries the run's id, made here, so a confirmation sent twice is one run.
- Confirmed, the run's record is written (who, what, when, the filter, the
  count) and its first step taken; each step acts on at most a page of jobs
  (dashboard.PAGE) and its answer carries the next step's form ("Continue",
  sent by the page's script while the tab is visible) until the run is
  done, saying how many were done in total.
- /ui/audit lists the records, newest first, a page at a time.

Read-only sessions see no form (and auth.py refuses their POSTs with 403).
"""

from __future__ import annotations

import logging
import re

from ...core.bounds import BULK_COUNT_ROWS, SEARCH_ROWS, STORED_ID_PATTERN
from ...core.log import event, get
from ...store.bulk import ACTIONS, RUN_ID, Bulk, Count, Run, new_run_id
from ...store.dashboard import PAGE, SearchFilters, Store
from ..router import Reply
from . import html as h
from .auth import safe_back
from .failed import FailedShown
from .parts import Column, crumbs, empty, nav, page, table
from .queues import CompletedShown, QueueShown
from .request import Refused, Request, csrf_field, known
from .search import BULK_FORM, MAX_QUERY, SearchShown, parse

log = get(__name__)

VERBS = {
    ("live", "cancel"): ("Cancel", "cancelled"),
    ("live", "run"): ("Run now", "made due now"),
    ("failed", "retry"): ("Retry", "retried"),
    ("failed", "delete"): ("Delete", "deleted"),
    ("completed", "retry"): ("Push again", "pushed again"),
    ("completed", "delete"): ("Delete", "deleted"),
}
"""Each (kind of job, action): its verb, and what was done to a job."""

KINDS = {"live": "queued", "failed": "failed", "completed": "completed"}

HOW = {
    ("live", "cancel"): "Each is removed from its queue, counted as cancelled; a job a worker "
    "holds now, or that waits out a retry, is left as it is.",
    ("live", "run"): "Each delayed job is made due now; a job a worker holds is left as it is.",
    ("failed", "retry"): "Each goes back on its queue, with its registered attempts afresh.",
    ("failed", "delete"): "Each is removed for good. This cannot be undone.",
    ("completed", "retry"): "Each is pushed again as a fresh job of its id, queue, name and "
    "payload, outside any workflow; its completion stays in the history.",
    ("completed", "delete"): "Each is removed from the history for good.",
}

WHO = {"full": "full session (D1QUEUE_TOKEN)"}
"""How a record's `who` (the session's role) is shown."""


def jobs(n: int, kind: str) -> str:
    return f"{n:,} {kind} job{'s' if n != 1 else ''}"


def shown_filter(q: str) -> str:
    """A run's filter as the user reads it: the `state:failed` or
    `state:completed` word is said by the kind of job."""
    words = [w for w in q.split() if w.lower() not in ("state:failed", "state:completed")]
    return " ".join(words)


def _what(source: str, action: str, filter: str, n: int | None, selected: bool) -> str:
    """ "Retry 1,234 failed jobs matching name:mail.send" (escaped)."""
    verb, _ = VERBS[source, action]
    kind = KINDS[source]
    if selected:
        return h.e(f"{verb} the {jobs(n or 0, kind)} selected")
    count = jobs(n or 0, kind)
    words = shown_filter(filter)
    which = f"matching {words}" if words else "(every one)"
    return h.e(f"{verb} {count} {which}")


def bulk_form(request: Request, q: str) -> str:
    """The buttons acting on the jobs ticked in the results (each check box
    belongs to the form around them) or on every job `q` matches. Nothing
    for a read-only session, or for a search that cannot be answered."""
    query = parse(q)
    if request.readonly or query.problem:
        return ""
    buttons = []
    for action in ACTIONS[query.source]:
        verb, _ = VERBS[query.source, action]
        cls = ' class="danger"' if action in ("cancel", "delete") else ""
        buttons.append(
            f'<button type="submit" name="do" value="{action}:selected"{cls} '
            f"data-needs-selection>{h.e(verb)} selected</button>"
            f'<button type="submit" name="do" value="{action}:all"{cls}>'
            f"{h.e(verb)} all matching…</button>"
        )
    return (
        '<div class="actions"><span data-selected-count class="muted"></span>'
        f'{"".join(buttons)}<span class="muted">(you will be asked to confirm, with the '
        "count)</span></div>"
    )


def progress(request: Request, run: Run, back: str) -> str:
    """A run as it stands: done so far, or done in total; the next step's form."""
    verb, did = VERBS[run.source, run.action]
    stated = f"at least {run.matched:,}" if run.capped else f"{run.matched:,}"
    kind = KINDS[run.source]
    what = (
        f"the {len(run.selected)} selected {kind} jobs"
        if run.selected is not None
        else f"the {kind} jobs matching “{shown_filter(run.filter) or 'everything'}”"
    )
    head = crumbs([("/ui", "Overview"), ("/ui/audit", "Audit")], f"{verb} run") + (
        f"<h1>{h.e(verb)}: {h.e(what)}</h1>"
    )
    if run.finished:
        return head + (
            f'<p class="notice" role="status" id="bulk-done">Done: {h.e(jobs(run.done, kind))} '
            f"{h.e(did)} in total, in {run.step} step{'s' if run.step != 1 else ''} "
            f"(its confirmation counted {h.e(stated)}).</p>"
            f'<p><a href="{h.e(back)}">Back</a> · <a href="/ui/audit">Audit log</a></p>'
        )
    return head + (
        f'<p class="notice" role="status" id="bulk-working">Working: {h.e(jobs(run.done, kind))} '
        f"{h.e(did)} so far, in {run.step} step{'s' if run.step != 1 else ''} of at most "
        f"{PAGE} jobs (its confirmation counted {h.e(stated)}). The next step follows by "
        "itself while this tab is visible; a run stopped here goes on from the Audit page.</p>"
        f'<form method="post" action="/ui/bulk/step" data-continue>{csrf_field(request)}'
        f"{h.hidden('run', run.id)}{h.hidden('step', run.step + 1)}{h.hidden('back', back)}"
        '<div class="actions"><button type="submit" class="primary">Continue</button>'
        f'<a class="button" href="{h.e(back)}">Stop here</a></div></form>'
    )


def _audit_columns(now: int) -> list[Column[Run]]:
    return [
        Column("When", lambda r: h.when(r.at, now)),
        Column("Who", lambda r: h.e(WHO.get(r.who, r.who))),
        Column("Action", lambda r: h.e(VERBS.get((r.source, r.action), (r.action, ""))[0])),
        Column("Jobs", lambda r: h.e(KINDS.get(r.source, r.source))),
        Column(
            "Filter",
            lambda r: (
                f"{len(r.selected)} selected"
                if r.selected is not None
                else f"<code>{h.e(r.filter)}</code>"
            ),
        ),
        Column(
            "Counted",
            lambda r: f"{'≥ ' if r.capped else ''}{r.matched:,}",
            "num",
        ),
        Column("Done", lambda r: f"{r.done:,}", "num"),
        Column("State", lambda r: "finished" if r.finished else f"stopped after step {r.step}"),
        Column("Last step", lambda r: h.when(r.updated_at, now), "hide-narrow"),
    ]


class BulkPages:
    """The bulk actions' pages over the dashboard's Store."""

    def __init__(self, store: Store) -> None:
        self.bulk = Bulk(store)

    def _query(self, q: str) -> tuple[str, str, SearchFilters]:
        q = " ".join(q.split())
        if len(q) > MAX_QUERY:
            raise Refused(400, f"A filter is at most {MAX_QUERY} characters.")
        query = parse(q)
        if query.problem:
            raise Refused(400, query.problem)
        return q, query.source, query.filters()

    async def confirm(self, request: Request) -> Reply:
        """POST /ui/bulk: the confirmation (the count), or, confirmed, the
        run's record and its first step."""
        q, source, _ = self._query(request.field("q"))
        action, _, scope = request.field("do").partition(":")
        if action not in ACTIONS[source]:
            raise Refused(400, f"On {KINDS[source]} jobs: {' or '.join(ACTIONS[source])}.")
        if scope not in ("all", "selected"):
            raise Refused(400, "Act on all matching, or on those selected.")
        selected: list[str] | None = None
        if scope == "selected":
            selected = list(dict.fromkeys(request.form.get("ids", [])))
            if not selected:
                raise Refused(400, "Select at least one job first.")
            if len(selected) > PAGE:
                raise Refused(400, f"At most {PAGE} selected jobs at once (one page).")
            for id in selected:
                if not STORED_ID_PATTERN.fullmatch(id):
                    raise Refused(400, f"{id!r} is not a job id")
        back = safe_back(request.field("back"), "/ui/search" + h.qs({"q": q}), "back")
        if request.field("confirm") != "yes":
            return await self._confirmation(request, q, source, action, scope, selected, back)
        run_id = request.field("run")
        if not RUN_ID.fullmatch(run_id):
            raise Refused(400, "The confirmation's run id is missing or malformed.")
        matched, capped = request.field("matched"), request.field("capped")
        if not re.fullmatch(r"[0-9]{1,12}", matched) or capped not in ("0", "1"):
            raise Refused(400, "The confirmation's count is missing or malformed.")
        count = Count(int(matched), 0, capped == "1")
        run = await self._start(request, run_id, action, source, q, selected, count)
        return await self._step(request, run, 1, back)

    async def selection(
        self, request: Request, run_id: str, action: str, source: str, ids: list[str]
    ) -> int:
        """A run on `ids` (at most a page), done to the end: a step a shard
        holding some of them. Its record says how many it did in total."""
        run = await self._start(request, run_id, action, source, "", ids, Count(len(ids), 0, False))
        steps = 0
        while not run.finished and steps <= len(self.bulk.store.stores):
            steps += 1
            run = await self.bulk.step(run, run.step + 1, SearchFilters(), request.now_ms)
        return run.done

    async def _start(
        self,
        request: Request,
        run_id: str,
        action: str,
        source: str,
        q: str,
        selected: list[str] | None,
        count: Count,
    ) -> Run:
        assert request.session is not None
        run = await self.bulk.start(
            run_id,
            who="readonly" if request.session.readonly else "full",
            action=action,
            source=source,
            filter="" if selected is not None else q,
            selected=selected,
            count=count,
            now=request.now_ms,
        )
        event(
            log,
            "d1queue.dashboard.bulk",
            logging.INFO,
            run=run.id,
            action=run.action,
            source=run.source,
            filter=run.filter,
            selected=len(run.selected or ()),
            matched=run.matched,
        )
        return run

    async def _confirmation(
        self,
        request: Request,
        q: str,
        source: str,
        action: str,
        scope: str,
        selected: list[str] | None,
        back: str,
    ) -> Reply:
        if selected is not None:
            count = Count(len(selected), len(selected), False)
        else:
            _, _, filters = self._query(q)
            count = await self.bulk.count(source, filters)
        n = count.matched
        if n == 0 and not count.capped:
            words = shown_filter(q) or "everything"
            body = "<h1>Nothing to do</h1>" + empty(
                f"<strong>No {h.e(KINDS[source])} job matches “{h.e(words)}”.</strong> "
                f'<a href="{h.e(back)}">Go back</a>.'
            )
            return page(request, "Nothing to do", body)
        what = _what(source, action, q, n, selected is not None)
        floor = (
            f'<p class="notice" role="status">Counted in the newest {BULK_COUNT_ROWS:,} jobs read '
            "on each database: more may match further on; the action goes on to the end.</p>"
            if count.capped
            else ""
        )
        question = (
            f"{what}?"
            if not count.capped
            else what.replace(
                h.e(jobs(n, KINDS[source])), h.e(f"at least {jobs(n, KINDS[source])}"), 1
            )
            + "?"
        )
        fields = (
            h.hidden("q", q)
            + h.hidden("do", f"{action}:{scope}")
            + "".join(h.hidden("ids", i) for i in selected or ())
            + h.hidden("run", new_run_id())
            + h.hidden("matched", n)
            + h.hidden("capped", int(count.capped))
        )
        verb, _ = VERBS[source, action]
        cls = "danger" if action in ("cancel", "delete") else "primary"
        listing = ""
        if selected:
            items = "".join(f'<li class="mono">{h.e(i)}</li>' for i in selected[:10])
            more = f"<li>and {len(selected) - 10} more</li>" if len(selected) > 10 else ""
            listing = f"<ul>{items}{more}</ul>"
        steps = (
            ""
            if selected is not None
            else f'<p class="muted">It acts {PAGE} jobs a step (each step reads at most '
            f"{SEARCH_ROWS:,} jobs a database), one step after another, and says how many it "
            "did in total; it is written to the audit log.</p>"
        )
        body = (
            f'<h1>Confirm</h1><p id="bulk-question">{question}</p>{floor}'
            f"<p>{h.e(HOW[source, action])}</p>{listing}{steps}"
            f'<form method="post" action="/ui/bulk">{csrf_field(request)}{fields}'
            f"{h.hidden('back', back)}{h.hidden('confirm', 'yes')}"
            f'<div class="actions"><button type="submit" class="{cls}" autofocus>'
            f"{h.e(verb)} {n:,}{'+' if count.capped else ''} job{'s' if n != 1 else ''}</button>"
            f'<a class="button" href="{h.e(back)}">Go back</a></div></form>'
        )
        return page(request, "Confirm", body)

    async def step(self, request: Request) -> Reply:
        """POST /ui/bulk/step: the run's next step (or, sent again, the run
        as that step left it)."""
        run_id, step = request.field("run"), request.field("step")
        if not RUN_ID.fullmatch(run_id):
            raise Refused(400, "run is a bulk action's id.")
        if not re.fullmatch(r"[1-9][0-9]{0,6}", step):
            raise Refused(400, "step is a number from 1.")
        back = safe_back(request.field("back"), "/ui/audit", "back")
        run = await self.bulk.get(run_id)
        if run is None:
            raise Refused(404, "There is no such bulk action (its record may have been pruned).")
        if int(step) > run.step + 1:
            raise Refused(400, f"This run took {run.step} step(s); the next is {run.step + 1}.")
        return await self._step(request, run, int(step), back)

    async def _step(self, request: Request, run: Run, n: int, back: str) -> Reply:
        filters = SearchFilters() if run.selected is not None else parse(run.filter).filters()
        run = await self.bulk.step(run, n, filters, request.now_ms)
        return page(request, "Bulk action", progress(request, run, back))

    async def audit(self, request: Request) -> Reply:
        """GET /ui/audit: the records, newest first (one query, a page)."""
        known(request, "cursor")
        cursor = request.param("cursor")
        try:
            runs, nxt = await self.bulk.audit(cursor or None)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        links = []
        if cursor:
            links.append('<a href="/ui/audit">« Newest</a>')
        if nxt:
            links.append(f'<a href="{h.e("/ui/audit" + h.qs({"cursor": nxt}))}">Older »</a>')
        listing = (
            _table(request, runs)
            if runs
            else empty("<strong>No bulk action yet.</strong> Each one is written here.")
        )
        body = (
            crumbs([("/ui", "Overview")], "Audit")
            + '<h1>Audit log</h1><p class="muted">Every bulk action: who, what, when, the '
            "filter, the count its confirmation stated and how many it did.</p>"
            + f'<section id="audit" aria-label="Bulk actions">{listing}{nav(links)}</section>'
        )
        return page(request, "Audit", body, current="/ui/audit")


def _carry_on(request: Request, run: Run) -> str:
    """An unfinished run's button sending its next step."""
    if run.finished or request.readonly:
        return ""
    return (
        f'<form method="post" action="/ui/bulk/step" class="inline">{csrf_field(request)}'
        f"{h.hidden('run', run.id)}{h.hidden('step', run.step + 1)}"
        f'{h.hidden("back", "/ui/audit")}<button type="submit">Continue</button></form>'
    )


def _table(request: Request, runs: list[Run]) -> str:
    columns = _audit_columns(request.now_ms)
    if not request.readonly:
        columns.append(Column("", lambda r: _carry_on(request, r)))
    return table("Bulk actions", columns, runs)


# -- the forms on other pages (pages.py adds them to their sections) ------------


def search_bulk(shown: SearchShown) -> str:
    """The search results' bulk actions: on the jobs ticked (the results'
    check boxes belong to this form), or on every job the search matches."""
    found = shown.found
    if shown.request.readonly or found is None or not found.rows or shown.query.problem:
        return ""
    back = "/ui/search" + h.qs({"q": shown.q, "cursor": shown.cursor})
    return (
        f'<section aria-label="Act on jobs found"><form method="post" action="/ui/bulk" '
        f'id="{BULK_FORM}">{csrf_field(shown.request)}{h.hidden("q", shown.q)}'
        f"{h.hidden('back', back)}{bulk_form(shown.request, shown.q)}"
        "</form></section>"
    )


def _q(**words: str) -> str:
    """A search's words of list filters (each `key:value`; `text` bare)."""
    text = words.pop("text", "")
    return " ".join([*(f"{k}:{v}" for k, v in words.items() if v), *text.split()])


def _to_search(q: str, what: str) -> str:
    """A list's link to the same filter as a search, where its bulk
    actions are (on every job matching, or on those ticked)."""
    href = h.e("/ui/search" + h.qs({"q": q}))
    return (
        f'<p class="bulk-link"><a href="{href}">Bulk actions on every {h.e(what)} matching this '
        f'filter</a> <span class="muted">(as the search <code>{h.e(q)}</code>: the count '
        "first, then confirm)</span></p>"
    )


def failed_bulk(shown: FailedShown) -> str:
    """The failed list's filter as a search (the age filter has no search
    word: then it says so)."""
    if shown.request.readonly or not shown.jobs.rows:
        return ""
    if shown.age:
        return (
            '<p class="muted">To act on every failed job matching a filter, clear the age '
            "filter (a search has no age).</p>"
        )
    q = _q(state="failed", queue=shown.queue, name=shown.name, text=shown.error)
    return _to_search(q, "failed job")


def queue_bulk(shown: QueueShown) -> str:
    if shown.request.readonly or not shown.jobs.rows:
        return ""
    return _to_search(_q(queue=shown.queue, name=shown.name, state=shown.state), "queued job")


def completed_bulk(shown: CompletedShown) -> str:
    if shown.request.readonly or not shown.jobs.rows:
        return ""
    return _to_search(_q(queue=shown.queue, state="completed"), "completed job")
