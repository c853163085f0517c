"""A scripted HTTP server on 127.0.0.1 for the http.request tests."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Server(http.server.ThreadingHTTPServer):
    """Answers each path from a script: a list of (status, headers, body, delay)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ScriptedHandler)
        self.script: dict[str, list[tuple[int, dict[str, str], str, float]]] = {}
        self.seen: list[tuple[str, str, str, str]] = []
        self.headers_seen: list[dict[str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class ScriptedHandler(http.server.BaseHTTPRequestHandler):
    server: Server

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode()
        self.server.seen.append((self.command, self.path, body, self.headers.get("x-k", "")))
        self.server.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
        steps = self.server.script.get(self.path) or [(200, {}, "ok", 0.0)]
        status, headers, text, delay = steps.pop(0) if len(steps) > 1 else steps[0]
        if delay:
            threading.Event().wait(delay)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(text.encode())))
        self.end_headers()
        self.wfile.write(text.encode())

    do_GET = do_POST = do_PUT = do_HEAD = _answer

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def running_server() -> Iterator[Server]:
    s = Server()
    threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield s
    finally:
        s.shutdown()
        s.server_close()
