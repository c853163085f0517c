"""Bounds on what reaches the queue, each stated once.

The API's validation, the library's checks and the OpenAPI document read
them from here. Each guards against a limit of the platform or a way the
Worker could be made to fail: D1 binds integers only below 2^53, Pyodide's
stack overflows on deeply nested JSON (which stops the Worker's Python for
good, not just the request), and a delay past the safe integer range makes
D1 refuse the whole settle batch it travels in.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any, TypeGuard

NAME_ALPHABET = "[A-Za-z0-9._:-]"
"""The characters of queue names, job names, groups and ids: none that a URL
holds specially ("/", "%", "?", "#", "\\", spaces), so a name is one path
segment as it is, and the router reads back what the caller sent."""

NOT_ONLY_DOTS = r"(?!\.+$)"
"""Refuses what NAME_ALPHABET still spells that no route can carry: dots
alone. `.` and `..` are a path's dot-segments, which the runtime's URL parser
(WHATWG, in workerd, Node and browsers) resolves before the Worker sees the
path, spelled `%2e` too: `/v1/queues/../jobs` arrives as `/v1/jobs`, and
`/v1/schedules/..` as `/v1/`. Longer runs of dots are refused with them, so
the rule is "not dots alone", whatever their number. A lookahead, which
Python's `re` and ECMAScript (the OpenAPI document's patterns) both read."""

DOTS_ONLY = "a name of dots alone is a URL's dot-segment, which no route can carry"
"""Why a name of dots alone is refused, in the words of every refusal."""

NAME_RULE = NOT_ONLY_DOTS + NAME_ALPHABET + "{1,64}"
"""Queue names, job names and schedule ids: short, URL-safe, one path segment
each, no surprises in logs or SQL."""
NAME_PATTERN = re.compile(NAME_RULE)

STORED_NAME_RULE = NAME_ALPHABET + "{1,64}"
"""A queue name or schedule id the tables may hold: NAME_RULE without its
dots clause, as nothing in the schema refuses such a row. What reads,
claims, clears and deletes accept (RPC, the library, a drain over every
queue), so a row of such a name still runs, shows and goes; nothing new is
written under one (NAME_RULE)."""
STORED_NAME_PATTERN = re.compile(STORED_NAME_RULE)


def name_refusal(kind: str, value: object, rule: str = NAME_RULE) -> str:
    """Why `value` is no `kind` (a queue, a job name, a schedule id): the
    rule it breaks, and for dots alone why that rule refuses them."""
    why = f"; {DOTS_ONLY}" if isinstance(value, str) and value and not value.strip(".") else ""
    shown = repr(value)
    if len(shown) > 80:  # an RPC argument may be any size: the message is not
        shown = shown[:72] + "... " + shown[-1]
    return f"{kind} must match {rule}, got {shown}{why}"


class InvalidName(ValueError):
    """A queue name, job name or schedule id not of NAME_RULE's shape: the
    one error of the one name check, which each interface turns into its own
    answer (a 400, a 422, a refused setting)."""

    def __init__(self, kind: str, value: object, rule: str = NAME_RULE) -> None:
        super().__init__(name_refusal(kind, value, rule))
        self.kind, self.value = kind, value


def is_name(value: object) -> TypeGuard[str]:
    """Whether `value` is a string of NAME_RULE's shape: a name something new
    may be written under."""
    return isinstance(value, str) and NAME_PATTERN.fullmatch(value) is not None


def check_name(kind: str, value: object) -> str:
    """`value`, if it is a well-formed `kind` (a queue, a job name) to write
    under; else InvalidName."""
    if not is_name(value):
        raise InvalidName(kind, value)
    return value


def is_stored_name(value: object) -> TypeGuard[str]:
    """Whether `value` is a string of STORED_NAME_RULE's shape: a name a row
    may have, to read, claim or delete it by."""
    return isinstance(value, str) and STORED_NAME_PATTERN.fullmatch(value) is not None


def check_stored_name(kind: str, value: object) -> str:
    """`value`, if a row may be named so (STORED_NAME_RULE): for reads,
    claims, clears and deletes; else InvalidName."""
    if not is_stored_name(value):
        raise InvalidName(kind, value, STORED_NAME_RULE)
    return value


GROUP_RULE = NAME_ALPHABET + "{1,255}"
"""A job's group (the key of per-group limits and of fair turns: a tenant,
an account, an upstream host): the names' alphabet, as long as a unique_key.
Never a path segment (no route names a group), so dots alone are a group
like any other: a registration may derive groups from payload data."""
GROUP_PATTERN = re.compile(GROUP_RULE)


def is_group(value: object) -> TypeGuard[str]:
    """Whether `value` is a string of GROUP_RULE's shape."""
    return isinstance(value, str) and GROUP_PATTERN.fullmatch(value) is not None


