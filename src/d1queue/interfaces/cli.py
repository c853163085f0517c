"""`d1queue` (or `python -m d1queue`): a Worker of one's own, with d1queue in it.

    d1queue migrations copy [DIR] [--force]   # d1queue's migrations into DIR (./migrations)
    d1queue migrations path                   # where the wheel keeps them
    d1queue dev [--root DIR] [--port 8787] [--plan free|paid] [host options]
                                              # serve a Worker offline, with its crons

`copy` puts the migrations the installed d1queue ships into the Worker's
migrations folder, where `wrangler d1 migrations apply` finds them (its
default folder, next to wrangler.toml), so nobody points wrangler into
site-packages. It says what it did to each file: copied (new), unchanged
(already the same), or kept (DIR holds a file of that name with other
content; it is never overwritten unless `--force`, and then it says so).
Other files in DIR, the Worker's own migrations, are left alone.
Exit status 1 when a differing file was kept, 2 for a usage error.

`dev` serves the Worker in DIR (its wrangler.toml, or --config FILE) with
d1queue's offline host, as `make dev` serves this repository's: the upload
built from its pyproject.toml (the installed d1queue vendored in), d1queue's
migrations copied into its migrations folder when missing (as `copy` does;
a kept file is said, and the start goes on), the folder applied to a local
D1 in DIR/.wrangler/state, and its crons run every minute. Other options go to
the host as they are: --fresh, --persist-to DIR, --var NAME=VALUE,
--d1-fault RATE, --d1-latency-ms N, --no-limits, --cpu warn,
--consumer-lanes N, ... (d1queue's docs/offline-host.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TextIO

from . import devhost
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


def _exec(run: devhost.Launch) -> NoReturn:
    """Become the host: a signal (Ctrl-C, a SIGTERM) reaches it with nobody between."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(run.argv[0], run.argv, run.env)


def _dev(
    args: argparse.Namespace,
    passed: list[str],
    out: TextIO,
    err: TextIO,
    run: Callable[[devhost.Launch], int],
) -> int:
    def say(line: str) -> None:
        err.write(f"d1queue dev: {line}\n")

    root = args.root.resolve()
    config = args.config.resolve() if args.config else root / "wrangler.toml"
    if not config.is_file():
        say(f"no {config.name} in {config.parent}: --root names the Worker's folder")
        return 2
    try:
        folders = devhost.d1queue_migrations_dirs(config)
        if not folders:
            say(f"{config} has no D1 database d1queue uses (D1QUEUE_SHARDS, default DB)")
    except devhost.DevHostError as e:
        say(f"{e}; d1queue's migrations not copied")
        folders = []
    for folder in folders:  # quiet when every file is already there and the same
        done = copy_migrations(folder)
        copied = sum(1 for item in done if item.action == "copied")
        if copied:
            say(f"copied {copied} of d1queue's migrations into {folder}")
        for item in done:
            if item.action == "kept":
                say(
                    f"{folder / item.name}: KEPT: it differs from d1queue's; the host applies"
                    " it as it is (d1queue migrations copy --force replaces it)"
                )
    if not devhost.has_token(root, passed):
        say(
            f"no D1QUEUE_TOKEN in {root / '.dev.vars'}: the API and the dashboard refuse"
            " everyone until there is one (echo D1QUEUE_TOKEN=... > .dev.vars)"
        )
    try:
        files = devhost.shipped_tree()
        folder = devhost.prepare(files, os.environ, say)
        launch = devhost.launch(
            folder,
            root=root,
            port=args.port,
            plan=args.plan,
            config=args.config.resolve() if args.config else None,
            passed=passed,
            env=os.environ,
        )
    except devhost.DevHostError as e:
        say(str(e))
        return 1
    return run(launch)


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(text)
    return port


def main(
    argv: list[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    run: Callable[[devhost.Launch], int] = _exec,
) -> int:
    """The command line; `run` starts the host `dev` prepared (by default,
    this process becomes it)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    parser = argparse.ArgumentParser(
        prog="d1queue",
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
    dev = commands.add_parser(
        "dev",
        help="serve a Worker of one's own offline: its crons, a local D1, the plan's limits",
        description="Serve the Worker in --root offline with d1queue's host. Options not"
        " listed here go to the host: --fresh, --persist-to DIR, --var NAME=VALUE,"
        " --d1-fault RATE, --no-limits, ... (d1queue's docs/offline-host.md).",
        allow_abbrev=False,  # an abbreviation of a host option would be taken for one of these
    )
    dev.add_argument("--root", type=Path, default=Path("."), help="the Worker's folder (.)")
    dev.add_argument("--port", type=_port, default=8787, help="8787; 0 takes a free one")
    dev.add_argument("--plan", choices=("free", "paid"), default="paid", help="whose limits")
    dev.add_argument("--config", type=Path, help="the wrangler.toml (--root's)")
    args, passed = parser.parse_known_args(argv)
    if args.topic == "dev":
        return _dev(args, passed, out, err, run)
    if passed:
        parser.error(f"unrecognized arguments: {' '.join(passed)}")
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
