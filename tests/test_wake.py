"""Wake-ups through Cloudflare Queues (d1queue/features/wake.py), on SqliteD1: the
settings, the shipped opt-in wrangler.toml block, what a batch asks for, the
capped count of due jobs, and a consumer's fan-out. Miniflare's real Queues
are in tests/runtime/test_wake_runtime.py.

The producer here is `Producer`, a list with the binding's two methods
(send, sendBatch) and a switch to make sends fail: what the Waker is handed
is only ever called, so this checks what d1queue sends, not Queues."""

from __future__ import annotations

import tomllib
from collections import Counter
from typing import Any

import pytest
from tools.wake_config import wake_toml

from d1queue import Config, ConfigError, D1Queue, Registry, drain
from d1queue.core.limits import Meter
from d1queue.features.wake import (
    FOLLOW_UP_RESERVE,
    WAKE_BINDING,
    Waker,
    consume,
    follow_ups,
    hop_of,
    parse_wake,
    plan,
    wake_body,
)
from d1queue.interfaces.testing import SqliteD1
from d1queue.store.inspection import due as count_due
from d1queue.store.maintenance import take_fan_out

from .conftest import ROOT, Clock


class Producer:
    """The producer binding's surface: what was sent, and failures on demand."""

    def __init__(self, fail: bool = False) -> None:
        self.messages: list[Any] = []
        self.calls = 0
        self.fail = fail

    async def send(self, body: Any) -> None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("Queue send failed")
        self.messages.append(body)

    async def sendBatch(self, messages: list[dict[str, Any]]) -> None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("Queue send failed")
        self.messages.extend(m["body"] for m in messages)


def test_wake_settings_default_off_and_are_validated() -> None:
    assert (Config().wake, Config().wake_per_jobs, Config().wake_max) == ("off", 100, 16)
    c = Config.from_vars(
        {"D1QUEUE_WAKE": "queues", "D1QUEUE_WAKE_PER_JOBS": "5", "D1QUEUE_WAKE_MAX": "3"}
    )
    assert (c.wake, c.wake_per_jobs, c.wake_max) == ("queues", 5, 3)
    for var, value in [
        ("D1QUEUE_WAKE", "on"),
        ("D1QUEUE_WAKE_PER_JOBS", "0"),
        ("D1QUEUE_WAKE_MAX", "101"),  # sendBatch carries at most 100
        ("D1QUEUE_WAKE_MAX", "x"),
    ]:
        with pytest.raises(ConfigError, match=var):
            Config.from_vars({var: value})
    with pytest.raises(ConfigError, match="unknown setting D1QUEUE_WAKEUP"):
        Config.from_vars({"D1QUEUE_WAKEUP": "queues"})


def test_the_shipped_wrangler_toml_is_off_and_its_wake_block_turns_it_on() -> None:
    text = (ROOT / "wrangler.toml").read_text()
    shipped = tomllib.loads(text)
    assert "queues" not in shipped, "off unless turned on: deploys without a queue"
    assert Config.from_vars(shipped["vars"]).wake == "off"
    on = tomllib.loads(wake_toml(text))
    assert Config.from_vars(on["vars"]).wake == "queues"
    (producer,) = on["queues"]["producers"]
    (consumer,) = on["queues"]["consumers"]
    assert producer["binding"] == WAKE_BINDING
    assert consumer["queue"] == producer["queue"], "the Worker consumes its own wake-ups"
    assert 1 <= consumer["max_batch_size"] <= 100
    assert 0 <= consumer["max_batch_timeout"] <= 60
    assert 1 <= consumer["max_concurrency"] <= 250
    # Nothing else changes.
    assert {k: v for k, v in on.items() if k != "queues"} == {
        **shipped,
        "vars": {**shipped["vars"], "D1QUEUE_WAKE": "queues"},
    }


def test_a_batch_folds_duplicates_and_skips_what_is_not_for_it() -> None:
    config = Config(queues=("mail", "default"))
    bodies = [
        wake_body("mail"),
        wake_body("default"),
        wake_body("mail"),  # delivered twice (at least once): one drain
        {"shard": 1, "queue": "mail"},  # another shard
        {"queue": "x y"},
        "not an object",
        wake_body("reports"),  # not in D1QUEUE_QUEUES
    ]
    report = plan(bodies, config)
    assert report.queues == ["mail", "default"]
    assert report.ignored == 3
    assert report.not_drained == ["reports"]
    assert parse_wake({"shard": True, "queue": "mail"}) is None


