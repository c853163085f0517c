"""examples/python-producer's logic (src/producer.py, no SDK) under CPython:
it pushes through d1queue's client over a service binding to the real
Service, and answers a refusal with the API's status and body."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from d1queue import D1Queue
from d1queue.interfaces.client import Client
from d1queue.interfaces.service import Service

from .test_api import registry
from .test_client import Binding

PRODUCER = Path(__file__).resolve().parents[1] / "examples" / "python-producer" / "src"


def producer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("producer", PRODUCER / "producer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_python_producer_pushes_and_reads_back(queue: D1Queue) -> None:
    client = Client.over_binding(Binding(Service(queue, registry())))
    status, body = await producer().push(
        client, {"queue": "py", "name": "t.echo", "payload": {"n": 1}, "unique_key": "k"}
    )
    assert status == 201 and body["pushed"]["queue"] == "py"
    assert body["state"]["payload"] == {"n": 1} and body["state"]["unique_key"] == "k"
    status, body = await producer().push(client, {"queue": "py", "name": "nope"})
    assert status == 422 and body["error"]["code"] == "invalid"
