"""examples/python-producer's logic (src/producer.py, no SDK) under CPython:
it pushes its one job through d1queue's client over a service binding to
the real Service, and refuses with a 4xx, pushing nothing, any body that is
not the one it expects: another job's name (http.request among them), a
queue or an option, a deep or oversized body."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from d1queue import D1Queue
from d1queue.interfaces.client import Client
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1

from .test_api import registry
from .test_client import Binding

PRODUCER = Path(__file__).resolve().parents[1] / "examples" / "python-producer" / "src"


def producer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("producer", PRODUCER / "producer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


def client(queue: D1Queue) -> Client:
    reg = registry()

    @reg.job("example.echo")
    async def echo(payload: Any) -> None: ...

    return Client.over_binding(Binding(Service(queue, reg)))


def jobs(db: SqliteD1) -> int:
    return int(db.query("SELECT COUNT(*) AS n FROM d1queue_jobs")[0]["n"])


async def test_the_python_producer_pushes_and_reads_back(queue: D1Queue, db: SqliteD1) -> None:
    p = producer()
    c = client(queue)
    status, answer = await p.push(c, body({"message": "hi", "unique_key": "k1"}))
    assert status == 201 and set(answer) == {"id", "deduplicated", "state"}
    assert (answer["deduplicated"], answer["state"]) == (False, "ready")
    stored = await c.job(answer["id"])
    assert (stored["name"], stored["queue"]) == ("example.echo", "echo")
    assert (stored["payload"], stored["unique_key"]) == ({"message": "hi"}, "k1")
    again, same = await p.push(c, body({"message": "hi again", "unique_key": "k1"}))
    assert again == 200 and same == {**answer, "deduplicated": True}
    assert jobs(db) == 1


REFUSED: list[tuple[str, bytes, int, str]] = [
    # (what, body, status, code)
    (
        "an http.request job",
        body({"name": "http.request", "payload": {"url": "http://127.0.0.1:9/x"}}),
        422,
        "too_deep",  # nested: refused before it is parsed
    ),
    ("an http.request name", body({"name": "http.request", "message": "hi"}), 422, "invalid"),
    ("another job's name", body({"name": "t.boom", "message": "hi"}), 422, "invalid"),
    ("a queue", body({"queue": "default", "message": "hi"}), 422, "invalid"),
    ("an option", body({"message": "hi", "delay_s": 3600}), 422, "invalid"),
    ("a payload", body({"message": "hi", "payload": 1}), 422, "invalid"),
    ("no message", body({"unique_key": "k"}), 422, "invalid"),
    ("a message not a string", body({"message": 7}), 422, "invalid"),
    ("an empty message", body({"message": ""}), 422, "invalid"),
    ("a long message", body({"message": "x" * 201}), 422, "invalid"),
    ("a bad unique key", body({"message": "hi", "unique_key": "a b"}), 422, "invalid"),
    ("a nested message", body({"message": {"text": "hi"}}), 422, "too_deep"),
    ("deep nesting", b'{"message": ' + b"[" * 400 + b"]" * 400 + b"}", 422, "too_deep"),
    ("too large", body({"message": "x" * 1100}), 413, "payload_too_large"),
    ("not JSON", b"message=hi", 400, "malformed_json"),
    ("not UTF-8", b'{"message": "\xff"}', 400, "malformed_json"),
    ("not an object", body(["message", "hi"]), 400, "malformed_json"),
    ("empty", b"", 400, "malformed_json"),
]


@pytest.mark.parametrize(
    ("what", "raw", "status", "code"), [pytest.param(*c, id=c[0]) for c in REFUSED]
)
async def test_anything_else_is_refused_and_nothing_is_pushed(
    what: str, raw: bytes, status: int, code: str, queue: D1Queue, db: SqliteD1
) -> None:
    got, answer = await producer().push(client(queue), raw)
    assert (got, answer["error"]["code"]) == (status, code), (what, answer)
    assert answer["error"]["message"]
    assert jobs(db) == 0, "nothing pushed"
