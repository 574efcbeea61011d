"""One owner per fd, closed exactly once; a leak shows up as a ResourceWarning."""

from __future__ import annotations

import gc
import mmap
import os

import pytest

from npu_client.transport import OwnedFd
from npud.fastrpc.dma import DeviceFd, SessionBuffer


def test_an_owned_fd_left_to_the_garbage_collector_warns_and_is_closed() -> None:
    read_end, write_end = os.pipe()
    os.close(write_end)
    owned = OwnedFd(read_end)
    with pytest.warns(ResourceWarning, match=f"fd {read_end} was never closed"):
        owned.__del__()  # what the garbage collector does
    assert owned.closed
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(read_end)


def test_a_closed_or_detached_owned_fd_is_silent() -> None:
    read_end, write_end = os.pipe()
    OwnedFd(read_end).close()
    os.close(OwnedFd(write_end).detach())
    gc.collect()  # no warning: filterwarnings = error would fail this test


def test_a_device_fd_closes_once_through_its_closer() -> None:
    closed: list[int] = []
    fd = DeviceFd(42, closed.append)
    assert fd.fileno() == 42
    fd.close()
    fd.close()
    assert closed == [42]
    assert fd.closed
    assert fd.fileno() == -1


def test_a_session_buffer_releases_once_in_the_seeds_order() -> None:
    memfd = os.memfd_create("test-buffer")
    os.ftruncate(memfd, mmap.PAGESIZE)
    steps: list[str] = []
    host = mmap.mmap(memfd, mmap.PAGESIZE)

    def close(fd: int) -> None:
        steps.append("close")
        os.close(fd)

    buffer = SessionBuffer(1, DeviceFd(memfd, close), mmap.PAGESIZE, host)
    buffer.mapped_at(0xC000_0000)
    buffer.release(lambda fd: steps.append(f"free {fd == memfd}"))
    buffer.release(lambda fd: steps.append("again"))
    assert steps == ["free True", "close"]
    assert host.closed
    assert buffer.released
    assert buffer.fd == -1
    assert buffer.dsp_address is None
