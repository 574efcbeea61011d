"""The address cache: answers only for mappings it saw made, never after they end.

Every refusal must still be the kernel's own answer, so these tests count how
often the kernel is asked and reuse freed addresses on purpose.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from npud.sim import EmulatedDriver, SimConfig
from npud.sim.dmabuf import DmaBuf, DmaBufRegistry
from npud.sim.mappings import MappingTable, UserMapping
from npud.sim.vmas import Vma, VmaFinder
from tests.emulator.sim_helpers import (
    PAGE,
    SC_ECHO,
    Arg,
    address_of,
    alloc_dma_buf,
    errno_of,
    invoke_args,
    open_skel,
    running_process,
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
MAP_FIXED_NOREPLACE = 0x100000


class CountingFinder(VmaFinder):
    """Asks the kernel like VmaFinder, and counts the questions."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def find(self, address: int) -> Vma | None:
        self.asked += 1
        return super().find(address)


@pytest.fixture
def registry() -> Iterator[DmaBufRegistry]:
    registry = DmaBufRegistry(1 << 30)
    fds: list[int] = []
    original = registry.allocate

    def allocate(size: int, **options: Any) -> int:
        fds.append(original(size, **options))
        return fds[-1]

    registry.allocate = allocate  # type: ignore[method-assign]
    yield registry
    for fd in fds:
        os.close(fd)


@pytest.fixture
def finder() -> CountingFinder:
    return CountingFinder()


@pytest.fixture
def table(finder: CountingFinder) -> MappingTable:
    return MappingTable(finder)


def new_buffer(registry: DmaBufRegistry, pages: int = 2) -> tuple[int, DmaBuf]:
    fd = registry.allocate(pages * PAGE)
    buffer = registry.identify(fd)
    assert buffer is not None
    return fd, buffer


def locate_errno(table: MappingTable, buffer: DmaBuf, ptr: int, length: int) -> int:
    return errno_of(table.locate, buffer, ptr, length, "test")


def test_a_lookup_inside_a_driver_mapping_does_not_ask_the_kernel(
    registry: DmaBufRegistry, table: MappingTable, finder: CountingFinder
) -> None:
    fd, buffer = new_buffer(registry)
    with table.map(fd, buffer, 2 * PAGE, 0) as mapping:
        assert isinstance(mapping, UserMapping)
        start = address_of(mapping)
        assert table.locate(buffer, start + 100, 50, "test") == 100
        assert table.locate(buffer, start, 2 * PAGE, "test") == 0
        assert finder.asked == 0
        # A mapping made by other code: the kernel answers, correctly.
        with mmap.mmap(fd, 2 * PAGE) as plain:
            assert table.locate(buffer, address_of(plain, 8), 8, "test") == 8
        assert finder.asked == 1
    assert table.counts() == (0, 0)


def test_every_refusal_is_the_kernels(
    registry: DmaBufRegistry, table: MappingTable, finder: CountingFinder
) -> None:
    fd, buffer = new_buffer(registry)
    other_fd, other = new_buffer(registry)
    with (
        table.map(fd, buffer, 2 * PAGE, 0) as mapping,
        table.map(fd, buffer, PAGE, PAGE) as tail,
        table.map(other_fd, other, 2 * PAGE, 0) as other_mapping,
    ):
        start = address_of(mapping)
        assert locate_errno(table, buffer, start + 2 * PAGE - 8, 16) == errno.EINVAL
        assert locate_errno(table, buffer, address_of(tail), 16) == errno.EINVAL
        assert locate_errno(table, buffer, address_of(other_mapping), 16) == errno.EINVAL
        assert locate_errno(table, other, start, 16) == errno.EINVAL
        assert finder.asked == 4


def _end_by_close(mapping: mmap.mmap) -> None:
    mapping.close()


def _end_by_exit(mapping: mmap.mmap) -> None:
    with mapping:
        pass


def _end_by_garbage_collection(mapping: mmap.mmap) -> None:
    del mapping
    gc.collect()


@pytest.mark.parametrize(
    "end", [_end_by_close, _end_by_exit, _end_by_garbage_collection], ids=["close", "with", "gc"]
)
def test_a_freed_address_taken_by_another_buffer_is_not_answered_from_the_cache(
    registry: DmaBufRegistry,
    table: MappingTable,
    end: Callable[[mmap.mmap], None],
) -> None:
    fd, buffer = new_buffer(registry)
    other_fd, other = new_buffer(registry)
    mapping = table.map(fd, buffer, 2 * PAGE, 0)
    start = address_of(mapping)
    assert table.locate(buffer, start, 8, "test") == 0
    end(mapping)
    del mapping
    # Code the emulator does not see maps another buffer at exactly that address.
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    flags = mmap.MAP_SHARED | MAP_FIXED_NOREPLACE
    assert _libc.mmap(start, 2 * PAGE, prot, flags, other_fd, 0) == start
    try:
        assert locate_errno(table, buffer, start, 8) == errno.EINVAL
        assert table.locate(other, start + 8, 8, "test") == 8
    finally:
        assert _libc.munmap(start, 2 * PAGE) == 0
    assert table.counts() == (0, 0)


