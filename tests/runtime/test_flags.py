"""Compatibility flags and the Python they select, asked of workerd itself
(host/flags.mjs): wrangler.toml carries no unknown and no no-op flag, the
host's release table is the one in the workerd binary, and package.json pins
the Pyodide that workerd selects."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from functools import cache
from typing import Any

import pytest

from .conftest import NODE, ROOT

FLAGS = ROOT / "host" / "flags.mjs"
WORKERD = ROOT / "node_modules" / "@cloudflare" / "workerd-linux-64" / "bin" / "workerd"


def flags_cli(*args: str) -> Any:
    done = subprocess.run(
        [str(NODE), str(FLAGS), *args], capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise AssertionError(done.stderr.strip() or done.stdout)
    return json.loads(done.stdout)


@cache
def releases() -> list[dict[str, str]]:
    table: list[dict[str, str]] = flags_cli("--releases")["releases"]
    return table


def config() -> dict[str, Any]:
    return tomllib.loads((ROOT / "wrangler.toml").read_text())


def effect(answer: dict[str, Any]) -> tuple[frozenset[str], str | None]:
    """What a set of flags does to a Python Worker: the flags on, the release
    flags aside, and the one Python release workerd runs."""
    release_flags = {r["flag"] for r in releases()}
    on = frozenset(k for k, v in answer["flags"].items() if v and k not in release_flags)
    return on, (answer["release"] or {}).get("flag")


def test_the_release_table_is_workerds() -> None:
    """host/flags.mjs's table against the releases embedded in the workerd
    binary wrangler runs (pyodide_extra.capnp): a workerd upgrade that adds
    or changes a Python release fails here."""
    binary = WORKERD.read_bytes()
    start = binary.find(b"pyodide_extra.capnp:releases")
    assert start >= 0, f"no Python release table in {WORKERD}"
    embedded = {
        m[1].decode(): m[2].decode()
        for m in re.finditer(
            rb"\x00(pythonWorkers\w*)\x00+(\d[\w.]*)\x00+sha256-", binary[start : start + 4096]
        )
    }
    ours = {r["field"]: r["pyodide"] for r in releases()}
    assert embedded.pop("pythonWorkersDevPyodide", None), "the dev release moved"
    assert embedded == ours
    # The flag each release field is turned on by, from the binary's flag schema:
    # the field's name is the last identifier before its flag's name.
    for r in releases():
        flag = r["flag"].encode()
        fields = [
            re.findall(rb"[A-Za-z_0-9]{6,}", binary[max(0, m.start() - 200) : m.start()])[-1:]
            for m in re.finditer(b"\x00" + flag + b"\x00", binary)
        ]
        assert [r["field"].encode()] in fields, (
            f"{r['flag']} is not workerd's flag for {r['field']}"
        )


def test_wrangler_toml_flags_are_known_and_each_changes_something() -> None:
    date, flags = config()["compatibility_date"], list(config()["compatibility_flags"])
    assert "python_workers" in flags, "a Python Worker needs python_workers"
    # python_workers itself cannot be left out below: flags.mjs's stub implies it.
    others = [f for f in flags if f != "python_workers"]
    answers = flags_cli(
        "--date", date, *(f"--flag={f}" for f in flags),
        *(f"--also={','.join(g for g in flags if g != f)}" for f in others),
    )  # fmt: skip
    if not others:
        answers = [answers]
    asked = effect(answers[0])
    for flag, without in zip(others, answers[1:], strict=True):
        assert effect(without) != asked, (
            f"{flag} in wrangler.toml changes nothing at {date}: it is on by default, or a"
            f" newer Python release flag wins ({asked[1]}); remove it"
        )


def test_an_unknown_flag_is_refused_with_its_name() -> None:
    with pytest.raises(AssertionError, match="workerd has no compatibility flag 'python_workerz'"):
        flags_cli(
            "--date",
            config()["compatibility_date"],
            "--flag=python_workers_314",
            "--flag=python_workerz",
        )


def test_the_configuration_selects_the_pyodide_package_json_pins() -> None:
    date, flags = config()["compatibility_date"], config()["compatibility_flags"]
    answer, older = flags_cli(
        "--date", date, *(f"--flag={f}" for f in flags),
        f"--also={','.join([*flags, 'no_python_workers_314'])}",
    )  # fmt: skip
    assert answer["flags"]["python_request_headers_preserve_commas"] is True
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["pyodide"]
    installed = json.loads((ROOT / "node_modules" / "pyodide" / "package.json").read_text())
    assert answer["release"]["pyodide"] == pinned == installed["version"]
    # The newest release whose flag is on wins: without python_workers_314, 0.28.
    assert older["release"]["flag"] == "python_workers_20250116"
    assert older["release"]["pyodide"] == "0.28.2"
