"""A subsystem restart removes the compute banks ALLOC_DMA_BUFF allocated in (issue 21, item 7).

The kernel depopulates the channel's compute-bank devices at a restart. The
emulator then treats every buffer ALLOC_DMA_BUFF made on the old channel as
no dma-buf a DSP can be given: MEM_MAP, INVOKE and INIT_CREATE refuse it with
EINVAL. Its memory stays readable through the holder's fd. Buffers of the
system DMA-BUF heap belong to no channel and map on the new one.
"""

from __future__ import annotations

import errno
import mmap
import os

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma_heap import DmaHeap
from npud.sim import EmulatedDriver
from tests.emulator import sim_helpers

SIZE = 4096


def test_old_channel_buffers_are_refused_heap_buffers_are_not() -> None:
    driver = EmulatedDriver()
    old = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    banked = sim_helpers.alloc_dma_buf(driver, old, SIZE)
    heap = DmaHeap.open(driver)
    assert heap is not None
    from_heap = heap.allocate(SIZE)
    with mmap.mmap(banked, SIZE) as view:
        view[:4] = b"kept"
    driver.faults.subsystem_restart()
    driver.faults.boot()
    new = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert sim_helpers.init_create(driver, new) == 0
        err = sim_helpers.errno_of(sim_helpers.mem_map, driver, new, banked, SIZE)
        assert err == errno.EINVAL
        assert sim_helpers.mem_map(driver, new, from_heap.fd, SIZE) != 0
        with mmap.mmap(banked, SIZE) as view:
            assert view[:4] == b"kept"  # the holder's memory, not the DSP's any more
        # A buffer ALLOC_DMA_BUFF makes on the new channel is a dma-buf as ever.
        fresh = sim_helpers.alloc_dma_buf(driver, new, SIZE)
        assert sim_helpers.mem_map(driver, new, fresh, SIZE) != 0
        os.close(fresh)
        sim_helpers.exit_process(driver, new)
    finally:
        driver.close(new)
        driver.close(old)
        os.close(banked)
        from_heap.give_up()
        heap.close()
