"""Listings and names in the real Worker (Pyodide, Miniflare's D1), as
`make dev` serves it:

- a page of large rows (completed jobs, failed jobs) stays under
  bounds.MAX_PAGE_BYTES over HTTP and RPC, cut by D1 in the page's query
  (sql.bytes_bounded: a window function D1 runs), and paging through
  next_cursor returns every row exactly once;
- names of dots alone are refused over HTTP and RPC and write nothing; a
  schedule already stored under one is still read and deleted over RPC.
"""

from __future__ import annotations

import json
from typing import Any

from d1queue.core.bounds import DOTS_ONLY, MAX_PAGE, MAX_PAGE_BYTES

from .conftest import Host, RpcError
from .test_flow_runtime import hook

KIB = 1024
DONE_BAND = -1004
"""sql.DONE_BAND: the band of a completed job kept."""

ROWS = 40
"""Rows of each kind: 40 of about 130 KB, some 5 MB a listing."""


def _fill(host: Host) -> None:
    """ROWS completed jobs kept on queue `big` (payload ~100 KB, result
    ~30 KB) and ROWS failed ones (payload ~130 KB), made by D1 itself (no
    request carries them in)."""
    hook(
        host,
        """
        async def main(env):
            n = VALUES["rows"]
            pad = "json_quote(substr(hex(zeroblob(?2)), 1, ?2 - (i * 7919) % 5000))"
            walk = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
            await env.DB.prepare(
                walk + "INSERT INTO d1queue_jobs (queue, band, available_at, id, name, payload, "
                "max_attempts, created_at, result) SELECT 'big', ?3, 1000 + i, "
                f"printf('c%05d', i), 'example.echo', {pad}, 3, 1000 + i, "
                "json_quote(substr(hex(zeroblob(?4)), 1, ?4)) FROM n"
            ).bind(n, 100 * 1024, VALUES["done"], 30 * 1024).run()
            await env.DB.prepare(
                walk + "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, error, "
                "attempts, max_attempts, priority, created_at, failed_at) SELECT "
                f"printf('f%05d', i), 'big', 'example.echo', {pad}, 'boom', 1, 1, 0, "
                "1000 + i, 1000 + i FROM n"
            ).bind(n, 130 * 1024).run()
        """,
        rows=ROWS,
        done=DONE_BAND,
    )


def _stored(jobs: list[dict[str, Any]]) -> int:
    return sum(
        len(json.dumps(j[k], separators=(",", ":")).encode())
        for j in jobs
        for k in ("payload", "result", "error", "last_error")
        if j.get(k) is not None
    )


def _pages_over_http(host: Host, path: str) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        reply = host.api("GET", path + (f"&cursor={cursor}" if cursor else ""))
        assert reply.status == 200, reply.text
        body = reply.json()
        assert body["jobs"] and _stored(body["jobs"]) <= MAX_PAGE_BYTES
        assert len(reply.body) < MAX_PAGE_BYTES + 64 * KIB, len(reply.body)
        pages.append([j["id"] for j in body["jobs"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def test_a_page_of_large_rows_stays_under_the_byte_bound(clean_host: Host) -> None:
    _fill(clean_host)
    completed = [f"c{i:05d}" for i in range(ROWS, 0, -1)]
    failed = [f"f{i:05d}" for i in range(ROWS, 0, -1)]
    for path, ids in (
        (f"/v1/queues/big/completed?limit={MAX_PAGE}", completed),
        (f"/v1/failed?limit={MAX_PAGE}", failed),
        (f"/v1/failed?queue=big&limit={MAX_PAGE}", failed),
    ):
        pages = _pages_over_http(clean_host, path)
        assert [i for page in pages for i in page] == ids, path
        assert len(pages) >= 2, path
    seen, cursor = [], None
    while True:
        page = clean_host.rpc("completed", "big", MAX_PAGE, cursor)
        assert page["jobs"] and _stored(page["jobs"]) <= MAX_PAGE_BYTES
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == completed


def test_names_of_dots_alone_are_refused_and_a_stored_one_is_still_reached(
    clean_host: Host,
) -> None:
    every_minute = {"cron": "* * * * *", "name": "example.echo"}
    for dots in (".", ".."):
        reply = clean_host.api("POST", "/v1/schedules", {"id": dots, **every_minute})
        assert reply.status == 422, reply.text
        assert DOTS_ONLY in reply.json()["error"]["message"]
        reply = clean_host.api("POST", "/v1/jobs", {"name": "example.echo", "queue": dots})
        assert reply.status == 422 and DOTS_ONLY in reply.text
        try:
            clean_host.rpc("dispatch", dots, {"name": "example.echo"})
        except RpcError as exc:
            assert "invalid_queue: " in str(exc) and DOTS_ONLY in str(exc), str(exc)
        else:
            raise AssertionError("dispatch to a queue of dots alone was taken")
    assert (
        hook(
            clean_host,
            """
        async def main(env):
            r = await env.DB.prepare(
                "SELECT (SELECT COUNT(*) FROM d1queue_jobs) + "
                "(SELECT COUNT(*) FROM d1queue_schedules WHERE source = 'api') AS n"
            ).all()
            return r["results"][0]["n"]
        """,
        )
        == 0
    )
    # A schedule a table already holds under such an id: read, listed and
    # deleted over RPC (no URL can carry it).
    assert clean_host.api("POST", "/v1/schedules", {"id": "was", **every_minute}).status == 201
    hook(
        clean_host,
        """
        async def main(env):
            await env.DB.prepare("UPDATE d1queue_schedules SET id = '..' WHERE id = 'was'").run()
        """,
    )
    assert clean_host.rpc("schedule", "..")["id"] == ".."
    assert clean_host.rpc("delete_schedule", "..") == {"id": "..", "deleted": True}
    listed = clean_host.api("GET", "/v1/schedules").json()["schedules"]
    assert ".." not in {s["id"] for s in listed}
