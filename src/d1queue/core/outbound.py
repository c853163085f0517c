"""What a job may reach over HTTP, and how its requests go out.

Every request a handler makes through `ctx.fetch` (the built-in
`http.request` job's included) passes here:

- its host is checked against the deployment's host rules
  (D1QUEUE_HTTP_ALLOW), and a service binding against the names in
  D1QUEUE_HTTP_SERVICES, before anything is sent and at no D1 cost;
- redirects are followed here, not by the platform, at most MAX_REDIRECTS
  hops, each hop checked as the first was;
- headers a job could use to pose as a client or as Cloudflare (`cf-*`,
  forwarding headers, `host`) are dropped;
- a body is read up to MAX_RESPONSE_BYTES, never whole.

The host check reads the URL, not DNS: a Worker cannot resolve names, so a
public name that resolves to a private address is not caught here (on
Cloudflare, fetch reaches the public Internet; docs/security.md says what
its own fetch refuses). What the check does catch is every spelling the
platform's URL parser (WHATWG) would turn into an internal address:
`127.1`, `0x7f.0.0.1`, `2130706433`, `%31%32%37.0.0.1`, full-width digits,
`[::ffff:127.0.0.1]`, `localhost.`.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote, urljoin, urlsplit

from .bounds import MAX_REDIRECTS, MAX_RESPONSE_BYTES
from .errors import Fail
from .limits import SubrequestKind
from .log import event, get

log = get(__name__)

CLASSES = ("public", "loopback", "private", "link-local", "localhost")
"""The kinds of host a rule can open by name: `public` is any host not of
the other four (or an unnamed class, see `host_class`)."""

DEFAULT_ALLOW = "public"
"""D1QUEUE_HTTP_ALLOW's default: the public Internet, nothing internal."""

ALLOW_ALL = "*"

SERVICE_RULE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]{0,63}")
"""A binding name as wrangler.toml gives one (a JS identifier)."""

_NAME_RULE = re.compile(r"(\*\.)?([a-z0-9_-]+(\.[a-z0-9_-]+)*)")

DROPPED_HEADER = re.compile(
    r"cf-.*|x-forwarded-.*|forwarded|x-real-ip|true-client-ip|client-ip|host|via|cdn-loop",
    re.IGNORECASE,
)
"""Headers a job may not send: a target behind Cloudflare or a proxy would
read them as the client's address or as the platform's own markers."""

CROSS_ORIGIN_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "cache-control",
        "content-language",
        "content-type",
        "user-agent",
    }
)
"""The only headers a job set that follow a redirect to another origin. Any
other one may be a credential (`authorization`, `cookie`, `x-api-key`, a
vendor's own token header): a target must not be able to forward a job's
credentials to a third party by answering with a Location."""

REDIRECTS = frozenset({301, 302, 303, 307, 308})

_FORBIDDEN_URL_CHARS = re.compile(r"[\x00-\x20\x7f\\]")
"""Characters WHATWG's URL parser strips or reads as `/` while Python's
urlsplit does not (`http://127.0.0.1\\@example.com` is 127.0.0.1 to fetch and
example.com to urlsplit): a URL holding one is refused, so both parsers see
the same host."""

_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@]*@")


def strip_credentials(text: str) -> str:
    """`text` with the `user:password@` part of every URL in it removed: what
    is stored as a job's error or shown in a log must not carry them."""
    return _URL_CREDENTIALS.sub(r"\1", text)


class OutboundRefused(Fail):
    """A request the deployment's rules do not allow: the job fails for good
    (running it again cannot change the rules)."""


# -- hosts -------------------------------------------------------------------------


def _ipv4_number(part: str) -> int | None:
    """One dot-separated part of a WHATWG IPv4 host: decimal, 0x-hex or
    0-octal; None if it is not a number."""
    base, digits = 10, part
    if part[:2] in ("0x", "0X"):
        base, digits = 16, part[2:]
    elif len(part) > 1 and part.startswith("0"):
        base, digits = 8, part[1:]
    if digits == "":
        return 0
    try:
        return int(digits, base)
    except ValueError:
        return None


