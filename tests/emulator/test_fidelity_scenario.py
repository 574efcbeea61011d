"""The bring-up's fidelity and suspend scenarios (issue 21): what they print settles,
on a device, what the emulator can only be told by its knobs."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.recording.replay import replay
from npud.fastrpc.recording.trace import TraceWriter, TracingDriver
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.ops.trace_cli import apps_std_calls, fidelity_scenario, suspend_scenario
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.config import AEE_ERPC

OLD_FIRMWARE = SimConfig(
    domain_handles=False, absent_module_result=AEE_ERPC, loader_probes=("oemconfig.so",)
)


def _record(
    path: Path,
    config: SimConfig,
    run: Callable[[FastRpcSession], None],
    *,
    suspend: bool = False,
    suspend_after: float | None = None,
) -> None:
    writer = TraceWriter(path, backend="emulator")
    emulator = EmulatedDriver(config)
    try:
        with FastRpcSession.open(
            TracingDriver(emulator, writer), library_path=[DSP_LIBRARY_DIR]
        ) as session:
            session.load_shell(DEV_SHELL.read_bytes())
            if suspend:
                emulator.faults.suspend_next_invoke()
            timer = None
            if suspend_after is not None:  # a suspend of the machine while the run goes on
                timer = threading.Timer(suspend_after, emulator.faults.suspend)
                timer.start()
            try:
                run(session)
            finally:
                if timer is not None:
                    timer.join()
    finally:
        writer.close()


def test_the_fidelity_scenario_prints_what_the_firmware_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "fidelity.jsonl"
    _record(trace, OLD_FIRMWARE, fidelity_scenario)
    printed = capsys.readouterr().out
    for line in (
        "UNSIGNED_PD_SUPPORT: 1",
        "static handle 9 (no module): 0x80000600 (AEE_ERPC)",
        "static handle 10 (no module): 0x80000600 (AEE_ERPC)",
        "listener: adsp_listener (retries 0)",
        "remotectl: remotectl",
        "paths refused: 0",
    ):
        assert line in printed, printed
    calls = apps_std_calls(trace)
    assert calls[:3] == [
        "reverse: apps_remotectl open apps_std -> 0",
        "reverse: apps_std fopen_with_env oemconfig.so -> 2",  # ENOENT: the loader goes on
        "reverse: apps_std fopen_with_env libecho_skel.so -> 0",
    ]
    assert replay(trace).divergence is None


def test_the_suspend_scenario_sees_one_answer_per_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "suspend.jsonl"
    _record(trace, SimConfig(), lambda session: suspend_scenario(session, 0.2), suspend=True)
    printed = capsys.readouterr().out
    assert ", 0 failed," in printed
    assert "listener: running=True" in printed
    assert "load after the suspend: ok in " in printed
    assert replay(trace).divergence is None


def test_the_suspend_scenario_loads_through_the_listener_that_waited_through_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 29, item 7: a suspend interrupts the listener's next2 (and whatever else
    # waits); the load afterwards needs the restarted next2, and npud counts the calls.
    trace = tmp_path / "suspend.jsonl"
    _record(trace, SimConfig(), lambda session: suspend_scenario(session, 0.3), suspend_after=0.05)
    printed = capsys.readouterr().out
    assert ", 0 failed," in printed
    assert "load after the suspend: ok in " in printed
    assert re.search(r"interrupted contexts: [1-9]", printed), printed


def test_only_the_unknown_static_handles_may_be_probed() -> None:
    driver = EmulatedDriver()
    with FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR]) as session:
        session.load_shell(DEV_SHELL.read_bytes())
        for handle in (0, 1, 3, 4, 7, 8, 11):
            with pytest.raises(RpcError) as caught:
                session.probe_static_handle(handle)
            assert caught.value.code is ErrorCode.INVALID_ARGUMENT
