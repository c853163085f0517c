"""What the dashboard's search, batches index, Running now and bulk actions
read on Miniflare's D1, which counts rows read as D1 does: at 100,000
queued jobs and 5,000 completed ones, a search page reads at most twice its
cap (bounds.SEARCH_ROWS: the matches' read and the span's), the same as at
2,000, and a lookup by id a row: no page scans the jobs. A page of the
batches index reads two rows a batch listed, at 100 batches or 10,000. Nor
does a page of Running now scan, whatever the jobs waiting out a retry in
the locked band it reads (bounds.RUNNING_ROWS). A bulk action's count and
steps are capped likewise, and each of its actions runs on D1, a step sent
again doing nothing twice."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue.core.bounds import BULK_COUNT_ROWS, RUNNING_ROWS, SEARCH_ROWS

from .conftest import Host
from .test_flow_runtime import hook

DONE_BAND = -1004
"""sql.DONE_BAND: the band of a completed job kept."""


def _seed(host: Host, queued: int, done: int) -> None:
    hook(
        host,
        """
        async def main(env):
            walk = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
            insert = (
                "INSERT INTO d1queue_jobs (queue, band, available_at, id, name, payload, "
                "max_attempts, created_at) SELECT 'bulk', ?2, 1000 + i, printf(?3, i), "
                "'example.echo', printf('{\\"i\\": %d}', i), 3, 1000 + i FROM n"
            )
            await env.DB.prepare(walk + insert).bind(VALUES["queued"], 0, "q%08d").run()
            await env.DB.prepare(walk + insert).bind(VALUES["done"], VALUES["band"], "d%08d").run()
        """,
        queued=queued,
        done=done,
        band=DONE_BAND,
    )


def _reads(host: Host) -> dict[str, Any]:
    """Rows read by a search page of each source, and by an id's lookup."""
    return dict(
        hook(
            host,
            """
            from d1queue import D1Queue
            from d1queue.store.dashboard import Store

            async def main(env):
                queue = D1Queue(env.DB)
                store = Store(queue)
                out = {}
                for source in ("live", "completed", "failed"):
                    before = queue.binding.usage.rows_read
                    page = await store.search(source, {"text": "no such word"})
                    out[source] = [queue.binding.usage.rows_read - before, page.scanned]
                before = queue.binding.usage.rows_read
                await store.job("q00000001")
                out["by_id"] = [queue.binding.usage.rows_read - before, 1]
                return out
            """,
        )
    )


@pytest.mark.parametrize("queued", [2_000, 100_000])
def test_a_search_page_reads_its_cap_whatever_the_jobs(clean_host: Host, queued: int) -> None:
    _seed(clean_host, queued, 5_000)
    reads = _reads(clean_host)
    live, completed = reads["live"], reads["completed"]
    assert live[1] == completed[1] == SEARCH_ROWS
    # The matches read their cap of rows, the span its cap of index entries.
    assert live[0] == completed[0] == 2 * SEARCH_ROWS, reads
    assert reads["failed"][0] <= 2, reads  # no failed jobs: next to nothing to read
    assert reads["by_id"][0] <= 2, reads


