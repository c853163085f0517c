"""Shards on several SqliteD1 databases: configuration (a typo refused),
routing by queue, pin and partition, ids that name their shard, the API and
the dashboard over every shard, schedules on their queue's shard, the cron's
budget shares, and wake-ups naming their shard."""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.bounds import ID_PATTERN, MAX_PARTITION
from d1queue.core.config import ConfigError
from d1queue.core.job import new_id
from d1queue.core.shards import (
    Routing,
    Shares,
    hash_shard,
    mark_id,
    merge_pages,
    rotation,
    shard_of_id,
    split,
)
from d1queue.features.cron import combine, cron
from d1queue.features.wake import (
    FOLLOW_UP_RESERVE,
    Waker,
    consume,
    consumer_jobs,
    parse_wake,
    wake_body,
)
from d1queue.interfaces.api import Api, ApiReply
from d1queue.interfaces.openapi import SPEC
from d1queue.interfaces.service import Service
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.dashboard import Store
from d1queue.store.shardset import ShardError, ShardQueue, ShardSet

from .conftest import MIGRATIONS, Clock
from .test_api import AUTH, TOKEN

# crc32 mod 2: mail -> 0, default/reports/q -> 1; mod 3: mail 0, reports 1, q 2.


def databases(n: int) -> list[SqliteD1]:
    dbs = [SqliteD1() for _ in range(n)]
    for d in dbs:
        d.apply_migrations(MIGRATIONS)
    return dbs


