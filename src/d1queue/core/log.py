"""d1queue's one logger: the standard `logging` module, one JSON line per event.

Every module logs through a child of the `d1queue` logger with `event`:

    event(log, "d1queue.drain", claimed=3, completed=3)

which the formatter writes as one line, `{"event": "d1queue.drain",
"claimed": 3, "completed": 3, "level": "info"}`: what `wrangler tail`,
Logpush and the offline host read. An application treats the `d1queue`
logger as any library's: it may set its level (`logging.getLogger(
"d1queue").setLevel(logging.WARNING)` drops the per-run reports) or attach
its own handler. The Worker glue calls `install()`, which gives the logger a
handler writing JSON lines to stdout (the Worker's console) if the
application has not given it one.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

ROOT = "d1queue"

_FIELDS = "d1queue_fields"


def get(name: str) -> logging.Logger:
    """The logger of module `name` (a child of `d1queue`)."""
    return logging.getLogger(name if name.startswith(ROOT) else f"{ROOT}.{name}")


def event(logger: logging.Logger, name: str, level: int = logging.INFO, /, **fields: Any) -> None:
    """Log event `name` with `fields` (JSON-able; others are written as
    their str(); positional-only parameters, so a field may be called
    `name`). Costs nothing past a level check when the level is off."""
    if logger.isEnabledFor(level):
        logger.log(level, name, extra={_FIELDS: fields})


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The fields an `event` call attached to its record ({} for others)."""
    return dict(getattr(record, _FIELDS, None) or {})


class JsonLines(logging.Formatter):
    """One JSON object per record, on one line: `event` first, then the
    event's fields, then `level`; a record not made by `event` is written as
    its logger's name and message; an exception as its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, _FIELDS, None)
        if fields is None:
            body: dict[str, Any] = {"event": record.name, "message": record.getMessage()}
        else:
            body = {"event": record.getMessage(), **fields}
        body["level"] = record.levelname.lower()
        if record.exc_info:
            body["traceback"] = self.formatException(record.exc_info)
        return json.dumps(body, separators=(",", ":"), default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `install` adds: JSON lines on `stream`, or on whatever
    sys.stdout is when a record is written (console.log in a Worker; a test
    runner may swap it after import)."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__(stream or sys.stdout)
        self._follow = stream is None

    def emit(self, record: logging.LogRecord) -> None:
        if self._follow:
            self.stream = sys.stdout
        super().emit(record)


def install(
    name: str = ROOT, level: int = logging.INFO, stream: TextIO | None = None
) -> logging.Logger:
    """Give logger `name` (`d1queue`, or an application's own such as its
    jobs') a JSON-lines handler on `stream` (stdout) at `level`, unless it
    already has a handler: an application that set its own keeps it.
    Idempotent: a Worker calls it on every invocation."""
    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = _Handler(stream)
        handler.setFormatter(JsonLines())
        logger.addHandler(handler)
        logger.propagate = False  # one line per event, not a second through the root's
        if logger.level == logging.NOTSET:
            logger.setLevel(level)
    return logger
