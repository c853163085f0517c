"""A job's dependents are bounded (bounds.MAX_DEPENDENTS), and so are the
edges one push writes (bounds.MAX_EDGES): past either, a push is refused
whole, nothing written, over the library, HTTP and RPC alike. The cap is
counted by the push's own statement, so two pushes racing for a job's last
places cannot pass it together, and completing a job at the cap costs a
bounded number of rows."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from d1queue import D1Queue, Registry
from d1queue.core.bounds import BATCH_JOBS, MAX_AFTER, MAX_BATCH, MAX_DEPENDENTS, MAX_EDGES
from d1queue.core.errors import TooManyDependents, TooManyEdges
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import ApiError, Service
from d1queue.interfaces.testing import SqliteD1

from .conftest import Clock
from .contract import batch_state
from .test_api import TOKEN, Client

TABLES = ("d1queue_jobs", "d1queue_deps", "d1queue_batches", "d1queue_batch_parts")


def written(db: SqliteD1) -> tuple[int, ...]:
    return tuple(db.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in TABLES)


def edges(db: SqliteD1, dep: str) -> int:
    return int(db.query("SELECT COUNT(*) AS n FROM d1queue_deps WHERE dep = ?1", dep)[0]["n"])


def registry() -> Registry:
    reg = Registry()

    @reg.job("step")
    async def step(payload: Any) -> Any:
        return payload

    return reg


@pytest.fixture
def reg() -> Registry:
    return registry()


@pytest.fixture
def kept(db: SqliteD1, clock: Clock, reg: Registry) -> D1Queue:
    return D1Queue(db, clock=clock, keep_completed=True, registry=reg)


@pytest.fixture
def service(kept: D1Queue, reg: Registry) -> Service:
    """What RPC calls: the Worker's entrypoint hands its arguments to these."""
    return Service(kept, reg)


@pytest.fixture
def client(db: SqliteD1, service: Service) -> Client:
    return Client(Api(service, TOKEN, "9.9", SPEC), db)


async def fill(q: D1Queue, dep: str, n: int) -> None:
    """`n` jobs pushed to wait for `dep`, in batches."""
    for i in range(0, n, MAX_BATCH):
        await q.push_many([q.new_job("step", i, after=[dep]) for i in range(min(MAX_BATCH, n - i))])


def waiter(dep: str, **fields: Any) -> dict[str, Any]:
    return {"name": "step", "payload": 1, "after": [dep], **fields}


# -- the library ----------------------------------------------------------------------


async def test_a_push_past_a_jobs_cap_is_refused_naming_it(kept: D1Queue, db: SqliteD1) -> None:
    dep = await kept.dispatch("step", "dep")
    other = await kept.dispatch("step", "other")
    await fill(kept, dep, MAX_DEPENDENTS)
    assert edges(db, dep) == MAX_DEPENDENTS
    before = written(db)
    with pytest.raises(TooManyDependents) as caught:
        await kept.dispatch("step", "one more", after=[other, dep])
    assert caught.value.ids == [dep] and str(MAX_DEPENDENTS) in str(caught.value)
    assert written(db) == before
    # The other job named takes waiters as before.
    await kept.dispatch("step", "fine", after=[other])
    assert edges(db, other) == 1
    # Once the job completed (kept), it costs nothing more to end: a waiter
    # naming it is taken, and gets no edge.
    held = await kept.reserve("default")
    assert held is not None and held.id == dep
    assert await kept.complete(held)
    late = await kept.dispatch("step", "late", after=[dep])
    assert edges(db, dep) == MAX_DEPENDENTS and await kept.job(late) is not None


async def test_a_batch_passing_the_cap_within_itself_is_refused_whole(
    kept: D1Queue, db: SqliteD1
) -> None:
    dep = await kept.dispatch("step", "dep")
    await fill(kept, dep, MAX_DEPENDENTS - 3)
    before = written(db)
    jobs = [kept.new_job("step", i, after=[dep]) for i in range(5)]
    with pytest.raises(TooManyDependents) as caught:
        await kept.push_many(jobs)
    assert caught.value.ids == [dep]
    assert written(db) == before
    # Up to the cap, a batch goes in.
    await kept.push_many([kept.new_job("step", i, after=[dep]) for i in range(3)])
    assert edges(db, dep) == MAX_DEPENDENTS


async def test_a_batch_giving_its_own_job_too_many_waiters_is_refused_naming_it(
    kept: D1Queue, db: SqliteD1
) -> None:
    """The job waited for is pushed in the same workflow batch, before its
    waiters: after the rollback it is nowhere, yet the refusal names the cap,
    not an unknown id."""
    root = kept.new_job("step", "root")
    jobs = [root] + [kept.new_job("step", i, after=[root.id]) for i in range(MAX_DEPENDENTS + 1)]
    with pytest.raises(TooManyDependents) as caught:
        await kept.batch(jobs)
    assert caught.value.ids == [root.id]
    assert written(db) == (0, 0, 0, 0)


