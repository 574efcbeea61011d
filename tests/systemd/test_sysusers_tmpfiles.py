"""sysusers.d and tmpfiles.d entries applied by the real tools to a temporary root.

systemd-sysusers and systemd-tmpfiles take --root, so the users, groups and
/run/npud are created exactly as at boot, only inside tmp_path.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.systemd.units import SERVICE, SOCKET, SYSUSERS, TMPFILES, read_unit
from tests.tools import require_tool


def _tool(name: str) -> str:
    return require_tool(name, "systemd")


def _table(path: Path) -> dict[str, list[str]]:
    """name -> fields, from an /etc/passwd or /etc/group style file."""
    return {line.split(":")[0]: line.split(":") for line in path.read_text().splitlines() if line}


@pytest.fixture
def root_with_users(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        [_tool("systemd-sysusers"), f"--root={tmp_path}", str(SYSUSERS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return tmp_path


def test_sysusers_creates_the_daemon_user_and_its_groups(root_with_users: Path) -> None:
    passwd = _table(root_with_users / "etc/passwd")
    group = _table(root_with_users / "etc/group")
    service = read_unit(SERVICE)
    user = passwd[service.value("Service", "User")]
    primary = group[service.value("Service", "Group")]
    assert user[3] == primary[2], "the daemon's primary group is the clients' group"
    assert user[6].endswith("nologin")
    for name in service.value("Service", "SupplementaryGroups").split():
        assert user[0] in group[name][3].split(",")
    # Clients are let in by the socket's group; the daemon's device group must
    # not be the clients' group, or clients could open the DSP directly.
    socket_group = read_unit(SOCKET).value("Socket", "SocketGroup")
    assert socket_group in group
    assert socket_group not in service.value("Service", "SupplementaryGroups").split()


@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-tmpfiles needs root to chown")
def test_tmpfiles_creates_the_runtime_directory(root_with_users: Path) -> None:
    result = subprocess.run(
        [_tool("systemd-tmpfiles"), "--create", f"--root={root_with_users}", str(TMPFILES)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    passwd = _table(root_with_users / "etc/passwd")
    group = _table(root_with_users / "etc/group")
    info = (root_with_users / "run/npud").stat()
    assert stat.S_ISDIR(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o750
    assert info.st_uid == int(passwd["npud"][2])
    assert info.st_gid == int(group["npu"][2])
