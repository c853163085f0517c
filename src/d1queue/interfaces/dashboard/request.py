"""A dashboard request, and what every part of the dashboard answers with:
a refusal (an error page), a redirect, a page in the frame."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..router import Reply
from . import html as h
from .session import Session


class Refused(Exception):
    """A request the dashboard answers with an error page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


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
    csrf: str | None = None
    """The session's CSRF token, for the forms a page shows (None: signed
    out, so the page shows none)."""
    form: dict[str, list[str]] = field(default_factory=dict)
    base: str = ""
    """Where the dashboard's Worker mounts d1queue ("" at the root, else a
    prefix such as "/queue"): what goes before `/ui` and `/v1` in an
    address shown to the user. `path` is the dashboard's own, without it."""

    @property
    def readonly(self) -> bool:
        """Signed in with the read-only token: its pages show no action."""
        return self.session is not None and self.session.readonly

    def param(self, name: str) -> str:
        values = self.query.get(name)
        return values[-1] if values else ""

    def field(self, name: str) -> str:
        values = self.form.get(name)
        return values[-1] if values else ""


def redirect(location: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(303, "", {"location": location, **(headers or {})})


def html_page(request: Request, title: str, body: str, *, current: str = "") -> str:
    """A whole page: navigation and sign-out only for a signed-in request."""
    return h.frame(title, body, current=current, csrf=request.csrf, readonly=request.readonly)


def csrf_field(request: Request) -> str:
    """The hidden field every state-changing form carries (auth.check_post)."""
    assert request.csrf is not None, "a page with forms needs a session"
    return h.hidden("csrf", request.csrf)


def known(request: Request, *names: str) -> None:
    """Refuse query parameters the page does not take: a mistyped filter
    must not silently show everything."""
    unknown = sorted(set(request.query) - {*names, "notice", "n"})
    if unknown:
        raise Refused(400, f"Unknown query parameter(s): {', '.join(unknown)}.")
