"""examples/own-worker as a user runs it, from outside this repository,
by the lines its README and docs/library.md give, run in bash as written:
a virtualenv in a copy of the example, this repository's wheel installed in
it from a clone's dist/ (its dependencies from the index), a token in
.dev.vars, and `d1queue dev` there. That copies d1queue's migrations into
the example's folder, builds the upload (the installed d1queue vendored in,
never its host), applies the migrations to a local D1 and serves the Worker
with its crons. The host's npm packages are this repository's node_modules
(D1QUEUE_HOST_NODE_MODULES), not a second `npm ci`."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..doc_blocks import blocks_for
from .conftest import ROOT, Host, built_wheel, launch_host
from .test_dashboard_http import send
from .test_docs_runtime import migrations_applied, placeholders, run_shell

EXAMPLE = ROOT / "examples" / "own-worker"
START_TIMEOUT_S = 360.0
"""The virtualenv and pip's install of the wheel, then `d1queue dev`'s first
start, which builds the upload too: pip fetches the SDK and d1queue's
dependencies for Pyodide's Python, then wrangler's dry run, then the boot."""
CLONE = "/path/to/d1queue"
"""How the pages write the folder of the reader's clone of d1queue."""
ISOLATED = " --port 0 --fresh --test-hooks"
"""What a test run adds to `d1queue dev` (docs/README.md): a free port, a
throwaway D1, the host's test hooks."""


def commands(block: str) -> list[str]:
    """A block's command lines, their trailing comments left out."""
    return [re.sub(r"\s+#.*$", "", line) for line in block.splitlines() if line.strip()]


def start_script(clone: Path) -> str:
    """The README's install-and-start lines, as the `own` fixture runs them:
    `clone` the folder of the reader's clone, and `d1queue dev` given the
    options that isolate a test run. docs/library.md's two blocks are the
    same commands, written for any Worker's folder."""
    test = "tests/runtime/test_own_worker_runtime.py::test_the_install_and_start_run_as_written"
    (block,) = blocks_for("examples/own-worker/README.md", test)
    guide = [line for b in blocks_for("docs/library.md", test) for line in commands(b)]
    assert commands(block) == guide, (block, guide)
    *setup, dev = block.splitlines(keepends=True)
    assert dev.startswith("d1queue dev "), dev
    return "".join(setup).replace(CLONE, str(clone)) + "d1queue dev" + ISOLATED + dev[11:]


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's machine: a clone of d1queue whose dist/ holds the wheel, and
    the example copied beside it, into a folder of its own."""
    home = tmp_path_factory.mktemp("user")
    (home / "d1queue" / "dist").mkdir(parents=True)
    shutil.copy(built_wheel(), home / "d1queue" / "dist")
    ignore = shutil.ignore_patterns("python_modules", ".wrangler", ".venv", ".dev.vars")
    shutil.copytree(EXAMPLE, home / "own-worker", ignore=ignore)
    return home


@pytest.fixture(scope="module")
def own(user: Path) -> Iterator[Host]:
    """The README's lines, pasted into bash in the example's folder, in
    order: the last one, `d1queue dev`, becomes the host."""
    # The user's shell: nothing of this repository's Python on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        XDG_CACHE_HOME=str(user / "cache"),
        D1QUEUE_HOST_NODE_MODULES=str(ROOT / "node_modules"),
        NO_COLOR="1",
    )
    host = launch_host(
        ["bash", "--noprofile", "--norc", "-e", "-c", start_script(user / "d1queue")],
        cwd=user / "own-worker", env=env, timeout=START_TIMEOUT_S, terminal=True,
    )  # fmt: skip
    yield host
    host.stop()


@pytest.fixture(scope="module")
def token(own: Host, user: Path) -> str:
    """The API token the README's `echo` line wrote into .dev.vars."""
    text = (user / "own-worker" / ".dev.vars").read_text()
    found = re.fullmatch(r"D1QUEUE_TOKEN=([A-Za-z0-9_-]{43})\n", text)  # token_urlsafe(32)
    assert found, text
    return found.group(1)


def test_the_install_and_start_run_as_written(own: Host, user: Path, token: str) -> None:
    """What the lines say they do: a virtualenv in the Worker's folder, the
    wheel from the clone's dist/ installed in it, a fresh token in
    .dev.vars, and `d1queue dev` from that virtualenv serving the Worker."""
    script = start_script(user / "d1queue")
    assert script.count(ISOLATED) == 1 and CLONE not in script, script
    venv = user / "own-worker" / ".venv"
    assert (venv / "bin" / "d1queue").is_file()
    (info,) = venv.glob("lib/python3*/site-packages/d1queue-*.dist-info")
    source = json.loads((info / "direct_url.json").read_text())["url"]
    assert source == (user / "d1queue" / "dist" / built_wheel().name).as_uri()
    assert own.get("/hello").status == 200
    assert own.api("GET", "/queue/v1/queues", token=token).status == 200


