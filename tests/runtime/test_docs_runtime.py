"""The documentation's examples, as written, against the Worker in the host
(one host for all of them: the session's).

The shell examples (the README's five minutes, docs/workflows.md's and
docs/flow-control.md's curl commands) run in bash, in order, in one
session, as a reader pastes them into a terminal beside `make dev`: in a
folder holding `.dev.vars`, with only the placeholders the docs name
replaced (the port 8787 by the host's, the README's `<id>` by the id the
push answered). Every request must succeed, and an answer the page shows in
a comment below its command (`# 201 {"queue": "default", …}`) must be what
the Worker answered: the status if shown, each field shown (`…` stands for
anything), lists at their length.

The Python Worker code of the README and docs/library.md runs in the
Worker's own Pyodide, through its routes and its cron."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..doc_blocks import blocks_for, run_async
from .conftest import NODE, ROOT, TOKEN, Host

ANY = "\x00any"
"""What `…` in a shown answer stands for: any value."""

PRELUDE = r"""
set -o pipefail
# Each request's status, exit code and body, in the order they ran; the body
# still goes to stdout, for the command's own pipes and captures.
curl() {
  local body status rc
  body=$(mktemp "$D1Q_DIR/body.XXXXXX")
  status=$(command curl -sS -o "$body" -w '%{http_code}' "$@"); rc=$?
  printf '%s %s %s\n' "$status" "$rc" "$body" >> "$D1Q_DIR/calls"
  cp "$body" "$D1Q_DIR/last"
  cat "$body"
  return $rc
}
# The README's <id>: the id of the answer before.
d1q_last_id() { sed -E 's/.*"id":"([^"]+)".*/\1/' "$D1Q_DIR/last"; }
d1q_block_done() { printf '%s %s\n' "$1" "$2" >> "$D1Q_DIR/blocks"; }
"""


@dataclass
class Shown:
    """An answer a page shows for its `curl`-th command of a block (from 0)."""

    curl: int
    status: int | None
    body: Any
    comment: str


@dataclass
class Call:
    status: int
    exit_code: int
    body: str


def scan(block: str) -> tuple[int, list[Shown]]:
    """The `curl` commands of a shell block, counted outside quotes and
    comments, and the answers its comments show, each for the command before
    it (a comment on the command's own line included)."""
    curls, shown = 0, []
    quote = ""
    i = 0
    while i < len(block):
        c = block[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            i += 1
        elif quote == '"':
            quote = "" if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or block[i - 1].isspace()):
            end = block.find("\n", i)
            end = len(block) if end < 0 else end
            answer = _answer(block[i + 1 : end].strip())
            if answer is not None:
                assert curls, f"an answer shown before any curl command: {block[i:end]}"
                shown.append(Shown(curls - 1, answer[0], answer[1], block[i:end]))
            i = end
            continue
        elif re.match(r"curl\s", block[i : i + 5]) and (i == 0 or block[i - 1] in " \t\n($|;&"):
            curls += 1
        i += 1
    return curls, shown


def _answer(comment: str) -> tuple[int | None, Any] | None:
    """A comment showing an answer: `201 {...}`, `{...}`, or `"key": value,
    ...`, then anything; None for prose."""
    m = re.match(r"(?:(?P<status>[1-5]\d\d)\s+)?(?P<rest>[{\"].*)$", comment)
    if m is None:
        return None
    rest = m["rest"]
    if rest.startswith("{"):
        depth, end = 0, 0
        for end, c in enumerate(rest):  # noqa: B007
            depth += {"{": 1, "}": -1}.get(c, 0)
            if depth == 0:
                break
        text = rest[: end + 1]
    else:
        text = "{" + rest + "}"
    return (int(m["status"]) if m["status"] else None), _loose_json(text)


def _loose_json(text: str) -> Any:
    """JSON as the docs show it: `…` (or `...`) for a part left out."""
    any_value = json.dumps(ANY)
    text = re.sub(r'"(?:[^"\\]|\\.)*…(?:[^"\\]|\\.)*"', lambda _: any_value, text)
    text = re.sub(r"\{\s*(?:\.\.\.|…)\s*\}|\[\s*(?:\.\.\.|…)\s*\]", lambda _: any_value, text)
    text = re.sub(r",\s*(?:\.\.\.|…)\s*(?=[}\]])", "", text)
    return json.loads(text)


def agrees(shown: Any, got: Any) -> bool:
    """Each field shown is in the answer with that value; lists at their length."""
    if shown == ANY:
        return True
    if isinstance(shown, dict):
        return isinstance(got, dict) and all(
            k in got and agrees(v, got[k]) for k, v in shown.items()
        )
    if isinstance(shown, list):
        return isinstance(got, list) and len(shown) == len(got) and all(map(agrees, shown, got))
    return bool(shown == got and isinstance(shown, bool) == isinstance(got, bool))


def placeholders(block: str, swaps: dict[str, str]) -> str:
    """`block` with the placeholders a reader fills in filled in."""
    for old, new in swaps.items():
        if old in block:
            block = block.replace(old, new)
    return block


def run_shell(blocks: list[str], folder: Path) -> list[Call]:
    """Run the blocks in one bash, in order, in `folder`: every request must
    succeed, or answer what its block shows, and every block end with
    status 0. Returns the requests."""
    work = folder / ".d1q"
    work.mkdir()
    (work / "calls").touch()
    script = PRELUDE + "".join(f"{b}\nd1q_block_done {n} $?\n" for n, b in enumerate(blocks))
    run = subprocess.run(
        ["bash", "--noprofile", "--norc", "-s"],
        input=script, cwd=folder, capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "D1Q_DIR": str(work), "HOME": str(folder)},
    )  # fmt: skip
    report = f"--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
    calls = []
    for line in (work / "calls").read_text().splitlines():
        status, code, body = line.split(" ", 2)
        calls.append(Call(int(status or 0), int(code), Path(body).read_text()))
    made = iter(calls)  # in the order the blocks make them, the first failure first
    for block in blocks:
        count, shown = scan(block)
        expected = {s.curl: s for s in shown}
        for k, call in zip(range(count), made, strict=False):
            where = f"request {k + 1} of the block:\n{block}\nanswered {call.status} {call.body}"
            assert call.exit_code == 0, f"{where}\n{report}"
            s = expected.get(k)
            if s is None or s.status is None:
                assert 200 <= call.status < 300, where
            else:
                assert call.status == s.status, f"{s.comment}\n{where}"
            if s is not None:
                assert agrees(s.body, json.loads(call.body)), f"{s.comment}\n{where}"
    assert len(calls) == sum(scan(b)[0] for b in blocks), ("requests made", calls, report)
    done = (work / "blocks").read_text().splitlines() if (work / "blocks").exists() else []
    assert done == [f"{n} 0" for n in range(len(blocks))], (done, report)
    return calls


