"""Listener and remotectl start-up as libcdsprpc does it, on both DSP generations.

Newer firmware has the domain-style ``adsp_listener1`` (static handle 7) and
``remotectl1`` (8); older firmware answers those with AEE_ENOSUCHMOD or
AEE_ERPC, and the session falls back to handles 3 and 0. ``init2`` runs on
the listener thread itself, which blocks every signal.
"""

from __future__ import annotations

import contextlib
import signal
import struct
import threading
from collections.abc import Sequence

import pytest

from npu_protocol import AEE
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import IoctlArg
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.reverse.listener import THREAD_NAME
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.config import AEE_ENOSUCHMOD, AEE_ERPC
from tests.emulator.conftest import ECHO_URI, fastrpc_threads


class WatchingDriver(EmulatedDriver):
    """Records (thread name, handle, sc) of every INVOKE."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.invokes: list[tuple[str, int, int]] = []

    def ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:  # type: ignore[override]
        if request == abi.FASTRPC_IOCTL_INVOKE and isinstance(arg, abi.fastrpc_invoke):
            self.invokes.append((threading.current_thread().name, int(arg.handle), int(arg.sc)))
        return super().ioctl(fd, request, arg)


def open_session(driver: EmulatedDriver) -> FastRpcSession:
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    return session


def echo_works(session: FastRpcSession) -> None:
    handle = session.remote_open(ECHO_URI)
    prim = struct.pack("<II", 2, 2)
    result = session.invoke(handle, 0x02020100, [Inline(prim), Inline(b"ok")], [Capacity(2)])
    assert (result.rc, result.output(0)) == (0, b"ok")
    session.remote_close(handle)


def handles_used(invokes: Sequence[tuple[str, int, int]]) -> set[int]:
    return {handle for _, handle, _ in invokes if handle <= 10}


def test_newer_firmware_uses_the_domain_style_handles() -> None:
    driver = WatchingDriver(SimConfig())
    session = open_session(driver)
    try:
        echo_works(session)
        stats = session.statistics()
        assert (stats.listener, stats.remotectl) == ("adsp_listener1", "remotectl1")
    finally:
        session.close()
    assert handles_used(driver.invokes) == {7, 8, 4}  # listener1, remotectl1, exit


@pytest.mark.parametrize("absent", [AEE_ENOSUCHMOD, AEE_ERPC])
def test_older_firmware_falls_back_to_handles_3_and_0(absent: int) -> None:
    driver = WatchingDriver(SimConfig(domain_handles=False, absent_module_result=absent))
    session = open_session(driver)
    try:
        echo_works(session)
        echo_works(session)
        stats = session.statistics()
        assert (stats.listener, stats.remotectl) == ("adsp_listener", "remotectl")
        # 7 and 8 were each asked once; everything after went to 3 and 0.
        asked = [handle for _, handle, _ in driver.invokes if handle in (7, 8)]
        assert sorted(asked) == [7, 8]
        assert {3, 0} <= handles_used(driver.invokes)
    finally:
        session.close()


def test_init2_runs_on_the_listener_thread_which_blocks_signals() -> None:
    driver = WatchingDriver(SimConfig())
    session = open_session(driver)
    try:
        init2 = [name for name, handle, sc in driver.invokes if (handle, sc) == (7, 0x05000000)]
        assert init2 == [THREAD_NAME]
        (listener,) = fastrpc_threads()
        assert listener.native_id is not None
        with open(f"/proc/self/task/{listener.native_id}/status") as status:
            blocked = int(
                next(line for line in status if line.startswith("SigBlk:")).split()[1], 16
            )
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            assert blocked & (1 << (number - 1)), signal.Signals(number).name
    finally:
        session.close()


class Init2AnswersAfterRunning(EmulatedDriver):
    """A DSP whose handle-7 init2 runs, then answers ``answer``: libcdsprpc then serves
    through handle 3 without an init2 of its own (issue 21, item 5)."""

    def __init__(self, answer: int) -> None:
        super().__init__(SimConfig())
        self.answer = answer
        self.invokes: list[tuple[int, int]] = []

    def ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:  # type: ignore[override]
        if request != abi.FASTRPC_IOCTL_INVOKE or not isinstance(arg, abi.fastrpc_invoke):
            return super().ioctl(fd, request, arg)
        call = (int(arg.handle), int(arg.sc))
        self.invokes.append(call)
        rc = super().ioctl(fd, request, arg)
        return self.answer if call == (7, 0x05000000) and rc == 0 else rc


def test_an_init2_failure_that_is_not_a_fallback_code_serves_through_handle_3() -> None:
    driver = Init2AnswersAfterRunning(AEE.EBADPARM.dsp)
    session = open_session(driver)
    try:
        echo_works(session)
        assert session.statistics().listener == "adsp_listener"
        assert (3, 0x03000000) not in driver.invokes  # no init2 on handle 3
        assert (3, 0x04020200) in driver.invokes  # next2 on handle 3
        assert not any(handle == 7 and sc != 0x05000000 for handle, sc in driver.invokes)
    finally:
        session.close()
    assert not fastrpc_threads()


def test_a_dsp_that_needs_the_failed_init2_ends_the_listener_after_one_retry() -> None:
    driver = EmulatedDriver()
    driver.faults.fail_next_invoke(AEE.EBADPARM.dsp, handle=7)  # init2 never ran
    session = open_session(driver)  # the load goes on, as libcdsprpc's does
    try:
        assert session.shell_loaded
        assert session.statistics().listener == "adsp_listener"
        listener = session.listener
        assert listener is not None
        assert listener.join(10)
        reason = session.statistics().listener_stopped_because
        # next2 before init2 is AEE_ENOTINITIALIZED here; the retry carried it back once.
        assert "AEE_ENOTINITIALIZED" in reason
        assert "on the retry" in reason
        assert listener.stats.retries == 1
    finally:
        session.close()
    assert not fastrpc_threads()
    assert driver.statistics().dsp_processes == 0


def test_an_erpc_from_handle_7_falls_back_even_on_newer_firmware() -> None:
    driver = EmulatedDriver()
    driver.faults.fail_next_invoke(AEE.ERPC.dsp, handle=7)
    session = open_session(driver)
    try:
        assert session.statistics().listener == "adsp_listener"
        echo_works(session)
    finally:
        session.close()


@pytest.mark.parametrize("answer", [AEE.EBADPARM.dsp, AEE.EFAILED.dsp, 0x1234])
def test_any_remotectl1_failure_falls_back_to_remotectl(answer: int) -> None:
    # remote_handle_open_domain: any non-zero answer of remotectl1_open1 falls back.
    driver = WatchingDriver(SimConfig())
    session = open_session(driver)
    try:
        driver.faults.fail_next_invoke(answer, handle=8)
        echo_works(session)
        assert session.statistics().remotectl == "remotectl"
        echo_works(session)
        assert [handle for _, handle, _ in driver.invokes if handle == 8] == [8]
    finally:
        session.close()


def test_a_failed_next2_is_answered_once_more_with_the_failure() -> None:
    # listener(): any other next2 failure gets one more next2 carrying it as prevResult.
    driver = EmulatedDriver()
    session = open_session(driver)
    try:
        listener = session.listener
        assert listener is not None
        # The next2 that carries the first reply of the next load fails (the reply is
        # lost); the retry tells the DSP that request failed, and the listener goes on.
        # Whether that load survives the lost reply is up to the DSP's loader.
        driver.faults.fail_next_invoke(AEE.EBADPARM.dsp, handle=7)
        with contextlib.suppress(RpcError):
            session.remote_open(ECHO_URI)
        assert listener.stats.retries == 1
        assert session.listener_running
        echo_works(session)
    finally:
        session.close()


def test_absent_module_result_is_validated() -> None:
    for bad in (0, 1 << 32):
        with pytest.raises(ValueError, match="absent_module_result"):
            SimConfig(absent_module_result=bad)
    assert SimConfig(absent_module_result=0x80000401).absent_module_result == 0x80000401
