"""client/README.md stays true: its example runs, its tables match the code."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import npu_client
import npu_protocol as p
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
        fields = list(record.__struct_fields__)
        if record is p.ClientRow:  # its models' keys follow `models`
            fields += list(p.ModelRow.__struct_fields__)
        assert re.findall(r"`(\w+)`", rows[key]) == fields, key
