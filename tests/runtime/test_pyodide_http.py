"""Does `requests` through pyodide-http work in a Worker? Evidence, not
belief: pyodide-http sends by synchronous XMLHttpRequest, and the Worker's
JS global scope (workerd's, and this host's) has none, so patch_all() is a
silent no-op (should_patch() is False). requests then falls through to
urllib3's own Emscripten backend, which needs JS promise integration (stack
switching) that this host's Node does not enable. Neither sends. The
built-in http.request job therefore uses the Workers fetch (test_worker.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from ..http_server import Server
from .conftest import ROOT, Host, start_host

PURE = ["requests", "urllib3", "idna", "certifi", "pyodide_http"]


@pytest.fixture(scope="module")
def requests_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    site = tmp_path_factory.mktemp("site")
    venv_site = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    for name in PURE:  # pure-Python packages, as `pywrangler sync` would vendor them
        shutil.copytree(venv_site / name, site / name, ignore=shutil.ignore_patterns("*.pyc"))
    h = start_host("--site", str(site))
    yield h
    h.stop()


def test_requests_through_pyodide_http_cannot_send(requests_host: Host, server: Server) -> None:
    result = requests_host.python(
        f"""
        async def main(env):
            import js
            import pyodide_http
            import requests

            pyodide_http.patch_all()
            out = {{"has_xhr": hasattr(js, "XMLHttpRequest")}}
            out["patched"] = pyodide_http.should_patch()
            try:
                r = requests.get("{server.url}/ping", timeout=5)
                out["status"] = r.status_code
            except Exception as e:
                out["error"] = f"{{type(e).__name__}}: {{e}}"
            return out
        """
    )
    print(result)
    assert result["has_xhr"] is False and result["patched"] is False
    assert "status" not in result and "stack-switching" in result["error"]
    assert server.seen == [], "nothing reached the server"
