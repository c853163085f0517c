"""Workflows over the HTTP API on SQLite: a job's states and result from
GET /v1/jobs/{id}, dependencies (`after`, `ignore_failed`) on every push
route, batches with callbacks (POST/GET /v1/batches, additions), a queue's
completed page; every bad input a 4xx that writes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import Config, D1Queue, Fail, Registry, drain
from d1queue.core.bounds import BATCH_JOBS, MAX_AFTER
from d1queue.core.job import new_id
from d1queue.interfaces.api import Api
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1

from .conftest import Clock
from .test_api import TOKEN, Client, registry
from .test_shards import Sharded

TABLES = (
    "d1queue_jobs",
    "d1queue_deps",
    "d1queue_batches",
    "d1queue_batch_parts",
    "d1queue_failed_jobs",
)


def written(db: SqliteD1) -> tuple[int, ...]:
    return tuple(db.query(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in TABLES)


@pytest.fixture
def ran() -> list[str]:
    return []


@pytest.fixture
def reg(ran: list[str]) -> Registry:
    reg = registry()

    @reg.job("step", max_attempts=1)
    async def step(payload: Any) -> Any:
        ran.append(payload["id"])
        if payload.get("fail"):
            raise Fail("told to fail")
        return {"done": payload["id"]}

    @reg.job("callback", subrequests=1)
    async def callback(payload: Any, ctx: Any) -> None:
        batch = await ctx.batch()
        ran.append(f"cb:{payload}:{batch['state']}:{len(batch['ids'])}")

    return reg


@pytest.fixture
def kept(db: SqliteD1, clock: Clock) -> D1Queue:
    """A queue that keeps completed jobs, as the Worker glue makes it by
    default (D1QUEUE_KEEP_COMPLETED_S > 0)."""
    return D1Queue(db, clock=clock, keep_completed=True)


@pytest.fixture
def client(db: SqliteD1, kept: D1Queue, reg: Registry) -> Client:
    return Client(Api(Service(kept, reg), TOKEN, "9.9", SPEC), db)


async def run(queue: D1Queue, reg: Registry, rounds: int = 1) -> None:
    for _ in range(rounds):
        await drain(queue, reg, Config())


def step(id: str, **fields: Any) -> dict[str, Any]:
    payload = {"id": id, **({"fail": True} if fields.pop("fail", False) else {})}
    return {"name": "step", "payload": payload, **fields}


async def push(client: Client, body: dict[str, Any], path: str = "/v1/jobs") -> str:
    r = await client("POST", path, body)
    assert r.status == 201, r.body
    return str(r.body["id"])


async def state(client: Client, id: str) -> dict[str, Any]:
    r = await client("GET", f"/v1/jobs/{id}")
    assert r.status == 200, r.body
    return dict(r.body)


# -- states and results -----------------------------------------------------------


async def test_a_job_answers_each_state_and_its_result(
    client: Client, kept: D1Queue, reg: Registry, clock: Clock
) -> None:
    a = await push(client, step("a"))
    b = await push(client, step("b", after=[a]), "/v1/queues/default/jobs")
    later = await push(client, step("later", delay_s=60))
    got = await state(client, b)
    assert (got["state"], got["after"], got["ignore_failed"], got["batch"]) == (
        "waiting",
        [a],
        False,
        None,
    )
    assert (got["result"], got["completed_at"], got["dependents"]) == (None, None, [])
    got = await state(client, a)
    assert (got["state"], got["after"], got["dependents"]) == ("ready", None, [b])
    assert (await state(client, later))["state"] == "delayed"

    held = await kept.reserve("default")
    assert held is not None and held.id == a
    assert (await state(client, a))["state"] == "reserved"
    assert await kept.complete(held)
    got = await state(client, a)
    assert got["state"] == "completed" and got["completed_at"] == clock()
    assert got["reserved_until"] is None and got["dependents"] == [b]
    # The waiter is free once its one dependency completed.
    assert (await state(client, b))["state"] == "ready"
    await run(kept, reg)
    got = await state(client, b)
    assert (got["state"], got["result"], got["payload"]) == (
        "completed",
        {"done": "b"},
        {"id": "b"},
    )


async def test_a_chain_runs_in_order(client: Client, kept: D1Queue, reg: Registry) -> None:
    ran_ids: list[str] = []
    ids: list[str] = []
    for name in "abcd":
        body = step(name, **({"after": [ids[-1]]} if ids else {}))
        ids.append(await push(client, body))
    for _ in range(len(ids)):
        states = [(await state(client, i))["state"] for i in ids]
        ran_ids.append(states.index("ready") if "ready" in states else -1)
        assert states.count("ready") == 1, states
        await run(kept, reg)
    assert ran_ids == [0, 1, 2, 3]
    for name, id in zip("abcd", ids, strict=True):
        assert (await state(client, id))["result"] == {"done": name}


async def test_a_failed_dependency_fails_the_waiter_unless_it_ignores_failures(
    client: Client, kept: D1Queue, reg: Registry, ran: list[str]
) -> None:
    a = await push(client, step("a", fail=True))
    b = await push(client, step("b", after=[a]))
    c = await push(client, step("c", after=[a], ignore_failed=True))
    await run(kept, reg, 3)
    assert "b" not in ran and "c" in ran
    got = await state(client, b)
    assert got["state"] == "failed" and got["error"] == f"dependency {a} failed", got
    assert got["after"] == [a]
    got = await state(client, c)
    assert (got["state"], got["ignore_failed"], got["result"]) == (
        "completed",
        True,
        {"done": "c"},
    )
    assert (await state(client, a))["state"] == "failed"


async def test_a_cancelled_dependency_fails_its_waiter(
    client: Client, kept: D1Queue, reg: Registry
) -> None:
    a = await push(client, step("a", delay_s=60))
    b = await push(client, step("b", after=[a]))
    assert (await client("DELETE", f"/v1/jobs/{a}")).status == 200
    await run(kept, reg)
    got = await state(client, b)
    assert (got["state"], got["error"]) == ("failed", f"dependency {a} failed")


async def test_a_batch_push_item_may_wait_for_a_job(
    client: Client, kept: D1Queue, reg: Registry, ran: list[str]
) -> None:
    a = await push(client, step("a"))
    r = await client(
        "POST",
        "/v1/queues/default/jobs/batch",
        {"jobs": [step("b", after=[a]), step("c", after=[a], ignore_failed=False), step("d")]},
    )
    assert r.status == 201, r.body
    b, c, d = r.body["ids"]
    assert [(await state(client, i))["state"] for i in (b, c, d)] == ["waiting", "waiting", "ready"]
    assert (await state(client, a))["dependents"] == sorted([b, c])
    await run(kept, reg, 2)
    assert ran.index("a") < ran.index("b") and ran.index("a") < ran.index("c")


async def test_a_completed_job_of_a_queue_without_history_is_gone(
    client: Client, kept: D1Queue, reg: Registry
) -> None:
    reg.history("nohist", keep=False)
    a = await push(client, step("a", queue="nohist"))
    await run(kept, reg)
    r = await client("GET", f"/v1/jobs/{a}")
    assert r.status == 404 and r.body["error"]["code"] == "not_found"
    # Nothing can wait for it now: it is neither queued nor kept.
    r = await client("POST", "/v1/jobs", step("b", after=[a]))
    assert (r.status, r.body["error"]["code"]) == (422, "unknown_dependency")


# -- bad input --------------------------------------------------------------------

PUSHES = ["/v1/jobs", "/v1/queues/default/jobs", "/v1/queues/default/jobs/batch", "/v1/batches"]

BAD_AFTER: list[tuple[dict[str, Any], str]] = [
    ({"after": []}, "after must name 1 to 100"),
    ({"after": "abc"}, "after must be an array"),
    ({"after": {"a": 1}}, "after must be an array"),
    ({"after": ["a b"]}, "is not a job id"),
    ({"after": [7]}, "is not a job id"),
    ({"after": ["x" * 129]}, "is not a job id"),
    ({"after": [f"id{i}" for i in range(MAX_AFTER + 1)]}, "got 101"),
    ({"after": ["dup", "dup"]}, "more than once"),
    ({"after": ["a1"], "ignore_failed": "yes"}, "ignore_failed must be true or false"),
    ({"ignore_failed": None}, "ignore_failed must be true or false"),
    ({"after": ["a1"], "unique_key": "k", "debounce_s": 5}, "cannot be combined"),
]


def body_for(path: str, job: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": [step("ok"), job]} if path.endswith(("batch", "batches")) else job


@pytest.mark.parametrize("path", PUSHES)
@pytest.mark.parametrize(("fields", "message"), BAD_AFTER)
async def test_a_bad_after_is_422_invalid_and_writes_nothing(
    client: Client, db: SqliteD1, path: str, fields: dict[str, Any], message: str
) -> None:
    existing = await push(client, step("there"))
    before = written(db)
    r = await client("POST", path, body_for(path, step("b", **fields)))
    assert (r.status, r.body["error"]["code"]) == (422, "invalid"), r.body
    assert message in r.body["error"]["message"], r.body
    assert written(db) == before
    assert (await state(client, existing))["dependents"] == []


@pytest.mark.parametrize("path", PUSHES)
async def test_an_unknown_dependency_is_422_naming_it_and_writes_nothing(
    client: Client, db: SqliteD1, kept: D1Queue, reg: Registry, path: str
) -> None:
    there = await push(client, step("there"))
    done = await push(client, step("done"))
    failed = await push(client, step("failed", fail=True))
    await run(kept, reg)
    assert (await state(client, done))["state"] == "completed"
    missing = new_id()
    before = written(db)
    r = await client("POST", path, body_for(path, step("b", after=[there, missing, done, failed])))
    assert (r.status, r.body["error"]["code"]) == (422, "unknown_dependency"), r.body
    message = r.body["error"]["message"]
    assert missing in message and there not in message and done not in message
    assert written(db) == before
    # Another shard's id is unknown to this job's database, said so.
    r = await client("POST", path, body_for(path, step("b", after=[f"s3-{missing}"])))
    assert (r.status, r.body["error"]["code"]) == (422, "unknown_dependency"), r.body
    assert "shard" in r.body["error"]["message"] and f"s3-{missing}" in r.body["error"]["message"]
    assert written(db) == before
    # Known ones: accepted.
    r = await client("POST", path, body_for(path, step("b", after=[there, done, failed])))
    assert r.status == 201, r.body


BAD_BATCHES: list[tuple[Any, int, str, str]] = [
    # (body, status, code, words in the message)
    ({"jobs": []}, 422, "invalid", f"{BATCH_JOBS[0]} to {BATCH_JOBS[1]} jobs"),
    ({"jobs": [step("x")] * (BATCH_JOBS[1] + 1)}, 422, "invalid", "1 to 1000 jobs"),
    ({}, 422, "invalid", "1 to 1000 jobs"),
    ({"jobs": {"name": "step"}}, 422, "invalid", "1 to 1000 jobs"),
    ({"jobs": [step("x")], "on_sucess": step("cb")}, 422, "invalid", "on_sucess"),
    ({"jobs": [step("x")], "then": 1, "zzz": 2}, 422, "invalid", "then, zzz"),
    ({"jobs": [step("x"), {**step("y"), "colour": "red"}]}, 422, "invalid", "jobs[1]: unknown"),
    ({"jobs": [step("x"), {"name": "nope"}]}, 422, "invalid", "jobs[1]: no job is registered"),
    ({"jobs": [step("x"), "step"]}, 422, "invalid", "jobs[1]: a job must be a JSON object"),
    ({"jobs": [step("x")], "on_success": {**step("cb"), "colour": 1}}, 422, "invalid", "colour"),
    ({"jobs": [step("x")], "on_failure": {"name": "nope"}}, 422, "invalid", "on_failure: no job"),
    ({"jobs": [step("x")], "on_finish": "callback"}, 422, "invalid", "on_finish: a job must be"),
    ({"jobs": [step("x")], "on_finish": step("cb", delay_s=5)}, 422, "invalid", "not delay_s"),
    ({"jobs": [step("x")], "on_success": step("cb", after=["a1"])}, 422, "invalid", "not after"),
    ({"jobs": [step("x"), step("y", priority=5000)]}, 422, "invalid", "jobs[1]: priority"),
    ({"jobs": [step("x", payload="p" * 200_000)]}, 413, "payload_too_large", "jobs[0]"),
    ([step("x")], 400, "malformed_json", "JSON object"),
    ("jobs", 400, "malformed_json", "JSON object"),
]


@pytest.mark.parametrize(
    ("body", "status", "code", "words"), BAD_BATCHES, ids=[c[3] for c in BAD_BATCHES]
)
async def test_a_bad_batch_is_refused_and_writes_nothing(
    client: Client, db: SqliteD1, body: Any, status: int, code: str, words: str
) -> None:
    r = await client("POST", "/v1/batches", body)
    assert (r.status, r.body["error"]["code"]) == (status, code), r.body
    assert words in r.body["error"]["message"], r.body
    assert written(db) == (0,) * len(TABLES)


async def test_the_batch_limit_is_bounds_and_the_document_states_it() -> None:
    schema = SPEC["components"]["schemas"]["BatchIn"]["properties"]["jobs"]
    assert (schema["minItems"], schema["maxItems"]) == BATCH_JOBS
    added = SPEC["components"]["schemas"]["BatchJobs"]["properties"]["jobs"]
    assert (added["minItems"], added["maxItems"]) == BATCH_JOBS
    after = SPEC["components"]["schemas"]["Job"]["properties"]["after"]
    assert after["maxItems"] == MAX_AFTER


async def test_a_full_batch_of_the_most_jobs_is_taken(client: Client, db: SqliteD1) -> None:
    jobs = [{"name": "t.echo", "payload": i} for i in range(BATCH_JOBS[1])]
    r = await client("POST", "/v1/batches", {"jobs": jobs})
    assert r.status == 201, r.body
    assert len(r.body["ids"]) == BATCH_JOBS[1] and len(set(r.body["ids"])) == BATCH_JOBS[1]
    got = (await client("GET", f"/v1/batches/{r.body['batch']}")).body
    assert (got["total"], got["pending"], got["state"]) == (BATCH_JOBS[1], BATCH_JOBS[1], "running")


# -- batches --------------------------------------------------------------------------


async def test_a_batchs_callbacks_run_once_and_its_state_follows(
    client: Client, kept: D1Queue, reg: Registry, ran: list[str], clock: Clock
) -> None:
    callbacks = {
        kind: {"name": "callback", "payload": kind.removeprefix("on_")}
        for kind in ("on_success", "on_failure", "on_finish")
    }
    r = await client(
        "POST",
        "/v1/batches",
        {"jobs": [step(f"m{i}", fail=i == 2) for i in range(4)], **callbacks},
    )
    assert r.status == 201 and set(r.body) == {"batch", "ids"}, r.body
    batch, ids = r.body["batch"], r.body["ids"]
    got = (await client("GET", f"/v1/batches/{batch}")).body
    assert got == {
        "id": batch,
        "total": 4,
        "pending": 4,
        "completed": 0,
        "failed": 0,
        "state": "running",
        "created_at": clock(),
        "finished_at": None,
        "ids": ids,
    }
    assert (await state(client, ids[0]))["batch"] == batch
    for _ in range(5):
        await run(kept, reg)
        clock.advance(1)
    got = (await client("GET", f"/v1/batches/{batch}")).body
    assert (got["pending"], got["completed"], got["failed"], got["state"]) == (0, 3, 1, "failed")
    assert got["finished_at"] is not None
    callbacks_ran = sorted(r for r in ran if r.startswith("cb:"))
    assert callbacks_ran == ["cb:failure:failed:4", "cb:finish:failed:4"]
    # A callback is a job of its own, with an id of the batch's.
    assert (await state(client, f"{batch}:on_finish"))["state"] == "completed"

    r = await client(
        "POST",
        "/v1/batches",
        {"jobs": [step("s1"), step("s2")], **callbacks},
    )
    second = r.body["batch"]
    for _ in range(4):
        await run(kept, reg)
    got = (await client("GET", f"/v1/batches/{second}")).body
    assert (got["completed"], got["state"]) == (2, "succeeded")
    assert ran.count("cb:success:succeeded:2") == 1 and ran.count("cb:finish:succeeded:2") == 1
    assert not any(r.startswith("cb:failure:succeeded") for r in ran)


async def test_a_batch_of_one_queue_per_job_and_a_callback_queue(
    client: Client, kept: D1Queue, reg: Registry, ran: list[str]
) -> None:
    r = await client(
        "POST",
        "/v1/batches",
        {
            "jobs": [step("a", queue="q1"), step("b", queue="q2", max_attempts=3)],
            "on_success": {"name": "callback", "payload": "success", "queue": "q3"},
            "on_failure": None,
        },
    )
    assert r.status == 201, r.body
    a, b = r.body["ids"]
    assert (await state(client, a))["queue"] == "q1"
    got = await state(client, b)
    assert (got["queue"], got["max_attempts"]) == ("q2", 3)
    await run(kept, reg, 3)
    assert (await state(client, f"{r.body['batch']}:on_success"))["queue"] == "q3"
    assert ran.count("cb:success:succeeded:2") == 1


async def test_jobs_are_added_to_a_running_batch_and_not_to_a_finished_one(
    client: Client, db: SqliteD1, kept: D1Queue, reg: Registry, ran: list[str]
) -> None:
    r = await client(
        "POST",
        "/v1/batches",
        {"jobs": [step("a", delay_s=30)], "on_finish": {"name": "callback", "payload": "f"}},
    )
    batch = r.body["batch"]
    r = await client("POST", f"/v1/batches/{batch}/jobs", {"jobs": [step("b"), step("c")]})
    assert r.status == 201 and set(r.body) == {"ids"} and len(r.body["ids"]) == 2, r.body
    got = (await client("GET", f"/v1/batches/{batch}")).body
    assert (got["total"], got["pending"]) == (3, 3) and got["ids"][1:] == r.body["ids"]
    before = written(db)
    for bad, code in (
        ({"jobs": []}, "invalid"),
        ({"jobs": [step("d")], "on_success": step("e")}, "invalid"),
        ({"jobs": [{"name": "nope"}]}, "invalid"),
        ({"jobs": [step("d", after=[new_id()])]}, "unknown_dependency"),
    ):
        r = await client("POST", f"/v1/batches/{batch}/jobs", bad)
        assert (r.status, r.body["error"]["code"]) == (422, code), r.body
    assert written(db) == before

    kept.clock.advance(30)  # type: ignore[attr-defined]
    for _ in range(3):
        await run(kept, reg)
    got = (await client("GET", f"/v1/batches/{batch}")).body
    assert (got["state"], got["completed"]) == ("succeeded", 3)
    assert ran.count("cb:f:succeeded:3") == 1
    before = written(db)
    for target in (batch, new_id(), f"s7-{new_id()}"):
        r = await client("POST", f"/v1/batches/{target}/jobs", {"jobs": [step("late")]})
        assert (r.status, r.body["error"]["code"]) == (409, "batch_not_running"), r.body
    assert written(db) == before
    r = await client("POST", "/v1/batches/a%20b/jobs", {"jobs": [step("late")]})
    assert (r.status, r.body["error"]["code"]) == (400, "invalid_id")
    assert written(db) == before


async def test_an_unknown_batch_is_404_and_a_bad_id_400(client: Client) -> None:
    r = await client("GET", f"/v1/batches/{new_id()}")
    assert (r.status, r.body["error"]["code"]) == (404, "not_found")
    r = await client("GET", f"/v1/batches/s9-{new_id()}")
    assert r.status == 404
    r = await client("GET", "/v1/batches/a%20b")
    assert (r.status, r.body["error"]["code"]) == (400, "invalid_id")
    r = await client("DELETE", f"/v1/batches/{new_id()}")
    assert r.status == 405


# -- the completed page ---------------------------------------------------------------


async def test_the_completed_page_is_newest_first_with_results(
    client: Client, kept: D1Queue, reg: Registry, clock: Clock
) -> None:
    ids = []
    for i in range(5):
        ids.append(await push(client, step(f"j{i}", queue="done")))
        await run(kept, reg)
        clock.advance(1)
    await push(client, step("other", queue="elsewhere"))
    await push(client, step("pending", queue="done", delay_s=600))
    await run(kept, reg)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        path = "/v1/queues/done/completed?limit=2" + (f"&cursor={cursor}" if cursor else "")
        r = await client("GET", path)
        assert r.status == 200, r.body
        for job in r.body["jobs"]:
            assert job["state"] == "completed" and job["result"] == {"done": job["payload"]["id"]}
            assert job["completed_at"] is not None
        seen += [j["id"] for j in r.body["jobs"]]
        pages += 1
        cursor = r.body["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1] and pages == 3
    r = await client("GET", "/v1/queues/done/completed")
    assert [j["id"] for j in r.body["jobs"]] == ids[::-1] and r.body["next_cursor"] is None
    r = await client("GET", "/v1/queues/empty/completed")
    assert r.body == {"jobs": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("limit=0", "invalid_limit"),
        ("limit=501", "invalid_limit"),
        ("limit=x", "invalid_limit"),
        ("cursor=abc", "invalid_cursor"),
        ("cursor=12", "invalid_cursor"),
        ("limt=3", "invalid_query"),
    ],
)
async def test_a_bad_completed_query_is_400(client: Client, query: str, code: str) -> None:
    r = await client("GET", f"/v1/queues/done/completed?{query}")
    assert (r.status, r.body["error"]["code"]) == (400, code), r.body
    r = await client("GET", "/v1/queues/a%20b/completed")
    assert (r.status, r.body["error"]["code"]) == (400, "invalid_queue")


# -- shards ----------------------------------------------------------------------------


def echo(queue: str, **fields: Any) -> dict[str, Any]:
    return {"name": "t.echo", "queue": queue, **fields}


async def test_workflows_stay_on_one_shard_and_ids_route_there() -> None:
    two = Sharded(2)
    try:
        # "mail" lives on shard 0 and "reports" on shard 1 (test_shards).
        mail = (await two("POST", "/v1/jobs", echo("mail"))).body["id"]
        r = await two("POST", "/v1/jobs", echo("reports", after=[mail]))
        assert (r.status, r.body["error"]["code"]) == (422, "unknown_dependency")
        assert "shard" in r.body["error"]["message"] and mail in r.body["error"]["message"]
        r = await two(
            "POST",
            "/v1/batches",
            {"jobs": [echo("mail"), echo("reports")]},
        )
        assert (r.status, r.body["error"]["code"]) == (422, "invalid")
        assert "shard" in r.body["error"]["message"]
        assert two.counts() == [1, 0]

        r = await two("POST", "/v1/batches", {"jobs": [echo("reports")]})
        assert r.status == 201, r.body
        batch = r.body["batch"]
        assert batch.startswith("s1-") and r.body["ids"][0].startswith("s1-")
        got = await two("GET", f"/v1/batches/{batch}")
        assert (got.status, got.body["total"]) == (200, 1)
        r = await two("POST", f"/v1/batches/{batch}/jobs", {"jobs": [echo("mail")]})
        assert (r.status, r.body["error"]["code"]) == (422, "invalid"), r.body
        r = await two("POST", f"/v1/batches/{batch}/jobs", {"jobs": [echo("reports")]})
        assert r.status == 201 and r.body["ids"][0].startswith("s1-"), r.body
        assert (await two("GET", f"/v1/batches/{batch}")).body["total"] == 2
        assert two.counts() == [1, 2]
        page = await two("GET", "/v1/queues/reports/completed")
        assert page.body == {"jobs": [], "next_cursor": None}
    finally:
        two.close()