@pytest.mark.parametrize("batches", [100, 10_000])
def test_the_batches_index_reads_a_page_whatever_the_batches(
    clean_host: Host, batches: int
) -> None:
    """The batches index on Miniflare's D1: a page (the first, and one deep
    in the list) reads about two rows a batch listed (the batch and its
    parts), at 100 batches and at 10,000 alike."""
    reads = hook(
        clean_host,
        """
        from d1queue import D1Queue
        from d1queue.store.dashboard import PAGE, Store

        async def main(env):
            for t in ("d1queue_batches", "d1queue_batch_parts"):
                await env.DB.prepare(f"DELETE FROM {t}").run()
            walk = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) "
            await env.DB.prepare(
                walk + "INSERT INTO d1queue_batches (id, total, pending, completed, failed, "
                "created_at) SELECT printf('%032d', i), 2, 0, 1, 1, i FROM n"
            ).bind(VALUES["batches"]).run()
            await env.DB.prepare(
                walk + "INSERT INTO d1queue_batch_parts (id, ids) "
                "SELECT printf('%032d', i), '[]' FROM n"
            ).bind(VALUES["batches"]).run()
            queue = D1Queue(env.DB)
            store = Store(queue)
            out = []
            cursor = None
            for _ in range(2):
                before = (queue.binding.usage.queries, queue.binding.usage.rows_read)
                page = await store.batches(cursor)
                usage = queue.binding.usage
                out.append([usage.queries - before[0], usage.rows_read - before[1], len(page.rows)])
                cursor = page.next_cursor
            return {"pages": out, "page": PAGE, "failed": page.rows[0]["state"]}
        """,
        batches=batches,
    )
    page = reads["page"]
    for queries, rows_read, listed in reads["pages"]:
        assert queries == 1 and listed == page, reads
        assert rows_read <= 2 * (page + 1), reads
    assert reads["failed"] == "failed"


LOCKED_BAND = -1002
"""sql.LOCKED_BAND: jobs held by a worker, or waiting out a retry."""


def _running_reads(host: Host, retrying: int) -> list[int]:
    """Rows read by the first page of Running now with `retrying` jobs
    waiting out a retry in the locked band (read and passed over) and one
    held job after them, and how many rows the page says it read."""
    return list(
        hook(
            host,
            """
            from d1queue import D1Queue
            from d1queue.store.dashboard import Store

            async def main(env):
                await env.DB.prepare(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                    "WHERE i < ?1) INSERT INTO d1queue_jobs (queue, band, available_at, "
                    "locked_until, id, name, payload, attempts, max_attempts, created_at) "
                    "SELECT 'bulk', ?2, ?3 + i, ?3 + i, printf('r%08d', i), 'example.echo', "
                    "'{}', 1, 3, 1000 FROM n"
                ).bind(VALUES["retrying"], VALUES["band"], 10**13).run()
                queue = D1Queue(env.DB)
                await queue.dispatch("example.echo", {}, queue="zz")
                await queue.reserve_batch("zz", 1)
                before = queue.binding.usage.rows_read
                page = await Store(queue).running()
                return [queue.binding.usage.rows_read - before, page.scanned]
            """,
            retrying=retrying,
            band=LOCKED_BAND,
        )
    )


def test_a_running_now_page_reads_its_cap_whatever_the_jobs(clean_host: Host) -> None:
    small = _running_reads(clean_host, 2_000)
    clean_host.reset()
    large = _running_reads(clean_host, 100_000)
    assert small[1] == large[1] == RUNNING_ROWS
    # The same rows read at 2,000 jobs in the band and at 100,000: the cap
    # twice (the held jobs' read and the span's), and the walk of the queues.
    assert small[0] == large[0] <= 2 * RUNNING_ROWS + 50, (small, large)


def test_a_bulk_actions_count_and_step_read_their_caps_at_100_000_jobs(clean_host: Host) -> None:
    """A bulk action's confirmation counts at most BULK_COUNT_ROWS jobs a
    database; each step reads one search page and its jobs by id."""
    _seed(clean_host, 100_000, 0)
    reads = hook(
        clean_host,
        """
        from d1queue import D1Queue
        from d1queue.store.bulk import Bulk
        from d1queue.store.dashboard import Store

        async def main(env):
            queue = D1Queue(env.DB)
            bulk = Bulk(Store(queue))
            usage = queue.binding.usage
            filters = {"text": '"i": 100000}'}
            before = usage.rows_read
            count = await bulk.count("live", filters)
            counted = usage.rows_read - before
            run = await bulk.start("a" * 32, who="full", action="cancel", source="live",
                                   filter='"i": 100000}', selected=None, count=count, now=1)
            before, queries = usage.rows_read, usage.queries
            run = await bulk.step(run, 1, filters, 2)
            return {"counted": counted, "matched": count.matched, "capped": count.capped,
                    "step": usage.rows_read - before, "queries": usage.queries - queries,
                    "done": run.done}
        """,
    )
    assert reads["matched"] == 1 and reads["capped"], reads
    assert reads["counted"] <= BULK_COUNT_ROWS + 1, reads
    assert reads["done"] == 1 and reads["queries"] == 2, reads
    # The search page (its matches and its span: 2 x SEARCH_ROWS), then
    # the one job by id, its metrics read, and the run's row.
    assert reads["step"] <= 2 * SEARCH_ROWS + 20, reads


