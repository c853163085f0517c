"""The driver contract (tests/contract.py) again, inside Pyodide against
Miniflare's D1: handed the workers SDK's binding wrapper, as in production
(the driver sets it aside for the JS binding underneath, which costs far less
CPU per statement), and handed the raw binding (JsProxy; None must still
reach D1 as NULL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..contract import CASES
from .conftest import Host

CONTRACT = (Path(__file__).resolve().parents[1] / "contract.py").read_text()


def run_case(host: Host, case: str) -> None:
    source = CONTRACT + (
        f"\n\nasync def main(env):\n    await CASES[{case!r}](env.DB, Clock())\n    return 'ok'\n"
    )
    assert host.python(source) == "ok"


@pytest.mark.parametrize("case", sorted(CASES))
def test_contract_through_the_sdk_wrapper(host: Host, case: str) -> None:
    run_case(host, case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_contract_on_a_raw_binding(raw_host: Host, case: str) -> None:
    run_case(raw_host, case)


def test_the_driver_sees_which_binding_it_has(host: Host, raw_host: Host) -> None:
    probe = """
    from d1queue import D1Queue

    async def main(env):
        q = D1Queue(env.DB)
        job_id = await q.dispatch("t", None, unique_key=None)
        row = (await q.binding.run(
            "SELECT unique_key IS NULL AS null_key, typeof(unique_key) AS t FROM d1queue_jobs"
            " WHERE id = ?1", job_id)).rows[0]
        await q.clear("default")
        wrapped = type(env.DB).__name__ != "JsProxy"
        return {"raw": q.binding._raw, "handed_the_sdk_wrapper": wrapped, **row}
    """
    assert host.python(probe) == {
        "raw": True,
        "handed_the_sdk_wrapper": True,
        "null_key": 1,
        "t": "null",
    }
    assert raw_host.python(probe) == {
        "raw": True,
        "handed_the_sdk_wrapper": False,
        "null_key": 1,
        "t": "null",
    }


CONVERSIONS = """
from d1queue.store.binding import Binding

MAX = 2**53 - 2  # d1queue.core.bounds.MAX_SAFE_INT: from 2^53 - 1 up Pyodide sends a BigInt
VALUES = {
    "none": None,
    "max": MAX,
    "min": -MAX,
    "zero": 0,
    "half": 1.5,
    "huge": 1e300,
    "true": True,
    "text": 'a "quoted" \\\\ line\\nwith é and 🦆',
    "brackets": "[1, [2]]",
    "bytes": b"\\x00\\x01\\xfe\\xff",
    "empty_bytes": b"",
}
# INTEGER affinity, as d1queue's own integer columns: D1 binds every JS
# number as a REAL (checked: bind(5) into an untyped column reads typeof
# 'real'), and the column makes the exact ones integers again.
T = "CREATE TABLE IF NOT EXISTS conv_t (k TEXT PRIMARY KEY, v INTEGER)"
INSERT = "INSERT INTO conv_t (k, v) VALUES (?1, ?2)"
READ = "SELECT k, v, typeof(v) AS t FROM conv_t ORDER BY k"


async def refused(send):
    try:
        await send()
    except Exception as exc:
        return "D1_TYPE_ERROR" if "D1_TYPE_ERROR: Type 'bigint'" in str(exc) else str(exc)
    return "accepted"


