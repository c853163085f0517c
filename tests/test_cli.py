"""`python -m d1queue migrations copy`: the wheel's migrations into a Worker's
folder, saying what it did, never overwriting a differing file unasked."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from d1queue.interfaces.cli import main
from d1queue.interfaces.testing import MIGRATIONS

from .conftest import ROOT

SHIPPED = sorted(p.name for p in MIGRATIONS.glob("*.sql"))


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_copy_into_a_new_folder_then_again(tmp_path: Path) -> None:
    target = tmp_path / "migrations"
    status, said = run("migrations", "copy", str(target))
    assert status == 0 and len(SHIPPED) >= 8
    assert sorted(p.name for p in target.iterdir()) == SHIPPED
    for name in SHIPPED:
        assert (target / name).read_bytes() == (MIGRATIONS / name).read_bytes()
        assert f"{target / name}: copied" in said
    assert f"{len(SHIPPED)} copied" in said and "wrangler d1 migrations apply" in said
    status, said = run("migrations", "copy", str(target))
    assert status == 0 and f"{len(SHIPPED)} unchanged" in said and "copied" not in said


def test_a_differing_file_is_kept_and_said_unless_forced(tmp_path: Path) -> None:
    run("migrations", "copy", str(tmp_path))
    first = tmp_path / SHIPPED[0]
    first.write_text("-- edited by hand\n")
    own = tmp_path / "0100_users.sql"
    own.write_text("CREATE TABLE users (id INTEGER PRIMARY KEY);\n")
    status, said = run("migrations", "copy", str(tmp_path))
    assert status == 1 and f"{first}: KEPT" in said and "1 kept" in said
    assert first.read_text() == "-- edited by hand\n"
    status, said = run("migrations", "copy", str(tmp_path), "--force")
    assert status == 0 and f"{first}: REPLACED" in said
    assert first.read_bytes() == (MIGRATIONS / SHIPPED[0]).read_bytes()
    assert own.read_text().startswith("CREATE TABLE users")  # the Worker's own: untouched


def test_the_default_folder_is_migrations_here_and_path_says_where(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "d1queue", "migrations", "copy"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "migrations").iterdir()) == SHIPPED
    status, said = run("migrations", "path")
    assert status == 0 and Path(said.strip()) == MIGRATIONS
