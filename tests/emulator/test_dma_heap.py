"""The system DMA-BUF heap, /dev/dma_heap/system, as drivers/dma-buf/dma-heap.c answers.

Its one command is checked against the C compiler's view of linux/dma-heap.h; every
errno of the allocation is provoked; a heap buffer belongs to no session: it maps into
two at once and outlives a subsystem restart.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver, SimConfig, layout
from npud.sim.dma_heap import SYSTEM_HEAP_NODE
from tests.emulator.sim_helpers import (
    PAGE,
    Arg,
    address_of,
    errno_of,
    invoke_args,
    mem_map,
    mem_unmap,
    open_fd_count,
    open_skel,
    running_process,
)
from tests.tools import require_file, require_tool

HEADER: Final = Path("/usr/include/linux/dma-heap.h")
ALLOC: Final = layout.DMA_HEAP_IOCTL_ALLOC
RDWR_CLOEXEC: Final = os.O_RDWR | os.O_CLOEXEC


class Allocation(ctypes.Structure):
    """struct dma_heap_allocation_data, as a caller declares it."""

    _fields_ = (
        ("len", ctypes.c_uint64),
        ("fd", ctypes.c_uint32),
        ("fd_flags", ctypes.c_uint32),
        ("heap_flags", ctypes.c_uint64),
    )


def _ioc(direction: int, kind: str, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (ord(kind) << 8) | nr


@pytest.fixture
def driver() -> EmulatedDriver:
    return EmulatedDriver()


@pytest.fixture
def heap(driver: EmulatedDriver) -> Iterator[int]:
    fd = driver.open(SYSTEM_HEAP_NODE, os.O_RDONLY | os.O_CLOEXEC)
    yield fd
    driver.close(fd)


def allocate(driver: EmulatedDriver, heap: int, size: int, fd_flags: int = RDWR_CLOEXEC) -> int:
    request = Allocation(len=size, fd=0, fd_flags=fd_flags, heap_flags=0)
    assert driver.ioctl(heap, ALLOC, request) == 0
    return int(request.fd)


# -- the ABI ------------------------------------------------------------------------------------


def test_the_layout_matches_the_kernel_header(tmp_path: Path) -> None:
    gcc = require_tool("gcc", "gcc")
    require_file(HEADER, "linux-libc-dev")
    source = tmp_path / "heap.c"
    source.write_text(
        "#define _GNU_SOURCE\n#include <fcntl.h>\n#include <stddef.h>\n#include <stdio.h>\n"
        "#include <linux/dma-heap.h>\n"
        "int main(void) {\n"
        '  printf("%lu %zu %zu %zu %zu %zu %lu %lu\\n", (unsigned long)DMA_HEAP_IOCTL_ALLOC,\n'
        "    sizeof(struct dma_heap_allocation_data),\n"
        "    offsetof(struct dma_heap_allocation_data, len),\n"
        "    offsetof(struct dma_heap_allocation_data, fd),\n"
        "    offsetof(struct dma_heap_allocation_data, fd_flags),\n"
        "    offsetof(struct dma_heap_allocation_data, heap_flags),\n"
        "    (unsigned long)DMA_HEAP_VALID_FD_FLAGS, (unsigned long)DMA_HEAP_VALID_HEAP_FLAGS);\n"
        "  return 0;\n}\n"
    )
    binary = tmp_path / "heap"
    subprocess.run(
        [gcc, "-std=c11", "-Wall", "-Werror", "-o", str(binary), str(source)], check=True
    )
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    request, size, *offsets, fd_flags, heap_flags = (int(x) for x in out.split())
    assert request == ALLOC == 0xC0184800
    assert size == layout.DMA_HEAP_ALLOCATION_STRUCT.size == ctypes.sizeof(Allocation)
    assert offsets == [0, layout.DMA_HEAP_ALLOCATION_FD_OFFSET, 12, 16]
    assert (fd_flags, heap_flags) == (
        layout.DMA_HEAP_VALID_FD_FLAGS,
        layout.DMA_HEAP_VALID_HEAP_FLAGS,
    )


# -- the device ------------------------------------------------------------------------------------


def test_a_buffer_from_the_heap(driver: EmulatedDriver, heap: int) -> None:
    buf = allocate(driver, heap, 5000)
    try:
        assert os.fstat(buf).st_size == 2 * PAGE  # whole pages
        assert os.readlink(f"/proc/self/fd/{buf}") == "/memfd:dma_heap-system (deleted)"
        seals = fcntl.fcntl(buf, fcntl.F_GET_SEALS)
        assert seals & (fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK) == (
            fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
        )
        assert fcntl.fcntl(buf, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        with driver.mmap(buf, 2 * PAGE) as mapping:
            mapping[:5] = b"heaps"
        stats = driver.statistics()
        assert (stats.dma_heap_fds_open, stats.dma_heap_allocations) == (1, 1)
        assert stats.dma_bufs_allocated == 1
    finally:
        os.close(buf)


def test_close_on_exec_follows_fd_flags(driver: EmulatedDriver, heap: int) -> None:
    buf = allocate(driver, heap, PAGE, fd_flags=os.O_RDWR)
    try:
        assert not fcntl.fcntl(buf, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        os.close(buf)


def test_the_heap_device_is_no_fastrpc_device(driver: EmulatedDriver, heap: int) -> None:
    # The heap's dispatcher looks at the command's number only: any but 0 is EINVAL.
    invoke = abi.fastrpc_invoke(handle=0x100, sc=0, args=0)
    assert errno_of(driver.ioctl, heap, abi.FASTRPC_IOCTL_INVOKE, invoke) == errno.EINVAL
    mem = abi.fastrpc_mem_map(fd=-1, length=PAGE)
    assert errno_of(driver.ioctl, heap, abi.FASTRPC_IOCTL_MEM_MAP, mem) == errno.EINVAL
    assert errno_of(driver.mmap, heap, PAGE) == errno.ENODEV
    # The other way round: a FastRPC device does not know the heap's command.
    device = driver.open(abi.CDSP_NODE, os.O_RDWR)
    try:
        assert errno_of(driver.ioctl, device, ALLOC, Allocation(len=PAGE)) == errno.ENOTTY
    finally:
        driver.close(device)


def test_a_machine_without_the_heap(driver: EmulatedDriver) -> None:
    bare = EmulatedDriver(SimConfig(dma_heap=False, pd_isolation="thread"))
    assert errno_of(bare.open, SYSTEM_HEAP_NODE, os.O_RDONLY) == errno.ENOENT
    assert errno_of(driver.open, "/dev/dma_heap/reserved", os.O_RDONLY) == errno.ENOENT


# -- every errno of the allocation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"len": PAGE, "fd": 7}, errno.EINVAL),  # fd must be 0 on entry
        ({"len": PAGE, "fd_flags": os.O_RDWR | os.O_NONBLOCK}, errno.EINVAL),
        ({"len": PAGE, "fd_flags": 0o100}, errno.EINVAL),  # O_CREAT
        ({"len": PAGE, "heap_flags": 1}, errno.EINVAL),
        ({"len": 0}, errno.EINVAL),
        ({"len": (1 << 64) - 1}, errno.EINVAL),  # PAGE_ALIGN wraps to 0
        ({"len": (1 << 32) + 1}, errno.ENOMEM),  # more than the emulator's DMA memory
    ],
)
def test_allocation_refusals(
    driver: EmulatedDriver, heap: int, fields: dict[str, int], expected: int
) -> None:
    before = open_fd_count()
    request = Allocation(**{"fd_flags": RDWR_CLOEXEC, **fields})
    assert errno_of(driver.ioctl, heap, ALLOC, request) == expected
    assert open_fd_count() == before
    assert driver.statistics().dma_heap_allocations == 0


def test_an_injected_failure(driver: EmulatedDriver, heap: int) -> None:
    driver.faults.fail_next_heap_alloc()
    driver.faults.fail_next_heap_alloc(errno.EMFILE)
    before = open_fd_count()
    assert errno_of(driver.ioctl, heap, ALLOC, Allocation(len=PAGE)) == errno.ENOMEM
    assert errno_of(driver.ioctl, heap, ALLOC, Allocation(len=PAGE)) == errno.EMFILE
    assert open_fd_count() == before
    os.close(allocate(driver, heap, PAGE))  # used up: the next one works
    driver.faults.fail_next_ioctl(ALLOC, errno.ENOMEM)  # the generic ioctl fault applies too
    assert errno_of(driver.ioctl, heap, ALLOC, Allocation(len=PAGE)) == errno.ENOMEM
    with pytest.raises(ValueError, match="errno"):
        driver.faults.fail_next_heap_alloc(0)


def test_bad_arguments_are_efault(driver: EmulatedDriver, heap: int) -> None:
    before = open_fd_count()
    assert errno_of(driver.ioctl, heap, ALLOC, None) == errno.EFAULT
    assert errno_of(driver.ioctl, heap, ALLOC, bytearray(16)) == errno.EFAULT  # too short
    # A result that cannot be written back: EFAULT, and no fd stays behind.
    readonly = memoryview(bytes(Allocation(len=PAGE, fd_flags=RDWR_CLOEXEC)))
    assert errno_of(driver.ioctl, heap, ALLOC, readonly) == errno.EFAULT
    assert open_fd_count() == before


def test_any_word_numbered_0_is_the_allocation(driver: EmulatedDriver, heap: int) -> None:
    """The kernel sizes the copies by the word's own size and directions."""
    old = bytearray(struct.pack("<QII", PAGE, 0, RDWR_CLOEXEC))  # a 16-byte caller: no heap_flags
    assert driver.ioctl(heap, _ioc(3, "H", 0, 16), old) == 0
    os.close(struct.unpack_from("<I", old, 8)[0])
    # Write-only: nothing is copied back, so the new fd is not reported (the emulator
    # closes it; the kernel leaves it to leak).
    before = open_fd_count()
    assert driver.ioctl(heap, _ioc(1, "X", 0, 24), bytearray(Allocation(len=PAGE))) == 0
    assert open_fd_count() == before
    assert driver.statistics().dma_heap_allocations == 2
    # Read-only: nothing is copied in, so the length is 0.
    assert errno_of(driver.ioctl, heap, _ioc(2, "H", 0, 24), bytearray(24)) == errno.EINVAL
    assert errno_of(driver.ioctl, heap, _ioc(3, "H", 1, 24), bytearray(24)) == errno.EINVAL


