"""Analytics Engine (features/analytics.py): a drain writes one data point
per (queue, name, outcome) it settled, with the count and the sum and
maximum of wait and run; never more than the invocation's 250 points, a
re-sent settle counted once, a job another worker took over not at all, and
a binding that throws costs the drain nothing."""

from __future__ import annotations

from typing import Any

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.metrics import OTHER, POINT_BLOBS, POINT_DOUBLES, Tally
from d1queue.features.analytics import ANALYTICS_POINTS, Points
from d1queue.interfaces.testing import SqliteD1
from d1queue.store import sql

from .contract import Clock
from .test_metrics import registry


class Dataset:
    """An Analytics Engine binding that checks each point as the platform's
    limits say (20 blobs, 20 doubles, 1 index of at most 96 bytes)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.points: list[dict[str, Any]] = []
        self.fail_after = fail_after

    def write(self, point: dict[str, Any]) -> None:
        if self.fail_after is not None and len(self.points) >= self.fail_after:
            raise RuntimeError("analytics engine unavailable")
        assert len(point["blobs"]) <= 20 and len(point["doubles"]) <= 20
        assert len(point["indexes"]) == 1 and len(point["indexes"][0].encode()) <= 96
        assert all(isinstance(d, float) for d in point["doubles"])
        self.points.append(point)

    def by_key(self) -> dict[tuple[str, ...], dict[str, float]]:
        return {
            tuple(p["blobs"]): dict(zip(POINT_DOUBLES, p["doubles"], strict=True))
            for p in self.points
        }


async def test_a_drain_writes_one_point_per_queue_name_and_outcome(
    db: SqliteD1, clock: Clock
) -> None:
    queue = D1Queue(db, clock=clock)
    for i in range(40):
        await queue.dispatch("ok", 0.2 if i < 39 else 3)
    await queue.dispatch("again", None, queue="mail")
    await queue.dispatch("bad", None, queue="mail")
    clock.advance(2)  # every job waits 2 s before it starts
    dataset = Dataset()
    points = Points(dataset.write)
    report = await drain(
        queue, registry(clock), Config(max_jobs=100, queues=("default", "mail")), points=points
    )
    assert (report.completed, report.retried, report.failed) == (40, 1, 1)
    assert report.data_points == 3 == points.written
    assert points.left == ANALYTICS_POINTS - 3
    assert POINT_BLOBS == ("queue", "name", "outcome")
    got = dataset.by_key()
    assert set(got) == {
        ("default", "ok", "completed"),
        ("mail", "again", "retried"),
        ("mail", "bad", "failed"),
    }
    ok = got[("default", "ok", "completed")]
    assert ok["jobs"] == 40
    assert ok["run_ms_max"] == 3000 and ok["run_ms_sum"] == pytest.approx(39 * 200 + 3000)
    assert ok["wait_ms_max"] >= 2000 and ok["wait_ms_sum"] >= 40 * 2000
    assert [p["indexes"] for p in dataset.points if p["blobs"][0] == "mail"] == [["mail"]] * 2


async def test_without_a_binding_nothing_is_tallied(db: SqliteD1, clock: Clock) -> None:
    queue = D1Queue(db, clock=clock)
    await queue.dispatch("ok")
    report = await drain(queue, registry(clock), Config())
    assert report.completed == 1 and report.data_points == 0


@pytest.mark.parametrize("lost", [sql.DELETE_HELD_BATCH_PLAIN, sql.RETRY, sql.FAIL_RECORD])
async def test_a_settle_resent_after_a_lost_reply_counts_once(
    db: SqliteD1, clock: Clock, lost: str
) -> None:
    queue = D1Queue(db, clock=clock)
    for _ in range(3):
        await queue.dispatch("ok")
    await queue.dispatch("again")
    await queue.dispatch("bad")
    db.lose_reply_when(lost)  # the batch commits, its reply is lost: sent again
    dataset = Dataset()
    report = await drain(queue, registry(clock), Config(max_jobs=100), points=Points(dataset.write))
    assert report.resent >= 1
    assert {k: v["jobs"] for k, v in dataset.by_key().items()} == {
        ("default", "ok", "completed"): 3,
        ("default", "again", "retried"): 1,
        ("default", "bad", "failed"): 1,
    }


async def test_an_outcome_d1_refused_is_not_counted(db: SqliteD1, clock: Clock) -> None:
    queue = D1Queue(db, clock=clock)
    await queue.dispatch("ok")
    db.fail_when(lambda s: s.lstrip().startswith("DELETE FROM d1queue_jobs"), times=None)
    dataset = Dataset()
    report = await drain(queue, registry(clock), Config(max_jobs=100), points=Points(dataset.write))
    assert report.unsettled and report.completed == 0
    assert dataset.points == []


async def test_an_invocations_points_are_shared_by_its_drains_and_capped(
    db: SqliteD1, clock: Clock
) -> None:
    reg = Registry()
    names = [f"job.n{i:03d}" for i in range(300)]
    for name in names:
        reg.job(name)(_noop)
    queue = D1Queue(db, clock=clock)
    for name in names:
        await queue.dispatch(name)
    dataset = Dataset()
    points = Points(dataset.write)
    report = await drain(queue, reg, Config(max_jobs=1000, batch_size=100), points=points)
    assert report.completed == 300
    # 300 keys, 250 points: 249 kept, the rest folded into one point.
    assert report.data_points == ANALYTICS_POINTS == len(dataset.points)
    assert sum(v["jobs"] for v in dataset.by_key().values()) == 300
    assert dataset.by_key()[(OTHER, OTHER, "completed")]["jobs"] == 51
    # The invocation has no point left: a second drain writes none.
    await queue.dispatch(names[0])
    again = await drain(queue, reg, Config(), points=points)
    assert again.completed == 1 and again.data_points == 0
    assert len(dataset.points) == ANALYTICS_POINTS


async def _noop(payload: Any) -> None:
    return None


async def test_a_binding_that_throws_costs_the_drain_nothing(db: SqliteD1, clock: Clock) -> None:
    queue = D1Queue(db, clock=clock)
    await queue.dispatch("ok")
    await queue.dispatch("bad")
    dataset = Dataset(fail_after=1)
    points = Points(dataset.write)
    report = await drain(queue, registry(clock), Config(), points=points)
    assert (report.completed, report.failed) == (1, 1)
    assert report.data_points == 1 and points.lost == 1
    assert await queue.size("default") == 0


def test_the_tally_folds_by_outcome_and_never_counts_a_job_twice() -> None:
    tally = Tally()
    for i in range(10):
        tally.add("q", f"n{i}", "completed", 5, 10 + i)
        tally.add("q", f"n{i}", "failed", 1, 1)
    tally.add("q", "n0", "completed", 7, 100)
    every = sum(p["doubles"][0] for p in tally.points(1000))
    for room in (1, 2, 4, 5, 6, 19, 20, 21):
        pts = tally.points(room)
        assert len(pts) <= room
        assert sum(p["doubles"][0] for p in pts) <= every
        if room >= 4 + 1:  # room for the folded points: every job counted
            assert sum(p["doubles"][0] for p in pts) == every == 21
    top = tally.points(1000)[0]
    assert top["blobs"] == ["q", "n0", "completed"]
    assert top["doubles"] == [2.0, 12.0, 7.0, 110.0, 100.0]
    assert tally.points(0) == []
