"""The runtime host itself: the real Worker's upload (src/ and python_modules/
with the `workers` SDK, as `wrangler deploy --dry-run` writes it) in Pyodide
with Miniflare's D1, plus host/fixtures' Worker for the host features the real
Worker does not exercise (waitUntil, errors, vars, calling conventions)."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import d1queue

from .conftest import FIXTURE, ROOT, Host, RpcError, bundle_for, start_host

# Q: a job row whose nullable columns are the last four parameters.
INSERT_JOB = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, available_at, band,"
    " reserved_at, last_error, reservation, created_at, unique_key)"
    " VALUES (?, 'default', 'noop', '{}', 3, 0, 0, ?, ?, ?, 0, ?)"
)


def with_q(source: str) -> str:
    return f"Q = {INSERT_JOB!r}\n" + textwrap.dedent(source)


def test_health(host: Host) -> None:
    reply = host.get("/health")
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"ok": True, "version": d1queue.__version__}


def test_start_up_names_the_api_and_the_dashboard_after_the_ready_line(host: Host) -> None:
    lines = host.output()
    ready = lines.index(f"d1queue host listening on {host.url}")
    after = lines[ready + 1 : ready + 3]
    assert after[0].startswith(f"  API:       {host.url}/v1 "), after
    assert after[1] == f"  dashboard: {host.url}/ui", after


def test_under_d1queue_prefix_every_printed_link_and_route_carries_it() -> None:
    """With D1QUEUE_PREFIX the Worker mounts d1queue under it, and the host
    prints its links there: the API, the dashboard and the index all answer
    at the printed paths, and nothing answers at the unprefixed ones."""
    h = start_host("--var", "D1QUEUE_PREFIX=/queue/")
    try:
        lines = h.output()
        ready = lines.index(f"d1queue host listening on {h.url}")
        api, board = lines[ready + 1 : ready + 3]
        assert api.startswith(f"  API:       {h.url}/queue/v1 "), api
        assert f"document: {h.url}/queue/v1/openapi.json)" in api
        assert board == f"  dashboard: {h.url}/queue/ui"
        assert h.get("/queue/health").json()["ok"] is True
        assert h.api("GET", "/queue/v1/queues").status == 200
        assert h.api("GET", "/queue/v1/openapi.json").json()["servers"] == [{"url": "/queue"}]
        assert h.get("/queue/ui/signin").status == 200
        assert h.get("/queue").json()["dashboard"] == "/queue/ui"
        for path in ("/health", "/ui", "/v1/queues"):
            assert h.get(path).status == 404, path
    finally:
        h.stop()


def test_the_root_is_a_public_index_of_links(host: Host) -> None:
    reply = host.get("/")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    links = reply.json()
    assert (links["api"], links["openapi"], links["dashboard"]) == (
        "/v1",
        "/v1/openapi.json",
        "/ui",
    )


def test_unknown_route_is_the_workers_404(host: Host) -> None:
    reply = host.api("GET", "/no/such/route")
    assert reply.status == 404
    assert reply.json()["error"]["code"] == "not_found"


def test_migrations_applied_and_recorded_like_wrangler(host: Host) -> None:
    names = host.python(
        """
        async def main(env):
            r = await env.DB.prepare("SELECT name FROM d1_migrations ORDER BY id").all()
            return [row["name"] for row in r["results"]]
        """
    )
    assert names == sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))


def test_sdk_wraps_the_binding_and_none_binds_as_null(clean_host: Host) -> None:
    source = with_q(
        """
        async def main(env):
            db = env.DB
            meta = (await db.prepare(Q).bind("j1", None, None, None, None).run())["meta"]
            row = await db.prepare(
                "SELECT id, reserved_at, typeof(unique_key) AS t FROM d1queue_jobs WHERE id = ?"
            ).bind("j1").first()
            missing = await db.prepare("SELECT id FROM d1queue_jobs WHERE id = 'nope'").first()
            return {
                "wrapper": type(db).__name__,
                "js_class": db._binding.constructor.name,
                "changes": meta.changes,
                "row": row,
                "missing": missing,
            }
        """
    )
    assert clean_host.python(source) == {
        "wrapper": "_BindingWrapper",
        "js_class": "D1Database",
        "changes": 1,
        "row": {"id": "j1", "reserved_at": None, "t": "null"},
        "missing": None,
    }


def test_sdk_batch_takes_a_python_list(clean_host: Host) -> None:
    source = with_q(
        """
        async def main(env):
            db = env.DB
            stmts = [db.prepare(Q).bind(f"b{i}", None, None, None, None) for i in range(3)]
            return [r.meta.changes for r in await db.batch(stmts)]
        """
    )
    assert clean_host.python(source) == [1, 1, 1]


def test_python_errors_come_back_as_tracebacks(host: Host) -> None:
    with pytest.raises(AssertionError, match=r"D1_ERROR: no such table: nope"):
        host.python(
            """
            async def main(env):
                await env.DB.prepare("SELECT * FROM nope").all()
            """
        )


def test_scheduled_runs_the_workers_cron(host: Host) -> None:
    seen = len(host.output())
    assert host.get("/__scheduled?cron=*+*+*+*+*").text == "Ran scheduled event"
    host.wait_for_output('"d1queue.drain"', since=seen)
    seen = len(host.output())
    assert host.get("/cdn-cgi/handler/scheduled?cron=0+*+*+*+*").text == "Ran scheduled event"
    lines = host.wait_for_output('"d1queue.drain"', since=seen)
    report = json.loads(next(line for line in lines if '"d1queue.drain"' in line))
    assert report["trigger"] == "cron 0 * * * *"


def test_raw_binding_is_a_bare_jsproxy(clean_raw_host: Host) -> None:
    """What Python sees without the SDK's wrapper (Pyodide 314, Miniflare's D1)."""
    source = with_q(
        """
        from pyodide.ffi import JsException, JsProxy, jsnull, to_js

        async def main(env):
            db = env.DB
            out = {"jsproxy": isinstance(db, JsProxy)}
            try:
                await db.prepare(Q).bind("r1", None, None, None, None).run()
            except JsException as e:
                out["none"] = str(e)
            await db.prepare(Q).bind("r2", jsnull, jsnull, jsnull, jsnull).run()
            row = await db.prepare(
                "SELECT typeof(reserved_at) AS t FROM d1queue_jobs WHERE id = 'r2'"
            ).first()
            out["jsnull"] = row.t
            missing = await db.prepare("SELECT id FROM d1queue_jobs WHERE id = 'nope'").first()
            out["first_missing_is_jsnull"] = missing is jsnull
            stmts = [db.prepare(Q).bind(f"r{i}", jsnull, jsnull, jsnull, jsnull) for i in (3, 4)]
            out["batch_list"] = len(await db.batch(stmts))
            stmts = [db.prepare(Q).bind(f"r{i}", jsnull, jsnull, jsnull, jsnull) for i in (5, 6)]
            out["batch_to_js"] = len(await db.batch(to_js(stmts)))
            return out
        """
    )
    result = clean_raw_host.python(source)
    assert result["jsproxy"] is True
    assert "D1_TYPE_ERROR: Type 'undefined' not supported" in result["none"]
    assert result["jsnull"] == "null"
    assert result["first_missing_is_jsnull"] is True
    assert result["batch_list"] == 2
    assert result["batch_to_js"] == 2


# --- host features, on host/fixtures' Worker ---------------------------------


@pytest.fixture(scope="module")
def fixture_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    # A copy, to add the .dev.vars that .gitignore keeps out of the repository.
    root = tmp_path_factory.mktemp("fixture") / "worker"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns(".wrangler", "python_modules"))
    (root / ".dev.vars").write_text("FIXTURE_SECRET=s3cret\n")
    h = start_host(root=root, bundle=bundle_for(FIXTURE))
    yield h
    h.stop()


def test_request_and_response_round_trip(fixture_host: Host) -> None:
    reply = fixture_host.post("/echo", body="héllo")
    assert (reply.status, reply.text, reply.headers["x-echo"]) == (201, "héllo", "POST")


def test_vars_and_dev_vars_reach_env(fixture_host: Host) -> None:
    assert fixture_host.python(
        "async def main(env):\n    return [env.FIXTURE_VAR, env.FIXTURE_SECRET]\n"
    ) == ["hello", "s3cret"]


def test_wait_until_work_is_tracked(fixture_host: Host) -> None:
    seen = len(fixture_host.output())
    assert fixture_host.get("/later").text == "queued"  # its waitUntil task sleeps first
    fixture_host.idle()
    fixture_host.wait_for_output("later done", since=seen)
    assert "later" in fixture_host.python(
        """
        async def main(env):
            r = await env.DB.prepare("SELECT msg FROM fixture_log").all()
            return [row["msg"] for row in r["results"]]
        """
    )


def test_the_upload_is_what_runs(host: Host) -> None:
    """The modules and the SDK come from the upload (workerd's layout); the
    runtime's own `workers` is the stub that raises (enable_python_external_sdk);
    the compat flags are workerd's, python_request_headers_preserve_commas on."""
    assert host.python(
        """
        import sys, workers, _cloudflare_compat_flags as flags
        import entry

        async def main(env):
            return {
                "entry": entry.__file__,
                "workers": workers.__file__,
                "python_modules_before_site_packages": sys.path.index(
                    "/session/metadata/python_modules"
                ) < min(i for i, p in enumerate(sys.path) if "site-packages" in p),
                "preserve_commas": flags.python_request_headers_preserve_commas,
                "stub": open(sys.path[-1] + "/workers/__init__.py").read().count("raise err"),
            }
        """
    ) == {
        "entry": "/session/metadata/entry.py",
        "workers": "/session/metadata/python_modules/workers/__init__.py",
        "python_modules_before_site_packages": True,
        "preserve_commas": True,
        "stub": 1,
    }


def test_randomness_is_back_once_the_worker_is_loaded(host: Host) -> None:
    """The real Worker loads under the import-time guard; in a request,
    randomness works, also through the `random` its modules imported then."""
    assert host.python(
        """
        import os, random, uuid
        import d1queue.core.registry as registry

        async def main(env):
            return [len(os.urandom(8)), 0 <= random.random() < 1,
                    0 <= registry.random.random() < 1, len(str(uuid.uuid4()))]
        """
    ) == [8, True, True, 36]


@pytest.mark.parametrize(
    ("module", "error"),
    [
        (
            "import os\nos.urandom(4)\n",
            "OSError: [Errno 29] Cannot get entropy outside of request context",
        ),
        (
            "import random\nrandom.random()\n",
            "RuntimeError: Cannot use random.random() outside of request context",
        ),
        (
            "from random import choice\nchoice('ab')\n",
            "RuntimeError: Cannot use random.choice() outside",
        ),
        ("import random\nrandom.Random()\n", "OSError: [Errno 29] Cannot get entropy"),
        ("import secrets\nsecrets.token_hex(4)\n", "OSError: [Errno 29] Cannot get entropy"),
        ("import random\nr = random.Random(4).random()\nf = random.random\n", None),
    ],
)
def test_randomness_at_import_fails_as_at_cloudflares_snapshot(
    host: Host, module: str, error: str | None
) -> None:
    """The host's loader (pyhost.load_worker) on a module that uses
    randomness at import, in the running host's Pyodide."""
    result = host.python(
        f"""
        import sys, _d1queue_host

        async def main(env):
            name = "entropy_probe_{abs(hash(module))}"
            with open(f"/tmp/{{name}}.py", "w") as f:
                f.write({module!r})
            sys.path.insert(0, "/tmp")
            try:
                _d1queue_host.load_worker(name)
                return None
            except BaseException as e:
                import traceback
                return "".join(traceback.format_exception(e))
            finally:
                sys.path.remove("/tmp")
        """
    )
    if error is None:
        assert result is None  # a seeded Random, or a reference kept for later, is fine
    else:
        assert error in result
        assert "Cloudflare imports them once, at deploy time" in result


def test_a_worker_using_randomness_at_import_does_not_load(tmp_path: Path) -> None:
    upload = tmp_path / "upload"
    shutil.copytree(bundle_for(FIXTURE), upload)
    with (upload / "helper.py").open("a") as f:
        f.write("import os\nSALT = os.urandom(8)\n")
    with pytest.raises(AssertionError, match="exited with 1 before it was ready") as failed:
        start_host(root=FIXTURE, bundle=upload)
    message = str(failed.value)
    assert "cannot load the Worker" in message
    assert "OSError: [Errno 29] Cannot get entropy outside of request context" in message
    assert "os.urandom() ran while the Worker's modules were imported" in message


def test_the_host_refuses_a_pyodide_workerd_would_not_run(tmp_path: Path) -> None:
    root = tmp_path / "worker"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns(".wrangler", "python_modules"))
    config = root / "wrangler.toml"
    config.write_text(
        config.read_text().replace(
            '["python_workers"]', '["python_workers", "no_python_workers_314"]'
        )
    )
    with pytest.raises(AssertionError, match="exited with 1 before it was ready") as failed:
        start_host(root=root, bundle=bundle_for(FIXTURE))
    assert (
        "workerd runs this Worker on Pyodide 0.28.2 (python_workers_20250116 is the newest"
        " Python release flag on at 2026-11-01), but node_modules has pyodide 314.0.6"
    ) in str(failed.value)


