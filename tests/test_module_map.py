"""docs/architecture.md's module map ("## Where the code is") names every
module of src/d1queue, one a line under its folder's line, and names no
module that is gone: a module added, split off or moved without its line
fails here, saying which line to add where."""

from __future__ import annotations

import re
from pathlib import Path

from .doc_blocks import blocks_for

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
SECTION = "## Where the code is"
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+(?:/[\w.]+)*(?:\.py|/))(?:\s+(?P<what>\S.*))?$")
"""A line of the map: a module (`queue.py`) or a folder (`store/`), indented
two spaces a level under its folder, then what it holds."""


def mapped(lines: list[str]) -> dict[str, tuple[int, str]]:
    """Path (from the repository's root) -> the indent of its line and what
    the line says it holds. A line indented deeper than one level past the
    entry above it is that entry's text, wrapped."""
    out: dict[str, tuple[int, str]] = {}
    folders: list[tuple[int, str]] = []  # (indent, path) of the open folders
    last = -1
    for line in lines:
        indent = len(line) - len(line.lstrip(" "))
        match = ENTRY.match(line)
        if match is None or indent > last + 2:
            continue
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = (folders[-1][1] if folders else "") + match["name"]
        out[path] = (indent, match["what"] or "")
        if path.endswith("/"):
            folders.append((indent, path))
        last = indent
    return out


def is_init(path: Path) -> bool:
    """A package's __init__.py: its folder's line names it, a line of its
    own may say what it re-exports."""
    return path.name == "__init__.py" and path.is_file()


def problems(root: Path, block: str, package: str = "src/d1queue") -> list[str]:
    """What is wrong with the map of `package` (a folder under `root`): the
    map's block, its text."""
    doc = DOC.relative_to(ROOT)
    entries = mapped(block.splitlines())
    have = {package + "/"} | {
        str(p.relative_to(root)) + ("/" if p.is_dir() else "")
        for p in (root / package).rglob("*")
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.name != "__init__.py" and "__pycache__" not in p.parts)
    }
    found: list[str] = []
    for path in sorted(have - set(entries)):
        parent, _, name = path.rstrip("/").rpartition("/")
        name += "/" if path.endswith("/") else ""
        indent = entries[parent + "/"][0] + 2 if parent + "/" in entries else 0
        found.append(
            f"{path} is missing from {doc}'s module map ({SECTION!r}): add the line "
            f"{' ' * indent + name!r} followed by one line on what it holds, "
            f"under the line of its folder, {parent + '/'!r}"
        )
    for path, (_, what) in sorted(entries.items()):
        if path.startswith(package + "/") and path not in have and not is_init(root / path):
            found.append(
                f"{doc}'s module map names {path}, which does not exist: "
                "remove its line, or rename it to where the module went"
            )
        elif not path.startswith(package + "/") and not (root / path).exists():
            found.append(f"{doc}'s module map names {path}, which does not exist")
        elif not what:
            found.append(f"{path}: its line in {doc}'s module map says nothing of what it holds")
    return found


def test_the_module_map_names_every_module_and_no_other() -> None:
    (block,) = blocks_for(
        "docs/architecture.md",
        "tests/test_module_map.py::test_the_module_map_names_every_module_and_no_other",
    )
    found = problems(ROOT, block)
    assert not found, "\n".join(found)


def test_a_module_left_out_is_named_with_where_its_line_goes(tmp_path: Path) -> None:
    pkg = tmp_path / "src" / "pkg"
    (pkg / "store").mkdir(parents=True)
    for name in ("__init__.py", "store/__init__.py", "store/queue.py", "store/claim.py", "cli.py"):
        (pkg / name).write_text("")
    block = (
        "src/pkg/           the package\n"
        "  cli.py           the command line,\n"
        "                   wrapped onto a second line\n"
        "  store/           the store\n"
        "    queue.py       the driver\n"
        "    settle.py      settling\n"
    )
    assert problems(tmp_path, block, "src/pkg") == [
        f"src/pkg/store/claim.py is missing from docs/architecture.md's module map ({SECTION!r}): "
        "add the line '    claim.py' followed by one line on what it holds, "
        "under the line of its folder, 'src/pkg/store/'",
        "docs/architecture.md's module map names src/pkg/store/settle.py, which does not exist: "
        "remove its line, or rename it to where the module went",
    ]
    assert mapped(block.splitlines())["src/pkg/cli.py"] == (2, "the command line,")
