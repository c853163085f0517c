"""clients/ts/index.d.ts: TypeScript types for the Workers that push to d1queue,
generated from the OpenAPI document (interfaces/openapi.py, built here under
CPython from the same route table the Worker serves) and from the RPC
entrypoint's methods (read by AST from RPC_SOURCE, never imported: that
module imports the `workers` SDK, which CPython does not have).

    python tools/ts_types.py            # print the file
    python tools/ts_types.py --write    # write clients/ts/index.d.ts
    python tools/ts_types.py --check    # exit 1 if the committed file differs

Deterministic: the same document and methods give the same bytes, so a test
(tests/test_ts_types.py) regenerates and fails on any difference.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from d1queue.interfaces.openapi import SPEC  # noqa: E402

RPC_SOURCE = REPO / "src" / "d1queue" / "interfaces" / "cloudflare.py"
"""The file holding d1queue's RPC entrypoint: the one class in it deriving
from `WorkerEntrypoint`. Its public methods, the runtime's handlers (HANDLERS)
aside, are the RPC methods a service binding exposes. Repoint this when the
class moves."""

OUTPUT = REPO / "clients" / "ts" / "index.d.ts"

HANDLERS = frozenset({"fetch", "scheduled", "queue", "email", "tail", "trace", "test"})
"""Methods the runtime calls on a WorkerEntrypoint: not RPC methods."""

GENERIC = frozenset({"Job", "JobByName", "CallbackJob", "ScheduleIn", "BatchIn", "BatchJobs"})
"""Schemas whose `name` is a registered job name, or that hold such jobs:
generic in it (`N`), so a caller can narrow names to its deployment's
(`D1Queue<"mail.send">`)."""

TS_NAMES = {"Error": "ErrorBody"}
"""Schema names that would shadow a TypeScript global."""

SUCCESS = ("200", "201", "202", "204")


@dataclass(frozen=True)
class Arg:
    """Where an RPC argument's type comes from in the document: `kind` is
    "path" (a path parameter of `op`), "body" (its request body, or the
    body's property `name` when `prop` is set), "query" (a query parameter),
    or "json" (the body as JSON text)."""

    kind: str
    op: str
    prop: str | None = None


@dataclass(frozen=True)
class Method:
    args: dict[str, Arg]
    results: tuple[str, ...]
    """operationIds whose success answers the method returns."""
    note: str = ""
    overrides: dict[str, str] = field(default_factory=dict)


RPC: dict[str, Method] = {
    "dispatch": Method(
        {"queue": Arg("path", "dispatch", "queue"), "job": Arg("body", "dispatch")},
        ("dispatch",),
    ),
    "dispatch_job": Method({"job": Arg("body", "dispatchJob")}, ("dispatchJob",)),
    "dispatch_json": Method(
        {"queue": Arg("path", "dispatch", "queue"), "job": Arg("json", "dispatch")},
        ("dispatch",),
        "`dispatch` with the job as JSON text, checked for size and depth before it is "
        "parsed: use it for input the calling Worker did not build itself (an object "
        "argument nested past ~1,000 levels fails in the runtime's conversion).",
    ),
    "dispatch_batch": Method(
        {
            "queue": Arg("path", "dispatchBatch", "queue"),
            "jobs": Arg("body", "dispatchBatch", "jobs"),
        },
        ("dispatchBatch",),
    ),
    "stats": Method(
        {"queue": Arg("path", "queueStats", "queue")},
        ("queues", "queueStats"),
        "Without a queue: every queue (`{queues}`); with one: that queue's stats.",
    ),
    "metrics": Method(
        {
            "window": Arg("query", "metrics", "window"),
            "queue": Arg("query", "metrics", "queue"),
            "name": Arg("query", "metrics", "name"),
        },
        ("metrics",),
    ),
    "limits": Method({"queue": Arg("path", "limits", "queue")}, ("limits",)),
    "set_limits": Method(
        {"queue": Arg("path", "setLimits", "queue"), "limits": Arg("body", "setLimits")},
        ("setLimits",),
    ),
    "job": Method({"id": Arg("path", "job", "id")}, ("job",)),
    "completed": Method(
        {
            "queue": Arg("path", "completed", "queue"),
            "limit": Arg("query", "completed", "limit"),
            "cursor": Arg("query", "completed", "cursor"),
        },
        ("completed",),
    ),
    "batch": Method({"batch": Arg("body", "createBatch")}, ("createBatch",)),
    "batch_state": Method({"id": Arg("path", "batchState", "id")}, ("batchState",)),
    "add_to_batch": Method(
        {"id": Arg("path", "addToBatch", "id"), "jobs": Arg("body", "addToBatch", "jobs")},
        ("addToBatch",),
    ),
    "cancel": Method({"id": Arg("path", "cancel", "id")}, ("cancel",)),
    "retry_failed": Method({"id": Arg("path", "retryFailed", "id")}, ("retryFailed",)),
    "put_schedule": Method(
        {"schedule": Arg("body", "putSchedule")},
        ("putSchedule",),
        "The answer's `created` says whether it was new or replaced one.",
    ),
    "schedules": Method(
        {
            "limit": Arg("query", "schedules", "limit"),
            "cursor": Arg("query", "schedules", "cursor"),
        },
        ("schedules",),
    ),
    "schedule": Method({"id": Arg("path", "schedule", "id")}, ("schedule",)),
    "delete_schedule": Method({"id": Arg("path", "deleteSchedule", "id")}, ("deleteSchedule",)),
    "pause_schedule": Method({"id": Arg("path", "pauseSchedule", "id")}, ("pauseSchedule",)),
    "resume_schedule": Method({"id": Arg("path", "resumeSchedule", "id")}, ("resumeSchedule",)),
}
"""Each RPC method's arguments and answer, as the HTTP operation it mirrors
(by operationId). A method missing here, or an argument named differently
from the Python method's, fails generation: the types cannot drift."""


@dataclass(frozen=True)
class PyMethod:
    name: str
    params: tuple[tuple[str, str], ...]
    """(name, "" | "optional" | "nullable") per parameter after self: no
    default, a default, a default of None (null is then the default too)."""


def rpc_methods(source: Path = RPC_SOURCE) -> list[PyMethod]:
    """The RPC methods of the one WorkerEntrypoint subclass in `source`, in
    source order: public `def`/`async def`s, the runtime's handlers aside."""
    tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    classes = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(_base_name(b) == "WorkerEntrypoint" for b in node.bases)
    ]
    if len(classes) != 1:
        raise SystemExit(
            f"{source}: expected one WorkerEntrypoint subclass, found {len(classes)} "
            "(repoint RPC_SOURCE in tools/ts_types.py)"
        )
    methods = []
    for node in classes[0].body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.name.startswith("_") or node.name in HANDLERS:
            continue
        a = node.args
        positional = [*a.posonlyargs, *a.args][1:]  # after self
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
        defaults += a.defaults
        pairs = [
            *zip(positional, defaults, strict=True),
            *zip(a.kwonlyargs, a.kw_defaults, strict=True),
        ]
        params = [(p.arg, _optional(d)) for p, d in pairs]
        methods.append(PyMethod(node.name, tuple(params)))
    return methods


