"""Dashboard sessions and CSRF tokens: signed cookies, and the sign-outs.

A session is a cookie the Worker signed: `v1.<expires_ms>.<nonce>.<mac>`,
the MAC an HMAC-SHA256 under a key derived from the API token
(D1QUEUE_TOKEN). Sessions last SESSION_S, then the user signs in again.

Why signed rather than stored: a stored session costs a D1 write at every
sign-in, a table to prune, and a row that anyone able to reach the sign-in
form could try to make the Worker write. A signed session is written
nowhere: checking one costs no D1 work, and a forged or expired cookie is
refused before D1 is asked anything. What a signature alone cannot do is
end a session early: a copy of the cookie would open the dashboard until it
expired, sign-out or not. So signing out also writes the session's nonce
to D1 (d1queue_signouts, on the home shard; store/dashboard.py), kept until
the session would have expired, and every dashboard request carrying a
session whose MAC and expiry check out pays one point read of that table
(a subrequest, against the free plan's 50). A request with no session
cookie, or a forged or expired one, reads nothing.

What this may write is bounded: only a valid session can sign out (its MAC
needs the API token's key, and a signed-out session is refused, so it signs
out once; a re-sent sign-out writes nothing more), each row expires with its
session, and each sign-out deletes up to bounds.SIGNOUT_PRUNE expired rows
in the same batch. Nobody without the token can make the Worker write a
row. Rotating the token (`wrangler secret put D1QUEUE_TOKEN`) still ends
every session at once, since the key changes with it.

The CSRF token is per session: an HMAC of the session's nonce under the
same key, sent in a hidden field of every form that changes state and
checked in constant time. A page from another site can neither read it
(same-origin policy) nor send the cookie (SameSite=Strict), and a stolen
CSRF token is useless without its session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

SESSION_S = 8 * 3600
"""How long a sign-in lasts (absolute, not sliding: a cookie the Worker
re-signed on every page would be a write to the browser on every refresh)."""

COOKIE = "d1queue_session"
SECURE_COOKIE = "__Host-d1queue_session"
"""Over HTTPS the cookie takes the __Host- prefix: the browser then accepts
it only with Secure, Path=/ and no Domain, so a sibling subdomain cannot
plant or shadow it."""

LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""Hosts served over plain HTTP in development (`make dev`): the cookie is
not Secure there, or the browser would drop it."""

_SHAPE = re.compile(r"v1\.([0-9]{1,15})\.([A-Za-z0-9_-]{16,64})\.([A-Za-z0-9_-]{43})")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class Session:
    nonce: str
    expires_ms: int
    readonly: bool = False
    """Signed in with the read-only token (D1QUEUE_READONLY_TOKEN): sees
    every page, may change nothing but sign out."""


FULL, READONLY = "full", "readonly"
"""Which token signed a session in: the API token, or the read-only one."""


class Sessions:
    """Signs and checks sessions and CSRF tokens for one API token, and for
    the read-only token when there is one (`readonly_token`).

    A read-only session is a cookie of the same shape whose MAC is made
    under a key derived from the read-only token: which key verifies a
    cookie says which token signed it in, so no field of the cookie can
    claim the full role, and rotating either token ends its sessions only."""

    def __init__(self, token: str, readonly_token: str | None = None) -> None:
        # A key of its own, derived from the token, so a MAC shown to the
        # browser is never a value the API would accept as a credential.
        self._keys = {
            FULL: hmac.new(token.encode(), b"d1queue dashboard sessions v1", "sha256").digest()
        }
        self._tokens = {FULL: token}
        if readonly_token:
            self._keys[READONLY] = hmac.new(
                readonly_token.encode(), b"d1queue dashboard read-only sessions v1", "sha256"
            ).digest()
            self._tokens[READONLY] = readonly_token

    def _mac(self, message: str, role: str = FULL) -> str:
        return _b64(hmac.new(self._keys[role], message.encode(), hashlib.sha256).digest())

    def check_token(self, given: str) -> str | None:
        """Which token `given` is (FULL or READONLY), or None; each compared
        in constant time, and both always compared."""
        sent = given.strip().encode()
        found = None
        for role, token in self._tokens.items():
            if hmac.compare_digest(sent, token.encode()):
                found = role
        return found

    def issue(self, now_ms: int, role: str = FULL) -> str:
        """A fresh session's cookie value, valid for SESSION_S. The nonce is
        drawn at sign-in, never at import (Workers refuse randomness then)."""
        body = f"v1.{now_ms + SESSION_S * 1000}.{secrets.token_urlsafe(18)}"
        return f"{body}.{self._mac(body, role)}"

    def verify(self, value: str | None, now_ms: int) -> Session | None:
        """The session a cookie value holds, or None: malformed, forged (made
        under another token), or expired. Whether it was signed out is D1's
        to say (auth.Auth.session), asked only of a session that passes."""
        if not value:
            return None
        m = _SHAPE.fullmatch(value)
        if m is None:
            return None
        body = value.rsplit(".", 1)[0]
        mac = m.group(3).encode()
        role = next(
            (r for r in self._keys if hmac.compare_digest(self._mac(body, r).encode(), mac)), None
        )
        if role is None:
            return None
        expires = int(m.group(1))
        if expires <= now_ms:
            return None
        return Session(nonce=m.group(2), expires_ms=expires, readonly=role == READONLY)

    def csrf(self, session: Session) -> str:
        """The CSRF token of `session`: the same for every form it is shown."""
        return self._mac(f"csrf.{session.nonce}", READONLY if session.readonly else FULL)

    def check_csrf(self, session: Session, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(
            self.csrf(session).encode(), given.encode()
        )


def is_local(host: str) -> bool:
    """Whether a request's Host (with or without port) is a development host."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return name.lower() in LOCAL_HOSTS


def cookie_name(secure: bool) -> str:
    return SECURE_COOKIE if secure else COOKIE


def set_cookie(value: str, *, secure: bool, max_age_s: int = SESSION_S) -> str:
    """The Set-Cookie header of a session (an empty value with max_age_s=0
    clears it): HttpOnly (no script reads it), SameSite=Strict (no other site
    sends it), Secure except on a development host, expiring."""
    parts = [
        f"{cookie_name(secure)}={value}",
        "Path=/",
        f"Max-Age={max_age_s}",
        "HttpOnly",
        "SameSite=Strict",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def read_cookies(header: str, name: str) -> list[str]:
    """Every value of cookie `name` in a Cookie header: a browser may send two
    of one name (another path's), and only a value the Worker signed counts,
    so each is checked rather than guessing which the browser put first."""
    values = []
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            values.append(value)
    return values
