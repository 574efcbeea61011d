"""One owner per fd, closed exactly once; a leak shows up as a ResourceWarning."""

from __future__ import annotations

import gc
import mmap
import os

import pytest

from npu_client.transport import OwnedFd
from npud.fastrpc.kernel.dma import DeviceFd, DmaBuffer


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


def _buffer(steps: list[str]) -> tuple[DmaBuffer, mmap.mmap, int]:
    memfd = os.memfd_create("test-buffer")
    os.ftruncate(memfd, mmap.PAGESIZE)
    host = mmap.mmap(memfd, mmap.PAGESIZE)

    def close(fd: int) -> None:
        steps.append("close")
        os.close(fd)

    buffer = DmaBuffer(
        1,
        DeviceFd(memfd, close),
        mmap.PAGESIZE,
        host,
        before_close=lambda fd: steps.append(f"free {fd == memfd}"),
    )
    return buffer, host, memfd


def test_a_dma_buffer_releases_once_in_the_seeds_order() -> None:
    steps: list[str] = []
    buffer, host, _ = _buffer(steps)
    assert buffer.request_release()
    buffer.release()
    buffer.release()
    assert steps == ["free True", "close"]
    assert host.closed
    assert buffer.released
    assert buffer.fd == -1
    assert not buffer.request_release()  # released: nothing more to do


def test_a_dma_buffer_stays_while_an_invoke_or_a_mapping_holds_it() -> None:
    """Its owner's release is due only once the last pin and the last DSP mapping (of
    any session) are gone; whoever lets go last is told to release it."""
    steps: list[str] = []
    buffer, _, _ = _buffer(steps)
    buffer.pin()
    with buffer.lock:
        buffer.add_mapping()
        buffer.add_mapping()  # a second session maps it too
    assert not buffer.request_release()
    assert buffer.release_pending
    with pytest.raises(Exception, match="unknown buffer 1"):
        buffer.pin()  # let go: no new invoke may use it
    assert not buffer.unpin()
    with buffer.lock:
        assert not buffer.drop_mapping()
        assert buffer.drop_mapping()  # the last reason: due now
    buffer.release()
    assert steps == ["free True", "close"]


def test_a_released_dma_buffer_cannot_be_mapped() -> None:
    steps: list[str] = []
    buffer, _, _ = _buffer(steps)
    assert buffer.request_release()
    buffer.release()
    with buffer.lock, pytest.raises(Exception, match="unknown buffer 1"):
        buffer.add_mapping()
