"""Hatch build hook: the wheel carries `d1queue dev`'s offline host as data
files, installed under the prefix at share/d1queue/devhost/ (beside the
environment's bin/, never inside site-packages):

    host/*.mjs, host/pyhost.py     the host (host/fixtures is the tests')
    tools/bundle.py                what the host builds the upload with
    package.json, package-lock.json  its npm packages (host/npm/)

The same tree as d1queue.interfaces.devhost.devhost_tree names in a
checkout (tests/test_packaging.py compares them). Globbed at build time, so
a module added to host/ ships without an edit here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SHARED = "share/d1queue/devhost"


def devhost_files(repo: Path) -> dict[str, str]:
    """{path in the repository: path in the installed tree}."""
    host = repo / "host"
    files = {f"host/{p.name}": f"host/{p.name}" for p in sorted(host.glob("*.mjs"))}
    files["host/pyhost.py"] = "host/pyhost.py"
    files["tools/bundle.py"] = "tools/bundle.py"
    files["host/npm/package.json"] = "package.json"
    files["host/npm/package-lock.json"] = "package-lock.json"
    return files


class DevHostFiles(BuildHookInterface[BuilderConfig]):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        repo = Path(self.root)
        for source, dest in devhost_files(repo).items():
            if not (repo / source).is_file():
                raise FileNotFoundError(f"the offline host's {source} is missing from {repo}")
            build_data["shared_data"][source] = f"{SHARED}/{dest}"
