"""The dashboard at /ui: its route table and how a request is handled.

Plain Python like api.py: method, URL, headers and body in; status, headers
and an HTML (or asset) body out. The Worker glue routes /ui and /ui/* here. Routing
is the one router's (router.py): HEAD, OPTIONS, 404 and 405 (with `allow`)
follow the API's rule, with an HTML page for a body. Sign-in, sessions and
CSRF are auth.py's; the pages and their actions, pages.py's.

Security, in one place:
- Every page and action but the sign-in and the static assets needs a valid
  session; every POST is checked for its origin, and but for sign-in for
  the session's CSRF token (auth.py). The assets hold no data.
- Content-Security-Policy allows scripts, styles and fetches from this
  origin only: no inline script or style, no framing, forms post here only.
- Pages are `no-store`: signing out leaves nothing readable in the cache.
- Where a form or a link says to go next (`next`, `back`): resolved as the
  browser will resolve it (percent-escapes, backslashes, dot-segments),
  then kept only when it stays under /ui, else the action's own page; a
  control character (a CR or LF would split the Location header; none
  belongs in a path) is refused with a 400 (auth.safe_back).
- Each page and action answers at one spelling of its path only (the
  router is canonical): `/ui/signin/`, `/ui/signin;x` or `/ui/%73ignin` is
  a 404, so a rule in front of the Worker that matches the exact path
  (docs/security.md) sees every sign-in.
- Payloads are shown with their secrets masked (mask.py).
- A session of the read-only token (D1QUEUE_READONLY_TOKEN) sees every
  page without its actions, and any POST of it but signing out or in is a
  403 (auth.py).

Mounted under a prefix (`prefix="/queue"`: the dashboard at /queue/ui), the
pages still route and build their addresses as `/ui/...`: the prefix is taken
off the request's path here, and put before every `/ui` address of an answer
(`_mounted`): a redirect's Location and the `href`, `action` and `src`
attributes of a page. Those are the only places a page names a dashboard
address the browser follows; a value from the database or the request
cannot fake one, as `h.e` escapes every quote. `next` and `back` (hidden
fields, query parameters) stay the dashboard's own paths, without the
prefix, and are checked as such (auth.safe_back): resolved to a path under
/ui with no dot-segment left, so with the prefix before it the browser
stays under <prefix>/ui.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Mapping
from urllib.parse import parse_qs, unquote, urlsplit

from ...core.d1_faults import is_unavailable
from ...core.guard import Guard
from ...core.log import event, get
from ...store.dashboard import Store
from ..router import Reply, Route, Router, options_reply, without_body
from ..service import UNAVAILABLE_RETRY_AFTER_S, ApiError, Service
from . import html as h
from .assets import ASSETS
from .auth import Auth
from .pages import Pages
from .request import Refused, Request, html_page
from .session import is_local

log = get(__name__)

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
_ADDRESS = re.compile(r'\b(href|action|src)="/ui')
"""A dashboard address in a page's markup: every one the pages write."""

_SEPARATORS = re.compile(r"[/\\;]")
"""What ends a path's first segment, for a browser or for urlparse."""


def is_dashboard_path(path: str) -> bool:
    """Whether the Worker hands `path` (d1queue's, without the prefix) to the
    dashboard: /ui and everything under it, and any other spelling of its
    first segment (/UI, /%75i, /ui;x, //ui, /ui%2F...). The dashboard's
    router answers those 404, so no spelling of /ui/signin reaches the API
    either (which would answer 401 before its 404, a different answer from
    the page's)."""
    first = _SEPARATORS.split(unquote(path, errors="replace").lstrip("/\\"), maxsplit=1)[0]
    return first.lower() == "ui"


ASSET_CACHE = "public, max-age=31536000, immutable"
"""An asset's path names its content's hash (assets.py): cached for good."""


