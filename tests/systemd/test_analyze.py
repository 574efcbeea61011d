"""The units as systemd itself judges them: `systemd-analyze verify` and `security`.

`systemd-analyze` comes with Debian's `systemd` package (`make test` installs
it as root; tests/tools.py says what happens without it).

`verify` checks that every Exec*= binary exists. The unit names the venv the
install script creates on the laptop (/opt/npud/venv/bin/npud), which does not
exist here, so the clean run verifies a copy whose ExecStart= points at an
executable stand-in, changing that one path and nothing else; a second test
proves that the missing binary is the only thing verify says about the
original files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.systemd.units import SERVICE, SOCKET, read_unit
from tests.tools import require_tool

EXPOSURE_LIMIT = 2.0
_EXPOSURE = re.compile(r"Overall exposure level for npud\.service: (\d+(?:\.\d+)?)")


@pytest.fixture
def systemd_analyze() -> str:
    return require_tool("systemd-analyze", "systemd")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(
        argv, capture_output=True, text=True, errors="replace", env=env, check=False, timeout=60
    )


def _exec_start_binary() -> str:
    return read_unit(SERVICE).value("Service", "ExecStart").split()[0]


def test_security_exposure_is_at_most_2(systemd_analyze: str) -> None:
    result = _run([systemd_analyze, "security", "--offline=true", "--no-pager", str(SERVICE)])
    output = result.stdout + result.stderr
    match = _EXPOSURE.search(output)
    assert match, f"no exposure line in systemd-analyze output:\n{output}"
    exposure = float(match[1])
    assert exposure <= EXPOSURE_LIMIT, f"exposure {exposure} > {EXPOSURE_LIMIT}:\n{output}"


def test_exposure_measures_the_hardening(systemd_analyze: str, tmp_path: Path) -> None:
    # The parse above would pass on a missing number; check that a unit stripped
    # of its hardening really scores worse, so the number measures something.
    weak = tmp_path / "npud.service"
    kept = [
        line
        for line in SERVICE.read_text(encoding="utf-8").splitlines()
        if not line.startswith(("Protect", "Private", "Restrict", "SystemCall", "Capability"))
    ]
    weak.write_text("\n".join(kept) + "\n", encoding="utf-8")
    result = _run([systemd_analyze, "security", "--offline=true", "--no-pager", str(weak)])
    match = _EXPOSURE.search(result.stdout + result.stderr)
    assert match
    assert float(match[1]) > EXPOSURE_LIMIT


def test_verify_is_clean(systemd_analyze: str, tmp_path: Path) -> None:
    stand_in = tmp_path / "bin" / "npud"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    stand_in.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    original = _exec_start_binary()
    text = SERVICE.read_text(encoding="utf-8")
    assert text.count(f"ExecStart={original} ") == 1
    (units / SERVICE.name).write_text(
        text.replace(f"ExecStart={original} ", f"ExecStart={stand_in} "), encoding="utf-8"
    )
    shutil.copy(SOCKET, units / SOCKET.name)
    result = _run([systemd_analyze, "verify", str(units / SOCKET.name), str(units / SERVICE.name)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""


def test_verify_objects_only_to_the_missing_venv(systemd_analyze: str) -> None:
    binary = _exec_start_binary()
    result = _run([systemd_analyze, "verify", str(SOCKET), str(SERVICE)])
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    if Path(binary).exists():
        assert result.returncode == 0, lines
        assert lines == []
    else:
        assert lines, "verify accepted a unit whose ExecStart binary does not exist"
        assert all(f"Command {binary} is not executable" in line for line in lines), lines
