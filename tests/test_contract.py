"""The driver contract (tests/contract.py) against SqliteD1 on a real file."""

from __future__ import annotations

from pathlib import Path

import pytest

from d1queue.interfaces.testing import SqliteD1

from .contract import CASES, Clock


@pytest.mark.parametrize("case", sorted(CASES))
async def test_contract(case: str, shared_file: Path) -> None:
    await CASES[case](SqliteD1(shared_file), Clock())
