"""The dashboard at /ui: pages, sign-in, and the actions behind its forms.

Plain Python like api.py: method, URL, headers and body in; status, headers
and an HTML (or asset) body out. entry.py routes /ui and /ui/* here.

Security, in one place:
- Every page and action but the sign-in page and the static assets needs a
  valid session (session.py): signed, unexpired and not signed out (one
  point read of D1 a request carrying one); without one a page redirects to
  sign-in and an action is refused (401). The assets hold no data.
- Every POST but sign-in carries the session's CSRF token in a hidden field,
  checked in constant time (403 without it); every POST, sign-in included,
  is refused when the browser says it came from another origin (Origin,
  Sec-Fetch-Site), which also covers sign-in CSRF.
- Content-Security-Policy allows scripts, styles and fetches from this
  origin only: no inline script or style, no framing, forms post here only.
- Pages are `no-store`: signing out leaves nothing readable in the cache.
- Where a form or a link says to go next (`next`, `back`): a dashboard path
  on this origin, and no control character (a CR or LF would split the
  Location header; none belongs in a path): refused with a 400.
- Payloads are shown with their secrets masked (mask.py).
Input is checked before anything is written; a bad value is a 400 page that
says what was wrong.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote, unquote, urlparse

from .. import stats as counters
from ..bounds import ID_PATTERN, NAME_RULE, is_name
from ..guard import RETRY_AFTER_S, Guard
from ..service import ApiError, Service
from . import html as h
from .assets import ASSETS
from .mask import mask, scrub
from .session import Session, Sessions, cookie_name, is_local, read_cookies, set_cookie
from .store import PAGE, STATES, Store

log = logging.getLogger(__name__)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
}
MAX_FORM_BYTES = 64 * 1024
"""A dashboard form: 50 ids and a few fields fit in a few KB."""

AGES: dict[str, tuple[str, int | None, int | None]] = {
    "": ("Any age", None, None),
    "1h": ("Failed in the last hour", 3600, None),
    "1d": ("Failed in the last day", 86400, None),
    "7d": ("Failed in the last 7 days", 7 * 86400, None),
    "gt1d": ("Failed more than a day ago", None, 86400),
    "gt7d": ("Failed more than 7 days ago", None, 7 * 86400),
}
"""The failed list's age filter: (label, newer than s, older than s)."""

SCHEDULES_PAGE = 50
"""Schedules listed a page."""

NOTICES = {
    "signed_in": "Signed in.",
    "paused": "Queue paused: its jobs wait until it is resumed.",
    "resumed": "Queue running again: the next cron run drains it.",
    "schedule_paused": "Schedule paused: it enqueues nothing until resumed.",
    "schedule_resumed": "Schedule running again, from its next slot.",
    "cancelled": "Job cancelled.",
    "run_now": "Job made due now: the next drain runs it.",
    "already_ready": "The job was already due; nothing changed.",
    "retried": "{n} failed job(s) put back on their queues.",
    "removed": "{n} failed job(s) removed for good.",
}
"""The messages an action's redirect may ask a page to show (`?notice=`):
fixed texts, so nothing from the URL is shown as a message."""


class Refused(Exception):
    """A request the dashboard answers with an error page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Reply:
    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes
    secure: bool
    now_ms: int
    session: Session | None = None
    form: dict[str, list[str]] = field(default_factory=dict)

    def param(self, name: str) -> str:
        values = self.query.get(name)
        return values[-1] if values else ""

    def field(self, name: str) -> str:
        values = self.form.get(name)
        return values[-1] if values else ""


def _redirect(location: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(303, "", {"location": location, **(headers or {})})


CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Control characters: C0 (CR and LF among them), DEL and C1. None belongs
in a path, and in a Location header CR or LF would end the header (the
Workers runtime refuses such a header outright: a 500)."""

_NOT_ASCII = re.compile("[^\x00-\x7f]+")


def _safe_back(path: str, default: str, name: str) -> str:
    """Where an action or sign-in returns to (form field or parameter
    `name`): a dashboard path on this origin only (no scheme, no host, no
    `//`), else `default`, so it is never an open redirect. A control
    character anywhere is refused (400). Other characters past ASCII are
    percent-encoded, as a browser sends them: a header carries bytes."""
    bad = CONTROL.search(path)
    if bad is not None:
        raise Refused(
            400,
            f"{name} holds a control character (U+{ord(bad.group()):04X}); "
            "a dashboard address has none.",
        )
    if path.startswith("/ui") and "//" not in path and "\\" not in path:
        parsed = urlparse(path)
        if not parsed.scheme and not parsed.netloc:
            return _NOT_ASCII.sub(lambda m: quote(m.group(), safe=""), path)
    return default


def _with_notice(path: str, notice: str, n: int | None = None) -> str:
    parsed = urlparse(path)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items() if k not in ("notice", "n")}
    query["notice"] = notice
    if n is not None:
        query["n"] = str(n)
    return parsed.path + h.qs(query)


def _check_name(kind: str, value: str) -> str:
    if not is_name(value):
        raise Refused(400, f"{kind} names match {NAME_RULE}; {value!r} does not")
    return value


def _check_id(value: str) -> str:
    if not ID_PATTERN.fullmatch(value):
        raise Refused(400, f"{value!r} is not a job id")
    return value


Handler = Callable[..., Awaitable[Reply]]


