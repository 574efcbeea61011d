"""A system suspend during an INVOKE, as 76e8e4ace1ed handles it (issue 21, item 6).

The kernel waits for a user invoke interruptibly. The suspend freezer ends
that wait with ERESTARTSYS; the syscall then restarts by itself, so the
kernel sends the call again and the DSP runs it twice, while the caller sees
one answer, the second run's. On the way, ``fastrpc_internal_invoke`` moves
every MMAP (heap growth) buffer of the fd to the channel's list, so a later
MUNMAP of one of them is EINVAL: npud logs it once per buffer, forgets the
grant and never gives it back again. ``faults.suspend_next_invoke`` does all
of that.
"""

from __future__ import annotations

import errno
import logging
import struct
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import IoctlArg
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from tests.emulator.conftest import ECHO_URI, open_fds


class MunmapWatchingDriver(EmulatedDriver):
    """Records the outcome (0 or the errno) of every MUNMAP."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.munmaps: list[int] = []

    def ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:  # type: ignore[override]
        if request != abi.FASTRPC_IOCTL_MUNMAP:
            return super().ioctl(fd, request, arg)
        try:
            rc = super().ioctl(fd, request, arg)
        except OSError as exc:
            self.munmaps.append(exc.errno or -1)
            raise
        self.munmaps.append(rc)
        return rc


@pytest.fixture
def tight() -> Iterator[tuple[MunmapWatchingDriver, FastRpcSession]]:
    """A DSP process with no heap of its own: loading the echo skel grows it (MMAP)."""
    before = open_fds()
    driver = MunmapWatchingDriver(SimConfig(initial_heap=0))
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    yield driver, session
    session.close()
    assert open_fds() == before


def echo(session: FastRpcSession, handle: int, data: bytes) -> bytes:
    prim = struct.pack("<II", len(data), len(data))
    result = session.invoke(handle, 0x02020100, [Inline(prim), Inline(data)], [Capacity(len(data))])
    assert result.rc == 0
    return result.output(0)


def test_the_call_runs_twice_and_the_caller_sees_one_answer() -> None:
    driver = EmulatedDriver()
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        session.load_shell(DEV_SHELL.read_bytes())
        driver.faults.suspend_next_invoke(handle=abi.REMOTECTL1_HANDLE)
        handle = session.remote_open(ECHO_URI)  # remotectl1 open, sent twice
        assert echo(session, handle, b"after") == b"after"
        # The DSP opened the skel twice; the first handle never reached the caller.
        assert driver.statistics().remote_handles_open == 2
        session.remote_close(handle)
        assert driver.statistics().remote_handles_open == 1
        assert driver.faults.pending_failures == 0
    finally:
        session.close()


def test_heap_growth_taken_by_the_kernel_is_logged_and_never_given_back_twice(
    tight: tuple[MunmapWatchingDriver, FastRpcSession], caplog: pytest.LogCaptureFixture
) -> None:
    driver, session = tight
    handle = session.remote_open(ECHO_URI)
    assert driver.statistics().mmap_buffers == 1
    driver.faults.suspend_next_invoke(handle)
    assert echo(session, handle, b"suspended") == b"suspended"
    stats = driver.statistics()
    assert (stats.mmap_buffers, stats.interrupted_mmaps) == (0, 1)
    with caplog.at_level(logging.WARNING, logger="npud.fastrpc.reverse.apps_mem"):
        session.remote_close(handle)  # the DSP gives its growth back: EINVAL now
        # The pages are still the DSP's (the channel keeps them): the next load uses
        # them, and giving them back again is refused by npud, not sent to the kernel.
        again = session.remote_open(ECHO_URI)
        assert echo(session, again, b"again") == b"again"
        session.remote_close(again)
    assert driver.munmaps == [errno.EINVAL]  # the moved buffer reached the kernel once
    taken = [r for r in caplog.records if "no longer on this session's fd" in r.getMessage()]
    assert len(taken) == 1
    assert session.listener_running
    assert not session.dead


def test_a_suspend_queues_like_the_other_faults() -> None:
    driver = EmulatedDriver()
    with pytest.raises(ValueError, match="handle"):
        driver.faults.suspend_next_invoke(handle=-1)
    driver.faults.suspend_next_invoke()
    assert driver.faults.pending_failures == 1
    driver.faults.clear()
    assert driver.faults.pending_failures == 0
