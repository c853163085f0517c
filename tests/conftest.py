"""Fixtures for the CPython layer: SqliteD1 on real SQLite, migrations from
migrations/ exactly as wrangler applies them, and a clock tests can move."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from d1queue import D1Queue
from d1queue.core.shards import Routing
from d1queue.interfaces.testing import MIGRATIONS, SqliteD1
from d1queue.store.shardset import ShardSet

from .contract import Clock
from .http_server import Server, running_server

ROOT = Path(__file__).resolve().parent.parent


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
def sharded(clock: Clock) -> Iterator[ShardSet]:
    """Two fresh SQLite databases as shards 0 and 1, queues routed by hash."""
    dbs = []
    for _ in range(2):
        d = SqliteD1()
        d.apply_migrations()
        dbs.append(d)
    yield ShardSet([D1Queue(d, clock=clock) for d in dbs], Routing(2))
    for d in dbs:
        d.close()


@pytest.fixture
def shared_file(tmp_path: Path) -> Path:
    """A database file several SqliteD1 objects open: several Workers, one D1."""
    path = tmp_path / "d1.sqlite"
    SqliteD1(path).apply_migrations(MIGRATIONS)
    return path


@pytest.fixture
def server() -> Iterator[Server]:
    """A scripted HTTP server on 127.0.0.1 (tests/http_server.py)."""
    with running_server() as s:
        yield s