class Dashboard:
    """`token` is the D1QUEUE_TOKEN secret (None: not configured, and every
    page says so). `schedules`: reserved for the recurring-schedules page."""

    def __init__(self, service: Service, token: str | None, guard: Guard | None = None) -> None:
        self.service = service
        self.guard = guard if guard is not None else Guard()
        """What a wrong sign-in costs its sender (guard.py)."""
        self.store = Store(service.queue, service.shards)
        self.sessions = Sessions(token) if token else None
        self.routes: list[tuple[str, str, Handler, bool]] = [
            # method, path pattern (segments; {x} matches one), handler, signed in
            ("GET", "/ui", self.overview, True),
            ("GET", "/ui/signin", self.signin_page, False),
            ("POST", "/ui/signin", self.signin, False),
            ("POST", "/ui/signout", self.signout, True),
            ("GET", "/ui/queues/{queue}", self.queue_page, True),
            ("POST", "/ui/queues/{queue}/pause", self.pause, True),
            ("POST", "/ui/queues/{queue}/resume", self.resume, True),
            ("GET", "/ui/jobs/{id}", self.job_page, True),
            ("POST", "/ui/jobs/{id}/cancel", self.cancel, True),
            ("POST", "/ui/jobs/{id}/run", self.run_now, True),
            ("GET", "/ui/failed", self.failed_page, True),
            ("POST", "/ui/failed/bulk", self.bulk, True),
            ("GET", "/ui/schedules", self.schedules_page, True),
            ("POST", "/ui/schedules/{id}/pause", self.pause_schedule, True),
            ("POST", "/ui/schedules/{id}/resume", self.resume_schedule, True),
        ]

    # -- dispatch ---------------------------------------------------------------

    async def handle(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes, now_ms: int
    ) -> Reply:
        parsed = urlparse(url)
        path = parsed.path.rstrip("/") or "/"
        if path in ASSETS and method in ("GET", "HEAD"):
            kind, text = ASSETS[path]
            return Reply(
                200,
                text,
                {
                    "content-type": kind,
                    "cache-control": "public, max-age=31536000, immutable",
                    **SECURITY_HEADERS,
                },
            )
        host = headers.get("host") or parsed.netloc
        request = Request(
            method=method,
            path=path,
            query=parse_qs(parsed.query, keep_blank_values=True),
            headers=headers,
            body=body,
            secure=not is_local(host),
            now_ms=now_ms,
        )
        try:
            reply = await self._route(request)
        except Refused as exc:
            reply = self._error_page(request, exc.status, exc.message)
        except ApiError as exc:
            reply = self._error_page(request, exc.status, exc.message)
        except Exception as exc:  # a bug or D1 failing: say so on a page
            log.exception("d1queue dashboard: %s %s failed", method, path)
            reply = self._error_page(request, 500, f"{type(exc).__name__}: {exc}")
        reply.headers.setdefault("content-type", "text/html; charset=utf-8")
        reply.headers.setdefault("cache-control", "no-store")
        for k, v in SECURITY_HEADERS.items():
            reply.headers.setdefault(k, v)
        return reply

    async def _route(self, request: Request) -> Reply:
        if self.sessions is None:
            raise Refused(
                503,
                "No API token is configured, so nobody can sign in: set the D1QUEUE_TOKEN "
                "secret (wrangler secret put D1QUEUE_TOKEN; .dev.vars locally).",
            )
        segments = request.path.split("/")
        allowed = []
        for method, pattern, handler, signed_in in self.routes:
            parts = pattern.split("/")
            if len(parts) != len(segments):
                continue
            args = []
            for want, got in zip(parts, segments, strict=True):
                if want.startswith("{"):
                    if not got:
                        break
                    args.append(_unquote(got))
                elif want != got:
                    break
            else:
                allowed.append(method)
                if request.method != method and not (request.method == "HEAD" and method == "GET"):
                    continue
                request.session = await self._session(request)
                if request.method == "POST":
                    self._check_post(request, signed_in)
                elif signed_in and request.session is None:
                    target = request.path + h.qs({k: v[-1] for k, v in request.query.items()})
                    return _redirect("/ui/signin" + h.qs({"next": target}))
                return await handler(request, *args)
        if allowed:
            raise Refused(405, f"{request.path} accepts {', '.join(sorted(set(allowed)))}")
        raise Refused(404, f"There is no page at {request.path}.")

    async def _session(self, request: Request) -> Session | None:
        """The request's session: a cookie value signed, unexpired, and not
        signed out. A copy of a cookie taken before its sign-out is still
        signed and unexpired; only D1 knows the session ended, so a request
        carrying a session pays one point read (store.signed_out). No
        session cookie, or only forged or expired ones: no read."""
        assert self.sessions is not None
        found = []
        for value in read_cookies(request.headers.get("cookie", ""), cookie_name(request.secure)):
            session = self.sessions.verify(value, request.now_ms)
            if session is not None:
                found.append(session)
        if not found:
            return None
        ended = await self.store.signed_out(list(dict.fromkeys(s.nonce for s in found)))
        return next((s for s in found if s.nonce not in ended), None)

    def _check_post(self, request: Request, signed_in: bool) -> None:
        """What every POST must pass before its form is read: from this
        origin, within size, a well-formed form; signed in and carrying the
        session's CSRF token, unless it is the sign-in itself."""
        assert self.sessions is not None
        site = request.headers.get("sec-fetch-site", "")
        if site and site not in ("same-origin", "none"):
            raise Refused(403, "This form was sent from another site; it was refused.")
        origin = request.headers.get("origin", "")
        host = request.headers.get("host", "")
        if origin and origin != "null" and urlparse(origin).netloc != host:
            raise Refused(403, "This form was sent from another origin; it was refused.")
        if len(request.body) > MAX_FORM_BYTES:
            raise Refused(413, f"The form is larger than {MAX_FORM_BYTES} bytes.")
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(400, "The form is not UTF-8.") from None
        request.form = parse_qs(text, keep_blank_values=True)
        if not signed_in:
            return
        if request.session is None:
            raise Refused(401, "You are signed out (or your session expired): sign in again.")
        if not self.sessions.check_csrf(request.session, request.field("csrf") or None):
            raise Refused(
                403,
                "This form is missing its security token (CSRF) or carries a wrong one, "
                "so nothing was changed. Reload the page and try again.",
            )

    def _page(self, request: Request, title: str, body: str, *, current: str = "") -> str:
        csrf = (
            self.sessions.csrf(request.session)
            if self.sessions is not None and request.session is not None
            else None
        )
        return h.frame(title, body, current=current, csrf=csrf)

    def _csrf(self, request: Request) -> str:
        assert self.sessions is not None and request.session is not None
        return h.hidden("csrf", self.sessions.csrf(request.session))

    def _error_page(self, request: Request, status: int, message: str) -> Reply:
        signed_in = request.session is not None
        back = (
            '<p><a href="/ui">Back to the overview</a></p>'
            if signed_in
            else '<p><a href="/ui/signin">Go to sign-in</a></p>'
        )
        body = (
            f'<h1>{e_status(status)}</h1><p class="error-box" role="alert">{h.e(message)}</p>{back}'
        )
        headers = {"www-authenticate": 'Cookie realm="d1queue"'} if status == 401 else {}
        return Reply(status, self._page(request, e_status(status), body), headers)

    def _notice(self, request: Request) -> str:
        code = request.param("notice")
        text = NOTICES.get(code)
        if text is None:
            return ""
        n = request.param("n")
        text = text.format(n=int(n) if n.isdigit() else "Some")
        return f'<p class="notice" role="status">{h.e(text)}</p>'

    def _known(self, request: Request, *names: str) -> None:
        """Refuse query parameters the page does not take: a mistyped filter
        must not silently show everything."""
        unknown = sorted(set(request.query) - {*names, "notice", "n"})
        if unknown:
            raise Refused(400, f"Unknown query parameter(s): {', '.join(unknown)}.")

    # -- sign-in ----------------------------------------------------------------

    def _signin_form(self, next_path: str, error: str = "") -> str:
        alert = f'<p class="error-box" role="alert">{h.e(error)}</p>' if error else ""
        return (
            '<div class="signin"><h1>d1queue dashboard</h1>'
            "<p>Enter this Worker's API token (the <code>D1QUEUE_TOKEN</code> secret; "
            "<code>.dev.vars</code> under <code>make dev</code>) to continue.</p>"
            f'{alert}<form method="post" action="/ui/signin">'
            '<div class="field"><label for="token">API token</label>'
            '<input type="password" id="token" name="token" autocomplete="current-password" '
            "required autofocus></div>"
            f"{h.hidden('next', next_path)}"
            '<button type="submit" class="primary">Sign in</button></form></div>'
        )

    async def signin_page(self, request: Request) -> Reply:
        self._known(request, "next")
        next_path = _safe_back(request.param("next"), "/ui", "next")
        if request.session is not None:
            return _redirect(next_path)
        return Reply(200, self._page(request, "Sign in", self._signin_form(next_path)))

    async def signin(self, request: Request) -> Reply:
        assert self.sessions is not None
        next_path = _safe_back(request.field("next"), "/ui", "next")
        if not self.sessions.check_token(request.field("token")):
            if await self.guard.failed(request.headers):
                form = self._signin_form(next_path, "Too many wrong tokens: wait a minute.")
                reply = Reply(429, self._page(request, "Sign in", form))
                reply.headers["retry-after"] = str(RETRY_AFTER_S)
                return reply
            form = self._signin_form(next_path, "That is not this Worker's API token.")
            return Reply(401, self._page(request, "Sign in", form))
        cookie = set_cookie(self.sessions.issue(request.now_ms), secure=request.secure)
        return _redirect(next_path, {"set-cookie": cookie})

    async def signout(self, request: Request) -> Reply:
        """End the session on the server (a copy of the cookie replayed later
        is refused), then clear the cookie in this browser. Should the write
        fail, the error page keeps the cookie, so signing out can be tried
        again (the write is safe to re-send)."""
        assert request.session is not None
        session = request.session
        await self.store.sign_out(session.nonce, session.expires_ms, request.now_ms)
        cookie = set_cookie("", secure=request.secure, max_age_s=0)
        return _redirect("/ui/signin", {"set-cookie": cookie})

    # -- overview ---------------------------------------------------------------

    async def overview(self, request: Request) -> Reply:
        self._known(request)
        now = request.now_ms
        queues = await self.service.admin.stats()
        chart, done = await self.store.counters(now)
        by_name = {s.queue: s for s in queues}
        names = sorted(set(by_name) | set(done))
        csrf = self._csrf(request)
        rows = []
        for name in names:
            s = by_name.get(name)
            d = done.get(name, counters.Done())
            paused = bool(s and s.paused)
            action = "resume" if paused else "pause"
            button = (
                f'<form method="post" action="/ui/queues/{h.q(name)}/{action}" class="inline">'
                f"{csrf}{h.hidden('back', '/ui')}"
                f'<button type="submit" title="{action.title()} queue {h.e(name)}">'
                f"{action.title()}</button></form>"
            )
            state = (
                '<span class="badge paused">Paused</span>'
                if paused
                else '<span class="badge running">Running</span>'
            )
            failed = s.failed if s else 0
            failed_link = (
                f'<a href="/ui/failed{h.qs({"queue": name})}">{failed}</a>' if failed else "0"
            )
            rows.append(
                "<tr>"
                f'<th scope="row"><a href="/ui/queues/{h.q(name)}">{h.e(name)}</a></th>'
                f'<td class="num">{s.ready if s else 0}</td>'
                f'<td class="num hide-narrow">{s.delayed if s else 0}</td>'
                f'<td class="num hide-narrow">{s.reserved if s else 0}</td>'
                f'<td class="num">{failed_link}</td>'
                f'<td class="hide-narrow">{h.age(s.oldest_ready_age_s if s else None)}</td>'
                f"<td>{state}</td>"
                f'<td class="num">{d.hour}</td><td class="num hide-narrow">{d.day}</td>'
                f"<td>{button}</td></tr>"
            )
        if rows:
            table = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Queues</caption>'
                '<thead><tr><th scope="col">Queue</th><th scope="col" class="num">Ready</th>'
                '<th scope="col" class="num hide-narrow">Delayed</th>'
                '<th scope="col" class="num hide-narrow">Reserved</th>'
                '<th scope="col" class="num">Failed</th>'
                '<th scope="col" class="hide-narrow">Oldest ready</th>'
                '<th scope="col">State</th><th scope="col" class="num">Done 1 h</th>'
                '<th scope="col" class="num hide-narrow">Done 24 h</th>'
                '<th scope="col">Action</th></tr>'
                f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
            )
        else:
            table = (
                '<div class="empty"><p><strong>No queues yet.</strong> A queue appears here '
                "when a job is pushed to it. Push one with the API, for example:</p>"
                '<pre>curl -H "Authorization: Bearer $TOKEN" '
                f"{h.e(_origin(request))}/v1/queues/default/jobs \\\n"
                '     -d \'{"name": "example.echo", "payload": {"hello": "world"}}\'</pre></div>'
            )
        body = (
            f"<h1>Overview</h1>{self._notice(request)}"
            f'<section id="queues" data-live aria-labelledby="queues-h">'
            f'<h2 id="queues-h">Queues</h2>{table}</section>'
            f'<section id="activity" data-live aria-labelledby="activity-h">'
            f'<h2 id="activity-h">Last hour</h2>{_chart(chart, now)}</section>'
        )
        return Reply(200, self._page(request, "Overview", body, current="/ui"))

    # -- a queue ----------------------------------------------------------------

    async def queue_page(self, request: Request, queue: str) -> Reply:
        _check_name("queue", queue)
        self._known(request, "state", "name", "cursor")
        state, name, cursor = request.param("state"), request.param("name"), request.param("cursor")
        if state and state not in STATES:
            raise Refused(400, f"state must be one of {', '.join(STATES)} (or empty for all).")
        if name:
            _check_name("job", name)
        (stats,) = await self.service.admin.stats(queue)
        try:
            page = await self.store.queue_jobs(queue, state=state, name=name, cursor=cursor or None)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        now = request.now_ms
        here = f"/ui/queues/{h.q(queue)}" + h.qs({"state": state, "name": name, "cursor": cursor})
        action = "resume" if stats.paused else "pause"
        control = (
            f'<form method="post" action="/ui/queues/{h.q(queue)}/{action}" class="inline">'
            f"{self._csrf(request)}{h.hidden('back', here)}"
            f'<button type="submit">{action.title()}</button></form>'
        )
        summary = (
            '<ul class="stats">'
            f'<li><span class="n">{stats.ready}</span>ready</li>'
            f'<li><span class="n">{stats.delayed}</span>delayed</li>'
            f'<li><span class="n">{stats.reserved}</span>reserved</li>'
            f'<li><span class="n"><a href="/ui/failed{h.qs({"queue": queue})}">{stats.failed}'
            "</a></span>failed</li>"
            f'<li><span class="n">{h.age(stats.oldest_ready_age_s)}</span>oldest ready</li>'
            f'<li><span class="n">{"Paused" if stats.paused else "Running"}</span>state</li></ul>'
        )
        filters = (
            f'<form method="get" action="/ui/queues/{h.q(queue)}" class="filters" '
            'role="search" aria-label="Filter jobs">'
            '<div><label for="f-state">State</label><select id="f-state" name="state">'
            + h.options([("", "All states"), *((s, s.title()) for s in STATES)], state)
            + "</select></div>"
            '<div><label for="f-name">Job name</label>'
            f'<input type="search" id="f-name" name="name" value="{h.e(name)}" '
            'placeholder="e.g. mail.send"></div>'
            '<div><button type="submit">Filter</button> '
            f'<a class="button" href="/ui/queues/{h.q(queue)}">Clear</a></div></form>'
        )
        rows = []
        for r in page.rows:
            rows.append(
                "<tr>"
                f'<td class="mono"><a href="/ui/jobs/{h.q(r["id"])}">{h.e(r["id"])}</a></td>'
                f"<td>{h.e(r['name'])}</td>"
                f'<td><span class="badge {h.e(r["state"])}">{h.e(r["state"])}</span></td>'
                f'<td class="num">{r["attempts"]} / {r["max_attempts"]}</td>'
                f'<td class="num hide-narrow">{r["priority"]}</td>'
                f"<td>{h.when(r['available_at'], now)}</td>"
                f'<td class="hide-narrow">{h.e(_short(scrub(r["last_error"], r["payload"])))}'
                "</td></tr>"
            )
        if rows:
            listing = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Jobs</caption>'
                '<thead><tr><th scope="col">Job id</th><th scope="col">Name</th>'
                '<th scope="col">State</th><th scope="col" class="num">Attempts</th>'
                '<th scope="col" class="num hide-narrow">Priority</th>'
                '<th scope="col">Available at</th><th scope="col" class="hide-narrow">'
                f"Last error</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
            )
        elif state or name or cursor:
            listing = (
                '<div class="empty"><p><strong>No jobs match this filter.</strong> '
                f'<a href="/ui/queues/{h.q(queue)}">Clear the filter</a> to see every job '
                "on the queue.</p></div>"
            )
        else:
            listing = (
                '<div class="empty"><p><strong>This queue holds no jobs.</strong> '
                "Jobs that completed are gone; failed ones are under "
                f'<a href="/ui/failed{h.qs({"queue": queue})}">Failed jobs</a>. '
                f"Push one with <code>POST /v1/queues/{h.e(queue)}/jobs</code>.</p></div>"
            )
        pager = _pager(
            f"/ui/queues/{h.q(queue)}",
            {"state": state, "name": name},
            cursor,
            page.next_cursor,
        )
        body = (
            f'<p><a href="/ui">Overview</a> › queue</p><h1>Queue {h.e(queue)}</h1>'
            f"{self._notice(request)}"
            f'<div id="queue-summary" data-live>{summary}'
            f'<div class="actions">{control}</div></div>'
            f'<h2 id="jobs-h">Jobs</h2>{filters}'
            f'<section id="jobs" data-live aria-labelledby="jobs-h">{listing}{pager}</section>'
        )
        return Reply(200, self._page(request, f"Queue {queue}", body))

    async def _set_paused(self, request: Request, queue: str, paused: bool) -> Reply:
        _check_name("queue", queue)
        back = _safe_back(request.field("back"), f"/ui/queues/{h.q(queue)}", "back")
        await self.service.set_paused(queue, paused)
        return _redirect(_with_notice(back, "paused" if paused else "resumed"))

    async def pause(self, request: Request, queue: str) -> Reply:
        return await self._set_paused(request, queue, True)

    async def resume(self, request: Request, queue: str) -> Reply:
        return await self._set_paused(request, queue, False)

    # -- a job ------------------------------------------------------------------

    async def job_page(self, request: Request, id: str) -> Reply:
        _check_id(id)
        self._known(request)
        try:
            job = await self.service.job(id)
        except ApiError as exc:
            if exc.status != 404:
                raise
            body = (
                f"<h1>Job {h.e(id)}</h1>"
                '<div class="empty"><p><strong>This job is not queued and not failed:</strong> '
                "it completed, was cancelled or removed, or never existed. "
                '<a href="/ui">Back to the overview</a>.</p></div>'
            )
            return Reply(404, self._page(request, "Job not found", body))
        now = request.now_ms
        failed = job["state"] == "failed"
        payload = job["payload"]
        if failed:  # the failed table keeps the stored JSON text
            with contextlib.suppress(ValueError):
                payload = json.loads(payload)
        payload = mask(payload)
        pretty = (
            json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True)
            if not isinstance(payload, str) or not failed
            else payload
        )
        props = [
            ("Id", f'<span class="mono">{h.e(job["id"])}</span>'),
            ("Queue", f'<a href="/ui/queues/{h.q(job["queue"])}">{h.e(job["queue"])}</a>'),
            ("Name", h.e(job["name"])),
            ("State", f'<span class="badge {h.e(job["state"])}">{h.e(job["state"])}</span>'),
            ("Attempts", f"{job['attempts']} of {job['max_attempts']}"),
            ("Priority", h.e(job["priority"])),
            ("Created", h.when(job.get("created_at"), now)),
        ]
        if failed:
            props.append(("Failed at", h.when(job.get("failed_at"), now)))
        else:
            props.append(("Available at", h.when(job.get("available_at"), now)))
            if job.get("reserved_until"):
                props.append(("Lease ends", h.when(job["reserved_until"], now)))
            if job.get("unique_key"):
                props.append(("Unique key", f'<span class="mono">{h.e(job["unique_key"])}</span>'))
        error = scrub(job.get("error") if failed else job.get("last_error"), job["payload"])
        csrf = self._csrf(request)
        here = f"/ui/jobs/{h.q(id)}"
        if failed:
            actions = (
                '<form method="post" action="/ui/failed/bulk" class="inline">'
                f"{csrf}{h.hidden('ids', id)}{h.hidden('action', 'retry')}"
                f"{h.hidden('back', '/ui/failed')}"
                '<button type="submit">Retry</button></form>'
                '<form method="post" action="/ui/failed/bulk" class="inline">'
                f"{csrf}{h.hidden('ids', id)}{h.hidden('action', 'delete')}"
                f"{h.hidden('back', '/ui/failed')}"
                '<button type="submit" class="danger">Delete</button></form>'
            )
        else:
            held = job["state"] == "reserved"
            waiting = job["state"] == "delayed"
            why = ' title="A worker is running it now"' if held else ""
            actions = (
                f'<form method="post" action="{here}/run" class="inline">{csrf}'
                f'<button type="submit"{" disabled" if not waiting else ""}'
                f"{why if held else ''}>Run now</button></form>"
                f'<form method="post" action="{here}/cancel" class="inline">{csrf}'
                f'<button type="submit" class="danger"{" disabled" if held else ""}{why}>'
                "Cancel job</button></form>"
            )
            if held:
                actions += '<span class="muted">A worker holds this job: wait for it.</span>'
            elif not waiting:
                actions += '<span class="muted">It is due: the next drain runs it.</span>'
        body = (
            f'<p><a href="/ui/queues/{h.q(job["queue"])}">Queue {h.e(job["queue"])}</a> › job</p>'
            f"<h1>Job {h.e(job['name'])}</h1>{self._notice(request)}"
            f'<div id="job" data-live><dl class="props">'
            + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in props)
            + f'</dl><div class="actions">{actions}</div>'
            f"<h2>{'Error' if failed else 'Last error'}</h2>"
            + (f"<pre>{h.e(error)}</pre>" if error else '<p class="muted">None.</p>')
            + f"<h2>Payload</h2><pre>{h.e(pretty)}</pre></div>"
        )
        return Reply(200, self._page(request, f"Job {id}", body))

    async def cancel(self, request: Request, id: str) -> Reply:
        _check_id(id)
        job = await self.service.job(id)  # 404 if gone
        await self.service.cancel(id)  # 409 if a worker holds it
        return _redirect(_with_notice(f"/ui/queues/{h.q(job['queue'])}", "cancelled"))

    async def run_now(self, request: Request, id: str) -> Reply:
        _check_id(id)
        outcome = await self.store.run_now(id)
        if outcome == "missing":
            raise Refused(404, f"Job {id} completed or never existed.")
        if outcome == "reserved":
            raise Refused(409, f"Job {id} is running now; it cannot be moved.")
        notice = "run_now" if outcome == "done" else "already_ready"
        return _redirect(_with_notice(f"/ui/jobs/{h.q(id)}", notice))

    # -- failed jobs ------------------------------------------------------------

    async def failed_page(self, request: Request) -> Reply:
        self._known(request, "queue", "name", "error", "age", "cursor")
        queue, name = request.param("queue"), request.param("name")
        error, age, cursor = request.param("error"), request.param("age"), request.param("cursor")
        if queue:
            _check_name("queue", queue)
        if name:
            _check_name("job", name)
        if len(error) > 200:
            raise Refused(400, "The error text to look for is at most 200 characters.")
        if age not in AGES:
            raise Refused(400, f"age must be one of {', '.join(a for a in AGES if a)}.")
        now = request.now_ms
        _, newer, older = AGES[age]
        since = now - newer * 1000 if newer else 0
        before = now - older * 1000 if older else now + 1
        try:
            page = await self.store.failed(
                queue=queue,
                name=name,
                error=error,
                since_ms=since,
                before_ms=before,
                cursor=cursor or None,
            )
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        filters = {"queue": queue, "name": name, "error": error, "age": age}
        here = "/ui/failed" + h.qs({**filters, "cursor": cursor})
        form = (
            '<form method="get" action="/ui/failed" class="filters" role="search" '
            'aria-label="Filter failed jobs">'
            '<div><label for="f-queue">Queue</label>'
            f'<input type="search" id="f-queue" name="queue" value="{h.e(queue)}" '
            'placeholder="any queue"></div>'
            '<div><label for="f-name">Job name</label>'
            f'<input type="search" id="f-name" name="name" value="{h.e(name)}" '
            'placeholder="any name"></div>'
            '<div><label for="f-error">Error contains</label>'
            f'<input type="search" id="f-error" name="error" value="{h.e(error)}" '
            'placeholder="e.g. timed out"></div>'
            '<div><label for="f-age">Age</label><select id="f-age" name="age">'
            + h.options(((k, v[0]) for k, v in AGES.items()), age)
            + "</select></div>"
            '<div><button type="submit">Filter</button> '
            '<a class="button" href="/ui/failed">Clear</a></div></form>'
        )
        rows = []
        for r in page.rows:
            rid = r["id"]
            rows.append(
                "<tr>"
                f'<td><input type="checkbox" name="ids" value="{h.e(rid)}" id="sel-{h.e(rid)}" '
                f'data-select aria-label="Select job {h.e(rid)}"></td>'
                f'<td class="mono"><a href="/ui/jobs/{h.q(rid)}">{h.e(rid)}</a></td>'
                f'<td><a href="/ui/queues/{h.q(r["queue"])}">{h.e(r["queue"])}</a></td>'
                f"<td>{h.e(r['name'])}</td>"
                f"<td>{h.e(_short(scrub(r['error'], r['payload'])))}</td>"
                f'<td class="num hide-narrow">{r["attempts"]} / {r["max_attempts"]}</td>'
                f"<td>{h.when(r['failed_at'], now)}</td></tr>"
            )
        if rows:
            listing = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Failed jobs'
                '</caption><thead><tr><th scope="col"><input type="checkbox" id="select-all" '
                'aria-label="Select every job on this page"></th>'
                '<th scope="col">Job id</th><th scope="col">Queue</th><th scope="col">Name</th>'
                '<th scope="col">Error</th><th scope="col" class="num hide-narrow">Attempts</th>'
                '<th scope="col">Failed</th></tr></thead>'
                f"<tbody>{''.join(rows)}</tbody></table></div>"
            )
        elif any(filters.values()) or cursor:
            listing = (
                '<div class="empty"><p><strong>No failed jobs match this filter.</strong> '
                '<a href="/ui/failed">Clear the filter</a> to see them all.</p></div>'
            )
        else:
            listing = (
                '<div class="empty"><p><strong>No failed jobs.</strong> A job lands here when '
                "its handler fails it or its attempts run out; nothing to do for now.</p></div>"
            )
        bulk = (
            '<div class="actions"><span data-selected-count class="muted"></span>'
            '<button type="submit" name="action" value="retry" data-needs-selection>Retry'
            "</button>"
            '<button type="submit" name="action" value="delete" class="danger" '
            "data-needs-selection>Delete</button>"
            '<span class="muted">the selected jobs (you will be asked to confirm)</span></div>'
            if rows
            else ""
        )
        pager = _pager("/ui/failed", filters, cursor, page.next_cursor)
        body = (
            f"<h1>Failed jobs</h1>{self._notice(request)}{form}"
            f'<form method="post" action="/ui/failed/bulk" aria-label="Act on selected jobs">'
            f"{self._csrf(request)}{h.hidden('back', here)}"
            f'<section id="failed" data-live aria-label="Failed jobs list">{bulk}{listing}'
            f"{pager}</section></form>"
        )
        return Reply(200, self._page(request, "Failed jobs", body, current="/ui/failed"))

    async def bulk(self, request: Request) -> Reply:
        """Retry or delete the selected failed jobs: first a confirmation page
        giving the count, then (with `confirm=yes`) the action itself."""
        action = request.field("action")
        if action not in ("retry", "delete"):
            raise Refused(400, "action must be retry or delete.")
        ids = list(dict.fromkeys(request.form.get("ids", [])))
        if not ids:
            raise Refused(400, "Select at least one failed job first.")
        if len(ids) > PAGE:
            raise Refused(400, f"At most {PAGE} jobs at once (one page).")
        for id in ids:
            _check_id(id)
        back = _safe_back(request.field("back"), "/ui/failed", "back")
        n = len(ids)
        jobs = f"{n} failed job{'s' if n != 1 else ''}"
        if request.field("confirm") != "yes":
            question = (
                f"Put {jobs} back on {'their queues' if n != 1 else 'its queue'}, "
                "each with one fresh attempt?"
                if action == "retry"
                else f"Remove {jobs} for good? This cannot be undone."
            )
            fields = "".join(h.hidden("ids", i) for i in ids)
            verb = "Retry" if action == "retry" else "Delete"
            listing = "".join(f'<li class="mono">{h.e(i)}</li>' for i in ids[:10])
            more = f"<li>and {n - 10} more</li>" if n > 10 else ""
            body = (
                f"<h1>Confirm</h1><p>{h.e(question)}</p><ul>{listing}{more}</ul>"
                f'<form method="post" action="/ui/failed/bulk">{self._csrf(request)}{fields}'
                f"{h.hidden('action', action)}{h.hidden('back', back)}"
                f'{h.hidden("confirm", "yes")}<div class="actions">'
                f'<button type="submit" class="{"primary" if action == "retry" else "danger"}" '
                f"autofocus>{verb} {n} job{'s' if n != 1 else ''}</button>"
                f'<a class="button" href="{h.e(back)}">Go back</a></div></form>'
            )
            return Reply(200, self._page(request, "Confirm", body))
        if action == "retry":
            done = await self.store.retry_many(ids)
            return _redirect(_with_notice(back, "retried", done))
        done = await self.store.delete_many(ids)
        return _redirect(_with_notice(back, "removed", done))

    # -- schedules --------------------------------------------------------------

    async def schedules_page(self, request: Request) -> Reply:
        self._known(request, "cursor")
        now = request.now_ms
        cursor = request.param("cursor") or None
        if cursor is not None:
            _check_name("schedule id", cursor)
        page = await self.service.schedules(SCHEDULES_PAGE, cursor)
        csrf = self._csrf(request)
        rows = []
        for sch in page["schedules"]:
            paused = bool(sch["paused"])
            action = "resume" if paused else "pause"
            back = "/ui/schedules" + h.qs({"cursor": cursor} if cursor else {})
            button = (
                f'<form method="post" action="/ui/schedules/{h.q(sch["id"])}/{action}" '
                f'class="inline">{csrf}{h.hidden("back", back)}'
                f'<button type="submit" title="{action.title()} schedule {h.e(sch["id"])}">'
                f"{action.title()}</button></form>"
            )
            state = (
                '<span class="badge paused">Paused</span>'
                if paused
                else '<span class="badge running">Running</span>'
            )
            queue = sch.get("queue") or ""
            rows.append(
                "<tr>"
                f'<th scope="row">{h.e(sch["id"])}</th>'
                f"<td><code>{h.e(sch['cron'])}</code> "
                f'<span class="muted">{h.e(sch["tz"])}</span></td>'
                f"<td>{h.e(sch['name'])}</td>"
                f'<td class="hide-narrow"><a href="/ui/queues/{h.q(queue)}">{h.e(queue)}</a></td>'
                f"<td>{h.when(sch.get('next_run_at'), now)}</td>"
                f'<td class="hide-narrow">{h.when(sch.get("last_run_at"), now)}</td>'
                f"<td>{state}</td>"
                f'<td class="hide-narrow">{h.e(sch.get("source", ""))}</td>'
                f"<td>{button}</td></tr>"
            )
        if rows:
            table = (
                '<div class="table-wrap"><table><caption class="visually-hidden">Schedules'
                '</caption><thead><tr><th scope="col">Schedule</th><th scope="col">Cron</th>'
                '<th scope="col">Job</th><th scope="col" class="hide-narrow">Queue</th>'
                '<th scope="col">Next run</th><th scope="col" class="hide-narrow">Last run</th>'
                '<th scope="col">State</th><th scope="col" class="hide-narrow">Declared in</th>'
                '<th scope="col">Action</th></tr>'
                f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
                + _pager("/ui/schedules", {}, cursor or "", page.get("next_cursor"))
            )
        else:
            table = (
                '<div class="empty"><p><strong>No schedules yet.</strong> Declare one beside '
                'its handler (<code>@registry.job("report.daily", schedule="0 6 * * *", '
                'tz="Europe/Berlin")</code>) or create one with the API:</p>'
                '<pre>curl -H "Authorization: Bearer $TOKEN" '
                f"{h.e(_origin(request))}/v1/schedules \\\n"
                '     -d \'{"cron": "*/5 * * * *", "name": "example.echo"}\'</pre></div>'
            )
        body = (
            f"<h1>Schedules</h1>{self._notice(request)}"
            f'<section id="schedules" data-live aria-label="Schedule list">{table}</section>'
        )
        return Reply(200, self._page(request, "Schedules", body, current="/ui/schedules"))

    async def _set_schedule_paused(self, request: Request, id: str, paused: bool) -> Reply:
        _check_name("schedule id", id)
        back = _safe_back(request.field("back"), "/ui/schedules", "back")
        if paused:
            await self.service.pause_schedule(id)
        else:
            await self.service.resume_schedule(id)
        return _redirect(_with_notice(back, "schedule_paused" if paused else "schedule_resumed"))

    async def pause_schedule(self, request: Request, id: str) -> Reply:
        return await self._set_schedule_paused(request, id, True)

    async def resume_schedule(self, request: Request, id: str) -> Reply:
        return await self._set_schedule_paused(request, id, False)


