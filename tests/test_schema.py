"""The indexes do what DESIGN.md says they are for: the queries that run on
every drain are answered from an index, in index order."""

from __future__ import annotations

from d1queue import sql
from d1queue.testing import SqliteD1


def plan(db: SqliteD1, statement: str, *params: object) -> str:
    return "\n".join(r["detail"] for r in db.query(f"EXPLAIN QUERY PLAN {statement}", *params))


def test_the_candidate_select_reads_the_ready_index_in_order(db: SqliteD1) -> None:
    p = plan(db, sql.SELECT_CANDIDATES, "default", 0, 10)
    assert "USING INDEX d1queue_jobs_ready" in p, p
    assert "TEMP B-TREE" not in p, p


def test_reclaim_reads_the_lease_index(db: SqliteD1) -> None:
    p = plan(db, sql.RECLAIM_EXPIRED, 0, "x")
    assert "d1queue_jobs_lease" in p, p


def test_size_is_answered_from_the_ready_index(db: SqliteD1) -> None:
    p = plan(db, sql.COUNT_UNRESERVED, "default")
    assert "INDEX d1queue_jobs_ready" in p, p


def test_settling_finds_the_row_by_primary_key(db: SqliteD1) -> None:
    for statement, n in ((sql.ACKNOWLEDGE, 2), (sql.RELEASE, 4), (sql.CLAIM, 5)):
        assert "USING PRIMARY KEY (id=?)" in plan(db, statement, *[1] * n), statement


def test_failed_jobs_list_newest_first_without_sorting(db: SqliteD1) -> None:
    p = plan(db, sql.LIST_FAILED, 10)
    assert "d1queue_failed_jobs_failed_at" in p, p


def test_reading_candidates_is_independent_of_backlog_depth(db: SqliteD1) -> None:
    """Reserved rows are not in the ready index, so a deep backlog of jobs in
    flight costs the candidate SELECT nothing: SQLite's VM steps stay flat."""
    conn = db._conn
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) "
        "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, available_at, "
        "created_at, reserved_at, reserved_until, reservation) "
        "SELECT printf('r%05d', i), 'default', 'x', 'null', 3, 0, 0, 1, 9e12, 't' FROM n"
    )
    conn.execute(
        "INSERT INTO d1queue_jobs (id, queue, name, payload, max_attempts, available_at, "
        "created_at) VALUES ('ready', 'default', 'x', 'null', 3, 0, 0)"
    )
    rows = db.query(sql.SELECT_CANDIDATES, "default", 1, 10)
    assert [r["id"] for r in rows] == ["ready"]
    assert "USING INDEX d1queue_jobs_ready" in plan(db, sql.SELECT_CANDIDATES, "default", 1, 10)
