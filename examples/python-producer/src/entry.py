"""A Python Worker that pushes to d1queue: POST / with
{"message": "...", "unique_key": "..."?} pushes one example.echo job and
answers its id and state. The URL is public, so the body is read no further
than producer.MAX_BODY_BYTES and checked before anything is pushed
(producer.py says what, and why)."""

import json

from producer import MAX_BODY_BYTES, push, too_large
from pyodide import ffi
from workers import Response, WorkerEntrypoint

from d1queue.interfaces.client import Client

JS_NULL = getattr(ffi, "jsnull", None)


async def read_body(request, limit: int) -> bytes | None:
    """The request's body, or None when it holds more than `limit` bytes.
    Read from the stream and stopped there: a chunked body states no length,
    and `await request.text()` would hold all of it, whatever its size."""
    length = request.headers.get("content-length")
    if length is not None and str(length).isdigit() and int(str(length)) > limit:
        return None
    stream = getattr(request, "js_object", request).body
    if stream is None or stream is JS_NULL:  # a POST without a body
        return b""
    reader = stream.getReader()
    chunks, size = [], 0
    while True:
        chunk = await reader.read()
        if chunk.done:
            return b"".join(chunks)
        data = bytes(chunk.value.to_bytes())
        size += len(data)
        if size > limit:
            await reader.cancel()
            return None
        chunks.append(data)


def answer(status: int, body: dict, headers: dict | None = None) -> Response:
    return Response(
        json.dumps(body),
        status=status,
        headers={"content-type": "application/json", **(headers or {})},
    )


class Default(WorkerEntrypoint):
    def _client(self) -> Client:
        binding = getattr(self.env, "QUEUE", None)
        if binding is not None:
            return Client.over_binding(binding)
        return Client.over_http(str(self.env.D1QUEUE_URL), str(self.env.D1QUEUE_TOKEN))

    async def fetch(self, request):
        # The JS Request's method: the SDK's enum raises for an unusual one.
        if str(getattr(request, "js_object", request).method) != "POST":
            error = {"code": "method_not_allowed", "message": "POST a job"}
            return answer(405, {"error": error}, {"allow": "POST"})
        body = await read_body(request, MAX_BODY_BYTES)
        if body is None:
            return answer(*too_large().answer())
        return answer(*await push(self._client(), body))
