"""One logger: the `d1queue` logger writes one JSON line per event, an
application sets its level or handler as for any library, and the library
itself never prints."""

from __future__ import annotations

import ast
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from d1queue.core.log import JsonLines, event, get, install

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def clean_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("d1queue")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    yield logger
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_an_event_is_one_json_line_with_its_fields(clean_logger: logging.Logger) -> None:
    out = io.StringIO()
    install(stream=out)
    log = get("d1queue.worker")
    event(log, "d1queue.drain", claimed=3, shard=0, schedules={"due": 1})
    event(log, "d1queue.settle.failed", logging.ERROR, id="x", error="boom\nline two")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first == {
        "event": "d1queue.drain",
        "claimed": 3,
        "shard": 0,
        "schedules": {"due": 1},
        "level": "info",
    }
    assert lines[0].startswith('{"event":"d1queue.drain"')
    assert second["error"] == "boom\nline two" and second["level"] == "error"


def test_the_application_sets_level_and_handler(clean_logger: logging.Logger) -> None:
    mine = io.StringIO()
    handler = logging.StreamHandler(mine)
    handler.setFormatter(JsonLines())
    clean_logger.addHandler(handler)
    install()  # an application's handler is kept: no second one
    assert clean_logger.handlers == [handler]
    clean_logger.setLevel(logging.WARNING)
    event(get("d1queue.worker"), "d1queue.drain", claimed=1)
    event(get("d1queue.outbound"), "d1queue.outbound.refused", logging.WARNING, why="x")
    (line,) = mine.getvalue().splitlines()
    assert json.loads(line)["event"] == "d1queue.outbound.refused"


def test_install_is_idempotent(clean_logger: logging.Logger) -> None:
    out = io.StringIO()
    install(stream=out)
    install(stream=out)
    event(get("x"), "d1queue.x")
    assert len(out.getvalue().splitlines()) == 1


def test_a_plain_record_and_an_exception_are_json_too(clean_logger: logging.Logger) -> None:
    out = io.StringIO()
    install(stream=out)
    try:
        raise ValueError("bad")
    except ValueError:
        get("d1queue.dashboard.app").exception("GET %s failed", "/ui")
    body = json.loads(out.getvalue())
    assert body["event"] == "d1queue.dashboard.app" and body["message"] == "GET /ui failed"
    assert "ValueError: bad" in body["traceback"]


def test_the_library_never_prints() -> None:
    calls = []
    for path in [*(SRC / "d1queue").rglob("*.py"), SRC / "entry.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "print"
            ):
                calls.append(f"{path.name}:{node.lineno}")
    assert calls == []