def test_madvise_that_splits_the_vma_hands_the_mapping_to_the_kernel(
    registry: DmaBufRegistry, table: MappingTable, finder: CountingFinder
) -> None:
    fd, buffer = new_buffer(registry)
    with table.map(fd, buffer, 2 * PAGE, 0) as mapping:
        start = address_of(mapping)
        assert table.locate(buffer, start + PAGE, 8, "test") == PAGE
        mapping.madvise(mmap.MADV_DONTFORK, PAGE, PAGE)  # the second page is now its own VMA
        assert table.counts() == (0, 0)
        # The kernel's view: the VMA holding start+PAGE begins at file offset PAGE.
        assert locate_errno(table, buffer, start + PAGE, 8) == errno.EINVAL
        assert locate_errno(table, buffer, start + PAGE - 4, 8) == errno.EINVAL
        assert table.locate(buffer, start, 8, "test") == 0
        assert finder.asked == 3


@pytest.fixture
def driver() -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver()
    yield driver
    stats = driver.statistics()
    assert (stats.user_mappings_cached, stats.dsp_mappings_cached) == (0, 0)


def _echo_args(mapping: mmap.mmap, buf: int, prim: ctypes.Array[ctypes.c_char]) -> list[Arg]:
    return [
        Arg(ctypes.addressof(prim), 8),
        Arg(address_of(mapping), 4, fd=buf),
        Arg(address_of(mapping, PAGE), 4, fd=buf),
    ]


def test_the_dsp_mapping_is_kept_while_the_callers_mapping_lives(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        echo = open_skel(driver, fd)
        buf = alloc_dma_buf(driver, fd, 2 * PAGE)
        mapping = driver.mmap(buf, 2 * PAGE)
        prim = ctypes.create_string_buffer(struct.pack("<II", 4, 4), 8)
        for data in (b"abcd", b"efgh"):
            mapping[:4] = data
            assert invoke_args(driver, fd, echo, SC_ECHO, _echo_args(mapping, buf, prim)) == 0
            assert mapping[PAGE : PAGE + 4] == data
        stats = driver.statistics()
        assert (stats.user_mappings_cached, stats.dsp_mappings_cached) == (1, 1)
        mapping.close()
        stats = driver.statistics()
        assert (stats.user_mappings_cached, stats.dsp_mappings_cached) == (0, 0)
        assert stats.dma_bufs_alive == 1  # the fd
        driver.close(buf)
        assert driver.statistics().dma_bufs_alive == 0


def test_the_caller_may_unmap_while_the_dsp_uses_the_buffer(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        echo = open_skel(driver, fd)
        buf = alloc_dma_buf(driver, fd, 2 * PAGE)
        mapping = driver.mmap(buf, 2 * PAGE)
        mapping[:4] = b"late"
        prim = ctypes.create_string_buffer(struct.pack("<II", 4, 4), 8)
        args = _echo_args(mapping, buf, prim)
        results: list[int] = []
        driver.faults.set_latency(0.2)
        worker = threading.Thread(
            target=lambda: results.append(invoke_args(driver, fd, echo, SC_ECHO, args))
        )
        worker.start()
        try:
            deadline = time.monotonic() + 10
            while driver.statistics().dsp_mappings_cached == 0:  # the call holds its mapping
                assert time.monotonic() < deadline
                time.sleep(0.005)
            mapping.close()
            assert driver.statistics().dsp_mappings_cached == 1  # still in use
        finally:
            worker.join()
            driver.faults.set_latency(0)
        assert results == [0]
        assert os.pread(buf, 4, PAGE) == b"late"  # the DSP wrote through its own mapping
        assert driver.statistics().dsp_mappings_cached == 0
        driver.close(buf)
        assert driver.statistics().dma_bufs_alive == 0


def test_without_the_cache_every_call_maps_for_itself() -> None:
    driver = EmulatedDriver(SimConfig(address_cache=False))
    with running_process(driver) as (fd, _):
        echo = open_skel(driver, fd)
        buf = alloc_dma_buf(driver, fd, 2 * PAGE)
        with driver.mmap(buf, 2 * PAGE) as mapping:
            assert type(mapping) is mmap.mmap
            mapping[:4] = b"same"
            prim = ctypes.create_string_buffer(struct.pack("<II", 4, 4), 8)
            assert invoke_args(driver, fd, echo, SC_ECHO, _echo_args(mapping, buf, prim)) == 0
            assert mapping[PAGE : PAGE + 4] == b"same"
            stats = driver.statistics()
            assert (stats.user_mappings_cached, stats.dsp_mappings_cached) == (0, 0)
        driver.close(buf)
