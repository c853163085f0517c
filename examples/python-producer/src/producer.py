"""What the producer does, without the Workers SDK (so it runs under CPython
too): check a request's body, push the one job this producer knows, read
its state back, and answer.

The producer's URL is public: anyone can POST to it, and it pushes with the
d1queue Worker's full authority (its service binding or token). So nothing
the caller sends chooses what runs or how:

- the job's name and queue are fixed here. A name taken from the request
  would let anyone run any handler, `http.request` among them, which makes
  the d1queue Worker send requests to whatever its D1QUEUE_HTTP_ALLOW permits;
- the body is at most MAX_BODY_BYTES (entry.py stops reading there), and
  its nesting is checked before it is parsed: a few thousand levels overflow
  Pyodide's parser, which no `except` catches, and the Worker does not
  survive it;
- only the expected fields are read, each of its type and size, and they
  become the payload and unique key; no option (delay, priority, group,
  after...) comes from the caller. Anything else is a 4xx naming the problem
  and pushes nothing;
- the answer holds the job's id and state, never its payload, and a refusal
  from d1queue is logged, not passed on (its message is for the operator).
"""

from __future__ import annotations

import json
import re
from typing import Any

from d1queue.core.bounds import json_depth
from d1queue.core.log import event, install
from d1queue.interfaces.client import Client, ClientError

JOB = "example.echo"
"""The one job this producer pushes."""

QUEUE = "echo"
"""The queue it pushes to."""

MAX_BODY_BYTES = 1024
"""A request body: {"message": ..., "unique_key": ...} fits with room to spare."""

MAX_MESSAGE_CHARS = 200

UNIQUE_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""The caller's idempotency key: a retried request pushes the job once."""

FIELDS = {"message": True, "unique_key": False}
"""The body's fields, and whether each is required."""

log = install("producer")


class Refused(Exception):
    """A request this producer does not push: `status`, `code`, `message`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def answer(self) -> tuple[int, dict[str, Any]]:
        return self.status, {"error": {"code": self.code, "message": self.message}}


def too_large() -> Refused:
    return Refused(413, "payload_too_large", f"the body exceeds {MAX_BODY_BYTES} bytes")


def checked(body: bytes) -> tuple[str, str | None]:
    """The request's message and unique key, or Refused: the body is a JSON
    object holding `message` (a string of 1 to MAX_MESSAGE_CHARS characters)
    and perhaps `unique_key` (UNIQUE_KEY), and nothing else."""
    if len(body) > MAX_BODY_BYTES:
        raise too_large()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(400, "malformed_json", "the body is not UTF-8") from None
    # Before parsing: the expected body is one flat object.
    if json_depth(text) > 1:
        raise Refused(
            422,
            "too_deep",
            'the body is one flat object, {"message": "...", "unique_key": "..."}: '
            "no object or array inside it",
        )
    try:
        request = json.loads(text)
    except ValueError as exc:
        raise Refused(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise Refused(400, "malformed_json", 'the body is a JSON object: {"message": "..."}')
    unknown = sorted(set(request) - set(FIELDS))
    if unknown:
        raise Refused(
            422,
            "invalid",
            f"unknown field(s): {', '.join(unknown)}; the body holds message and unique_key only",
        )
    missing = [name for name, required in FIELDS.items() if required and name not in request]
    if missing:
        raise Refused(422, "invalid", f"missing field(s): {', '.join(missing)}")
    message = request["message"]
    if not isinstance(message, str) or not 1 <= len(message) <= MAX_MESSAGE_CHARS:
        raise Refused(422, "invalid", f"message is a string of 1 to {MAX_MESSAGE_CHARS} characters")
    key = request.get("unique_key")
    if key is not None and not (isinstance(key, str) and UNIQUE_KEY.fullmatch(key)):
        raise Refused(422, "invalid", f"unique_key is a string matching {UNIQUE_KEY.pattern}")
    return message, key


async def push(client: Client, body: bytes) -> tuple[int, dict[str, Any]]:
    """Push JOB for the request `body` (its raw bytes). Answers (status,
    body): 201 {id, deduplicated, state} (200 when `unique_key` found the job
    already queued), or a 4xx naming what the body got wrong, nothing pushed."""
    try:
        message, key = checked(body)
    except Refused as refused:
        return refused.answer()
    options = {"unique_key": key} if key is not None else {}
    try:
        pushed = await client.push(QUEUE, JOB, {"message": message}, **options)
        state = await client.job(pushed["id"])
    except ClientError as exc:
        event(log, "producer.refused", status=exc.status, code=exc.code, error=exc.message)
        return 502, {"error": {"code": "not_queued", "message": "the job was not queued"}}
    answer = {"id": pushed["id"], "deduplicated": pushed["deduplicated"], "state": state["state"]}
    return (200 if pushed["deduplicated"] else 201), answer
