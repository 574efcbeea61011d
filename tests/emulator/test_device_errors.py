"""Errors a real device produces that the emulator used to spare us, each handled by the session.

* EINTR / ERESTARTSYS: a signal or the suspend freezer interrupts the kernel's
  interruptible wait; the DSP still runs the call.
* ETIMEDOUT: the kernel's own calls to the DSP give up after 10 s.
* A DSP result in -4095..-1 reaches userspace as an errno.
* The pre-2024 capability copy-back bug with an answer of 3 (which equals
  the ``domain`` field the struct starts with).
* STATUS_NOTIFICATION_SUPPORT: only 3 means supported.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator

import pytest

from npu_protocol import ErrorCode
from npud.domain.life import capabilities_record
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import InterruptedCallError, RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.config import HVX_SUPPORT_128B, STATUS_NOTIFICATION_SUPPORT
from tests.emulator.conftest import ECHO_URI, fastrpc_threads, open_fds

ECHO_SC = 0x02020100


def open_session(driver: EmulatedDriver) -> FastRpcSession:
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    return session


@pytest.fixture
def driver() -> EmulatedDriver:
    return EmulatedDriver(SimConfig(reverse_rpc_timeout=0.5))


@pytest.fixture
def session(driver: EmulatedDriver) -> Iterator[FastRpcSession]:
    before = open_fds()
    session = open_session(driver)
    yield session
    session.close()
    assert open_fds() == before
    assert not fastrpc_threads()


def echo(session: FastRpcSession, handle: int, data: bytes) -> tuple[int, bytes]:
    prim = struct.pack("<II", len(data), len(data))
    result = session.invoke(handle, ECHO_SC, [Inline(prim), Inline(data)], [Capacity(len(data))])
    return result.rc, result.output(0)


# --- EINTR ------------------------------------------------------------------------------


def test_an_interrupted_invoke_fails_once_and_is_not_repeated(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(ECHO_URI)
    driver.faults.interrupt_next_invoke()
    with pytest.raises(InterruptedCallError) as caught:
        echo(session, handle, b"lost")
    assert caught.value.code is ErrorCode.DEVICE_ERROR
    assert "EINTR" in str(caught.value)
    assert "may still run the call" in str(caught.value)
    assert not session.dead
    assert driver.faults.pending_failures == 0
    assert echo(session, handle, b"next") == (0, b"next")


def test_an_interrupted_next2_keeps_the_listener_serving(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    listener = session.statistics().listener
    handle_number = 7 if listener == "adsp_listener1" else 3
    driver.faults.interrupt_next_invoke(handle=handle_number)
    # The request the interrupted next2 carried is lost: that load times out on the DSP...
    with pytest.raises(RpcError) as caught:
        session.remote_open(ECHO_URI)
    assert "did not answer" in str(caught.value)
    # ...but the listener issued next2 again and serves the next one.
    assert session.listener_running
    assert session.listener is not None
    assert session.listener.stats.interrupted == 1
    handle = session.remote_open(ECHO_URI)
    assert echo(session, handle, b"served") == (0, b"served")


# --- ETIMEDOUT --------------------------------------------------------------------------


def test_a_kernel_call_that_times_out_is_a_timeout(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    buffer = session.alloc(4096)
    driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_MEM_MAP, errno.ETIMEDOUT)
    with pytest.raises(RpcError) as caught:
        session.map(buffer)
    assert caught.value.code is ErrorCode.TIMEOUT
    assert "MEM_MAP on /dev/fastrpc-cdsp-secure did not finish within 10000 ms" in str(caught.value)
    assert session.address_of(buffer) is None
    assert not session.dead
    session.map(buffer)  # the DSP answers again
    session.free(buffer)


def test_a_shell_load_that_times_out_fails_cleanly() -> None:
    before = open_fds()
    driver = EmulatedDriver()
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    # The DSP created the process, but the kernel stopped waiting for it.
    driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_INIT_CREATE, errno.ETIMEDOUT, after=True)
    with pytest.raises(RpcError) as caught:
        session.load_shell(DEV_SHELL.read_bytes())
    assert caught.value.code is ErrorCode.TIMEOUT
    assert not session.shell_loaded
    session.close()
    assert open_fds() == before
    assert driver.statistics().dsp_processes == 0


# --- a DSP result that looks like an errno --------------------------------------------------


def test_a_dsp_result_in_the_errno_range_is_returned_as_the_result(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(ECHO_URI)
    # -2 (ENOENT) is no errno an INVOKE has: it can only be the DSP's result.
    driver.faults.fail_next_invoke(0xFFFFFFFE)
    rc, _ = echo(session, handle, b"x")
    assert rc == 0xFFFFFFFE
    assert not session.dead


def test_one_that_is_also_a_kernel_errno_is_taken_as_the_kernels(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    handle = session.remote_open(ECHO_URI)
    driver.faults.fail_next_invoke(0xFFFFFFEA)  # -22: EINVAL, which the kernel does return
    with pytest.raises(RpcError) as caught:
        echo(session, handle, b"x")
    assert caught.value.code is ErrorCode.DEVICE_ERROR
    assert "EINVAL" in str(caught.value)
    assert echo(session, handle, b"y") == (0, b"y")


def test_the_ambiguity_that_remains_minus_32_reads_as_a_restart(
    driver: EmulatedDriver, session: FastRpcSession
) -> None:
    """Documented, not solvable: -32 is EPIPE, and the session takes it as a restart."""
    handle = session.remote_open(ECHO_URI)
    driver.faults.fail_next_invoke(0xFFFFFFE0)
    with pytest.raises(RpcError) as caught:
        echo(session, handle, b"x")
    assert caught.value.code is ErrorCode.DSP_RESTARTED
    assert session.dead


# --- capabilities -------------------------------------------------------------------------


@pytest.mark.parametrize("copyback_bug", [False, True])
def test_an_answer_of_3_survives_the_copy_back_bug(copyback_bug: bool) -> None:
    config = SimConfig(
        capability_copyback_bug=copyback_bug,
        capabilities={HVX_SUPPORT_128B: 3, STATUS_NOTIFICATION_SUPPORT: 3},
    )
    session = FastRpcSession.open(EmulatedDriver(config), library_path=[DSP_LIBRARY_DIR])
    try:
        caps = session.capabilities
        assert caps.hvx_128b == 3
        assert caps.status_notification
        assert caps.arch == "v73"
        assert caps.as_dict()["status_notification"] is True
    finally:
        session.close()


@pytest.mark.parametrize(("answer", "supported"), [(0, False), (1, False), (2, False), (3, True)])
def test_status_notification_is_supported_only_at_3(answer: int, supported: bool) -> None:
    config = SimConfig(capabilities={STATUS_NOTIFICATION_SUPPORT: answer})
    session = FastRpcSession.open(EmulatedDriver(config), library_path=[DSP_LIBRARY_DIR])
    try:
        assert session.capabilities.status_notification is supported
        # The wire carries the answer as the DSP gave it (as version 1 did), and the verdict.
        record = capabilities_record(session.capabilities)
        assert (record.status_notification_support, record.status_notifications) == (
            answer,
            supported,
        )
    finally:
        session.close()
