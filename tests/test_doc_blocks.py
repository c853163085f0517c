"""Every fenced block of the README and docs/ (and the client's and the
own-worker example's READMEs) is run by a test as written, or marked a
sketch, or is text (tests/doc_blocks.py; docs/README.md says how to mark a
block). The walker is tried on pages and tests made up here, so it is seen
to fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import doc_blocks
from .doc_blocks import blocks, problems

FENCE = "```"


def test_every_block_of_the_docs_is_run_by_a_test_or_marked() -> None:
    found = problems()
    assert not found, "\n".join(found)


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


READS = """
from .doc_blocks import blocks_for

def test_a():
    (block,) = blocks_for("docs/a.md", "tests/test_a.py::test_a")
    exec(block)
"""

PAGE = f"""# A page

<!-- tested: tests/test_a.py::test_a -->
{FENCE}python
x = 1
{FENCE}

{FENCE}sh
# sketch: needs an account
wrangler deploy
{FENCE}

{FENCE}text
a diagram
{FENCE}

- In a list:

  {FENCE}js
  // sketch: inside a Worker
  await env.QUEUE.stats();
  {FENCE}
"""


def walk(root: Path) -> list[str]:
    return problems(root, ("docs/*.md",))


def test_a_page_whose_blocks_are_run_sketched_or_text_passes(tmp_path: Path) -> None:
    root = tree(tmp_path, {"docs/a.md": PAGE, "tests/test_a.py": READS})
    assert walk(root) == []
    found = blocks("docs/a.md", root)
    assert [(b.line, b.info, b.tested) for b in found] == [
        (4, "python", ("tests/test_a.py::test_a",)),
        (8, "sh", ()),
        (13, "text", ()),
        (19, "js", ()),
    ]
    assert found[3].text == "// sketch: inside a Worker\nawait env.QUEUE.stats();\n"
    assert doc_blocks.blocks_for("docs/a.md", "tests/test_a.py::test_a", root) == ["x = 1\n"]


def test_an_unmarked_block_is_named_with_its_line(tmp_path: Path) -> None:
    page = PAGE + f"\n{FENCE}python\nregistry.history('q', keep=False)\n{FENCE}\n"
    root = tree(tmp_path, {"docs/a.md": page, "tests/test_a.py": READS})
    (problem,) = walk(root)
    assert problem.startswith('docs/a.md:24: a ```python block starting "registry.history(')
    assert "neither run by a test" in problem


@pytest.mark.parametrize(
    ("first", "fine"),
    [
        ("# sketch: in a handler", True),
        ("// sketch: in a Worker", True),
        ("# a sketch of the call", False),  # the word alone is no mark
        ("# sketch:", False),  # nor is a mark without its why
    ],
)
def test_a_sketch_says_so_on_its_first_line(tmp_path: Path, first: str, fine: bool) -> None:
    page = f"{FENCE}python\n{first}\nqueue.dispatch()\n{FENCE}\n"
    root = tree(tmp_path, {"docs/a.md": page})
    assert (walk(root) == []) is fine


def test_a_text_block_may_hold_no_command(tmp_path: Path) -> None:
    page = f"{FENCE}text\nthe answer:\ncurl -s 127.0.0.1:8787/health\n{FENCE}\n"
    root = tree(tmp_path, {"docs/a.md": page})
    (problem,) = walk(root)
    assert "a text block holds a command ('curl -s 127.0.0.1:8787/health')" in problem


def test_a_tested_mark_needs_a_test_that_reads_the_block(tmp_path: Path) -> None:
    runs_a_copy = 'def test_a():\n    exec("x = 1")  # the text, copied: no blocks_for\n'
    other_page = READS.replace("docs/a.md", "docs/b.md")
    never = 'tests/test_a.py::test_a never calls blocks_for("docs/a.md", "tests/test_a.py::test_a")'
    for n, (test_file, expected) in enumerate(
        [
            (None, "tests/test_a.py does not exist"),
            ("def test_b():\n    pass\n", "tests/test_a.py has no function test_a"),
            (runs_a_copy, never),
            (other_page, never),
        ]
    ):
        root = tree(tmp_path / str(n), {"docs/a.md": PAGE, "docs/b.md": "no blocks\n"})
        if test_file:
            tree(root, {"tests/test_a.py": test_file})
        assert walk(root)[0] == f"docs/a.md:4: marked tested, but {expected}"


def test_a_test_may_read_its_blocks_through_a_helper_of_its_module(tmp_path: Path) -> None:
    helper = """
from .doc_blocks import blocks_for

def page_blocks():
    test = "tests/test_a.py::test_a"
    return [b for doc in ("docs/a.md",) for b in blocks_for(doc, test)]

def test_a():
    for block in page_blocks():
        exec(block)
"""
    root = tree(tmp_path, {"docs/a.md": PAGE, "tests/test_a.py": helper})
    assert walk(root) == []


def test_a_read_no_block_answers_is_named(tmp_path: Path) -> None:
    reads_more = READS + '\ndef test_c():\n    blocks_for("docs/a.md", "tests/test_a.py::test_c")\n'
    root = tree(tmp_path, {"docs/a.md": PAGE, "tests/test_a.py": reads_more})
    assert walk(root) == [
        'tests/test_a.py: blocks_for("docs/a.md", "tests/test_a.py::test_c"),'
        " but no block of docs/a.md names it"
    ]
    with pytest.raises(AssertionError, match=r"no block of docs/a\.md is marked"):
        doc_blocks.blocks_for("docs/a.md", "tests/test_a.py::test_c", root)
