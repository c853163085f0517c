"""`python -m d1queue`: d1queue's migrations for a Worker of one's own.

    python -m d1queue migrations copy [DIR] [--force]   # into DIR (./migrations)
    python -m d1queue migrations path                   # where the wheel keeps them

`copy` puts the migrations the installed d1queue ships into the Worker's
migrations folder, where `wrangler d1 migrations apply` finds them (its
default folder, next to wrangler.toml), so nobody points wrangler into
site-packages. It says what it did to each file: copied (new), unchanged
(already the same), or kept (DIR holds a file of that name with other
content; it is never overwritten unless `--force`, and then it says so).
Other files in DIR, the Worker's own migrations, are left alone.
Exit status 1 when a differing file was kept, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .testing import MIGRATIONS


@dataclass(frozen=True)
class Copied:
    """What `copy_migrations` did to one file: `action` is "copied",
    "unchanged", "kept" (differs; left as it was) or "replaced" (--force)."""

    name: str
    action: str


def copy_migrations(
    target: Path, *, force: bool = False, source: Path = MIGRATIONS
) -> list[Copied]:
    """Copy `source`'s *.sql files into `target` (made if missing), in name
    order; a file of the same name with other content is kept unless
    `force`."""
    target.mkdir(parents=True, exist_ok=True)
    done = []
    for path in sorted(source.glob("*.sql")):
        dest = target / path.name
        if not dest.exists():
            shutil.copyfile(path, dest)
            done.append(Copied(path.name, "copied"))
        elif dest.read_bytes() == path.read_bytes():
            done.append(Copied(path.name, "unchanged"))
        elif force:
            shutil.copyfile(path, dest)
            done.append(Copied(path.name, "replaced"))
        else:
            done.append(Copied(path.name, "kept"))
    return done


_SAID = {
    "copied": "copied",
    "unchanged": "unchanged (already the same)",
    "replaced": "REPLACED: it differed from d1queue's; --force overwrote it",
    "kept": "KEPT: it differs from d1queue's and was not overwritten (--force replaces it)",
}


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    parser = argparse.ArgumentParser(
        prog="python -m d1queue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="topic", required=True)
    migrations = commands.add_parser("migrations", help="d1queue's D1 migrations")
    actions = migrations.add_subparsers(dest="action", required=True)
    copy = actions.add_parser("copy", help="copy them into a Worker's migrations folder")
    copy.add_argument(
        "dir", nargs="?", type=Path, default=Path("migrations"), help="default: ./migrations"
    )
    copy.add_argument("--force", action="store_true", help="overwrite files that differ")
    actions.add_parser("path", help="print the folder the installed d1queue keeps them in")
    args = parser.parse_args(argv)
    if args.action == "path":
        out.write(f"{MIGRATIONS}\n")
        return 0
    done = copy_migrations(args.dir, force=args.force)
    for item in done:
        out.write(f"{args.dir / item.name}: {_SAID[item.action]}\n")
    counts = {a: sum(1 for d in done if d.action == a) for a in _SAID}
    summary = ", ".join(f"{n} {a}" for a, n in counts.items() if n)
    out.write(f"d1queue migrations into {args.dir}: {summary or 'none shipped'}\n")
    if counts["copied"] or counts["replaced"]:
        out.write("next: npx wrangler d1 migrations apply <database> (--local or --remote)\n")
    return 1 if counts["kept"] else 0
