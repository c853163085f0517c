"""Module paths from before the package was grouped into layers, kept as
aliases: `import d1queue.queue` gives `d1queue.store.queue`, the same module
object, so code written against the old paths keeps working. One table, one
import hook; no module is kept twice."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

MOVED = {
    "d1queue.bounds": "d1queue.core.bounds",
    "d1queue.errors": "d1queue.core.errors",
    "d1queue.log": "d1queue.core.log",
    "d1queue.limits": "d1queue.core.limits",
    "d1queue.shards": "d1queue.core.shards",
    "d1queue.job": "d1queue.core.job",
    "d1queue.schedule": "d1queue.core.schedule",
    "d1queue.registry": "d1queue.core.registry",
    "d1queue.context": "d1queue.core.context",
    "d1queue.config": "d1queue.core.config",
    "d1queue.outbound": "d1queue.core.outbound",
    "d1queue.guard": "d1queue.core.guard",
    "d1queue.sql": "d1queue.store.sql",
    "d1queue.binding": "d1queue.store.binding",
    "d1queue.queue": "d1queue.store.queue",
    "d1queue.admin": "d1queue.store.admin",
    "d1queue.shardset": "d1queue.store.shardset",
    "d1queue.stats": "d1queue.store.stats",
    "d1queue.aggregate": "d1queue.store.aggregate",
    "d1queue.schedules": "d1queue.store.schedules",
    "d1queue.dashboard.store": "d1queue.store.dashboard",
    "d1queue.worker": "d1queue.features.drain",
    "d1queue.wake": "d1queue.features.wake",
    "d1queue.crons": "d1queue.features.cron",
    "d1queue.http_job": "d1queue.features.http_request",
    "d1queue.router": "d1queue.interfaces.router",
    "d1queue.api": "d1queue.interfaces.api",
    "d1queue.service": "d1queue.interfaces.service",
    "d1queue.openapi": "d1queue.interfaces.openapi",
    "d1queue.testing": "d1queue.interfaces.testing",
    "d1queue.dashboard": "d1queue.interfaces.dashboard",
}
"""Old module path -> where it lives now. A module inside a moved package
(`d1queue.dashboard.session`) moves with it."""


def current(name: str) -> str | None:
    """Where old module path `name` lives now (None: it did not move)."""
    if name in MOVED:
        return MOVED[name]
    parent, _, leaf = name.rpartition(".")
    return f"{MOVED[parent]}.{leaf}" if parent in MOVED else None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module ran once, under its own name."""


class OldPaths(importlib.abc.MetaPathFinder):
    """Finds a module by the path it had before it moved."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved = current(name) if name.startswith("d1queue.") else None
        return None if moved is None else importlib.machinery.ModuleSpec(name, _Alias(moved))


def install() -> None:
    """Idempotent: one finder on sys.meta_path."""
    if not any(isinstance(f, OldPaths) for f in sys.meta_path):
        sys.meta_path.append(OldPaths())
