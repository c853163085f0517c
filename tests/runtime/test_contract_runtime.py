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
