"""The JSON depth check's cost at the body limit: bounds.json_depth, which
every request body passes before it is parsed, on bodies of
api.MAX_BODY_BYTES (1 MiB), a normal job's and adversarial shapes
(bench.inside.depth_bodies), under CPython and in the Worker's Pyodide.

    .venv/bin/python bench/depth.py [--repeats 5] [--cpython-only]

Prints its lines of the bench's table; `make bench` (bench/run.py) runs it
too and puts them in its table and results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "src"))

from tests.runtime.conftest import start_host  # noqa: E402

from bench import host as bench_host  # noqa: E402
from bench import inside  # noqa: E402
from d1queue.interfaces.api import MAX_BODY_BYTES  # noqa: E402

Row = tuple[str, str, str, str, str, str]


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(repeats: int = 5, pyodide: bool = True) -> dict[str, Any]:
    """The check's least time of `repeats` on each body, under CPython (this
    process) and, unless `pyodide` is false, inside a host's Worker."""
    log(f"JSON depth check, {MAX_BODY_BYTES:,}-byte bodies: CPython")
    out = {"cpython": asyncio.run(inside.depth_check(None, MAX_BODY_BYTES, repeats))}
    if pyodide:
        log("JSON depth check: the Worker's Pyodide")
        host = start_host()
        try:
            bench_host.load(host)
            out["pyodide"] = bench_host.call(
                host, "depth_check", size=MAX_BODY_BYTES, repeats=repeats
            )
        finally:
            host.stop()
    return out


def rows(result: dict[str, Any]) -> list[Row]:
    """The table's lines: ms per check, Pyodide and CPython, per body."""
    cpy = result["cpython"]
    pyo = result.get("pyodide")
    size = f"{cpy['size'] // 1024:,} KiB"

    def cell(ms: float | None, other: float) -> str:
        return f"{ms:,.1f} ms; CPython {other:,.1f} ms" if ms is not None else f"{other:,.1f} ms"

    out: list[Row] = []
    for i, (body, ms) in enumerate(cpy["check_ms"].items()):
        label = f"JSON depth check (Pyodide; CPython): {body}" if i == 0 else f"  {body}"
        theirs = pyo["check_ms"][body] if pyo else None
        out.append((label, size, cell(theirs, ms), "", "", ""))
    parse = pyo["parse_normal_ms"] if pyo else None
    scale = cell(parse, cpy["parse_normal_ms"])
    out.append(("  for scale: json.loads of the normal job", size, scale, "", "", ""))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpython-only", action="store_true", help="no host: CPython alone")
    args = parser.parse_args()
    result = run(args.repeats, pyodide=not args.cpython_only)
    for row in rows(result):
        print(f"{row[0]:<70} {row[1]:>9} {row[2]:>28}")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