def e_status(status: int) -> str:
    return {
        400: "Bad request",
        401: "Signed out",
        403: "Refused",
        404: "Not found",
        405: "Method not allowed",
        409: "Conflict",
        413: "Too large",
        422: "Invalid",
        503: "Not configured",
    }.get(status, "Error")


def _unquote(segment: str) -> str:
    return unquote(segment)


def _origin(request: Request) -> str:
    host = request.headers.get("host", "")
    return f"{'https' if request.secure else 'http'}://{host}"


def _short(text: str | None, n: int = 120) -> str:
    if not text:
        return ""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _pager(base: str, filters: Mapping[str, str], cursor: str, next_cursor: str | None) -> str:
    links = []
    if cursor:
        links.append(f'<a href="{h.e(base + h.qs(filters))}">« First page</a>')
    if next_cursor:
        links.append(
            f'<a href="{h.e(base + h.qs({**filters, "cursor": next_cursor}))}">Next page »</a>'
        )
    return f'<nav class="pager" aria-label="Pages">{"".join(links)}</nav>' if links else ""


def _chart(minutes: list[counters.Minute], now_ms: int) -> str:
    """The last hour as an SVG bar chart (no script, no inline style: the
    CSP allows neither), with its numbers in words for screen readers."""
    series = counters.per_minute(minutes, now_ms)
    completed = sum(m.completed for m in series)
    retried = sum(m.retried for m in series)
    failed = sum(m.failed for m in series)
    summary = f"{completed} completed, {retried} retried, {failed} failed in the last hour"
    if not completed and not retried and not failed:
        return (
            '<div class="empty"><p><strong>No jobs ran in the last hour.</strong> The chart '
            "fills in as cron runs drain jobs (each run records its counts).</p></div>"
        )
    top = max(m.completed + m.retried + m.failed for m in series) or 1
    width, height, bar = 600, 120, 10
    bars = []
    for i, m in enumerate(series):
        x = i * bar
        y = height
        for cls, n in (("c", m.completed), ("r", m.retried), ("f", m.failed)):
            if not n:
                continue
            tall = max(1, round(n / top * (height - 4)))
            y -= tall
            bars.append(
                f'<rect class="{cls}" x="{x + 1}" y="{y}" width="{bar - 2}" height="{tall}"/>'
            )
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height + 1}" role="img" '
        'aria-labelledby="chart-t"><title id="chart-t">'
        f"{h.e(summary)} (peak {top} a minute)</title>"
        f'<line class="axis" x1="0" y1="{height}" x2="{width}" y2="{height}"/>'
        f"{''.join(bars)}</svg>"
        '<ul class="legend"><li><span class="sw c"></span>completed</li>'
        '<li><span class="sw r"></span>retried</li><li><span class="sw f"></span>failed</li>'
        f"<li>{h.e(summary)}; peak {top} a minute; oldest minute on the left</li></ul>"
    )
