"""Which D1 errors are D1 failing for a while, not the statement or the code:
the binding re-sends the transient ones (store/binding.py), and the API and
the dashboard answer the ones left 503 `unavailable`, not 500. Pure text
rules, so the interfaces read them without importing the driver."""

from __future__ import annotations

TRANSIENT_ERRORS = (
    "Network connection lost",
    "storage caused object to be reset",
    "reset because its code was updated",
    "Cannot resolve D1 DB due to transient issue",
)
"""D1 errors its docs say to retry ("debug-d1", "retry-queries"). Not retried:
"overloaded", timeouts, memory and CPU resets, which retrying makes worse.
Retrying is safe for every statement d1queue sends: a re-sent claim or settle
is fenced (it changes nothing the second time), and a re-sent insert carries
the same job id."""


def is_transient(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in TRANSIENT_ERRORS)


UNAVAILABLE_ERRORS = (
    *TRANSIENT_ERRORS,
    "D1 DB is overloaded",
    "exceeded timeout",
    "exceeded its memory limit",
    "exceeded its CPU time limit",
    "caused object to be reset",
)
"""D1 failing for a while rather than the statement being wrong: the
transient errors (still failing once their re-sends ran out) and the ones
not re-sent because retrying at once makes them worse (overloaded, a
storage timeout, a reset). A caller that cannot ride one out says "try
again later" (503), not "bug" (500)."""


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` is D1 being unavailable (UNAVAILABLE_ERRORS), not a
    fault of the statement or of the code that sent it. A D1 error raised
    again `from` it (its __cause__) counts; one met while handling it (its
    __context__) does not: that is the handler's own failure."""
    seen: BaseException | None = exc
    for _ in range(8):  # a cycle of causes cannot hold the request
        if seen is None:
            return False
        if any(marker in str(seen) for marker in UNAVAILABLE_ERRORS):
            return True
        seen = seen.__cause__
    return False
