"""The drain's per-job path does only what a job needs: counts, not timings
(the CPU figures are bench/cpu.py's)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from d1queue import Config, D1Queue, JobContext, Registry, drain
from d1queue.core.limits import Meter
from d1queue.store import sql
from d1queue.store.binding import json_loads, returns_no_rows


@pytest.mark.parametrize(
    "text",
    ['{"i":0}', "[1,2.5,null,true]", '"x"', "0", '{"a":{"b":[]}}', "NaN", '"\\u00e9"'],
)
def test_json_loads_reads_what_json_loads_reads(text: str) -> None:
    assert json.dumps(json_loads(text)) == json.dumps(json.loads(text))


@pytest.mark.parametrize("text", [" {}", "{} ", "{}x", "{", "", "\ufeff{}", "[1,]"])
def test_json_loads_refuses_or_accepts_as_json_loads_does(text: str) -> None:
    try:
        expected: Any = json.loads(text)
    except ValueError as exc:
        with pytest.raises(ValueError) as got:
            json_loads(text)
        assert str(got.value) == str(exc)
    else:
        assert json_loads(text) == expected


def test_only_writes_without_returning_are_read_without_their_rows() -> None:
    statements = {
        name: value
        for name, value in vars(sql).items()
        if name.isupper() and isinstance(value, str) and value.lstrip()[:6].isalpha()
    }
    for name, text in statements.items():
        head = text.lstrip().split(None, 1)[0].upper()
        if head == "SELECT" or "RETURNING" in text.upper():
            assert not returns_no_rows(text), name
    assert returns_no_rows(sql.CLAIM) and returns_no_rows(sql.DELETE_HELD)
    assert not returns_no_rows(sql.SELECT_CANDIDATES)
    assert not returns_no_rows("INSERT INTO t (a) VALUES (1) RETURNING a")
    assert not returns_no_rows("WITH x AS (SELECT 1) DELETE FROM t")


async def test_a_handler_that_uses_nothing_gets_no_meter(
    queue: D1Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Meter] = []
    child = Meter.child

    def counted(self: Meter, *args: Any, **kwargs: Any) -> Meter:
        made.append(m := child(self, *args, **kwargs))
        return m

    monkeypatch.setattr(Meter, "child", counted)
    reg = Registry()

    @reg.job("noop")
    async def noop(payload: Any) -> None:
        """Touches nothing of its context."""

    @reg.job("fan", subrequests=1)
    async def fan(payload: Any, ctx: JobContext) -> None:
        await ctx.queue.dispatch("noop", None)

    for _ in range(5):
        await queue.dispatch("noop", None)
    await queue.dispatch("fan", None)
    report = await drain(queue, reg, Config(plan="paid", batch_size=25))
    assert report.completed == 6  # the pushed job waits for the next run (a short round)
    assert len(made) == 1  # only the fan-out's budget
    assert (made[0].subrequests, made[0].used) == (1, 1)


_ROW = {
    "id": "0190abcdef0123456789abcdef012345",
    "queue": "q",
    "name": "j",
    "payload": '{"i":12}',
    "attempts": 1,
    "max_attempts": 3,
    "priority": 2,
    "available_at": 1_000,
    "created_at": 900,
    "locked_until": 0,
    "reserved_at": None,
    "reservation": None,
    "unique_key": "k",
    "last_error": "boom",
    "band": 2,
    "grp": "tenant-1",
    "slot": None,
    "gslot": None,
    "after": None,
    "waiting": 0,
    "batch": None,
    "dependents": 0,
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "cancel_at": None,
}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"locked_until": 5_000},  # a lock past the key's time
        {"reserved_at": 800, "locked_until": 2_000, "reservation": "t"},  # a lapsed lease
        {"payload": "null"},
        {"payload": " 1"},  # json.loads reads it; the fast path defers
        {"payload": "{"},  # undecodable: kept as text, explained
        {"payload": "[" * 70 + "]" * 70},  # past the depth limit
        {"payload": '{"a":' + "1" * 70 + "}"},  # long but shallow
        {"payload": None},
        {"attempts": 1.0},  # not an int: the general path makes it one
        {"unique_key": None, "last_error": None},
    ],
)
def test_row_to_job_fast_path_makes_what_the_general_path_makes(changes: dict[str, Any]) -> None:
    from d1queue.store.rows import _row_to_job, row_to_job

    row = {**_ROW, **changes}
    fast, general = row_to_job(row), _row_to_job(row)
    assert fast == general
    assert (fast.held, fast.payload_error) == (general.held, general.payload_error)
    assert fast.__dict__ == general.__dict__
    assert list(fast.__dict__) == list(general.__dict__)  # same field order, same repr
    assert repr(fast) == repr(general)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"locked_until": 5_000},
        {"locked_until": None},
        {"reserved_at": 800, "locked_until": 2_000, "reservation": "t"},
        {"payload": "null"},
        {"payload": " 1"},
        {"payload": "{"},
        {"payload": "[" * 70 + "]" * 70},
        {"payload": '{"a":' + "1" * 70 + "}"},
        {"payload": None},
        {"attempts": 1.0},
        {"unique_key": None, "last_error": None},
        {"traceparent": None},
        {"cancel_at": 1_500},
    ],
)
def test_a_row_read_by_position_makes_the_job_its_dict_makes(changes: dict[str, Any]) -> None:
    from d1queue.store.rows import row_to_job, values_to_job

    row = {**_ROW, **changes}
    by_position = values_to_job([row[c] for c in sql.JOB_COLUMN_NAMES])
    by_name = row_to_job(row)
    assert by_position == by_name
    assert (by_position.held, by_position.payload_error) == (by_name.held, by_name.payload_error)
    assert list(by_position.__dict__.items()) == list(by_name.__dict__.items())
    assert repr(by_position) == repr(by_name)


@pytest.mark.parametrize(
    ("params", "fast"),
    [
        (("a", 1, 2.5, None, True), True),
        ((2**53 - 2, -(2**53 - 2)), False),  # 16 digits: checked, and passes there
        ((10**15 - 1, -(10**15 - 1)), True),
        ((2**53 - 1,), False),  # refused by the checked path
        ((b"\x00",), False),  # bytes: converted by the checked path
        (("x" * 3,), True),
        (("1234567890123456",), False),  # digits in a string: only checked, not refused
        ((float("nan"),), False),
        ((1.5e300,), True),
    ],
)
def test_batches_skip_the_per_value_check_only_when_json_is_exact(
    params: tuple[Any, ...], fast: bool
) -> None:
    from d1queue.store.binding import _dumps_strict, _has_long_number, _plain_runs

    runs = _plain_runs([("SELECT ?", params), ("SELECT ?", params), ("SELECT 1", ())])
    if runs is None:
        assert not fast
        return
    sqls, groups = runs
    assert sqls == ["SELECT ?", "SELECT 1"]
    assert groups == [[params, params], [()]]
    try:
        text = _dumps_strict(groups)
    except ValueError:
        assert not fast
        return
    assert (not _has_long_number(text)) == fast


async def test_handlers_run_at_most_concurrency_at_once(queue: D1Queue) -> None:
    reg = Registry()
    running = 0
    most = 0
    order: list[int] = []

    @reg.job("slow")
    async def slow(payload: Any) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        order.append(payload)
        await asyncio.sleep(0.01)
        running -= 1

    @reg.job("quick")
    async def quick(payload: Any) -> None:
        order.append(payload)

    for i in range(7):
        await queue.dispatch("slow" if i % 3 else "quick", i)
    report = await drain(queue, reg, Config(plan="paid", batch_size=7, concurrency=3))
    assert report.completed == 7
    assert most == 3
    assert order == list(range(7))  # slots are taken first come, first served


async def test_a_cancelled_wait_for_a_slot_loses_no_slot() -> None:
    from d1queue.core.limits import Slots

    slots = Slots(1)
    assert slots.take_now()
    assert not slots.take_now()
    waiter = asyncio.ensure_future(slots.take())
    handed = asyncio.ensure_future(slots.take())
    await asyncio.sleep(0)
    waiter.cancel()  # cancelled while waiting: it leaves the line
    await asyncio.sleep(0)
    slots.give()  # to the next in line
    await handed
    assert not slots.take_now()
    late = asyncio.ensure_future(slots.take())
    await asyncio.sleep(0)
    slots.give()  # handed to `late`...
    late.cancel()  # ...which is cancelled before it runs: the slot moves on
    with pytest.raises(asyncio.CancelledError):
        await late
    assert slots.take_now()  # the slot `late` was handed is free again
    assert not slots.take_now()
