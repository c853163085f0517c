"""SqliteD1 behaves as the D1 binding does where the driver depends on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from d1queue.interfaces.testing import D1Error, SqliteD1


@pytest.fixture
def d1() -> SqliteD1:
    d = SqliteD1()
    d._conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v)")
    return d


async def test_run_all_first_raw_and_meta(d1: SqliteD1) -> None:
    r = await d1.prepare("INSERT INTO t (v) VALUES (?1), (?2)").bind("a", None).run()
    assert r["success"] is True and r.meta.changes == 2 and r.meta.last_row_id == 2
    rows = (await d1.prepare("SELECT id, v FROM t ORDER BY id").all())["results"]
    assert rows[0]["v"] == "a" and rows[1].v is None, "item and attribute access"
    assert await d1.prepare("SELECT v FROM t WHERE id = ?").bind(1).first("v") == "a"
    assert await d1.prepare("SELECT v FROM t WHERE id = 9").first() is None
    assert await d1.prepare("SELECT id, v FROM t ORDER BY id").raw() == [[1, "a"], [2, None]]
    raw = await d1.prepare("SELECT id FROM t LIMIT 1").raw(columnNames=True)
    assert raw == [["id"], [1]]
    reads = await d1.prepare("SELECT * FROM t").run()
    assert reads.meta.changes == 0, "a read changes nothing"


@pytest.mark.parametrize("value", [2**53 - 1, -(2**53 - 1), 2**64, {"a": 1}, [1], (1,), object()])
async def test_values_d1_rejects_are_rejected(d1: SqliteD1, value: object) -> None:
    with pytest.raises(D1Error, match="D1_TYPE_ERROR"):
        d1.prepare("INSERT INTO t (v) VALUES (?)").bind(value)


async def test_booleans_become_integers_and_bytes_blobs(d1: SqliteD1) -> None:
    await d1.prepare("INSERT INTO t (v) VALUES (?), (?)").bind(True, b"\x00\x01").run()
    assert await d1.prepare("SELECT v FROM t ORDER BY id").raw() == [[1], [b"\x00\x01"]]


async def test_batch_is_one_transaction(d1: SqliteD1) -> None:
    ok = d1.prepare("INSERT INTO t (v) VALUES (?)").bind("kept?")
    bad = d1.prepare("INSERT INTO nope (v) VALUES (1)")
    with pytest.raises(D1Error, match="D1_ERROR"):
        await d1.batch([ok, bad])
    assert await d1.prepare("SELECT COUNT(*) AS n FROM t").first("n") == 0
    results = await d1.batch([ok, d1.prepare("SELECT COUNT(*) AS n FROM t")])
    assert results[0].meta.changes == 1 and results[1].results[0]["n"] == 1


async def test_exec_runs_each_line_as_a_statement(d1: SqliteD1) -> None:
    r = await d1.exec("INSERT INTO t (v) VALUES (1)\nINSERT INTO t (v) VALUES (2)")
    assert r["count"] == 2
    with pytest.raises(D1Error, match="D1_EXEC_ERROR"):
        await d1.exec("INSERT INTO t (v)\nVALUES (3)")


async def test_fault_hook_fails_chosen_statements(d1: SqliteD1) -> None:
    d1.fail_when("INSERT", "D1_ERROR: Network connection lost.", times=2)
    stmt = d1.prepare("INSERT INTO t (v) VALUES (1)")
    for _ in range(2):
        with pytest.raises(D1Error, match="Network connection lost"):
            await stmt.run()
    assert (await stmt.run()).meta.changes == 1
    d1.fail_when(lambda sql: "SELECT" in sql, times=None)
    for _ in range(3):
        with pytest.raises(D1Error):
            await d1.prepare("SELECT 1").all()
    d1.clear_faults()
    assert await d1.prepare("SELECT 1 AS one").first("one") == 1


async def test_objects_on_one_file_share_the_database(tmp_path: Path) -> None:
    a, b = SqliteD1(tmp_path / "x.db"), SqliteD1(tmp_path / "x.db")
    await a.exec("CREATE TABLE t (v)")
    await a.prepare("INSERT INTO t VALUES (?)").bind(7).run()
    assert await b.prepare("SELECT v FROM t").first("v") == 7


async def test_the_driver_retries_transient_d1_errors_only() -> None:
    from d1queue import D1Queue
    from d1queue.store.binding import Binding, RetryPolicy

    from .conftest import MIGRATIONS

    d1 = SqliteD1()
    d1.apply_migrations(MIGRATIONS)
    queue = D1Queue(Binding(d1, retry=RetryPolicy(base_s=0.001)))
    d1.fail_when("INSERT", "D1_ERROR: Network connection lost.", times=2)
    job_id = await queue.dispatch("x")
    assert await queue.job(job_id) is not None
    assert queue.binding.retried == 2
    d1.fail_when("SELECT", "D1_ERROR: D1 DB is overloaded. Too many requests queued.")
    with pytest.raises(D1Error, match="overloaded"):
        await queue.size("default")
    d1.fail_when("SELECT", "D1_ERROR: Network connection lost.", times=None)
    with pytest.raises(D1Error, match="Network connection lost"):
        await queue.size("default")
    assert queue.binding.retried == 2 + 4, "five tries in all, then the error"
