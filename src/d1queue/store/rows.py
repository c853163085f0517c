"""The jobs table's rows as the store reads them: the columns a QueuedJob
is read from, in order, and the decoders of a row read by position (the
claim's candidates) or by name (every other read)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.bounds import MAX_JSON_DEPTH, json_depth, json_loads
from ..core.job import QueuedJob

JOB_COLUMN_NAMES = (
    "id",
    "queue",
    "name",
    "payload",
    "attempts",
    "max_attempts",
    "priority",
    "available_at",
    "reserved_at",
    "locked_until",
    "reservation",
    "created_at",
    "unique_key",
    "last_error",
    "band",
    "grp",
    "slot",
    "gslot",
    "after",
    "waiting",
    "batch",
    "dependents",
    "traceparent",
    "cancel_at",
)
"""The columns of a d1queue_jobs row as a QueuedJob is read from it, in the
order `values_to_job` unpacks them: sql.JOB_COLUMNS selects them in this
order, so the decoder and the SELECT cannot disagree on a position."""


def _after(text: Any) -> list[str] | None:
    """A row's `after` column (JSON text, or NULL) as a list of ids."""
    if not text:
        return None
    try:
        ids = json.loads(text)
    except ValueError:
        return None
    return [str(i) for i in ids] if isinstance(ids, list) else None


def stored_runs(text: Any) -> list[dict[str, Any]]:
    """A row's attempt history (`runs`, JSON text or NULL) as a list of its
    entries, oldest first (core/history.py); [] for none or for text that
    does not decode (written by something other than d1queue)."""
    if not text:
        return []
    try:
        runs = json.loads(text)
    except ValueError:
        return []
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def stored_progress(text: Any) -> dict[str, Any] | None:
    """A row's `progress` (JSON text or NULL) as a dict; None for none."""
    if not text:
        return None
    try:
        progress = json.loads(text)
    except ValueError:
        return None
    return progress if isinstance(progress, dict) else None


_new_job = object.__new__
_scan_json: Any = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def row_to_job(row: Mapping[str, Any]) -> QueuedJob:
    """A d1queue_jobs row read by name as a QueuedJob: `values_to_job` of
    its JOB_COLUMN_NAMES, with `ignore_failed`, which only a read of the
    whole row holds. An undecodable payload is kept as text and explained
    in `payload_error` instead of raising."""
    get = row.get
    job = values_to_job([get(c) for c in JOB_COLUMN_NAMES])
    job.ignore_failed = bool(get("ignore_failed"))
    return job


def values_to_job(values: Sequence[Any]) -> QueuedJob:
    """A d1queue_jobs row read `positional`ly (in JOB_COLUMN_NAMES' order, as
    sql.SELECT_CANDIDATES returns it) as a QueuedJob. Every claim decodes its
    candidates so: the usual row (a short text payload, int columns) without
    the dataclass's __init__ and json.loads' wrappers, most of a row's CPU in
    Pyodide, into the object __init__ would make. Anything else: `_row_to_job`."""
    (
        id_,
        queue,
        name,
        text,
        attempts,
        max_attempts,
        priority,
        available_at,
        reserved_at,
        locked_until,
        reservation,
        created_at,
        unique_key,
        last_error,
        band,
        grp,
        slot,
        gslot,
        after,
        waiting,
        batch,
        dependents,
        traceparent,
        cancel_at,
    ) = values
    if type(text) is not str or len(text) > MAX_JSON_DEPTH:
        return _row_to_job(dict(zip(JOB_COLUMN_NAMES, values, strict=True)))
    # A text no longer than the limit cannot nest past it.
    try:
        payload, end = _scan_json(text, 0)
    except (StopIteration, ValueError):
        end = -1
    locked_until = locked_until or 0
    if not (
        end == len(text)
        and type(locked_until) is int
        and type(available_at) is int
        and type(attempts) is int
        and type(max_attempts) is int
        and type(priority) is int
        and type(created_at) is int
    ):
        return _row_to_job(dict(zip(JOB_COLUMN_NAMES, values, strict=True)))
    held = reserved_at is not None
    job = _new_job(QueuedJob)
    job.__dict__ = {  # the fields in QueuedJob's order, as its __init__ sets them
        "name": name,
        "payload": payload,
        "queue": queue,
        "id": id_,
        "attempts": attempts,
        "max_attempts": max_attempts,
        "priority": priority,
        # When it runs next: the later of the two times (the locked band's agree).
        "available_at": available_at if held or available_at >= locked_until else locked_until,
        "created_at": created_at,
        "unique_key": unique_key,
        "reservation": reservation,
        "reserved_until": locked_until if held else None,
        "last_error": last_error,
        "held": held,
        "payload_error": None,
        "group": grp,
        "debounce_s": 0,
        "debounced": False,
        "slot": slot,
        "gslot": gslot,
        "band": band,
        "after": _after(after) if after else None,
        "ignore_failed": False,
        "batch": batch,
        "waiting": waiting or 0,
        "dependents": bool(dependents),
        "traceparent": traceparent,
        "started_at": 0,
        "ended_at": 0,
        "cancel_at": cancel_at,
    }
    return job


def _row_to_job(row: Mapping[str, Any]) -> QueuedJob:
    """row_to_job for any row: long payloads checked for depth, the stored
    payload kept when it does not decode, numbers made ints."""
    payload_error = None
    try:
        text = row["payload"]
        # A text no longer than the limit cannot nest past it: the scan is
        # skipped for the usual small payload (it is most of a row's CPU).
        if (
            isinstance(text, str)
            and len(text) > MAX_JSON_DEPTH
            and json_depth(text) > MAX_JSON_DEPTH
        ):
            # Written by something other than d1queue: parsing it could stop
            # the Worker's Python (see bounds.MAX_JSON_DEPTH).
            raise ValueError(f"nests deeper than {MAX_JSON_DEPTH} levels")
        payload = json_loads(text)
    except (TypeError, ValueError) as exc:
        payload, payload_error = row["payload"], f"undecodable payload: {exc}"
    held = row.get("reserved_at") is not None
    locked_until = int(row.get("locked_until") or 0)
    # When it runs next: the later of the two times (in the locked band they
    # agree: the key's time is the lock's end).
    available_at = int(row["available_at"])
    return QueuedJob(
        id=row["id"],
        name=row["name"],
        payload=payload,
        queue=row["queue"],
        attempts=int(row["attempts"]),
        max_attempts=int(row["max_attempts"]),
        priority=int(row["priority"]),
        available_at=available_at if held else max(available_at, locked_until),
        created_at=int(row["created_at"]),
        unique_key=row.get("unique_key"),
        reservation=row.get("reservation"),
        reserved_until=locked_until if held else None,
        held=held,
        last_error=row.get("last_error"),
        payload_error=payload_error,
        group=row.get("grp"),
        slot=row.get("slot"),
        gslot=row.get("gslot"),
        band=row.get("band"),
        after=_after(row.get("after")),
        ignore_failed=bool(row.get("ignore_failed")),
        batch=row.get("batch"),
        waiting=int(row.get("waiting") or 0),
        dependents=bool(row.get("dependents")),
        traceparent=row.get("traceparent"),
        cancel_at=row.get("cancel_at"),
    )
