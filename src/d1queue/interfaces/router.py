"""The one HTTP router: the API (/health, /v1/...) and the dashboard (/ui/...)
both route through it, so a method, a path and its answer follow one rule.

Routes are data (`Route`): a method, an OpenAPI path template such as
`/v1/jobs/{id}`, what it runs, and per-route options: the query parameters
the API accepts there, whether it is public (answered before any credential
or configuration is checked), and whether the dashboard needs a session.
What a handler takes and returns is the surface's own business; the router
only says which route a request reaches, or why none does.

The rule, for both surfaces:
- A GET route answers HEAD too, the same status and headers without a body
  (`without_body`); no route declares HEAD itself.
- OPTIONS on a path some route serves answers 204 with `allow`.
- A path some route serves, asked with a method none of them takes: 405,
  with `allow`.
- No route on the path: 404.
`allow` lists the path's methods in the table's order, then HEAD when GET is
among them, after OPTIONS: `OPTIONS, GET, DELETE, HEAD`.

A router made `canonical` (the dashboard's) serves a path only as its
templates spell it, each `{param}` as `path_segment` writes it: a trailing
slash, a `;x`, an empty segment or a percent-encoded letter is another
path, so 404. A rule in front of the Worker that matches a path exactly
(a WAF rule on the sign-in) then sees every request that reaches the route.

Each surface renders its own error body (JSON for the API, an HTML page for
the dashboard) around the status and `allow` the router decides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal
from urllib.parse import quote, unquote

from .service import ApiError

ANSWERED_BY_THE_ROUTER = ("HEAD", "OPTIONS")
"""Methods no route declares: HEAD is a GET route's, OPTIONS the path's."""


def path_segment(value: str) -> str:
    """`value` as one path segment, every character but letters, digits and
    `_.-~` percent-encoded: how an address names it, and, for a canonical
    router, the one spelling it is served under."""
    return quote(value, safe="")


@dataclass
class Reply:
    """An answer, before the Worker glue makes a Response of it: `body` is
    the surface's (a JSON value for the API, HTML text for the dashboard),
    None for no body at all (204, HEAD)."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_JSON_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,15})")


@dataclass(frozen=True)
class QueryParam:
    """One query parameter a route accepts. Its type and bounds are both what
    the API checks and what the OpenAPI document states (`schema`), so the two
    cannot drift; the bounds themselves come from bounds.py."""

    name: str
    type: Literal["integer", "number", "string"]
    minimum: int | None = None
    maximum: int | None = None
    pattern: str | None = None
    """A string's shape, a regex matched in full (the document anchors it)."""
    required: bool = False
    default: Any = None
    code: str = ""
    """The error code of a bad value (default `invalid_<name>`)."""

    def schema(self) -> dict[str, Any]:
        """The parameter's JSON Schema, as the OpenAPI document states it."""
        schema: dict[str, Any] = {"type": self.type}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.pattern is not None:
            schema["pattern"] = f"^{self.pattern}$"
        if self.default is not None:
            schema["default"] = self.default
        return schema

    def rule(self) -> str:
        """What a valid value is, in words, for the error message."""
        kind = {"integer": "an integer", "number": "a number", "string": "a string"}[self.type]
        if self.pattern is not None:
            return f"{kind} matching {self.pattern}"
        if self.minimum is not None and self.maximum is not None:
            return f"{kind} from {self.minimum} to {self.maximum}"
        return kind

    def parse(self, raw: str) -> Any:
        """The value of `?name=raw`, checked against the schema (ApiError 400
        otherwise). Numbers are JSON numbers: no "inf", "nan", "1_0" or
        spaces, which Python's int() and float() would take."""
        value: Any = raw
        if self.type == "integer" and _JSON_INTEGER.fullmatch(raw):
            value = int(raw)
        elif self.type == "number" and _JSON_NUMBER.fullmatch(raw):
            value = float(raw)
            value = value if math.isfinite(value) else None
        elif self.type != "string":
            value = None
        ok = value is not None and (
            (self.pattern is None or re.fullmatch(self.pattern, value) is not None)
            if self.type == "string"
            else (self.minimum is None or value >= self.minimum)
            and (self.maximum is None or value <= self.maximum)
        )
        if not ok:
            raise ApiError(
                400, self.code or f"invalid_{self.name}", f"{self.name} must be {self.rule()}"
            )
        return value


