"""The fenced blocks of the documentation and what each one is: run by a
test as written, a sketch, or text (docs/README.md says how to mark them).

    <!-- tested: tests/test_docs_run.py::test_x -->
    ```python
    ...                                 # test_x reads it with
    ```                                 # blocks_for("docs/x.md", "tests/test_docs_run.py::test_x")

    ```python
    # sketch: inside a handler          # a comment as the block's first line
    ```

    ```text
    a diagram, a listing, an answer     # no code, no command
    ```

`problems()` is what tests/test_doc_blocks.py asserts is empty: a block that
is none of these, a `tested` marker whose test does not read the block
through `blocks_for` (by the AST of its file), a `blocks_for` call
that no marker answers, a command in a text block."""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

DOCS = ("README.md", "docs/*.md", "clients/ts/README.md", "examples/own-worker/README.md")
"""The pages whose every block is run by a test or marked (globs, from ROOT)."""

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
TESTED = re.compile(r"^\s*<!--\s*tested:\s*(?P<tests>.*?)\s*-->\s*$")
TEST_ID = re.compile(r"^tests/[\w/]+\.py::test_\w+$")
SKETCH = re.compile(r"^(#|//|--)\s*sketch:\s*\S")
COMMAND = re.compile(
    r"^\s*(\$\s+)?(curl|make|npx|npm|node|python3?|pip|uv|wrangler|pywrangler|bash|echo|cd|export)\s"
)
"""A line of a text block that reads as a command someone would run."""
HELPER = "blocks_for"


@dataclass(frozen=True)
class Block:
    doc: str
    """The page, from the repository's root: `docs/workflows.md`."""
    line: int
    """The opening fence's line, from 1."""
    info: str
    """The fence's info string: `python`, `sh`, `text`, or ``."""
    text: str
    """The block's lines as written (less the fence's indent), each ending in a newline."""
    tested: tuple[str, ...]
    """The tests the marker before the fence names: `tests/x.py::test_y`."""

    @property
    def first(self) -> str:
        return next((line.strip() for line in self.text.splitlines() if line.strip()), "")

    @property
    def sketch(self) -> bool:
        return bool(SKETCH.match(self.first))

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_paths(root: Path = ROOT, docs: Iterable[str] = DOCS) -> list[str]:
    return sorted(
        {str(p.relative_to(root)) for pattern in docs for p in root.glob(pattern) if p.is_file()}
    )