def _optional(default: ast.expr | None) -> str:
    if default is None:
        return ""
    if isinstance(default, ast.Constant) and default.value is None:
        return "nullable"
    return "optional"


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


# -- JSON Schema to TypeScript ------------------------------------------------------


def _name(ref: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    ts = TS_NAMES.get(name, name)
    return f"{ts}<N>" if name in GENERIC else ts


def _literal(value: Any) -> str:
    return json.dumps(value)


def _comment(text: str, indent: str) -> str:
    text = text.replace("*/", "*\\/")
    lines = text.splitlines() or [""]
    if len(lines) == 1 and len(text) + len(indent) < 92:
        return f"{indent}/** {text} */\n"
    return (
        f"{indent}/**\n"
        + "".join(f"{indent} * {line}".rstrip() + "\n" for line in lines)
        + f"{indent} */\n"
    )


def _doc(schema: dict[str, Any]) -> str:
    """A property's JSDoc: its description, then its limits."""
    parts = []
    if "description" in schema:
        parts.append(str(schema["description"]))
    limits = []
    for key in ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"):
        if key in schema:
            limits.append(f"{key} {schema[key]}")
    if "pattern" in schema:
        limits.append(f"pattern `{schema['pattern']}`")
    if "default" in schema:
        limits.append(f"default {_literal(schema['default'])}")
    if limits:
        parts.append("; ".join(limits))
    if schema.get("deprecated"):
        parts.append("@deprecated")  # editors strike the old name through; it still type-checks
    return "\n".join(parts)


def ts_type(schema: dict[str, Any], indent: str = "", name_param: bool = False) -> str:
    """The TypeScript type of a JSON Schema (the subset openapi.py uses).
    `name_param`: this object's `name` property is the job-name parameter N."""
    if "$ref" in schema:
        return _name(schema["$ref"])
    if "const" in schema:
        return _literal(schema["const"])
    if "enum" in schema:
        return " | ".join(_literal(v) for v in schema["enum"]) or "never"
    for union in ("oneOf", "anyOf"):
        if union in schema:
            return " | ".join(ts_type(s, indent) for s in schema[union])
    kind = schema.get("type")
    if kind is None:
        return "Json"  # any JSON value
    if isinstance(kind, list):
        return " | ".join(ts_type({**schema, "type": k}, indent) for k in kind)
    if kind in ("integer", "number"):
        return "number"
    if kind in ("string", "boolean", "null"):
        return str(kind)
    if kind == "array":
        item = ts_type(schema.get("items", {}), indent)
        return f"Array<{item}>" if " " in item else f"{item}[]"
    if kind == "object":
        props = schema.get("properties")
        if not props:
            return "JsonObject"
        required = set(schema.get("required", ()))
        inner = indent + "  "
        out = "{\n"
        for prop, sub in props.items():
            doc = _doc(sub)
            if doc:
                out += _comment(doc, inner)
            t = "N" if name_param and prop == "name" else ts_type(sub, inner)
            out += f"{inner}{prop}{'' if prop in required else '?'}: {t};\n"
        return out + indent + "}"
    raise SystemExit(f"no TypeScript type for schema {schema!r}")


# -- the file -----------------------------------------------------------------------

HEADER = """\
// d1queue's types for the Workers that push to it, over a service binding
// (RPC) or over HTTP. Generated by tools/ts_types.py from the OpenAPI
// document (GET /v1/openapi.json) and the RPC entrypoint's methods: do not
// edit; run `python tools/ts_types.py --write`.

/** Any JSON value: what a payload may be, and all that crosses RPC. */
export type Json = null | boolean | number | string | JsonArray | JsonObject;
// Interfaces, not inline types: TypeScript expands them lazily, so
// workers-types' Rpc.Serializable check on a result holding Json stays shallow.
export interface JsonArray extends Array<Json> {}
export interface JsonObject {
  [key: string]: Json;
}

"""


def _operations(doc: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """operationId -> (method, path, path item, operation), in document order."""
    found = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            op_id = op["operationId"]
            if op_id in found:
                raise SystemExit(f"operationId {op_id!r} twice")
            found[op_id] = (method.upper(), path, item, op)
    return found


def _body_schema(op: dict[str, Any]) -> dict[str, Any] | None:
    body = op.get("requestBody")
    if body is None:
        return None
    schema: dict[str, Any] = body["content"]["application/json"]["schema"]
    return schema


def _schema_of(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, its $ref followed."""
    if "$ref" in schema:
        resolved: dict[str, Any] = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        return resolved
    return schema


def _response_schema(doc: dict[str, Any], response: dict[str, Any]) -> dict[str, Any] | None:
    if "$ref" in response:
        response = doc["components"]["responses"][response["$ref"].rsplit("/", 1)[-1]]
    content = response.get("content")
    if content is None:
        return None
    schema: dict[str, Any] = content["application/json"]["schema"]
    return schema


def _ok(doc: dict[str, Any], op: dict[str, Any]) -> str:
    types: list[str] = []
    for status in SUCCESS:
        if status in op["responses"]:
            schema = _response_schema(doc, op["responses"][status])
            t = "null" if schema is None else ts_type(schema, "    ")
            if t not in types:
                types.append(t)
    return " | ".join(types)


def _schemas(doc: dict[str, Any]) -> str:
    out = "// -- Schemas (the document's components.schemas) --\n\n"
    for name, schema in doc["components"]["schemas"].items():
        if "description" in schema:
            out += _comment(schema["description"], "")
        ts_name = TS_NAMES.get(name, name)
        generic = "<N extends string = string>" if name in GENERIC else ""
        body = ts_type(schema, "", name_param=name in GENERIC)
        if body.startswith("{"):
            out += f"export interface {ts_name}{generic} {body}\n\n"
        else:
            out += f"export type {ts_name}{generic} = {body};\n\n"
    return out


def _routes(doc: dict[str, Any]) -> str:
    out = (
        "// -- HTTP: one entry per route, keyed by `METHOD path` --\n\n"
        "/**\n"
        " * Every route of the HTTP API. `params`: the path's parameters; `query`: the\n"
        " * query string's (send them as strings); `body`: the JSON request body\n"
        " * (`never`: none); `ok`: the success answer's body; `responses`: every\n"
        " * answer by status. Every route but /health needs\n"
        " * `Authorization: Bearer <D1QUEUE_TOKEN>`; every error is `ErrorBody`.\n"
        " */\n"
        "export interface Routes<N extends string = string> {\n"
    )
    for op_id, (method, path, item, op) in _operations(doc).items():
        out += _comment(f"{op['summary']} (operationId `{op_id}`)", "  ")
        out += f'  "{method} {path}": {{\n'
        out += f'    operationId: "{op_id}";\n'
        params = item.get("parameters", [])
        out += "    params: " + _param_object([p for p in params if p["in"] == "path"]) + ";\n"
        query = [p for p in op.get("parameters", []) if p["in"] == "query"]
        out += "    query: " + _param_object(query) + ";\n"
        body = _body_schema(op)
        out += "    body: " + ("never" if body is None else ts_type(body, "    ")) + ";\n"
        out += f"    ok: {_ok(doc, op)};\n"
        out += "    responses: {\n"
        for status, response in op["responses"].items():
            schema = _response_schema(doc, response)
            t = "null" if schema is None else ts_type(schema, "      ")
            out += f"      {status}: {t};\n"
        out += "    };\n  };\n"
    out += "}\n\n"
    out += (
        '/** A route\'s key, such as `"POST /v1/queues/{queue}/jobs"`. */\n'
        "export type Route = keyof Routes;\n\n"
        '/** The routes by operationId (`Operations["dispatch"]["body"]`). */\n'
        "export type Operations<N extends string = string> = {\n"
        '  [R in keyof Routes<N> as Routes<N>[R]["operationId"]]: Routes<N>[R];\n'
        "};\n\n"
    )
    return out


def _param_object(params: list[dict[str, Any]]) -> str:
    if not params:
        return "{}"
    fields = []
    for p in params:
        t = ts_type(p["schema"])
        fields.append(f"{p['name']}{'' if p.get('required') else '?'}: {t}")
    return "{ " + "; ".join(fields) + " }"


def _arg_type(doc: dict[str, Any], ops: dict[str, Any], arg: Arg) -> tuple[str, str]:
    """(TypeScript type, where it comes from) of an RPC argument."""
    method, path, item, op = ops[arg.op]
    where = f"{method} {path}"
    if arg.kind in ("path", "query"):
        params = item.get("parameters", []) if arg.kind == "path" else op.get("parameters", [])
        (param,) = [p for p in params if p["in"] == arg.kind and p["name"] == arg.prop]
        return ts_type(param["schema"]), f"the {arg.kind} parameter `{arg.prop}` of {where}"
    body = _body_schema(op)
    if body is None:
        raise SystemExit(f"{arg.op} has no request body")
    if arg.kind == "json":
        return "string", f"the body of {where} as JSON text"
    if arg.prop is None:
        return ts_type(body), f"the body of {where}"
    sub = _schema_of(doc, body)["properties"][arg.prop]
    return ts_type(sub), f"the body's `{arg.prop}` of {where}"


def _rpc(doc: dict[str, Any], methods: list[PyMethod]) -> str:
    ops = _operations(doc)
    names = [m.name for m in methods]
    missing = sorted(set(names) - set(RPC))
    gone = sorted(set(RPC) - set(names))
    if missing or gone:
        raise SystemExit(
            f"RPC methods without types in tools/ts_types.py RPC: {missing}; "
            f"typed methods no longer in {RPC_SOURCE.relative_to(REPO)}: {gone}"
        )
    out = (
        "// -- RPC: the entrypoint's methods, for a service binding --\n\n"
        "/**\n"
        " * d1queue's RPC entrypoint. Type the binding as `Service<D1Queue>`\n"
        ' * (@cloudflare/workers-types), or `Service<D1Queue<"mail.send" | ...>>` to\n'
        " * narrow job names to your deployment's. Each method validates as its HTTP\n"
        " * route does; a refusal rejects with an Error whose message is\n"
        " * `<code>: <message>`, the code the HTTP API would answer in\n"
        " * `ErrorBody.error.code`. Results are plain JSON objects.\n"
        " */\n"
        "export interface D1Queue<N extends string = string> {\n"
        "  /** Makes `Service<D1Queue>` an RPC binding (Rpc.WorkerEntrypointBranded). */\n"
        "  readonly __WORKER_ENTRYPOINT_BRAND: never;\n"
    )
    for py in methods:
        spec = RPC[py.name]
        declared = [p for p, _ in py.params]
        if declared != list(spec.args):
            raise SystemExit(
                f"RPC method {py.name}{tuple(declared)}: tools/ts_types.py types {tuple(spec.args)}"
            )
        args, sources = [], []
        for (pname, optional), arg in zip(py.params, spec.args.values(), strict=True):
            t, where = _arg_type(doc, ops, arg)
            if optional == "nullable":
                args.append(f"{pname}?: {t} | null")
            elif optional:
                # Omit it rather than pass undefined: undefined arrives in
                # Python as None, which is not this parameter's default.
                args.append(f"{pname}?: {t}")
            else:
                args.append(f"{pname}: {t}")
            sources.append(f"`{pname}`: {where}")
        results = []
        for op_id in spec.results:
            t = _ok(doc, ops[op_id][3])
            if t not in results:
                results.append(t)
        routes = ", ".join(f"{ops[o][0]} {ops[o][1]}" for o in spec.results)
        lines = [ops[spec.results[-1]][3]["summary"] + f" (as {routes})."]
        if spec.note:
            lines.append(spec.note)
        lines += sources
        out += _comment("\n".join(lines), "  ")
        out += f"  {py.name}({', '.join(args)}): Promise<{' | '.join(results)}>;\n"
    out += "}\n\n"
    out += (
        "/** The method names of `D1Queue`, in the entrypoint's order. */\n"
        "export type D1QueueMethod = " + " | ".join(f'"{m.name}"' for m in methods) + ";\n"
    )
    return out


def generate(doc: dict[str, Any] | None = None, source: Path = RPC_SOURCE) -> str:
    doc = SPEC if doc is None else doc
    return HEADER + _schemas(doc) + _routes(doc) + _rpc(doc, rpc_methods(source))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {OUTPUT.relative_to(REPO)}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(REPO)} is stale: run python tools/ts_types.py --write")
            return 1
        return 0
    if args.write:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text, encoding="utf-8")
        print(OUTPUT)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
