"""Start-up failures: one line that says what and how to fix it, nothing left, and an exit
status of sysexits (64 usage, 69 unavailable, 71 system, 73 cannot create, 75 try again,
78 configuration) decided before npud logs that it is starting, wherever the command line
or the configuration decides it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from npud.ops.backend import DEV_PUBLIC_KEY, DEV_SHELL
from tests.e2e.daemon import RawPeer, start_npud


def run_npud(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "npud.daemon.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_help_explains() -> None:
    result = run_npud("--help")
    assert result.returncode == 0
    for needle in ("--backend", "emulator", "SIGHUP", "NOTIFY_SOCKET", "exit status"):
        assert needle in result.stdout


def test_bad_config_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "npud.toml"
    config.write_text("[daemon]\nsockt = '/tmp/x'\n")
    result = run_npud("--config", str(config))
    assert result.returncode == 78
    assert one_line(result) == (
        f"npud: bad configuration: {config}: unknown key daemon.sockt (did you mean socket?)"
    )


def test_a_renamed_key_starts_npud_with_a_warning_in_its_log(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, "[daemon]\nshutdown_grace = 1.0\n")
    try:
        log = daemon.log()
    finally:
        assert daemon.stop() == 0
    warnings = [line for line in log.splitlines() if "renamed configuration key" in line]
    assert len(warnings) == 1, log
    assert '"level": "warning"' in warnings[0]
    assert "daemon.shutdown_grace is now daemon.shutdown_grace_s" in warnings[0]


def test_missing_config_file(tmp_path: Path) -> None:
    result = run_npud("--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 78
    assert "cannot read: No such file or directory" in one_line(result)


def test_kernel_backend_without_a_device(tmp_path: Path) -> None:
    if any(Path(n).exists() for n in ("/dev/fastrpc-cdsp", "/dev/fastrpc-cdsp-secure")):
        pytest.skip("this machine has the device")
    result = run_npud("--backend", "kernel", "--socket", str(tmp_path / "s"))
    assert result.returncode == 69
    line = one_line(result)
    assert line.startswith(
        "npud: no FastRPC device node (/dev/fastrpc-cdsp-secure, /dev/fastrpc-cdsp)"
    )
    assert "--backend emulator" in line
    assert not (tmp_path / "s").exists()


def _signed_copy(tmp_path: Path) -> Path:
    shell = tmp_path / DEV_SHELL.name
    for suffix in ("", ".sha256", ".sig"):
        shutil.copyfile(f"{DEV_SHELL}{suffix}", f"{shell}{suffix}")
        os.chmod(f"{shell}{suffix}", 0o644)
    return shell


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("flip", "does not match"),
        ("truncate-sig", "signature file"),
        ("world-writable", "chmod go-w"),
    ],
)
def test_a_refused_shell_stops_start_up(tmp_path: Path, damage: str, needle: str) -> None:
    shell = _signed_copy(tmp_path)
    if damage == "flip":
        data = bytearray(shell.read_bytes())
        data[-1] ^= 1
        shell.write_bytes(bytes(data))
    elif damage == "truncate-sig":
        Path(f"{shell}.sig").write_bytes(Path(f"{shell}.sig").read_bytes()[:40])
    else:
        os.chmod(shell, 0o666)  # noqa: S103 - the refusal is the point
    key = tmp_path / "key.pub"
    shutil.copyfile(DEV_PUBLIC_KEY, key)
    os.chmod(key, 0o644)
    config = tmp_path / "npud.toml"
    config.write_text(
        f"[backend]\nkind = 'emulator'\n[shell]\npath = '{shell}'\npublic_key = '{key}'\n"
    )
    result = run_npud("--config", str(config), "--socket", str(tmp_path / "s"))
    assert result.returncode == 78, result.stderr  # the installation's files: configuration
    line = one_line_after_logs(result)
    assert line.startswith("npud: cannot start the NPU session: DSP shell verification failed:")
    assert needle in line
    assert not (tmp_path / "s").exists()


def one_line_after_logs(result: subprocess.CompletedProcess[str]) -> str:
    """The failure line; structured log lines before it are the journal's."""
    assert "Traceback" not in result.stderr
    failures = [line for line in result.stderr.splitlines() if line.startswith("npud: ")]
    assert len(failures) == 1, result.stderr
    return failures[0]


def test_the_development_key_is_refused_by_the_kernel_profile(tmp_path: Path) -> None:
    from npud.fastrpc.kernel.errors import ShellVerifyError
    from npud.ops.backend import select_profile
    from npud.ops.config import parse_config

    key = tmp_path / "key.pub"
    shutil.copyfile(DEV_PUBLIC_KEY, key)
    os.chmod(key, 0o644)
    config = parse_config(f"[shell]\npublic_key = '{key}'\ntrusted_uids = [{os.getuid()}]\n")
    profile = select_profile(config, "kernel")
    with pytest.raises(ShellVerifyError, match="development key"):
        profile.load_public_key()


