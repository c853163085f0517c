"""Slowing down whoever guesses the API token or the dashboard's sign-in.

A wrong bearer token or a wrong sign-in costs its sender:

- a pause of FAILED_AUTH_DELAY_S before the answer, always: one client
  guessing in turn gets a few tries a second, not thousands;
- with Cloudflare's Rate Limiting binding (`[[ratelimits]]` named
  AUTH_LIMITER_BINDING in wrangler.toml), a 429 once its client (an IPv4
  address, or an IPv6 /64: `client_key`) has failed more than the
  binding's limit in its period. That binding
  counts per Cloudflare location and approximately (docs/security.md); a
  strict limit is a WAF rate-limiting rule in front of the Worker.

Only failures are counted, so a busy producer with the right token is
never slowed; a request with no token at all is refused at once (it guesses
nothing), and nothing is written to D1: an attacker cannot make the
Worker store anything by guessing. The token itself is at least
config.MIN_TOKEN_CHARS characters, beyond guessing at any rate.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Mapping

from .log import event, get

log = get(__name__)

AUTH_LIMITER_BINDING = "AUTH_LIMITER"
"""The Rate Limiting binding the Worker uses when wrangler.toml declares one."""

FAILED_AUTH_DELAY_S = 0.25
"""The pause before answering a wrong token or sign-in."""

RETRY_AFTER_S = 60
"""What a 429 tells the client to wait: the binding's longest period."""

CLIENT_HEADER = "cf-connecting-ip"
"""The client's address as Cloudflare's edge sets it (a client cannot: the
edge overwrites it). Absent off Cloudflare, where every client is one key."""

Limiter = Callable[[str], Awaitable[bool]]
"""`await limiter(key)`: count one failure of `key`; False once it is over
the limit (the Rate Limiting binding's `limit({key}).success`)."""


IPV6_CLIENT_BITS = 64
"""An IPv6 client is its /64: one subscriber, one LAN or one host is given a
whole /64 to pick addresses from, so keying on the full address would give
one guesser 2**64 fresh keys, each with its own allowance."""


def client_key(headers: Mapping[str, str]) -> str:
    """The key a failed attempt is counted under: `auth:` and the client's
    IPv4 address, or its IPv6 /64 (an IPv4-mapped IPv6 address counts as
    its IPv4 address). The one place a client is named: the API and the
    dashboard's sign-in both count through Guard.failed. A value that is
    no address cannot have come from Cloudflare's edge, which sets the
    header over any a client sent: it is its own key. No header (off
    Cloudflare): every client is `auth:unknown`."""
    raw = headers.get(CLIENT_HEADER, "").strip()
    if not raw:
        return "auth:unknown"
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return "auth:" + raw
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return f"auth:{address.ipv4_mapped}"
        bits = 128 - IPV6_CLIENT_BITS
        network = ipaddress.IPv6Network((int(address) >> bits << bits, IPV6_CLIENT_BITS))
        return f"auth:{network}"
    return f"auth:{address}"


class Guard:
    """What the API and the dashboard do after a failed credential check."""

    def __init__(
        self,
        limiter: Limiter | None = None,
        *,
        delay_s: float = FAILED_AUTH_DELAY_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.limiter, self.delay_s, self._sleep = limiter, delay_s, sleep

    async def failed(self, headers: Mapping[str, str]) -> bool:
        """Count a failed attempt of the request's client and pause; True
        when the client is over the limit and is to be answered 429."""
        key = client_key(headers)
        over = False
        if self.limiter is not None:
            try:
                over = not await self.limiter(key)
            except Exception as exc:  # a limiter that fails must not lock everyone out
                event(log, "d1queue.guard.limiter_failed", logging.WARNING, error=str(exc))
        if over:
            event(log, "d1queue.guard.limited", logging.WARNING, key=key)
        await self._sleep(self.delay_s)
        return over