@dataclass(frozen=True)
class Route:
    """One operation: method, path template (`{name}` matches one non-empty
    segment, handed to the handler percent-decoded), what it runs, and its
    options."""

    method: str
    path: str
    handler: Callable[..., Any]
    query: tuple[QueryParam, ...] = ()
    """The API's: the query parameters the route accepts (any other is
    refused), as the OpenAPI document states them."""
    public: bool = False
    """Answered before any credential or configuration is checked, and so
    is a 405 on its path: the API's /health, the dashboard's static assets."""
    signed_in: bool = True
    """The dashboard's: needs a session (a page redirects to sign-in, an
    action is refused); False for sign-in itself. Every API route that is
    not public needs the token."""

    def __post_init__(self) -> None:
        if self.method in ANSWERED_BY_THE_ROUTER:
            raise ValueError(f"{self.method} is the router's to answer, not a route's")

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """The path as a regex, one group per `{param}` segment."""
        parts = re.split(r"\{[a-z_]+\}", self.path)
        return re.compile("([^/]+)".join(re.escape(p) for p in parts))

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"\{([a-z_]+)\}", self.path)

    def match(self, path: str, *, canonical: bool = False) -> tuple[str, ...] | None:
        """The path's `{param}` values, decoded, or None when it is not this
        route's path (`canonical`: nor when a value is not spelled as
        `path_segment` spells it)."""
        m = self.pattern.fullmatch(path)
        if m is None:
            return None
        values = tuple(unquote(g) for g in m.groups())
        if canonical and any(path_segment(v) != g for v, g in zip(values, m.groups(), strict=True)):
            return None
        return values

    def parse_query(self, query: Mapping[str, list[str]]) -> dict[str, Any]:
        """The route's query parameters, parsed, defaults filled in; a name
        the route does not declare is refused (a typo such as ?limt=10 must
        not be silently ignored), and so is a missing required one."""
        known = {p.name: p for p in self.query}
        unknown = sorted(set(query) - set(known))
        if unknown:
            message = f"unknown query parameter(s): {', '.join(unknown)}"
            raise ApiError(400, "invalid_query", message)
        parsed: dict[str, Any] = {}
        for name, param in known.items():
            values = query.get(name)
            if values:
                parsed[name] = param.parse(values[-1])
            elif param.required:
                message = f"{name} is required: {param.rule()}"
                raise ApiError(400, param.code or f"invalid_{name}", message)
            else:
                parsed[name] = param.default
        return parsed


@dataclass(frozen=True)
class Resolution:
    """Where a request goes. `status`: 200 a route takes it (`route`,
    `args`); 204 it asked OPTIONS of a served path; 405 the path is served
    but not with this method; 404 no route serves the path."""

    status: Literal[200, 204, 404, 405]
    route: Route | None = None
    args: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    """What the path accepts, HEAD included when GET is (empty for a 404)."""
    public: bool = False
    """Whether what the path serves is public: the route taken, or on a 405
    every route on the path."""

    @property
    def allow(self) -> str:
        """The `allow` header of a 204 or a 405."""
        return ", ".join(("OPTIONS", *self.methods))


class Router:
    """Resolves a method and path against a table of routes. Order matters
    only where two templates could match the same path: the first wins."""

    def __init__(self, routes: Iterable[Route], *, canonical: bool = False) -> None:
        self.routes = tuple(routes)
        self.canonical = canonical
        """Serve each path under one spelling only (the module's docstring)."""

    def resolve(self, method: str, path: str) -> Resolution:
        found = [
            (r, args)
            for r in self.routes
            if (args := r.match(path, canonical=self.canonical)) is not None
        ]
        if not found:
            return Resolution(404)
        declared = tuple(dict.fromkeys(r.method for r, _ in found))
        methods = (*declared, "HEAD") if "GET" in declared else declared
        if method == "OPTIONS":
            return Resolution(204, methods=methods)
        wanted = "GET" if method == "HEAD" else method
        for route, args in found:
            if route.method == wanted:
                return Resolution(200, route, args, methods, public=route.public)
        return Resolution(405, methods=methods, public=all(r.public for r, _ in found))


def options_reply(resolution: Resolution) -> Reply:
    """The answer to OPTIONS on a served path: what it accepts, nothing
    else (no credential needed to ask)."""
    return Reply(204, None, {"allow": resolution.allow})


def without_body(method: str, reply: Reply) -> Reply:
    """A HEAD answer is its GET's, status and headers, with no body: the
    same for an error, as a HEAD response carries no content on the wire."""
    if method == "HEAD":
        reply.body = None
    return reply
