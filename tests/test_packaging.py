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
    assert "d1queue/store/queue.py" in modules and "d1queue/interfaces/testing.py" in modules
    assert "d1queue/interfaces/cloudflare.py" in modules  # the Worker glue
    assert "d1queue/__main__.py" in modules  # python -m d1queue migrations copy
    assert all(n.startswith("d1queue/") for n in modules), modules


USER_JOBS = """
from d1queue import Fail, Registry

registry = Registry()


@registry.job("mail.send", queue="mail", subrequests=1)
async def send(payload, ctx):
    if "to" not in payload:
        raise Fail("no recipient")
    await ctx.queue.dispatch("mail.receipt", {"to": payload["to"]})


@registry.job("mail.receipt", queue="mail")
async def receipt(payload):
    pass
"""


def readme_test() -> str:
    """The example test of README.md's "Testing your own handlers"."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Testing your own handlers") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_an_installed_wheel_runs_the_readmes_example_test(tmp_path: Path) -> None:
    """What a user gets from `pip install d1queue`: the wheel, in a fresh
    virtualenv outside the repository, with the schema and the test kit."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("d1queue-*.whl")
    assert "d1queue/migrations/0001_init.sql" in zipfile.ZipFile(wheel).namelist()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pins = [
        line.strip().strip('",')
        for line in (ROOT / "pyproject.toml").read_text().splitlines()
        if line.strip().startswith(('"pytest==', '"pytest-asyncio=='))
    ]
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(wheel), *pins],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    project = tmp_path / "user-project"
    project.mkdir()
    (project / "jobs.py").write_text(USER_JOBS)
    (project / "test_mail.py").write_text(readme_test())
    (project / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    run = subprocess.run(
        [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout
    # The migrations, from the installed wheel into the user's folder.
    copy = subprocess.run(
        [str(py), "-m", "d1queue", "migrations", "copy"],
        cwd=project, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert copy.returncode == 0, copy.stdout + copy.stderr
    copied = sorted(p.name for p in (project / "migrations").glob("*.sql"))
    assert copied == sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    assert f"{len(copied)} copied" in copy.stdout
