"""Every shell script in the repository is shellcheck clean, in one run.

A shell script is a ``*.sh`` file, a file whose first line runs bash or sh
(``.ci/run``, the skels' helpers), or a bash completion script (which says
``# shellcheck shell=bash``). shellcheck comes from Debian's ``shellcheck``
package: `make test` installs it as root (tests/tools.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Final

from tests.scripts.snapshots import REPO
from tests.tools import require_tool

_SKIP_DIRS: Final = frozenset({".venv", ".git", "node_modules", "build", "__pycache__"})
_VISIBLE_DOT_DIRS: Final = frozenset({".ci"})
_SHEBANG: Final = re.compile(rb"#!\s*(/usr/bin/env\s+)?(/usr)?(/bin/)?(bash|sh)\b")
_DIRECTIVE: Final = re.compile(rb"^# shellcheck shell=(bash|sh)\b", re.MULTILINE)


def _searched(path: Path) -> bool:
    for part in path.relative_to(REPO).parts[:-1]:
        if part in _SKIP_DIRS or (part.startswith(".") and part not in _VISIBLE_DOT_DIRS):
            return False
    return True


def _is_shell_script(path: Path) -> bool:
    if path.suffix == ".sh":
        return True
    with open(path, "rb") as file:
        head = file.read(512)
    return bool(_SHEBANG.match(head) or _DIRECTIVE.search(head))


def shell_scripts() -> list[Path]:
    return sorted(
        path
        for path in REPO.rglob("*")
        if path.is_file() and not path.is_symlink() and _searched(path) and _is_shell_script(path)
    )


def test_every_kind_of_script_is_found() -> None:
    names = {path.relative_to(REPO).as_posix() for path in shell_scripts()}
    expected = {
        "scripts/deploy_npu.sh",
        "scripts/install.sh",
        "scripts/test-deps.sh",
        "config/portal-npu.sh",
        "docker/build_skel.sh",
        ".ci/run",
    }
    assert expected <= names, expected - names
    assert not any(name.endswith((".py", ".c", ".md")) for name in names), names


def test_shellcheck_clean() -> None:
    shellcheck = require_tool("shellcheck", "shellcheck")
    scripts = shell_scripts()
    result = subprocess.run(
        [shellcheck, "--external-sources", "--severity=style", *map(str, scripts)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
