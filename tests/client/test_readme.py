"""client/README.md stays true: its example runs, its tables match the code."""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys

import npu_client
import npu_protocol as p
from npu_client import npuctl
from tests.client.peer import Peer

README = pathlib.Path(__file__).parents[2] / "client" / "README.md"


def _section(name: str) -> str:
    text = README.read_text()
    match = re.search(rf"<!-- begin {name} -->\n(.*?)<!-- end {name} -->", text, re.DOTALL)
    assert match, f"README section {name!r} is missing"
    return match.group(1)


def test_the_first_example_runs_as_written(peer: Peer) -> None:
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert example
    result = subprocess.run(
        [sys.executable, "-c", example.group(1)],
        env={**os.environ, "NPUD_SOCKET": peer.path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "b'hello'\n", "")


def test_the_error_table_is_the_registry() -> None:
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| `(\w+)` \|$", _section("error classes"), re.M)
    documented = {int(code): (name, cls) for code, name, cls in rows}
    actual = {
        int(code): (p.ErrorCode(code).name, cls.__name__)
        for code, cls in npu_client.ERROR_CLASSES.items()
    }
    assert documented == actual


def test_the_status_keys_are_the_record_fields() -> None:
    table = _section("status keys")
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.M))
    assert list(rows) == list(p.DaemonStatus.__struct_fields__)
    nested = {
        "dsp": p.DspCapabilities,
        "shell": p.ShellStatus,
        "totals": p.Totals,
        "clients": p.ClientRow,
    }
    for key, record in nested.items():
        fields = []
        for field in record.__struct_fields__:
            fields.append(field)
            if record is p.ClientRow and field == "models":  # its models' keys follow
                fields += list(p.ModelRow.__struct_fields__)
            if record is p.ClientRow and field == "held":  # and so do its holds'
                fields += list(p.HoldRow.__struct_fields__)
        assert re.findall(r"`(\w+)`", rows[key]) == fields, key


def test_the_usage_block_names_every_npuctl_command() -> None:
    parser = npuctl.build_parser()
    commands = next(
        action
        for action in parser._actions  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction)
    )
    usage = README.read_text().split("## npuctl\n\n```\n", 1)[1].split("```", 1)[0]
    for name in commands.choices:
        assert f"] {name}" in usage, f"npuctl {name} is missing from client/README.md"
        assert f"`npuctl {name}" in README.read_text(), f"npuctl {name} is not described"
