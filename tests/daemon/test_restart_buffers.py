"""Buffers from a compute bank that a subsystem restart removed (issue 21, item 7).

Without the system DMA-BUF heap (``[emulator] dma_heap = false``, or a kernel
without ``/dev/dma_heap/system``) npud's buffers come from ALLOC_DMA_BUFF, in
the compute bank of the allocating domain's session. A subsystem restart
depopulates the channel's compute banks: those buffers are no dma-bufs a DSP
can be given any more (the emulated kernel answers EINVAL). npud never hands
one out again (the pool lets go of them) and never maps one again (the
client's id goes, DSP_RESTARTED). System-heap buffers are not affected.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from npu_client import DspRestarted
from npu_client.trio_client import open_trio_client
from npud.daemon.server import Daemon
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import IoctlArg
from npud.sim import EmulatedDriver
from tests.daemon.wire import serve_daemon

SIZE = 64 * 1024
NO_HEAP = "[emulator]\ndma_heap = false\n"


def inode(fd: int) -> tuple[int, int]:
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def sim_of(daemon: Daemon) -> EmulatedDriver:
    driver = daemon.broker.device.driver
    assert isinstance(driver, EmulatedDriver)
    return driver


async def restarted(daemon: Daemon) -> None:
    sim_of(daemon).faults.subsystem_restart(down_for=0.2)
    domain = daemon.broker.default_domain
    assert domain is not None
    with trio.fail_after(10):
        while domain.epoch < 2 or domain.session is None:
            await trio.sleep(0.01)


def count_mem_maps(driver: EmulatedDriver) -> list[int]:
    """Every MEM_MAP's fd from now on (wraps the driver's ioctl)."""
    seen: list[int] = []
    ioctl = driver.ioctl

    def watching(fd: int, request: int, arg: IoctlArg) -> int:
        if request == abi.FASTRPC_IOCTL_MEM_MAP and isinstance(arg, abi.fastrpc_mem_map):
            seen.append(int(arg.fd))
        return ioctl(fd, request, arg)

    driver.ioctl = watching  # type: ignore[method-assign,assignment]
    return seen


async def test_buffers_of_a_removed_compute_bank_are_never_handed_out_or_mapped_again(
    tmp_path: Path,
) -> None:
    async with serve_daemon(tmp_path, NO_HEAP) as daemon:
        assert daemon.broker.status().memory is not None
        async with open_trio_client(tmp_path / "npud.sock", name="a") as a:
            held = await a.alloc(SIZE)
            await held.map()
            freed = await a.alloc(SIZE)
            freed_inode = inode(freed.fd)
            await freed.free()  # kept by the pool
            await restarted(daemon)
            mem_maps = count_mem_maps(sim_of(daemon))
            pool = daemon.broker.status().pool
            assert pool is not None
            assert pool.buffers == 0  # the pool let go of the lost buffer
            fresh = await a.alloc(SIZE)
            assert inode(fresh.fd) != freed_inode
            with pytest.raises(DspRestarted):
                await held.map()
            await fresh.map()  # a new buffer of the new session maps as ever
            assert len(mem_maps) == 1
            await fresh.free()


async def test_heap_buffers_live_on_across_a_restart(tmp_path: Path) -> None:
    async with (
        serve_daemon(tmp_path) as daemon,
        open_trio_client(tmp_path / "npud.sock", name="a") as a,
    ):
        held = await a.alloc(SIZE)
        await restarted(daemon)
        await held.map()  # a system-heap buffer belongs to no compute bank
        await held.free()
