"""Flow control in the real Worker (Pyodide running the upload, Miniflare's
D1, Cloudflare's limits: the offline host), counted from OUTSIDE the Worker.

Every job is an `http.request` whose target is the Recorder below, an HTTP
server in this test process on 127.0.0.1: it holds each request open a while
(what the job's payload asks, 0.3 to 1 s) and counts, under one lock, the
requests in flight in all, per group and per job, at the instant each one
arrives. A request is counted done just before its answer is written, so
before its handler can return and its job be settled (which frees its
place): a place taken again is taken after the count dropped, and any
overlap the recorder counts did happen at the target. Only what the target
saw is asserted: no timing of the Worker's own, no elapsed duration.

- Overlapping drains under D1 faults: a queue limited to `concurrency` 3 and
  `group_concurrency` 1 over 4 groups, drained by cycles of 8 cron runs fired
  at once (threads on the host's scheduled trigger) with Queues consumers
  woken alongside (3 wake messages a cycle on the host's 3 consumer lanes),
  each drain claiming at most MAX_JOBS, while 10% of the Worker's D1 calls
  fail: lost before they reach D1, lost after they committed (their replies
  never arrive) and "overloaded". At no moment more than 3 requests in
  flight at the target, nor more than 1 per group, nor 2 of one job; every
  job delivered.
- A host killed (SIGKILL) while a handler holds a request: its claims keep
  their places until their leases lapse (a new host on the same D1 state
  runs none of the held groups' jobs, and none at all if the dead host held
  all 3 places), then, the leases lapsed, the new host finishes everything,
  the limits holding throughout, across both hosts.
- Rates: `rate` 2 per 2 s on one queue and `group_rate` 1 per 2 s on
  another (3 groups), under the same D1 faults: no window of 2 s holds more
  handler starts at the target than the limit, per queue and per group.

Duplicates allowed: a job runs again only after a lease lapse, never while
its first run is in flight (the per-job count at the target never passes 1).
A lease lapses here when its host died holding it, when a drain reports the
job's outcome `unsettled` (D1 refused the settle every time), or when a job
stays held past STRANDED_S with no request of it at the target (a claim
whose undo failed too, an invocation cut): each such cause allows one more
run of that job, and no other re-run is allowed.

Leases are lapsed by aging them, as test_chaos_runtime does (this Worker's
leases last over a minute, too long to wait in CI), and only leases no live
drain holds.
Aging moves the job's held key (its lease end) to a past time, which is
what waiting would have made of it: the job, lapsed, keeps its places until
a drain claims it again and runs it in them.

Rates need wall-clock waiting; they are kept small (about 10 s). A rate
counts a start at the database's time as its claim's batch runs (a batch
re-sent after a fault counts when it commits), and holds on handler starts
as long as a reply takes less than RATE_GUARD_MS (core/flow.py).
"""

from __future__ import annotations

import json
import random
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tools.wake_config import write as write_wake_config

from .conftest import ROOT, Host, start_host
from .test_chaos_runtime import events, scheduled, table_counts

DRAINS = 8
"""Cron runs fired at once, a cycle."""
WAKES = 3
"""Wake messages sent each cycle: as many consumers at once as the host has
lanes (--consumer-lanes)."""
FAULT_RATE = "0.1"
LATENCY_MS = "20"
SEED = 20270314
GROUPS = ("a", "b", "c", "d")
CONCURRENCY = 3
GROUP_CONCURRENCY = 1
LIMITS = {
    "concurrency": CONCURRENCY,
    "group_concurrency": GROUP_CONCURRENCY,
    "rate": None,
    "group_rate": None,
}
HOLD_S = (0.3, 1.0)
"""How long the target holds each request, drawn per job."""
STRANDED_S = 10.0
"""A job held this long with no request of it at the target is held by no
live handler (a handler starts within a round of its claim and holds the
target at most HOLD_S[1]): its lease may be aged."""
MAX_ATTEMPTS = 20
"""Enough that the faults' lapsed leases never fail a job for its attempts."""
PUT_TRIES = 12
MAX_JOBS = 4
"""Jobs one drain may claim (D1QUEUE_MAX_JOBS): a drain that keeps its places
(its settle and its next claims go in one batch) would otherwise run the
whole queue alone while the others find it at its limit; with a small cap
drains end and others take their places, and claims of several drains
overlap."""