async def main(env):
    b = Binding(env.DB)
    await b.run(T)
    out = {}
    for how in ("run", "batch"):
        await b.run("DELETE FROM conv_t")
        if how == "run":
            for k, v in VALUES.items():
                await b.run(INSERT, k, v)
            rows = (await b.run(READ)).rows
        else:
            # Runs of different SQL texts in one batch, in order: the SELECT
            # at the end sees every INSERT before it.
            stmts = [(INSERT, (k, v)) for k, v in VALUES.items()]
            rows = (await b.batch([*stmts[:3], ("SELECT 1", ()), *stmts[3:], (READ, ())]))[-1].rows
        # Rows read by position: each row's values in column order, the same
        # values as by name (a BLOB as bytes), after writes in the same batch.
        if how == "run":
            by_position = (await b.run(READ, positional=True)).rows
        else:
            none = ("DELETE FROM conv_t WHERE k = 'none of them'", ())
            mixed = [none, ("SELECT 1", ()), (READ, ())]
            by_position = (await b.batch(mixed, positional=True))[-1].rows
        out[how] = {
            "by_position": by_position == [list(r.values()) for r in rows],
            "same": {r["k"]: r["v"] == (1 if r["k"] == "true" else VALUES[r["k"]]) for r in rows},
            "types": {r["k"]: r["t"] for r in rows},
            "py": {r["k"]: type(r["v"]).__name__ for r in rows},
        }
        for big in (MAX + 1, 2**60, -(2**60)):
            out[how][f"big {big}"] = await refused(
                (lambda: b.run(INSERT, "big", big))
                if how == "run"
                else (lambda: b.batch([(INSERT, ("ok", 1)), (INSERT, ("big", big))]))
            )
    left = await b.run("SELECT count(*) AS n FROM conv_t WHERE k = 'ok'")
    out["left_by_refused_batches"] = left.rows[0]["n"]
    await b.run("DROP TABLE conv_t")
    return out
"""


@pytest.mark.parametrize("which", ["sdk", "raw"])
def test_values_cross_into_d1_and_back_unchanged(host: Host, raw_host: Host, which: str) -> None:
    """None as SQL NULL, ints to ±(2^53 - 2) exactly, bytes as a BLOB read
    back as bytes, through single statements and through batches (which
    send their values as one JSON text), rows read by name or by position,
    handed the SDK's wrapper or the raw binding; an int past that is refused
    by D1 as before, and a refused batch writes nothing."""
    out = (host if which == "sdk" else raw_host).python(CONVERSIONS)
    types = {
        "none": "null",
        "max": "integer",
        "min": "integer",
        "zero": "integer",
        "half": "real",
        "huge": "real",
        "true": "integer",
        "text": "text",
        "brackets": "text",
        "bytes": "blob",
        "empty_bytes": "blob",
    }
    py = {
        "none": "NoneType",
        "max": "int",
        "min": "int",
        "zero": "int",
        "half": "float",
        "huge": "float",
        "true": "int",
        "text": "str",
        "brackets": "str",
        "bytes": "bytes",
        "empty_bytes": "bytes",
    }
    for how in ("run", "batch"):
        assert out[how]["same"] == dict.fromkeys(types, True), out[how]
        assert out[how]["types"] == types
        assert out[how]["py"] == py
        assert out[how]["by_position"], out[how]
        for big in (2**53 - 1, 2**60, -(2**60)):
            assert out[how][f"big {big}"] == "D1_TYPE_ERROR", out[how]
    assert out["left_by_refused_batches"] == 0


def test_a_drain_prepares_each_sql_text_once(clean_host: Host) -> None:
    """The hot path's per-statement cost: a drain of 60 jobs (3 rounds)
    prepares each distinct SQL text once, and binds a batch's values with one
    JSON text (deterministic counts, not timings)."""
    result = clean_host.python(
        """
        from d1queue import Config, D1Queue, Registry, drain
        from d1queue.store.binding import Binding

        async def main(env):
            reg = Registry()

            @reg.job("noop", timeout_s=5)
            async def noop(payload):
                pass

            b = Binding(env.DB)
            q = D1Queue(b)
            for i in range(60):
                await q.dispatch("noop", {"i": i})
            prepares, parses = [], []

            class Counted:  # the JS binding, its prepare() calls counted
                def __init__(self, js):
                    self.js = js

                def prepare(self, sql):
                    prepares.append(sql)
                    return self.js.prepare(sql)

                def batch(self, statements):
                    return self.js.batch(statements)

            parse = b._parse
            b.db, b._parse = Counted(b.db), lambda text: parses.append(text) or parse(text)
            report = await drain(q, reg, Config(plan="paid", batch_size=25))
            return {
                "completed": report.completed,
                "statements": report.statements,
                "queries": report.queries,
                "prepares": len(prepares),
                "distinct": len(set(prepares)),
                "parses": len(parses),
            }
        """
    )
    assert result["completed"] == 60
    assert result["prepares"] == result["distinct"], result
    assert result["statements"] > 3 * result["prepares"], result
    # one JSON.parse per batch: the batches, less the single-statement runs
    assert result["parses"] <= result["queries"], result
