"""Fixtures for the CPython layer: SqliteD1 on real SQLite, migrations from
migrations/ exactly as wrangler applies them, and a clock tests can move."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from d1queue import D1Queue
from d1queue.testing import SqliteD1

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "migrations"


class Clock:
    """Epoch milliseconds that only move when a test says so."""

    def __init__(self, ms: int = 1_700_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += round(seconds * 1000)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db() -> Iterator[SqliteD1]:
    d = SqliteD1()
    d.apply_migrations(MIGRATIONS)
    yield d
    d.close()


@pytest.fixture
def queue(db: SqliteD1, clock: Clock) -> D1Queue:
    return D1Queue(db, clock=clock)


@pytest.fixture
def shared_file(tmp_path: Path) -> Path:
    """A database file several SqliteD1 objects open: several Workers, one D1."""
    path = tmp_path / "d1.sqlite"
    SqliteD1(path).apply_migrations(MIGRATIONS)
    return path
