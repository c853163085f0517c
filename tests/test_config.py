"""Configuration from the Worker's vars: defaults, validation, typos."""

from __future__ import annotations

import tomllib

import pytest

from d1queue import Config, ConfigError
from d1queue.core.config import mount_prefix, resolve_prefix

from .conftest import ROOT


def test_the_shipped_wrangler_vars_are_valid_and_complete() -> None:
    wrangler = tomllib.loads((ROOT / "wrangler.toml").read_text())
    config = Config.from_vars(wrangler["vars"])
    assert config == Config(), "wrangler.toml shows the defaults"
    assert wrangler["main"] == "src/entry.py"
    assert "python_workers" in wrangler["compatibility_flags"]
    (d1,) = wrangler["d1_databases"]
    assert (d1["binding"], d1["database_name"]) == ("DB", "d1queue")
    assert "migrations_dir" not in d1, "wrangler finds migrations/ by itself"
    assert wrangler["triggers"]["crons"] == ["* * * * *"]


def test_values_are_parsed() -> None:
    c = Config.from_vars(
        {
            "D1QUEUE_QUEUES": "mail, default ,reports",
            "D1QUEUE_PLAN": "paid",
            "D1QUEUE_QUERY_BUDGET": "900",
            "D1QUEUE_MAX_JOBS": "250",
            "D1QUEUE_TIME_BUDGET_S": "25.5",
            "D1QUEUE_DRAIN_ON_PUSH": "true",
            "D1QUEUE_TOKEN": "a secret, not a setting, 32 chars or more",
            "OTHER": "ignored",
        }
    )
    assert c.queues == ("mail", "default", "reports")
    assert (c.query_budget, c.time_budget_s, c.drain_on_push) == (900, 25.5, True)
    assert (c.plan, c.max_jobs) == ("paid", 250)


def test_the_plan_sets_the_budgets_it_allows() -> None:
    free, paid = Config(), Config(plan="paid")
    assert (free.query_budget, free.max_jobs) == (45, 5), "50 subrequests, 10 ms of CPU"
    assert (paid.query_budget, paid.max_jobs) == (995, 100_000), "1,000 D1 queries"
    assert Config(plan="paid", query_budget=1000).query_budget == 1000


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"D1QUEUE_QUEUE": "default"}, "unknown setting D1QUEUE_QUEUE"),
        ({"D1QUEUE_QUERY_BUDGET": "lots"}, "not a valid value"),
        ({"D1QUEUE_QUERY_BUDGET": "51"}, "<= 50 \\(the free plan's cap"),
        ({"D1QUEUE_QUERY_BUDGET": "1001", "D1QUEUE_PLAN": "paid"}, "<= 1000"),
        ({"D1QUEUE_PLAN": "pro"}, "D1QUEUE_PLAN must be one of free, paid"),
        ({"D1QUEUE_MAX_JOBS": "0"}, "D1QUEUE_MAX_JOBS must be >= 1"),
        ({"D1QUEUE_BATCH_SIZE": "0"}, "1..100"),
        ({"D1QUEUE_TIME_BUDGET_S": "nan"}, "not a valid value"),
        ({"D1QUEUE_RESERVATION_S": "0"}, "must be > 0"),
        ({"D1QUEUE_QUEUES": "a b"}, "D1QUEUE_QUEUES"),
        ({"D1QUEUE_QUEUES": " , "}, "names no queue"),
        ({"D1QUEUE_BATCH_COUNTS_AS": "rows"}, "'query' or 'statements'"),
        ({"D1QUEUE_DRAIN_ON_PUSH": "yes please"}, "not a valid value"),
    ],
)
def test_bad_settings_fail_loudly(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_vars(env)


@pytest.mark.parametrize(
    ("raw", "drained", "not_drained"),
    [
        ("*", ["default", "mail", "acc-1"], []),
        ("mail,*", ["mail", "default", "acc-1"], []),
        ("mail, reports", ["mail", "reports"], ["default", "acc-1"]),
        ("default", ["default"], ["mail"]),
    ],
)
def test_which_queues_a_configuration_drains(
    raw: str, drained: list[str], not_drained: list[str]
) -> None:
    config = Config.from_vars({"D1QUEUE_QUEUES": raw})
    assert all(config.drains(q) for q in drained)
    assert not any(config.drains(q) for q in not_drained)
    assert "*" not in config.listed_queues


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("*,mail", '"\\*" \\(the rest\\) may only come last'),
        ("mail,*,*", "may only come last"),
        ("mail*", "queue must match"),
        ("**", "queue must match"),
        ("mail,mail", "names mail more than once"),
    ],
)
def test_a_queue_list_typo_is_an_error(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_vars({"D1QUEUE_QUEUES": raw})


def test_the_prefix_is_a_var_the_code_may_repeat_but_not_contradict() -> None:
    """D1QUEUE_PREFIX mounts d1queue under a path; a `prefix=` in the code
    agreeing with it is fine, a different one is the operator's mistake,
    said in words (the routes and the printed links would disagree)."""
    assert Config.from_vars({"D1QUEUE_PREFIX": "/queue/"}).prefix == "/queue"
    assert Config.from_vars({}).prefix == ""
    with pytest.raises(ConfigError, match="D1QUEUE_PREFIX"):
        Config.from_vars({"D1QUEUE_PREFIX": "queue"})
    assert resolve_prefix(None, None) == ("", None)
    assert resolve_prefix(None, "/queue") == ("/queue", None)
    assert resolve_prefix("/queue", None) == ("/queue", None)
    assert resolve_prefix("/queue/", " /queue ") == ("/queue", None)
    mounted, problem = resolve_prefix("/queue", "/jobs")
    assert mounted == "/queue" and problem is not None
    assert "prefix='/queue'" in problem and "D1QUEUE_PREFIX is '/jobs'" in problem
    mounted, problem = resolve_prefix(None, "/a/../b")
    assert mounted == "" and problem is not None and "D1QUEUE_PREFIX" in problem
    with pytest.raises(ValueError, match="a d1queue prefix is a path"):
        mount_prefix("/a?b")
