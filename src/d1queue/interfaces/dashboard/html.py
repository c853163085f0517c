"""HTML building blocks for the dashboard: escaping, times, the page frame.

Every value that comes from the database or the request goes through `e()`
(text and attribute values alike) or `q()`/`qs()` (URL parts); nothing else
is interpolated into markup.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from urllib.parse import urlencode

from ..router import path_segment
from .assets import CSS_PATH, ICON_PATH, JS_PATH, REFRESH_EVERY_S


def e(value: object) -> str:
    """Text or an attribute value, escaped (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def q(segment: str) -> str:
    """One URL path segment, spelled as the dashboard's router serves it."""
    return path_segment(segment)


def qs(params: Mapping[str, object]) -> str:
    """A query string of the non-empty params, with its '?' (or nothing)."""
    kept = {k: str(v) for k, v in params.items() if v not in (None, "")}
    return "?" + urlencode(kept) if kept else ""


def absolute(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(ms: int, now_ms: int) -> str:
    """'3 min ago' / 'in 2 h 5 min', as the page's script also writes it."""
    s = round((now_ms - ms) / 1000)
    future, s = s < 0, abs(s)
    if s < 60:
        text = f"{s} s"
    elif s < 3600:
        text = f"{s // 60} min"
    elif s < 86400:
        text = f"{s // 3600} h {(s % 3600) // 60} min"
    else:
        text = f"{s // 86400} d {(s % 86400) // 3600} h"
    return f"in {text}" if future else f"{text} ago"


def when(ms: int | None, now_ms: int) -> str:
    """A time both ways: relative (kept current by the script) and absolute."""
    if ms is None:
        return '<span class="muted">—</span>'
    iso = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")
    return (
        f'<span class="rel" data-at="{int(ms)}">{e(relative(ms, now_ms))}</span> '
        f'<time datetime="{e(iso)}">({e(absolute(ms))})</time>'
    )


def age(seconds: float | None) -> str:
    if seconds is None:
        return '<span class="muted">—</span>'
    return e(relative(0, round(seconds * 1000)).removesuffix(" ago"))


def hidden(name: str, value: object) -> str:
    return f'<input type="hidden" name="{e(name)}" value="{e(value)}">'


def options(choices: Iterable[tuple[str, str]], selected: str) -> str:
    return "".join(
        f'<option value="{e(v)}"{" selected" if v == selected else ""}>{e(label)}</option>'
        for v, label in choices
    )


def search_form(value: str = "", where: str = "top") -> str:
    """The search box: in the page's header (`top`), or on the search page."""
    return (
        f'<form method="get" action="/ui/search" class="search {where}" role="search" '
        f'aria-label="Search jobs"><label for="q-{where}" class="visually-hidden">Search by id, '
        f'queue:, name:, state:, batch:, error:</label><input type="search" id="q-{where}" '
        f'name="q" value="{e(value)}" placeholder="Id, name:…, queue:…, a word" '
        'maxlength="300"><button type="submit">Search</button></form>'
    )


NAV = (
    ("/ui", "Overview"),
    ("/ui/metrics", "Metrics"),
    ("/ui/running", "Running now"),
    ("/ui/failed", "Failed jobs"),
    ("/ui/batches", "Batches"),
    ("/ui/schedules", "Schedules"),
    ("/ui/audit", "Audit"),
)


REFRESH_CHOICES = options(((str(s * 1000), f"every {s} s") for s in REFRESH_EVERY_S), "15000")


def frame(
    title: str, body: str, *, current: str = "", csrf: str | None = None, readonly: bool = False
) -> str:
    """A whole page. `csrf` None: signed out (no navigation, no sign-out).
    `readonly`: a read-only session, said beside the sign-out button."""
    nav = ""
    session = ""
    if csrf is not None:
        links = "".join(
            f'<li><a href="{href}"{" aria-current=page" if href == current else ""}>'
            f"{label}</a></li>"
            for href, label in NAV
        )
        nav = f'<nav aria-label="Main"><ul>{links}</ul></nav>{search_form()}'
        session = (
            '<div class="session">'
            + (
                '<span class="badge readonly" title="Signed in with the read-only token: '
                'pages show no actions">Read-only</span>'
                if readonly
                else ""
            )
            + '<span class="refresh" id="refresh" hidden>'
            '<span id="refresh-status">Auto-refresh every 15 s</span>'
            '<label for="refresh-every" class="visually-hidden">Refresh every</label>'
            f'<select id="refresh-every" title="Refresh every">{REFRESH_CHOICES}</select>'
            '<button type="button" id="refresh-toggle" aria-pressed="true">'
            "Stop auto-refresh</button></span>"
            f'<form method="post" action="/ui/signout" class="inline">{hidden("csrf", csrf)}'
            '<button type="submit">Sign out</button></form></div>'
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · d1queue</title>"
        f'<link rel="icon" href="{ICON_PATH}" type="image/svg+xml">'
        f'<link rel="stylesheet" href="{CSS_PATH}">'
        f'<script src="{JS_PATH}" defer></script></head><body>'
        '<a class="skip" href="#main">Skip to content</a>'
        f'<header class="top"><a class="brand" href="/ui">d1queue</a>{nav}{session}</header>'
        f'<main id="main" tabindex="-1">{body}</main></body></html>'
    )