def check_group(value: object) -> str:
    """`value`, if it is a well-formed group; else InvalidName."""
    if not is_group(value):
        raise InvalidName("group", value, GROUP_RULE)
    return value


MAX_UNIQUE_KEY = 255
"""Characters of a unique_key."""
MAX_PARTITION = 255
"""Characters of a job's `partition`, the key that picks its shard when its
queue is not pinned to one (shards.py)."""

TRACEPARENT_RULE = "00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
"""A push's W3C trace context (the `traceparent` header's value, version
00): version, trace id, the producer's span id and flags, in lowercase hex,
neither id all zeros (TRACEPARENT_ZEROS). A job stores it as given (55
characters), so its runs join the producer's trace; anything else is
refused, never stored half-read."""
TRACEPARENT_PATTERN = re.compile(TRACEPARENT_RULE)
TRACEPARENT_ZEROS = "its trace id and its parent id must not be all zeros"
_TRACEPARENT_SHAPE = re.compile(TRACEPARENT_RULE.replace("(?!0{32})", "").replace("(?!0{16})", ""))


def check_traceparent(value: object, where: str = "traceparent") -> str | None:
    """`value` if it is None (none given) or a valid TRACEPARENT_RULE trace
    context; else ValueError saying what is wrong, naming `where`."""
    if value is None:
        return None
    if isinstance(value, str) and TRACEPARENT_PATTERN.fullmatch(value):
        return value
    if isinstance(value, str) and _TRACEPARENT_SHAPE.fullmatch(value):
        raise ValueError(f"{where}: {TRACEPARENT_ZEROS}, got {value!r}")
    shown = value[:64] if isinstance(value, str) else value
    raise ValueError(
        f"{where} must be a W3C trace context, 00-<32 hex trace id>-<16 hex parent id>-"
        f"<2 hex flags> in lowercase, got {shown!r}"
    )


ID_RULE = NOT_ONLY_DOTS + NAME_ALPHABET + "{1,128}"
"""A job's id (or a failed job's, a batch's, a schedule's) in a path or a
form: what d1queue makes, `[s<shard>-]<32 hex digits>` (shards.py), and what
a library caller may choose for a job (refused at push otherwise). The API,
the dashboard and the OpenAPI document read it from here."""
ID_PATTERN = re.compile(ID_RULE)
STORED_ID_RULE = NAME_ALPHABET + "{1,128}"
"""An id a row may have (ID_RULE without its dots clause, as
STORED_NAME_RULE): what reads and deletes by id, and page cursors, accept."""
STORED_ID_PATTERN = re.compile(STORED_ID_RULE)
MAX_ATTEMPTS = 100
PRIORITY_RANGE = (-1000, 1000)
"""Higher runs first."""
MAX_BATCH = 100
"""Jobs in one batch push."""
BATCH_JOBS = (1, 1000)
"""Jobs in one `POST /v1/batches` (a workflow batch with callbacks), and
in one addition to a running batch: one db.batch of about 110 multi-row
INSERTs, far inside a Worker's CPU and D1's statement limits."""
MAX_AFTER = 100
"""Jobs one job may wait for (`after`): its edges are written in its push,
one row each, and its handler reads their results in one query."""
MAX_ERROR_CHARS = 4000
"""A job's last_error and a failed job's error, in characters: read by
people, and every byte is stored and billed. A longer one is cut."""
MAX_RUNS = 10
"""Attempts a job's history keeps (its `runs`: start, duration, outcome,
error, progress and log lines of each), the latest: an older one is dropped
by the settle that adds the eleventh."""
MAX_RUN_ERROR_CHARS = 2000
"""An attempt's error in the history: its message and the traceback's last
frames (outcomes.describe), cut here. last_error keeps MAX_ERROR_CHARS."""
MAX_LOG_LINES = 50
"""Lines one attempt keeps of what its handler logged through `ctx.log`;
past them (or MAX_LOG_BYTES) the rest are counted in `logs_truncated`, not
kept (every line is also a JSON log line on the Worker's console)."""
MAX_LOG_BYTES = 8 * 1024
"""Bytes (as stored JSON) of the lines one attempt keeps; see MAX_LOG_LINES."""
MAX_LOG_LINE_CHARS = 1000
"""One kept log line's message, in characters: a longer one is cut."""
MAX_PROGRESS_NOTE = 200
"""A progress report's `note`, in characters: a longer one is refused
(ValueError in the handler), nothing written."""
MAX_RUN_BYTES = 12 * 1024
"""One attempt's entry in the history as stored JSON, at most: the error,
the progress, the log lines (MAX_LOG_BYTES) and the few numbers fit; an
entry past it keeps fewer log lines. A job's history is so bounded at
MAX_RUNS * MAX_RUN_BYTES (120 KiB), far under D1's 2 MB row."""
MAX_RUNS_BYTES = MAX_RUNS * MAX_RUN_BYTES
"""A job's whole attempt history as stored JSON, at most."""
SCHEDULE_RUNS_KEPT = 10
"""A schedule's last runs kept with it (the time and job id of each, about
60 bytes): the dashboard's "last runs", one bounded column written by the
statement that advances the schedule."""
MAX_DEPENDENTS = 100
"""Jobs that may wait for one job (an edge each, written by the pushes that
name it in `after`): the statement that ends it follows every edge in its
own transaction (about 4 rows read and 2 or 3 written a dependent), so this
bounds what one completion costs, far inside D1's statement time. The push
statement itself counts the edges, in the push's transaction, so concurrent
pushes cannot pass it together. A job that waits on more fans out through
a batch its handler pushes instead."""
MAX_EDGES = 1000
"""Ids named in `after` by all the jobs of one push (a batch push, a
workflow batch, an addition, a chain), each an edge written and about 30
rows read in the push's one transaction: a chain of BATCH_JOBS jobs fits."""
MAX_RESULT_BYTES = 64 * 1024
"""A handler's return value as stored JSON, kept with the completed job.
A larger one fails the job with an error that says so."""
MAX_PAGE = 500
"""Rows in one page of a listing (`?limit=`): failed jobs, completed jobs,
schedules."""
SEARCH_ROWS = 1_000
"""The jobs one page of the dashboard's search reads on each shard, at most
(store/sql.py SEARCH_LIVE, and its span reading as many index entries):
whatever the number of jobs, a search page reads at most twice this a
shard, and says when it stopped before the end."""

