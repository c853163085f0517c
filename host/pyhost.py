"""The Python half of host/worker.mjs; runs inside Pyodide next to the Worker.

What workerd does around a Python Worker, done the same way here:

- `setup_search_path`: the upload's modules at /session/metadata, first on
  sys.path; its python_modules/ just before site-packages, and its .pth files
  processed when `python_process_pth_files` is on (workerd's
  setup_python_search_path.py).
- `load_worker`: the main module is imported with randomness refused, as when
  Cloudflare imports a Worker to take its memory snapshot (workerd's
  topLevelEntropy/entropy_patches.py): `os.urandom` raises OSError, calling
  anything in `random` but `Random`/`SystemRandom` raises RuntimeError, and an
  unseeded `Random()` raises too. All of it is lifted before the first request.
- `install_event_loop`: every step of Python's event loop goes through the
  host's scheduleCallback, which times it (limits.mjs).
- `resume`: after a memory snapshot of all this is restored in a new host
  (snapshot.mjs), what lives outside Python's memory is set again and
  `random` is reseeded, as workerd reseeds it before the first request.
- `call_method`: workerd's `wrapper_func` (introspection.py), through which
  it calls every method of a `WorkerEntrypoint` but the DO/legacy handlers:
  the JS arguments go through the SDK's `python_from_rpc`, the result through
  `python_to_rpc`; only `fetch` is called "relaxed" (extra arguments dropped
  if the method does not take them). `scheduled` and `queue` get
  `(event, undefined, undefined)`: a class-based Worker has env and ctx on
  `self` only.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import site
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from inspect import isawaitable
from types import ModuleType
from typing import Any

import pyodide.ffi
from pyodide.code import relaxed_call
from pyodide.ffi import JsProxy

jsnull: Any = getattr(pyodide.ffi, "jsnull", None)  # older Pyodide: JS null arrives as None

PYTHON_MODULES = "python_modules"

# ------------------------------------------------------------ search path --


def setup_search_path(worker_dir: str, process_pth_files: bool) -> None:
    os.chdir(worker_dir)
    sys.path.insert(0, worker_dir)
    vendored = f"{worker_dir}/{PYTHON_MODULES}"
    at = next((i for i, p in enumerate(sys.path) if "site-packages" in p), len(sys.path))
    sys.path.insert(at, vendored)
    if process_pth_files and os.path.isdir(vendored):
        site.addsitedir(vendored)


# -------------------------------------------------------------- event loop --

_pyodide_schedule: Any = None


def install_event_loop() -> None:
    """Route Python's event loop through the host's scheduleCallback."""
    import _d1queue_host_loop  # type: ignore[import-not-found]  # registered by worker.mjs
    import pyodide.webloop

    global _pyodide_schedule
    # Kept alive: Pyodide's memory snapshot expects its own scheduleCallback
    # at a fixed place in its table of JS references, which dropping the
    # last Python reference to it would free for another object.
    _pyodide_schedule = pyodide.webloop.scheduleCallback
    pyodide.webloop.scheduleCallback = _d1queue_host_loop.scheduleCallback


# ---------------------------------------------------------- memory snapshot --


def before_snapshot() -> None:
    """Nothing left in Python's output buffers: a restored host would print it again."""
    sys.stdout.flush()
    sys.stderr.flush()


def resume(worker_dir: str) -> None:
    """After a memory snapshot is restored into a new Pyodide: set again what
    lives outside Python's memory, in JS (the working directory, the files
    under sys.path, which were copied anew), and reseed `random`."""
    # loadPyodide puts "" first on sys.path again; the snapshot already has it.
    if sys.path[:1] == [""] and "" in sys.path[1:]:
        del sys.path[0]
    os.chdir(worker_dir)
    importlib.invalidate_caches()  # the upload's folders were made anew
    # The snapshot holds the generator state `random` had when the snapshot
    # was taken: reseeded, or every host restored from it would draw the same
    # numbers. Its other generators were seeded explicitly (an unseeded one
    # is refused at import), and the hash seed cannot change once dicts exist.
    import random

    random.seed()


# ------------------------------------------------- randomness at import --

EIO = 29
_refused: list[str] = []
"""What was refused during the current load_worker."""


class _Guard:
    importing = False
    """True while the Worker's modules are imported."""


def _importing() -> bool:
    return _Guard.importing