def test_a_live_daemon_keeps_its_socket(tmp_path: Path) -> None:
    first = start_npud(tmp_path)
    try:
        result = run_npud("--config", str(first.config_path), "--socket", str(first.socket_path))
        assert result.returncode == 75
        assert "another npud is already listening on" in one_line(result)  # not "starting"
        peer = RawPeer.connect(first.socket_path)  # the first one still serves
        peer.hello()
        peer.close()
    finally:
        assert first.stop() == 0
    assert not first.socket_path.exists()


def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "npud.sock"))
    stale.close()  # the file stays, nobody listens: a daemon that died
    daemon = start_npud(tmp_path)
    try:
        peer = RawPeer.connect(daemon.socket_path)
        peer.hello()
        peer.close()
        assert "replacing a stale socket" in daemon.log()
    finally:
        assert daemon.stop() == 0


def test_a_path_that_is_not_a_socket_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "npud.sock").write_text("precious")
    config = tmp_path / "npud.toml"
    config.write_text("[backend]\nkind = 'emulator'\n")
    result = run_npud("--config", str(config), "--socket", str(tmp_path / "npud.sock"))
    assert result.returncode == 64  # --socket named it: a usage error
    assert "exists and is not a socket" in one_line(result)  # said before "starting"
    assert (tmp_path / "npud.sock").read_text() == "precious"
    # The configuration named it: a configuration error.
    config.write_text(f"[backend]\nkind = 'emulator'\n[daemon]\nsocket = '{tmp_path}/npud.sock'\n")
    result = run_npud("--config", str(config))
    assert result.returncode == 78
    assert "exists and is not a socket" in one_line(result)


def test_a_socket_option_naming_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    """`npud --socket DIR` exited 1 after logging "starting"."""
    config = tmp_path / "npud.toml"
    config.write_text("[backend]\nkind = 'emulator'\n")
    result = run_npud("--config", str(config), "--socket", str(tmp_path))
    assert result.returncode == 64
    assert one_line(result) == (
        f"npud: {tmp_path} is a directory; name the socket file itself (--socket or "
        f"daemon.socket), e.g. {tmp_path / 'npud.sock'}"
    )
    assert "starting" not in result.stderr


def test_socket_mode_and_group(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, "[daemon]\nsocket_mode = '0640'\n")
    try:
        assert (daemon.socket_path.stat().st_mode & 0o777) == 0o640
    finally:
        assert daemon.stop() == 0


def test_an_unknown_socket_group_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "npud.toml"
    config.write_text("[backend]\nkind = 'emulator'\n[daemon]\nsocket_group = 'no-such-group-x'\n")
    result = run_npud("--config", str(config), "--socket", str(tmp_path / "s"))
    assert result.returncode == 78
    assert "groupadd no-such-group-x" in one_line(result)


def test_an_unknown_pd_user_stops_start_up(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("pd_user applies when npud runs as root")
    config = tmp_path / "npud.toml"
    config.write_text("[backend]\nkind = 'emulator'\n[emulator]\npd_user = 'no-such-user-here'\n")
    result = run_npud("--config", str(config), "--socket", str(tmp_path / "s"))
    assert result.returncode == 78, result.stderr
    assert one_line_after_logs(result) == (
        "npud: cannot start the emulator: [emulator]: pd_user='no-such-user-here': no such user"
    )
    assert not (tmp_path / "s").exists()


def test_a_trace_path_that_exists_stops_start_up(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("someone else's\n")
    result = run_npud(
        "--backend", "emulator", "--socket", str(tmp_path / "s"), "--trace", str(trace)
    )
    assert result.returncode == 73, result.stderr
    line = one_line(result)  # said before "starting"
    assert line == (
        f"npud: cannot write the trace {trace}: it exists (npud writes a new file only: "
        "move the old one away or name another)"
    )
    assert trace.read_text() == "someone else's\n"


def test_a_usage_error_exits_64() -> None:
    result = run_npud("--backend", "gpu")
    assert result.returncode == 64
    assert "invalid choice: 'gpu'" in result.stderr


def test_help_into_a_closed_pipe_is_quiet() -> None:
    """`npud --help | head -1` when head is gone first: no BrokenPipeError traceback, the
    status a shell reports for a program SIGPIPE ended."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before npud writes
    try:
        result = subprocess.run(
            [sys.executable, "-m", "npud.daemon.main", "--help"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (141, "")
