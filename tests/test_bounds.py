"""bounds.json_depth: the depth check every request body passes before it is
parsed. It must count at least as deep as the parser would descend, on any
text, valid JSON or not, and its CPU must grow linearly with the text up to
the body limit (api.MAX_BODY_BYTES), whatever the text's shape."""

from __future__ import annotations

import contextlib
import json
import signal
import string
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from json.scanner import py_make_scanner  # type: ignore[attr-defined]
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from d1queue.core.bounds import MAX_JSON_DEPTH, json_depth, value_depth
from d1queue.interfaces.api import MAX_BODY_BYTES, json_object
from d1queue.interfaces.service import ApiError

# --------------------------------------------------------------- references --


def reference_depth(text: str) -> tuple[int, bool]:
    """The depth by a character-at-a-time state machine, as the parser reads
    strings: inside one a backslash escapes the next character; outside one a
    backslash is invalid JSON and stops the parser (True: it stopped there)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "\\":
            return deepest, True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest, False


def parser_descent(text: str) -> int:
    """How many arrays and objects deep Python's own JSON parser gets in
    `text` before it finishes or fails: the pure-Python scanner (the C one
    follows the same grammar) with its array and object parsers counted."""
    decoder = json.JSONDecoder()
    depth = deepest = 0

    def counted(parse: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            nonlocal depth, deepest
            depth += 1
            deepest = max(deepest, depth)
            try:
                return parse(*args)
            finally:
                depth -= 1

        return run

    decoder.parse_array = counted(decoder.parse_array)  # type: ignore[attr-defined]
    decoder.parse_object = counted(decoder.parse_object)  # type: ignore[attr-defined]
    decoder.scan_once = py_make_scanner(decoder)  # type: ignore[attr-defined]
    # Past Python's recursion limit the count is a lower bound.
    with contextlib.suppress(ValueError, RecursionError):
        decoder.decode(text)
    return deepest


# ------------------------------------------------------------- correctness --


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("", 0),
        ("1", 0),
        ('"x"', 0),
        ("[]", 1),
        ("{}", 1),
        ("[[], {}]", 2),
        ('{"a": [1, {"b": [[]]}]}', 5),
        ("[" * 8000 + "]" * 8000, 8000),
        ('{"a":' * 100 + "1" + "}" * 100, 100),
        ('{"a": "[[[[{{", "b": [1, {"c": null}]}', 3),  # brackets in a string
        ('["]]]]", [["{"]]]', 3),
        ('"\\"[["', 0),  # an escaped quote does not end the string
        ('["\\\\", [[1]]]', 3),  # an escaped backslash does not escape the quote
        ('["\\\\\\"[[[", 1]', 1),
        ('["\\u005b\\u007b", [1]]', 2),
        ('"unclosed [[[[', 0),
        ("[[[", 3),  # unclosed arrays count
        ("]]][[", 0),  # the parser stops at once; no depth below 0
        ('[[ \\" [[', 4),  # past a stray backslash it may count more, never less
    ],
)
def test_depth_of_examples(text: str, depth: int) -> None:
    assert json_depth(text) == depth
    assert json_depth(text) >= parser_descent(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)


@given(json_values, st.booleans())
@settings(max_examples=400, deadline=None)
def test_depth_of_json_agrees_with_the_value_and_the_parser(value: Any, ascii: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii)
    depth = json_depth(text)
    assert depth == value_depth(value, limit=1000) == reference_depth(text)[0]
    assert depth == parser_descent(text)


JSONISH = '[]{}"\\:, au0' + "é\u2028"
"""Characters that matter to the count (brackets, quotes, backslashes), some
that JSON needs around them, a `\\u` escape's letters and non-ASCII."""


@given(st.text(alphabet=JSONISH, max_size=80))
@settings(max_examples=2000, deadline=None)
@example('[[ \\" [[[')
@example('["\\"]]]" [[')
@example('\\"[[["')
def test_any_text_counts_at_least_as_deep_as_the_parser_descends(text: str) -> None:
    depth = json_depth(text)
    reference, stopped = reference_depth(text)
    assert depth >= parser_descent(text)
    assert depth >= reference
    if not stopped:  # no stray backslash: the reading of strings is the parser's
        assert depth == reference


@given(st.text(alphabet=string.printable, max_size=200))
@settings(max_examples=500, deadline=None)
def test_any_printable_text_counts_at_least_as_deep_as_the_parser_descends(text: str) -> None:
    assert json_depth(text) >= parser_descent(text)


