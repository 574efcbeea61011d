"""The n-th internal call fails, for every n: each path returns a code and leaks nothing.

The library is built with its fault hook (FAULTS=1) and the sanitizers. A
clean run of tests/shim/c/fault_run.c counts the fault points it passes (N:
each malloc, socket, connect, sendmsg, recvmsg, mmap, pthread_create and
msgpack decode); then it runs again with NPUD_SHIM_FAULT_AT=n for n = 1..N.
Every run must exit 0: its calls returned (a code or NULL), no fd but the
connection's and no DMA-BUF mapping is left, and LeakSanitizer found no leak
at exit. npud must hold nothing of any of them afterwards.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.daemon import Npud
from tests.shim.programs import environment, wait_until_clean


def _run(program: Path, socket_path: Path, n: int, count_file: Path | None = None) -> str:
    env = environment(socket_path)
    env["NPUD_SHIM_FAULT_AT"] = str(n)
    if count_file is not None:
        env["NPUD_SHIM_FAULT_COUNT"] = str(count_file)
    result = subprocess.run(
        [str(program)], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, f"fault at call {n}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_every_fault_point(fault_run: Path, npud: Npud, tmp_path: Path) -> None:
    count_file = tmp_path / "points"
    clean = _run(fault_run, npud.socket_path, 0, count_file)
    assert "get_dsp_info 0x0" in clean, clean
    assert "invoke_spill 0x0" in clean, clean
    points = int(count_file.read_text())
    assert points > 100, points  # the pass goes through every part of the library
    for n in range(1, points + 1):
        _run(fault_run, npud.socket_path, n)
        if n % 50 == 0:
            wait_until_clean(npud)
    wait_until_clean(npud)


def test_every_fault_point_of_dspqueue(dspq_test: Path, tmp_path: Path) -> None:
    """dspqueue's own fault points (its allocations and threads), against the fake DSP."""
    program = dspq_test
    count_file = tmp_path / "points"
    env = environment(None)
    env["NPUD_SHIM_FAULT_COUNT"] = str(count_file)
    subprocess.run([str(program), "faults"], env=env, check=True, capture_output=True, timeout=60)
    points = int(count_file.read_text())
    assert points >= 4, points
    for n in range(1, points + 1):
        env = environment(None)
        env["NPUD_SHIM_FAULT_AT"] = str(n)
        result = subprocess.run(
            [str(program), "faults"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert result.returncode == 0, f"fault at call {n}:\n{result.stdout}\n{result.stderr}"