def test_the_migration_lines_run_as_written(own: Host, user: Path, tmp_path: Path) -> None:
    """The README's lines before `uv run pywrangler dev` (a sketch: it
    downloads Cloudflare's runtime), in bash in a fresh copy of the example
    with the user's virtualenv active: d1queue's migrations copied into
    ./migrations, then applied by wrangler to the local D1 `own-worker`."""
    (block,) = blocks_for(
        "examples/own-worker/README.md",
        "tests/runtime/test_own_worker_runtime.py::test_the_migration_lines_run_as_written",
    )
    worker = tmp_path / "own-worker"
    shutil.copytree(EXAMPLE, worker, ignore=shutil.ignore_patterns("python_modules", ".wrangler"))
    venv = user / "own-worker" / ".venv"
    tables, applied = migrations_applied(worker, block, venv / "bin", {"VIRTUAL_ENV": str(venv)})
    shipped = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    assert sorted(p.name for p in (worker / "migrations").glob("*.sql")) == shipped
    assert {"d1queue_jobs", "d1queue_failed_jobs", "d1queue_schedules"} <= tables
    assert applied == shipped


def test_dev_put_the_migrations_in_place_and_vendored_the_installed_d1queue(
    own: Host, user: Path
) -> None:
    worker = user / "own-worker"
    shipped = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    assert sorted(p.name for p in (worker / "migrations").glob("*.sql")) == shipped
    assert any(
        f"copied {len(shipped)} of d1queue's migrations into {worker / 'migrations'}" in line
        for line in own.output()
    ), own.output()
    # The upload's d1queue is the installed one, and carries none of the host.
    stamp = json.loads((worker / ".wrangler" / "python_modules.json").read_text())
    assert stamp["d1queue"]["package"].startswith(str(user / "own-worker" / ".venv")), stamp
    assert "d1queue" not in stamp["requirements"]  # nothing asked of an index
    upload = worker / ".wrangler" / "bundle"
    assert (upload / "python_modules" / "d1queue" / "interfaces" / "cloudflare.py").is_file()
    assert not [p for p in upload.rglob("*") if p.suffix == ".mjs" or p.name == "share"]
    # The host ran from the user's cache, never from the repository.
    (folder,) = (user / "cache" / "d1queue").glob("host-*")
    assert (folder / "host" / "host.mjs").is_file()
    venv = user / "own-worker" / ".venv"
    assert not (venv / "share" / "d1queue" / "devhost" / ".wrangler").exists()


def test_its_own_route_answers_and_d1queue_stays_under_the_prefix(own: Host, token: str) -> None:
    hello = own.get("/hello")
    assert hello.status == 200 and hello.text == "hello from my own Worker\n"
    assert own.get("/nowhere").status == 404
    assert own.get("/nowhere").text == "not found\n"
    # Outside /queue: the Worker's own.
    assert own.api("GET", "/v1/queues", token=token).status == 404
    assert own.get("/queue/health").json()["ok"] is True
    assert own.api("GET", "/queue/v1/queues", token=None).status == 401
    doc = own.api("GET", "/queue/v1/openapi.json", token=token).json()
    assert doc["servers"] == [{"url": "/queue"}] and "/v1/jobs" in doc["paths"]
    assert "hello.greet" in doc["components"]["schemas"]["Job"]["properties"]["name"]["enum"]


def test_a_push_through_the_prefix_is_drained_by_the_cron(own: Host, token: str) -> None:
    own.idle()
    # From before the push: `d1queue dev` also runs the cron every minute,
    # and that run may be the one that finds the job due.
    since = len(own.output())
    pushed = own.api(
        "POST", "/queue/v1/queues/default/jobs",
        json={"name": "hello.greet", "payload": {"name": "ada"}, "delay_s": 1}, token=token,
    )  # fmt: skip
    assert pushed.status == 201, pushed.text
    job_id = pushed.json()["id"]
    assert own.api("GET", f"/queue/v1/jobs/{job_id}", token=token).json()["state"] == "delayed"
    own.idle()  # the push's short drain found nothing due
    time.sleep(1.2)
    own.scheduled()
    own.wait_for_output('"hello.greet"', since)
    # The minute's own cron may be the run that took the job: its drain
    # line is printed when its invocation ends, which may be after ours.
    deadline = time.monotonic() + 10
    while True:
        drains = [e for e in own.events("d1queue.drain", since) if e["trigger"].startswith("cron")]
        if sum(e["completed"] for e in drains) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert drains and sum(e["completed"] for e in drains) == 1, drains
    assert any('"who":"ada"' in line.replace(" ", "") for line in own.output()[since:])
    assert own.api("GET", f"/queue/v1/jobs/{job_id}", token=token).json()["state"] == "completed"


