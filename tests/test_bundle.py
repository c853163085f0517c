"""tools/bundle.py: what the upload must carry, and the check that fails when
`wrangler deploy --dry-run`'s output lacks it (make check-wrangler)."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from tools import bundle

from .conftest import ROOT


def test_the_sdk_is_vendored_first_and_pinned_in_one_place() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = bundle.requirements(ROOT)
    assert reqs[0].startswith("workers-runtime-sdk==")
    assert reqs == list(pyproject["dependency-groups"]["worker"]) + list(
        pyproject["project"]["dependencies"]
    )
    assert {"include-group": "worker"} in pyproject["dependency-groups"]["dev"]
    assert not any(
        isinstance(r, str) and r.startswith("workers-runtime-sdk")
        for r in pyproject["dependency-groups"]["dev"]
    ), "the SDK is pinned in the worker group only"


def test_a_worker_without_pyproject_gets_the_worker_group(tmp_path: Path) -> None:
    assert bundle.requirements(tmp_path) == bundle.requirements(ROOT)[:1]


def test_runtime_imports_are_what_src_imports_from_outside(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("from . import sub\nimport json\n")
    (src / "pkg" / "sub.py").write_text("def f():\n    import croniter.parser\n")
    (src / "entry.py").write_text(
        "import pkg, helper\nfrom workers import Response\nfrom js import Object\n"
        "import pyodide.ffi\n"
    )
    (src / "helper.py").write_text("from typing import Any\n")
    assert bundle.runtime_imports(src) == {
        "workers": {"entry.py"},
        "croniter": {"pkg/sub.py"},
    }
    # The real Worker: everything it imports from outside src/ is the SDK or
    # a dependency the bundle vendors.
    imported = set(bundle.runtime_imports(ROOT / "src"))
    assert "workers" in imported
    assert "pytest" not in imported  # the pytest plugin's import is pytest's alone


def test_nothing_the_worker_runs_imports_the_pytest_plugin() -> None:
    # runtime_imports skips these modules' imports: were one imported by the
    # Worker, the upload would need what it imports and the check not say so.
    src = ROOT / "src"
    for path in src.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module or ''}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                assert "pytest_plugin" not in name, f"{path} imports {name}"
    for module in bundle.NOT_RUN_BY_THE_WORKER:
        assert (src / module).is_file(), module


def fake_upload(outdir: Path) -> None:
    """A dry-run output of the real Worker, as wrangler lays it out."""
    shutil.copytree(ROOT / "src", outdir, ignore=shutil.ignore_patterns("__pycache__"))
    sdk = outdir / "python_modules" / "workers"
    sdk.mkdir(parents=True)
    (sdk / "__init__.py").write_text("")
    (outdir / "python_modules" / "pyvenv.cfg").write_text("")
    for name in bundle.runtime_imports(ROOT / "src"):
        if name != "workers":
            (outdir / "python_modules" / f"{name}.py").write_text("")


def test_the_check_passes_on_a_complete_upload(tmp_path: Path) -> None:
    fake_upload(tmp_path / "out")
    assert bundle.check(ROOT, tmp_path / "out") == []


def test_the_check_fails_without_the_sdk(tmp_path: Path) -> None:
    fake_upload(tmp_path / "out")
    shutil.rmtree(tmp_path / "out" / "python_modules" / "workers")
    [problem] = bundle.check(ROOT, tmp_path / "out")
    assert "python_modules/workers/ is missing" in problem


def test_the_check_fails_without_a_module_src_imports(tmp_path: Path) -> None:
    worker = tmp_path / "worker"
    shutil.copytree(ROOT / "src", worker / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "wrangler.toml", worker)
    entry = worker / "src" / "entry.py"
    entry.write_text(entry.read_text() + "\nimport croniter\n")
    fake_upload(tmp_path / "out")
    (tmp_path / "out" / "jobs.py").unlink()
    problems = bundle.check(worker, tmp_path / "out")
    assert any("the Worker's own module jobs is not in" in p for p in problems)
    assert any(p.startswith("croniter (imported by entry.py) is in neither") for p in problems)


def test_a_requirement_on_d1queue_is_met_by_the_installed_one() -> None:
    """d1queue is on no index: `d1queue dev` vendors the one it runs from,
    and fetches that one's own requirements instead."""
    own = bundle.installed()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert own is not None and own.package == ROOT / "src" / "d1queue"
    named = [bundle._name(r)[0] for r in project["dependencies"]]
    assert [bundle._name(r)[0] for r in own.requires] == named == ["cronsim", "tzdata"]
    sdk = "workers-runtime-sdk==1.9.5"
    for spelled in ("d1queue", "D1Queue>=0.1", "d1queue[extra] ; python_version >= '3.11'"):
        assert bundle.from_index([sdk, spelled, "tzdata>=2024.1"], own) == (
            [sdk, *own.requires],
            own,
        ), spelled
    for other in ("d1queue @ file:///tmp/d1queue-0.1.0-py3-none-any.whl", "d1queue-extras"):
        assert bundle.from_index([sdk, other], own) == ([sdk, other], None), other
    assert bundle.from_index([sdk, "d1queue"], None) == ([sdk, "d1queue"], None)


