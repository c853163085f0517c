"""An attempt as its job's history keeps it, and what a handler adds to it.

Each settle that keeps the job (a retry, a completion kept as history, a
failure) appends one entry for the attempt to the job's `runs`
(core/history.py builds it; store/sql.py `_runs_set` appends it).

A handler adds to its attempt through its ctx (context.py):

- `ctx.log`, a logging.Logger whose records are kept with the attempt, at
  most MAX_LOG_LINES lines and MAX_LOG_BYTES (the rest counted in
  `logs_truncated`), and are also JSON log lines with the job's id and
  trace (`Notes.line`);
- `ctx.progress(value, note)`, the attempt's latest progress: written to
  the job at most once per PROGRESS_INTERVAL_S while it runs (with the
  log lines so far), the rest coalesced, and the last value with the
  settle.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from .bounds import (
    MAX_LOG_BYTES,
    MAX_LOG_LINE_CHARS,
    MAX_LOG_LINES,
    MAX_PROGRESS_NOTE,
    MAX_SAFE_INT,
)
from .job import QueuedJob, now_ms, trace_fields
from .log import event, get

PROGRESS_INTERVAL_S = 2.0
"""A running job's progress is written at most once per this many seconds
(the first report at once); reports in between are coalesced into the next
write, or the settle's."""

SEQ_PER_ATTEMPT = 2**20
"""Progress writes are numbered `attempt * SEQ_PER_ATTEMPT + n`: a write
lands only over a lower number (sql.SET_PROGRESS), so a re-sent earlier
write never moves the progress back."""

JOB_LOGGER = "d1queue.job"
"""The logger of the JSON lines a handler's `ctx.log` records become."""

jlog = get(JOB_LOGGER)


def check_progress(value: Any, note: Any) -> tuple[int | float, str | None]:
    """A progress report's value (a fraction, or a count: a finite number
    from 0 to MAX_SAFE_INT) and note (None, or at most MAX_PROGRESS_NOTE
    characters); ValueError or TypeError saying what is wrong."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"progress must be a number (a fraction or a count), got {value!r}")
    if not (math.isfinite(value) and 0 <= value <= MAX_SAFE_INT):
        raise ValueError(f"progress must be a finite number from 0 to {MAX_SAFE_INT}: {value!r}")
    if note is not None:
        if not isinstance(note, str):
            raise TypeError(f"a progress note must be a string, got {type(note).__name__}")
        if len(note) > MAX_PROGRESS_NOTE:
            raise ValueError(
                f"a progress note is at most {MAX_PROGRESS_NOTE} characters; "
                f"this one has {len(note)}"
            )
    return value, note


class Capture(logging.Handler):
    """Keeps an attempt's log records as lines, bounded (MAX_LOG_LINES,
    MAX_LOG_BYTES: the rest only counted), and writes each as a JSON log
    line with the job's id and trace."""

    def __init__(self, job: QueuedJob) -> None:
        super().__init__(logging.DEBUG)
        self.job = job
        self.lines: list[dict[str, Any]] = []
        self.size = 0
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message = f"{message}: {type(exc).__name__}: {exc}"
        message = message[:MAX_LOG_LINE_CHARS]
        level = record.levelname.lower()
        at = int(record.created * 1000)
        job = self.job
        event(
            jlog,
            "d1queue.job.log",
            record.levelno,
            message=message,
            id=job.id,
            queue=job.queue,
            name=job.name,
            attempt=job.attempts,
            **trace_fields(job.traceparent),
        )
        line = {"at": at, "level": level, "message": message}
        size = len(json.dumps(line)) + 1
        if len(self.lines) >= MAX_LOG_LINES or self.size + size > MAX_LOG_BYTES:
            self.dropped += 1
            return
        self.lines.append(line)
        self.size += size


class Notes:
    """What one attempt's handler has added to its history so far: its
    log (made on first use) and its latest progress, and when the progress
    was last written to the job."""

    def __init__(self, job: QueuedJob, monotonic: Callable[[], float] | None = None) -> None:
        self.job = job
        self.monotonic = monotonic or time.monotonic
        self._log: logging.Logger | None = None
        self.capture: Capture | None = None
        self.progress: dict[str, Any] | None = None
        self.reports = 0
        self.written_at: float | None = None
        self.written = 0
        """Progress writes sent while the attempt ran."""

    @property
    def log(self) -> logging.Logger:
        if self._log is None:
            # Not registered with logging's manager (getLogger would keep
            # one logger per job for the life of the isolate): its own.
            logger = logging.Logger(f"{JOB_LOGGER}.{self.job.name}", logging.INFO)
            self.capture = Capture(self.job)
            logger.addHandler(self.capture)
            logger.propagate = False
            self._log = logger
        return self._log

    def report(self, value: Any, note: Any) -> bool:
        """Record a progress report; True if it is due to be written now
        (the first, or the first PROGRESS_INTERVAL_S after the last write)."""
        value, note = check_progress(value, note)
        progress: dict[str, Any] = {"value": value, "at": now_ms()}
        if note is not None:
            progress["note"] = note
        self.progress = progress
        self.reports += 1
        last = self.written_at
        return last is None or self.monotonic() - last >= PROGRESS_INTERVAL_S

    def live(self) -> tuple[str, int]:
        """The running job's progress as written to it now (with the log
        lines so far), and that write's sequence number."""
        self.written_at = self.monotonic()
        self.written += 1
        seq = self.job.attempts * SEQ_PER_ATTEMPT + min(self.reports, SEQ_PER_ATTEMPT - 1)
        body: dict[str, Any] = {"attempt": self.job.attempts, "seq": seq, **(self.progress or {})}
        body.update(self.logs())
        return json.dumps(body, separators=(",", ":")), seq

    def logs(self) -> dict[str, Any]:
        """The log lines kept so far and how many were not ({} for none)."""
        capture = self.capture
        if capture is None or not (capture.lines or capture.dropped):
            return {}
        out: dict[str, Any] = {"logs": list(capture.lines)}
        if capture.dropped:
            out["logs_truncated"] = capture.dropped
        return out

    def kept(self) -> dict[str, Any] | None:
        """What the attempt's entry carries from its handler (None: nothing)."""
        out = self.logs()
        if self.progress is not None:
            out["progress"] = {"attempt": self.job.attempts, **self.progress}
        return out or None
