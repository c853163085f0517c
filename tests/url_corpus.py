"""Spellings of URLs whose host a parser might read otherwise than the
runtime's (WHATWG) parser: numeric IPv4 forms, IPv6 forms, IDNA edge cases,
code points current Unicode drops or maps to digits, percent-encoded
Unicode, trailing dots. Shared by the CPython property test (against Node's
parser) and the runtime one (inside the Worker, against workerd's).

`verdict` is the reference: the rules applied to the host the runtime
itself read (its canonical href), never to the raw spelling."""

from __future__ import annotations

import ipaddress
import random
from urllib.parse import quote, urlsplit

from d1queue.core.outbound import Host, HostRules, ip_class, parse_host

ADDRESSES = ["127.0.0.1", "10.0.0.1", "169.254.169.254", "0.0.0.0", "192.168.1.1", "8.8.8.8"]

DROPPED = ["\u00ad", "\u034f", "\u180b", "\u180f", "\u200b", "\u200c", "\u200d", "\u2060"]
DROPPED += ["\u2064", "\ufe0f", "\ufeff", "\U000e0100"]
"""Ignored by current UTS 46 (some unassigned in Unicode 3.2, as U+2064 and
U+180F are): the runtime's IDNA removes them from a host."""

DIGITS = [
    "0123456789",
    "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19",  # full-width
    "".join(chr(0x1FBF0 + i) for i in range(10)),  # segmented digits (Unicode 13)
    "".join(chr(0x1D7CE + i) for i in range(10)),  # mathematical bold
    "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079",  # superscripts
    "\u24ea\u2460\u2461\u2462\u2463\u2464\u2465\u2466\u2467\u2468",  # circled
    "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669",  # Arabic-Indic
]
DOTS = [".", "\u3002", "\uff0e", "\uff61"]

NAMES = [
    "example.com",
    "EXAMPLE.COM.",
    "m\u00fcnchen.de",
    "M\u00dcNCHEN.DE",
    "xn--mnchen-3ya.de",
    "xn--zz.com",
    "xn--abc.com",
    "fa\u00df.de",
    "localhost",
    "localhost.",
    "LOCALHOST",
    "\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54",  # full-width
    "\u24db\u24de\u24d2\u24d0\u24db\u24d7\u24de\u24e2\u24e3",  # circled
    "api.localhost",
    "a..b.com",
    "a!b.com",
    "a_b.com",
    "metadata.google.internal",
    "printer.local",
    "intranet",
    "ex%41mple.com",
    "%6c%6f%63%61%6c%68%6f%73%74",
    "\u0131ocalhost",
    "\u212a.example.com",  # KELVIN SIGN, maps to k
    "\ufb01.example.com",  # ligature fi
]

IPV6 = [
    "[::1]",
    "[0:0:0:0:0:0:0:1]",
    "[::ffff:127.0.0.1]",
    "[::FFFF:7F00:1]",
    "[::127.0.0.1]",
    "[64:ff9b::a00:1]",
    "[2002:a00:1::]",
    "[fe80::1]",
    "[fe80::1%25eth0]",
    "[2606:4700::1111]",
    "[2606:4700::1111%25x]",
    "[::]",
    "[%3a%3a1]",
    "[::1].",
    "[1::2::3]",
]


def ipv4_forms(address: str) -> list[str]:
    """Every numeric spelling WHATWG reads as `address`."""
    a, b, c, d = (int(x) for x in address.split("."))
    n = int(ipaddress.IPv4Address(address))
    forms = [
        address,
        str(n),
        hex(n),
        "0X" + format(n, "X"),
        "0" + format(n, "o"),
        f"{a}.{n & 0xFFFFFF}",
        f"{a}.{b}.{n & 0xFFFF}",
        ".".join(hex(x) for x in (a, b, c, d)),
        ".".join("0" + format(x, "o") for x in (a, b, c, d)),
        f"{hex(a)}.{b}.0{c:o}.{d}",
        address + ".",
        address + "..",
        "".join(f"%{ord(ch):02X}" for ch in address),
        f"{a}.{b}.{c}.{d}.0",
        f"{a}.{b}.{c}.{d + 256}",
        f"0x.{n & 0xFFFFFF}" if a == 0 else f"{a}.0x",
    ]
    return forms


def _mapped(address: str, digits: str, dot: str) -> str:
    return "".join(dot if ch == "." else digits[int(ch)] for ch in address)


def hosts(seed: int = 20261205, extra: int = 600) -> list[str]:
    """The corpus of hosts: every form above, each with dropped code points
    inserted raw and percent-encoded, and `extra` random mixtures."""
    out: list[str] = []
    for address in ADDRESSES:
        out += ipv4_forms(address)
        for digits in DIGITS[1:]:
            for dot in DOTS:
                out.append(_mapped(address, digits, dot))
            out.append(address[:-1] + digits[int(address[-1])])
            out.append(address[:-1] + quote(digits[int(address[-1])], safe=""))
        for ch in DROPPED:
            out += [address + ch, ch + address, address.replace(".", ch + ".", 1)]
            out.append(address + quote(ch, safe=""))
    out += NAMES + IPV6
    for name in ("localhost", "example.com"):
        for ch in DROPPED[:4]:
            out += [name + ch, name[:2] + ch + name[2:], name + quote(ch, safe="")]
    rng = random.Random(seed)
    pieces = [*DROPPED, *DOTS, "%", "%2e", "%E2%81%A4", "0x", "0", "1", "7f", "x", "-", "xn--"]
    for _ in range(extra):
        base = rng.choice([*ADDRESSES, "localhost", "example.com", "10.1"])
        chars = list(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randint(0, len(chars))
            piece = rng.choice(pieces)
            if rng.random() < 0.3 and not piece.isascii():
                piece = quote(piece, safe="")
            chars.insert(at, piece)
        if rng.random() < 0.3:
            chars = [
                rng.choice(DIGITS[1:])[int(c)] if c.isdigit() and rng.random() < 0.5 else c
                for c in chars
            ]
        out.append("".join(chars))
    return list(dict.fromkeys(out))


def urls(seed: int = 20261205, extra: int = 600) -> list[str]:
    """The corpus of URLs: each host bare, with a port and with userinfo."""
    out: list[str] = []
    for i, host in enumerate(hosts(seed, extra)):
        out.append(f"http://{host}/x")
        if i % 3 == 0:
            out.append(f"https://user:pw@{host}:8080/")
    out += ["http:127.0.0.1/", "http:/127.0.0.1/", "http:///127.0.0.1/", "HTTP://127.1"]
    return out


REDIRECTS = [
    ("http://example.com/a", "//127.0.0.1\u2064/"),
    ("http://example.com/a", "//127.0.0.1%E2%81%A4:8080/"),
    ("http://example.com/a", "/b"),
    ("http://example.com/a", "//169.254.169.254\u180f/"),
    ("http://example.com/a", "http:127.0.0.1/"),
    ("http://example.com/a", "//10.0.0.\U0001fbf1/"),
    ("http://example.com/a", "https://m\u00fcnchen.de/"),
]
"""(base, Location) pairs: a redirect's target is read against its base."""


def verdict(rules: HostRules, href: str | None) -> bool:
    """Whether `rules` admit the host the runtime read (`href`, its
    canonical serialization of the URL; None: it read no URL)."""
    if href is None:
        return False
    parts = urlsplit(href)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    try:
        ip = ipaddress.ip_address(parts.hostname)
    except ValueError:
        return rules.admits(parse_host(parts.hostname))
    return rules.admits(Host(str(ip), ip, ip_class(ip)))
