"""The driver's fault control is a typed capability: the emulator's, None on the kernel's.

``debug`` asks the driver for it instead of checking which backend runs, so a
driver that cannot fake the DSP's failures (the kernel's, a replay) refuses with
UNSUPPORTED, and one that wraps another (the tracing driver) passes it on.
"""

from __future__ import annotations

import pathlib
from types import SimpleNamespace
from typing import Any

import pytest

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.fastrpc.kernel.driver import FaultControl, KernelDriver
from npud.fastrpc.recording.trace import TraceWriter, TracingDriver
from npud.requests.daemon_requests import Debug
from npud.sim.driver import EmulatedDriver


def test_the_kernel_driver_has_no_fault_control() -> None:
    assert KernelDriver().fault_control() is None


def test_the_emulator_hands_out_its_faults() -> None:
    driver = EmulatedDriver()
    try:
        control: FaultControl | None = driver.fault_control()
        assert control is not None
        control.set_latency(0.25)
        assert driver.faults.latency == pytest.approx(0.25)
        control.clear()
        assert driver.faults.latency == 0.0  # cleared
        assert control.crash_process(12345) is False  # no such device fd
    finally:
        driver.shutdown()


@pytest.mark.parametrize("inner", ["kernel", "emulator"])
def test_the_tracing_driver_passes_the_control_on(inner: str, tmp_path: pathlib.Path) -> None:
    driver: Any = KernelDriver() if inner == "kernel" else EmulatedDriver()
    writer = TraceWriter(tmp_path / "trace.jsonl", backend=inner)
    try:
        tracing = TracingDriver(driver, writer)
        assert (tracing.fault_control() is None) == (inner == "kernel")
    finally:
        writer.close()
        driver.shutdown()


class _NoOtherDomains:
    """The daemon as a request sees it, with no domain but the client's own."""

    def status(self, viewer: Any) -> p.DaemonStatus:
        raise AssertionError("debug does not ask for the status")

    def domain_named(self, name: str) -> None:
        return None


def _debug(driver: Any, uid: int = 0, **request: Any) -> Debug:
    client: Any = SimpleNamespace(uid=uid, pid=1)
    domain: Any = SimpleNamespace(device=SimpleNamespace(driver=driver))
    asked = {"action": "latency", "duration_ms": 5, **request}
    return Debug(client, domain, p.DebugRequest(id=1, **asked), _NoOtherDomains())


def test_debug_on_a_driver_without_faults_is_unsupported() -> None:
    with pytest.raises(CodedError) as caught:
        _debug(KernelDriver()).arrive()
    assert caught.value.code is ErrorCode.UNSUPPORTED


def test_debug_injects_through_the_control() -> None:
    driver = EmulatedDriver()
    try:
        handler = _debug(driver)
        handler.arrive()
        answer = handler.run()
        assert driver.faults.latency == pytest.approx(0.005)
        assert isinstance(answer.reply, p.DebugReply)
    finally:
        driver.shutdown()


def test_debug_stays_root_only() -> None:
    with pytest.raises(CodedError) as caught:
        _debug(EmulatedDriver(), uid=1000).arrive()
    assert caught.value.code is ErrorCode.NOT_PERMITTED


def test_debug_names_a_domain_through_the_daemon_it_was_given() -> None:
    driver = EmulatedDriver()
    try:
        with pytest.raises(CodedError) as caught:
            _debug(driver, action="ssr", domain="elsewhere").arrive()
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT
        assert "no domain 'elsewhere'" in str(caught.value)
    finally:
        driver.shutdown()