def test_every_bulk_action_runs_on_d1_and_a_step_sent_again_does_nothing(
    clean_host: Host,
) -> None:
    """Each (kind, action)'s statements as D1 runs them: two jobs each, one
    step, then the same step sent again (another request's nonce)."""
    done = hook(
        clean_host,
        """
        from d1queue import D1Queue
        from d1queue.store.bulk import Bulk
        from d1queue.store.dashboard import Store

        async def main(env):
            db = env.DB
            walk = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2) "
            cols = ("INSERT INTO d1queue_jobs (queue, band, available_at, id, name, payload, "
                    "max_attempts, created_at) ")
            await db.prepare(walk + cols + "SELECT 'late', -1001, 9999999999999, printf('l%d', i), "
                             "'example.echo', '{}', 3, 1 FROM n").run()
            await db.prepare(walk + cols + "SELECT 'kept', -1004, 5 + i, printf('c%d', i), "
                             "'example.echo', '{}', 3, 1 FROM n").run()
            await db.prepare(walk + "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, "
                             "error, attempts, max_attempts, priority, created_at, failed_at) "
                             "SELECT printf('f%d', i), 'bad', 'example.echo', '{}', 'boom', 1, 1, "
                             "0, 1, 1 FROM n").run()
            bulk = Bulk(Store(D1Queue(env.DB)))
            out = {}
            plan = [("live", "run", {"queue": "late"}), ("completed", "retry", {"queue": "kept"}),
                    ("completed", "delete", {"queue": "kept"}), ("failed", "retry", {}),
                    ("live", "cancel", {"queue": "late"})]
            for i, (source, action, filters) in enumerate(plan):
                count = await bulk.count(source, filters)
                run = await bulk.start(f"{i:032x}", who="full", action=action, source=source,
                                       filter="", selected=None, count=count, now=10)
                first = await bulk.step(run, 1, filters, 10)
                again = await bulk.step(run, 1, filters, 11)
                out[f"{source}.{action}"] = [count.matched, first.done, again.done]
            # The failed jobs retried are queued now: delete two more failures.
            await db.prepare(walk + "INSERT INTO d1queue_failed_jobs (id, queue, name, payload, "
                             "error, attempts, max_attempts, priority, created_at, failed_at) "
                             "SELECT printf('g%d', i), 'bad', 'example.echo', '{}', 'boom', 1, 1, "
                             "0, 1, 1 FROM n").run()
            count = await bulk.count("failed", {})
            run = await bulk.start("f" * 32, who="full", action="delete", source="failed",
                                   filter="", selected=None, count=count, now=10)
            out["failed.delete"] = [count.matched, (await bulk.step(run, 1, {}, 10)).done,
                                    (await bulk.step(run, 1, {}, 11)).done]
            rows = await db.prepare("SELECT id, band FROM d1queue_jobs ORDER BY id").all()
            out["rows"] = [[r["id"], r["band"]] for r in rows.results]
            return out
        """,
    )
    assert done["live.run"] == [2, 2, 2], done
    assert done["completed.retry"] == [2, 2, 2], done
    assert done["completed.delete"] == [2, 2, 2], done
    assert done["failed.retry"] == [2, 2, 2], done
    assert done["failed.delete"] == [2, 2, 2], done
    # Cancelled: the two delayed jobs made due. Left queued, ready: the two
    # completed jobs pushed again (their completions deleted) and the two
    # failures retried.
    assert done["live.cancel"] == [2, 2, 2], done
    assert done["rows"] == [["c1", 0], ["c2", 0], ["f1", 0], ["f2", 0]], done
