"""Analytics Engine in the real Worker (Pyodide, Miniflare's D1, the host's
dataset binding, which checks each point against the platform's limits and
counts them per invocation): a cron drain writes one data point per (queue,
name, outcome) it settled, with the counts and the wait and run figures, and
the invocation's line says how many it wrote. Counts are asserted, never
timings."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from ..doc_blocks import blocks_for
from .conftest import ROOT, Host, start_host


def analytics_config() -> str:
    """wrangler.toml with its Analytics Engine block turned on, as its
    comment tells an operator to do."""
    text = (ROOT / "wrangler.toml").read_text()
    block = re.search(r"^# \[\[analytics_engine_datasets\]\]\n(?:^# .*\n)+", text, re.M)
    assert block is not None, "wrangler.toml lost its Analytics Engine block"
    on = re.sub(r"^# ", "", block.group(0), flags=re.M)
    path = ROOT / "wrangler.analytics.toml"
    path.write_text(text.replace(block.group(0), on))
    return str(path)


@pytest.fixture(scope="module")
def ae_host() -> Iterator[Host]:
    h = start_host("--config", analytics_config())
    yield h
    h.stop()


def points(host: Host) -> list[dict[str, Any]]:
    reply = host.get("/__test/analytics")
    assert reply.status == 200, reply.text
    return list(reply.json())


def test_a_cron_drain_writes_one_point_per_queue_name_and_outcome(ae_host: Host) -> None:
    # The block wrangler.toml comments out, which the fixture turned on, is
    # the one docs/operations.md shows.
    (shown,) = blocks_for(
        "docs/operations.md",
        "tests/runtime/test_analytics_runtime.py::"
        "test_a_cron_drain_writes_one_point_per_queue_name_and_outcome",
    )
    assert shown in (ROOT / "wrangler.analytics.toml").read_text()
    assert "# " + shown.replace("\n", "\n# ").rstrip("# ") in (ROOT / "wrangler.toml").read_text()
    host = ae_host
    host.reset()
    before = len(points(host))
    for i in range(3):
        assert (
            host.api(
                "POST", "/v1/queues/default/jobs", {"name": "example.echo", "payload": {"i": i}}
            ).status
            == 201
        )
    assert (
        host.api(
            "POST", "/v1/queues/default/jobs", {"name": "example.add", "payload": {"a": "x"}}
        ).status
        == 201
    )
    since = len(host.output())
    host.scheduled()
    # The drain's line is printed when its invocation ends, with that
    # invocation's own line: a push's line may come after `since` first.
    host.wait_for_output('"d1queue.drain"', since)
    host.wait_for_output('"kind":"scheduled"', since)
    (report,) = host.events("d1queue.drain", since)
    assert (report["completed"], report["failed"]) == (3, 1)
    assert report["data_points"] == 2
    (line,) = [e for e in host.events("d1queue.invocation", since) if e["kind"] == "scheduled"]
    assert line["data_points"] == 2
    written = points(host)[before:]
    assert {p["dataset"] for p in written} == {"d1queue"}
    got = {tuple(p["blobs"]): p for p in written}
    assert set(got) == {
        ("default", "example.echo", "completed"),
        ("default", "example.add", "failed"),
    }
    echo = got[("default", "example.echo", "completed")]
    assert echo["indexes"] == ["default"] and echo["invocation"] == "scheduled"
    jobs, wait_sum, wait_max, run_sum, run_max = echo["doubles"]
    assert jobs == 3
    assert 0 <= wait_max <= wait_sum and 0 <= run_max <= run_sum
    assert got[("default", "example.add", "failed")]["doubles"][0] == 1


def test_without_the_binding_nothing_is_written(clean_host: Host) -> None:
    host = clean_host
    assert host.api("POST", "/v1/queues/default/jobs", {"name": "example.echo"}).status == 201
    since = len(host.output())
    host.scheduled()
    # The drain's line is printed when its invocation ends, with that
    # invocation's own line: a push's line may come after `since` first.
    host.wait_for_output('"d1queue.drain"', since)
    host.wait_for_output('"kind":"scheduled"', since)
    (report,) = host.events("d1queue.drain", since)
    assert report["completed"] == 1 and report["data_points"] == 0
    assert points(host) == []
