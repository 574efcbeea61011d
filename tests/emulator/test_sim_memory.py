"""MMAP/MUNMAP (DSP heap growth) and MEM_MAP/MEM_UNMAP (dma-bufs into the DSP)."""

from __future__ import annotations

import errno
import gc
import os
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver
from tests.emulator.sim_helpers import (
    AEE_EBADPARM,
    AEE_EBADSTATE,
    PAGE,
    alloc_dma_buf,
    errno_of,
    exit_process,
    init_create,
    mem_map,
    mem_unmap,
    mmap_heap,
    open_fd_count,
)

DSP_VA_START = 0x1000_0000
DSP_VA_END = 0xFFFF_F000


@pytest.fixture
def driver() -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver()
    yield driver
    stats = driver.statistics()
    assert (stats.device_fds_open, stats.mem_maps, stats.mmap_buffers) == (0, 0, 0)


@pytest.fixture
def device(driver: EmulatedDriver) -> Iterator[int]:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    assert init_create(driver, fd) == 0
    yield fd
    driver.close(fd)


# -- MMAP / MUNMAP ------------------------------------------------------------------


@pytest.mark.parametrize("flags", [0x1000, 0x8])
def test_mmap_returns_page_aligned_dsp_addresses(
    driver: EmulatedDriver, device: int, flags: int
) -> None:
    first = mmap_heap(driver, device, 3 * PAGE + 1, flags)
    second = mmap_heap(driver, device, PAGE)
    assert DSP_VA_START <= first < second < DSP_VA_END
    assert first % PAGE == second % PAGE == 0
    assert second >= first + 4 * PAGE  # the first took four pages
    assert driver.statistics().mmap_buffers == 2
    unmap = abi.fastrpc_req_munmap(vaddrout=first, size=3 * PAGE + 1)
    assert driver.ioctl(device, abi.FASTRPC_IOCTL_MUNMAP, unmap) == 0
    assert mmap_heap(driver, device, PAGE) == first  # first fit reuses the gap
    assert driver.statistics().mmap_buffers == 2


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (abi.fastrpc_req_mmap(flags=0, size=PAGE), errno.EINVAL),
        (abi.fastrpc_req_mmap(flags=0x3000, size=PAGE), errno.EINVAL),  # ADD_PAGES_LLC
        (abi.fastrpc_req_mmap(flags=4, size=PAGE), errno.EINVAL),
        (abi.fastrpc_req_mmap(flags=0x1000, vaddrin=0x1000, size=PAGE), errno.EINVAL),
        (abi.fastrpc_req_mmap(flags=0x1000, size=0), errno.ENOMEM),
        (abi.fastrpc_req_mmap(flags=0x1000, size=1 << 40), errno.ENOMEM),
    ],
)
def test_mmap_errors(
    driver: EmulatedDriver, device: int, request_: abi.fastrpc_req_mmap, expected: int
) -> None:
    assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_MMAP, request_) == expected


def test_the_dsp_address_space_runs_out(driver: EmulatedDriver, device: int) -> None:
    span = DSP_VA_END - DSP_VA_START
    for _ in range(span // (256 * 1024 * 1024)):
        mmap_heap(driver, device, 256 * 1024 * 1024)
    request = abi.fastrpc_req_mmap(flags=0x1000, size=256 * 1024 * 1024)
    assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_MMAP, request) == errno.ENOMEM
    buf = alloc_dma_buf(driver, device, PAGE)
    try:
        map_request = abi.fastrpc_mem_map(fd=buf, length=PAGE)
        # MEM_MAP shares the address space; what is left is smaller than 256 MiB
        # but a page still fits.
        assert driver.ioctl(device, abi.FASTRPC_IOCTL_MEM_MAP, map_request) == 0
        assert mem_unmap(driver, device, buf, map_request.vaddrout) == 0
    finally:
        driver.close(buf)


def test_munmap_needs_the_exact_address_and_size(driver: EmulatedDriver, device: int) -> None:
    vaddr = mmap_heap(driver, device, 2 * PAGE)
    for wrong in [
        abi.fastrpc_req_munmap(vaddrout=vaddr, size=PAGE),
        abi.fastrpc_req_munmap(vaddrout=vaddr + PAGE, size=2 * PAGE),
        abi.fastrpc_req_munmap(vaddrout=0, size=0),
    ]:
        assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_MUNMAP, wrong) == errno.EINVAL
    exact = abi.fastrpc_req_munmap(vaddrout=vaddr, size=2 * PAGE)
    assert driver.ioctl(device, abi.FASTRPC_IOCTL_MUNMAP, exact) == 0
    assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_MUNMAP, exact) == errno.EINVAL


