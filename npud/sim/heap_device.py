"""The emulated driver's fds of ``/dev/dma_heap/system`` and their one command.

:mod:`npud.sim.dma_heap` answers the command as the kernel does; this holds the
open heap fds and the allocation count (under the driver lock, which
:class:`npud.sim.driver.EmulatedDriver` passes in) and the injected failures.
"""

from __future__ import annotations

import errno
import os
import threading

from npud.sim import dma_heap
from npud.sim.config import SimConfig
from npud.sim.dmabuf import DmaBufRegistry
from npud.sim.errors import fault
from npud.sim.faults import FaultInjector
from npud.sim.ioctl_args import IoctlBuffer


class HeapDevice:
    """The DMA-BUF heap of one driver; ``lock`` is the driver lock."""

    def __init__(
        self,
        config: SimConfig,
        dmabufs: DmaBufRegistry,
        faults: FaultInjector,
        lock: threading.Lock,
    ) -> None:
        self._config = config
        self._dmabufs = dmabufs
        self._faults = faults
        self._lock = lock
        self.fds: set[int] = set()
        """The open heap fds (under the lock)."""
        self.allocations = 0
        """Buffers allocated so far (under the lock)."""

    def open(self, path: str) -> int:
        if not self._config.dma_heap:
            raise fault(errno.ENOENT, f"{path}: this machine has no system DMA-BUF heap")
        fd = os.eventfd(0, os.EFD_CLOEXEC)
        with self._lock:
            self.fds.add(fd)
        return fd

    def ioctl(self, request: int, arg: IoctlBuffer) -> int:
        def allocate(size: int, cloexec: bool) -> int:
            injected = self._faults.take_heap_failure()
            if injected is not None:
                raise fault(injected, "injected")
            fd = self._dmabufs.allocate(
                size, cloexec=cloexec, name=dma_heap.MEMFD_NAME, fd_error=None
            )
            with self._lock:
                self.allocations += 1
            return fd

        def injected_fault(word: int) -> None:
            injected = self._faults.take_ioctl_fault(word)
            if injected is not None:
                raise fault(injected.err, "injected")

        return dma_heap.heap_ioctl(request, arg, allocate, injected_fault)