def _whatwg_ipv4(host: str) -> ipaddress.IPv4Address | str | None:
    """The IPv4 address WHATWG's host parser reads in `host`, None when the
    host is a domain name, or a string saying why it is no valid host (a
    host ending in a number must be an address)."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    last = parts[-1]
    ends_in_number = last.isdigit() or (
        last[:2] in ("0x", "0X") and all(c in "0123456789abcdefABCDEF" for c in last[2:])
    )
    if not ends_in_number:
        return None
    if len(parts) > 4:
        return "an address of more than four parts"
    numbers = [_ipv4_number(p) if p else None for p in parts]
    if any(n is None for n in numbers):
        return "an address with a part that is not a number"
    *head, tail = [n for n in numbers if n is not None]
    if any(n > 255 for n in head) or tail >= 256 ** (5 - len(parts)):
        return "an address out of range"
    value = tail + sum(n * 256 ** (3 - i) for i, n in enumerate(head))
    return ipaddress.IPv4Address(value)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """An IPv4 address an IPv6 one carries and a network could route to:
    mapped (::ffff:a.b.c.d), 6to4, NAT64 (64:ff9b::/96) or the deprecated
    compatible form (::a.b.c.d)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    packed = ip.packed
    if packed[:12] == bytes.fromhex("0064ff9b0000000000000000") or (
        packed[:12] == bytes(12) and packed[12:] not in (bytes(4), bytes(3) + b"\x01")
    ):
        return ipaddress.IPv4Address(packed[12:])
    return None


