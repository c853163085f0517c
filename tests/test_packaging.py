"""The library stands alone: it imports without the workers SDK, and its
wheel holds d1queue only, not this repository's Worker."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from d1queue.interfaces.devhost import devhost_tree

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
    assert "d1queue/testing.py" in modules  # the test kit's documented path
    assert all(n.startswith("d1queue/") for n in modules), modules
    # `d1queue dev`'s host: data files under the prefix, outside the package
    # (pywrangler vendors site-packages only), the same tree a checkout runs.
    data = "d1queue-0.1.0.data/data/share/d1queue/devhost/"
    shipped = {n[len(data) :]: n for n in names if n.startswith(data)}
    assert set(shipped) == set(devhost_tree(ROOT)), set(shipped) ^ set(devhost_tree(ROOT))
    wheel_zip = zipfile.ZipFile(wheel)
    for name, path in devhost_tree(ROOT).items():
        assert wheel_zip.read(shipped[name]) == path.read_bytes(), name
    assert all(n.startswith(data) for n in names if ".data/" in n)
    assert (
        "d1queue = d1queue.interfaces.cli:main"
        in wheel_zip.read("d1queue-0.1.0.dist-info/entry_points.txt").decode()
    )


def readme_section(title: str) -> str:
    """The text of README.md's section `## {title}`, up to the next one."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"## {title}\n") + len(title) + 4 :]
    return section.split("\n## ", 1)[0]


def python_blocks(section: str) -> list[str]:
    return [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]


def readme_suite() -> dict[str, str]:
    """The files of the README's test suite, by name, verbatim: the testing
    section's blocks, each named by its first line (`# conftest.py`), and
    `jobs.py`, the job "Defining a job" shows, which that section tests."""
    files = {"jobs.py": python_blocks(readme_section("Defining a job"))[0]}
    for block in python_blocks(readme_section("Testing your own handlers")):
        first = block.split("\n", 1)[0]
        assert re.fullmatch(r"# \w+\.py", first), f"a block of the suite names no file: {first}"
        files[first[2:]] = block
    assert {"conftest.py", "test_mail.py"} <= set(files), files.keys()
    return files


def readme_installs() -> list[str]:
    """What the testing section says to install (`pip install ...`)."""
    (command,) = re.findall(r"`pip install ([^`]+)`", readme_section("Testing your own handlers"))
    return command.split()


OWN_TEST = """
# Written from the README's words alone: a user's own tests of mail.send.
from types import SimpleNamespace

from jobs import registry


@registry.job("mail.twice", queue="mail", subrequests=1)
async def twice(payload, ctx):
    await ctx.queue.dispatch("mail.send", payload)
    await ctx.queue.dispatch("mail.send", payload)  # one more than declared


def answering(status):
    async def fetch(url, **request):
        return SimpleNamespace(status=status)

    return fetch


async def test_a_sent_mail_completes(d1queue):
    d1queue.fetch = answering(200)
    outcome = await d1queue.run_job("mail.send", {"to": "ada@example.com"})
    assert outcome.action == "complete"


async def test_a_server_error_is_retried_with_the_backoff(d1queue):
    d1queue.fetch = answering(503)
    outcome = await d1queue.run_job("mail.send", {"to": "ada@example.com"})
    assert outcome.action == "retry" and outcome.delay_s > 0
    assert "mail service answered 503" in outcome.error


async def test_a_call_past_the_declared_subrequests_is_retried_by_both(d1queue):
    d1queue.fetch = answering(200)
    outcome = await d1queue.run_job("mail.twice", {"to": "ada@example.com"})
    assert outcome.action == "retry"
    assert "SubrequestLimitExceeded" in outcome.error
    await d1queue.dispatch("mail.twice", {"to": "ada@example.com"})
    report = await d1queue.run_due()
    assert (report.claimed, report.retried) == (3, 1)  # the mail.send each one sent completes


async def test_the_fifth_failure_is_the_last(d1queue):
    d1queue.fetch = answering(503)
    await d1queue.dispatch("mail.send", {"to": "ada@example.com"})
    failed = 0
    for _ in range(5):
        failed += (await d1queue.run_due()).failed
        d1queue.advance(3600)
    assert failed == 1
    assert (await d1queue.run_due()).claimed == 0
"""


def test_an_installed_wheel_runs_the_readmes_test_suite(tmp_path: Path) -> None:
    """What a user gets from the README's `pip install`: the wheel and what
    else the README names, in a fresh virtualenv outside the repository (no
    pytest-asyncio, no pytest settings), running the README's suite verbatim
    and a test of our own written from the README's words."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("d1queue-*.whl")
    assert "d1queue/migrations/0001_init.sql" in zipfile.ZipFile(wheel).namelist()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pins = {
        re.split(r"[=<>!~]", pin)[0]: pin
        for pin in tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
        if isinstance(pin, str)
    }
    named = readme_installs()
    assert "d1queue" in named and "pytest-asyncio" not in named, named
    # The README's names, d1queue as the wheel just built, the rest at the
    # versions this repository is tested with.
    packages = [str(wheel) if name == "d1queue" else pins.get(name, name) for name in named]
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *packages],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    project = tmp_path / "user-project"
    project.mkdir()
    suite = readme_suite()
    for name, text in suite.items():
        (project / name).write_text(text)
    (project / "test_own.py").write_text(OWN_TEST)
    run = subprocess.run(
        [str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider"],
        cwd=project, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    readme_tests = sum(text.count("\nasync def test_") for text in suite.values())
    assert f"{readme_tests + 4} passed" in run.stdout, run.stdout
    # The migrations, from the installed wheel into the user's folder.
    copy = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "d1queue", "migrations", "copy"],
        cwd=project, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert copy.returncode == 0, copy.stdout + copy.stderr
    copied = sorted(p.name for p in (project / "migrations").glob("*.sql"))
    assert copied == sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    assert f"{len(copied)} copied" in copy.stdout
