"""``Driver.dsp_report``: the DSP time the DSP reported with a thread's last INVOKE
(issue 28, item 5). Only the emulator's DSP reports one (with a dspqueue
``wait_signal`` answer); the kernel's driver never does, and the tracing driver passes
on what its inner driver says. npud charges a batch the report when there is one and
its own estimate otherwise (docs/scheduling.md, "The LLM's batches")."""

from __future__ import annotations

import pathlib
from typing import Any

import msgspec
import pytest

from npud.fastrpc.kernel.driver import KernelDriver
from npud.fastrpc.kernel.invoke_args import InvokeResult
from npud.fastrpc.recording.trace import TraceWriter, TracingDriver
from npud.ops.backend import select_profile
from npud.ops.config import load_config
from npud.sim import pd_wire as wire
from npud.sim.config import SimConfig
from npud.sim.driver import EmulatedDriver
from npud.sim.skels import SkelCall


def test_the_kernel_driver_reports_no_dsp_time() -> None:
    assert KernelDriver().dsp_report() is None


def test_the_emulator_reports_nothing_before_an_invoke() -> None:
    driver = EmulatedDriver()
    try:
        assert driver.dsp_report() is None
    finally:
        driver.shutdown()


@pytest.mark.parametrize("inner", ["kernel", "emulator"])
def test_the_tracing_driver_passes_the_report_on(inner: str, tmp_path: pathlib.Path) -> None:
    driver: Any = KernelDriver() if inner == "kernel" else EmulatedDriver()
    writer = TraceWriter(tmp_path / "trace.jsonl", backend=inner)
    try:
        tracing = TracingDriver(driver, writer)
        assert tracing.dsp_report() is None
        if inner == "emulator":  # as an answered wait_signal leaves it on this thread
            driver._reports.dsp_seconds = 0.5
            assert tracing.dsp_report() == 0.5
    finally:
        writer.close()
        driver.shutdown()


def test_an_invoke_result_without_a_report_has_none() -> None:
    assert InvokeResult(rc=0, outputs=()).dsp_seconds is None


@pytest.mark.parametrize("seconds", [-0.001, float("nan"), float("inf"), 86400.5])
def test_a_skel_cannot_report_an_impossible_dsp_time(seconds: float) -> None:
    call = SkelCall(0, [], [], lambda _: None)
    with pytest.raises(ValueError, match="DSP time"):
        call.report_dsp_seconds(seconds)
    assert call.reported_dsp_seconds is None


def test_a_skel_reports_a_dsp_time() -> None:
    call = SkelCall(0, [], [], lambda _: None)
    call.report_dsp_seconds(0.004)
    assert call.reported_dsp_seconds == 0.004


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), 1e9])
def test_a_pd_childs_impossible_report_breaks_the_wire(seconds: float) -> None:
    """npud decodes a child's answer against the wire's bounds: a child that reports an
    impossible DSP time breaks the wire (its PD ends), as any bad field does."""
    raw = msgspec.msgpack.encode(wire.Result(1, 0, seconds))
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(wire.ChildMessage).decode(raw)


def test_a_pd_childs_report_and_its_absence_decode() -> None:
    decoder = msgspec.msgpack.Decoder(wire.ChildMessage)
    assert decoder.decode(msgspec.msgpack.encode(wire.Result(1, 0, 0.004))) == wire.Result(
        1, 0, 0.004
    )
    assert decoder.decode(msgspec.msgpack.encode(wire.Result(1, 0))) == wire.Result(1, 0, None)


def test_the_emulator_with_its_report_off_reports_none_as_a_device() -> None:
    """``[emulator] report_dsp_time = false``: npud then estimates a batch's time, as it
    must on a device, and a benchmark can measure that estimate."""
    driver = EmulatedDriver(SimConfig(report_dsp_time=False))
    try:
        driver._reports.dsp_seconds = 0.5  # as an answered wait_signal leaves it
        assert driver.dsp_report() is None
    finally:
        driver.shutdown()


def test_the_config_switch_reaches_the_emulated_driver(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "npud.toml"
    path.write_text("[emulator]\nreport_dsp_time = false\n")
    profile = select_profile(load_config(path), "emulator")
    assert profile.emulator_report_dsp_time is False
    assert select_profile(load_config(None), "emulator").emulator_report_dsp_time is True
