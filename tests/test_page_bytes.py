"""Every listing's page is bounded by bytes as well as by count
(bounds.MAX_PAGE_BYTES): completed jobs, failed jobs and schedules over the
API and RPC, and the dashboard's lists of a queue's jobs, its completed jobs
and the failed ones. 500 completed jobs of 130 KB payloads once made one
page of 65 MB, in a Worker of 128 MB. The cut is made in the SQL, in the
page's one query; the rest follows through next_cursor, every row exactly
once, with one shard or several."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from d1queue import D1Queue
from d1queue.core.bounds import MAX_PAGE, MAX_PAGE_BYTES, page_bytes
from d1queue.core.job import QueuedJob
from d1queue.core.shards import merge_pages
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql
from d1queue.store.dashboard import PAGE, Store
from d1queue.store.failed import FailedJobs

from .test_api import TOKEN, registry
from .test_api import Client as RawApi
from .test_shards import Sharded

KIB = 1024


def add_completed(db: SqliteD1, n: int, payload: int, result: int, queue: str = "big") -> None:
    """`n` completed jobs kept on `queue`, with a payload of about `payload`
    bytes and a result of about `result` (JSON strings of '0's), varied a
    little so the cut falls at different rows."""
    db.query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
        "INSERT INTO d1queue_jobs (queue, band, available_at, id, name, payload, max_attempts, "
        "created_at, result) SELECT ?2, ?3, 1000 + i, printf('c%05d', i), 't.echo', "
        "json_quote(substr(hex(zeroblob(?4)), 1, ?4 - (i * 7919) % 5000)), 3, 1000 + i, "
        "json_quote(substr(hex(zeroblob(?5)), 1, ?5)) FROM n",
        n,
        queue,
        sql.DONE_BAND,
        payload,
        result,
    )


def add_failed(db: SqliteD1, n: int, payload: int, queue: str = "big") -> None:
    """`n` failed jobs of `queue` with payloads of about `payload` bytes."""
    db.query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
        "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, attempts, "
        "max_attempts, priority, created_at, failed_at) SELECT printf('f%05d', i), ?2, "
        "'t.echo', json_quote(substr(hex(zeroblob(?3)), 1, ?3 - (i * 7919) % 5000)), "
        "'boom', 1, 1, 0, 1000 + i, 1000 + i FROM n",
        n,
        queue,
        payload,
    )


def stored(*values: Any) -> int:
    """Bytes of values as stored: compact JSON (a string as is)."""
    return sum(
        len((v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))).encode())
        for v in values
        if v is not None
    )


async def pages(api: RawApi, db: SqliteD1, path: str, key: str) -> list[list[dict[str, Any]]]:
    """Every page of a listing, following next_cursor; each page one D1
    query and at most MAX_PAGE_BYTES of payloads, results and errors."""
    out, cursor = [], None
    while True:
        sep = "&" if "?" in path else "?"
        before = len(db.statements)
        r = await api("GET", path + (f"{sep}cursor={cursor}" if cursor else ""))
        assert r.status == 200, r.body
        assert len(db.statements) - before == 1, db.statements[before:]
        rows = r.body[key]
        size = sum(
            stored(j.get("payload"), j.get("result"), j.get("error"), j.get("last_error"))
            for j in rows
        )
        assert rows and size <= MAX_PAGE_BYTES, (len(rows), size)
        assert len(json.dumps(r.body)) < MAX_PAGE_BYTES + 64 * KIB
        out.append(rows)
        cursor = r.body["next_cursor"]
        if cursor is None:
            return out


@pytest.fixture
def api(queue: D1Queue, db: SqliteD1) -> RawApi:
    queue.keep_completed = True
    return RawApi(Api(Service(queue, registry()), TOKEN, "1", SPEC), db)


async def test_a_page_of_completed_jobs_holds_at_most_its_bytes(api: RawApi, db: SqliteD1) -> None:
    add_completed(db, 60, 100 * KIB, 30 * KIB)
    got = await pages(api, db, f"/v1/queues/big/completed?limit={MAX_PAGE}", "jobs")
    ids = [j["id"] for page in got for j in page]
    assert ids == [f"c{i:05d}" for i in range(60, 0, -1)], "newest first, each once"
    assert len(got) >= 2
    assert all(j["result"] and j["payload"] for page in got for j in page)


async def test_a_page_of_failed_jobs_holds_at_most_its_bytes(api: RawApi, db: SqliteD1) -> None:
    add_failed(db, 60, 120 * KIB)
    newest_first = [f"f{i:05d}" for i in range(60, 0, -1)]
    for path in (f"/v1/failed?limit={MAX_PAGE}", f"/v1/failed?queue=big&limit={MAX_PAGE}"):
        got = await pages(api, db, path, "jobs")
        assert [j["id"] for page in got for j in page] == newest_first
        assert len(got) >= 2


async def test_a_page_of_schedules_holds_at_most_its_bytes(api: RawApi, db: SqliteD1) -> None:
    for i in range(40):
        payload = "x" * (120 * KIB - i)
        r = await api(
            "POST",
            "/v1/schedules",
            {"id": f"s{i:02d}", "cron": "@daily", "name": "t.echo", "payload": payload},
        )
        assert r.status == 201, r.body
    got = await pages(api, db, f"/v1/schedules?limit={MAX_PAGE}", "schedules")
    assert [s["id"] for page in got for s in page] == [f"s{i:02d}" for i in range(40)]
    assert len(got) >= 2


async def test_rpc_completed_pages_the_same_way(queue: D1Queue, db: SqliteD1) -> None:
    queue.keep_completed = True
    service = Service(queue, registry())
    add_completed(db, 45, 120 * KIB, 0)
    seen, cursor = [], None
    while True:
        page = await service.completed("big", MAX_PAGE, cursor)
        assert stored(*(j["payload"] for j in page["jobs"])) <= MAX_PAGE_BYTES
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"c{i:05d}" for i in range(45, 0, -1)]


def greedy(sizes: list[int], limit: int, budget: int) -> list[int]:
    """The pages the cut makes, as lengths: each the longest run of rows
    within `limit` whose sizes add up to at most `budget` (one row at least)."""
    out, i = [], 0
    while i < len(sizes):
        n, total = 0, 0
        while i + n < len(sizes) and n < limit and (n == 0 or total + sizes[i + n] <= budget):
            total += sizes[i + n]
            n += 1
        out.append(n)
        i += n
    return out


async def test_the_cut_is_the_longest_run_within_the_bytes_and_the_limit(
    queue: D1Queue, db: SqliteD1
) -> None:
    """FailedJobs.page with small budgets, against a model: pages end where
    the next row would pass the bytes, or at the limit; a row larger than
    the budget is a page of its own; nothing is skipped or repeated."""
    rng = random.Random(7)
    sizes = [rng.choice((10, 100, 700, 2000)) for _ in range(80)]
    for i, size in enumerate(sizes):
        db.query(
            "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, attempts, "
            "max_attempts, priority, created_at, failed_at) VALUES (?1, 'q', 't.echo', ?2, "
            "'e', 1, 1, 0, ?3, ?3)",
            f"f{i:03d}",
            json.dumps("y" * (size - 3)),  # its quotes and the error's byte: size in all
            10_000 - i,  # newest first: the order of `sizes`
        )
    failed = FailedJobs(queue.binding, queue.clock)
    for limit, budget in ((500, 1000), (7, 2500), (3, 10**6), (1, 1), (50, 2000)):
        lengths, cursor, seen = [], None, []
        while True:
            jobs, cursor = await failed.page(None, limit, cursor, budget)
            lengths.append(len(jobs))
            seen += [j.id for j in jobs]
            if cursor is None:
                break
        assert seen == [f"f{i:03d}" for i in range(80)]
        assert lengths == greedy(sizes, limit, budget), (limit, budget)


async def test_the_dashboards_lists_hold_at_most_their_bytes(queue: D1Queue, db: SqliteD1) -> None:
    queue.keep_completed = True
    # More than a page of each: live jobs, completed ones, failed ones.
    await queue.push_many(
        [QueuedJob.new("t.echo", "z" * (100 * KIB + i), queue="big") for i in range(PAGE + 10)]
    )
    add_completed(db, PAGE + 10, 90 * KIB, 40 * KIB)
    add_failed(db, PAGE + 10, 110 * KIB)
    store = Store(queue)
    for read, size in (
        (lambda c: store.queue_jobs("big", cursor=c), lambda r: stored(r["payload"])),
        (lambda c: store.completed("big", c), lambda r: stored(r["result"])),
        (lambda c: store.failed(cursor=c), lambda r: stored(r["payload"], r["error"])),
    ):
        seen, cursor, n = [], None, 0
        while True:
            page = await read(cursor)
            assert page.rows and sum(size(r) for r in page.rows) <= MAX_PAGE_BYTES
            seen += [r["id"] for r in page.rows]
            cursor, n = page.next_cursor, n + 1
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) == PAGE + 10 and n >= 2


async def test_pages_merged_from_shards_share_the_bytes_and_skip_nothing() -> None:
    two = Sharded(2)
    try:
        for q in two.shards.queues:
            q.keep_completed = True
        # Both shards hold the queue's completed jobs, interleaved in time.
        for k, db in enumerate(two.dbs):
            add_completed(db, 40, 60 * KIB * (k + 1), 0)
            db.query(
                "UPDATE d1queue_jobs SET id = ?1 || id, available_at = available_at * 2 + ?2",
                f"s{k}-",
                k,
            )
        expected = sorted(
            (r["available_at"], r["id"])
            for db in two.dbs
            for r in db.query("SELECT available_at, id FROM d1queue_jobs")
        )
        seen, cursor = [], None
        while True:
            before = [len(db.statements) for db in two.dbs]
            r = await two(
                "GET",
                "/v1/queues/big/completed?limit=500" + (f"&cursor={cursor}" if cursor else ""),
            )
            assert r.status == 200, r.body
            assert [len(db.statements) - b for db, b in zip(two.dbs, before, strict=True)] == [1, 1]
            assert stored(*(j["payload"] for j in r.body["jobs"])) <= MAX_PAGE_BYTES
            seen += [j["id"] for j in r.body["jobs"]]
            cursor = r.body["next_cursor"]
            if cursor is None:
                break
        assert seen == [id for _, id in reversed(expected)]
    finally:
        two.close()
    assert page_bytes(2) == MAX_PAGE_BYTES // 2


def test_a_shards_page_cut_short_bounds_the_merged_page() -> None:
    """A shard whose page ended early (at its bytes) has rows after it that
    were not read: the merged page stops at its last row, so the next page
    (after the merged page's last row) does not skip them."""
    short = ([1, 2], True)  # rows 3, 5, ... follow on this shard, unread
    full = ([1.5, 2.5, 4, 6], False)
    rows, more = merge_pages([short, full], key=lambda r: r, limit=10)
    assert (rows, more) == ([1, 1.5, 2], True)
    rows, more = merge_pages([([9, 8], True), ([8.5, 7, 6], False)], lambda r: r, 10, reverse=True)
    assert (rows, more) == ([9, 8.5, 8], True)


def test_the_document_states_the_bound_of_every_page() -> None:
    schemas = SPEC["components"]["schemas"]
    for page in ("CompletedPage", "FailedPage", "SchedulePage"):
        assert f"at most {MAX_PAGE_BYTES} bytes" in schemas[page]["description"]