async def test_jobs_added_to_a_batch_past_the_cap_are_refused(kept: D1Queue, db: SqliteD1) -> None:
    dep = await kept.dispatch("step", "dep")
    batch, _ = await kept.batch([kept.new_job("step", "member")])
    await fill(kept, dep, MAX_DEPENDENTS - 1)
    before = written(db)
    added = [kept.new_job("step", i, after=[dep]) for i in range(2)]
    with pytest.raises(TooManyDependents):
        await kept.add_to_batch(batch, added)
    assert written(db) == before
    state = await batch_state(kept, batch)
    assert state is not None and state["total"] == 1


async def test_a_push_resent_after_taking_the_last_place_is_not_refused(
    kept: D1Queue, db: SqliteD1
) -> None:
    """D1 committed the push that took the job's last place and its reply was
    lost: the re-send finds its own edge, which is not counted against it."""
    dep = await kept.dispatch("step", "dep")
    await fill(kept, dep, MAX_DEPENDENTS - 1)
    db.lose_reply_when("ignore_failed, batch, last_error")
    last = await kept.dispatch("step", "last", after=[dep])
    assert edges(db, dep) == MAX_DEPENDENTS and await kept.job(last) is not None
    with pytest.raises(TooManyDependents):
        await kept.dispatch("step", "one more", after=[dep])


async def test_pushes_racing_for_the_last_places_never_pass_the_cap_together(
    shared_file: Path, clock: Clock
) -> None:
    """Two Workers (two connections to one database) each push waiters for
    the same job at once: each push counts the edges inside its own
    transaction, so together they stay within the cap."""
    a, b = SqliteD1(shared_file), SqliteD1(shared_file)
    qa, qb = D1Queue(a, clock=clock), D1Queue(b, clock=clock)
    dep = await qa.dispatch("step", "dep")
    await fill(qa, dep, MAX_DEPENDENTS - 4)
    pushes = [
        q.push_many([q.new_job("step", i, after=[dep]) for i in range(3)]) for q in (qa, qb, qa, qb)
    ]
    results = await asyncio.gather(*pushes, return_exceptions=True)
    refused = [r for r in results if isinstance(r, TooManyDependents)]
    assert len(refused) == 3, results
    assert edges(a, dep) == MAX_DEPENDENTS - 1


async def test_a_push_of_too_many_edges_is_refused_before_anything_is_sent(
    kept: D1Queue, db: SqliteD1
) -> None:
    deps = [await kept.dispatch("step", i) for i in range(MAX_AFTER)]
    sent = len(db.statements)
    per_job = MAX_EDGES // MAX_AFTER + 1
    jobs = [kept.new_job("step", i, after=deps) for i in range(per_job)]
    with pytest.raises(TooManyEdges) as caught:
        await kept.push_many(jobs)
    assert caught.value.edges == per_job * MAX_AFTER and str(MAX_EDGES) in str(caught.value)
    with pytest.raises(TooManyEdges):
        await kept.batch(jobs)
    assert len(db.statements) == sent
    # A chain of a batch's most jobs fits.
    ids = await kept.chain([kept.new_job("step", i) for i in range(BATCH_JOBS[1])])
    assert len(ids) == BATCH_JOBS[1] and len(ids) - 1 <= MAX_EDGES


