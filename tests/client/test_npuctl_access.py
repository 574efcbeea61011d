"""npuctl refused by the socket's permissions: the hint names `make run`, SOCKET= and the npu group.

A child process becomes the user nobody (as after `sudo make run`, where a
person meets a root-owned socket) and runs npuctl against a socket that
really refuses it.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from npu_client import npuctl

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory nobody may traverse (pytest's own tmp_path is private to root)."""
    with tempfile.TemporaryDirectory() as name:
        path = Path(name)
        path.chmod(0o755)
        yield path


def listening_socket(path: Path, mode: int, gid: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    os.chown(path, 0, gid)
    path.chmod(mode)
    return sock


def npuctl_as_nobody(*argv: str) -> tuple[int, str]:
    """Run npuctl.main(argv) in a child that became nobody; its exit status and stderr."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(read_end)
            sys.stderr = os.fdopen(write_end, "w")  # pytest captures the parent's
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = npuctl.main(list(argv))
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "r") as pipe:
        err = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


def test_a_root_only_socket_says_sudo_make_run_serves_root_only(public_dir: Path) -> None:
    path = public_dir / "npud.sock"
    with listening_socket(path, 0o660):
        code, err = npuctl_as_nobody("--socket", str(path), "--timeout", "5", "status")
    assert code == npuctl.EXIT_NOPERM == 77
    first, hint = err.splitlines()
    assert first.startswith(f"npuctl: cannot connect to npud at {path}: Permission denied")
    assert hint.startswith("npuctl: hint: the socket is root:root 0660: a daemon started as root")
    assert "make run" in hint
    assert "SOCKET=" in hint
    assert "export NPUD_SOCKET=" in hint
    assert "usermod -aG npu $USER" in hint


def test_a_socket_of_another_group_says_join_the_npu_group(public_dir: Path) -> None:
    path = public_dir / "npud.sock"
    with listening_socket(path, 0o660, gid=1):
        code, err = npuctl_as_nobody("--socket", str(path), "status")
    assert code == npuctl.EXIT_NOPERM == 77
    hint = err.splitlines()[-1]
    assert hint.startswith("npuctl: hint: the socket is root:")
    assert " 0660; to use the system's npud, join the npu group" in hint
    assert "SOCKET=" in hint


def test_a_closed_directory_is_named(public_dir: Path) -> None:
    closed = public_dir / "npud"
    closed.mkdir(mode=0o750)
    path = closed / "npud.sock"
    with listening_socket(path, 0o666):
        code, err = npuctl_as_nobody("--socket", str(path), "status")
    assert code == npuctl.EXIT_NOPERM == 77
    assert f"npuctl: hint: its directory {closed} is closed to you; " in err
    assert "npu group" in err


def test_no_hint_when_the_cause_is_not_permissions(public_dir: Path) -> None:
    code, err = npuctl_as_nobody("--socket", str(public_dir / "absent.sock"), "status")
    assert code == npuctl.EXIT_UNAVAILABLE == 69
    assert "No such file or directory" in err
    assert "hint" not in err
