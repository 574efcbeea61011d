"""npud's libcdsprpc when things go away: npud killed mid-call, npud shutting down, the
DSP process restarting, the program killed (tests/shim/c/api_test.c)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import npu_client
from tests.e2e.daemon import Npud, start_npud
from tests.shim.programs import answer, expect_line, finish, spawned, status, wait_until_clean


def test_npud_gone_mid_call(api_test: Path, tmp_path: Path) -> None:
    """Calls waiting on npud fail at once with AEE_ECONNRESET when it dies; later calls
    on what it held fail the same way, new ones find nobody (AEE_ECONNREFUSED)."""
    daemon = start_npud(tmp_path)
    try:
        with spawned(api_test, "gone", daemon.socket_path) as process:
            expect_line(process, "CALLING")
            daemon.process.kill()
            daemon.process.wait()
            answer(process)
            assert "DONE" in finish(process)
    finally:
        daemon.stop()


def test_npud_shutting_down(api_test: Path, tmp_path: Path) -> None:
    """shutting_down: calls that take resources fail at once, the running one finishes
    within the grace period, and then the connection is gone."""
    daemon = start_npud(tmp_path)
    try:
        with spawned(api_test, "shutdown", daemon.socket_path) as process:
            expect_line(process, "RUNNING")
            daemon.process.send_signal(signal.SIGTERM)
            _wait_for_log(daemon, '"event": "stopping"')
            time.sleep(0.5)  # the shutting_down event reaches the client
            answer(process)
            assert "DONE" in finish(process)
        assert daemon.process.wait(timeout=30) == 0
    finally:
        daemon.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="npud's debug faults need root")
def test_dsp_process_restart(api_test: Path, npud: Npud) -> None:
    """The DSP restarts (a subsystem restart, 0.3 s away): the call on it, the client's
    handles and mappings fail with AEE_ECONNRESET; its buffers live on, and it starts
    again. (A crash of the client's domain alone, `debug ssr --domain`, needs the
    emulator's PD processes: EmulatedDriver.crash_process is not on this branch.)"""
    with spawned(api_test, "restart", npud.socket_path) as process:
        expect_line(process, "RESTART")
        with npu_client.connect(str(npud.socket_path), name="observer", timeout=30) as npu:
            npu.debug_fault("ssr", 0.3)
        answer(process)
        assert "DONE" in finish(process)
    wait_until_clean(npud)


def test_killed_program_leaves_npud_clean(api_test: Path, npud: Npud) -> None:
    """SIGKILL while holding buffers, a mapping, a handle and a call on the DSP."""
    with spawned(api_test, "hold", npud.socket_path) as process:
        expect_line(process, "HOLDING")
        [held] = [row for row in status(npud.socket_path).clients if row.pid == process.pid]
        assert (held.buffers, held.handles, held.mappings) == (2, 1, 1)
        process.send_signal(signal.SIGKILL)
        process.wait()
    wait_until_clean(npud)


def _wait_for_log(daemon: Npud, text: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in daemon.log():
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.02)
