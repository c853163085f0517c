"""The dashboard's sign-in, sign-out, session check and CSRF check, and the
check of where a form or link says to go next (`next`, `back`).

- Every page and action but the sign-in and the static assets needs a valid
  session (session.py): signed, unexpired and not signed out (one point
  read of D1 a request carrying one); without one a page redirects to
  sign-in and an action is refused (401).
- Every POST but sign-in carries the session's CSRF token in a hidden field,
  checked in constant time (403 without it); every POST, sign-in included,
  is refused when the browser says it came from another origin (Origin,
  Sec-Fetch-Site), which also covers sign-in CSRF.
- A wrong sign-in costs its sender what a wrong API token does (guard.py).
- Signing out ends the session on the server, not only in this browser.
- A session signed in with the read-only token (D1QUEUE_READONLY_TOKEN)
  sees every page and may POST nothing but a sign-out or sign-in (403 otherwise,
  before the form is read); its pages show no action (Request.readonly).
- `next` and `back`: resolved as the browser resolves a path, then a
  dashboard path (under /ui) on this origin, else the action's own page;
  a control character is refused with a 400.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, quote, unquote, urlparse

from ...core.guard import RETRY_AFTER_S, Guard
from ...store.dashboard import Store
from ..router import Reply, Route
from . import html as h
from .request import Refused, Request, html_page, known, redirect
from .session import Session, Sessions, cookie_name, read_cookies, set_cookie

MAX_FORM_BYTES = 64 * 1024
"""A dashboard form: 50 ids and a few fields fit in a few KB."""

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Control characters: C0 (CR and LF among them), DEL and C1. None belongs
in a path, and in a Location header CR or LF would end the header (the
Workers runtime refuses such a header outright: a 500)."""

_NOT_ASCII = re.compile("[^\x00-\x7f]+")


def safe_back(path: str, default: str, name: str) -> str:
    """Where an action or sign-in returns to (form field or parameter
    `name`): a dashboard path on this origin, else `default`, so it is never
    an open redirect. A control character anywhere is refused (400).

    The path is resolved before it is checked, as the browser will resolve
    the Location it ends up in (with the prefix before it, /queue/ui/...):
    percent-escapes decoded (`%2e%2e` is `..`), a backslash read as `/`,
    dot-segments applied. What is left must be /ui or under it, with no
    empty segment (`//`: another host, or a spelling no page has) and no
    `%` (an escape inside an escape, which someone may decode twice); else
    `default`. The answer is that resolved path, each segment spelled as
    the pages spell it, so nothing is left for the browser to resolve:
    `/ui/../../admin` cannot climb out of the prefix to a route of the
    Worker around d1queue. The query is kept, characters past ASCII
    percent-encoded (a header carries bytes); a fragment is dropped."""
    bad = CONTROL.search(path)
    if bad is not None:
        raise Refused(
            400,
            f"{name} holds a control character (U+{ord(bad.group()):04X}); "
            "a dashboard address has none.",
        )
    resolved = _resolved(path.split("#", 1)[0].split("?", 1)[0])
    if resolved is None:
        return default
    query = path.split("#", 1)[0].partition("?")[2]
    if query:
        resolved += "?" + _NOT_ASCII.sub(lambda m: quote(m.group(), safe=""), query)
    return resolved


def _resolved(path: str) -> str | None:
    """`path` resolved (safe_back says how), or None when that is not /ui
    or a path under it."""
    decoded = unquote(path, errors="replace").replace("\\", "/")
    if not decoded.startswith("/") or "%" in decoded:
        return None
    segments: list[str] = []
    for part in decoded.split("/")[1:]:
        if part == "":
            return None  # `//` (`//host` is another site) or a trailing `/`
        if part == "..":
            if segments:
                segments.pop()
        elif part != ".":
            segments.append(part)
    if not segments or segments[0] != "ui":
        return None
    return "/" + "/".join(h.q(s) for s in segments)


READONLY_POSTS = frozenset({"/ui/signout", "/ui/signin"})
"""The only forms (route paths) a read-only session may send: signing out,
and signing in again (with the API token, to act): neither changes a job."""