def test_a_body_past_the_depth_limit_is_refused_before_parsing() -> None:
    body = '{"name": "x", "payload": ' + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(ApiError) as refused:
        json_object((body + "}").encode())
    assert refused.value.status == 422
    assert json_object(b'{"payload": "' + b"[" * 1000 + b'"}') == {"payload": "[" * 1000}


# --------------------------------------------------------------- linearity --

KIB = 1024


def repeat(unit: str, size: int, prefix: str = "") -> str:
    """`prefix` then `unit` repeated, `size` characters in all."""
    n = (size - len(prefix)) // len(unit)
    text = prefix + unit * n
    return text + unit[: size - len(text)]


SHAPES: dict[str, Callable[[int], str]] = {
    "quotes": lambda n: '"' * n,
    "quote-backslash": lambda n: repeat('"\\', n),
    "backslash-quote": lambda n: repeat('\\"', n),
    "unclosed string, then escaped quotes": lambda n: repeat('\\"', n, prefix='{"a": "'),
    "unclosed string, then quotes": lambda n: repeat('"', n, prefix='{"a": "\\'),
    "quote-backslash-quote": lambda n: repeat('"\\"', n),
    "deep brackets": lambda n: "[" * n,
    "brackets in a string": lambda n: '"' + "[" * (n - 2) + '"',
    "bracket-quote": lambda n: repeat('["', n),
    "closed and open": lambda n: repeat("[]{[", n),
}

RATIO = 4
"""How much more CPU a byte of a text 64 times longer may cost. A linear
check costs about the same per byte at both sizes (somewhat more at the
larger, which leaves the processor's caches); a quadratic one costs 64 times
more per byte."""


class OverBudget(Exception):
    pass


@contextmanager
def cpu_budget(seconds: float) -> Iterator[None]:
    """Raise OverBudget in the block once it has used `seconds` of process
    CPU (SIGPROF; the regex engine checks for signals as it runs), so a
    quadratic check fails in about a second instead of running for hours."""

    def over(signum: int, frame: Any) -> None:
        raise OverBudget

    previous = signal.signal(signal.SIGPROF, over)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def cpu(fn: Callable[[], object], repeats: int = 5) -> float:
    """The least CPU of `repeats` runs of fn. The thread's clock, not the
    process's: while a process CPU timer is armed (cpu_budget), Linux reads
    the process's clock at the scheduler tick's granularity (4 ms)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def per_byte_growth(shape: Callable[[int], str], small: int, large: int) -> float:
    """CPU of one check of a `large` text over that of `large // small`
    checks of a `small` one: the same number of bytes, so about 1 if the
    check is linear, `large / small` if it is quadratic. A run of the large
    text is stopped once it has used 4 times the CPU the assertion allows."""
    short, long = shape(small), shape(large)
    assert (len(short), len(long)) == (small, large)
    times = large // small
    batch = cpu(lambda: [json_depth(short) for _ in range(times)])
    budget = max(batch, 0.001) * RATIO * 4

    def guarded() -> None:
        with cpu_budget(budget):
            json_depth(long)

    try:
        one = cpu(guarded)
    except OverBudget:
        pytest.fail(
            f"{large:,} characters used over {budget * 1000:.0f} ms of CPU; "
            f"{times} times {small:,} characters {batch * 1000:.1f} ms"
        )
    return one / max(batch, 1e-6)


@pytest.mark.parametrize("name", list(SHAPES))
def test_cpu_grows_linearly_up_to_the_body_limit(name: str) -> None:
    shape = SHAPES[name]
    # Small sizes first: a quadratic check fails there within a second.
    assert per_byte_growth(shape, KIB, 64 * KIB) < RATIO
    assert MAX_BODY_BYTES == 1024 * KIB
    assert per_byte_growth(shape, 16 * KIB, MAX_BODY_BYTES) < RATIO


async def test_every_name_check_raises_the_one_error_type() -> None:
    import pytest

    from d1queue import D1Queue, Registry
    from d1queue.core.bounds import InvalidName, check_name, is_name
    from d1queue.interfaces.testing import database

    assert check_name("queue", "mail.out-1") == "mail.out-1" and is_name("a:b")
    for bad in ("", "a b", "x" * 65, None, 7, "é"):
        assert not is_name(bad)
        with pytest.raises(InvalidName):
            check_name("queue", bad)
    with pytest.raises(InvalidName):
        Registry().register("bad name", lambda p: None)  # type: ignore[arg-type, return-value]
    queue = D1Queue(database())
    with pytest.raises(InvalidName):
        await queue.size("bad queue")
    with pytest.raises(InvalidName):
        await queue.dispatch("x", None, queue="bad queue")