def test_scheduled_gets_env_and_ctx_on_self_only(fixture_host: Host) -> None:
    seen = len(fixture_host.output())
    fixture_host.scheduled()
    fixture_host.wait_for_output("args=None,None", since=seen)


def test_rpc_methods_are_called_strictly(fixture_host: Host) -> None:
    assert fixture_host.rpc("add", 2, 3) == 5
    with pytest.raises(RpcError, match=r"TypeError: .*add\(\) takes 3 positional arguments but 4"):
        fixture_host.rpc("add", 1, 2, 3)


def test_scheduled_reply_waits_for_its_wait_until_work(fixture_host: Host) -> None:
    seen = len(fixture_host.output())
    fixture_host.scheduled("*/5 * * * *")
    logged = fixture_host.python(
        """
        async def main(env):
            r = await env.DB.prepare("SELECT msg FROM fixture_log").all()
            return [row["msg"] for row in r["results"]]
        """
    )
    assert json.dumps({"cron": "*/5 * * * *"}) in logged
    fixture_host.wait_for_output("scheduled cron=*/5 * * * * at=", since=seen)
    fixture_host.wait_for_output("scheduled via logging", since=seen)


def test_worker_exception_is_a_500_with_the_traceback_logged(fixture_host: Host) -> None:
    seen = len(fixture_host.output())
    reply = fixture_host.get("/boom")
    assert reply.status == 500
    fixture_host.wait_for_output("RuntimeError: boom from the fixture", since=seen)