def ip_class(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """`loopback`, `link-local`, `private` (any other address that is not
    globally reachable: RFC 1918, shared, unique local, unspecified,
    multicast, reserved) or `public`."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            return ip_class(inner)
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if not ip.is_global or ip.is_multicast:
        return "private"
    return "public"


@dataclass(frozen=True)
class Host:
    """A URL's host as the platform would reach it."""

    name: str
    """Lower-case ASCII, without a trailing dot; an address in its usual form."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    kind: str
    """One of CLASSES."""


_PRIVATE_SUFFIXES = (".local", ".internal", ".localdomain", ".home.arpa", ".lan", ".intranet")

_FORBIDDEN_DOMAIN_CHARS = re.compile(r"[\x00-\x20#%/:<>?@\[\\\]^|\x7f]")
"""WHATWG's forbidden domain code points (in ASCII): a host holding one once
percent-decoded is no valid host to fetch."""


_BRACKETS = re.compile(r"[^\[\]]*|\[[^\[\]]*\](:[0-9]*)?")
"""A URL's host and port: brackets only around the whole host."""


def _check_ace_labels(host: str) -> None:
    """WHATWG refuses a host with an `xn--` label that is not valid Punycode;
    so does d1queue, rather than allow a host the runtime would not read."""
    for label in host.split("."):
        if label.startswith("xn--"):
            try:
                decoded = label[4:].encode("ascii").decode("punycode")
                # A label decoding to ASCII alone or to controls is refused,
                # as WHATWG does; other Unicode rules are the runtime's to apply.
                valid = not decoded.isascii() and not any(
                    unicodedata.category(c) == "Cc" for c in decoded
                )
            except (UnicodeError, IndexError, ValueError):
                valid = False
            if not valid:
                raise ValueError("the host has a label that is not valid Punycode")


def parse_host(raw: str) -> Host:
    """The host `raw` (as urlsplit gives it: percent-encoded, any case,
    brackets removed) names, classified; ValueError if it is no valid host.

    Only ASCII hosts are read (after percent-decoding): the runtime maps
    other code points by current Unicode (dropping some, reading others as
    digits), which no Python codec here follows. The Worker hands this the
    runtime's own reading of a URL, which is always ASCII (`Http.read_url`)."""
    try:
        host = unquote(raw, errors="strict")
    except UnicodeError:
        raise ValueError("the host is not ASCII once percent-decoded") from None
    if not host:
        raise ValueError("the URL has no host")
    if not host.isascii():
        raise ValueError("the host is not ASCII: give an internationalized name in its xn-- form")
    if ":" in host:
        if "%" in host or "%" in raw:  # a zone id or an escape: WHATWG reads neither in [...]
            raise ValueError("the host is not a valid IPv6 address")
        try:
            ip6 = ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError("the host is not a valid IPv6 address") from None
        return Host(str(ip6), ip6, ip_class(ip6))
    host = host.lower()
    if _FORBIDDEN_DOMAIN_CHARS.search(host):
        raise ValueError("the host holds a character no host may hold")
    ip4 = _whatwg_ipv4(host)
    if isinstance(ip4, str):
        raise ValueError(f"the host is {ip4}")
    if ip4 is not None:
        return Host(str(ip4), ip4, ip_class(ip4))
    _check_ace_labels(host)
    name = host[:-1] if host.endswith(".") else host
    if name == "localhost" or name.endswith(".localhost"):
        return Host(name, None, "localhost")
    if "." not in name or name.endswith(_PRIVATE_SUFFIXES):
        return Host(name, None, "private")  # resolved by a private resolver, if at all
    return Host(name, None, "public")


# -- the rules ---------------------------------------------------------------------


@dataclass(frozen=True)
class HostRules:
    """D1QUEUE_HTTP_ALLOW: comma-separated entries, any of which admits a host.

    - `public`, `loopback`, `private`, `link-local`, `localhost`: every host
      of that kind (`ip_class`, `parse_host`);
    - `*`: every host;
    - `api.example.com`: that host; `*.example.com`: its subdomains;
    - `10.1.2.3`, `10.0.0.0/8`, `fd00::/8`: an address or a network.

    An empty value admits nothing (no outbound HTTP from jobs)."""

    text: str = DEFAULT_ALLOW
    classes: frozenset[str] = frozenset({"public"})
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def parse(cls, text: str) -> HostRules:
        """ValueError, saying which entry, for anything not of the grammar."""
        classes: set[str] = set()
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in (e.strip().lower() for e in text.split(",")):
            if not entry:
                continue
            if "://" in entry:
                raise ValueError(f"{entry!r} is a URL, not a host rule: give its host alone")
            if entry == ALLOW_ALL:
                classes.update(CLASSES)
            elif entry in CLASSES:
                classes.add(entry)
            elif "/" in entry or ":" in entry or re.fullmatch(r"[0-9.]+", entry):
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError:
                    raise ValueError(f"{entry!r} is not an address or network") from None
            elif _NAME_RULE.fullmatch(entry):
                if entry.startswith("*."):
                    suffixes.append(entry[1:])
                else:
                    names.add(entry)
            else:
                raise ValueError(
                    f"{entry!r} is not a host rule: give {', '.join(CLASSES)}, '*', "
                    "a host name, '*.' and a domain, an address or a network"
                )
        return cls(text, frozenset(classes), frozenset(names), tuple(suffixes), tuple(networks))

    def admits(self, host: Host) -> bool:
        if host.kind in self.classes or host.name in self.names:
            return True
        if any(host.name.endswith(s) for s in self.suffixes):
            return True
        return host.ip is not None and any(
            host.ip.version == n.version and host.ip in n for n in self.networks
        )

    def refusal(self, url: str) -> str | None:
        """Why `url` may not be fetched (None: it may), read by d1queue's own
        parser (`parse_host`: ASCII hosts only). The reason names only what
        the URL itself says, never what a target answered."""
        if _FORBIDDEN_URL_CHARS.search(url):
            return "the URL holds spaces, control characters or backslashes"
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 -- raises for a port that is not a number in range
            if not _BRACKETS.fullmatch(parts.netloc.rpartition("@")[2]):
                # urlsplit reads `[::1].` or `x[::1]` as ::1; WHATWG refuses both.
                raise ValueError("the host is not a valid IPv6 address")
            host = parse_host(parts.hostname or "")
        except ValueError as exc:
            return str(exc)
        if parts.scheme not in ("http", "https"):
            return "only http and https URLs are fetched"
        if not self.admits(host):
            return f"{host.kind} host {host.name} is not allowed by D1QUEUE_HTTP_ALLOW"
        return None

    def target(self, url: str, base: str | None = None, read: UrlReader | None = None) -> str:
        """The URL to send for `url` (a redirect's Location resolved against
        `base`): as `read`, the runtime's URL parser, writes it, and checked
        on that reading, so the host checked is the host connected to.
        ValueError, saying why, for a URL these rules refuse."""
        if _FORBIDDEN_URL_CHARS.search(url):
            # Refused before the runtime reads it: WHATWG strips tabs and
            # newlines and reads `\\` as `/`, so a URL holding one says
            # something else to a reader of the job than to fetch.
            raise ValueError("the URL holds spaces, control characters or backslashes")
        resolved = (read or plain_url)(url, base)
        reason = self.refusal(resolved)
        if reason is not None:
            raise ValueError(reason)
        return resolved


class UrlReader(Protocol):
    """A URL parser: `read(url, base)` is `url` (resolved against `base`
    when given) as the parser writes it; ValueError when it reads no URL."""

    def __call__(self, url: str, base: str | None = None, /) -> str: ...


def plain_url(url: str, base: str | None = None, /) -> str:
    """The reader used where no runtime reads URLs (a drain under CPython):
    the URL as given, a relative one resolved with urljoin. The check that
    follows refuses any host that is not ASCII, which Python cannot read as
    the runtime would."""
    return url if base is None else urljoin(base, url)


def parse_services(text: str) -> frozenset[str]:
    """D1QUEUE_HTTP_SERVICES: the service bindings a job may send through,
    comma-separated (none by default)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if not SERVICE_RULE.fullmatch(name):
            raise ValueError(f"{name!r} is not a binding name")
    return frozenset(names)


@dataclass(frozen=True)
class Outbound:
    """The deployment's outbound rules, from Config (http_allow, http_services)."""

    hosts: HostRules = field(default_factory=HostRules)
    services: frozenset[str] = frozenset()


def clean_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers a job may send (DROPPED_HEADER removed)."""
    return {k: v for k, v in headers.items() if not DROPPED_HEADER.fullmatch(k.strip())}


# -- sending -----------------------------------------------------------------------


class RawResponse(Protocol):
    """What the Worker's fetch (`drain(fetch=...)`) answers: the status, a
    header by name, and the body read up to a limit (`read`) or whole
    (`text`, for test doubles only: a Worker's fetch must offer `read`)."""

    status: int

    def header(self, name: str) -> str | None: ...


Http = Callable[..., Awaitable[Any]]
"""The Worker's fetch: `http(url, *, method, headers, body, service, env)`,
sending one request without following redirects. It may also offer
`read_url(url, base)` (a UrlReader): the runtime's own reading of a URL,
which `send` then checks and sends; without one, `plain_url`."""


class Reply:
    """An answer as a handler sees it: `status`, `header(name)`, `url` (where
    it came from, after redirects) and the body, read at most `limit` bytes
    (`read`, `text`); the rest is never read."""

    def __init__(self, raw: Any, url: str) -> None:
        self._raw = raw
        self.status = int(raw.status)
        self.url = url
        self._body: bytes | None = None
        self.truncated = False
        """Whether the body went past the limit it was read with (or its
        Content-Length said it would, and it was not read at all)."""

    def header(self, name: str) -> str | None:
        header = getattr(self._raw, "header", None)  # a test double may have none
        value = None if header is None else header(name)
        return None if value is None else str(value)

    async def read(self, limit: int = MAX_RESPONSE_BYTES) -> bytes:
        """At most `limit` bytes of the body: none at all when Content-Length
        says it is longer (a target may answer with any size; the isolate has
        128 MB), else up to the limit, the rest of the stream cancelled."""
        if self._body is not None:
            return self._body
        length = self.header("content-length")
        if length is not None and length.strip().isdigit() and int(length) > limit:
            self.truncated = True
            self._body = b""
            await self.cancel()
            return self._body
        if hasattr(self._raw, "read"):
            data = bytes(await self._raw.read(limit + 1))
        else:  # a test double's whole text
            data = str(await self._raw.text()).encode()
        self.truncated = len(data) > limit
        self._body = data[:limit]
        return self._body

    async def text(self, limit: int = MAX_RESPONSE_BYTES) -> str:
        """The body as text (invalid UTF-8 replaced), at most `limit` bytes of it."""
        return (await self.read(limit)).decode("utf-8", "replace")

    async def cancel(self) -> None:
        """Leave the body unread (a redirect's, or one too long)."""
        cancel = getattr(self._raw, "cancel", None)
        if cancel is not None:
            await cancel()


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def cross_origin_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers that follow a redirect to another origin (CROSS_ORIGIN_HEADERS)."""
    return {k: v for k, v in headers.items() if k.strip().lower() in CROSS_ORIGIN_HEADERS}


def _note(name: str, **fields: Any) -> None:
    """One JSON line in the deployment's own log (never in a job's error)."""
    event(log, f"d1queue.outbound.{name}", logging.WARNING, **fields)


async def send(
    http: Http,
    rules: Outbound,
    url: str,
    *,
    method: str,
    headers: Mapping[str, str],
    body: str | None,
    service: str | None,
    env: Any,
    spend: Callable[[SubrequestKind], None] | None = None,
) -> Reply:
    """Send a request under the deployment's rules, following redirects.

    `spend(kind)` is called before each request goes out ("fetch" or
    "binding"): a redirect costs a subrequest as the first request did.
    Raises OutboundRefused for a target the rules refuse, at any hop."""
    headers, first = clean_headers(headers), url
    read: UrlReader = getattr(http, "read_url", None) or plain_url
    if service is not None:
        if service not in rules.services or env is None or getattr(env, service, None) is None:
            # Whether the name is unlisted or missing is the operator's to
            # know: a stored error that told them apart would let a job probe
            # which bindings this Worker has.
            listed = service in rules.services
            _note("refused", service=service, why="missing" if listed else "not listed")
            raise OutboundRefused(
                f"service binding {service!r} is not available to jobs (D1QUEUE_HTTP_SERVICES)"
            )
    else:
        try:
            url = rules.hosts.target(url, read=read)
        except ValueError as exc:
            raise OutboundRefused(f"{strip_credentials(url)}: refused: {exc}") from None
    for hop in range(MAX_REDIRECTS + 1):
        if spend is not None:
            spend("binding" if service else "fetch")
        raw = await http(url, method=method, headers=headers, body=body, service=service, env=env)
        reply = Reply(raw, url)
        location = reply.header("location") if reply.status in REDIRECTS else None
        if location is None:
            return reply
        await reply.cancel()
        if hop == MAX_REDIRECTS:
            break
        location = location.strip()
        if service is not None and urlsplit(location).netloc:
            service = None  # an absolute Location leaves the binding for the Internet
        if service is None:
            try:
                target = rules.hosts.target(location, base=url, read=read)
            except ValueError as exc:
                # The Location is the target's own words: logged for the
                # operator, never stored where the job's pusher can read it.
                _note("refused", redirect_from=strip_credentials(url), why=str(exc))
                raise OutboundRefused(
                    f"{method} {strip_credentials(url)} redirected to a target "
                    "D1QUEUE_HTTP_ALLOW refuses"
                ) from None
            if _origin(target) != _origin(url):
                headers = cross_origin_headers(headers)
        else:
            target = urljoin(url, location)
        if reply.status == 303 or (reply.status in (301, 302) and method == "POST"):
            method, body = ("HEAD" if method == "HEAD" else "GET"), None
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        url = target
    raise OutboundRefused(f"more than {MAX_REDIRECTS} redirects from {strip_credentials(first)}")
