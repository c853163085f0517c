"""wrangler.toml with Cloudflare Queues wake-ups turned on.

The shipped wrangler.toml carries the wake-up settings commented out, each
line prefixed "# wake: " (docs/operations.md, "Wake-ups"), so `wrangler deploy` works
without a queue. This writes the same file with the prefix removed: what a
user gets by uncommenting those lines, and what `make dev WAKE=queues`, the
runtime tests and `make check-wrangler` run. Written next to wrangler.toml
(paths in it stay relative to the same folder) as wrangler.wake.toml.

    python tools/wake_config.py            # print it
    python tools/wake_config.py --write    # write wrangler.wake.toml, print its path
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREFIX = "# wake: "
OUTPUT = "wrangler.wake.toml"


def wake_toml(text: str) -> str:
    """`text` with every "# wake: " line uncommented (a bare "# wake:" is a
    blank line)."""
    out = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(PREFIX):
            out.append(stripped[len(PREFIX) :])
        elif stripped == PREFIX.rstrip():
            out.append("")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def write_beside(root: Path, name: str, text: str) -> Path:
    """Write root/`name` atomically (test sessions may race), beside
    wrangler.toml so the paths in it stay relative to the same folder."""
    target = root / name
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, target)
    return target


def write(root: Path = REPO) -> Path:
    """Write root/wrangler.wake.toml; returns its path."""
    return write_beside(root, OUTPUT, wake_toml((root / "wrangler.toml").read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO)
    parser.add_argument("--write", action="store_true", help=f"write {OUTPUT} beside wrangler.toml")
    args = parser.parse_args(argv)
    if args.write:
        print(write(args.root))
    else:
        sys.stdout.write(wake_toml((args.root / "wrangler.toml").read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