RUNNING_ROWS = 1_000
"""The jobs of the locked band (held, or waiting out a retry) one page of
the dashboard's "Running now" reads on each shard, at most (store/sql.py
RUNNING_NOW): whatever the number of jobs, and says when it stopped before
the end."""

MAX_PAGE_BYTES = 4 * 1024 * 1024
"""The stored bytes one page of a listing carries, at most: its rows'
payloads, results and errors added up (a single row past it still makes a
page of one, so paging always moves on). A page stops at whichever of
`limit` rows and these bytes comes first, and its `next_cursor` continues
from there: 500 rows of 130 KB payloads would be 65 MB to decode and answer
in an isolate of 128 MB. The cut is made in the SQL (store/sql.py
`bytes_bounded`), so the rows past it never reach the Worker. With shards
each shard's page gets an equal share (one row at least)."""


def page_bytes(shards: int = 1) -> int:
    """A shard's share of MAX_PAGE_BYTES, when a page is merged from the
    pages of `shards` shards read at once (shards.merge_pages): together
    they hold no more than one shard's page would."""
    return MAX_PAGE_BYTES // max(1, shards)


MAX_OLDER_THAN_S = 10**12
"""A prune's `older_than_s`: ~31,700 years, every failure, in a number D1 binds."""

MAX_SAFE_INT = 2**53 - 2
"""The largest int a Python Worker can bind: Pyodide turns ints from 2^53 - 1
up into a JS BigInt, which D1 refuses (seen on Pyodide 314 with Miniflare)."""

MAX_DELAY_S = 365 * 24 * 3600
"""The longest a job may wait: a push's `delay_s` above it is refused, and a
retry's delay (a handler's `Retry(delay_s=...)`, a server's Retry-After) is
clamped to it."""

LIMIT_RANGE = (1, 1000)
"""A flow limit's N (concurrency, group_concurrency, a rate's limit): each
holder or start is an entry of one row's JSON (store/sql.py, d1queue_flow),
read whole by every claim that the limit applies to."""
PERIOD_RANGE = (1, 86_400)
"""A rate's period_s: a second to a day."""

SIGNOUT_PRUNE = 10
"""Expired rows of the dashboard's sign-outs (d1queue_signouts) a sign-out
deletes, at most, in the batch that writes its own row. More than the one
row it adds, so the expired backlog shrinks with every sign-out, and few
enough that a sign-out's cost is a constant: the table holds about the
sign-outs of the last session lifetime (dashboard/session.py SESSION_S),
never a row per request, and rows are written only by a valid session."""