def test_a_shown_answer_is_read_as_the_page_means_it() -> None:
    """How a block's comments are read: each answer belongs to the curl
    before it; `…` is any value; a field shown must be there, a list at its
    length; prose is no answer."""
    block = (
        'X=$(curl -s "$URL/a" -d \'{"k": "not # a comment"}\' | sed \'s/a/b/\')\n'
        '# 201 {"id": "01a2…", "ids": ["01…", "01…"], "ok": true, …}: then prose\n'
        'curl -s "$URL/b"   # "state":"ready","attempts":0\n'
        'curl -s "$URL/c"   # the cron, now\n'
    )
    count, shown = scan(block)
    assert count == 3
    assert [(s.curl, s.status) for s in shown] == [(0, 201), (1, None)]
    first, second = (s.body for s in shown)
    assert agrees(first, {"id": "x", "ids": ["a", "b"], "ok": True, "more": 1})
    assert not agrees(first, {"id": "x", "ids": ["a"], "ok": True})  # a list at its length
    assert not agrees(first, {"id": "x", "ids": ["a", "b"], "ok": 1})  # true is not 1
    assert not agrees(first, {"ids": ["a", "b"], "ok": True})  # a field shown is there
    assert agrees(second, {"state": "ready", "attempts": 0})
    assert not agrees(second, {"state": "completed", "attempts": 0})


def reader_folder(tmp_path: Path) -> Path:
    """Where a reader runs the commands: the repository's folder, as far as
    they read it (`.dev.vars`, with the token the host was given)."""
    (tmp_path / ".dev.vars").write_text(f"D1QUEUE_TOKEN={TOKEN}\n")
    return tmp_path


def port(host: Host) -> str:
    return host.url.rsplit(":", 1)[1]


