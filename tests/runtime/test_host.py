"""The runtime host itself: the real Worker (src/entry.py) in Pyodide with the
`workers` SDK and Miniflare's D1, plus host/fixtures' Worker for the host
features the real Worker does not exercise (waitUntil, errors, vars)."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Iterator

import pytest

import d1queue

from .conftest import ROOT, Host, start_host

# Q: a job row whose nullable columns are the last four parameters.
INSERT_JOB = (
    "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, available_at,"
    " reserved_at, reserved_until, reservation, created_at, unique_key)"
    " VALUES (?, 'default', 'noop', '{}', 3, 0, ?, ?, ?, 0, ?)"
)


def with_q(source: str) -> str:
    return f"Q = {INSERT_JOB!r}\n" + textwrap.dedent(source)


def test_health(host: Host) -> None:
    reply = host.get("/health")
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"ok": True, "version": d1queue.__version__}


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
    shutil.copytree(ROOT / "host" / "fixtures", root)
    (root / ".dev.vars").write_text("FIXTURE_SECRET=s3cret\n")
    h = start_host(root=root)
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
