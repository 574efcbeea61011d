"""No source file over 700 lines (issue 32): past that a module has more than one job.

Tables and generated files would be exempt; none is today. Tests are not held to it:
a test file is a list of cases of one thing."""

from __future__ import annotations

import subprocess
from pathlib import Path

MAX_LINES = 700
ROOT = Path(__file__).resolve().parents[2]
SOURCE = (".py", ".c", ".h", ".sh")
EXEMPT: frozenset[str] = frozenset()
"""Repository paths of tables or generated files that may be longer."""


def _sources() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [
        path
        for path in listed.split("\0")
        if path.endswith(SOURCE) and not path.startswith("tests/") and (ROOT / path).is_file()
    ]


def test_no_source_file_is_over_700_lines() -> None:
    sources = _sources()
    assert "npud/runtime/scheduler.py" in sources  # the listing sees the tree
    long = {
        path: lines
        for path in sources
        if path not in EXEMPT and (lines := (ROOT / path).read_bytes().count(b"\n")) > MAX_LINES
    }
    assert not long, f"split these by job (lines): {long}"
