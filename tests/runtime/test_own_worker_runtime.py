"""examples/own-worker as a user runs it, from outside this repository:
a bare virtualenv, this repository's wheel installed in it (`pip install
d1queue-*.whl`, its dependencies from the index), the example copied to a
folder of its own with a token in .dev.vars, and `d1queue dev` there. That
copies d1queue's migrations into the example's folder, builds the upload
(the installed d1queue vendored in, never its host), applies the migrations
to a local D1 and serves the Worker with its crons. The host's npm packages
are this repository's node_modules (D1QUEUE_HOST_NODE_MODULES), not a
second `npm ci`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..doc_blocks import blocks_for
from .conftest import ROOT, TOKEN, Host, built_wheel, launch_host
from .test_dashboard_http import send
from .test_docs_runtime import placeholders, run_shell

EXAMPLE = ROOT / "examples" / "own-worker"
DEV_TIMEOUT_S = 240.0
"""A first start builds the upload too: pip fetches the SDK and d1queue's
dependencies for Pyodide's Python, then wrangler's dry run, then the boot."""


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's machine: a virtualenv with the wheel, the example beside it."""
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(built_wheel())],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    worker = home / "own-worker"
    shutil.copytree(EXAMPLE, worker, ignore=shutil.ignore_patterns("python_modules", ".wrangler"))
    (worker / ".dev.vars").write_text(f"D1QUEUE_TOKEN={TOKEN}\n")
    return home


@pytest.fixture(scope="module")
def own(user: Path) -> Iterator[Host]:
    # The user's shell: nothing of this repository's Python on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        XDG_CACHE_HOME=str(user / "cache"),
        D1QUEUE_HOST_NODE_MODULES=str(ROOT / "node_modules"),
        NO_COLOR="1",
    )
    host = launch_host(
        [str(user / "venv" / "bin" / "d1queue"), "dev", "--port", "0", "--fresh", "--test-hooks"],
        cwd=user / "own-worker", env=env, timeout=DEV_TIMEOUT_S,
    )  # fmt: skip
    yield host
    host.stop()


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
    assert stamp["d1queue"]["package"].startswith(str(user / "venv")), stamp
    assert "d1queue" not in stamp["requirements"]  # nothing asked of an index
    upload = worker / ".wrangler" / "bundle"
    assert (upload / "python_modules" / "d1queue" / "interfaces" / "cloudflare.py").is_file()
    assert not [p for p in upload.rglob("*") if p.suffix == ".mjs" or p.name == "share"]
    # The host ran from the user's cache, never from the repository.
    (folder,) = (user / "cache" / "d1queue").glob("host-*")
    assert (folder / "host" / "host.mjs").is_file()
    assert not (user / "venv" / "share" / "d1queue" / "devhost" / ".wrangler").exists()


def test_its_own_route_answers_and_d1queue_stays_under_the_prefix(own: Host) -> None:
    hello = own.get("/hello")
    assert hello.status == 200 and hello.text == "hello from my own Worker\n"
    assert own.get("/nowhere").status == 404
    assert own.get("/nowhere").text == "not found\n"
    assert own.api("GET", "/v1/queues").status == 404  # outside /queue: the Worker's own
    assert own.get("/queue/health").json()["ok"] is True
    assert own.api("GET", "/queue/v1/queues", token=None).status == 401
    doc = own.api("GET", "/queue/v1/openapi.json").json()
    assert doc["servers"] == [{"url": "/queue"}] and "/v1/jobs" in doc["paths"]
    assert "hello.greet" in doc["components"]["schemas"]["Job"]["properties"]["name"]["enum"]


def test_a_push_through_the_prefix_is_drained_by_the_cron(own: Host) -> None:
    own.idle()
    pushed = own.api(
        "POST", "/queue/v1/queues/default/jobs",
        json={"name": "hello.greet", "payload": {"name": "ada"}, "delay_s": 1},
    )  # fmt: skip
    assert pushed.status == 201, pushed.text
    job_id = pushed.json()["id"]
    assert own.api("GET", f"/queue/v1/jobs/{job_id}").json()["state"] == "delayed"
    own.idle()  # the push's short drain found nothing due
    time.sleep(1.2)
    since = len(own.output())
    own.scheduled()
    drains = [e for e in own.events("d1queue.drain", since) if e["trigger"].startswith("cron")]
    assert drains and sum(e["completed"] for e in drains) == 1, drains
    own.wait_for_output('"hello.greet"', since)
    assert any('"who":"ada"' in line.replace(" ", "") for line in own.output()[since:])
    assert own.api("GET", f"/queue/v1/jobs/{job_id}").json()["state"] == "completed"


def test_the_dashboard_signs_in_under_the_prefix(own: Host) -> None:
    first = send(own, "GET", "/queue/ui")
    assert first.status == 303
    assert first.headers["location"] == "/queue/ui/signin?next=%2Fui"
    page = send(own, "GET", first.headers["location"])
    assert page.status == 200 and 'action="/queue/ui/signin"' in page.text
    assets = re.findall(r'(?:href|src)="(/[^"]*static[^"]*)"', page.text)
    assert assets and all(a.startswith("/queue/ui/static/") for a in assets)
    assert send(own, "GET", assets[0]).status == 200
    signed = send(own, "POST", "/queue/ui/signin", {"token": TOKEN, "next": "/ui"})
    assert signed.status == 303 and signed.headers["location"] == "/queue/ui"
    cookie = signed.headers["set-cookie"].split(";", 1)[0]
    overview = send(own, "GET", "/queue/ui", cookie=cookie)
    assert overview.status == 200 and 'href="/queue/ui/failed"' in overview.text


def test_next_and_back_never_leave_the_prefix(own: Host) -> None:
    """Mounted at /queue, a Location of /queue/ui/%2e%2e/%2e%2e/admin/x is
    the host Worker's /admin/x to the browser: d1queue sends its own page."""
    for target in ("/ui/%2e%2e/%2e%2e/admin/x", "/ui/../../admin/x"):
        signed = send(own, "POST", "/queue/ui/signin", {"token": TOKEN, "next": target})
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


def test_sign_in_under_the_prefix_answers_at_one_path(own: Host) -> None:
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
        reply = send(own, "POST", path, {"token": TOKEN, "next": "/ui"})
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
