"""An attempt as its job's history keeps it: the entry each settle that
keeps the job (a retry, a completion kept as history, a failure) appends to
the job's `runs` in the statement that writes it (store/sql.py `_runs_set`):
`{attempt, started_at, duration_ms, outcome, error?, progress?, logs?,
logs_truncated?}`, the latest MAX_RUNS kept. The append is keyed by the
attempt's number, so a settle re-sent after a lost reply appends nothing
more. What the handler adds (progress, log lines) is core/runs.py's."""

from __future__ import annotations

import json
from typing import Any

from .bounds import MAX_RUN_BYTES, MAX_RUN_ERROR_CHARS
from .outcomes import Outcome, ending
from .telemetry import OUTCOMES


def run_entry(outcome: Outcome, now: int, action: str | None = None) -> str:
    """The attempt's entry in its job's history, as JSON text: its number,
    start (now if it never started), run time, outcome (`action`'s word, or
    the outcome's), error (cut to MAX_RUN_ERROR_CHARS) and what its handler
    added (Outcome.record), at most MAX_RUN_BYTES (log lines dropped first)."""
    job = outcome.job
    started = job.started_at or now
    key = action or ending(outcome)
    word = OUTCOMES.get(key, key)
    head = (
        f'{{"attempt":{job.attempts},"started_at":{started},'
        f'"duration_ms":{job.run_ms},"outcome":"{word}"'
    )
    error, record = outcome.error, outcome.record
    if error is None and not record:
        return head + "}"  # the usual completion: no encoder run
    extra: dict[str, Any] = {}
    if error is not None:
        extra["error"] = error[:MAX_RUN_ERROR_CHARS]
    if record:
        extra.update(record)
        if "logs" in extra:
            # A copy: the outcome may be settled again (a re-send), whole.
            extra["logs"] = list(extra["logs"])
    text = head + "," + json.dumps(extra, separators=(",", ":"))[1:]
    while len(text) > MAX_RUN_BYTES:
        if extra.get("logs"):
            extra["logs"].pop()
            extra["logs_truncated"] = extra.get("logs_truncated", 0) + 1
        elif extra.get("error"):
            # Escaped past its length in characters (\uXXXX): halved until it fits.
            extra["error"] = extra["error"][: len(extra["error"]) // 2]
        elif "progress" in extra:
            del extra["progress"]
        else:  # the numbers alone: never this long
            break
        text = head + "," + json.dumps(extra, separators=(",", ":"))[1:]
    return text