class Auth:
    """Sessions for one API token (None: not configured, and nobody can
    sign in) and the read-only token, if any. `store` holds the sign-outs;
    `guard` slows wrong sign-ins."""

    def __init__(
        self, token: str | None, store: Store, guard: Guard, readonly_token: str | None = None
    ) -> None:
        self.sessions = Sessions(token, readonly_token) if token else None
        self.store = store
        self.guard = guard

    def configured(self) -> Sessions:
        """The sessions, or a 503 saying how to configure them."""
        if self.sessions is None:
            raise Refused(
                503,
                "No API token is configured, so nobody can sign in: set the D1QUEUE_TOKEN "
                "secret (wrangler secret put D1QUEUE_TOKEN; .dev.vars locally).",
            )
        return self.sessions

    async def admit(self, request: Request, route: Route) -> Reply | None:
        """What a request must pass before its route's handler runs: its
        session looked up; a POST from this origin, within size, and (but
        for sign-in) signed in with the session's CSRF token; a page that
        needs a session and has none redirected to sign-in (the returned
        reply). None: the handler may run."""
        sessions = self.configured()
        request.session = await self.session(request)
        if request.session is not None:
            request.csrf = sessions.csrf(request.session)
        if request.method == "POST":
            if (
                request.session is not None
                and request.session.readonly
                and route.path not in READONLY_POSTS
            ):
                raise Refused(
                    403,
                    "You are signed in with the read-only token: it shows every page and "
                    "changes nothing. Sign in with the API token to act.",
                )
            self.check_post(request, route.signed_in)
        elif route.signed_in and request.session is None:
            target = request.path + h.qs({k: v[-1] for k, v in request.query.items()})
            return redirect("/ui/signin" + h.qs({"next": target}))
        return None

    async def session(self, request: Request) -> Session | None:
        """The request's session: a cookie value signed, unexpired, and not
        signed out. A copy of a cookie taken before its sign-out is still
        signed and unexpired; only D1 knows the session ended, so a request
        carrying a session pays one point read (store.signed_out). No
        session cookie, or only forged or expired ones: no read."""
        sessions = self.configured()
        found = []
        for value in read_cookies(request.headers.get("cookie", ""), cookie_name(request.secure)):
            session = sessions.verify(value, request.now_ms)
            if session is not None:
                found.append(session)
        if not found:
            return None
        ended = await self.store.signed_out(list(dict.fromkeys(s.nonce for s in found)))
        return next((s for s in found if s.nonce not in ended), None)

    def check_post(self, request: Request, signed_in: bool) -> None:
        """What every POST must pass before its form is read: from this
        origin, within size, a well-formed form; signed in and carrying the
        session's CSRF token, unless it is the sign-in itself."""
        sessions = self.configured()
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
        if not sessions.check_csrf(request.session, request.field("csrf") or None):
            raise Refused(
                403,
                "This form is missing its security token (CSRF) or carries a wrong one, "
                "so nothing was changed. Reload the page and try again.",
            )

    # -- the sign-in page and its form -------------------------------------------

    def _signin_form(self, next_path: str, error: str = "") -> str:
        alert = f'<p class="error-box" role="alert">{h.e(error)}</p>' if error else ""
        return (
            '<div class="signin"><h1>d1queue dashboard</h1>'
            "<p>Enter this Worker's API token (the <code>D1QUEUE_TOKEN</code> secret; "
            "<code>.dev.vars</code> under <code>make dev</code>) to continue, or its "
            "read-only token (<code>D1QUEUE_READONLY_TOKEN</code>) to look without "
            "changing anything.</p>"
            f'{alert}<form method="post" action="/ui/signin">'
            '<div class="field"><label for="token">API token</label>'
            '<input type="password" id="token" name="token" autocomplete="current-password" '
            "required autofocus></div>"
            f"{h.hidden('next', next_path)}"
            '<button type="submit" class="primary">Sign in</button></form></div>'
        )

    async def signin_page(self, request: Request) -> Reply:
        known(request, "next")
        next_path = safe_back(request.param("next"), "/ui", "next")
        if request.session is not None:
            return redirect(next_path)
        return Reply(200, html_page(request, "Sign in", self._signin_form(next_path)))

    async def signin(self, request: Request) -> Reply:
        sessions = self.configured()
        next_path = safe_back(request.field("next"), "/ui", "next")
        role = sessions.check_token(request.field("token"))
        if role is None:
            if await self.guard.failed(request.headers):
                form = self._signin_form(next_path, "Too many wrong tokens: wait a minute.")
                reply = Reply(429, html_page(request, "Sign in", form))
                reply.headers["retry-after"] = str(RETRY_AFTER_S)
                return reply
            form = self._signin_form(next_path, "That is not this Worker's API token.")
            return Reply(401, html_page(request, "Sign in", form))
        cookie = set_cookie(sessions.issue(request.now_ms, role), secure=request.secure)
        return redirect(next_path, {"set-cookie": cookie})

    async def signout(self, request: Request) -> Reply:
        """End the session on the server (a copy of the cookie replayed later
        is refused), then clear the cookie in this browser. Should the write
        fail, the error page keeps the cookie, so signing out can be tried
        again (the write is safe to re-send)."""
        assert request.session is not None
        session = request.session
        await self.store.sign_out(session.nonce, session.expires_ms, request.now_ms)
        cookie = set_cookie("", secure=request.secure, max_age_s=0)
        return redirect("/ui/signin", {"set-cookie": cookie})
