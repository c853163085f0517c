"""Wrong tokens are slowed (guard.py): a pause on every failure, a 429 past
the Rate Limiting binding's limit, and a right token never counted."""

from __future__ import annotations

from typing import Any

from d1queue import D1Queue, Registry
from d1queue.core.guard import FAILED_AUTH_DELAY_S, Guard, client_key
from d1queue.interfaces.api import Api
from d1queue.interfaces.service import Service

TOKEN = "t" * 32


class Limiter:
    """The Rate Limiting binding's contract: `limit` per key, `success`
    False once the key is over `n`."""

    def __init__(self, n: int) -> None:
        self.n, self.counts = n, {}  # type: ignore[var-annotated]

    async def __call__(self, key: str) -> bool:
        self.counts[key] = self.counts.get(key, 0) + 1
        return bool(self.counts[key] <= self.n)


def api(queue: D1Queue, guard: Guard) -> Api:
    return Api(Service(queue, Registry()), TOKEN, "test", {}, guard)


async def test_a_wrong_token_pauses_and_the_limit_answers_429(queue: D1Queue) -> None:
    pauses: list[float] = []

    async def sleep(s: float) -> None:
        pauses.append(s)

    limiter = Limiter(3)
    a = api(queue, Guard(limiter, sleep=sleep))
    client = {"cf-connecting-ip": "203.0.113.9"}
    statuses = []
    for i in range(5):
        reply = await a.handle(
            "GET", "https://q/v1/queues", client | {"authorization": f"Bearer {i}"}, b""
        )
        statuses.append(reply.status)
    assert statuses == [401, 401, 401, 429, 429]
    assert pauses == [FAILED_AUTH_DELAY_S] * 5
    assert limiter.counts == {"auth:203.0.113.9": 5}
    right = await a.handle(
        "GET", "https://q/v1/queues", client | {"authorization": f"Bearer {TOKEN}"}, b""
    )
    assert right.status == 200 and len(pauses) == 5, "a right token is neither paused nor counted"
    other = await a.handle(
        "GET",
        "https://q/v1/queues",
        {"cf-connecting-ip": "198.51.100.1", "authorization": "x"},
        b"",
    )
    assert other.status == 401, "another client has its own count"
    bare = await a.handle("GET", "https://q/v1/queues", client, b"")
    assert bare.status == 401 and len(pauses) == 6, "no token at all guesses nothing: no pause"


async def test_a_failing_limiter_locks_no_one_out(queue: D1Queue) -> None:
    async def broken(key: str) -> bool:
        raise RuntimeError("binding unavailable")

    async def sleep(s: float) -> None:
        pass

    a = api(queue, Guard(broken, sleep=sleep))
    reply = await a.handle("GET", "https://q/v1/queues", {"authorization": "Bearer x"}, b"")
    assert reply.status == 401


def test_client_key() -> None:
    assert client_key({"cf-connecting-ip": " 1.2.3.4 "}) == "auth:1.2.3.4"
    assert client_key({}) == "auth:unknown"


async def test_every_api_answer_says_no_store(queue: D1Queue) -> None:
    a = api(queue, Guard(delay_s=0))
    for method, path, headers in [
        ("GET", "/health", {}),
        ("GET", "/v1/queues", {}),
        ("GET", "/v1/queues", {"authorization": f"Bearer {TOKEN}"}),
        ("GET", "/v1/nope", {"authorization": f"Bearer {TOKEN}"}),
        ("OPTIONS", "/v1/queues", {}),
    ]:
        reply = await a.handle(method, f"https://q{path}", headers, b"")
        assert reply.headers["cache-control"] == "no-store", (method, path, reply.status)


async def test_ids_are_checked_by_the_service_for_every_caller(queue: D1Queue) -> None:
    import pytest

    from d1queue.interfaces.service import ApiError

    service = Service(queue, Registry())
    for call in (
        service.job,
        service.cancel,
        service.retry_failed,
        service.delete_failed,
        service.schedule,
        service.delete_schedule,
        service.pause_schedule,
    ):
        for bad in ("../x", "", "x" * 129, 5):
            with pytest.raises(ApiError) as exc:
                await call(bad)  # type: ignore[arg-type]
            assert exc.value.code == "invalid_id"


async def test_wrong_sign_ins_are_paused_and_limited(db: Any, clock: Any) -> None:
    from d1queue.interfaces.dashboard import Dashboard

    from .test_dashboard import TOKEN as BOARD_TOKEN
    from .test_dashboard import Browser, registry

    pauses: list[float] = []

    async def sleep(s: float) -> None:
        pauses.append(s)

    board = Dashboard(
        Service(D1Queue(db, clock=clock), registry()), BOARD_TOKEN, Guard(Limiter(2), sleep=sleep)
    )
    browser = Browser(board, clock)
    statuses = [(await browser.post("/ui/signin", {"token": "nope"})).status for _ in range(4)]
    assert statuses == [401, 401, 429, 429] and len(pauses) == 4
    limited = await browser.post("/ui/signin", {"token": "nope"})
    assert limited.headers["retry-after"] == "60" and "set-cookie" not in limited.headers
    await browser.sign_in()  # the right token is never counted
    assert len(pauses) == 5


def test_an_ipv6_client_is_its_64_and_an_ipv4_client_its_address() -> None:
    def key(address: str) -> str:
        return client_key({"cf-connecting-ip": address})

    same = ["2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff", " 2001:DB8:1:2:0:0:0:9 "]
    assert {key(a) for a in same} == {"auth:2001:db8:1:2::/64"}
    assert key("2001:db8:1:3::1") == "auth:2001:db8:1:3::/64"
    assert key("::ffff:198.51.100.7") == "auth:198.51.100.7", "IPv4-mapped: the IPv4 address"
    assert key("198.51.100.7") != key("198.51.100.8")
    assert key("fe80::1%eth0") == "auth:fe80::/64"


async def test_addresses_of_one_ipv6_64_share_one_limit(queue: D1Queue) -> None:
    """A /64 is one subscriber's: new addresses in it are no new allowance."""

    async def sleep(s: float) -> None:
        pass

    limiter = Limiter(3)
    a = api(queue, Guard(limiter, sleep=sleep))
    statuses = []
    for i in range(5):
        client = {"cf-connecting-ip": f"2001:db8:7:7::{i + 1:x}", "authorization": f"Bearer {i}"}
        statuses.append((await a.handle("GET", "https://q/v1/queues", client, b"")).status)
    assert statuses == [401, 401, 401, 429, 429]
    assert limiter.counts == {"auth:2001:db8:7:7::/64": 5}
    other = {"cf-connecting-ip": "2001:db8:7:8::1", "authorization": "Bearer x"}
    assert (await a.handle("GET", "https://q/v1/queues", other, b"")).status == 401
