"""The answer while the Worker's configuration is invalid (api.misconfigured,
which the Worker glue gives every request, /health and the dashboard
included, when its D1QUEUE_* vars fail to parse): 500 `misconfigured` to
everyone, the reason (which may quote a var's value, internal host names
included) in the log and only in the answer of a caller holding the valid
token. A token that is itself invalid signs in nobody."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from d1queue import Config, ConfigError
from d1queue.core.config import MIN_TOKEN_CHARS
from d1queue.core.guard import Guard
from d1queue.core.log import fields_of
from d1queue.interfaces.api import MISCONFIGURED, ROUTES, misconfigured

TOKEN = "t" * MIN_TOKEN_CHARS
INTERNAL = "db.internal.corp"
BAD_ALLOW = f"public,{INTERNAL}:5432"

PATHS = [
    ("GET", "/health"),
    ("HEAD", "/health"),
    ("GET", "/"),
    ("GET", "/ui"),
    ("POST", "/ui/signin"),
    *((r.method, r.path) for r in ROUTES),
]
"""Every route the Worker answers: the glue answers misconfigured for each
before routing (the API's routes with their path templates as written)."""


def reason(env: Mapping[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        Config.from_vars(env)
    return str(caught.value)


class Counted(Guard):
    def __init__(self, over: bool = False) -> None:
        super().__init__(delay_s=0)
        self.over, self.failures = over, 0

    async def failed(self, headers: Mapping[str, str]) -> bool:
        self.failures += 1
        return self.over


def logged(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [fields_of(r) for r in caplog.records if r.getMessage() == "d1queue.misconfigured"]


@pytest.mark.parametrize(("method", "path"), PATHS, ids=lambda v: v)
async def test_without_the_token_the_answer_says_nothing_of_the_value(
    method: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    why = reason({"D1QUEUE_HTTP_ALLOW": BAD_ALLOW})
    assert INTERNAL in why
    for headers in ({}, {"authorization": "Bearer " + "w" * MIN_TOKEN_CHARS}):
        guard = Counted()
        with caplog.at_level(logging.ERROR, logger="d1queue"):
            reply = await misconfigured(why, TOKEN, method, path, headers, guard)
        assert reply.status == 500
        assert reply.body == {"error": {"code": "misconfigured", "message": MISCONFIGURED}}
        assert INTERNAL not in str(reply.body) and "D1QUEUE_HTTP_ALLOW" not in str(reply.body)
        assert guard.failures == (1 if headers else 0), "a wrong token is a guess"
    assert logged(caplog) == [{"request": f"{method} {path}", "error": why}] * 2


@pytest.mark.parametrize(("method", "path"), PATHS, ids=lambda v: v)
async def test_the_tokens_holder_reads_the_reason(
    method: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    why = reason({"D1QUEUE_HTTP_ALLOW": BAD_ALLOW})
    guard = Counted()
    with caplog.at_level(logging.ERROR, logger="d1queue"):
        reply = await misconfigured(
            why, TOKEN, method, path, {"authorization": f"Bearer {TOKEN}"}, guard
        )
    assert reply.status == 500
    assert reply.body == {"error": {"code": "misconfigured", "message": why}}
    assert guard.failures == 0
    assert logged(caplog) == [{"request": f"{method} {path}", "error": why}]


@pytest.mark.parametrize("allow", [None, BAD_ALLOW])
async def test_a_short_token_signs_in_nobody(
    allow: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """The token is what is wrong (perhaps besides another var): whoever
    sends it is told nothing, and the log says why."""
    short = "too-short"
    env = {"D1QUEUE_TOKEN": short, **({"D1QUEUE_HTTP_ALLOW": allow} if allow else {})}
    why = reason(env)
    with caplog.at_level(logging.ERROR, logger="d1queue"):
        reply = await misconfigured(
            why, short, "GET", "/v1/queues", {"authorization": f"Bearer {short}"}, Counted()
        )
    assert reply.body == {"error": {"code": "misconfigured", "message": MISCONFIGURED}}
    assert logged(caplog) == [{"request": "GET /v1/queues", "error": why}]


async def test_no_token_configured_signs_in_nobody() -> None:
    why = reason({"D1QUEUE_HTTP_ALLOW": BAD_ALLOW})
    reply = await misconfigured(
        why, None, "GET", "/health", {"authorization": "Bearer "}, Counted()
    )
    assert reply.body == {"error": {"code": "misconfigured", "message": MISCONFIGURED}}


async def test_wrong_tokens_past_the_limit_are_answered_429() -> None:
    why = reason({"D1QUEUE_HTTP_ALLOW": BAD_ALLOW})
    wrong = {"authorization": "Bearer " + "w" * MIN_TOKEN_CHARS}
    reply = await misconfigured(why, TOKEN, "GET", "/v1/queues", wrong, Counted(over=True))
    assert (reply.status, reply.headers) == (429, {"retry-after": "60"})
    assert reply.body["error"]["code"] == "too_many_attempts"
    assert INTERNAL not in str(reply.body)
