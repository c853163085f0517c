"""Docs that run as written: docs/testing.md's conftest and its fetch
double's test, verbatim, beside the README's mail.send; and the TypeScript
client's README names every RPC method the Worker has."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from .test_packaging import python_blocks, readme_section

ROOT = Path(__file__).resolve().parent.parent


def _block(text: str, starts: str) -> str:
    (block,) = [b for b in python_blocks(text) if b.lstrip().startswith(starts)]
    return block


def test_the_testing_guides_conftest_and_redirect_test_run_as_written(tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "testing.md").read_text()
    (tmp_path / "jobs.py").write_text(python_blocks(readme_section("Defining a job"))[0])
    (tmp_path / "conftest.py").write_text(_block(guide, "# conftest.py"))
    (tmp_path / "test_guide.py").write_text(_block(guide, "import asyncio"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout, run.stdout


def _rpc_methods() -> set[str]:
    tree = ast.parse((ROOT / "src/d1queue/interfaces/cloudflare.py").read_text())
    (entry,) = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "D1QueueEntrypoint"
    ]
    handlers = {"fetch", "scheduled", "queue"}
    return {
        f.name
        for f in entry.body
        if isinstance(f, ast.AsyncFunctionDef)
        and not f.name.startswith("_")
        and f.name not in handlers
    }


def test_the_ts_clients_readme_names_every_rpc_method() -> None:
    text = (ROOT / "clients" / "ts" / "README.md").read_text()
    listed = re.search(r"Methods: (.*?)\.\n", text, re.S)
    assert listed is not None
    named = set(re.findall(r"`(\w+)`", listed.group(1)))
    assert named == _rpc_methods()