# -- a buffer of no session ---------------------------------------------------------------------------


def _echo_slices(driver: EmulatedDriver, fd: int, handle: int, buf: int, address: int) -> int:
    prim = ctypes.create_string_buffer(struct.pack("<II", 8, 8), 8)
    args = [
        Arg(ctypes.addressof(prim), 8),
        Arg(address, 8, fd=buf),
        Arg(address + PAGE, 8, fd=buf),
    ]
    return invoke_args(driver, fd, handle, 0x02020100, args)


def test_one_buffer_in_two_sessions_and_through_a_restart(
    driver: EmulatedDriver, heap: int
) -> None:
    buf = allocate(driver, heap, 2 * PAGE)
    mapping = driver.mmap(buf, 2 * PAGE)
    address = address_of(mapping)
    try:
        mapping[:8] = b"sessions"
        with running_process(driver) as (first, _), running_process(driver) as (second, _):
            vaddrs = [mem_map(driver, fd, buf, 2 * PAGE) for fd in (first, second)]
            for fd in (first, second):
                assert _echo_slices(driver, fd, open_skel(driver, fd), buf, address) == 0
                assert mapping[PAGE : PAGE + 8] == b"sessions"
                mapping[PAGE : PAGE + 8] = bytes(8)
            assert driver.statistics().mem_maps == 2
            assert mem_unmap(driver, first, buf, vaddrs[0]) == 0
            driver.faults.subsystem_restart(down_for=0)
        # The sessions died with the DSP; the buffer, its fd and its bytes did not.
        assert mapping[:8] == b"sessions"
        extra = allocate(driver, heap, PAGE)  # the heap does not depend on the DSP
        os.close(extra)
        with running_process(driver) as (fd, _):
            mem_map(driver, fd, buf, 2 * PAGE)
            assert _echo_slices(driver, fd, open_skel(driver, fd), buf, address) == 0
            assert mapping[PAGE : PAGE + 8] == b"sessions"
    finally:
        mapping.close()
        os.close(buf)
    stats = driver.statistics()
    assert (stats.mem_maps, stats.dma_bufs_alive, stats.restarts) == (0, 0, 1)


def test_the_heap_buffer_maps_like_any_dma_buf(driver: EmulatedDriver, heap: int) -> None:
    buf = allocate(driver, heap, PAGE)
    try:
        assert errno_of(driver.mmap, buf, 2 * PAGE) == errno.EINVAL  # past its pages
        with mmap.mmap(buf, PAGE) as mapping:  # a mapping made elsewhere works too
            mapping[:1] = b"x"
    finally:
        os.close(buf)