# -- the outside recorder ---------------------------------------------------------------


@dataclass
class Run:
    """One request at the target: a handler's run of job `i`."""

    queue: str
    group: str
    i: int
    start: float
    hold_s: float
    end: float | None = None


class Recorder(ThreadingHTTPServer):
    """The jobs' target. Counts what is in flight at each arrival, under one
    lock: the maxima per queue in all, in any one group and of any one job."""

    daemon_threads = True
    request_queue_size = 128  # a broken limit must show as overlap, not as refused connections

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Target)
        self.lock = threading.Lock()
        self.runs: list[Run] = []
        self.in_flight: Counter[str] = Counter()
        self.in_group: Counter[tuple[str, str]] = Counter()
        self.of_job: Counter[tuple[str, int]] = Counter()
        self.most: Counter[str] = Counter()
        self.most_in_a_group: Counter[str] = Counter()
        self.most_of_a_job: Counter[str] = Counter()
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, queue: str, group: str, i: int) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/run/{queue}/{group}/{i}"

    def arrive(self, queue: str, group: str, i: int, hold_s: float) -> Run:
        with self.lock:
            run = Run(queue, group, i, time.monotonic(), hold_s)
            self.runs.append(run)
            self.in_flight[queue] += 1
            self.in_group[queue, group] += 1
            self.of_job[queue, i] += 1
            self.most[queue] = max(self.most[queue], self.in_flight[queue])
            self.most_in_a_group[queue] = max(
                self.most_in_a_group[queue], self.in_group[queue, group]
            )
            self.most_of_a_job[queue] = max(self.most_of_a_job[queue], self.of_job[queue, i])
            return run

    def leave(self, run: Run) -> None:
        with self.lock:
            run.end = time.monotonic()
            self.in_flight[run.queue] -= 1
            self.in_group[run.queue, run.group] -= 1
            self.of_job[run.queue, run.i] -= 1

    def of(self, queue: str) -> list[Run]:
        with self.lock:
            return [r for r in self.runs if r.queue == queue]

    def open(self, queue: str) -> list[Run]:
        return [r for r in self.of(queue) if r.end is None]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Target(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        _, _, queue, group, i = self.path.split("/")
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        assert (body["queue"], body["group"], body["i"]) == (queue, group, int(i)), body
        run = self.server.arrive(queue, group, int(i), float(body["hold_s"]))
        try:
            time.sleep(run.hold_s)
        finally:
            self.server.leave(run)  # before the answer: before the job can be settled
        try:
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        except OSError:
            pass  # the host was killed: nobody reads the answer

    def log_message(self, *args: Any) -> None:
        pass


# -- the Worker's side ------------------------------------------------------------------


def hook(host: Host, source: str, **values: Any) -> Any:
    """host.python of `source` (its `main(env)`), `values` given to it as
    the global VALUES (a JSON round trip). The hook meets no injected D1
    fault: it is how the test looks at and arranges the database."""
    head = f"import json\nVALUES = json.loads({json.dumps(json.dumps(values))})\n"
    return host.python(head + textwrap.dedent(source))


def set_limits(host: Host, queue: str, limits: dict[str, Any]) -> str:
    """Store `queue`'s limits: PUT /v1/queues/{queue}/limits (re-sent while
    D1's faults answer 5xx), or where the API has no such route yet, the
    library's D1Queue.set_limits through the hook. Checks the row holds
    Limits.to_json() of them; returns which way they were set."""
    how = "PUT"
    for _ in range(PUT_TRIES):
        reply = host.api("PUT", f"/v1/queues/{queue}/limits", limits)
        if reply.status < 500:
            break
    if reply.status in (404, 405):
        how = "D1Queue.set_limits"
        hook(
            host,
            """
            from d1queue import D1Queue
            from d1queue.core.flow import Limits

            async def main(env):
                await D1Queue(env.DB).set_limits(VALUES["queue"], Limits.parse(VALUES["limits"]))
            """,
            queue=queue,
            limits=limits,
        )
    else:
        assert reply.status == 200, (reply.status, reply.text)
    stored = hook(
        host,
        """
        from d1queue.core.flow import Limits
        from d1queue.store.binding import Binding

        async def main(env):
            r = await Binding(env.DB).run(
                "SELECT limits FROM d1queue_queues WHERE name = ?1", VALUES["queue"])
            expected = Limits.parse(VALUES["limits"]).to_json()
            return [r.rows[0]["limits"] if r.rows else None, expected]
        """,
        queue=queue,
        limits=limits,
    )
    assert stored[0] == stored[1], f"stored {stored[0]!r}, Limits.to_json() is {stored[1]!r}"
    return how


def push_jobs(
    host: Host, recorder: Recorder, queue: str, jobs: list[tuple[int, str | None, float]]
) -> dict[int, str]:
    """Push `jobs` (i, group or None, hold_s) to `queue` as http.request jobs
    aimed at the recorder, in one batch through the library (the HTTP API
    takes no group); returns each i's job id."""
    made = [
        {
            "i": i,
            "group": group,
            "payload": {
                "url": recorder.url(queue, group or "-", i),
                "method": "POST",
                "body": {"queue": queue, "group": group or "-", "i": i, "hold_s": hold},
                "timeout_s": 30,
            },
        }
        for i, group, hold in jobs
    ]
    ids: list[str] = hook(
        host,
        """
        from d1queue import D1Queue

        async def main(env):
            q = D1Queue(env.DB)
            jobs = [
                q.new_job("http.request", j["payload"], queue=VALUES["queue"], group=j["group"],
                          max_attempts=VALUES["max_attempts"])
                for j in VALUES["jobs"]
            ]
            return [job_id for job_id, _ in await q.push_many(jobs)]
        """,
        queue=queue,
        jobs=made,
        max_attempts=MAX_ATTEMPTS,
    )
    assert len(set(ids)) == len(jobs)
    return {i: job_id for (i, _, _), job_id in zip(jobs, ids, strict=True)}


def held(host: Host, queue: str) -> list[dict[str, Any]]:
    """`queue`'s jobs held under a lease not yet over: id, group, claimed at."""
    rows: list[dict[str, Any]] = hook(
        host,
        """
        import time
        from d1queue.store.binding import Binding

        async def main(env):
            r = await Binding(env.DB).run(
                "SELECT id, grp, reserved_at FROM d1queue_jobs WHERE queue = ?1 "
                "AND reserved_at IS NOT NULL AND available_at > ?2",
                VALUES["queue"], int(time.time() * 1000))
            return r.rows
        """,
        queue=queue,
    )
    return rows


def lapse_leases(
    host: Host, queue: str, *, held_s: float = 0.0, spare: Iterable[str] = ()
) -> list[str]:
    """Lapse the leases of `queue`'s jobs claimed at least `held_s` ago (but
    those in `spare`), as waiting for their ends would: the held key's time
    (the lease's end) set to a moment just past. (A lapsed job keeps its
    places, and takes them back when a drain claims it again.) Call it only
    for leases no live drain holds. Returns the ids lapsed."""
    lapsed: list[str] = hook(
        host,
        """
        import time
        from d1queue.store.binding import Binding

        JOB = (
            "UPDATE d1queue_jobs SET available_at = ?1, locked_until = ?1 "
            "WHERE id = ?2 AND reservation = ?3 AND reserved_at IS NOT NULL"
        )

        async def main(env):
            b = Binding(env.DB)
            now = int(time.time() * 1000)
            rows = (await b.run(
                "SELECT id, reservation FROM d1queue_jobs WHERE queue = ?1 "
                "AND reserved_at IS NOT NULL AND reserved_at <= ?2",
                VALUES["queue"], now - int(VALUES["held_s"] * 1000))).rows
            out = []
            for r in rows:
                if r["id"] in VALUES["spare"]:
                    continue
                past = now - 1
                args = (past, r["id"], r["reservation"])
                (done,) = await b.batch([(JOB, args)])
                if done.changes == 1:
                    out.append(r["id"])
            return out
        """,
        queue=queue,
        held_s=held_s,
        spare=sorted(spare),
    )
    return lapsed


def wake(host: Host, queue: str, n: int) -> None:
    """n wake messages for `queue`, one send call each: with the host's
    lanes, n consumers at once."""
    hook(
        host,
        """
        async def main(env):
            for _ in range(VALUES["n"]):
                await env.WAKE.send({"shard": 0, "queue": VALUES["queue"]})
        """,
        queue=queue,
        n=n,
    )


def cycle(
    host: Host, answers: Counter[str], *, queue: str = "", wakes: int = 0, wake_first: bool = False
) -> None:
    """DRAINS cron runs at once (threads), `wakes` consumers woken with them
    (or just before: a wake-up reaches its consumer later than a cron run
    starts, so consumers would seldom be first to a free place)."""
    if wakes and wake_first:
        wake(host, queue, wakes)
    threads = [threading.Thread(target=scheduled, args=(host, answers)) for _ in range(DRAINS)]
    if wakes and not wake_first:
        threads.append(threading.Thread(target=wake, args=(host, queue, wakes)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass
class Drained:
    cycles: int
    lapsed: list[str]
    answers: Counter[str]


def drain_until_done(
    host: Host, recorder: Recorder, queue: str, ids: dict[int, str], *, wakes: int = 0
) -> Drained:
    """Cycles until `queue` holds no job (with `wakes`, every other cycle
    wakes its consumers first). A cycle that leaves the queue as it
    was with jobs held lapses the leases held past STRANDED_S whose job has
    no request at the target (their drains are done with them)."""
    answers: Counter[str] = Counter()
    lapsed: list[str] = []
    deadline = time.monotonic() + 150
    left = table_counts(host)
    cycles = 0
    while left["jobs"]:
        assert time.monotonic() < deadline, f"not drained: {left}, lapsed {lapsed}"
        cycle(host, answers, queue=queue, wakes=wakes, wake_first=cycles % 2 == 0)
        cycles += 1
        now = table_counts(host)
        if now == left and now["reserved"]:
            busy = {ids[r.i] for r in recorder.open(queue)}
            lapsed += lapse_leases(host, queue, held_s=STRANDED_S, spare=busy)
        left = now
    return Drained(cycles, lapsed, answers)


def grouped_jobs(n_per_group: int, seed: int) -> list[tuple[int, str | None, float]]:
    """n_per_group jobs per group, groups interleaved, each with its hold."""
    rng = random.Random(seed)
    return [
        (k * len(GROUPS) + g, group, round(rng.uniform(*HOLD_S), 3))
        for k in range(n_per_group)
        for g, group in enumerate(GROUPS)
    ]


def host_args(seed: int, *, faults: bool = True, wake_lanes: int = 0) -> tuple[str, ...]:
    wake_args: tuple[str, ...] = ()
    if wake_lanes:
        wake_args = ("--config", str(write_wake_config(ROOT)), "--consumer-lanes", str(wake_lanes))
    fault_args = ("--d1-fault", FAULT_RATE, "--d1-latency-ms", LATENCY_MS) if faults else ()
    return (
        *wake_args,
        "--plan",
        "paid",
        "--cpu",
        "warn",
        "--var",
        "D1QUEUE_PLAN=paid",
        "--var",
        f"D1QUEUE_MAX_JOBS={MAX_JOBS}",
        *fault_args,
        "--d1-seed",
        str(seed),
    )


def reports(lines: list[str]) -> list[dict[str, Any]]:
    return events(lines, "d1queue.drain")


def unsettled(lines: list[str]) -> Counter[str]:
    return Counter(j for r in reports(lines) for j in r.get("unsettled", ()))


def assert_limits_held(recorder: Recorder, queue: str) -> None:
    most = (recorder.most[queue], recorder.most_in_a_group[queue], recorder.most_of_a_job[queue])
    assert most[0] <= CONCURRENCY, f"{most[0]} requests in flight at once (limit {CONCURRENCY})"
    assert most[1] <= GROUP_CONCURRENCY, f"{most[1]} of one group at once"
    assert most[2] <= 1, "a job ran twice at once"


def assert_reruns_explained(
    recorder: Recorder, queue: str, ids: dict[int, str], allowed: Counter[str]
) -> Counter[int]:
    """Every job ran; a job ran more than once only as often as `allowed`
    (its lapsed leases, its unsettled outcomes). Returns the runs by i."""
    runs = Counter(r.i for r in recorder.of(queue))
    assert set(runs) == set(ids), f"never delivered: {sorted(set(ids) - set(runs))}"
    extra = {i: n - 1 for i, n in runs.items() if n - 1 > allowed[ids[i]]}
    assert extra == {}, f"re-runs with no lapsed lease to explain them: {extra}"
    return runs


# -- the tests --------------------------------------------------------------------------


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.stop()


def test_limits_hold_across_overlapping_drains_and_d1_faults(recorder: Recorder) -> None:
    queue = "flow"
    jobs = grouped_jobs(10, SEED)
    host = start_host(*host_args(SEED, wake_lanes=WAKES))
    try:
        how = set_limits(host, queue, LIMITS)
        ids = push_jobs(host, recorder, queue, jobs)
        since = len(host.output())
        done = drain_until_done(host, recorder, queue, ids, wakes=WAKES)
        end = table_counts(host)
        faults = host.faults()
        lines = host.output()[since:]
    finally:
        host.stop()

    found = reports(lines)
    crons = [r for r in found if r["trigger"].startswith("cron")]
    consumers = [r for r in found if r["trigger"].startswith("queue")]
    lost_settles = unsettled(lines)
    allowed = Counter(done.lapsed) + lost_settles
    runs = assert_reruns_explained(recorder, queue, ids, allowed)
    kinds = {k: faults[k] for k in ("lost_before", "lost_after", "overloaded")}
    print(
        f"\nflow runtime: {len(jobs)} jobs over {len(GROUPS)} groups, limits {LIMITS} "
        f"(set by {how}); {done.cycles} cycles of {DRAINS} cron runs + {WAKES} wake-ups: "
        f"{len(crons)} cron drains ({sum(r['claimed'] > 0 for r in crons)} of them claimed jobs), "
        f"{len(consumers)} consumer drains ({sum(r.get('claimed', 0) > 0 for r in consumers)} "
        f"of them), limited {sum(r.get('limited', 0) for r in found)}; D1 faults {kinds} "
        f"in {faults['calls']} calls; at the target: most in flight {recorder.most[queue]}, "
        f"in a group {recorder.most_in_a_group[queue]}, of a job "
        f"{recorder.most_of_a_job[queue]}; {sum(runs.values())} runs, re-runs "
        f"{sum(runs.values()) - len(runs)} (unsettled {sum(lost_settles.values())}, "
        f"leases lapsed {len(done.lapsed)}); cron answers {dict(done.answers)}"
    )
    assert_limits_held(recorder, queue)
    # Every job completed once: its row kept in the done band.
    assert end == {"jobs": 0, "reserved": 0, "failed": 0, "completed": len(jobs)}
    assert all(kinds.values()), f"the run met every kind of D1 fault: {kinds}"
    # The limits were in play, not merely never reached: the queue ran at its
    # concurrency, drains met it, and cron runs and consumers both claimed.
    assert recorder.most[queue] == CONCURRENCY
    assert sum(r.get("limited", 0) for r in found) > 0
    assert sum(r["claimed"] > 0 for r in crons) >= 2
    assert any(r.get("claimed", 0) > 0 for r in consumers), "a consumer drained too"


def test_a_killed_hosts_places_free_when_its_leases_lapse(
    tmp_path: Path, recorder: Recorder
) -> None:
    queue = "flow-kill"
    jobs = grouped_jobs(6, SEED + 1)
    state = tmp_path / "state"
    first = start_host(*host_args(SEED + 1), persist_to=state, own_group=True)
    stop = threading.Event()
    answers1: Counter[str] = Counter()
    try:
        set_limits(first, queue, LIMITS)
        ids = push_jobs(first, recorder, queue, jobs)
        since = len(first.output())

        def cycles() -> None:
            while not stop.is_set():
                cycle(first, answers1)

        driver = threading.Thread(target=cycles)
        driver.start()
        try:
            deadline = time.monotonic() + 60
            while True:  # some jobs done, and a request in flight for 0.1 s more at least
                assert time.monotonic() < deadline, "the drains made no progress"
                runs = recorder.of(queue)
                now = time.monotonic()
                busy = [r for r in runs if r.end is None and r.start + r.hold_s - now > 0.1]
                if sum(r.end is not None for r in runs) >= len(GROUPS) and busy:
                    break
                time.sleep(0.005)
            stop.set()  # no cycle after this one, which the kill cuts
            first.kill()
            killed_at = time.monotonic()
        finally:
            stop.set()
            driver.join()
        lines1 = first.output()[since:]
    finally:
        first.stop()
    # Mid-job: requests the dead host had open; no answer reached it, so
    # their jobs were not settled.
    cut = [r for r in recorder.of(queue) if r.start < killed_at and (r.end or 1e18) > killed_at]
    assert cut, "killed while a handler held a request"

    second = start_host(*host_args(SEED + 2), persist_to=state)
    try:
        # -- before the leases lapse: the dead host's places are still taken --
        holding = held(second, queue)
        held_ids = {r["id"] for r in holding}
        held_groups = {r["grp"] for r in holding}
        assert {ids[r.i] for r in cut} <= held_ids, "the cut jobs are still held"
        before = time.monotonic()
        answers2: Counter[str] = Counter()
        since2 = len(second.output())
        cycle(second, answers2)
        second.idle()
        early = [r for r in recorder.of(queue) if r.start >= before]
        blocked = [r for r in early if r.group in held_groups]
        assert blocked == [], f"ran a held group's job before its lease lapsed: {blocked}"
        if len(held_groups) >= CONCURRENCY:
            assert early == [], "the queue's places were all held by the dead host"
        # -- lapsed: its places free; everything finishes ---------------------
        lapsed_at_kill = lapse_leases(second, queue)
        assert held_ids <= set(lapsed_at_kill)
        done = drain_until_done(second, recorder, queue, ids)
        end = table_counts(second)
        lines2 = second.output()[since2:]
    finally:
        second.stop()

    lost_settles = unsettled(lines1) + unsettled(lines2)
    allowed = Counter(lapsed_at_kill) + Counter(done.lapsed) + lost_settles
    runs = assert_reruns_explained(recorder, queue, ids, allowed)
    after = [r for r in recorder.of(queue) if r.start > killed_at]
    print(
        f"\nflow runtime, killed host: {len(jobs)} jobs; killed with {len(cut)} requests in "
        f"flight (groups {sorted(r.group for r in cut)}), {len(holding)} jobs held "
        f"(groups {sorted(held_groups)}); the new host before the leases lapsed: "
        f"{len(early)} runs, none of a held group; after: {len(after) - len(early)} runs in "
        f"{done.cycles} cycles; runs {sum(runs.values())}, re-runs "
        f"{sum(runs.values()) - len(runs)}; at the target: most in flight "
        f"{recorder.most[queue]}, in a group {recorder.most_in_a_group[queue]}; cron answers "
        f"{dict(answers1)} then {dict(answers2 + done.answers)}"
    )
    assert_limits_held(recorder, queue)
    # Every job completed once: its row kept in the done band.
    assert end == {"jobs": 0, "reserved": 0, "failed": 0, "completed": len(jobs)}
    assert answers1["cut"] + answers1["refused"] >= 1, "the host was killed under a cron run"
    for r in cut:  # the cut runs ran again, after the kill
        assert any(x.i == r.i for x in after), f"job {r.i}, cut by the kill, never ran again"


def most_in_window(starts: Iterable[float], period_s: float) -> int:
    """The most of `starts` in any window [t, t + period_s)."""
    s = sorted(starts)
    most = j = 0
    for k, t in enumerate(s):
        while t - s[j] >= period_s:
            j += 1
        most = max(most, k - j + 1)
    return most


def test_rates_hold_on_handler_starts(recorder: Recorder) -> None:
    rated, group_rated = "flow-rate", "flow-group-rate"
    rate = {"limit": 2, "period_s": 2}
    group_rate = {"limit": 1, "period_s": 2}
    host = start_host(*host_args(SEED + 3, faults=True))
    try:
        set_limits(host, rated, {**LIMITS, "concurrency": None, "group_concurrency": None,
                                 "rate": rate})  # fmt: skip
        set_limits(host, group_rated, {**LIMITS, "concurrency": None, "group_concurrency": None,
                                       "group_rate": group_rate})  # fmt: skip
        push_jobs(host, recorder, rated, [(i, None, 0.05) for i in range(8)])
        groups = [(k * 3 + g, group, 0.05) for k in range(3) for g, group in enumerate("xyz")]
        push_jobs(host, recorder, group_rated, groups)
        answers: Counter[str] = Counter()
        deadline = time.monotonic() + 60
        while table_counts(host)["jobs"]:
            assert time.monotonic() < deadline, "not drained"
            cycle(host, answers)
            time.sleep(0.1)
        faults = host.faults()
    finally:
        host.stop()
    assert faults["lost_before"] + faults["lost_after"] + faults["overloaded"] > 0, faults

    queue_starts = [r.start for r in recorder.of(rated)]
    by_group: dict[str, list[float]] = {}
    for r in recorder.of(group_rated):
        by_group.setdefault(r.group, []).append(r.start)
    t0 = min(queue_starts)
    print(
        f"\nflow runtime, rates: {rated} {rate}: starts at "
        f"{[round(t - t0, 2) for t in sorted(queue_starts)]} s; {group_rated} {group_rate}: "
        + "; ".join(
            f"{g} at {[round(t - t0, 2) for t in sorted(ts)]}" for g, ts in sorted(by_group.items())
        )
        + f"; {sum(answers.values())} cron runs"
    )
    assert len(queue_starts) == 8 and sorted(r.i for r in recorder.of(rated)) == list(range(8))
    assert sorted(len(ts) for ts in by_group.values()) == [3, 3, 3]
    assert most_in_window(queue_starts, rate["period_s"]) <= rate["limit"]
    for g, ts in by_group.items():
        assert most_in_window(ts, group_rate["period_s"]) <= group_rate["limit"], g


def test_the_cron_prunes_the_rows_of_groups_that_hold_nothing(clean_host: Host) -> None:
    """Counted by Miniflare's D1: 30 groups pushed over HTTP, then their
    jobs deleted; one more group with a job waiting on a paused queue. One
    cron run deletes the 30 rows in its one read batch and logs the count;
    the group still holding a job keeps its row."""
    from .test_schedules_runtime import fire
    from .test_worker import wait_reports

    host = clean_host
    for i in range(30):
        reply = host.api(
            "POST", "/v1/queues/rt-prune/jobs", {"name": "example.echo", "group": f"u{i}"}
        )
        assert reply.status == 201, reply.text
    assert host.api("POST", "/v1/queues/rt-kept/pause").status == 200
    reply = host.api("POST", "/v1/queues/rt-kept/jobs", {"name": "example.echo", "group": "busy"})
    assert reply.status == 201, reply.text
    assert host.api("DELETE", "/v1/queues/rt-prune/jobs").json()["deleted"] == 30

    def rows() -> list[list[str]]:
        return host.python(
            """
            async def main(env):
                found = await env.DB.prepare(
                    "SELECT queue, grp FROM d1queue_flow ORDER BY queue, grp"
                ).all()
                return [[r.queue, r.grp] for r in found.results]
            """
        )

    assert len(rows()) == 31
    since = len(host.output())
    fire(host, int(time.time() * 1000) + 1000)
    (report,) = wait_reports(host, since, 1)
    schedules = report["schedules"]
    assert not schedules["error"], schedules
    assert (schedules["pruned_flow"], schedules["queries"]) == (30, 1), schedules
    # A row deleted is a row written (no index on the table), and the
    # cursor's row is made with the table's first rows.
    assert schedules["rows_written"] == 30 + 1, schedules
    # The schedules' own reads (about 25), then about 7 a row pruned (the
    # cursor's walk, its queue's stored limits, the heads of its queue's
    # grouped bands, the row deleted): 255 measured before the job metrics,
    # 298 with their rollup and prune in the same batch (METRICS_CRON_READ).
    assert schedules["rows_read"] <= 30 + 8 * 31 + 30, schedules
    assert rows() == [["rt-kept", "busy"]]
    print("flow prune:", schedules)
