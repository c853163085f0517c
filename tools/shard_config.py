"""wrangler.toml with N D1 databases as shards, and the D1 bindings of a config.

The shipped wrangler.toml has one D1 database (binding DB, shard 0). A
sharded deployment adds `[[d1_databases]]` entries DB_1, DB_2, ... with the
same migrations_dir and lists them in `D1QUEUE_SHARDS` (docs/operations.md, "Shards").
This writes that file for N shards, as wrangler.shards.toml beside
wrangler.toml (paths in it stay relative to the same folder): what
`make dev SHARDS=4`, `make check-wrangler`, the runtime tests and the bench
run. Local database ids are placeholders (Miniflare keys its state by them);
for a deployment, `npx wrangler d1 create` each and put their ids in.

    python tools/shard_config.py --shards 3            # print it
    python tools/shard_config.py --shards 3 --write    # write wrangler.shards.toml
    python tools/shard_config.py --shards 3 --wake --write   # wake-ups on too
    python tools/shard_config.py --bindings [--config F]     # F's D1 bindings, one a line
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script, tools/ is sys.path[0]
    sys.path.insert(0, str(REPO))

from tools.wake_config import wake_toml, write_beside  # noqa: E402

OUTPUT = "wrangler.shards.toml"


def binding(shard: int) -> str:
    """Shard i's binding name: DB for 0, DB_<i> after it."""
    return "DB" if shard == 0 else f"DB_{shard}"


def shards_toml(text: str, shards: int, *, wake: bool = False) -> str:
    """`text` (wrangler.toml) with `shards` D1 databases and D1QUEUE_SHARDS
    naming them; with `wake`, its wake-up block turned on as well."""
    if not 1 <= shards <= 100:
        raise ValueError("shards must be 1 to 100")
    if wake:
        text = wake_toml(text)
    config = tomllib.loads(text)
    (first,) = config["d1_databases"]
    blocks = []
    for i in range(1, shards):
        blocks.append(
            "\n".join(
                [
                    "[[d1_databases]]",
                    f'binding = "{binding(i)}"',
                    f'database_name = "{first["database_name"]}-{i}"',
                    f'database_id = "00000000-0000-0000-0000-{i:012d}"',
                    # wrangler's default (migrations/) unless the first names another
                    *(
                        [f'migrations_dir = "{first["migrations_dir"]}"']
                        if "migrations_dir" in first
                        else []
                    ),
                ]
            )
        )
    names = ",".join(binding(i) for i in range(shards))
    out = re.sub(r"(?m)^\[triggers\]", "\n\n".join([*blocks, "[triggers]"]), text, count=1)
    out = re.sub(r"(?m)^\[vars\]\n", f'[vars]\nD1QUEUE_SHARDS = "{names}"\n', out, count=1)
    return out if out.endswith("\n") else out + "\n"


def bindings(path: Path) -> list[str]:
    """The D1 bindings a wrangler config declares, in order."""
    config = tomllib.loads(path.read_text())
    return [str(d["binding"]) for d in config.get("d1_databases", [])]


def write(root: Path, shards: int, *, wake: bool = False, name: str = OUTPUT) -> Path:
    """Write root/wrangler.shards.toml, or root/`name`; returns its path."""
    text = shards_toml((root / "wrangler.toml").read_text(), shards, wake=wake)
    return write_beside(root, name, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--wake", action="store_true", help="turn the wake-up block on too")
    parser.add_argument("--write", action="store_true", help=f"write {OUTPUT} beside wrangler.toml")
    parser.add_argument("--bindings", action="store_true", help="list --config's D1 bindings")
    parser.add_argument("--config", type=Path, help="the config --bindings reads")
    args = parser.parse_args(argv)
    if args.bindings:
        print("\n".join(bindings(args.config or args.root / "wrangler.toml")))
    elif args.write:
        print(write(args.root, args.shards, wake=args.wake))
    else:
        text = (args.root / "wrangler.toml").read_text()
        sys.stdout.write(shards_toml(text, args.shards, wake=args.wake))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
