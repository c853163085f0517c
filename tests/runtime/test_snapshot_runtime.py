"""The host's memory snapshots (host/snapshot.mjs): a start with an upload an
earlier start imported restores that import instead of redoing it, and
serves as a cold start does; randomness at import is still refused, restored
hosts do not share a random sequence, and a snapshot that is not whole, or
that the env no longer matches, is never used.

Each test runs host/fixtures' Worker with a cache of its own: a copy of the
fixture folder, whose .wrangler/snapshots the host uses."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import FIXTURE, ROOT, Host, bundle_for, start_host

_KEEP = re.search(r"export const KEEP = (\d+);", (ROOT / "host" / "snapshot.mjs").read_text())
assert _KEEP is not None
KEEP = int(_KEEP[1])
"""Snapshots a cache folder keeps (host/snapshot.mjs)."""
STATE = """
import os, sys, _d1queue_host

async def main(env):
    return {"cwd": os.getcwd(), "path": sys.path[:3], "refused": list(_d1queue_host._refused)}
"""
"""What a host's Python looks like from a request: where it runs and imports from."""


def worker_root(tmp_path: Path) -> Path:
    """A copy of the fixture Worker's folder: its own snapshot cache."""
    root = tmp_path / "worker"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns(".wrangler", "python_modules"))
    return root


def snapshots(root: Path) -> list[Path]:
    folder = root / ".wrangler" / "snapshots"
    return sorted(folder.iterdir()) if folder.exists() else []


def ready_line(host: Host) -> str:
    return next(line for line in host.output() if "ready in" in line)


def run(root: Path, *args: str, bundle: Path | None = None) -> Host:
    return start_host(*args, root=root, bundle=bundle or bundle_for(FIXTURE))


def answers(host: Host) -> list[object]:
    """What a host answers to a few requests of each kind."""
    return [
        host.get("/health").json(),
        host.post("/echo", body="héllo").text,
        host.get("/boom").status,
        host.rpc("add", 40, 2),
        host.python(STATE),
    ]


@dataclass(frozen=True)
class Taken:
    """A snapshot of the fixture Worker, taken by a cold start: its file, and
    that start's ready line and answers."""

    file: Path
    ready: str
    answers: list[object]


@pytest.fixture(scope="module")
def taken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Taken]:
    """Tests copy it into their own cache."""
    root = worker_root(tmp_path_factory.mktemp("taken"))
    host = run(root)
    try:
        ready, said = ready_line(host), answers(host)
    finally:
        host.stop()  # waits for the snapshot's write
    (file,) = snapshots(root)
    yield Taken(file, ready, said)


def with_snapshot(tmp_path: Path, taken: Taken) -> tuple[Path, Path]:
    """A Worker folder whose cache holds the taken snapshot; (root, its file)."""
    root = worker_root(tmp_path)
    folder = root / ".wrangler" / "snapshots"
    folder.mkdir(parents=True)
    shutil.copy(taken.file, folder)
    return root, folder / taken.file.name


def test_a_cold_start_takes_a_snapshot_the_next_start_restores_and_answers_alike(
    tmp_path: Path, taken: Taken
) -> None:
    key = taken.file.stem
    assert f", cold (snapshot {key[:12]} taken) (" in taken.ready
    root, _ = with_snapshot(tmp_path, taken)
    host = run(root)
    try:
        assert f", warm (snapshot {key[:12]}) (" in ready_line(host)
        assert answers(host) == taken.answers
        assert taken.answers[-1] == {
            "cwd": "/session/metadata",
            "path": ["/session/metadata", "", "/lib/python314.zip"],
            "refused": [],
        }
        # waitUntil work and the event loop's timers, through the host's
        # scheduler, which the restored Python still calls.
        since = len(host.output())
        assert host.get("/later").text == "queued"
        host.idle()
        host.wait_for_output("later done", since=since)
    finally:
        host.stop()
    assert [p.name for p in snapshots(root)] == [taken.file.name], "a warm start writes none"


def test_restored_hosts_draw_their_own_random_numbers(tmp_path: Path, taken: Taken) -> None:
    """The snapshot holds the state `random` was seeded with by the start that
    took it: each restored host reseeds it, as workerd does before the first
    request."""
    draw = """
    import os, random

    async def main(env):
        return [random.random(), random.getrandbits(64), os.urandom(8).hex()]
    """
    hosts = [run(with_snapshot(tmp_path / str(i), taken)[0]) for i in range(2)]
    try:
        assert all(", warm (" in ready_line(h) for h in hosts)
        first, second = (h.python(draw) for h in hosts)
    finally:
        for h in hosts:
            h.stop()
    assert first[0] != second[0] and first[1] != second[1] and first[2] != second[2]


def test_a_worker_using_randomness_at_import_is_refused_each_start_and_never_snapshotted(
    tmp_path: Path,
) -> None:
    root = worker_root(tmp_path)
    upload = tmp_path / "upload"
    shutil.copytree(bundle_for(FIXTURE), upload)
    with (upload / "helper.py").open("a") as f:
        f.write("import random\nSALT = random.random()\n")
    for _ in range(2):
        with pytest.raises(AssertionError, match="exited with 1 before it was ready") as failed:
            run(root, bundle=upload)
        assert "RuntimeError: Cannot use random.random() outside of request context" in str(
            failed.value
        )
        assert snapshots(root) == []


