"""Every command of npuctl and npud into a pipe whose reader has gone (`npuctl status |
head -3`): no BrokenPipeError traceback, nothing on stderr, exit status 141 (what a shell
reports for a program SIGPIPE ended), as cat, grep and ls behave."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from npud.ops.backend import DEV_PUBLIC_KEY, DEV_SHELL
from tests.e2e.daemon import Npud, start_npud
from tests.emulator import onnx_models

NPUCTL = [sys.executable, "-m", "npu_client.npuctl"]
NPUD = [sys.executable, "-m", "npud.daemon.main"]
SIGN = [sys.executable, "-m", "npud.ops.sign_shell"]


@pytest.fixture(scope="module")
def npud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Npud]:
    daemon = start_npud(tmp_path_factory.mktemp("pipes"))
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def into_a_closed_pipe(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes
    try:
        return subprocess.run(
            argv,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, **env},
        )
    finally:
        os.close(write)


NPUCTL_COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["selftest"],
    ["metrics"],
    ["top", "--once", "--interval", "0.1"],
    ["top", "--once", "--json", "--interval", "0.1"],
    ["debug", "clear"],
    ["--help"],
    ["status", "--help"],
    ["--version"],
]


@pytest.mark.parametrize("command", NPUCTL_COMMANDS, ids=" ".join)
def test_npuctl(npud: Npud, command: list[str]) -> None:
    result = into_a_closed_pipe([*NPUCTL, "--socket", str(npud.socket_path), *command])
    assert (result.returncode, result.stderr) == (141, "")


def test_npuctl_run(npud: Npud, tmp_path: Path) -> None:
    model = tmp_path / "affine.onnx"
    model.write_bytes(onnx_models.affine())
    result = into_a_closed_pipe(
        [*NPUCTL, "--socket", str(npud.socket_path), "run", str(model), "--shape", "a=3"]
    )
    assert (result.returncode, result.stderr) == (141, "")


@pytest.mark.parametrize(
    "command",
    [
        [*NPUD, "--help"],
        [*NPUD, "--version"],
        [*NPUD, "trace", "--help"],
        [*NPUD, "doctor", "--help"],
        [*SIGN, "--help"],
    ],
    ids=lambda argv: " ".join(argv[2:]),
)
def test_npuds_commands(command: list[str]) -> None:
    result = into_a_closed_pipe(command)
    assert (result.returncode, result.stderr) == (141, "")


def test_npud_doctor(npud: Npud) -> None:
    result = into_a_closed_pipe([*NPUD, "doctor", "--socket", str(npud.socket_path)])
    assert (result.returncode, result.stderr) == (141, "")


def test_npud_sign_shell_verify() -> None:
    result = into_a_closed_pipe(
        [*SIGN, "verify", "--public-key", str(DEV_PUBLIC_KEY), "--trusted-uid",
         str(os.getuid()), str(DEV_SHELL)]
    )  # fmt: skip
    assert (result.returncode, result.stderr) == (141, "")


def test_an_error_still_says_so_whatever_stdout_is(tmp_path: Path) -> None:
    """A closed stdout changes nothing for a command that failed before writing."""
    result = into_a_closed_pipe([*NPUCTL, "--socket", str(tmp_path / "none.sock"), "status"])
    assert result.returncode == 69
    assert result.stderr.startswith("npuctl: cannot connect to npud at ")