def test_mmap_needs_a_process(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    try:
        request = abi.fastrpc_req_mmap(flags=0x1000, size=PAGE)
        assert driver.ioctl(fd, abi.FASTRPC_IOCTL_MMAP, request) == AEE_EBADSTATE
        unmap = abi.fastrpc_req_munmap(vaddrout=DSP_VA_START, size=PAGE)
        assert errno_of(driver.ioctl, fd, abi.FASTRPC_IOCTL_MUNMAP, unmap) == errno.EINVAL
    finally:
        driver.close(fd)


def test_close_drops_heap_buffers(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    assert init_create(driver, fd) == 0
    mmap_heap(driver, fd, PAGE)
    assert driver.statistics().mmap_buffers == 1
    driver.close(fd)
    assert driver.statistics().mmap_buffers == 0


# -- MEM_MAP / MEM_UNMAP ----------------------------------------------------------------


def test_mem_map_and_unmap(driver: EmulatedDriver, device: int) -> None:
    buf = alloc_dma_buf(driver, device, 4 * PAGE)
    try:
        whole = mem_map(driver, device, buf, 4 * PAGE)
        tail = mem_map(driver, device, buf, 100, offset=PAGE + 12)
        assert DSP_VA_START <= whole < DSP_VA_END
        assert whole % PAGE == 0
        assert tail % PAGE == 12  # the address of byte 'offset'
        assert driver.statistics().mem_maps == 2
        assert mem_unmap(driver, device, buf, tail) == 0
        assert mem_unmap(driver, device, -1, whole) == 0  # a negative fd matches any
        assert driver.statistics().mem_maps == 0
    finally:
        driver.close(buf)


def test_mem_unmap_matches_address_and_fd(driver: EmulatedDriver, device: int) -> None:
    buf = alloc_dma_buf(driver, device, PAGE)
    other = alloc_dma_buf(driver, device, PAGE)
    try:
        vaddr = mem_map(driver, device, buf, PAGE)
        for fd, address in [(other, vaddr), (buf, vaddr + PAGE), (buf, 0)]:
            request = abi.fastrpc_mem_unmap(fd=fd, vaddr=address, length=PAGE)
            assert (
                errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_MEM_UNMAP, request) == errno.EINVAL
            )
        assert mem_unmap(driver, device, buf, vaddr) == 0
        request = abi.fastrpc_mem_unmap(fd=buf, vaddr=vaddr)
        assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_MEM_UNMAP, request) == errno.EINVAL
    finally:
        driver.close(other)
        driver.close(buf)


def test_mem_map_errors(driver: EmulatedDriver, device: int) -> None:
    buf = alloc_dma_buf(driver, device, PAGE)
    foreign = os.memfd_create("foreign")
    os.ftruncate(foreign, PAGE)
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)
    try:
        cases = [
            (abi.fastrpc_mem_map(fd=closed, length=PAGE), errno.EBADF),
            (abi.fastrpc_mem_map(fd=-1, length=PAGE), errno.EBADF),
            (abi.fastrpc_mem_map(fd=foreign, length=PAGE), errno.EINVAL),
            (abi.fastrpc_mem_map(fd=buf, length=PAGE + 1), errno.EINVAL),
        ]
        for request, expected in cases:
            assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_MEM_MAP, request) == expected
        for request in [
            abi.fastrpc_mem_map(fd=buf, length=0),
            abi.fastrpc_mem_map(fd=buf, offset=-1, length=16),
            abi.fastrpc_mem_map(fd=buf, offset=PAGE - 8, length=16),
        ]:
            assert driver.ioctl(device, abi.FASTRPC_IOCTL_MEM_MAP, request) == AEE_EBADPARM
        assert driver.statistics().mem_maps == 0
    finally:
        os.close(foreign)
        driver.close(buf)


def test_mem_map_needs_a_process(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    buf = alloc_dma_buf(driver, fd, PAGE)
    try:
        request = abi.fastrpc_mem_map(fd=buf, length=PAGE)
        assert driver.ioctl(fd, abi.FASTRPC_IOCTL_MEM_MAP, request) == AEE_EBADSTATE
        unmap = abi.fastrpc_mem_unmap(fd=-1, vaddr=DSP_VA_START)
        assert errno_of(driver.ioctl, fd, abi.FASTRPC_IOCTL_MEM_UNMAP, unmap) == errno.EINVAL
    finally:
        driver.close(buf)
        driver.close(fd)


def test_a_mapping_keeps_the_buffer_alive(driver: EmulatedDriver, device: int) -> None:
    before = open_fd_count()
    buf = alloc_dma_buf(driver, device, PAGE)
    os.pwrite(buf, b"kept", 0)
    vaddr = mem_map(driver, device, buf, PAGE)
    driver.close(buf)  # the caller's last fd
    assert driver.statistics().dma_bufs_alive == 1
    assert mem_unmap(driver, device, -1, vaddr) == 0
    gc.collect()
    assert driver.statistics().dma_bufs_alive == 0
    assert open_fd_count() == before


def test_close_drops_mappings_and_their_references(driver: EmulatedDriver) -> None:
    before = open_fd_count()
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    assert init_create(driver, fd) == 0
    buf = alloc_dma_buf(driver, fd, PAGE)
    mem_map(driver, fd, buf, PAGE)
    mem_map(driver, fd, buf, PAGE)
    driver.close(buf)
    assert driver.statistics().mem_maps == 2
    driver.close(fd)
    stats = driver.statistics()
    assert (stats.mem_maps, stats.dma_bufs_alive) == (0, 0)
    assert open_fd_count() == before


def test_after_exit_mapping_fails_but_unmapping_succeeds(
    driver: EmulatedDriver, device: int
) -> None:
    buf = alloc_dma_buf(driver, device, PAGE)
    try:
        vaddr = mem_map(driver, device, buf, PAGE)
        heap = mmap_heap(driver, device, PAGE)
        assert exit_process(driver, device) == 0
        request = abi.fastrpc_mem_map(fd=buf, length=PAGE)
        assert driver.ioctl(device, abi.FASTRPC_IOCTL_MEM_MAP, request) == AEE_EBADSTATE
        heap_request = abi.fastrpc_req_mmap(flags=0x1000, size=PAGE)
        assert driver.ioctl(device, abi.FASTRPC_IOCTL_MMAP, heap_request) == AEE_EBADSTATE
        assert mem_unmap(driver, device, buf, vaddr) == 0
        unmap = abi.fastrpc_req_munmap(vaddrout=heap, size=PAGE)
        assert driver.ioctl(device, abi.FASTRPC_IOCTL_MUNMAP, unmap) == 0
    finally:
        driver.close(buf)
