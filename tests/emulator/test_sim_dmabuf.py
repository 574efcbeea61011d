"""ALLOC_DMA_BUFF: sealed memfds, mmap rules, identity by inode, no leaks."""

from __future__ import annotations

import array
import errno
import fcntl
import gc
import mmap
import os
import socket
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver, SimConfig
from npud.sim.dmabuf import SWEEP_MIN
from tests.emulator.sim_helpers import (
    PAGE,
    alloc_dma_buf,
    errno_of,
    init_create,
    mem_map,
    mem_unmap,
    open_fd_count,
)


@pytest.fixture
def driver() -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver()
    yield driver
    assert driver.statistics().device_fds_open == 0


@pytest.fixture
def device(driver: EmulatedDriver) -> Iterator[int]:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    yield fd
    driver.close(fd)


def test_alloc_returns_a_new_sealed_memfd(driver: EmulatedDriver, device: int) -> None:
    request = abi.fastrpc_alloc_dma_buf(fd=-1, flags=0xDEAD, size=2 * PAGE)
    assert driver.ioctl(device, abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, request) == 0
    buf = request.fd
    try:
        assert buf >= 0
        assert buf != device
        assert os.readlink(f"/proc/self/fd/{buf}") == "/memfd:fastrpc-dmabuf (deleted)"
        assert os.fstat(buf).st_size == 2 * PAGE
        seals = fcntl.fcntl(buf, fcntl.F_GET_SEALS)
        assert seals == fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
        assert fcntl.fcntl(buf, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    finally:
        driver.close(buf)


def test_the_buffer_cannot_grow_or_shrink(driver: EmulatedDriver, device: int) -> None:
    buf = alloc_dma_buf(driver, device, PAGE)
    try:
        for size in (2 * PAGE, PAGE // 2, 0):
            with pytest.raises(PermissionError):
                os.ftruncate(buf, size)
        with pytest.raises(PermissionError):
            fcntl.fcntl(buf, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        os.pwrite(buf, b"x", 0)  # writable in place
    finally:
        driver.close(buf)


def test_size_zero_is_einval(driver: EmulatedDriver, device: int) -> None:
    assert (
        errno_of(
            driver.ioctl,
            device,
            abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF,
            abi.fastrpc_alloc_dma_buf(size=0),
        )
        == errno.EINVAL
    )


@pytest.mark.parametrize("size", [(1 << 32) + 1, 1 << 63, (1 << 64) - 1])
def test_huge_sizes_are_enomem(driver: EmulatedDriver, device: int, size: int) -> None:
    before = open_fd_count()
    assert (
        errno_of(
            driver.ioctl,
            device,
            abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF,
            abi.fastrpc_alloc_dma_buf(size=size),
        )
        == errno.ENOMEM
    )
    assert open_fd_count() == before


def test_the_pool_limit_is_configurable() -> None:
    driver = EmulatedDriver(SimConfig(max_dma_buf_size=PAGE))
    fd = driver.open(abi.CDSP_NODE, 0)
    try:
        driver.close(alloc_dma_buf(driver, fd, PAGE))
        assert errno_of(alloc_dma_buf, driver, fd, PAGE + 1) == errno.ENOMEM
    finally:
        driver.close(fd)


def test_mmap_shares_memory_between_mappings(driver: EmulatedDriver, device: int) -> None:
    buf = alloc_dma_buf(driver, device, 2 * PAGE)
    first = driver.mmap(buf, 2 * PAGE)
    second = driver.mmap(buf, PAGE, PAGE)
    try:
        first[PAGE : PAGE + 5] = b"hello"
        assert second[:5] == b"hello"
        assert os.pread(buf, 5, PAGE) == b"hello"
    finally:
        second.close()
        first.close()
        driver.close(buf)


@pytest.mark.parametrize(
    ("size", "length", "offset"),
    [
        (PAGE, PAGE + 1, 0),  # past the end
        (2 * PAGE, PAGE, 2 * PAGE),  # offset at the end
        (PAGE, PAGE, 100),  # unaligned offset
        (PAGE, 0, 0),  # empty
        (100, 100, 0),  # the last partial page is not mappable (dma_buf_mmap_internal)
        (PAGE + 100, PAGE + 1, 0),
    ],
)
def test_mmap_rules_of_the_dma_buf(
    driver: EmulatedDriver, device: int, size: int, length: int, offset: int
) -> None:
    buf = alloc_dma_buf(driver, device, size)
    try:
        assert errno_of(driver.mmap, buf, length, offset) == errno.EINVAL
    finally:
        driver.close(buf)


def test_mmap_of_a_foreign_fd_is_a_plain_mmap(driver: EmulatedDriver, tmp_path: object) -> None:
    foreign = os.memfd_create("not-a-dmabuf")
    os.ftruncate(foreign, 100)
    mapping = driver.mmap(foreign, 100)  # no dma-buf page rule for it
    mapping.close()
    os.close(foreign)


def test_closing_fd_and_mapping_frees_the_buffer(driver: EmulatedDriver, device: int) -> None:
    before = open_fd_count()
    buf = alloc_dma_buf(driver, device, PAGE)
    mapping = driver.mmap(buf, PAGE)
    assert driver.statistics().dma_bufs_alive == 1
    driver.close(buf)
    assert driver.statistics().dma_bufs_alive == 1  # the mapping keeps it alive
    mapping.close()
    assert driver.statistics().dma_bufs_alive == 0
    assert open_fd_count() == before
    assert driver.statistics().dma_bufs_allocated == 1


def test_no_fd_leaks_over_many_allocations(driver: EmulatedDriver, device: int) -> None:
    before = open_fd_count()
    for _ in range(50):
        buf = alloc_dma_buf(driver, device, PAGE)
        driver.mmap(buf, PAGE).close()
        driver.close(buf)
    gc.collect()
    assert open_fd_count() == before
    assert driver.statistics().dma_bufs_alive == 0


def test_a_dup_is_the_same_buffer(driver: EmulatedDriver, device: int) -> None:
    assert init_create(driver, device) == 0
    buf = alloc_dma_buf(driver, device, PAGE)
    copy = os.dup(buf)
    driver.close(buf)
    try:
        vaddr = mem_map(driver, device, copy, PAGE)
        assert mem_unmap(driver, device, copy, vaddr) == 0
        driver.mmap(copy, PAGE).close()
    finally:
        os.close(copy)


def test_an_fd_passed_over_scm_rights_is_recognised(driver: EmulatedDriver, device: int) -> None:
    assert init_create(driver, device) == 0
    buf = alloc_dma_buf(driver, device, PAGE)
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        left.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [buf]))])
        driver.close(buf)
        _, ancillary, _, _ = right.recvmsg(1, socket.CMSG_SPACE(4))
        received = array.array("i", ancillary[0][2][:4])[0]
    try:
        vaddr = mem_map(driver, device, received, PAGE)
        assert mem_unmap(driver, device, -1, vaddr) == 0
    finally:
        os.close(received)