def blocks(doc: str, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of page `doc` (a path from root), in order."""
    lines = (root / doc).read_text(encoding="utf-8").splitlines(keepends=True)
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i].rstrip("\n"))
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        closing = re.compile(rf"^ {{0,{indent + 3}}}{fence[0]}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), len(lines))
        body = "".join(
            line[indent:] if line[:indent].isspace() else line for line in lines[i + 1 : end]
        )
        before = lines[i - 1] if i else ""
        marker = TESTED.match(before)
        tests = tuple(t for t in re.split(r"[,\s]+", marker["tests"]) if t) if marker else ()
        found.append(Block(doc, i + 1, opening["info"].strip(), body, tests))
        i = end + 1
    return found


def blocks_for(doc: str, test: str, root: Path = ROOT) -> list[str]:
    """The text of each block of `doc` whose marker names `test`, in order:
    how a test reads the blocks it runs, so the walker can see it does."""
    texts = [b.text for b in blocks(doc, root) if test in b.tested]
    assert texts, f"no block of {doc} is marked <!-- tested: {test} -->"
    return texts


async def run_async(block: str, names: dict[str, Any]) -> dict[str, Any]:
    """Run `block`, which awaits at its top level as a handler's code does,
    with `names` defined; returns the names it left."""
    source = "async def __block__():\n" + textwrap.indent(block, "    ") + "\n    return locals()\n"
    exec(compile(source, "<doc block>", "exec"), names)
    left: dict[str, Any] = await names["__block__"]()
    return left


# ------------------------------------------------------------ the walker --


def _strings(tree: ast.AST) -> dict[str, set[str]]:
    """The strings each name under `tree` is given: `test = "..."`, or
    `for doc in ("a.md", "b.md")`."""
    values: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            targets, options = node.targets, [node.value]
        elif isinstance(node, ast.For | ast.comprehension) and isinstance(
            node.iter, ast.Tuple | ast.List
        ):
            targets, options = [node.target], node.iter.elts
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and all(
                isinstance(o, ast.Constant) and isinstance(o.value, str) for o in options
            ):
                values.setdefault(target.id, set()).update(o.value for o in options)
    return values


def _helper_calls(tree: ast.AST) -> list[tuple[str, str]]:
    """(doc, test) of each blocks_for(doc, test) call under `tree`, its
    arguments strings, or names given strings under `tree`."""
    names = _strings(tree)

    def strings(arg: ast.expr) -> set[str]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return {arg.value}
        return names.get(arg.id, set()) if isinstance(arg, ast.Name) else set()

    calls = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == HELPER
            and len(node.args) >= 2
        ):
            calls += [(d, t) for d in strings(node.args[0]) for t in strings(node.args[1])]
    return calls


def _reads(root: Path, test: str, doc: str) -> str | None:
    """Why `test` (tests/x.py::test_y) does not read its blocks of `doc`, or None.
    It reads them if its function, or a function of its module it calls
    (however deep), calls blocks_for(doc, test) with those two strings."""
    path, name = test.split("::")
    source = root / path
    if not source.is_file():
        return f"{path} does not exist"
    functions = {
        node.name: node
        for node in ast.parse(source.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    if name not in functions:
        return f"{path} has no function {name}"
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if (doc, test) in _helper_calls(functions[current]):
            return None
        todo += [
            n.func.id
            for n in ast.walk(functions[current])
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in functions
        ]
    return f'{test} never calls {HELPER}("{doc}", "{test}")'


def _unmarked(block: Block) -> str | None:
    """Why `block`, marked as no test's, is not fine as it is, or None."""
    if block.info == "text":
        commands = [line.strip() for line in block.text.splitlines() if COMMAND.match(line)]
        if commands:
            return f"a text block holds a command ({commands[0]!r}): run it in a test, or sketch it"
        return None
    if block.sketch:
        return None
    return (
        f"a ```{block.info} block starting {block.first[:50]!r} is neither run by a test"
        " (<!-- tested: tests/x.py::test_y --> before its fence) nor a sketch (`# sketch: why`"
        " or `// sketch: why` as its first line; docs/README.md)"
    )


def _calls_in_tests(root: Path) -> list[tuple[Path, str, str]]:
    """(file, doc, test) of each blocks_for call in a function under root/tests."""
    calls = []
    for path in sorted((root / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = {
            call
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for call in _helper_calls(node)
        }
        calls += [(path.relative_to(root), doc, test) for doc, test in sorted(found)]
    return calls


def problems(root: Path = ROOT, docs: Iterable[str] = DOCS) -> list[str]:
    """Every block neither run by a test nor marked, and every marker or
    blocks_for call that does not hold."""
    found: list[str] = []
    marked: set[tuple[str, str]] = set()
    for doc in doc_paths(root, docs):
        for block in blocks(doc, root):
            for test in block.tested:
                if not TEST_ID.match(test):
                    found.append(f"{block.where()}: {test!r} is not a test (tests/x.py::test_y)")
                    continue
                marked.add((doc, test))
                why = _reads(root, test, doc)
                if why:
                    found.append(f"{block.where()}: marked tested, but {why}")
            why = None if block.tested else _unmarked(block)
            if why:
                found.append(f"{block.where()}: {why}")
    walked = set(doc_paths(root, docs))
    for path, doc, test in _calls_in_tests(root):
        if doc in walked and (doc, test) not in marked:
            found.append(f'{path}: {HELPER}("{doc}", "{test}"), but no block of {doc} names it')
    return found
