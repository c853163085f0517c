"""The Python half of host/host.mjs; runs inside Pyodide next to the Worker.

It calls the Worker's entrypoint the way workerd does (workerd's
src/pyodide/internal/introspection.py and python-entrypoint-helper.ts):
`fetch` and RPC methods get their JS arguments through `python_from_rpc` and
their result goes back through `python_to_rpc`; `scheduled`/`queue` get the raw
JS arguments, called "relaxed" (extra arguments dropped if not accepted).
"""

import json
import traceback
from inspect import isawaitable

from pyodide.code import relaxed_call
from pyodide.ffi import JsProxy
from workers import python_from_rpc, python_to_rpc

try:
    from pyodide.ffi import jsnull
except ImportError:  # older Pyodide: JS null arrives as None
    jsnull = None


async def call_method(relaxed, inst, name, *args):
    """fetch (relaxed) and RPC methods: Python arguments in, a JS value out."""
    method = getattr(inst, name)
    py_args = [python_from_rpc(arg) for arg in args]
    result = relaxed_call(method, *py_args) if relaxed else method(*py_args)
    if isawaitable(result):
        result = await result
    return python_to_rpc(result)


async def call_handler(inst, name, *args):
    """scheduled/queue: raw JS arguments, relaxed, result ignored."""
    result = relaxed_call(getattr(inst, name), *args)
    if isawaitable(result):
        await result


def _jsonable(obj):
    if obj is jsnull:
        return None
    if isinstance(obj, JsProxy):
        return obj.to_py()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return list(bytes(obj))
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)


async def run_test(source, inst):
    """POST /__test/python: run `async def main(env)` with the entrypoint's env.

    The source also sees `worker` (the Default instance whose `self.env` it
    gets), so a test can call the Worker's own methods.
    """
    namespace = {"__name__": "__d1queue_test__", "worker": inst}
    try:
        exec(compile(source, "<test>", "exec"), namespace)
        result = namespace["main"](inst.env)
        if isawaitable(result):
            result = await result
        return json.dumps({"ok": True, "result": result}, default=_jsonable)
    except BaseException:  # noqa: BLE001 - the traceback is the answer
        return json.dumps({"ok": False, "error": traceback.format_exc()})
