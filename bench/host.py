"""Running bench/inside.py in the Worker's Pyodide, through host/host.mjs.

`load(host)` copies this package's modules into the Pyodide file system (once
per host process); `call(host, "invocation", design="seed", ...)` runs
`bench.inside.<function>(env.DB, **kwargs)` there and returns its result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.runtime import conftest
from tests.runtime.conftest import Host

HERE = Path(__file__).resolve().parent
MODULES = ("__init__.py", "seed_driver.py", "inside.py")
PYODIDE_DIR = "/tmp/d1queue-bench"
CALL_TIMEOUT_S = 900.0


def allow_long_calls() -> None:
    """A drain of a deep backlog can take longer than the test suite's 60 s per
    request (the fixtures read the limit at every request); for bench/run.py,
    not for the tests."""
    conftest.REQUEST_TIMEOUT_S = max(conftest.REQUEST_TIMEOUT_S, CALL_TIMEOUT_S)


def load(host: Host) -> None:
    """Put the bench package on the Worker's sys.path (idempotent)."""
    files = {name: (HERE / name).read_text() for name in MODULES}
    host.python(
        f"""
import os, sys, importlib
FILES = {files!r}
async def main(env):
    os.makedirs({PYODIDE_DIR + "/bench"!r}, exist_ok=True)
    for name, text in FILES.items():
        with open({PYODIDE_DIR + "/bench/"!r} + name, "w") as f:
            f.write(text)
    if {PYODIDE_DIR!r} not in sys.path:
        sys.path.insert(0, {PYODIDE_DIR!r})
    importlib.invalidate_caches()
    import bench.inside
    return True
"""
    )


def call(host: Host, function: str, **kwargs: Any) -> Any:
    """bench.inside.<function>(env.DB, **kwargs), inside the Worker."""
    return host.python(
        f"""
import json
async def main(env):
    import bench.inside
    return await bench.inside.{function}(env.DB, **json.loads({json.dumps(kwargs)!r}))
"""
    )
