#!/usr/bin/env python3
"""A release's files, built and checked (make dist):

    python tools/dist.py [--outdir dist]

- d1queue-<version>-py3-none-any.whl and d1queue-<version>.tar.gz, the
  Python package, built by hatchling from this virtualenv (the dev group's
  pin: no build isolation, no download), then `twine check --strict`;
- d1queue-types-<version>.tgz, `npm pack` of clients/ts (@d1queue/types).

Both packages carry one version: the Python package's is d1queue.__version__
(pyproject.toml reads it), the types' is clients/ts/package.json's, and a
build stops when they differ. docs/releasing.md is the whole release.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION_FILE = REPO / "src" / "d1queue" / "__init__.py"
TYPES = REPO / "clients" / "ts"


class DistError(Exception):
    """Something the release must fix; the message says what."""


def versions() -> dict[str, str]:
    """Each package's version, by where it is written."""
    found = re.findall(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(), re.MULTILINE)
    if len(found) != 1:
        raise DistError(f"{VERSION_FILE} must set __version__ once")
    package = json.loads((TYPES / "package.json").read_text())
    return {
        str(VERSION_FILE.relative_to(REPO)): found[0],
        str((TYPES / "package.json").relative_to(REPO)): package["version"],
    }


def version() -> str:
    """The release's version, the same in every place `versions` reads."""
    found = versions()
    if len(set(found.values())) != 1:
        listed = ", ".join(f"{v} in {where}" for where, v in found.items())
        raise DistError(f"the packages' versions differ: {listed}")
    return next(iter(found.values()))


@dataclass(frozen=True)
class Dist:
    """The files of one release."""

    wheel: Path
    sdist: Path
    types: Path

    def files(self) -> list[Path]:
        return [self.wheel, self.sdist, self.types]


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DistError(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr).strip()}")
    return done.stdout


def build(outdir: Path) -> Dist:
    """The wheel, the sdist and the types' tarball of this version in
    `outdir` (earlier releases' files there are removed first), checked."""
    v = version()
    outdir.mkdir(parents=True, exist_ok=True)
    for old in [*outdir.glob("d1queue-*.whl"), *outdir.glob("d1queue-*.tar.gz")]:
        old.unlink()
    for old in outdir.glob("d1queue-types-*.tgz"):
        old.unlink()
    _run([sys.executable, "-m", "hatchling", "build", "-d", str(outdir)], cwd=REPO)
    wheel, sdist = outdir / f"d1queue-{v}-py3-none-any.whl", outdir / f"d1queue-{v}.tar.gz"
    for made in (wheel, sdist):
        if not made.is_file():
            raise DistError(f"hatchling made no {made.name} (is the version {v} everywhere?)")
    _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)])
    npm = shutil.which("npm")
    if npm is None:
        raise DistError("npm is needed to pack @d1queue/types")
    packed = json.loads(
        _run([npm, "pack", str(TYPES), "--json", "--pack-destination", str(outdir)])
    )
    types = outdir / packed[0]["filename"]
    if packed[0]["version"] != v or not types.is_file():
        raise DistError(f"npm pack made {types.name}, not @d1queue/types {v}")
    return Dist(wheel, sdist, types)


def contents(path: Path) -> list[str]:
    """The names of the files in a wheel or a tarball."""
    if path.suffix == ".whl":
        return zipfile.ZipFile(path).namelist()
    with tarfile.open(path) as tar:
        return [m.name for m in tar.getmembers() if m.isfile()]


def report(dist: Dist) -> str:
    """What `build` made, a line a file, and how to install it."""
    where = dist.wheel.parent
    shown = where.relative_to(Path.cwd()) if where.is_relative_to(Path.cwd()) else where
    what = {
        dist.wheel: f"pip install {shown / dist.wheel.name}",
        dist.sdist: "its source: builds the same wheel",
        dist.types: f"@d1queue/types: npm install {shown / dist.types.name}",
    }
    lines = [f"dist: in {shown}/, checked by twine check --strict:"]
    for path, note in what.items():
        size = f"{path.stat().st_size / 1024:.1f} KiB"
        files = f"{len(contents(path))} files"
        lines.append(f"  {path.name:<34} {size:>10} {files:>10}   {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--outdir", type=Path, default=REPO / "dist", help="default: dist/")
    args = parser.parse_args(argv)
    try:
        print(report(build(args.outdir.resolve())))
    except DistError as e:
        print(f"dist: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
