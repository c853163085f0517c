"""The drain's configuration, from the Worker's `[vars]`.

Every setting is a `D1QUEUE_*` var with a default that suits a per-minute
cron on the free plan. Values are validated when read, and an unknown
`D1QUEUE_*` name is an error: a typo must not silently fall back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from .bounds import MAX_OLDER_THAN_S, check_stored_name
from .costs import LEAST_ROUND, least_run
from .limits import PLANS
from .outbound import HostRules, Outbound, parse_services
from .shards import Routing, check, parse_shard_map, parse_shards

RETRY_RESERVE = 5
"""Subrequests of the plan's cap a drain leaves unplanned by default: room
for the re-sends of transient D1 errors and for what the invocation did
before the drain (the push that started a drain-on-push)."""

MAX_JOBS = {"free": 5, "paid": 100_000}
"""Jobs one run may claim, by plan, when D1QUEUE_MAX_JOBS is not set. The
free plan allows 10 ms of CPU per invocation and a Worker cannot measure its
own CPU, so the run is bounded by a count measured in the offline host:
see docs/performance.md, "How the job cap was chosen"."""


MIN_TOKEN_CHARS = 32
"""D1QUEUE_TOKEN's shortest length: 32 URL-safe characters carry 192 bits,
beyond guessing at any rate a Worker can answer."""

SCHEDULE_QUERIES = 2
"""D1 queries the cron's schedules cost on each shard, at most (schedules.py).
The failed-job prune rides in the first of them and adds none."""

KEEP_FAILED_S = 30 * 24 * 3600
"""D1QUEUE_KEEP_FAILED_S's default: 30 days (see Config.keep_failed_s)."""

KEEP_COMPLETED_S = 24 * 3600
"""D1QUEUE_KEEP_COMPLETED_S's default: 1 day (see Config.keep_completed_s)."""

PRUNE_COMPLETED = {"free": 100, "paid": 2_000}
"""Completed jobs past D1QUEUE_KEEP_COMPLETED_S one cron run deletes, by
plan, shared over the shards; older ones wait for later runs. At a
per-minute cron that is 144,000 a day on free (more than the 100,000 rows
written a day the free plan allows, so pruning keeps up with any load it
can run) and 2,880,000 on paid."""

PRUNE_FLOW = {"free": 100, "paid": 1_000}
"""Flow-control rows (d1queue_flow: a group's fair tag and rate window, a
queue's window) one cron run looks at, by plan, shared over the shards: the
next this many after where the last run stopped, in key order, round and
round the table. Of those it deletes the ones that hold nothing any more
(store/sql.py PRUNE_FLOW), so a table of groups named from user data
shrinks back to the groups in use. A run reads about 2 rows a row it looks
at (its key in the cursor's walk, the row) and 5 to 7 a row it deletes,
nothing but 2 with the table empty; it writes the rows it deletes and,
while the table holds more than this, one row saying where it stopped. At
a per-minute cron that looks at 144,000 rows a day on free (more groups
than its 100,000 rows written a day can make) and 1,440,000 on paid."""

PRUNE_METRICS = {"free": 100, "paid": 1_000}
"""Job-metrics rows past their retention (minute rows after 3 hours, hour
rows after 30 days; core/metrics.py) one cron run deletes, of each shape,
by plan, shared over the shards; more wait for the next run. A (queue,
name) that runs jobs every minute leaves 60 minute rows an hour to prune,
so 100 a run keeps up with 100 such pairs on free. The prune and the
hourly rollup ride in the schedules' read batch: rows, never a query."""

PRUNE_FAILED = {"free": 10, "paid": 1_000}
"""Failed jobs past D1QUEUE_KEEP_FAILED_S one cron run deletes, by plan,
shared over the shards like due schedules; older ones wait for later runs.
A bound on rows written, which a backlog of old failures would otherwise
spend at once: D1's free plan allows 100,000 rows written a day per account
and refuses every query past them, and 10 a minute is at most 14,400 a day,
as many as a free plan can fail (a failed job costs ~7 rows written). Paid:
up to 1,440,000 a day at a per-minute cron. Either way the DELETE, which
shares a transaction with the schedules' read, stays a bounded walk of the
failed_at index rather than one as long as the backlog."""


