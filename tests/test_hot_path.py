"""The drain's per-job path does only what a job needs: counts, not timings
(the CPU figures are bench/cpu.py's)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from d1queue import Config, D1Queue, JobContext, Registry, drain, sql
from d1queue.binding import json_loads, returns_no_rows
from d1queue.limits import Meter


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
