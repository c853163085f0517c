"""The search box every signed-in page carries (html.frame), and what a
search is (/ui/search?q=...).

A search reads at most two rows by primary key, or nothing; it never scans:

- one word of an id's shape: the job with that id (its page), else the
  batch (its page): a point read each, in that order;
- qualifiers, `queue:`, `name:`, `state:`, `batch:`, `error:`, lead to the
  paged, indexed view that answers them, with the filter in its URL: a
  queue's jobs (by state and name), the failed jobs (by queue, name and
  error text), a batch, a job name's metrics (its queues and their jobs);
- anything else: the views it may mean, as links (no read).

Searching payload text is not offered: no index answers it, and a bounded
scan would say little at 100,000 jobs."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.bounds import STORED_ID_PATTERN, is_stored_name
from ...store.dashboard import STATES
from . import html as h
from .html import search_form
from .parts import crumbs, empty

QUALIFIERS = ("queue", "name", "state", "batch", "error")
"""The `key:value` words a search understands."""


@dataclass
class Query:
    """A search's words: its qualifiers, and the rest as text."""

    fields: dict[str, str]
    text: str
    problem: str = ""
    """Why the query cannot be answered as written (shown, escaped)."""


def parse(q: str) -> Query:
    fields: dict[str, str] = {}
    rest: list[str] = []
    problem = ""
    for word in q.split():
        key, sep, value = word.partition(":")
        if sep and key.lower() in QUALIFIERS:
            fields[key.lower()] = value
        else:
            rest.append(word)
    for key in ("queue", "name", "batch"):
        if key in fields and not (
            is_stored_name(fields[key]) or STORED_ID_PATTERN.fullmatch(fields[key])
        ):
            problem = f"{key}:{fields[key]} is not a {key} this deployment could hold."
    if "state" in fields and fields["state"] not in (*STATES, "failed"):
        problem = f"state is one of {', '.join((*STATES, 'failed'))}."
    return Query(fields, " ".join(rest), problem)


def target(query: Query) -> str | None:
    """The view that answers qualifiers alone, or None."""
    f, text = query.fields, query.text
    if query.problem or not f:
        return None
    if "batch" in f:
        return f"/ui/batches/{h.q(f['batch'])}"
    error = f.get("error", "") or text
    if f.get("state") == "failed" or "error" in f:
        return "/ui/failed" + h.qs(
            {"queue": f.get("queue", ""), "name": f.get("name", ""), "error": error}
        )
    if "queue" in f and not text:
        params = {"state": f.get("state", ""), "name": f.get("name", "")}
        return f"/ui/queues/{h.q(f['queue'])}" + h.qs(params)
    if "name" in f and not text and "state" not in f:
        return "/ui/metrics" + h.qs({"name": f["name"]})
    return None


HELP = (
    "<p class=\"muted\">A job's or batch's id jumps to its page. Or qualifiers: "
    "<code>queue:mail</code>, <code>queue:mail state:delayed name:mail.send</code>, "
    "<code>state:failed error:timeout</code>, <code>name:mail.send</code> (its queues, "
    "charts and jobs), <code>batch:&lt;id&gt;</code>. Payload text is not searched.</p>"
)


def results(q: str, query: Query) -> str:
    """The page of a search no single view answers: what it may mean, as links."""
    head = crumbs([("/ui", "Overview")], "Search") + "<h1>Search</h1>" + search_form(q, "page")
    if not q:
        return head + HELP
    if query.problem:
        return head + f'<p class="error-box" role="alert">{h.e(query.problem)}</p>' + HELP
    word = query.text
    options = []
    if word and is_stored_name(word):
        options += [
            f'<li><a href="/ui/queues/{h.q(word)}">The queue {h.e(word)}</a></li>',
            f'<li><a href="{h.e("/ui/metrics" + h.qs({"name": word}))}">The job name '
            f"{h.e(word)}: its queues, charts and jobs</a></li>",
        ]
    if word and len(word) <= 200:
        options.append(
            f'<li><a href="{h.e("/ui/failed" + h.qs({"error": word}))}">Failed jobs whose '
            f"error contains “{h.e(word)}”</a></li>"
        )
    listed = f'<ul class="links">{"".join(options)}</ul>' if options else ""
    return head + empty(
        f"<strong>No job or batch has the id “{h.e(q)}”.</strong> It may mean:", listed + HELP
    )
