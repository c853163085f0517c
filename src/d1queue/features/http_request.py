"""The built-in `http.request` job: deliver an HTTP request, with retries.

Payload: {url | service + path, method?, headers?, body?, timeout_s?,
expect_status?}. Succeeds on 2xx (or `expect_status`); retries on 5xx, 429
and network errors, honouring Retry-After; fails for good on any other 4xx,
and on a target the deployment's rules refuse (D1QUEUE_HTTP_ALLOW,
D1QUEUE_HTTP_SERVICES; outbound.py), at the first hop or after a redirect.
The response status and the first EXCERPT_CHARS of its body go into
last_error, so a failure explains itself in the failed-jobs store; no more
than MAX_RESPONSE_BYTES of a body is ever read.

The request goes out through `ctx.fetch`, the HTTP client the drain was
given (`drain(..., fetch=...)`: the Workers fetch in interfaces/cloudflare.py, tests pass
their own). It declares one subrequest and one for each redirect it may
follow, and a cancel watch every CANCEL_WATCH_S (a subrequest each): a
cancel of a running request cancels its task, which aborts the fetch. A
Worker has no synchronous XMLHttpRequest, which is why `requests` (through
pyodide-http) is not used.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from ..core.bounds import MAX_REDIRECTS
from ..core.context import JobContext
from ..core.errors import Fail, Retry
from ..core.limits import SubrequestLimitExceeded
from ..core.outbound import Reply, strip_credentials
from ..core.registry import Backoff, Registry

JOB_NAME = "http.request"
EXCERPT_CHARS = 300
MAX_TIMEOUT_S = 60.0
CANCEL_WATCH_S = 13.0
"""How often a running `http.request` reads whether a cancel marked it: the
shortest interval at which its 65 s timeout needs 4 watches, so a job
declares 10 subrequests and a free plan's drain still runs 4 at once."""
METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None if absent
    or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def parse(payload: Any) -> dict[str, Any]:
    """The request a payload describes; Fail (not retried) if it is malformed."""
    if not isinstance(payload, Mapping):
        raise Fail("payload must be an object")
    unknown = set(payload) - {
        "url", "service", "path", "method", "headers", "body", "timeout_s", "expect_status"
    }  # fmt: skip
    if unknown:
        raise Fail(f"unknown field(s): {', '.join(sorted(unknown))}")
    service = payload.get("service")
    url: Any
    if service is not None:
        path = payload.get("path", "/")
        if not isinstance(service, str) or not isinstance(path, str) or not path.startswith("/"):
            raise Fail("service must be a binding name and path must start with /")
        url = f"https://{service}{path}"  # the host is ignored by a service binding
    else:
        url = payload.get("url")
        if not isinstance(url, str) or urlparse(url).scheme not in ("http", "https"):
            raise Fail("url must be an http(s) URL (or give service and path)")
    method = str(payload.get("method", "POST" if "body" in payload else "GET")).upper()
    if method not in METHODS:
        raise Fail(f"method must be one of {', '.join(sorted(METHODS))}")
    headers = payload.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise Fail("headers must be an object of strings")
    headers = dict(headers)
    body = payload.get("body")
    if body is not None and not isinstance(body, str):
        body = json.dumps(body)
        headers.setdefault("content-type", "application/json")
    timeout = payload.get("timeout_s", 30)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (0 < timeout <= MAX_TIMEOUT_S)
    ):
        raise Fail(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:g}]")
    expect = payload.get("expect_status")
    if expect is not None and (isinstance(expect, bool) or not isinstance(expect, int)):
        raise Fail("expect_status must be an integer")
    return {
        "url": url,
        "service": service,
        "method": method,
        "headers": headers,
        "body": body,
        "timeout_s": float(timeout),
        "expect_status": expect,
    }


RESULT_BODY_CHARS = 300
"""Characters of the answer's body an `http.request` job's result keeps."""


def register_http_job(
    registry: Registry,
    *,
    max_attempts: int = 5,
    backoff: Backoff | None = None,
) -> None:
    """Register `http.request` on `registry`; it sends with the drain's fetch."""

    async def http_request(payload: Any, ctx: JobContext) -> dict[str, Any] | None:
        req = parse(payload)
        target = f"{req['method']} {strip_credentials(req['url'])}"
        try:
            response: Reply = await asyncio.wait_for(
                ctx.fetch(
                    req["url"],
                    method=req["method"],
                    headers=req["headers"],
                    body=req["body"],
                    service=req["service"],
                ),
                req["timeout_s"],
            )
            status = int(response.status)
            text = await asyncio.wait_for(response.text(), req["timeout_s"])
            if response.truncated and not text:
                text = "(a body longer than the read limit, not read)"
        except TimeoutError:
            raise Retry(f"{target}: no response within {req['timeout_s']:g}s") from None
        except (Fail, Retry, SubrequestLimitExceeded):
            raise
        except Exception as exc:  # network errors, DNS, refused connections
            raise Retry(strip_credentials(f"{target}: {type(exc).__name__}: {exc}")) from None
        excerpt = " ".join(text[:EXCERPT_CHARS].split())
        said = f"{target} answered {status}" + (f": {excerpt}" if excerpt else "")
        expected = req["expect_status"]
        if (expected is None and 200 <= status < 300) or status == expected:
            # The job's result, kept with it while its queue keeps history.
            return {"status": status, "body": text[:RESULT_BODY_CHARS]}
        if status == 429 or status >= 500:
            raise Retry(said, delay_s=retry_after_s(response.header("retry-after")))
        raise Fail(said)

    registry.register(
        JOB_NAME,
        http_request,
        max_attempts=max_attempts,
        timeout_s=MAX_TIMEOUT_S + 5,
        backoff=backoff or Backoff(base_s=10, max_s=3600),
        subrequests=1 + MAX_REDIRECTS,
        # A cancel of a running request is found within this; its task is
        # then cancelled, which aborts the fetch (the target's connection
        # closes). Each watch is a subrequest of the job's plan.
        cancel_watch_s=CANCEL_WATCH_S,
    )