@pytest.mark.parametrize(
    ("due", "expected"), [(0, 0), (1, 1), (100, 1), (101, 2), (1600, 16), (10**6, 16)]
)
def test_fan_out_is_one_wake_per_n_due_jobs_up_to_the_ceiling(due: int, expected: int) -> None:
    assert follow_ups(due, 100, 16) == expected


async def test_due_counts_claimable_jobs_only_and_stops_at_the_cap(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    for i in range(12):
        await queue.dispatch("count", i, queue="q")
    await queue.dispatch("count", "later", queue="q", delay_s=60)
    await queue.dispatch("count", "elsewhere", queue="other")
    assert len(await queue.reserve_batch("q", 1)) == 1  # held: not due
    assert await count_due(queue, "q", 100) == 11
    assert await count_due(queue, "q", 5) == 5
    clock.advance(61)
    assert await count_due(queue, "q", 100) == 12
    # Bounded reads: the capped count does not read the whole backlog.
    for i in range(300):
        await queue.dispatch("count", i, queue="deep")
    before = queue.binding.usage.rows_read
    assert await count_due(queue, "deep", 10) == 10
    assert queue.binding.usage.rows_read - before <= 2 * 10 + 2


def counting(runs: Counter[Any]) -> Registry:
    reg = Registry()

    @reg.job("count")
    async def count(payload: Any) -> None:
        runs[payload] += 1

    return reg


async def test_a_consumer_left_with_work_wakes_one_more_per_n_due_jobs(
    queue: D1Queue, clock: Clock
) -> None:
    runs: Counter[Any] = Counter()
    reg = counting(runs)
    for i in range(30):
        await queue.dispatch("count", i, queue="q")
    config = Config(plan="paid", max_jobs=5, wake="queues", wake_per_jobs=4, wake_max=3)
    producer = Producer()
    meter = Meter(50)

    async def run_drain(q: D1Queue, c: Config) -> Any:
        assert c.queues == ("q",)
        assert c.budget == config.budget - FOLLOW_UP_RESERVE
        return await drain(queue, reg, c, meter=meter)

    report, drained = await consume(
        queue,
        config,
        [wake_body("q"), wake_body("q")],
        run_drain=run_drain,
        waker=Waker(producer, meter),
    )
    assert drained is not None and drained.stopped == "max_jobs"
    assert sum(runs.values()) == 5
    # 25 due, one wake per 4, at most 3: three messages in one sendBatch.
    assert (report.follow_ups, producer.calls) == (3, 1)
    assert producer.messages == [wake_body("q", hop=1)] * 3
    assert not report.retry

    # An emptied queue sends nothing more.
    report, drained = await consume(
        queue,
        Config(plan="paid", wake="queues"),
        [wake_body("q")],
        run_drain=lambda q, c: drain(q, reg, c),
        waker=Waker(producer),
    )
    assert drained is not None and drained.stopped == "empty"
    assert report.follow_ups == 0 and producer.calls == 1
    assert runs == Counter(range(30))


async def test_a_consumer_woken_by_follow_ups_relays_one(queue: D1Queue) -> None:
    """Follow-ups only (hop >= 1): however many are due, one message carries
    the chain on, its hop one more than the least in the batch. A push's
    message in the same batch makes it fan out again."""
    runs: Counter[Any] = Counter()
    reg = counting(runs)
    for i in range(30):
        await queue.dispatch("count", i, queue="q")
    config = Config(plan="paid", max_jobs=5, wake="queues", wake_per_jobs=4, wake_max=3)
    producer = Producer()

    async def run_drain(q: D1Queue, c: Config) -> Any:
        return await drain(queue, reg, c)

    bodies = [wake_body("q", hop=3), wake_body("q", hop=2)]
    report, _ = await consume(queue, config, bodies, run_drain=run_drain, waker=Waker(producer))
    assert report.hops == {"0:q": 2}
    assert report.follow_ups == 1 and producer.messages == [wake_body("q", hop=3)]

    bodies = [wake_body("q", hop=2), wake_body("q")]
    report, _ = await consume(queue, config, bodies, run_drain=run_drain, waker=Waker(producer))
    assert report.hops == {"0:q": 0} and report.follow_ups == 3
    assert producer.messages[1:] == [wake_body("q", hop=1)] * 3
    assert hop_of({"hop": True}) == hop_of({"hop": -1}) == hop_of("x") == 0


@pytest.mark.parametrize("jobs", [40, 400])
async def test_fan_out_is_damped_consumers_never_multiply(
    queue: D1Queue, clock: Clock, jobs: int
) -> None:
    """One push of a backlog, then every message consumed in turn, one per
    consumer invocation (a list standing in for Cloudflare's queue). Each
    chain a fan-out starts carries on one message at a time, so the messages
    sent are about the consumers the backlog needs plus the fan-out's width;
    were every consumer to fan out, they would multiply by wake_max a
    generation (here 1 + 2 + 4 + ... past the backlog's end)."""
    runs: Counter[Any] = Counter()
    reg = counting(runs)
    for i in range(jobs):
        await queue.dispatch("count", i, queue="q")
    config = Config(plan="paid", max_jobs=5, wake="queues", wake_per_jobs=5, wake_max=4)
    producer = Producer()
    pending: list[Any] = [wake_body("q")]
    consumers = 0
    while pending:
        body = pending.pop(0)
        before = len(producer.messages)
        await consume(
            queue,
            config,
            [body],
            run_drain=lambda q, c: drain(q, reg, c),
            waker=Waker(producer),
        )
        pending += producer.messages[before:]
        consumers += 1
        assert consumers <= jobs, "the chains end once the queue is drained"
    assert runs == Counter(range(jobs)), "every job once"
    needed = -(-jobs // 5)
    assert consumers <= needed + config.wake_max + 1


async def test_one_fan_out_a_minute_however_many_pushes_wake_consumers(
    queue: D1Queue, db: SqliteD1, clock: Clock
) -> None:
    """40 pushes of 10 jobs, each push's message consumed on its own: only
    the first consumer takes the queue's fan-out lease (one row written); the
    other push-woken ones relay one message each, so the consumers stay
    about what the backlog needs. A minute later the lease can be taken
    again."""
    runs: Counter[Any] = Counter()
    reg = counting(runs)
    config = Config(plan="paid", max_jobs=5, wake="queues", wake_per_jobs=5, wake_max=4)
    producer = Producer()
    pending: list[Any] = []
    for p in range(40):
        for i in range(10):
            await queue.dispatch("count", p * 10 + i, queue="q")
        pending.append(wake_body("q"))
    consumers = fan_outs = 0
    while pending:
        before = len(producer.messages)
        report, _ = await consume(
            queue,
            config,
            [pending.pop(0)],
            run_drain=lambda q, c: drain(q, reg, c),
            waker=Waker(producer),
        )
        fan_outs += report.fan_outs
        pending += producer.messages[before:]
        consumers += 1
    assert sum(runs.values()) == 400 and set(runs.values()) == {1}
    assert fan_outs == 1
    assert consumers <= 400 // 5 + 40 + config.wake_max
    row = db.query("SELECT fanned_out_at FROM d1queue_queues WHERE name = 'q'")
    assert row == [{"fanned_out_at": clock()}]
    assert not await take_fan_out(queue, "q", 60), "taken: within the minute"
    clock.advance(61)
    assert await take_fan_out(queue, "q", 60), "free again a minute later"


async def test_a_failed_send_is_logged_and_never_raises(
    queue: D1Queue, caplog: pytest.LogCaptureFixture
) -> None:
    producer = Producer(fail=True)
    waker = Waker(producer, Meter(50))
    with caplog.at_level("INFO", logger="d1queue"):
        assert await waker.wake("q") == 0
    assert waker.failed == 1 and producer.messages == []
    assert any(r.getMessage() == "d1queue.wake" for r in caplog.records)
    # Past the invocation's subrequests: refused before it is sent.
    full = Meter(1)
    full.spend("d1")
    assert await Waker(Producer(), full).wake("q") == 0