def test_the_dashboard_signs_in_under_the_prefix(own: Host, token: str) -> None:
    first = send(own, "GET", "/queue/ui")
    assert first.status == 303
    assert first.headers["location"] == "/queue/ui/signin?next=%2Fui"
    page = send(own, "GET", first.headers["location"])
    assert page.status == 200 and 'action="/queue/ui/signin"' in page.text
    assets = re.findall(r'(?:href|src)="(/[^"]*static[^"]*)"', page.text)
    assert assets and all(a.startswith("/queue/ui/static/") for a in assets)
    assert send(own, "GET", assets[0]).status == 200
    signed = send(own, "POST", "/queue/ui/signin", {"token": token, "next": "/ui"})
    assert signed.status == 303 and signed.headers["location"] == "/queue/ui"
    cookie = signed.headers["set-cookie"].split(";", 1)[0]
    overview = send(own, "GET", "/queue/ui", cookie=cookie)
    assert overview.status == 200 and 'href="/queue/ui/failed"' in overview.text


def test_next_and_back_never_leave_the_prefix(own: Host, token: str) -> None:
    """Mounted at /queue, a Location of /queue/ui/%2e%2e/%2e%2e/admin/x is
    the host Worker's /admin/x to the browser: d1queue sends its own page."""
    for target in ("/ui/%2e%2e/%2e%2e/admin/x", "/ui/../../admin/x"):
        signed = send(own, "POST", "/queue/ui/signin", {"token": token, "next": target})
        assert signed.status == 303 and signed.headers["location"] == "/queue/ui", target
    cookie = signed.headers["set-cookie"].split(";", 1)[0]
    page = send(own, "GET", "/queue/ui", cookie=cookie)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text
    for target in ("/ui/../../admin/x", "/ui/%2e%2e/%2e%2e/admin/x"):
        form = {"csrf": csrf.group(1), "back": target}
        paused = send(own, "POST", "/queue/ui/queues/default/pause", form, cookie=cookie)
        assert paused.status == 303, paused.text
        assert paused.headers["location"] == "/queue/ui/queues/default?notice=paused", target
    form = {"csrf": csrf.group(1), "back": "/ui/queues/x/../default"}
    resumed = send(own, "POST", "/queue/ui/queues/default/resume", form, cookie=cookie)
    assert resumed.headers["location"] == "/queue/ui/queues/default?notice=resumed"


def test_the_root_under_the_prefix_names_the_prefixed_paths(own: Host) -> None:
    browser = send(own, "GET", "/queue", accept="text/html")
    assert browser.status == 303 and browser.headers["location"] == "/queue/ui"
    index = own.get("/queue").json()
    assert (index["dashboard"], index["api"], index["health"]) == (
        "/queue/ui",
        "/queue/v1",
        "/queue/health",
    )
    assert index["openapi"] == "/queue/v1/openapi.json"
    assert own.get(index["health"]).json()["ok"] is True


def test_sign_in_under_the_prefix_answers_at_one_path(own: Host, token: str) -> None:
    """A WAF rule on the path /queue/ui/signin sees every sign-in: another
    spelling is a 404 that signs no one in."""
    for path in (
        "/queue/ui/signin/",
        "/queue/ui/signin;x",
        "/queue/ui/signin//",
        "/queue/ui/%73ignin",
        "/queue/UI/signin",
        "/queue/ui/SIGNIN",
        "/queue//ui/signin",
    ):
        reply = send(own, "POST", path, {"token": token, "next": "/ui"})
        assert reply.status == 404 and "set-cookie" not in reply.headers, (path, reply.text)
        assert send(own, "GET", path).status == 404, path


def test_the_readmes_walk_runs_as_written(own: Host, user: Path) -> None:
    """The README's requests, in bash in the example's folder (its
    .dev.vars), against `d1queue dev` there: 8787 is the port it serves on."""
    (walk,) = blocks_for(
        "examples/own-worker/README.md",
        "tests/runtime/test_own_worker_runtime.py::test_the_readmes_walk_runs_as_written",
    )
    since = len(own.output())
    served = own.url.removeprefix("http://")
    run_shell([placeholders(walk, {"127.0.0.1:8787": served})], user / "own-worker")
    own.wait_for_output('"hello.greet"', since)
    assert any('"who":"ada"' in line.replace(" ", "") for line in own.output()[since:])
