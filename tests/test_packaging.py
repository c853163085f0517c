"""The library stands alone: it imports without the workers SDK, and its
wheel holds d1queue only, not this repository's Worker."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from .conftest import ROOT


def test_d1queue_imports_under_plain_cpython_without_the_sdk(tmp_path: Path) -> None:
    # A bare interpreter with only src/d1queue on its path: an import of
    # `workers`, `js` or `pyodide` anywhere in the library would fail here.
    (tmp_path / "workers.py").write_text("raise ImportError('the SDK must not be imported')")
    (tmp_path / "js.py").write_text("raise ImportError('js must not be imported')")
    code = (
        "import d1queue, d1queue.testing, sys; "
        "assert not {'workers', 'js', 'pyodide'} & set(sys.modules); print(d1queue.__version__)"
    )
    paths = [str(tmp_path), str(ROOT / "src")]
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path[:0] = {paths}; {code}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_the_wheel_is_the_library_alone(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("d1queue-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = {n for n in names if not n.startswith("d1queue-")}
    assert "d1queue/queue.py" in modules and "d1queue/testing.py" in modules
    assert all(n.startswith("d1queue/") for n in modules), modules