class Dashboard:
    """`token` is the D1QUEUE_TOKEN secret (None: not configured, and every
    page says so); `readonly_token` the D1QUEUE_READONLY_TOKEN secret (None:
    no read-only sign-in). `guard`: what a wrong sign-in costs its sender."""

    def __init__(
        self,
        service: Service,
        token: str | None,
        guard: Guard | None = None,
        *,
        prefix: str = "",
        readonly_token: str | None = None,
    ) -> None:
        self.service = service
        self.prefix = prefix
        """Where the Worker mounts d1queue: "" (the dashboard at /ui) or a
        path such as "/queue" (the dashboard at /queue/ui)."""
        self.guard = guard if guard is not None else Guard()
        self.store = Store(service.queue, service.shards)
        self.auth = Auth(token, self.store, self.guard, readonly_token)
        self.pages = Pages(service, self.store)
        self.bulk = self.pages.bulk_pages
        auth, pages, bulk = self.auth, self.pages, self.bulk
        self.router = Router(
            (
                *(Route("GET", path, self._asset, public=True) for path in ASSETS),
                Route("GET", "/ui", pages.overview),
                Route("GET", "/ui/signin", auth.signin_page, signed_in=False),
                Route("POST", "/ui/signin", auth.signin, signed_in=False),
                Route("POST", "/ui/signout", auth.signout),
                Route("GET", "/ui/queues/{queue}", pages.queue_page),
                Route("GET", "/ui/queues/{queue}/completed", pages.completed_page),
                Route("POST", "/ui/queues/{queue}/pause", pages.pause),
                Route("POST", "/ui/queues/{queue}/resume", pages.resume),
                Route("POST", "/ui/queues/{queue}/limits", pages.set_limits),
                Route("GET", "/ui/metrics", pages.metrics_page),
                Route("GET", "/ui/search", pages.search),
                Route("GET", "/ui/running", pages.running_page),
                Route("GET", "/ui/jobs/{id}", pages.job_page),
                Route("POST", "/ui/jobs/{id}/cancel", pages.cancel),
                Route("POST", "/ui/jobs/{id}/run", pages.run_now),
                Route("GET", "/ui/batches", pages.batches_page),
                Route("GET", "/ui/batches/{id}", pages.batch_page),
                Route("GET", "/ui/failed", pages.failed_page),
                Route("POST", "/ui/failed/bulk", pages.bulk),
                Route("POST", "/ui/bulk", bulk.confirm),
                Route("POST", "/ui/bulk/step", bulk.step),
                Route("GET", "/ui/audit", bulk.audit),
                Route("GET", "/ui/schedules", pages.schedules_page),
                Route("GET", "/ui/schedules/{id}", pages.schedule_page),
                Route("POST", "/ui/schedules/{id}/run", pages.run_schedule),
                Route("POST", "/ui/schedules/{id}/edit", pages.edit_schedule),
                Route("POST", "/ui/schedules/{id}/pause", pages.pause_schedule),
                Route("POST", "/ui/schedules/{id}/resume", pages.resume_schedule),
            ),
            canonical=True,
        )

    async def handle(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes, now_ms: int
    ) -> Reply:
        # urlsplit, not urlparse: urlparse takes a last segment's `;x` for
        # parameters and drops it, so /ui/signin;x would route as /ui/signin.
        parsed = urlsplit(url)
        host = headers.get("host") or parsed.netloc
        path = parsed.path
        if self.prefix and (path == self.prefix or path.startswith(self.prefix + "/")):
            path = path[len(self.prefix) :] or "/"
        request = Request(
            method=method,
            path=path,
            query=parse_qs(parsed.query, keep_blank_values=True),
            headers=headers,
            body=body,
            secure=not is_local(host),
            now_ms=now_ms,
            base=self.prefix,
        )
        try:
            reply = await self._route(request)
        except (Refused, ApiError) as exc:
            reply = self._error_page(request, exc.status, exc.message)
        except Exception as exc:
            reply = self._failure_page(request, exc)
        if reply.status != 204:
            reply.headers.setdefault("content-type", "text/html; charset=utf-8")
        reply.headers.setdefault("cache-control", "no-store")
        for k, v in SECURITY_HEADERS.items():
            reply.headers.setdefault(k, v)
        return without_body(method, self._mounted(reply))

    def _mounted(self, reply: Reply) -> Reply:
        """The answer with the prefix before every dashboard address the
        browser follows (the module's docstring says which)."""
        if not self.prefix:
            return reply
        location = reply.headers.get("location", "")
        if location.startswith("/ui"):
            reply.headers["location"] = self.prefix + location
        if isinstance(reply.body, str) and reply.headers.get("content-type", "").startswith(
            "text/html"
        ):
            reply.body = _ADDRESS.sub(lambda m: f'{m.group(1)}="{self.prefix}/ui', reply.body)
        return reply

    async def _route(self, request: Request) -> Reply:
        found = self.router.resolve(request.method, request.path)
        if found.status == 204:
            return options_reply(found)
        if not found.public:
            # Before 404 and 405, as the API answers 503 before them.
            self.auth.configured()
        if found.status == 404:
            raise Refused(404, f"There is no page at {request.path}.")
        if found.status == 405:
            message = f"{request.path} accepts {', '.join(found.methods)}"
            return self._error_page(request, 405, message, {"allow": found.allow})
        assert found.route is not None
        if not found.route.public:
            turned_away = await self.auth.admit(request, found.route)
            if turned_away is not None:
                return turned_away
        reply: Reply = await found.route.handler(request, *found.args)
        return reply

    async def _asset(self, request: Request) -> Reply:
        kind, text = ASSETS[request.path]
        return Reply(
            200, text, {"content-type": kind, "cache-control": ASSET_CACHE, **SECURITY_HEADERS}
        )

    def _failure_page(self, request: Request, exc: Exception) -> Reply:
        """The page for an exception no route answered: D1 failing past the
        binding's re-sends is 503 with Retry-After (reload in a moment);
        anything else is a 500 whose details go to the log, not the page
        (they may hold SQL, a payload or a stack)."""
        where = f"{request.method} {request.path}"
        error = f"{type(exc).__name__}: {exc}"
        if is_unavailable(exc):
            event(log, "d1queue.dashboard.unavailable", logging.WARNING, request=where, error=error)
            message = (
                f"The database is unavailable for now. Reload in {UNAVAILABLE_RETRY_AFTER_S} "
                "seconds; an action you sent may have been done already (each is safe to "
                "send again)."
            )
            retry = {"retry-after": str(UNAVAILABLE_RETRY_AFTER_S)}
            return self._error_page(request, 503, message, retry, "Unavailable")
        event(
            log,
            "d1queue.dashboard.failed",
            logging.ERROR,
            request=where,
            error=error,
            traceback=traceback.format_exc(),
        )
        message = "The page failed inside the Worker; its log says why (d1queue.dashboard.failed)."
        return self._error_page(request, 500, message)

    def _error_page(
        self,
        request: Request,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        title: str = "",
    ) -> Reply:
        back = (
            '<p><a href="/ui">Back to the overview</a></p>'
            if request.session is not None
            else '<p><a href="/ui/signin">Go to sign-in</a></p>'
        )
        title = title or e_status(status)
        body = f'<h1>{title}</h1><p class="error-box" role="alert">{h.e(message)}</p>{back}'
        extra = dict(headers or {})
        if status == 401:
            extra["www-authenticate"] = 'Cookie realm="d1queue"'
        return Reply(status, html_page(request, title, body), extra)


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