def test_alloc_works_without_a_process(driver: EmulatedDriver, device: int) -> None:
    buf = alloc_dma_buf(driver, device, PAGE)
    mapping = driver.mmap(buf, PAGE)
    mapping.close()
    driver.close(buf)
    assert isinstance(mapping, mmap.mmap)


# -- the registry forgets freed buffers (it used to keep one entry per allocation) --------


def _churn(driver: EmulatedDriver, device: int, count: int) -> None:
    """Allocate, map, unmap and close ``count`` buffers."""
    for _ in range(count):
        buf = alloc_dma_buf(driver, device, PAGE)
        driver.mmap(buf, PAGE).close()
        driver.close(buf)


def test_the_registry_forgets_freed_buffers(driver: EmulatedDriver, device: int) -> None:
    _churn(driver, device, 10 * SWEEP_MIN)
    stats = driver.statistics()
    assert stats.dma_bufs_allocated == 10 * SWEEP_MIN
    assert stats.dma_bufs_registered <= 2 * SWEEP_MIN
    assert stats.dma_bufs_alive == 0


def test_buffers_closed_with_os_close_are_forgotten_too(
    driver: EmulatedDriver, device: int
) -> None:
    for _ in range(10 * SWEEP_MIN):
        os.close(alloc_dma_buf(driver, device, PAGE))  # a close the emulator does not see
    assert driver.statistics().dma_bufs_registered <= 2 * SWEEP_MIN


def test_a_sweep_keeps_every_buffer_still_referenced(driver: EmulatedDriver, device: int) -> None:
    assert init_create(driver, device) == 0
    by_dup = alloc_dma_buf(driver, device, PAGE)
    copy = os.dup(by_dup)
    driver.close(by_dup)
    by_mapping = alloc_dma_buf(driver, device, PAGE)
    mapping = driver.mmap(by_mapping, PAGE)
    driver.close(by_mapping)
    by_mem_map = alloc_dma_buf(driver, device, PAGE)
    vaddr = mem_map(driver, device, by_mem_map, PAGE)
    os.close(by_mem_map)  # only the DSP's mapping holds it now
    try:
        _churn(driver, device, 4 * SWEEP_MIN)
        stats = driver.statistics()
        assert stats.dma_bufs_alive == 3
        assert stats.dma_bufs_registered <= 2 * SWEEP_MIN
        # Still recognised after the sweeps: the dup maps into the DSP and back.
        assert mem_unmap(driver, device, copy, mem_map(driver, device, copy, PAGE)) == 0
    finally:
        assert mem_unmap(driver, device, -1, vaddr) == 0
        mapping.close()
        os.close(copy)
    _churn(driver, device, 4 * SWEEP_MIN)
    assert driver.statistics().dma_bufs_alive == 0