class _ImportTimeModule:
    """What `import random` gives the Worker's modules while they are imported:
    the real module, whose functions refuse to run until the first request
    (and pass through from then on, as the module keeps this object)."""

    def __init__(self, module: ModuleType, allowed: tuple[str, ...]) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_allowed", allowed)

    def __getattribute__(self, name: str) -> Any:
        module: ModuleType = object.__getattribute__(self, "_module")
        value = getattr(module, name)
        if (
            not _importing()
            or not callable(value)
            or name in object.__getattribute__(self, "_allowed")
        ):
            return value

        @functools.wraps(value)
        def refused(*args: Any, **kwargs: Any) -> Any:
            if _importing():
                _refused.append(f"{module.__name__}.{name}()")
                raise RuntimeError(
                    f"Cannot use {module.__name__}.{name}() outside of request context"
                )
            return value(*args, **kwargs)

        return refused

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_module"), name, value)

    def __dir__(self) -> list[str]:
        return dir(object.__getattribute__(self, "_module"))


def _no_entropy(real: Callable[..., Any], what: str) -> Callable[..., Any]:
    @functools.wraps(real)
    def refused(*args: Any, **kwargs: Any) -> Any:
        if _importing():
            _refused.append(what)
            raise OSError(EIO, "Cannot get entropy outside of request context")
        return real(*args, **kwargs)

    return refused


@contextmanager
def _import_time() -> Iterator[None]:
    """Randomness refused while the block runs, as at Cloudflare's snapshot."""
    import _random
    import random

    saved = (os.urandom, random._urandom, _random.Random.seed, sys.modules["random"])  # type: ignore[attr-defined]
    real_seed = saved[2]

    def seed(self: Any, a: Any = None, *args: Any) -> Any:
        if a is None and _importing():
            _refused.append("random.Random() without a seed")
            raise OSError(EIO, "Cannot get entropy outside of request context")
        return real_seed(self, a, *args)

    os.urandom = _no_entropy(os.urandom, "os.urandom()")
    random._urandom = _no_entropy(random._urandom, "random.SystemRandom")  # type: ignore[attr-defined]
    _random.Random.seed = seed  # type: ignore[method-assign]
    sys.modules["random"] = _ImportTimeModule(random, ("Random", "SystemRandom"))  # type: ignore[assignment]
    _Guard.importing = True
    try:
        yield
    finally:
        _Guard.importing = False
        os.urandom, random._urandom, _random.Random.seed, sys.modules["random"] = saved  # type: ignore[attr-defined, method-assign]


def load_worker(name: str) -> ModuleType:
    """Import the Worker's main module as Cloudflare does at deploy time."""
    _refused.clear()
    try:
        with _import_time():
            module = importlib.import_module(name)
    except BaseException as e:
        if _refused:
            e.add_note(
                f"{_refused[0]} ran while the Worker's modules were imported. Cloudflare imports"
                " them once, at deploy time, to snapshot their memory, and refuses randomness"
                " until the first request: call it inside a handler instead."
            )
        raise
    global _sdk
    _sdk = importlib.import_module("workers")  # the upload's SDK: its converters, as workerd's
    return module


# ------------------------------------------------------------------ calls --

_sdk: Any = None


async def call_method(relaxed: bool, inst: Any, name: str, *args: Any) -> Any:
    """workerd's wrapper_func: JS arguments in, a JS value out."""
    method = getattr(inst, name)
    py_args = [_sdk.python_from_rpc(arg) for arg in args]
    result = relaxed_call(method, *py_args) if relaxed else method(*py_args)
    if isawaitable(result):
        result = await result
    return _sdk.python_to_rpc(result)


# ------------------------------------------------------------- test hook --


def _jsonable(obj: Any) -> Any:
    if obj is jsnull:
        return None
    if isinstance(obj, JsProxy):
        return obj.to_py()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return list(bytes(obj))
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)


async def run_test(source: str, inst: Any) -> str:
    """POST /__test/python: run `async def main(env)` with the entrypoint's env.

    The source also sees `worker` (the Default instance whose `self.env` it
    gets), so a test can call the Worker's own methods.
    """
    namespace: dict[str, Any] = {"__name__": "__d1queue_test__", "worker": inst}
    try:
        exec(compile(source, "<test>", "exec"), namespace)
        result = namespace["main"](inst.env)
        if isawaitable(result):
            result = await result
        return json.dumps({"ok": True, "result": result}, default=_jsonable)
    except BaseException:  # the traceback is the answer
        return json.dumps({"ok": False, "error": traceback.format_exc()})
