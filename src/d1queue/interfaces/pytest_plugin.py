"""d1queue's pytest plugin: fixtures for testing your own handlers, loaded by
pytest on its own once d1queue is installed (the wheel's `pytest11` entry
point; `-p no:d1queue` turns it off).

Fixtures (each made afresh for every test):

- `d1queue_registry`: your Registry. Override it in your `conftest.py`;
  the plugin's own raises, saying so.
- `d1queue_clock`: a `testing.Clock` that moves only when told.
- `d1queue_config`: the Config drains and job runs use (default Config()).
- `d1queue_db`: a `SqliteD1` with d1queue's schema, closed after the test.
- `d1queue_queue`: a D1Queue on that database and clock, with your registry.
- `d1queue`: a `testing.Kit` over all of them.

An `async def` test that takes any of these fixtures, or is marked
`@pytest.mark.d1queue`, is run by this plugin on an event loop of its own,
so no async plugin or `asyncio_mode` is needed. A test another plugin has
already made synchronous (pytest-asyncio's auto mode, an `asyncio` or
`anyio` mark) is left to that plugin.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import pytest

from ..core.config import Config
from ..core.registry import Registry
from ..store.queue import D1Queue
from .testing import Clock, Kit, SqliteD1, database

FIXTURES = frozenset(
    {
        "d1queue",
        "d1queue_clock",
        "d1queue_config",
        "d1queue_db",
        "d1queue_queue",
        "d1queue_registry",
    }
)
"""The fixtures whose async tests this plugin runs."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "d1queue: run this async test on an event loop of d1queue's test plugin"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an async test of ours to the end on a fresh event loop. First of
    the implementations (tryfirst): pytest's own fails any coroutine test."""
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test):
        return None  # a sync test, or one another async plugin already wrapped
    if not (FIXTURES & set(pyfuncitem.fixturenames) or pyfuncitem.get_closest_marker("d1queue")):
        return None  # not ours: left to whatever async plugin the project uses
    funcargs = pyfuncitem.funcargs
    if "anyio_backend" in funcargs:
        return None  # anyio's plugin runs it, on the backend the test asked for
    names = inspect.signature(test).parameters
    asyncio.run(test(**{name: funcargs[name] for name in names if name in funcargs}))
    return True


@pytest.fixture
def d1queue_registry() -> Registry:
    """Your Registry: override this fixture in your conftest.py."""
    pytest.fail(
        "d1queue's fixtures need your Registry: define a fixture named "
        "`d1queue_registry` that returns it, in your conftest.py",
        pytrace=False,
    )


@pytest.fixture
def d1queue_clock() -> Clock:
    return Clock()


@pytest.fixture
def d1queue_config() -> Config:
    return Config()


@pytest.fixture
def d1queue_db() -> Iterator[SqliteD1]:
    db = database()
    yield db
    db.close()


@pytest.fixture
def d1queue_queue(
    d1queue_db: SqliteD1, d1queue_clock: Clock, d1queue_registry: Registry
) -> D1Queue:
    # Completed jobs kept, as a deployment's default (D1QUEUE_KEEP_COMPLETED_S).
    return D1Queue(d1queue_db, registry=d1queue_registry, clock=d1queue_clock, keep_completed=True)


@pytest.fixture
def d1queue(
    d1queue_registry: Registry,
    d1queue_db: SqliteD1,
    d1queue_clock: Clock,
    d1queue_config: Config,
    d1queue_queue: D1Queue,
) -> Kit:
    kit = Kit(d1queue_registry, db=d1queue_db, clock=d1queue_clock, config=d1queue_config)
    kit.queue = d1queue_queue  # one queue, so a test holding both sees one object
    return kit
