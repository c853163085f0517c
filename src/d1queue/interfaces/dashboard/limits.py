"""A queue's flow limits on the dashboard: the form that changes them (its
fields filled from, and read back into, the API's PUT body through
Limits.parse), their use now on the queue page, the overview's cell, and
the confirmation a change asks for."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...core.bounds import LIMIT_RANGE, PERIOD_RANGE
from ...core.flow import LIMIT_FIELDS, Limits, LimitsError
from . import html as h
from .parts import Column, confirm_form, props, table
from .request import Refused, Request, csrf_field

_INTEGER = re.compile(r"-?[0-9]{1,12}")
"""A form's number, read as an integer for Limits.parse to judge; any other
text goes to it as the text, which it refuses saying what it got."""

_FORM_FIELDS = {
    "rate": ("rate_limit", "rate_period_s"),
    "group_rate": ("group_rate_limit", "group_rate_period_s"),
}
"""The form's two fields of each rate: its limit and its period_s."""

LABELS = {
    "concurrency": "Concurrency",
    "group_concurrency": "Group concurrency",
    "rate_limit": "Rate: claims",
    "rate_period_s": "Rate: per seconds",
    "group_rate_limit": "Group rate: claims",
    "group_rate_period_s": "Group rate: per seconds",
}
"""The form's fields, in order, with their labels."""

NO_GROUP = '<span class="muted">no group</span>'
"""Jobs pushed without a group: Service.limits names them ""."""

SOURCES = {
    "api": "Set here or over the API (PUT /v1/queues/…/limits).",
    "code": "Declared in the Worker's code (Registry.limit); saving the form below replaces them.",
    "none": "None: drains claim this queue's jobs as fast as they run them.",
}


def _form_number(request: Request, name: str) -> object:
    """A field of the limits form: None when empty, an int when it is one,
    else its text (cut short: it is only quoted in the error)."""
    text = request.field(name).strip()
    if not text:
        return None
    if _INTEGER.fullmatch(text):
        return int(text)
    return text if len(text) <= 24 else text[:23] + "…"


def limits_of_form(request: Request) -> Limits:
    """The limits the queue page's form sends, judged by Limits.parse, the
    rule the API applies to a PUT body: an empty field is no limit of that
    kind, a rate with one of its two fields filled is refused. A 422 page
    with LimitsError's message otherwise, before anything is written."""
    body: dict[str, Any] = {}
    for name in LIMIT_FIELDS:
        if name in _FORM_FIELDS:
            limit, period = (_form_number(request, f) for f in _FORM_FIELDS[name])
            if limit is None and period is None:
                body[name] = None
                continue
            body[name] = {
                k: v for k, v in (("limit", limit), ("period_s", period)) if v is not None
            }
        else:
            body[name] = _form_number(request, name)
    try:
        return Limits.parse(body)
    except LimitsError as exc:
        raise Refused(422, f"Nothing was changed: {exc}.") from None


def form_values(limits: Mapping[str, Any]) -> dict[str, str]:
    """A limits body (the PUT body's shape) as the form's fields ("" for none)."""
    out = {}
    for name in LIMIT_FIELDS:
        value = limits.get(name)
        if name in _FORM_FIELDS:
            limit, period = _FORM_FIELDS[name]
            out[limit] = "" if value is None else str(value["limit"])
            out[period] = "" if value is None else str(value["period_s"])
        else:
            out[name] = "" if value is None else str(value)
    return out