ALL_QUEUES = "*"
"""In D1QUEUE_QUEUES, as the last entry (or alone): every queue not listed."""


ANALYTICS_BINDING = "D1QUEUE_ANALYTICS"
"""The Workers Analytics Engine binding d1queue writes to when the Worker
has one (wrangler.toml [[analytics_engine_datasets]]; features/analytics.py)."""


class ConfigError(ValueError):
    """A `D1QUEUE_*` var is unknown or has an invalid value."""


SECRETS = ("D1QUEUE_TOKEN", "D1QUEUE_READONLY_TOKEN")
"""The secrets sharing the `D1QUEUE_` prefix: not drain settings, and never
quoted in an error (a mistake in one names the secret, not its value)."""

NOT_SETTINGS = (*SECRETS, ANALYTICS_BINDING)
"""Env names with the D1QUEUE_ prefix that are a secret or a binding, not a
drain setting: never refused as unknown."""


def token_problem(token: Any, name: str = "D1QUEUE_TOKEN") -> str | None:
    """Why a token secret (`name`'s value, None when unset) cannot guard
    the Worker, or None when it can or is unset: a short token is refused
    outright, and nobody counts as signed in with it."""
    if token is not None and len(str(token)) < MIN_TOKEN_CHARS:
        return (
            f"{name} must be at least {MIN_TOKEN_CHARS} characters (it guards "
            "every queue and the dashboard); make one with: python3 -c "
            "'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return None


def readonly_token_problem(token: Any, readonly: Any) -> str | None:
    """Why D1QUEUE_READONLY_TOKEN (None when unset) cannot be used beside
    D1QUEUE_TOKEN (`token`): too short, set without the API token, or the
    same value (which would make every holder of the API token read-only,
    or every read-only holder an admin)."""
    if readonly is None:
        return None
    problem = token_problem(readonly, "D1QUEUE_READONLY_TOKEN")
    if problem is not None:
        return problem
    if token is None:
        return (
            "D1QUEUE_READONLY_TOKEN is set without D1QUEUE_TOKEN: set the API token too "
            "(the read-only token signs in beside it)"
        )
    if str(token) == str(readonly):
        return "D1QUEUE_READONLY_TOKEN must differ from D1QUEUE_TOKEN"
    return None


@dataclass(frozen=True)
class Config:
    plan: Literal["free", "paid"] = "free"
    """D1QUEUE_PLAN: the Workers plan, whose per-invocation caps the drain
    keeps inside: subrequests (free 50; paid 10,000 with 1,000 D1 queries)
    and CPU (free 10 ms; paid 30 s). Sets the defaults of query_budget and
    max_jobs."""
    queues: tuple[str, ...] = (ALL_QUEUES,)
    """D1QUEUE_QUEUES: comma-separated queues to drain. It may end with `*`,
    "every other queue holding jobs"; `*` alone (the default) drains every
    queue. Anything else that is not a queue name is an error (see
    `drains`). Each round of a drain offers every queue an equal share of
    its batch, listed queues first, then the rest by name."""
    time_budget_s: float = 20.0
    """D1QUEUE_TIME_BUDGET_S: stop claiming new batches after this long. A
    per-minute cron may run about 30 s; the rest is left for settling."""
    query_budget: int | None = None
    """D1QUEUE_QUERY_BUDGET: subrequests one drain may spend: its own D1
    queries and the subrequests its handlers declare, stopping before the cap
    so no batch is claimed that cannot be settled. Default: the plan's cap
    less RETRY_RESERVE (free 45, paid 995)."""
    batch_counts_as: Literal["query", "statements"] = "query"
    """D1QUEUE_BATCH_COUNTS_AS: whether a db.batch costs one query of the
    budget or one per statement. D1 does not document which its cap counts;
    "statements" is the safe reading, "query" drains ~10x more per run."""
    batch_size: int = 25
    """D1QUEUE_BATCH_SIZE: jobs claimed per round (one SELECT + one batch)."""
    concurrency: int = 10
    """D1QUEUE_CONCURRENCY: handlers running at once (D1 calls in flight are
    capped at 6 separately, the platform's connection limit)."""
    reservation_s: float | None = None
    """D1QUEUE_RESERVATION_S: a claim's lease; must cover the longest handler
    timeout. A round claims only as many jobs as can wait for a slot, run and
    be settled inside it. Default: the D1Queue's own (90 s unless made
    otherwise); set, it applies to every claim the drain makes."""
    drain_on_push: bool = False
    """D1QUEUE_DRAIN_ON_PUSH: start a short drain after a push (API issue)."""
    stats: bool = True
    """D1QUEUE_STATS: record each run's completed, retried and failed counts
    in the per-minute counters the dashboard draws (d1queue_stats): one
    extra D1 query and at most one row written per run that settled a job,
    budgeted like the rest."""
    metrics: bool = True
    """D1QUEUE_METRICS (on/off): count each settled job into the job metrics
    per queue and name (GET /v1/metrics; store/metrics.py), inside the
    settle batch that goes to D1 anyway: no extra query, a row per (queue,
    name) for the totals and one for the minute per round. off: no
    statement, no row."""
    keep_failed_s: int = KEEP_FAILED_S
    """D1QUEUE_KEEP_FAILED_S: each cron run deletes failed jobs older than
    this many seconds, at most PRUNE_FAILED a run, oldest first; 0 keeps
    them until deleted by hand (DELETE /v1/failed). Default 30 days: a
    failed job's row is the only copy of its payload and error, so it must
    outlive a weekend or a two-week holiday with room to notice and retry
    (Sidekiq keeps dead jobs 6 months, BullMQ until removed; Oban's
    pruner drops discarded jobs after 60 s, which leaves nothing to retry
    on Monday). The table then holds failures a day x 30 x row size, against
    D1's 10 GB (paid) or 500 MB (free) per database: 1,000 failures a day
    of 10 KiB is 300 MB. Lower it for large payloads or many failures."""
    keep_completed_s: int = KEEP_COMPLETED_S
    """D1QUEUE_KEEP_COMPLETED_S: a completed job (its payload and result) is
    kept this many seconds, then each cron run deletes those past it, at
    most PRUNE_COMPLETED a run, oldest first; 0 keeps none (a job is deleted
    as it completes, as a queue that opts out with `registry.history(queue,
    keep=False)` does). Default 1 day: long enough for a dependent pushed
    later that day to name a job (`after`), for a batch's callbacks to read
    results and for someone to look on the dashboard, and short enough for
    D1's 10 GB: a job kept costs its row (~300 bytes plus payload and
    result), so 1,000,000 jobs a day of 1 KiB each hold about 1 GB, a tenth
    of a database. Oban's pruner keeps 60 s by default, BullMQ keeps
    everything until removed; raise it for audit trails, lower it (or opt
    queues out) for large results at high volume."""
    max_jobs: int | None = None
    """D1QUEUE_MAX_JOBS: jobs one run may claim, the bound on its CPU time.
    Default by plan (MAX_JOBS)."""
    job_logs: Literal["notable", "all", "off"] = "notable"
    """D1QUEUE_JOB_LOGS: which runs log their own `d1queue.process` line
    (core/telemetry.py). "notable": a run that failed, retried, was found
    taken by another worker or left unsettled, and any run of a job pushed
    with a traceparent; "all": every run (a JSON line a job costs CPU: about
    as much again as the job's own share of a drain, docs/performance.md);
    "off": none. The drain's summary line counts every run either way."""
    wake: Literal["off", "queues"] = "off"
    """D1QUEUE_WAKE: "queues" sends a Cloudflare Queues message after each
    push (binding WAKE, see docs/operations.md, "Wake-ups"), whose consumer drains the
    queue at once; "off" leaves draining to the cron (and drain-on-push).
    D1 stays the source of truth either way: a lost or duplicated message
    costs latency, never a job."""
    wake_per_jobs: int = 100
    """D1QUEUE_WAKE_PER_JOBS: a consumer that stopped on a budget with work
    left sends one more wake message per this many due jobs..."""
    wake_max: int = 16
    """D1QUEUE_WAKE_MAX: ...and at most this many (the fan-out ceiling; keep
    the consumer's max_concurrency at or below it)."""

    shards: tuple[str, ...] = ("DB",)
    """D1QUEUE_SHARDS: the D1 bindings jobs are spread over, comma-separated;
    shard i is the i-th (docs/operations.md, "Shards"). Grow the list at its end only:
    job ids name shards by position. One shard (DB) is the default."""
    shard_map: tuple[tuple[str, int], ...] = ()
    """D1QUEUE_SHARD_MAP: queues pinned to shards, `queue=shard,...` (e.g.
    `emails=1,reports=2`); any other queue goes by a stable hash of its
    name, or of a job's `partition` when it gives one (shards.py)."""

    http_allow: HostRules = field(default_factory=HostRules)
    """D1QUEUE_HTTP_ALLOW: the hosts a job's HTTP requests may reach
    (`http.request`, and any handler's `ctx.fetch`), comma-separated rules:
    `public` (the default: any host that is not loopback, private,
    link-local or `localhost`), those four kinds by name, `*`, host names,
    `*.domain`, addresses and networks (outbound.HostRules). Each redirect
    hop is checked too. `make dev` adds `loopback`."""
    http_services: frozenset[str] = frozenset()
    """D1QUEUE_HTTP_SERVICES: the service bindings a job may send requests
    through, comma-separated binding names; none unless listed."""

    prefix: str = ""
    """D1QUEUE_PREFIX: the path d1queue's HTTP API and dashboard are mounted
    under in a Worker of one's own (`/queue`: /queue/v1/..., /queue/ui); ""
    (the default) is the root. A `prefix=` given in the Worker's code must
    agree with it. The offline host prints its links under it."""

    def __post_init__(self) -> None:
        if self.plan not in PLANS:
            raise ConfigError(f"D1QUEUE_PLAN must be one of {', '.join(PLANS)}")
        plan = PLANS[self.plan]
        # Frozen: the plan's defaults are filled in once, here.
        if self.query_budget is None:
            object.__setattr__(self, "query_budget", plan.d1_queries - RETRY_RESERVE)
        if self.max_jobs is None:
            object.__setattr__(self, "max_jobs", MAX_JOBS[self.plan])
        if not self.queues:
            raise ConfigError("D1QUEUE_QUEUES names no queue")
        for i, q in enumerate(self.queues):
            if q == ALL_QUEUES and i == len(self.queues) - 1:
                continue
            if q == ALL_QUEUES:
                raise ConfigError(f'D1QUEUE_QUEUES: "{ALL_QUEUES}" (the rest) may only come last')
            try:
                check_stored_name("queue", q)
            except ValueError as exc:
                raise ConfigError(f"D1QUEUE_QUEUES: {exc}") from None
        repeated = sorted({q for q in self.queues if self.queues.count(q) > 1})
        if repeated:
            raise ConfigError(f"D1QUEUE_QUEUES names {', '.join(repeated)} more than once")
        checks = [
            (self.time_budget_s > 0, "D1QUEUE_TIME_BUDGET_S must be > 0"),
            (
                self.budget >= least_run(self.stats_reserve),
                f"D1QUEUE_QUERY_BUDGET must be >= {least_run(self.stats_reserve)}"
                + (f" ({LEAST_ROUND} for a round, 1 for the run's counters)" if self.stats else ""),
            ),
            (
                self.budget <= plan.d1_queries,
                f"D1QUEUE_QUERY_BUDGET must be <= {plan.d1_queries} "
                f"(the {plan.name} plan's cap; D1QUEUE_PLAN sets the plan)",
            ),
            (self.job_cap >= 1, "D1QUEUE_MAX_JOBS must be >= 1"),
            (
                0 <= self.keep_failed_s <= MAX_OLDER_THAN_S,
                f"D1QUEUE_KEEP_FAILED_S must be 0 (keep forever) to {MAX_OLDER_THAN_S} seconds",
            ),
            (
                0 <= self.keep_completed_s <= MAX_OLDER_THAN_S,
                f"D1QUEUE_KEEP_COMPLETED_S must be 0 (keep none) to {MAX_OLDER_THAN_S} seconds",
            ),
            (1 <= self.batch_size <= 100, "D1QUEUE_BATCH_SIZE must be 1..100"),
            (1 <= self.concurrency <= 100, "D1QUEUE_CONCURRENCY must be 1..100"),
            (
                self.reservation_s is None or self.reservation_s > 0,
                "D1QUEUE_RESERVATION_S must be > 0",
            ),
            (self.wake in ("off", "queues"), "D1QUEUE_WAKE must be 'off' or 'queues'"),
            (
                self.job_logs in ("notable", "all", "off"),
                "D1QUEUE_JOB_LOGS must be 'notable', 'all' or 'off'",
            ),
            (1 <= self.wake_per_jobs <= 100_000, "D1QUEUE_WAKE_PER_JOBS must be 1..100000"),
            # sendBatch takes at most 100 messages (Queues limits).
            (1 <= self.wake_max <= 100, "D1QUEUE_WAKE_MAX must be 1..100"),
            (
                self.batch_counts_as in ("query", "statements"),
                "D1QUEUE_BATCH_COUNTS_AS must be 'query' or 'statements'",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        problem = check(self.shards, self.shard_map)
        if problem:
            raise ConfigError(problem)
        for queue, _ in self.shard_map:
            try:
                check_stored_name("queue", queue)
            except ValueError as exc:
                raise ConfigError(f"D1QUEUE_SHARD_MAP: {exc}") from None

    def drains(self, queue: str) -> bool:
        """Whether a drain on this configuration runs `queue`'s jobs: it is
        listed, or the list ends with "*" (every queue not listed). A push
        to a queue this says False for is told so: its jobs would wait for
        ever."""
        return queue in self.queues or self.queues[-1] == ALL_QUEUES

    def check_shares(self) -> None:
        """The cron drains every shard in one invocation, each on its share
        of the budget (shardset.cron): each share must hold the shard's
        schedules and a round. Checked when the vars are read and by the
        cron, not on every `replace` (a drain-on-push's small budget drains
        one shard, not all)."""
        need = SCHEDULE_QUERIES + least_run(self.stats_reserve)
        if len(self.shards) > 1 and self.budget // len(self.shards) < need:
            raise ConfigError(
                f"D1QUEUE_QUERY_BUDGET ({self.budget}) gives each of the "
                f"{len(self.shards)} shards {self.budget // len(self.shards)} subrequests a "
                f"cron run; each needs at least {need} ({SCHEDULE_QUERIES} for schedules, "
                f"{LEAST_ROUND} for a round"
                + (", 1 for the counters" if self.stats else "")
                + "): "
                'use fewer shards or a larger budget (D1QUEUE_PLAN = "paid")'
            )

    @property
    def routing(self) -> Routing:
        """Where jobs go across `shards` (shards.py)."""
        return Routing(len(self.shards), dict(self.shard_map))

    @property
    def listed_queues(self) -> tuple[str, ...]:
        """The queues named explicitly, in order, without a trailing "*"."""
        return tuple(q for q in self.queues if q != ALL_QUEUES)

    @property
    def budget(self) -> int:
        """query_budget, resolved (never None after construction)."""
        assert self.query_budget is not None
        return self.query_budget

    @property
    def stats_reserve(self) -> int:
        """Subrequests a drain keeps back for recording its counters."""
        return 1 if self.stats else 0

    @property
    def prune_failed(self) -> int:
        """Failed jobs one cron run may prune over all shards (0: off)."""
        return PRUNE_FAILED[self.plan] if self.keep_failed_s else 0

    @property
    def prune_completed(self) -> int:
        """Completed jobs one cron run may prune over all shards."""
        return PRUNE_COMPLETED[self.plan]

    @property
    def prune_flow(self) -> int:
        """Flow-control rows one cron run may look at over all shards."""
        return PRUNE_FLOW[self.plan]

    @property
    def prune_metrics(self) -> int:
        """Job-metrics rows of each shape one cron run may prune over all
        shards (0: metrics off, and the cron neither rolls up nor prunes)."""
        return PRUNE_METRICS[self.plan] if self.metrics else 0

    @property
    def job_cap(self) -> int:
        """max_jobs, resolved."""
        assert self.max_jobs is not None
        return self.max_jobs

    @classmethod
    def from_vars(cls, env: Mapping[str, Any]) -> Config:
        """Build from the Worker's vars (only `D1QUEUE_*` names are read)."""
        known = {f"D1QUEUE_{f.name.upper()}": f for f in fields(cls)}
        unknown = sorted(k for k in env if k.startswith("D1QUEUE_") and k not in known)
        # Secrets and bindings share the prefix but are not drain settings.
        unknown = [k for k in unknown if k not in NOT_SETTINGS]
        if unknown:
            raise ConfigError(
                f"unknown setting {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        for var, f in known.items():
            if var not in env:
                continue
            raw = str(env[var]).strip()
            try:
                values[f.name] = _parse(f.name, raw)
            except ValueError as exc:
                why = f": {exc}" if f.name.startswith("http_") else ""
                raise ConfigError(f"{var}={raw!r} is not a valid value{why}") from None
        problem = token_problem(env.get("D1QUEUE_TOKEN")) or readonly_token_problem(
            env.get("D1QUEUE_TOKEN"), env.get("D1QUEUE_READONLY_TOKEN")
        )
        if problem is not None:
            raise ConfigError(problem)
        config = cls(**values)
        config.check_shares()
        return config

    @property
    def outbound(self) -> Outbound:
        """What jobs may reach over HTTP (outbound.py)."""
        return Outbound(self.http_allow, self.http_services)


def mount_prefix(prefix: str) -> str:
    """`prefix` as d1queue mounts under it: "" (the root) or "/a/b", with no
    trailing slash. Anything else (no leading slash, a query, a fragment, an
    empty or dot segment) is a ValueError: the Worker's author's mistake."""
    cut = prefix.rstrip("/")
    if not cut:
        return ""
    segments = cut.split("/")
    if (
        not cut.startswith("/")
        or any(c in cut for c in "?#\\ %")
        or any(s in ("", ".", "..") for s in segments[1:])
    ):
        raise ValueError(
            f"a d1queue prefix is a path such as '/queue' (segments, no query): {prefix!r}"
        )
    return cut


def resolve_prefix(code: str | None, var: Any) -> tuple[str, str | None]:
    """Where d1queue is mounted, from the `prefix=` the Worker's code gives
    (None: none) and its D1QUEUE_PREFIX var (None: unset), and the
    operator's mistake when there is one: the var not a path, or not the
    code's prefix (two truths would put the links under one and the routes
    under the other). On a mistake the prefix is the code's, else the root."""
    fallback = "" if code is None else mount_prefix(code)
    try:
        mounted = None if var is None else mount_prefix(str(var).strip())
    except ValueError as exc:
        return fallback, f"D1QUEUE_PREFIX={str(var)!r}: {exc}"
    if code is None:
        return mounted or "", None
    if mounted is not None and mounted != fallback:
        return fallback, (
            f"the Worker's code mounts d1queue at prefix={fallback!r} but "
            f"D1QUEUE_PREFIX is {mounted!r}: make them agree, or drop one"
        )
    return fallback, None


def _parse(name: str, raw: str) -> Any:
    if name == "prefix":
        return mount_prefix(raw)
    if name == "http_allow":
        return HostRules.parse(raw)
    if name == "http_services":
        return parse_services(raw)
    if name == "shards":
        return parse_shards(raw)
    if name == "shard_map":
        return parse_shard_map(raw)
    if name == "queues":
        return tuple(q.strip() for q in raw.split(",") if q.strip())
    if name in (
        "query_budget",
        "batch_size",
        "concurrency",
        "max_jobs",
        "wake_per_jobs",
        "wake_max",
        "keep_failed_s",
        "keep_completed_s",
    ):
        return int(raw)
    if name in ("time_budget_s", "reservation_s"):
        value = float(raw)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(raw)
        return value
    if name in ("drain_on_push", "stats", "metrics"):
        allowed = ("true", "false", "1", "0") + (("on", "off") if name == "metrics" else ())
        if raw.lower() not in allowed:
            raise ValueError(raw)
        return raw.lower() in ("true", "1", "on")
    return raw