# ------------------------------------------------------------ the blocks --


def test_the_readmes_five_minutes_run_as_written(clean_host: Host, tmp_path: Path) -> None:
    (block,) = blocks_for(
        "README.md",
        "tests/runtime/test_docs_runtime.py::test_the_readmes_five_minutes_run_as_written",
    )
    assert "PORT=8787;" in block and "/v1/jobs/<id>" in block
    filled = placeholders(
        block, {"PORT=8787;": f"PORT={port(clean_host)};", "<id>": "$(d1q_last_id)"}
    )
    calls = run_shell([filled], reader_folder(tmp_path))
    assert [c.status for c in calls] == [200, 201, 200]


def test_the_workflows_examples_run_as_written(clean_host: Host, tmp_path: Path) -> None:
    blocks = blocks_for(
        "docs/workflows.md",
        "tests/runtime/test_docs_runtime.py::test_the_workflows_examples_run_as_written",
    )
    url = "http://127.0.0.1:8787"
    assert url in blocks[0]
    calls = run_shell(
        [placeholders(b, {url: clean_host.url}) for b in blocks], reader_folder(tmp_path)
    )
    assert calls


def test_the_flow_control_examples_run_as_written(clean_host: Host, tmp_path: Path) -> None:
    blocks = blocks_for(
        "docs/flow-control.md",
        "tests/runtime/test_docs_runtime.py::test_the_flow_control_examples_run_as_written",
    )
    url = "http://127.0.0.1:8787"
    assert url in blocks[0]
    run_shell([placeholders(b, {url: clean_host.url}) for b in blocks], reader_folder(tmp_path))
    limits = clean_host.api("GET", "/v1/queues/api-calls/limits").json()
    assert limits["source"] == "api" and limits["limits"]["concurrency"] == 3


ENTRY = """
async def main(env):
    import json
    from types import SimpleNamespace

    import js
    import workers

    namespace = {"__name__": "doc_entry"}
    exec(compile(BLOCK, "<doc block>", "exec"), namespace)
    cls = namespace["Default"]
    entry = cls.__new__(cls)  # as workerd makes it: the Worker's own env and ctx
    entry.env, entry.ctx = worker.env, worker.ctx
    if VARS:  # the Worker's env with the page's [vars] too
        from pyodide.ffi import to_js

        added = to_js(VARS, dict_converter=js.Object.fromEntries)
        entry.env = workers._EnvWrapper(js.Object.assign(js.Object.new(), worker.env._env, added))
    answers = {}
    for path in PATHS:
        request = workers.python_from_rpc(js.Request.new("http://worker" + path))
        response = await entry.fetch(request)
        answers[path] = [response.status, await response.text()]
    if CRON:
        now = js.Date.now()
        await entry.scheduled(SimpleNamespace(cron="* * * * *", scheduledTime=now))
    return answers
"""


def run_entry(
    host: Host, block: str, paths: list[str], *, cron: bool = False, vars: str = ""
) -> dict[str, Any]:
    """The page's `Default`, defined by running `block` as a module of the
    Worker (its `jobs` is src/jobs.py), asked for `paths` over its fetch,
    with the `[vars]` of the TOML `vars` added to the Worker's env; `cron`:
    then its `scheduled` runs."""
    added = tomllib.loads(vars).get("vars", {})
    source = f"BLOCK = {block!r}\nPATHS = {paths!r}\nCRON = {cron!r}\nVARS = {added!r}\n"
    source += ENTRY
    answers: dict[str, Any] = host.python(source)
    return {path: (status, text) for path, (status, text) in answers.items()}


