"""The route table and the OpenAPI document agree, under CPython (no runtime
host): every routed operation is documented and every documented one routed,
each operation's query parameters are its route's, the API accepts and
refuses exactly what the document says, and the names and limits the
document states are bounds.py's."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import D1Queue
from d1queue.core import bounds
from d1queue.interfaces.api import ROUTES, Api, QueryParam, Route
from d1queue.interfaces.openapi import SPEC, document
from d1queue.interfaces.service import ApiError, Service
from d1queue.interfaces.testing import SqliteD1

from .test_api import TOKEN, Client, registry

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
DOC = document(["t.echo", "t.boom"])


@pytest.fixture
def client(db: SqliteD1, queue: D1Queue) -> Client:
    return Client(Api(Service(queue, registry()), TOKEN, "1", DOC), db)


def operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in METHODS
    }


def test_every_route_is_documented_and_every_documented_operation_is_routed() -> None:
    routed = {(r.method, r.path) for r in ROUTES}
    assert len(routed) == len(ROUTES), "no route twice"
    # / and /health are public routes beside the table, documented by hand.
    assert operations(DOC) == routed | {("GET", "/"), ("GET", "/health")}
    assert operations(SPEC) == operations(DOC)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_each_operation_has_its_routes_parameters(route: Route) -> None:
    item = DOC["paths"][route.path]
    op = item[route.method.lower()]
    path_params = [p["name"] for p in item.get("parameters", []) if p["in"] == "path"]
    assert path_params == route.path_params
    query = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "query"}
    assert list(query) == [q.name for q in route.query]
    for q in route.query:
        assert query[q.name]["schema"] == q.schema()
        assert query[q.name]["required"] is q.required


def test_the_documented_names_and_limits_come_from_bounds() -> None:
    name = f"^{bounds.NAME_RULE}$"
    failed = {p["name"]: p["schema"] for p in DOC["paths"]["/v1/failed"]["get"]["parameters"]}
    # A filter reads: any name a row may have, dots alone too (no path holds it).
    assert failed["queue"]["pattern"] == f"^{bounds.STORED_NAME_RULE}$"
    assert (failed["limit"]["minimum"], failed["limit"]["maximum"]) == (1, bounds.MAX_PAGE)
    (older,) = DOC["paths"]["/v1/failed"]["delete"]["parameters"]
    assert older["required"] is True
    assert older["schema"]["maximum"] == bounds.MAX_OLDER_THAN_S
    (queue_param,) = DOC["paths"]["/v1/queues/{queue}"]["parameters"]
    assert queue_param["schema"]["pattern"] == name
    schemas = DOC["components"]["schemas"]
    for schema in ("Job", "JobByName"):
        props = schemas[schema]["properties"]
        assert props["unique_key"]["maxLength"] == bounds.MAX_UNIQUE_KEY
        assert props["delay_s"]["maximum"] == bounds.MAX_DELAY_S
        assert props["max_attempts"]["maximum"] == bounds.MAX_ATTEMPTS
        priority = props["priority"]
        assert (priority["minimum"], priority["maximum"]) == bounds.PRIORITY_RANGE
    assert schemas["JobByName"]["properties"]["queue"]["pattern"] == name
    assert SPEC["components"]["schemas"]["Job"]["properties"]["name"]["pattern"] == name
    batch = DOC["paths"]["/v1/queues/{queue}/jobs/batch"]["post"]["requestBody"]
    jobs = batch["content"]["application/json"]["schema"]["properties"]["jobs"]
    assert jobs["maxItems"] == bounds.MAX_BATCH


def _url(route: Route, query: str) -> str:
    path = route.path.replace("{queue}", "q").replace("{id}", "0123")
    return f"{path}?{query}" if query else path


def _edge(param: QueryParam) -> tuple[str, str]:
    """A value the document allows at its very edge, and one just past it."""
    if param.type == "string":
        assert param.pattern is not None
        if param.name == "window":
            return "7d", "2d"
        return ("q" if param.name == "queue" else "1:x"), "a b"
    assert param.maximum is not None
    return str(param.maximum), str(param.maximum + 1)


def _required(route: Route, but: str = "") -> list[str]:
    return [f"{q.name}={q.minimum or 0}" for q in route.query if q.required and q.name != but]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
async def test_the_api_takes_exactly_the_documented_query_parameters(
    client: Client, route: Route
) -> None:
    documented = {
        p["name"]
        for p in DOC["paths"][route.path][route.method.lower()].get("parameters", [])
        if p["in"] == "query"
    }
    before = client.counts()
    # An undocumented parameter is refused before anything runs.
    r = await client(route.method, _url(route, "&".join([*_required(route), "extra=1"])))
    assert (r.status, r.body["error"]["code"]) == (400, "invalid_query")
    assert "extra" in r.body["error"]["message"]
    for param in route.query:
        assert param.name in documented
        good, bad = _edge(param)
        # The route itself refuses what the document rules out (the service
        # checks again for Python and RPC callers, so the replies alone
        # would not show which layer did).
        others = {q.name: [str(q.minimum or 0)] for q in route.query if q.required}
        with pytest.raises(ApiError) as refused:
            route.parse_query({**others, param.name: [bad]})
        assert refused.value.code == f"invalid_{param.name}"
        assert param.name in route.parse_query({**others, param.name: [good]})
        ok = await client(
            route.method,
            _url(route, "&".join([*_required(route, param.name), f"{param.name}={good}"])),
        )
        assert ok.status == 200, (param.name, ok.body)
        r = await client(
            route.method,
            _url(route, "&".join([*_required(route, param.name), f"{param.name}={bad}"])),
        )
        assert (r.status, r.body["error"]["code"]) == (400, f"invalid_{param.name}"), r.body
        if param.required:
            r = await client(route.method, _url(route, "&".join(_required(route, param.name))))
            assert (r.status, r.body["error"]["code"]) == (400, f"invalid_{param.name}")
    assert client.counts() == before, "a refused query writes nothing"


@pytest.mark.parametrize("raw", ["inf", "nan", "1_0", " 5", "0x10", "1e999", ""])
def test_numbers_in_a_query_are_json_numbers(raw: str) -> None:
    param = QueryParam("n", "number", minimum=0, maximum=10**12)
    with pytest.raises(ApiError, match="n must be a number from 0 to"):
        param.parse(raw)
    assert param.parse("1e3") == 1000.0 and param.parse("0.5") == 0.5
