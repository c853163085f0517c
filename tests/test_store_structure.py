"""The store is entered by lifecycle: D1Queue is a thin front with one
method per transition, no SQL is written outside the store, and a claim
round over queues without flow limits never enters flow admission."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from d1queue import Config, D1Queue, Registry, drain
from d1queue.core.flow import Limits

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "d1queue"

MOST_PUBLIC = 25
"""The most public methods and properties D1Queue may have, inherited ones
and aliases included: one per transition of a job, and no second names."""

SQL = re.compile(
    r"\b(SELECT\b.+\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b",
    re.DOTALL,
)
"""A statement's text in a string literal (d1queue writes SQL's keywords in
capitals; not a word like "SELECT" alone, in prose or a page's script)."""


def public(cls: type) -> list[str]:
    """The public callables and properties `cls` has, inherited ones too."""
    return sorted(
        name
        for name in dir(cls)
        if not name.startswith("_")
        and (
            callable(getattr(cls, name)) or isinstance(inspect.getattr_static(cls, name), property)
        )
    )


def test_d1queue_is_a_thin_front() -> None:
    names = public(D1Queue)
    assert len(names) <= MOST_PUBLIC, f"{len(names)} public names: {names}"
    assert {"dispatch", "push", "batch", "reserve", "settle_and_claim", "settle"} <= set(names)
    for gone in ("acknowledge", "release", "push_batch", "survey_flows", "metered", "keeps"):
        assert gone not in names


def sql_outside_the_store() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "store":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and SQL.search(node.value)
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_no_sql_text_outside_the_store() -> None:
    assert sql_outside_the_store() == []


async def test_a_round_without_flow_limits_never_enters_flow_admission(
    queue: D1Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from d1queue.store import claim

    reg = Registry()

    @reg.job("t.ok", queue="plain")
    async def ok(payload: object) -> None:
        return None

    @reg.job("t.limited", queue="limited")
    async def limited(payload: object) -> None:
        return None

    made: list[object] = []
    real = claim.Admission

    def spy(*args: object) -> object:
        made.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(claim, "Admission", spy)
    for i in range(3):
        await queue.dispatch("t.ok", i, queue="plain")
    report = await drain(queue, reg, Config(plan="paid"), queues=["plain"])
    assert report.completed == 3 and made == []
    await queue.set_limits("limited", Limits(concurrency=1))
    await queue.dispatch("t.limited", 0, queue="limited")
    report = await drain(queue, reg, Config(plan="paid"), queues=["limited"])
    assert report.completed == 1 and made, "a queue with limits is admitted by admission.py"


@pytest.mark.parametrize(
    ("field", "value"),
    [("delay_s", -1), ("delay_s", None), ("unique_key", ""), ("unique_key", 7)],
)
def test_a_push_is_checked_by_the_job_model_the_service_adds_no_rule(
    queue: D1Queue, field: str, value: object
) -> None:
    """A job field's rule is stated once, by the job model: the API's 422
    says what QueuedJob.new says of the same value."""
    from d1queue import QueuedJob
    from d1queue.interfaces.service import ApiError, Service

    reg = Registry()

    @reg.job("t.ok")
    async def ok(payload: object) -> None:
        return None

    with pytest.raises(ValueError) as by_the_job:
        QueuedJob.new("t.ok", **{field: value})  # type: ignore[arg-type]
    with pytest.raises(ApiError) as by_the_api:
        Service(queue, reg).parse_job("q", {"name": "t.ok", field: value})
    assert (by_the_api.value.status, by_the_api.value.code) == (422, "invalid")
    assert by_the_api.value.message == str(by_the_job.value)
