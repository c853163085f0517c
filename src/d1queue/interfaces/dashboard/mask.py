"""Secrets in payloads, masked on the dashboard's pages.

A payload may carry credentials: an `http.request` job's headers
(`authorization`, `cookie`, `x-api-key`, ...), a password in a body. The
dashboard is for looking at queues, not for reading those, and a page is
easy to share as a screenshot: the value under any key SECRET_KEY matches,
at any depth of the payload, is shown as MASK, whatever its type or length.
The API (/v1/...) still returns payloads as pushed: its caller holds the
token that could push them.

A handler's error text may quote its payload (as repr or JSON), so the
pages also replace, in an error text, the secret values its job's payload
holds (`scrub`).
"""

from __future__ import annotations

import json
import re
from typing import Any

MASK = "\u2022" * 6
"""What a secret value is shown as: fixed, so it hints at neither the
value's length nor its first characters."""

SECRET_KEY = re.compile(
    r"authori[sz]ation|cookie|token|secret|passw(?:or)?d|passphrase|credential"
    r"|api[-_. ]?key|private[-_. ]?key"
    r"|(?:^|[-_. ])(?:auth|pass|pwd)(?:$|[-_. ])",
    re.IGNORECASE,
)
"""The names of keys whose values are secrets, searched anywhere in the key,
case-insensitive: authorization and proxy-authorization, cookie and
set-cookie, x-api-key and api_key/apiKey, anything naming a token, secret,
password, passphrase, credential or private key, and `auth`, `pass` or
`pwd` as a word of their own (not inside `author`, `compass`)."""

MIN_SCRUBBED = 4
"""The shortest secret value replaced in an error text: a shorter one would
mask every occurrence of a letter or a digit and leave the text unreadable
(a payload's page still masks it, by key)."""


def mask(value: Any) -> Any:
    """`value` (a payload, parsed) with every secret key's value replaced
    by MASK, at any depth; `value` itself is not changed. Payloads nest at
    most bounds.MAX_JSON_DEPTH deep (checked at push), so recursing is safe."""
    if isinstance(value, dict):
        return {
            k: MASK if isinstance(k, str) and SECRET_KEY.search(k) else mask(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def _secret_values(value: Any, found: set[str], under_secret: bool = False) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _secret_values(v, found, under_secret or bool(SECRET_KEY.search(str(k))))
    elif isinstance(value, list):
        for v in value:
            _secret_values(v, found, under_secret)
    elif under_secret and value is not None:
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) >= MIN_SCRUBBED:
            found.add(text)


def scrub(text: str | None, payload: Any) -> str | None:
    """`text` (an error) with each secret value of `payload` (parsed, or as
    its stored JSON text) that it quotes replaced by MASK, longest first. A
    payload whose text names no secret key is not parsed at all."""
    if not text or payload is None:
        return text
    if isinstance(payload, str):
        if not SECRET_KEY.search(payload):
            return text
        try:
            payload = json.loads(payload)
        except ValueError:
            return text
    found: set[str] = set()
    _secret_values(payload, found)
    for secret in sorted(found, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
