"""DMA-BUFs from the system heap, as libcdsprpc's rpcmem allocates them.

``/dev/dma_heap/system`` hands out DMA-BUFs that belong to no FastRPC session:
one opens the heap node and asks for ``len`` bytes with ``DMA_HEAP_IOCTL_ALLOC``
(``drivers/dma-buf/dma-heap.c``; the kernel page-aligns the length, refuses
fd_flags other than O_CLOEXEC plus an access mode and any heap flag with
EINVAL, and answers ENOMEM when it cannot allocate). Such a buffer outlives the
DSP process of any session: a session maps it with MEM_MAP (the kernel attaches
the DMA-BUF to that session's compute context bank and maps it through its
SMMU, whatever exported it) or passes a slice of it in an INVOKE, and several
sessions can have it mapped at once.

Where the node is missing (kernels without CONFIG_DMABUF_HEAPS_SYSTEM, or a
sandbox that hides it) :meth:`DmaHeap.open` answers None and callers fall back
to ``FASTRPC_IOCTL_ALLOC_DMA_BUFF`` on a session's device fd, as rpcmem does.

Everything goes through the Driver seam, so the emulator serves the same calls.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
from typing import Final

from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import DeviceFd, DmaBuffer, checked_dma_size
from npud.fastrpc.kernel.driver import Driver
from npud.fastrpc.kernel.errors import DriverCall, RpcError, translate_os_error
from npud.fastrpc.kernel.trace_hooks import TraceHooks, trace_hooks_of

log = logging.getLogger(__name__)

FD_FLAGS: Final = os.O_RDWR | os.O_CLOEXEC
"""What rpcmem asks for: a read-write fd that is not inherited across exec."""
ABSENT: Final = frozenset({errno.ENOENT, errno.ENODEV, errno.ENXIO, errno.EACCES, errno.EPERM})
"""Open failures that mean "no usable heap here": fall back to ALLOC_DMA_BUFF."""


class DmaHeap:
    """One open of the system heap node; allocations are thread-safe.

    The heap owns its node's fd (closed once by :meth:`close`); each buffer it
    allocates owns its own fd and host mapping (:class:`DmaBuffer`).
    """

    def __init__(self, driver: Driver, fd: DeviceFd, path: str, trace_session: int = 0) -> None:
        self._driver = driver
        self._hooks: TraceHooks | None = trace_hooks_of(driver)
        self._trace_session = trace_session
        self._fd = fd
        self.path = path
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._allocated = 0

    @classmethod
    def open(cls, driver: Driver, path: str = abi.DMA_HEAP_SYSTEM) -> DmaHeap | None:
        """The heap at ``path``, or None when this machine has none (ENOENT and the
        like: the caller falls back to the FastRPC driver's own allocation). A trace
        records it as the operation ``heap_open`` of a trace session of its own."""
        hooks = trace_hooks_of(driver)
        if hooks is None:
            return cls._open(driver, path, 0)
        session = hooks.new_session()
        with hooks.operation("heap_open", session, path=path) as op:
            heap = cls._open(driver, path, session)
            op.result(available=heap is not None)
            return heap

    @classmethod
    def _open(cls, driver: Driver, path: str, trace_session: int) -> DmaHeap | None:
        try:
            fd = driver.open(path, os.O_RDONLY)
        except OSError as exc:
            if exc.errno in ABSENT:
                log.info(
                    "no system DMA-BUF heap; buffers come from the FastRPC driver",
                    extra={"path": path, "error": exc.strerror},
                )
                return None
            raise translate_os_error(exc, DriverCall.OPEN, device=path) from None
        return cls(driver, DeviceFd(fd, driver.close), path, trace_session)

    @property
    def allocated(self) -> int:
        """Buffers allocated so far (a counter, for statistics)."""
        return self._allocated

    def allocate(self, size: int) -> DmaBuffer:
        """A buffer of ``size`` bytes rounded up to whole pages, mapped on the host.

        The caller owns it: :meth:`DmaBuffer.give_up` when done. A trace records the
        operation ``heap_alloc``.
        """
        hooks = self._hooks
        if hooks is None:
            return self._allocate(size)
        with hooks.operation("heap_alloc", self._trace_session, size=size) as op:
            buffer = self._allocate(size)
            op.result(buffer=buffer.trace_ref, size=buffer.size)
            return buffer

    def _allocate(self, size: int) -> DmaBuffer:
        allocated = checked_dma_size(size)
        request = abi.dma_heap_allocation_data(
            len=allocated, fd=0, fd_flags=FD_FLAGS, heap_flags=abi.DMA_HEAP_VALID_HEAP_FLAGS
        )
        heap_fd = self._fd.fileno()
        if heap_fd < 0:
            raise RpcError(ErrorCode.DMA_BUF_ALLOC, msg="the DMA-BUF heap is closed")
        try:
            self._driver.ioctl(heap_fd, abi.DMA_HEAP_IOCTL_ALLOC, request)
        except OSError as exc:
            reason = os.strerror(exc.errno or 0)
            raise RpcError(
                ErrorCode.DMA_BUF_ALLOC, msg=f"the system heap refused {allocated} bytes: {reason}"
            ) from None
        fd = DeviceFd(int(request.fd), self._driver.close)
        try:
            host = self._driver.mmap(fd.fileno(), allocated)
        except OSError as exc:
            fd.close()
            raise translate_os_error(exc, DriverCall.MMAP, device=self.path) from None
        except BaseException:
            fd.close()
            raise
        with self._lock:
            self._allocated += 1
        return DmaBuffer(
            next(self._ids),
            fd,
            allocated,
            host,
            origin="heap",
            hooks=self._hooks,
            trace_session=self._trace_session,
        )

    def close(self) -> None:
        """Close the heap node (buffers already allocated stay valid). Idempotent."""
        hooks = self._hooks
        if hooks is None or self._fd.closed:
            self._fd.close()
            return
        with hooks.operation("heap_close", self._trace_session):
            self._fd.close()
