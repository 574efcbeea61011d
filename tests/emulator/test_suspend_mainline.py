"""A system suspend as mainline's fastrpc handles it (issue 29, item 7).

The freezer ends the wait of every INVOKE waiting for the DSP at once: each
session's listener in next2, each dspqueue wait_signal, any call in flight. For
each, ``fastrpc_internal_invoke`` keeps the context on the fd's pending list
(its id taken until the fd is released: 255 ids per channel, for every fd on it),
moves the fd's MMAP buffers to the channel's list (never freed: a restart only
unlinks them) and the syscall restarts under a new context.
"""

from __future__ import annotations

import errno
import struct
import threading
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, InvokeResult
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.channel import FASTRPC_CTX_IDS
from npud.sim.skels_dspqueue import URI as DSPQUEUE_URI
from tests.emulator.conftest import ECHO_URI

WAIT_SIGNAL_SC = 0x06000100
CANCEL_WAIT_SIGNAL_SC = 0x07000000


def open_session(driver: EmulatedDriver) -> FastRpcSession:
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        session.load_shell(DEV_SHELL.read_bytes())
    except BaseException:
        session.close()
        raise
    return session


@pytest.fixture
def driver() -> Iterator[EmulatedDriver]:
    with EmulatedDriver() as emulated:
        yield emulated


class Waiter:
    """A thread in dspqueue's wait_signal until the DSP process signals (or it is cancelled)."""

    def __init__(self, session: FastRpcSession, handle: int) -> None:
        self.result: InvokeResult | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(session, handle))
        self._thread.start()

    def _run(self, session: FastRpcSession, handle: int) -> None:
        try:
            self.result = session.invoke(handle, WAIT_SIGNAL_SC, [], [Capacity(4)])
        except BaseException as exc:
            self.result = exc

    def join(self) -> InvokeResult:
        self._thread.join(30)
        assert not self._thread.is_alive()
        assert isinstance(self.result, InvokeResult), self.result
        return self.result


def wait_in_flight(driver: EmulatedDriver, count: int) -> None:
    for _ in range(2000):
        if driver.statistics().invokes_in_flight >= count:
            return
        threading.Event().wait(0.005)
    raise AssertionError(f"{count} calls never waited on the DSP")


def test_a_suspend_interrupts_every_waiting_call_at_once(driver: EmulatedDriver) -> None:
    first, second = open_session(driver), open_session(driver)
    try:
        handle = first.remote_open(DSPQUEUE_URI)
        waiter = Waiter(first, handle)
        wait_in_flight(driver, 3)  # two listeners in next2, one wait_signal
        assert driver.statistics().interrupted_contexts == 0
        driver.faults.suspend()
        stats = driver.statistics()
        assert stats.suspends == 1
        assert stats.interrupted_contexts == 3  # one per waiting call, on both fds
        assert stats.contexts_in_use == 6  # and a context each for the restarted calls
        # The restarted calls still get their answers.
        assert first.invoke(handle, CANCEL_WAIT_SIGNAL_SC, [], []).rc == 0
        answer = waiter.join()
        assert answer.rc == 0
        assert struct.unpack("<i", answer.output(0)) == (-1,)  # cancelled
        echo = second.remote_open(ECHO_URI)  # through second's restarted listener
        second.remote_close(echo)
        first.remote_close(handle)
    finally:
        first.close()
    # The first fd is released: its interrupted contexts (listener, wait) go with it.
    stats = driver.statistics()
    assert stats.interrupted_contexts == 1
    second.close()
    assert driver.statistics().contexts_in_use == 0


def test_interrupted_contexts_use_up_the_channel_until_their_fd_closes(
    driver: EmulatedDriver,
) -> None:
    session = open_session(driver)
    try:
        wait_in_flight(driver, 1)  # the listener
        for _ in range(FASTRPC_CTX_IDS - 1):
            driver.faults.suspend()
        stats = driver.statistics()
        assert stats.interrupted_contexts == FASTRPC_CTX_IDS - 1
        assert stats.contexts_in_use == FASTRPC_CTX_IDS  # the restarted listener's too
        # Every id is taken: any call to the DSP, from any fd, is ENOSPC.
        fd = driver.open(abi.CDSP_SECURE_NODE, 0)
        try:
            invoke = abi.fastrpc_invoke(handle=abi.REMOTECTL1_HANDLE, sc=0, args=0)
            with pytest.raises(
                OSError, match="254 interrupted ones kept until their fds close"
            ) as caught:
                driver.ioctl(fd, abi.FASTRPC_IOCTL_INVOKE, invoke)
            assert caught.value.errno == errno.ENOSPC
        finally:
            driver.close(fd)
        # Even the session's own exit call finds no context: only the end of the DSP
        # process (here the emulator's shutdown) lets the listener and the fd go.
        with pytest.raises(RpcError):
            session.remote_open(ECHO_URI)
        driver.shutdown()
    finally:
        session.close()
    assert driver.statistics().contexts_in_use == 0  # the release freed them all
    fresh = open_session(driver)
    try:
        echo = fresh.remote_open(ECHO_URI)
        fresh.remote_close(echo)
    finally:
        fresh.close()


def test_moved_buffers_are_unlinked_at_a_restart_never_freed() -> None:
    with EmulatedDriver(SimConfig(initial_heap=0)) as driver:
        session = open_session(driver)
        try:
            handle = session.remote_open(ECHO_URI)  # the load grows the heap (MMAP)
            assert driver.statistics().mmap_buffers == 1
            wait_in_flight(driver, 1)
            driver.faults.suspend()  # the listener's wait: the fd's buffers move
            stats = driver.statistics()
            assert (stats.mmap_buffers, stats.interrupted_mmaps) == (0, 1)
            driver.faults.subsystem_restart()
            stats = driver.statistics()
            assert stats.interrupted_mmaps == 0
            assert stats.lost_mmaps == 1
            assert stats.lost_mmap_bytes >= 1 << 20  # growth comes in whole MiB
            del handle
        finally:
            session.close()
        driver.faults.boot()
        assert driver.statistics().lost_mmaps == 1  # for good: a new boot keeps the count


def test_the_session_counts_the_contexts_the_kernel_keeps(driver: EmulatedDriver) -> None:
    session = open_session(driver)
    try:
        wait_in_flight(driver, 1)  # the listener, in next2 through every suspend below
        for _ in range(3):
            driver.faults.suspend()
        # Counted while the interrupted call still waits: it may never return on its own.
        assert session.statistics().interrupted_contexts == 3
        assert driver.statistics().interrupted_contexts == 3
        echo = session.remote_open(ECHO_URI)  # the listener's next2 returns and waits again
        session.remote_close(echo)
        assert session.statistics().interrupted_contexts == 3
    finally:
        session.close()
    assert driver.statistics().contexts_in_use == 0