def test_no_snapshot_boots_cold_and_keeps_none(tmp_path: Path, taken: Taken) -> None:
    root, file = with_snapshot(tmp_path, taken)
    host = run(root, "--no-snapshot")
    try:
        assert ", cold (--no-snapshot) (" in ready_line(host)
        assert host.get("/health").status == 200
    finally:
        host.stop()
    assert snapshots(root) == [file], "neither read, nor written, nor removed"


def _flip_a_byte(data: bytes) -> bytes:
    """The same length, one byte of the memory image changed."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


MAGIC = b"d1qsnap\n"


def header(data: bytes) -> tuple[dict[str, object], int, int]:
    """A snapshot file's header, where it starts and its length."""
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    return json.loads(data[start : start + size]), start, size


def whole(data: bytes) -> bool:
    meta, _, _ = header(data)
    payload = data[meta["offset"] :]  # type: ignore[misc]
    return data.startswith(MAGIC) and hashlib.sha256(payload).hexdigest() == meta["sha256"]


def _refused_by_pyodide(data: bytes) -> bytes:
    """Whole by the host's own checks (length, checksum), but no snapshot
    Pyodide takes: its magic number is changed, and the checksum made anew."""
    meta, start, size = header(data)
    payload = bytearray(data[meta["offset"] :])  # type: ignore[misc]
    payload[0] ^= 0xFF
    new = dict(meta, sha256=hashlib.sha256(payload).hexdigest())
    text = json.dumps(new, separators=(",", ":")).encode()
    assert len(text) == size, "same-length header"
    return data[:start] + text + data[start + size : meta["offset"]] + bytes(payload)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("spoil", "warning"),
    [
        (_flip_a_byte, "is unusable (its checksum does not match)"),
        (lambda data: data[: len(data) // 3], "cut short"),
        (_refused_by_pyodide, "could not be restored"),
    ],
    ids=["a-byte-changed", "cut-short", "refused-by-pyodide"],
)
def test_an_unusable_snapshot_is_deleted_and_the_host_boots_cold(
    tmp_path: Path, taken: Taken, spoil: object, warning: str
) -> None:
    root, file = with_snapshot(tmp_path, taken)
    file.write_bytes(spoil(file.read_bytes()))  # type: ignore[operator]
    host = run(root)
    try:
        (line,) = [x for x in host.output() if x.startswith("d1queue host: snapshot ")]
        assert warning in line and "booting cold" in line, line
        assert f", cold (snapshot {file.stem[:12]} taken) (" in ready_line(host)
        assert host.get("/health").json()["ok"] is True
    finally:
        host.stop()
    assert snapshots(root) == [file]
    assert whole(file.read_bytes()), "taken anew by the cold start"


def test_hosts_starting_together_leave_one_whole_snapshot(tmp_path: Path) -> None:
    root = worker_root(tmp_path)
    hosts: list[Host] = []

    def start() -> None:
        hosts.append(run(root))

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(hosts) == 3
        assert all(h.get("/health").status == 200 for h in hosts)
    finally:
        for h in hosts:
            h.stop()
    (file,) = snapshots(root)  # no temporary file left either
    assert file.suffix == ".bin"
    host = run(root)
    try:
        assert f", warm (snapshot {file.stem[:12]}) (" in ready_line(host)
    finally:
        host.stop()


def test_the_cache_keeps_the_newest_snapshots(tmp_path: Path) -> None:
    root = worker_root(tmp_path)
    folder = root / ".wrangler" / "snapshots"
    folder.mkdir(parents=True)
    old = []
    for i in range(KEEP + 1):
        path = folder / f"{i:064x}.bin"
        path.write_bytes(b"an older snapshot")
        t = 1_000_000 + i  # oldest first
        os.utime(path, (t, t))
        old.append(path)
    stale = folder / f"{0:064x}.bin.123.tmp"  # a killed host's half-written file
    stale.write_bytes(b"half")
    os.utime(stale, (1_000_000, 1_000_000))
    host = run(root)
    host.stop()
    kept = snapshots(root)
    assert len(kept) == KEEP
    assert kept == sorted([*old[-(KEEP - 1) :], *(p for p in kept if p not in old)])
    assert stale not in kept


def test_a_value_read_from_env_at_import_is_never_stale(tmp_path: Path) -> None:
    """A Worker that reads its env while imported keeps what it read in its
    memory: a snapshot is used only while those values are the same."""
    root = worker_root(tmp_path)
    upload = tmp_path / "upload"
    shutil.copytree(bundle_for(FIXTURE), upload)
    with (upload / "helper.py").open("a") as f:
        f.write("from workers import env\nGREETING = env.FIXTURE_VAR\n")
    greeting = "import helper\n\nasync def main(env):\n    return helper.GREETING\n"
    seen = []
    for value in ("one", "one", "two"):
        host = run(root, "--var", f"FIXTURE_VAR={value}", bundle=upload)
        try:
            ready = ready_line(host)
            seen.append((host.python(greeting), ", warm (" in ready))
        finally:
            host.stop()
        if seen[-1] == ("two", False):
            assert "the Worker read env FIXTURE_VAR at import, changed since snapshot" in ready
    assert seen == [("one", False), ("one", True), ("two", False)]