def test_the_entrypoints_run_in_the_worker(
    clean_host: Host,
) -> None:
    test = "tests/runtime/test_docs_runtime.py::test_the_entrypoints_run_in_the_worker"
    (readme,) = blocks_for("README.md", test)
    way1, way2, prefix = blocks_for("docs/library.md", test)
    paths = ["/queue/health", "/queue", "/hello", "/health"]
    for block in (readme, way1):  # d1queue_entrypoint(registry, prefix="/queue")
        answers = run_entry(clean_host, block, paths)
        assert answers["/queue/health"][0] == 200 and json.loads(answers["/queue/health"][1])["ok"]
        assert json.loads(answers["/queue"][1])["api"] == "/queue/v1"
        assert answers["/health"][0] == 404  # outside /queue: a JSON 404
        assert json.loads(answers["/health"][1])["error"]["code"] == "not_found"
    assert run_entry(clean_host, way1, ["/hello"])["/hello"] == (200, "hello")
    since = len(clean_host.output())
    answers = run_entry(clean_host, way2, paths, cron=True, vars=prefix)  # D1QUEUE_PREFIX
    assert answers["/queue/health"][0] == 200 and json.loads(answers["/queue/health"][1])["ok"]
    assert answers["/hello"] == (200, "my own routes") and answers["/health"] == (
        200,
        "my own routes",
    )
    clean_host.wait_for_output('"d1queue.drain"', since)  # its line may follow the answer
    drains = clean_host.events("d1queue.drain", since)
    assert [d["trigger"] for d in drains] == ["cron * * * * *"], drains


def migrations_applied(
    folder: Path, commands: str, python: Path, env: dict[str, str]
) -> tuple[set[str], list[str]]:
    """Run migration `commands` in bash in `folder` (a Worker's, its
    wrangler.toml), with `python`'s folder (the `d1queue` command's) first on
    the path and `env`; npx finds wrangler in this repository's node_modules.
    Returns the tables of the one local D1 they leave in .wrangler/state and
    the migrations applied to it, in order."""
    (folder / "node_modules").symlink_to(ROOT / "node_modules")
    run = subprocess.run(
        ["bash", "--noprofile", "--norc", "-e", "-s"], input=commands, cwd=folder,
        capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": f"{python}:{NODE.parent}:/usr/bin:/bin", "HOME": str(folder),
             "WRANGLER_SEND_METRICS": "false", "NO_COLOR": "1", **env},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    (database,) = [
        p for p in (folder / ".wrangler" / "state").rglob("*.sqlite") if p.name != "metadata.sqlite"
    ]
    with sqlite3.connect(database) as db:
        tables = {
            name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        applied = [name for (name,) in db.execute("SELECT name FROM d1_migrations ORDER BY id")]
    return tables, applied


def test_the_library_guides_migrations_apply_as_written(tmp_path: Path) -> None:
    """docs/library.md's wrangler.toml, and its migration commands run in
    its folder: d1queue's migrations copied, then applied by wrangler to the
    local D1 of that wrangler.toml."""
    test = "tests/runtime/test_docs_runtime.py::test_the_library_guides_migrations_apply_as_written"
    config, commands = blocks_for("docs/library.md", test)
    (tmp_path / "wrangler.toml").write_text(config)
    python = Path(sys.executable).parent
    tables, applied = migrations_applied(
        tmp_path, commands, python, {"PYTHONPATH": str(ROOT / "src")}
    )
    shipped = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    assert sorted(p.name for p in (tmp_path / "migrations").glob("*.sql")) == shipped
    assert sorted(p.name for p in (tmp_path / "db" / "mig").glob("*.sql")) == shipped
    assert {"d1queue_jobs", "d1queue_failed_jobs", "d1queue_schedules"} <= tables
    assert applied == shipped


async def test_the_python_client_runs_as_written(clean_host: Host) -> None:
    """docs/api.md's client calls, under CPython, over HTTP to the Worker:
    its URL in place of the page's, `token` the Worker's; `self.env.QUEUE`,
    which only the binding line uses, is any object."""
    (block,) = blocks_for(
        "docs/api.md", "tests/runtime/test_docs_runtime.py::test_the_python_client_runs_as_written"
    )
    url = "https://q.example.workers.dev"
    assert url in block
    this = SimpleNamespace(env=SimpleNamespace(QUEUE=object()))
    left = await run_async(
        placeholders(block, {url: clean_host.url}), {"self": this, "token": TOKEN}
    )
    assert left["state"]["state"] == "ready" and left["state"]["queue"] == "mail"
    assert left["b"]["batch"] and len(left["b"]["ids"]) == 1
    limits = clean_host.api("GET", "/v1/queues/crm/limits").json()["limits"]
    assert (limits["concurrency"], limits["group_concurrency"]) == (10, 1)
    waiting = [j for j in clean_host.api("GET", "/v1/queues").json()["queues"] if j["waiting"]]
    assert [(q["queue"], q["waiting"]) for q in waiting] == [("default", 1)]