def period(seconds: int) -> str:
    """A rate's period as an operator reads it: 10 s, 1 min, 2 h, 1 d."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def limits_text(limits: Mapping[str, Any] | None, running: int | None = None) -> str:
    """A limits body in words ("" for none): `running` is the queue's jobs
    held now, shown against its concurrency."""
    if not limits:
        return ""
    parts = []
    n = limits.get("concurrency")
    if n is not None:
        parts.append(
            f"concurrency {running}/{n} running" if running is not None else f"concurrency {n}"
        )
    n = limits.get("group_concurrency")
    if n is not None:
        parts.append(f"group concurrency {n}")
    for name, label in (("rate", "rate"), ("group_rate", "group rate")):
        rate = limits.get(name)
        if rate is not None:
            parts.append(f"{label} {rate['limit']} per {period(rate['period_s'])}")
    return ", ".join(parts)


def limits_brief(limits: Mapping[str, Any] | None, running: int) -> str:
    """The overview's Limits cell, from the stats' read alone."""
    text = limits_text(limits, running)
    return h.e(text) if text else '<span class="muted">none</span>'


def _in_force(limits: Mapping[str, Any], running: int) -> list[tuple[str, str]]:
    """Each kind of limit in words, with the use now of the concurrency."""
    n = limits["concurrency"]
    rows = [
        (
            "Concurrency",
            f"{running} of {n} running" if n is not None else f"no limit ({running} running)",
        )
    ]
    n = limits["group_concurrency"]
    rows.append(("Per group", f"at most {n} running" if n is not None else "no limit"))
    for name, label in (("rate", "Rate"), ("group_rate", "Rate per group")):
        rate = limits[name]
        rows.append(
            (
                label,
                f"{rate['limit']} claims per {period(rate['period_s'])}"
                if rate is not None
                else "no limit",
            )
        )
    return rows


def _busiest(busiest: Mapping[str, int], cap: int | None) -> str:
    """The busiest groups' jobs running now, against the group concurrency."""
    if not busiest:
        return ""
    of = f" / {cap}" if cap is not None else ""
    columns: list[Column[tuple[str, int]]] = [
        Column("Group", lambda gk: h.e(gk[0]) if gk[0] else NO_GROUP, row_header=True),
        Column("Running", lambda gk: f"{gk[1]}{of}", "num"),
    ]
    return table(
        "Running now, busiest groups first",
        columns,
        busiest.items(),
        wrap="table-wrap narrow",
        caption_shown=True,
    )


def limits_usage(flow: Mapping[str, Any]) -> str:
    """The queue page's limits and their use now (Service.limits)."""
    limits = flow["limits"]
    source = h.e(SOURCES.get(flow["source"], ""))
    shown = props((k, h.e(v)) for k, v in _in_force(limits, flow["running"]))
    groups = _busiest(flow["running_by_group"], limits["group_concurrency"])
    return f'<p class="muted">{source}</p>{shown}{groups}'


def limits_form(request: Request, queue: str, limits: Mapping[str, Any], back: str) -> str:
    """The form changing the queue's limits, filled with those in force;
    sent, it asks to confirm (Pages.set_limits)."""
    values = form_values(limits)
    lo, hi = LIMIT_RANGE
    plo, phi = PERIOD_RANGE
    fields = "".join(
        f'<div><label for="l-{name}">{label}</label>'
        f'<input type="number" id="l-{name}" name="{name}" value="{h.e(values[name])}" '
        f'min="{plo if name.endswith("period_s") else lo}" '
        f'max="{phi if name.endswith("period_s") else hi}" step="1" inputmode="numeric">'
        "</div>"
        for name, label in LABELS.items()
    )
    return (
        f'<form method="post" action="/ui/queues/{h.q(queue)}/limits" class="limits-form" '
        'aria-labelledby="limits-h">'
        f"{csrf_field(request)}{h.hidden('back', back)}"
        f'<div class="fields">{fields}</div>'
        f'<p class="muted">An empty field is no limit of that kind; a rate needs both its '
        f"claims ({lo} to {hi}) and its period ({plo} to {phi} seconds).</p>"
        '<div class="actions"><button type="submit">Change limits</button>'
        '<span class="muted">(you will be asked to confirm)</span></div></form>'
    )


def confirm_limits(
    request: Request, queue: str, limits: Limits, now: Mapping[str, Any], back: str
) -> str:
    """The page asking to confirm a change of the queue's limits to
    `limits`, giving those in force `now` (Service.limits)."""
    new = limits_text(limits.as_dict()) or "no limits"
    was = limits_text(now["limits"]) or "no limits"
    note = (
        "<p>These replace the limits declared in code (Registry.limit) for this "
        "queue, until set again here or over the API.</p>"
        if now["source"] == "code"
        else ""
    )
    fields = "".join(h.hidden(k, v) for k, v in form_values(limits.as_dict()).items())
    action = f"/ui/queues/{h.q(queue)}/limits"
    return (
        f"<h1>Confirm</h1><p>Set the flow limits of queue {h.e(queue)} to "
        f"<strong>{h.e(new)}</strong>?</p><p>Now: {h.e(was)} "
        f"({h.e(now['running'])} running). Every drain claims under the new limits "
        f"from its next claim; jobs running now are not stopped.</p>{note}"
        + confirm_form(request, action, fields, back, "Set limits", "primary")
    )