async def test_completing_a_job_at_the_cap_costs_a_bounded_number_of_rows(
    kept: D1Queue, db: SqliteD1
) -> None:
    """Pushes try to give a job half as many dependents again as the cap;
    its completion then writes a row for its own move and one a dependent it
    releases (SQLite's count of rows changed, the trigger's included), and
    the work it does (VM steps) is what the cap allows."""
    dep = await kept.dispatch("step", "dep")
    for _ in range(3):
        with contextlib.suppress(TooManyDependents):
            await fill(kept, dep, MAX_DEPENDENTS // 2)
    assert edges(db, dep) <= MAX_DEPENDENTS
    held = await kept.reserve("default")
    assert held is not None and held.id == dep
    changes = db._conn.total_changes
    db.count_vm_steps()
    assert await kept.complete(held)
    steps = db.vm_steps
    db.count_vm_steps(False)
    released = db.query(
        "SELECT COUNT(*) AS n FROM d1queue_jobs WHERE band > -1002 AND waiting = 0 AND id <> ?1",
        dep,
    )[0]["n"]
    assert released == edges(db, dep)
    assert db._conn.total_changes - changes <= MAX_DEPENDENTS + 1
    # About 180 VM steps a dependent released (17,861 at the cap on SQLite
    # 3.40): what the cap allows, with room, and below what more would take.
    assert steps <= 200 * (MAX_DEPENDENTS + 1), steps


# -- HTTP and RPC ------------------------------------------------------------------------


async def test_http_pushes_past_the_cap_are_422_naming_it_and_write_nothing(
    client: Client, kept: D1Queue, db: SqliteD1
) -> None:
    dep = await kept.dispatch("step", "dep")
    # One batch giving the job more waiters than the cap: refused whole.
    before = written(db)
    r = await client("POST", "/v1/batches", {"jobs": [waiter(dep)] * (MAX_DEPENDENTS + 1)})
    assert (r.status, r.body["error"]["code"]) == (422, "too_many_dependents"), r.body
    assert dep in r.body["error"]["message"] and str(MAX_DEPENDENTS) in r.body["error"]["message"]
    assert written(db) == before
    await fill(kept, dep, MAX_DEPENDENTS)
    before = written(db)
    for path, body in (
        ("/v1/jobs", waiter(dep)),
        ("/v1/queues/default/jobs", waiter(dep)),
        ("/v1/queues/default/jobs/batch", {"jobs": [waiter(dep)]}),
        ("/v1/batches", {"jobs": [waiter(dep)]}),
    ):
        r = await client("POST", path, body)
        assert (r.status, r.body["error"]["code"]) == (422, "too_many_dependents"), (path, r.body)
        assert dep in r.body["error"]["message"], r.body
        assert written(db) == before, path


async def test_http_additions_past_the_cap_are_422(
    client: Client, kept: D1Queue, db: SqliteD1
) -> None:
    dep = await kept.dispatch("step", "dep")
    r = await client("POST", "/v1/batches", {"jobs": [{"name": "step", "payload": 0}]})
    assert r.status == 201, r.body
    batch = r.body["batch"]
    await fill(kept, dep, MAX_DEPENDENTS)
    before = written(db)
    r = await client("POST", f"/v1/batches/{batch}/jobs", {"jobs": [waiter(dep)]})
    assert (r.status, r.body["error"]["code"]) == (422, "too_many_dependents"), r.body
    assert written(db) == before


async def test_http_requests_of_too_many_edges_are_422_naming_the_bound(
    client: Client, kept: D1Queue, db: SqliteD1
) -> None:
    deps = [await kept.dispatch("step", i) for i in range(MAX_AFTER)]
    before = written(db)
    jobs = [
        {"name": "step", "payload": i, "after": deps} for i in range(1 + MAX_EDGES // MAX_AFTER)
    ]
    for path in ("/v1/queues/default/jobs/batch", "/v1/batches"):
        r = await client("POST", path, {"jobs": jobs})
        assert (r.status, r.body["error"]["code"]) == (422, "too_many_edges"), (path, r.body)
        assert str(MAX_EDGES) in r.body["error"]["message"], r.body
        assert written(db) == before


async def test_rpc_pushes_past_either_bound_are_422_and_write_nothing(
    service: Service, kept: D1Queue, db: SqliteD1
) -> None:
    dep = await kept.dispatch("step", "dep")
    await fill(kept, dep, MAX_DEPENDENTS)
    before = written(db)
    calls = [
        service.dispatch("default", waiter(dep)),
        service.dispatch_job(waiter(dep)),
        service.dispatch_batch("default", [waiter(dep)]),
        service.batch({"jobs": [waiter(dep)]}),
    ]
    for call in calls:
        with pytest.raises(ApiError) as caught:
            await call
        assert (caught.value.status, caught.value.code) == (422, "too_many_dependents")
        assert dep in caught.value.message
    deps = [await kept.dispatch("step", i) for i in range(MAX_AFTER)]
    before = written(db)
    jobs = [
        {"name": "step", "payload": i, "after": deps} for i in range(1 + MAX_EDGES // MAX_AFTER)
    ]
    with pytest.raises(ApiError) as caught:
        await service.batch({"jobs": jobs})
    assert (caught.value.status, caught.value.code) == (422, "too_many_edges")
    assert written(db) == before


async def test_the_bounds_are_stated_in_the_document() -> None:
    after = SPEC["components"]["schemas"]["Job"]["properties"]["after"]["description"]
    assert f"{MAX_DEPENDENTS} jobs" in after and "too_many_dependents" in after
    batch = SPEC["components"]["schemas"]["BatchIn"]["properties"]["jobs"]["description"]
    assert str(MAX_EDGES) in batch and "too_many_edges" in batch