def count(db: SqliteD1, table: str = "d1queue_jobs") -> int:
    return int(db.query(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"])


def ids(db: SqliteD1) -> list[str]:
    return [str(r["id"]) for r in db.query("SELECT id FROM d1queue_jobs ORDER BY id")]


def registry(runs: Counter[Any] | None = None) -> Registry:
    reg = Registry()

    @reg.job("t.echo")
    async def echo(payload: Any) -> None:
        if runs is not None:
            runs[json.dumps(payload)] += 1

    @reg.job("t.boom", max_attempts=1)
    async def boom(payload: Any) -> None:
        raise RuntimeError("boom")

    @reg.job("t.fanout", queue="mail", subrequests=1)
    async def fanout(payload: Any, ctx: Any) -> None:
        await ctx.queue.dispatch("t.echo", {"from": "mail"}, queue="reports")

    return reg


class Sharded:
    """n SqliteD1 databases as shards, with a Service and an Api over them."""

    def __init__(self, n: int, pinned: dict[str, int] | None = None, **config: Any) -> None:
        self.clock = Clock()
        self.dbs = databases(n)
        self.config = Config(
            shards=tuple(["DB", *[f"DB_{i}" for i in range(1, n)]]),
            shard_map=tuple((pinned or {}).items()),
            **config,
        )
        self.shards = ShardSet(
            [D1Queue(d, clock=self.clock) for d in self.dbs], self.config.routing
        )
        self.runs: Counter[Any] = Counter()
        self.reg = registry(self.runs)
        self.pushed: list[tuple[str, int]] = []

        def on_push(queue: str, shard: int) -> None:
            self.pushed.append((queue, shard))

        self.service = Service(
            self.shards.home, self.reg, on_push=on_push, config=self.config, shards=self.shards
        )
        self.api = Api(self.service, TOKEN, "1", SPEC)

    async def __call__(self, method: str, path: str, body: Any = None) -> ApiReply:
        data = b"" if body is None else json.dumps(body).encode()
        return await self.api.handle(method, f"https://q.example{path}", AUTH, data)

    def counts(self) -> list[int]:
        return [count(d) for d in self.dbs]

    def close(self) -> None:
        for d in self.dbs:
            d.close()


@pytest.fixture
def two() -> Iterator[Sharded]:
    s = Sharded(2)
    yield s
    s.close()


@pytest.fixture
def three() -> Iterator[Sharded]:
    s = Sharded(3, pinned={"emails": 2})
    yield s
    s.close()


# -- configuration ---------------------------------------------------------------


def test_one_shard_named_db_is_the_default() -> None:
    c = Config.from_vars({})
    assert c.shards == ("DB",) and c.routing == Routing(1, {})
    assert c.routing.shard_of("anything", "any partition") == 0


def test_shards_and_the_map_are_read_from_vars() -> None:
    c = Config.from_vars(
        {"D1QUEUE_SHARDS": " DB, DB_1 ,DB_2", "D1QUEUE_SHARD_MAP": "emails=1, reports=2"}
    )
    assert c.shards == ("DB", "DB_1", "DB_2")
    assert c.routing.pinned == {"emails": 1, "reports": 2}


@pytest.mark.parametrize(
    ("vars", "says"),
    [
        ({"D1QUEUE_SHARD": "DB,DB_1"}, "unknown setting D1QUEUE_SHARD"),
        ({"D1QUEUE_SHARDS_MAP": "a=1"}, "unknown setting D1QUEUE_SHARDS_MAP"),
        ({"D1QUEUE_SHARDS": "DB,DB-1"}, "not a binding name"),
        ({"D1QUEUE_SHARDS": "DB,,DB_1"}, "not a binding name"),
        ({"D1QUEUE_SHARDS": "DB,DB"}, "more than once"),
        ({"D1QUEUE_SHARDS": "DB,DB_1", "D1QUEUE_SHARD_MAP": "emails=2"}, "0 to 1"),
        ({"D1QUEUE_SHARD_MAP": "emails=1"}, "0 to 0"),
        ({"D1QUEUE_SHARDS": "DB,DB_1", "D1QUEUE_SHARD_MAP": "emails:1"}, "not a valid value"),
        ({"D1QUEUE_SHARDS": "DB,DB_1", "D1QUEUE_SHARD_MAP": "emails=-1"}, "not a valid"),
        ({"D1QUEUE_SHARDS": "DB,DB_1", "D1QUEUE_SHARD_MAP": "a=0,a=1"}, "more than once"),
        ({"D1QUEUE_SHARDS": "DB,DB_1", "D1QUEUE_SHARD_MAP": "no way=1"}, "queue must match"),
        (
            {"D1QUEUE_SHARDS": ",".join(["DB", *[f"DB_{i}" for i in range(1, 8)]])},
            "each needs at least 6",
        ),
    ],
)
def test_a_typo_or_an_impossible_shard_setting_is_refused(vars: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Config.from_vars(vars)


def test_the_paid_plan_affords_many_shards_in_one_cron_run() -> None:
    names = ",".join(["DB", *[f"DB_{i}" for i in range(1, 50)]])
    assert len(Config.from_vars({"D1QUEUE_SHARDS": names, "D1QUEUE_PLAN": "paid"}).shards) == 50


# -- routing and ids ----------------------------------------------------------------


def test_routing_is_a_stable_hash_of_the_queue_or_the_partition() -> None:
    # CRC-32, never Python's hash(): the same in every Worker and every deploy.
    assert hash_shard("mail", 3) == zlib.crc32(b"mail") % 3 == 0
    assert [hash_shard(q, 3) for q in ("reports", "q", "default")] == [1, 2, 1]
    r = Routing(3, {"emails": 2})
    assert r.shard_of("mail") == 0
    assert r.shard_of("mail", partition="q") == 2  # the partition key instead of the queue
    assert r.shard_of("emails") == r.shard_of("emails", partition="mail") == 2  # pinned wins
    spread = Counter(r.shard_of("hot", partition=f"customer-{i}") for i in range(300))
    assert set(spread) == {0, 1, 2} and min(spread.values()) > 60


def test_an_id_names_its_shard_and_old_ids_are_shard_0() -> None:
    old = new_id(1_700_000_000_000)
    assert len(old) == 32 and shard_of_id(old) == 0
    assert mark_id(old, 0) == old
    assert mark_id(old, 7) == f"s7-{old}" and shard_of_id(f"s7-{old}") == 7
    assert shard_of_id(f"s99-{old}") == 99
    for chosen in ("s0-x", "s01-x", "sx-1", "job-1", "s100-x"):
        assert shard_of_id(chosen) == 0  # a caller's own id without a marker
    assert all(ID_PATTERN.fullmatch(mark_id(old, k)) for k in (0, 1, 99))
    # FIFO within a shard: one prefix, ids still in creation order.
    made = [mark_id(new_id(1_700_000_000_000), 3) for _ in range(50)]
    assert made == sorted(made)


def test_split_and_rotation_add_up() -> None:
    assert split(45, 2) == [23, 22] and sum(split(45, 7)) == 45
    assert split(5, 8) == [1, 1, 1, 1, 1, 0, 0, 0]
    assert rotation(3, 4) == [1, 2, 0]


# -- pushes and lookups ------------------------------------------------------------


async def test_pushes_land_on_their_queues_shard_and_lookups_go_straight_there(
    two: Sharded,
) -> None:
    mail = await two("POST", "/v1/queues/mail/jobs", {"name": "t.echo", "payload": 1})
    reports = await two("POST", "/v1/queues/reports/jobs", {"name": "t.echo", "payload": 2})
    assert mail.status == reports.status == 201
    assert shard_of_id(mail.body["id"]) == 0 and len(mail.body["id"]) == 32
    assert reports.body["id"].startswith("s1-")
    assert ids(two.dbs[0]) == [mail.body["id"]] and ids(two.dbs[1]) == [reports.body["id"]]
    assert two.pushed == [("mail", 0), ("reports", 1)]
    for body in (mail.body, reports.body):
        got = await two("GET", f"/v1/jobs/{body['id']}")
        assert (got.status, got.body["id"], got.body["state"]) == (200, body["id"], "ready")
    # One query, to the id's shard only.
    usage = [q.binding.usage for q in two.shards.queues]
    before = [u.queries for u in usage]
    await two("GET", f"/v1/jobs/{reports.body['id']}")
    assert [u.queries for u in usage] == [before[0], before[1] + 1]
    # A shard this Worker does not have: not found, nothing sent.
    r = await two("GET", f"/v1/jobs/s5-{new_id()}")
    assert r.status == 404
    assert (await two("DELETE", f"/v1/jobs/{reports.body['id']}")).status == 200
    assert two.counts() == [1, 0]


async def test_a_bad_id_is_400_and_a_bad_partition_422_and_nothing_is_written(
    two: Sharded,
) -> None:
    r = await two("GET", "/v1/jobs/" + "x" * 129)
    assert (r.status, r.body["error"]["code"]) == (400, "invalid_id")
    r = await two("POST", "/v1/failed/a%20b/retry")
    assert (r.status, r.body["error"]["code"]) == (400, "invalid_id")
    for partition in (7, True, "", "p" * (MAX_PARTITION + 1), ["a"], {"a": 1}):
        r = await two("POST", "/v1/queues/q/jobs", {"name": "t.echo", "partition": partition})
        assert (r.status, r.body["error"]["code"]) == (422, "invalid"), partition
        assert "partition" in r.body["error"]["message"]
    batch = {"jobs": [{"name": "t.echo", "partition": "mail"}, {"name": "t.echo"}]}
    r = await two("POST", "/v1/queues/q/jobs/batch", batch)
    assert r.status == 422 and "jobs[1]: routes to shard 1" in r.body["error"]["message"]
    assert two.counts() == [0, 0] and two.pushed == []


async def test_a_partition_spreads_one_queue_and_unique_keys_are_per_shard(
    two: Sharded,
) -> None:
    for p in ("mail", "reports"):
        r = await two("POST", "/v1/queues/hot/jobs", {"name": "t.echo", "partition": p})
        assert r.status == 201
    assert two.counts() == [1, 1]
    # A unique key holds on its shard: a second push there stores nothing...
    job = {"name": "t.echo", "unique_key": "k", "partition": "mail"}
    first = await two("POST", "/v1/queues/hot/jobs", job)
    again = await two("POST", "/v1/queues/hot/jobs", job)
    assert again.status == 200 and again.body["id"] == first.body["id"]
    # ...and a push of the same key routed to the other shard is stored there.
    other = await two("POST", "/v1/queues/hot/jobs", {**job, "partition": "reports"})
    assert other.status == 201 and other.body["id"].startswith("s1-")
    # A batch whose jobs all route to one shard is one transaction there.
    batch = {"jobs": [{"name": "t.echo", "partition": "reports"}] * 3}
    r = await two("POST", "/v1/queues/hot/jobs/batch", batch)
    assert r.status == 201 and all(i.startswith("s1-") for i in r.body["ids"])
    assert two.counts() == [2, 5]
    stats = await two("GET", "/v1/queues/hot")
    assert stats.body["ready"] == 7


async def test_stats_add_up_and_pause_writes_every_shard(two: Sharded) -> None:
    for q in ("mail", "reports", "reports"):
        await two("POST", f"/v1/queues/{q}/jobs", {"name": "t.echo"})
    await two("POST", "/v1/queues/hot/jobs", {"name": "t.echo", "partition": "mail"})
    await two("POST", "/v1/queues/hot/jobs", {"name": "t.echo", "partition": "reports"})
    r = await two("GET", "/v1/queues")
    assert {s["queue"]: s["ready"] for s in r.body["queues"]} == {
        "hot": 2,
        "mail": 1,
        "reports": 2,
    }
    r = await two("POST", "/v1/queues/hot/pause")
    assert r.body["paused"] is True
    for d in two.dbs:
        assert d.query("SELECT paused FROM d1queue_queues WHERE name = 'hot'")[0]["paused"] == 1
    report = await drain(two.shards.queue(1), two.reg, two.config)
    assert report.paused == ["hot"] and report.completed == 2  # reports' two, not hot's
    assert (await two("POST", "/v1/queues/hot/resume")).body["paused"] is False
    assert (await two("DELETE", "/v1/queues/hot/jobs")).body == {"deleted": 2}


async def test_failed_jobs_are_listed_newest_first_over_shards_page_by_page(
    two: Sharded,
) -> None:
    for i in range(5):
        for q in ("mail", "reports"):
            two.clock.advance(0.001)
            await two("POST", f"/v1/queues/{q}/jobs", {"name": "t.boom", "payload": i})
    for shard in (0, 1):
        await drain(two.shards.queue(shard), two.reg, two.config)
    assert [count(d, "d1queue_failed_jobs") for d in two.dbs] == [5, 5]
    seen: list[dict[str, Any]] = []
    cursor = ""
    while True:
        r = await two("GET", f"/v1/failed?limit=3{cursor}")
        assert r.status == 200
        seen += r.body["jobs"]
        if r.body["next_cursor"] is None:
            break
        cursor = f"&cursor={r.body['next_cursor']}"
    keys = [(j["failed_at"], j["id"]) for j in seen]
    assert len(keys) == 10 and keys == sorted(keys, reverse=True)
    assert {shard_of_id(j["id"]) for j in seen} == {0, 1}
    # Retry goes to the failed job's shard, and the job comes back there.
    target = next(j for j in seen if j["id"].startswith("s1-"))
    r = await two("POST", f"/v1/failed/{target['id']}/retry")
    assert r.status == 200 and target["id"] in ids(two.dbs[1])
    other = next(j for j in seen if j["id"] != target["id"])
    assert (await two("DELETE", f"/v1/failed/{other['id']}")).status == 200
    two.clock.advance(1)
    assert (await two("DELETE", "/v1/failed?older_than_s=0")).body == {"deleted": 8}


async def test_a_handler_dispatch_routes_to_the_queues_shard(two: Sharded) -> None:
    await two("POST", "/v1/jobs", {"name": "t.fanout"})  # registered on mail: shard 0
    assert two.counts() == [1, 0]
    report = await drain(two.shards.queue(0), two.reg, two.config)
    assert report.completed == 1
    (follow_up,) = ids(two.dbs[1])  # reports lives on shard 1
    assert follow_up.startswith("s1-") and two.counts() == [0, 1]
    # A library push of an id naming a shard this set lacks is refused.
    job = two.shards.home
    with pytest.raises(ShardError, match="names shard 4"):
        from d1queue.core.job import QueuedJob

        await job.push(QueuedJob(name="t.echo", id=f"s4-{new_id()}"))


# -- the cron --------------------------------------------------------------------


async def test_the_cron_drains_every_shard_in_turn_on_shares_of_the_budget(
    three: Sharded,
) -> None:
    for q in ("mail", "reports", "q", "emails"):
        for i in range(3):
            await three("POST", f"/v1/queues/{q}/jobs", {"name": "t.echo", "payload": [q, i]})
    assert three.counts() == [3, 3, 6]  # emails is pinned to shard 2, with q
    given: list[tuple[int, int, int]] = []

    async def run_drain(queue: ShardQueue, c: Config) -> Any:
        given.append((queue.shard, c.budget, c.job_cap))
        return await drain(queue, three.reg, c)

    now = (three.clock() // 180_000 * 3 + 4) * 60_000  # a minute that is 1 mod 3: from shard 1
    runs = await cron(
        three.shards,
        three.reg,
        three.config,
        now=now,
        grace_ms=0,
        due_limit=10,
        run_drain=run_drain,
    )
    assert [r.shard for r in runs] == [1, 2, 0]
    # Free plan: 45 subrequests and 5 jobs for the run, in shares that add up.
    assert given[0][1] == 15 and [g[2] for g in given] == [2, 2, 1]
    assert sum(r.drained.claimed for r in runs) == 5 and len(three.runs) == 5
    assert all(r.drained.subrequests <= r.budget for r in runs)
    spent = sum(r.drained.subrequests for r in runs) + sum(r.schedules.queries for r in runs[1:])
    assert spent <= three.config.budget == 45
    total = combine([r.drained for r in runs])
    assert total.claimed == 5 and total.stopped == "max_jobs"
    assert sum(r.schedules.queries for r in runs) <= 3 * 2


async def test_an_idle_shard_leaves_its_share_to_the_next(two: Sharded) -> None:
    for i in range(10):
        await two("POST", "/v1/queues/reports/jobs", {"name": "t.echo", "payload": i})
    assert two.counts() == [0, 10]
    given: dict[int, tuple[int, int]] = {}

    async def run_drain(queue: ShardQueue, c: Config) -> Any:
        given[queue.shard] = (c.budget, c.job_cap)
        return await drain(queue, two.reg, c)

    now = (two.clock() // 120_000 * 2) * 60_000  # an even minute: shard 0 first
    runs = await cron(
        two.shards, two.reg, two.config, now=now, grace_ms=0, due_limit=10, run_drain=run_drain
    )
    assert [r.shard for r in runs] == [0, 1]
    assert runs[0].drained.claimed == 0 and given[0] == (23, 3)
    # Shard 1: its 22 and 2, plus what shard 0 left (23 less its queries; 3 jobs).
    spent = runs[0].drained.subrequests
    assert given[1] == (22 + 23 - spent - runs[1].schedules.queries, 5)
    assert runs[1].drained.claimed == 5 and two.counts() == [0, 5]


async def test_one_shard_cron_is_the_one_database_cron(db: SqliteD1, clock: Clock) -> None:
    queue = D1Queue(db, clock=clock)
    reg = registry()
    for i in range(3):
        await queue.dispatch("t.echo", i)
    seen: list[Config] = []

    async def run_drain(q: ShardQueue, c: Config) -> Any:
        seen.append(c)
        return await drain(q, reg, c)

    config = Config()
    runs = await cron(
        ShardSet.of(queue),
        reg,
        config,
        now=clock(),
        grace_ms=0,
        due_limit=10,
        run_drain=run_drain,
    )
    assert seen == [config] and runs[0].drained.completed == 3


# -- schedules -----------------------------------------------------------------------


async def test_a_schedule_lives_on_its_queues_shard_and_runs_there_once(
    three: Sharded,
) -> None:
    three.reg.schedule("tick-emails", "* * * * *", "t.echo", payload={"s": "e"}, queue="emails")
    three.reg.schedule("tick-mail", "* * * * *", "t.echo", payload={"s": "m"}, queue="mail")
    r = await three(
        "POST",
        "/v1/schedules",
        {"id": "api-q", "cron": "* * * * *", "name": "t.echo", "queue": "q"},
    )
    assert r.status == 201

    def stored(d: SqliteD1) -> list[str]:
        return [str(x["id"]) for x in d.query("SELECT id FROM d1queue_schedules ORDER BY id")]

    assert [stored(d) for d in three.dbs] == [[], [], ["api-q"]]

    async def minute(m: int) -> None:
        now = (three.clock() // 60_000 + m) * 60_000
        await cron(
            three.shards,
            three.reg,
            three.config,
            now=now,
            grace_ms=120_000,
            due_limit=10,
            run_drain=lambda q, c: _nothing(),
        )

    await minute(0)  # syncs the code-declared schedules, each on its shard
    assert [stored(d) for d in three.dbs] == [["tick-mail"], [], ["api-q", "tick-emails"]]
    three.clock.advance(61)
    for _ in range(2):  # the same minute twice (a retried or overlapping run): once
        await minute(0)
    on = [[str(x["queue"]) for x in d.query("SELECT queue FROM d1queue_jobs")] for d in three.dbs]
    assert sorted(on[0]) == ["mail"] and on[1] == [] and sorted(on[2]) == ["emails", "q"]
    assert all(i.startswith("s2-") for i in ids(three.dbs[2]))
    # Pages merge over shards by id; a replace moving the queue moves the schedule.
    r = await three("GET", "/v1/schedules?limit=2")
    assert [s["id"] for s in r.body["schedules"]] == ["api-q", "tick-emails"]
    r = await three("GET", f"/v1/schedules?limit=2&cursor={r.body['next_cursor']}")
    assert [s["id"] for s in r.body["schedules"]] == ["tick-mail"]
    assert r.body["next_cursor"] is None
    r = await three(
        "POST",
        "/v1/schedules",
        {"id": "api-q", "cron": "* * * * *", "name": "t.echo", "queue": "mail"},
    )
    assert r.status == 200 and r.body["created"] is False
    assert [stored(d) for d in three.dbs] == [["api-q", "tick-mail"], [], ["tick-emails"]]
    assert (await three("POST", "/v1/schedules/api-q/pause")).body["paused"] is True
    assert (await three("GET", "/v1/schedules/tick-emails")).status == 200
    assert (await three("DELETE", "/v1/schedules/api-q")).status == 200
    assert (await three("DELETE", "/v1/schedules/tick-emails")).status == 409


async def _nothing() -> Any:
    from d1queue.features.drain import DrainReport

    return DrainReport(stopped="empty")


# -- wake-ups ---------------------------------------------------------------------


class Producer:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def send(self, body: Any) -> None:
        self.messages.append(body)

    async def sendBatch(self, messages: list[Any]) -> None:
        self.messages += [m["body"] for m in messages]


def test_a_wake_message_names_a_shard_this_worker_has() -> None:
    assert parse_wake(wake_body("mail", 1), 2) == (1, "mail")
    assert parse_wake(wake_body("mail", 2), 2) is None
    assert parse_wake({"shard": -1, "queue": "mail"}, 2) is None
    assert parse_wake({"shard": "1", "queue": "mail"}, 2) is None


async def test_the_consumer_drains_the_shard_a_message_names(two: Sharded) -> None:
    for q in ("mail", "reports"):
        for i in range(4):
            await two("POST", f"/v1/queues/{q}/jobs", {"name": "t.echo", "payload": [q, i]})
    drained_on: list[int] = []

    async def run_drain(queue: ShardQueue, c: Config) -> Any:
        drained_on.append(queue.shard)
        return await drain(queue, two.reg, c)

    config = Config(shards=("DB", "DB_1"), plan="paid", max_jobs=2, wake="queues", wake_per_jobs=1)
    producer = Producer()
    report, drained = await consume(
        two.shards,
        config,
        [wake_body("reports", 1), wake_body("reports", 1)],
        run_drain=run_drain,
        waker=Waker(producer),
    )
    assert drained_on == [1] and report.shards == {1: ["reports"]}
    assert drained is not None and drained.claimed == 2 and two.counts() == [4, 2]
    # The follow-ups name the shard the work is left on.
    assert producer.messages == [wake_body("reports", 1, hop=1)] * 2
    # A batch naming both shards drains each, on shares of the job cap.
    drained_on.clear()
    report, drained = await consume(
        two.shards,
        config,
        [wake_body("mail", 0), wake_body("reports", 1)],
        run_drain=run_drain,
        waker=None,
    )
    assert drained_on == [0, 1] and drained is not None and drained.claimed == 2


async def test_a_wake_up_gives_an_idle_shards_share_to_the_next_as_the_cron_does(
    two: Sharded,
) -> None:
    """One rule splits a budget over shards (core.shards.Shares): a
    wake-up naming both shards drains them in turn, each on its share plus
    what the one before left unspent, as the cron does."""
    for i in range(6):
        await two("POST", "/v1/queues/reports/jobs", {"name": "t.echo", "payload": i})
    given: dict[int, tuple[int, int]] = {}
    spent: dict[int, tuple[int, int]] = {}

    async def run_drain(queue: ShardQueue, c: Config) -> Any:
        given[queue.shard] = (c.budget, c.job_cap)
        report = await drain(queue, two.reg, c)
        spent[queue.shard] = (report.subrequests, report.claimed)
        return report

    config = Config(shards=("DB", "DB_1"), plan="paid", max_jobs=8, wake="queues")
    await consume(
        two.shards,
        config,
        [wake_body("mail", 0), wake_body("reports", 1)],
        run_drain=run_drain,
        waker=None,
    )
    shares = Shares.of(config.budget - FOLLOW_UP_RESERVE * 2, consumer_jobs(config), 2)
    assert given[0] == (shares.queries[0], shares.jobs[0])
    assert spent[0][1] == 0, "shard 0's queue is empty"
    assert given[1] == (
        shares.queries[1] + shares.queries[0] - spent[0][0],
        shares.jobs[1] + shares.jobs[0],
    )
    assert two.counts() == [0, 0]


def test_shares_carry_what_a_turn_left_unspent() -> None:
    shares = Shares.of(10, 5, 3)
    assert (shares.queries, shares.jobs) == ([4, 3, 3], [2, 2, 1])
    assert shares.turn(0) == (4, 2)
    shares.used(4, 2, 1, 0)
    assert shares.turn(1, spent=2) == (3 + 3 - 2, 2 + 2)
    shares.used(4, 4, 9, 9)  # overspent: nothing carries, never less than nothing
    assert shares.turn(2) == (3, 1)


# -- the dashboard ---------------------------------------------------------------------


async def test_the_dashboards_pages_and_counters_add_up_over_shards(two: Sharded) -> None:
    for i in range(60):
        two.clock.advance(0.001)
        await two("POST", "/v1/queues/hot/jobs", {"name": "t.echo", "partition": f"p{i}"})
    store = Store(two.service.queue, two.shards)
    got: list[str] = []
    page = await store.queue_jobs("hot")
    got += [r["id"] for r in page.rows]
    assert len(page.rows) == 50 and page.next_cursor
    page = await store.queue_jobs("hot", cursor=page.next_cursor)
    got += [r["id"] for r in page.rows]
    assert len(got) == len(set(got)) == 60 and page.next_cursor is None
    assert {shard_of_id(i) for i in got} == {0, 1}
    for shard in (0, 1):
        await drain(two.shards.queue(shard), two.reg, two.config.__class__(plan="paid"))
    chart, done = await store.counters(two.clock())
    assert sum(m.completed for m in chart) == 60 and done["hot"].hour == 60


# -- the sharded config and the API's document ---------------------------------------


def test_the_sharded_config_lists_every_database_and_is_a_valid_config() -> None:
    import tomllib

    from tools.shard_config import bindings, shards_toml

    from .conftest import ROOT

    text = shards_toml((ROOT / "wrangler.toml").read_text(), 3, wake=True)
    config = tomllib.loads(text)
    assert [d["binding"] for d in config["d1_databases"]] == ["DB", "DB_1", "DB_2"]
    assert len({d["database_id"] for d in config["d1_databases"]}) == 3
    assert {d.get("migrations_dir") for d in config["d1_databases"]} == {None}, "migrations/"
    parsed = Config.from_vars(config["vars"])
    assert parsed.shards == ("DB", "DB_1", "DB_2") and parsed.wake == "queues"
    assert bindings(ROOT / "wrangler.toml") == ["DB"]


def test_the_document_states_the_partition_and_the_id_shape_from_bounds() -> None:
    from d1queue.core.bounds import ID_RULE

    job = SPEC["components"]["schemas"]["Job"]["properties"]["partition"]
    assert job["maxLength"] == MAX_PARTITION and job["minLength"] == 1
    op = SPEC["paths"]["/v1/jobs/{id}"]
    (param,) = op["parameters"]
    assert param["schema"]["pattern"] == f"^{ID_RULE}$"
    assert "400" in op["get"]["responses"] and "400" in op["delete"]["responses"]


async def test_the_dashboard_shows_and_acts_on_every_shard(two: Sharded) -> None:
    from d1queue.interfaces.dashboard import Dashboard

    from .test_dashboard import TOKEN as BOARD_TOKEN
    from .test_dashboard import Browser

    browser = Browser(Dashboard(two.service, BOARD_TOKEN), two.clock)
    await browser.sign_in()
    failed = []
    for q in ("mail", "reports"):
        for i in range(2):
            r = await two("POST", f"/v1/queues/{q}/jobs", {"name": "t.boom", "payload": i})
            failed.append(r.body["id"])
    for shard in (0, 1):
        await drain(two.shards.queue(shard), two.reg, two.config)
    body = (await browser.get("/ui/failed")).body
    assert all(f'value="{i}"' in body for i in failed)
    job = (await browser.get(f"/ui/jobs/{failed[-1]}")).body
    assert failed[-1] in job and "reports" in job
    await browser.get("/ui/failed")
    form = {"csrf": browser.csrf(), "action": "retry", "ids": failed, "confirm": "yes"}
    reply = await browser.post("/ui/failed/bulk", form)
    assert reply.headers["location"].endswith("notice=retried&n=4")
    assert two.counts() == [2, 2], "each failed job back on its own shard"
    overview = (await browser.get("/ui")).body
    assert "mail" in overview and "reports" in overview
    copied = browser.cookie
    await browser.post("/ui/signout", {"csrf": browser.csrf()})
    signouts = [d.query("SELECT COUNT(*) AS n FROM d1queue_signouts")[0]["n"] for d in two.dbs]
    assert signouts == [1, 0], "sign-outs live on the home shard"
    browser.cookie = copied
    assert (await browser.get("/ui")).status == 303


@pytest.mark.parametrize(
    ("pages", "reverse", "expected"),
    [
        # Rows interleaved across shards come out in the list's order.
        ([([1, 4], False), ([2, 3], False)], False, ([1, 2, 3], True)),
        ([([4, 1], False), ([3, 2], False)], True, ([4, 3, 2], True)),
        # Together no more than the limit, and no shard has more: the end.
        ([([1], False), ([2, 3], False)], False, ([1, 2, 3], False)),
        # One shard has more, though the merged rows fit: the list goes on.
        ([([1], True), ([], False)], False, ([1], True)),
        ([], False, ([], False)),
    ],
)
def test_merge_pages_keeps_the_list_order_and_says_whether_it_goes_on(
    pages: list[tuple[list[int], bool]], reverse: bool, expected: tuple[list[int], bool]
) -> None:
    assert merge_pages(pages, lambda n: n, 3, reverse) == expected
