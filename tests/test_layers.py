"""The library's modules import each other without a circle; the folders are
the layers (core, store, features, interfaces), and no module imports from
a layer above its own; only the store speaks to D1.

Every import counts, wherever it is written: at the top, inside a function,
or under `if TYPE_CHECKING:` (a type-only import still ties the two modules
together: each must be read to understand the other). Imports are read from
the source (AST), so a module that is never imported is checked too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "d1queue"

DRIVER = {"d1queue.store.binding", "d1queue.store.sql"}
"""The modules that speak to D1: statements and the binding."""
LAYERS = ("core", "store", "features", "interfaces")
"""The package's folders, lowest first: a module may import from its own
layer and the ones below."""


def layer(module: str) -> int | None:
    """The layer of a module (None: the package itself, which re-exports)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in it."""
    known = set(modules)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    found.add(sub)  # `from . import sql`: the submodule
                elif target in known:
                    found.add(target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def floors(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The modules by floor: floor 0 imports none of the package's modules,
    floor n only modules below it. A circle's modules share one floor,
    named together in brackets."""
    group = {m: m for m in graph}
    for component in circles(graph):
        label = "[" + " ".join(component) + "]"
        for m in component:
            group[m] = label
    deps: dict[str, set[str]] = {}
    for m, targets in graph.items():
        deps.setdefault(group[m], set()).update(group[t] for t in targets if group[t] != group[m])
    level: dict[str, int] = {}

    def floor_of(g: str) -> int:
        if g not in level:
            level[g] = 1 + max((floor_of(d) for d in deps[g]), default=-1)
        return level[g]

    out: list[list[str]] = []
    for g in sorted(deps, key=floor_of):
        while len(out) <= level[g]:
            out.append([])
        out[level[g]].append(g)
    return [sorted(f) for f in out]


def describe(graph: Mapping[str, set[str]]) -> str:
    """The floors, one a line, module names without the package's."""
    return "\n".join(
        f"floor {n}: " + ", ".join(m.replace(f"{PACKAGE.name}.", "") for m in f)
        for n, f in enumerate(floors(graph))
    )


def reach(graph: Mapping[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_modules_import_each_other_without_a_circle() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found, f"import circles: {found}\nthe import graph's floors:\n{describe(graph)}"


def test_the_core_reaches_no_driver() -> None:
    graph = import_graph()
    assert set(graph) >= DRIVER
    core = [m for m in graph if layer(m) == 0]
    assert len(core) > 10, core
    wrong = {m: sorted(reach(graph, m) & DRIVER) for m in sorted(core)}
    wrong = {m: found for m, found in wrong.items() if found}
    assert not wrong, f"core modules reaching the driver: {wrong}\n{describe(graph)}"


def test_every_module_sits_in_a_layer_and_imports_none_above_it() -> None:
    graph = import_graph()
    outside = ("d1queue", "d1queue.__main__", "d1queue.testing")
    loose = [m for m in graph if layer(m) is None and m not in outside]
    assert not loose, f"modules outside the layers: {loose}"
    upward = {
        m: sorted(t for t in targets if (layer(t) or 0) > (layer(m) or 0))
        for m, targets in graph.items()
        if layer(m) is not None
    }
    upward = {m: t for m, t in upward.items() if t}
    assert not upward, f"imports from a layer above: {upward}\n{describe(graph)}"


def test_only_the_store_imports_the_driver() -> None:
    graph = import_graph()
    speaking = sorted(m for m, targets in graph.items() if targets & DRIVER)
    assert all(layer(m) == 1 for m in speaking), speaking


def test_the_graph_reads_every_kind_of_import(tmp_path: Path) -> None:
    """A type-only import and a function's import count as much as a
    top-level one; `from . import x` is module x."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "d.py").write_text("from .. import a\nfrom ..b import f\n")
    modules = module_names(pkg)
    graph = {name: imports(name, path, modules) for name, path in modules.items()}
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.sub.d"] == {"pkg.a", "pkg.b"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert floors(graph) == [["[pkg.a pkg.b pkg.c]", "pkg", "pkg.sub"], ["pkg.sub.d"]]


def test_the_package_root_holds_only_the_public_names() -> None:
    """Outside the layers, the package root holds only what a user imports
    (`from d1queue import ...`, `python -m d1queue`, the test kit at its
    documented path), and installs no import hook: a module is imported
    under its own path only."""
    import subprocess
    import sys

    import d1queue
    from d1queue import testing
    from d1queue.interfaces import testing as kit

    assert sorted(m for m in module_names() if layer(m) is None) == [
        "d1queue",
        "d1queue.__main__",
        "d1queue.testing",
    ]
    assert all(hasattr(d1queue, name) for name in d1queue.__all__)
    defined = [n for n, v in vars(kit).items() if getattr(v, "__module__", "") == kit.__name__]
    public = [n for n in defined if not n.startswith("_")]
    assert "Kit" in public and all(getattr(testing, n) is getattr(kit, n) for n in public)
    assert testing.MIGRATIONS is kit.MIGRATIONS
    code = (
        "import sys; before = list(sys.meta_path); import d1queue, d1queue.testing; "
        "assert sys.meta_path == before, sys.meta_path; import d1queue.queue"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "ModuleNotFoundError: No module named 'd1queue.queue'" in run.stderr, run.stderr


RUNTIME_ONLY = {"workers", "js", "pyodide", "pyodide_js"}
"""What exists only inside a Worker: the SDK and Pyodide's modules."""
GLUE = "d1queue.interfaces.cloudflare"
"""The one module allowed to import them (the Worker glue)."""


def test_only_the_worker_glue_imports_the_sdk_or_pyodide() -> None:
    found: dict[str, set[str]] = {}
    for name, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = {node.module.split(".")[0]}
            else:
                continue
            if tops & RUNTIME_ONLY:
                found.setdefault(name, set()).update(tops & RUNTIME_ONLY)
    sdk = {m for m, tops in found.items() if "workers" in tops}
    assert sdk == {GLUE}, f"the workers SDK imported outside the glue: {found}"
    # The producer client converts a dict to a JS object for a raw binding
    # (js, pyodide.ffi), inside a function that runs only in Pyodide.
    assert set(found) <= {GLUE, "d1queue.interfaces.client"}, found
    graph = import_graph()
    importers = sorted(m for m, targets in graph.items() if GLUE in targets)
    assert not importers, f"library modules importing the glue: {importers}"
