"""Stale mappings on kernels that find a map by fd number only (before linux-next).

When a MEM_UNMAP fails, the kernel keeps the mapping under the buffer's fd
number. On such kernels (``SimConfig.map_match_fd_only``) a new buffer that
gets the same fd number aliases that stale mapping: an invoke through it
reads and writes the *old* buffer. The session therefore keeps the fd of a
buffer whose MEM_UNMAP failed open until it closes.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from collections.abc import Iterator

import pytest

from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Inline, Slice
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from tests.emulator import sim_helpers
from tests.emulator.conftest import ECHO_URI, open_fds

ECHO_SC = 0x02020100


# --- the emulator behaves like those kernels ---------------------------------------


@pytest.mark.parametrize("fd_only", [True, False])
def test_a_reused_fd_number_aliases_a_stale_mapping_on_old_kernels(fd_only: bool) -> None:
    driver = EmulatedDriver(SimConfig(map_match_fd_only=fd_only))
    with sim_helpers.running_process(driver) as (fd, _responder):
        echo = sim_helpers.open_skel(driver, fd)
        old = sim_helpers.alloc_dma_buf(driver, fd, 4096)
        old_view = mmap.mmap(old, 4096)
        old_view[1024:1043] = b"X" * 19  # what the old buffer holds where the input points
        vaddr = sim_helpers.mem_map(driver, fd, old, 4096)
        driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_MEM_UNMAP, errno.ETIMEDOUT)
        assert sim_helpers.errno_of(sim_helpers.mem_unmap, driver, fd, old, vaddr) == (
            errno.ETIMEDOUT
        )
        number = old
        os.close(old)  # the mapping stays in the kernel; the number is free
        new = sim_helpers.alloc_dma_buf(driver, fd, 4096)
        assert new == number
        new_view = mmap.mmap(new, 4096)
        try:
            data = b"where does this go?"
            source = sim_helpers.address_of(new_view, 1024)
            new_view[1024 : 1024 + len(data)] = data
            target = sim_helpers.address_of(new_view, 0)
            prim = struct.pack("<II", len(data), len(data))
            holder = (ctypes.c_char * 8).from_buffer_copy(prim)
            result = sim_helpers.invoke_args(
                driver,
                fd,
                echo,
                ECHO_SC,
                [
                    sim_helpers.Arg(ctypes.addressof(holder), 8),
                    sim_helpers.Arg(source, len(data), new),
                    sim_helpers.Arg(target, len(data), new),
                ],
            )
            assert result == 0
            if fd_only:
                # The kernel used the stale mapping: the DSP read and wrote the old buffer.
                assert bytes(old_view[: len(data)]) == b"X" * len(data)
                assert bytes(new_view[: len(data)]) == bytes(len(data))
            else:
                assert bytes(new_view[: len(data)]) == data
                assert bytes(old_view[: len(data)]) == bytes(len(data))
        finally:
            new_view.close()
            old_view.close()
            os.close(new)


def test_mem_map_of_a_reused_number_maps_the_old_buffer_on_old_kernels() -> None:
    driver = EmulatedDriver(SimConfig(map_match_fd_only=True))
    with sim_helpers.running_process(driver) as (fd, _responder):
        old = sim_helpers.alloc_dma_buf(driver, fd, 8192)
        sim_helpers.mem_map(driver, fd, old, 8192)
        # Same fd number, still the same buffer: the kernel reuses the map (no harm).
        again = sim_helpers.mem_map(driver, fd, old, 4096)
        assert driver.statistics().mem_maps == 2
        assert sim_helpers.mem_unmap(driver, fd, old, again) == 0
        os.close(old)
        assert driver.statistics().mem_maps == 1


# --- the session keeps the fd of a buffer whose MEM_UNMAP failed ---------------------


@pytest.fixture
def old_kernel() -> Iterator[tuple[EmulatedDriver, FastRpcSession]]:
    before = open_fds()
    driver = EmulatedDriver(SimConfig(map_match_fd_only=True))
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    yield driver, session
    session.close()
    assert open_fds() == before, "the parked fd was not closed with the session"


def test_a_failed_mem_unmap_parks_the_fd_so_its_number_is_not_reused(
    old_kernel: tuple[EmulatedDriver, FastRpcSession],
) -> None:
    driver, session = old_kernel
    echo = session.remote_open(ECHO_URI)
    first = session.alloc(4096)
    session.map(first)
    number = first.fd
    driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_MEM_UNMAP, errno.ETIMEDOUT)
    with pytest.raises(RpcError) as caught:
        session.free(first)
    assert caught.value.code is ErrorCode.TIMEOUT
    assert session.statistics().stale_fds == 1
    os.fstat(number)  # still open: nobody else can get this number

    second = session.alloc(4096)
    assert second.fd != number
    data = b"lands in the new buffer"
    second.view()[1024 : 1024 + len(data)] = data
    prim = struct.pack("<II", len(data), len(data))
    result = session.invoke(
        echo,
        ECHO_SC,
        [Inline(prim), Slice(second, 1024, len(data))],
        [Slice(second, 0, len(data))],
    )
    assert result.rc == 0
    assert bytes(second.view()[: len(data)]) == data
    session.free(second)


def test_a_failed_mem_unmap_by_the_dsp_parks_too(
    old_kernel: tuple[EmulatedDriver, FastRpcSession],
) -> None:
    driver, session = old_kernel
    buffer = session.alloc(4096)
    session.map(buffer)
    driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_MEM_UNMAP, errno.EINVAL)
    with pytest.raises(RpcError):
        session.free(buffer)
    assert session.statistics().stale_fds == 1
    assert session.statistics().buffers == 0  # the client's view: it is gone


def test_an_unmap_that_fails_leaves_the_buffer_mapped_and_usable(
    old_kernel: tuple[EmulatedDriver, FastRpcSession],
) -> None:
    driver, session = old_kernel
    buffer = session.alloc(4096)
    address = session.map(buffer)
    driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_MEM_UNMAP, errno.ETIMEDOUT)
    with pytest.raises(RpcError):
        session.unmap(buffer)
    assert session.address_of(buffer) == address
    assert session.statistics().stale_fds == 0
    session.unmap(buffer)  # the retry works
    session.free(buffer)
    assert session.statistics().stale_fds == 0