def test_the_installed_d1queue_is_copied_as_it_is_and_vendored_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site" / "d1queue"
    shutil.copytree(ROOT / "src" / "d1queue", package)
    (package / "__pycache__").mkdir(exist_ok=True)
    (package / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    own = bundle.Installed("0.1.0", package, "Name: d1queue\nVersion: 0.1.0\n", ("cronsim",))
    pip_calls: list[list[str]] = []

    def pip(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        """pip --target, as it lays a wheel's files out: scripts, data files."""
        pip_calls.append(cmd)
        target = Path(cmd[cmd.index("--target") + 1])
        for made in ("cronsim/__init__.py", "bin/d1queue", "share/d1queue/devhost/host/host.mjs"):
            (target / made).parent.mkdir(parents=True, exist_ok=True)
            (target / made).write_text("")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bundle.subprocess, "run", pip)
    root = tmp_path / "worker"
    root.mkdir()
    assert bundle.vendor(root, ["workers-runtime-sdk==1.9.5", "cronsim"], "3.14", own=own)
    assert pip_calls[0][-2:] == ["workers-runtime-sdk==1.9.5", "cronsim"]
    vendored = root / "python_modules"
    assert sorted(p.name for p in vendored.iterdir()) == [
        "cronsim", "d1queue", "d1queue-0.1.0.dist-info", "pyvenv.cfg",
    ]  # fmt: skip
    assert (vendored / "d1queue-0.1.0.dist-info" / "METADATA").read_text() == own.metadata
    copied = {p.relative_to(vendored / "d1queue") for p in (vendored / "d1queue").rglob("*.py")}
    assert copied == {p.relative_to(package) for p in package.rglob("*.py")}
    assert not list(vendored.rglob("__pycache__"))
    reqs = ["workers-runtime-sdk==1.9.5", "cronsim"]
    assert not bundle.vendor(root, reqs, "3.14", reuse=True, own=own)
    (package / "core" / "job.py").write_text("# edited\n")  # an editable install, edited
    assert bundle.vendor(root, reqs, "3.14", reuse=True, own=own)
    assert (vendored / "d1queue" / "core" / "job.py").read_text() == "# edited\n"
    assert len(pip_calls) == 2


def recipe(target: str) -> list[str]:
    """The commands of a Makefile target."""
    text = (ROOT / "Makefile").read_text()
    body = text.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in body.splitlines()[1:] if line.startswith("\t")]


def test_deploy_dry_run_prints_what_the_upload_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """make deploy-dry-run: the bundle, wrangler's dry-run and the check of
    check-wrangler, and wrangler's report printed: the modules with their
    sizes, the total and the bindings. Run here into a folder of the test's
    (and keeping python_modules/ if vendored from the same list)."""
    (command,) = recipe("deploy-dry-run")
    args = shlex.split(command)
    assert args[:2] == ["$(PY)", "tools/bundle.py"] and "--show" in args, args
    outdir = tmp_path / "upload"
    args = [str(outdir) if a == ".wrangler/upload" else a for a in args[2:]]
    assert str(outdir) in args, "the upload is left in .wrangler/upload"
    assert bundle.main([*args, "--reuse"]) == 0
    shown = capsys.readouterr().out
    for line in ("│ jobs.py ", "│ d1queue/store/claim.py ", "│ Vendored Modules "):
        assert line in shown, shown
    assert re.search(r"^Total Upload: [\d.]+ KiB / gzip: [\d.]+ KiB$", shown, re.MULTILINE)
    assert "env.DB (d1queue)" in shown
    assert "has the workers SDK and every package src/ imports" in shown
    assert (outdir / "python_modules" / "workers" / "__init__.py").is_file()


def small_worker(root: Path) -> Path:
    """A Worker folder with a module root and a vendored python_modules/."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "entry.py").write_text("x = 1\n")
    (root / "python_modules" / "pkg").mkdir(parents=True)
    (root / "python_modules" / "pkg" / "__init__.py").write_text("")
    (root / "wrangler.toml").write_text('main = "src/entry.py"\n')
    return root


def test_the_upload_inputs_change_with_the_files_an_upload_is_built_from(tmp_path: Path) -> None:
    root = small_worker(tmp_path / "w")
    first = bundle.upload_inputs(root)
    (root / "src" / "__pycache__").mkdir()
    (root / "src" / "__pycache__" / "entry.cpython-314.pyc").write_bytes(b"\0")
    (root / ".wrangler" / "bundle").mkdir(parents=True)
    (root / ".wrangler" / "bundle" / "entry.py").write_text("old\n")
    assert bundle.upload_inputs(root) == first, "caches and outputs are no inputs"
    seen = {first}
    for path, text in (
        (root / "src" / "entry.py", "x = 2\n"),
        (root / "src" / "new.py", ""),
        (root / "python_modules" / "pkg" / "__init__.py", "y = 1\n"),
        (root / "wrangler.toml", 'main = "src/entry.py"\nname = "w"\n'),
    ):
        path.write_text(text)
        now = bundle.upload_inputs(root)
        assert now not in seen, path
        seen.add(now)
    (root / "wrangler.toml").write_text('main = "src/entry.py"\n[build]\ncommand = "make"\n')
    assert bundle.upload_inputs(root) is None, "a custom build's inputs are its own"


def test_reuse_keeps_an_upload_built_from_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = small_worker(tmp_path / "w")
    outdir = tmp_path / "out"
    runs: list[list[str]] = []

    def wrangler(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        runs.append(cmd)
        outdir.mkdir()
        (outdir / "entry.py").write_text((root / "src" / "entry.py").read_text())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bundle.subprocess, "run", wrangler)
    assert bundle.dry_run(root, outdir, reuse=True) is not None
    assert bundle.dry_run(root, outdir, reuse=True) is None, "kept"
    assert len(runs) == 1
    (root / "src" / "entry.py").write_text("x = 2\n")
    assert bundle.dry_run(root, outdir, reuse=True) is not None
    assert (outdir / "entry.py").read_text() == "x = 2\n"
    assert bundle.dry_run(root, outdir) is not None, "without reuse, wrangler always runs"
    assert len(runs) == 3