BULK_COUNT_ROWS = 10_000
"""The jobs a bulk action's confirmation reads on each shard to count what
its filter matches, at most (store/sql.py BULK_COUNT_LIVE): past it the
count is stated as a floor ("at least"), never a full scan. Each step of
the action then reads at most SEARCH_ROWS a shard, as a search page does."""

AUDIT_KEEP_S = 90 * 86_400
"""How long the audit log (d1queue_audit) keeps a bulk action's record."""

AUDIT_PRUNE = 10
"""Records older than AUDIT_KEEP_S each new bulk action deletes, at most,
in the batch that writes its own (as SIGNOUT_PRUNE): the log holds about
the actions of the last AUDIT_KEEP_S, at a constant cost an action."""

MAX_JSON_DEPTH = 64
"""Nesting of a request body or payload. Checked before parsing: at a few
thousand levels Pyodide's parser overflows the JS stack, and the Worker's
Python cannot run again."""

MAX_PAYLOAD_BYTES = 128 * 1024
"""A job's payload as stored JSON: Cloudflare Queues' message limit, and far
under D1's 2 MB row limit and 100 KB-per-statement SQL text (payloads are
bound, not inlined)."""

MAX_RESPONSE_BYTES = 64 * 1024
"""What a job reads of an HTTP answer's body, at most: a target may answer
with any size, and a Worker's isolate has 128 MB for every job of its round.
A Content-Length above it is not read at all; a stream is cancelled there."""

MAX_REDIRECTS = 5
"""Redirects a job's request follows, each hop checked against the
deployment's host rules and each a subrequest of its own."""

_ESCAPES = re.compile(r"\\.", re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DELTA = [0] * 256
_DELTA[ord("[")] = _DELTA[ord("{")] = 1
_DELTA[ord("]")] = _DELTA[ord("}")] = -1


def json_depth(text: str) -> int:
    """How deeply the JSON text nests arrays and objects, without parsing it:
    brackets inside strings do not count. Never less than the parser would
    descend, valid JSON or not; more only past a point where the parser would
    have failed (a backslash outside a string, a bracket that closes nothing).

    It runs on every request body, before anything else reads it, so its CPU
    must grow linearly with the text whatever its shape, up to the body limit:
    a few passes at C speed, none of which backtracks (a regex matching whole
    strings would not do: on an unclosed string every quote starts a scan to
    the end of the text, quadratic in all). Escape pairs go first; then every
    quote left starts or ends a string, so the text between the first and
    second quote, the third and fourth and so on is inside strings and the
    rest is not; of the rest only the brackets count."""
    # An escape pair is a backslash and the character after it, paired left
    # to right, as the parser reads them inside a string. Outside one a
    # backslash is invalid JSON: up to the first, the pairing is the parser's.
    unescaped = _ESCAPES.sub("", text)
    outside = "".join(unescaped.split('"')[::2])
    # UTF-8 encodes non-ASCII characters in bytes above 0x7F: no brackets.
    brackets = outside.encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_DELTA.__getitem__, brackets), initial=0))


def value_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """How deeply a Python value nests lists and dicts, as `json_depth`
    counts, level by level without recursion and no further than `limit` + 1,
    so a hostile value cannot make this recurse or run long either."""
    depth, frontier = 0, [value]
    while depth <= limit:
        containers = [v for v in frontier if isinstance(v, dict | list | tuple)]
        if not containers:
            break
        depth += 1
        frontier = [
            child for c in containers for child in (c.values() if isinstance(c, dict) else c)
        ]
    return depth


def clamp_delay_s(delay: Any) -> float:
    """A retry delay as seconds in [0, MAX_DELAY_S]: infinite, huge or not a
    number at all becomes the maximum, negative becomes 0."""
    if isinstance(delay, bool) or not isinstance(delay, int | float) or math.isnan(delay):
        return float(MAX_DELAY_S)
    return float(min(max(delay, 0), MAX_DELAY_S))


_scan: Any = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def json_loads(text: str) -> Any:
    """`json.loads(text)`, for compact JSON without the Python-level wrappers
    (three calls and two whitespace matches, most of the time of a small
    text in Pyodide): the decoder's own scanner when it reads the whole
    text; anything else (whitespace around it, trailing data, a syntax
    error) goes to json.loads, which says what is wrong."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, TypeError, ValueError):
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value
