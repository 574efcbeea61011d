"""Every shell script in the repository is shellcheck clean.

shellcheck comes from Debian's `shellcheck` package (.ci/run installs it);
without it the test skips and says so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.scripts.snapshots import REPO

_SKIP_DIRS = {".venv", ".git", "node_modules", "build"}


def _shell_scripts() -> list[Path]:
    found = []
    for path in sorted(REPO.rglob("*.sh")):
        parts = path.relative_to(REPO).parts
        if not any(part in _SKIP_DIRS or part.startswith(".") for part in parts[:-1]):
            found.append(path)
    return found


def test_the_deployment_scripts_are_found() -> None:
    names = {path.relative_to(REPO).as_posix() for path in _shell_scripts()}
    assert {"scripts/deploy_npu.sh", "scripts/install.sh", "config/portal-npu.sh"} <= names


@pytest.mark.parametrize("script", _shell_scripts(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_shellcheck_clean(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not found: apt-get install shellcheck")
    result = subprocess.run(
        [shellcheck, "--external-sources", str(script)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
