"""DMA-BUF sizing rules and the host side of one DMA-BUF.

A :class:`DmaBuffer` owns its fd and its host mapping and releases them exactly
once, when its owner has let it go and no invoke and no DSP mapping holds it
any more. Users get the buffer's memory through :meth:`DmaBuffer.view` and pass
slices of it to invokes; any session can map it (MEM_MAP) and pass it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from npu_protocol import MAX_BUFFER_SIZE, ErrorCode
from npud.fastrpc.kernel.errors import RpcError

if TYPE_CHECKING:
    from npud.fastrpc.kernel.trace_hooks import TraceHooks

PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
_U64_MAX: Final = (1 << 64) - 1


def page_round_up(size: int, page_size: int = PAGE_SIZE) -> int:
    """Round ``size`` up to a page multiple, as a u64 (the kernel's ``size`` field).

    Raises DMA_SIZE_OVERFLOW where the rounded size would not fit in 64 bits.
    """
    if size < 0:
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"negative size {size}")
    rounded = (size + page_size - 1) // page_size * page_size
    if rounded > _U64_MAX:
        raise RpcError(ErrorCode.DMA_SIZE_OVERFLOW, size=size)
    return rounded


def checked_dma_size(size: int) -> int:
    """Validate a requested DMA-BUF size and return the page-rounded size to allocate.

    The order is the crate's: the ceiling first (the wire's largest, 4 GiB; a client's
    own, ``max_buffer_size``, is checked where its request arrives), then page rounding.
    """
    if isinstance(size, bool) or not isinstance(size, int):
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"size must be an integer, got {size!r}")
    if size == 0:
        raise RpcError(ErrorCode.DMA_BUF_ALLOC, msg="size 0: a DMA-BUF holds at least one byte")
    if size < 0:
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"negative size {size}")
    if size > MAX_BUFFER_SIZE:
        raise RpcError(ErrorCode.DMA_EXCEEDS_MAX_SIZE, size=size, limit=MAX_BUFFER_SIZE)
    return page_round_up(size)


class DeviceFd:
    """One fd from ``Driver.open`` or ALLOC_DMA_BUFF: closed through the Driver exactly once."""

    __slots__ = ("_close", "_fd")

    def __init__(self, fd: int, close: Callable[[int], None]) -> None:
        self._fd = fd
        self._close = close

    @property
    def closed(self) -> bool:
        return self._fd == -1

    def fileno(self) -> int:
        """The fd number; -1 once closed (callers check ``closed`` first)."""
        return self._fd

    def close(self) -> None:
        """Close once; later calls do nothing. The number is -1 from here on."""
        fd, self._fd = self._fd, -1
        if fd != -1:
            self._close(fd)


class ComputeBank:
    """Where ALLOC_DMA_BUFF puts a session's buffers: its compute context bank on the DSP
    channel. A subsystem restart depopulates the channel's compute-bank devices, and
    every buffer allocated there is invalid from then on (no DSP may be given it again);
    the session that sees the restart (EPIPE) marks its bank ``lost``. System-heap
    buffers have no bank."""

    __slots__ = ("lost",)

    def __init__(self) -> None:
        self.lost = False


class DmaBuffer:
    """One DMA-BUF: its fd, its shared host mapping, and the reasons it must stay.

    The buffer owns its fd and its host mapping and releases both exactly once
    (:meth:`release`). Its *owner* (the FastRpcSession that allocated it through
    ALLOC_DMA_BUFF, or the daemon's heap allocator for a system-heap buffer)
    decides when it is no longer wanted (:meth:`request_release`); it is then
    released by whichever thread lets go of the last reason to keep it:

    * **pins**: invokes in flight that pass a slice of it (the DSP may be using it);
    * **DSP mappings**: one per session that has it MEM_MAPped (each session keeps
      its own address; :meth:`add_mapping` / :meth:`drop_mapping`). A mapping whose
      MEM_UNMAP failed stays counted until its session closes: the kernel keeps
      that mapping under the fd's number, so the fd must stay open (else a later
      buffer reusing the number would alias it).

    ``size`` is the allocated size, a whole number of pages: the one size that
    slices are checked against and that quotas count.
    """

    def __init__(
        self,
        buffer_id: int,
        fd: DeviceFd,
        size: int,
        host: mmap.mmap,
        *,
        before_close: Callable[[int], None] | None = None,
        origin: str = "fastrpc",
        bank: ComputeBank | None = None,
        hooks: TraceHooks | None = None,
        trace_session: int = 0,
    ) -> None:
        self.id = buffer_id
        self.bank = bank
        """The compute bank it lives in (ALLOC_DMA_BUFF); None for a system-heap buffer."""
        self._fd = fd
        self.size = size
        self.origin = origin
        """Where it was allocated: "heap" (the system DMA-BUF heap) or "fastrpc"
        (ALLOC_DMA_BUFF on a session's device fd)."""
        self._host: mmap.mmap | None = host
        anchor = ctypes.c_char.from_buffer(host)
        self.host_address = ctypes.addressof(anchor)
        del anchor  # drop the buffer export so the mapping can be closed later
        self._before_close = before_close
        self._hooks = hooks
        self.trace_session = trace_session
        """The trace session number of the allocator (a trace names buffers per allocator)."""
        self._pins = 0
        self._mappings = 0
        self._release_pending = False
        # Kept by the buffer pool between a free and the next allocation: no invoke may pin it.
        self._parked = False
        self.lock = threading.Lock()
        """Held across a change of a DSP mapping of the buffer and across its release."""

    @property
    def bank_lost(self) -> bool:
        """Its compute bank went with a subsystem restart: never map it or hand it out."""
        return self.bank is not None and self.bank.lost

    @property
    def fd(self) -> int:
        """The DMA-BUF's fd (owned here); -1 once released."""
        return self._fd.fileno()

    @property
    def trace_ref(self) -> int | str:
        """How a trace names it: its number for a session's own buffer, ``h<number>`` for
        one of the system heap (docs/trace-format.md)."""
        return f"h{self.id}" if self.origin == "heap" else self.id

    def give_up(self) -> None:
        """Its owner (the daemon's memory) lets it go for good: released now, or by whatever
        still holds it once that lets go. A trace records it as a ``release`` operation."""
        if self._hooks is None:
            self._give_up()
            return
        with self._hooks.operation("release", self.trace_session, buffer=self.trace_ref):
            self._give_up()

    def _give_up(self) -> None:
        if self.request_release():
            self.release()

    @property
    def released(self) -> bool:
        return self._fd.closed

    @property
    def release_pending(self) -> bool:
        """Its owner let it go; it is released once nothing else holds it."""
        return self._release_pending

    @property
    def mappings(self) -> int:
        """Sessions that have it mapped into their DSP process (failed unmaps included)."""
        return self._mappings

    def view(self) -> memoryview:
        """Read-write view of the whole buffer."""
        if self._host is None:
            raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=self.id)
        return memoryview(self._host)

    def check_slice(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise RpcError(
                ErrorCode.SLICE_OUT_OF_RANGE,
                offset=offset,
                length=length,
                buffer=self.id,
                size=self.size,
            )

    # --- what keeps it (the caller holds ``lock`` for the mapping counts) -------------
    def pin(self) -> None:
        with self.lock:
            if self.released or self._release_pending or self._parked:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=self.id)
            self._pins += 1

    def unpin(self) -> bool:
        """Drop one pin; True when the release is now due (the caller releases it)."""
        with self.lock:
            self._pins -= 1
            return self._due()

    def add_mapping(self) -> None:
        """A session mapped it (caller holds ``lock``)."""
        if self.released:
            raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=self.id)
        self._mappings += 1

    def drop_mapping(self) -> bool:
        """A session's mapping of it is gone (caller holds ``lock``); True when the
        release is now due (the caller releases it, after letting go of the lock)."""
        self._mappings -= 1
        return self._due()

    def request_release(self) -> bool:
        """The owner lets it go; True when the release can happen now (nothing holds it)."""
        with self.lock:
            if self.released or self._release_pending:
                return False
            self._release_pending = True
            return self._due()

    def _due(self) -> bool:
        return self._release_pending and not self._pins and not self._mappings and not self.released

    # --- keeping for reuse (npud/pool.py) -----------------------------------
    @property
    def parked(self) -> bool:
        return self._parked

    @property
    def pinned(self) -> bool:
        return self._pins > 0

    def park(self) -> bool:
        """Take the buffer out of use, to be kept for reuse: True when no invoke uses it
        (it then refuses pins until :meth:`unpark`); False leaves it as it was (a running
        invoke may still read or write it: only releasing it after that invoke is safe)."""
        with self.lock:
            if self.released or self._release_pending or self._pins or self._parked:
                return False
            self._parked = True
            return True

    def unpark(self) -> None:
        """Back in use: handed to a client again."""
        with self.lock:
            self._parked = False

    def zero(self) -> bool:
        """Write zeros over the whole buffer through the host mapping (a parked buffer, before
        anyone gets it again); False if it was released meanwhile. ctypes.memset lets go of
        the GIL, so the other threads run while it writes."""
        with self.lock:
            if self.released or self._host is None:
                return False
            ctypes.memset(self.host_address, 0, self.size)
            return True

    def release(self) -> None:
        """Unmap the host mapping, then close the fd (the allocator's ``before_close(fd)``
        runs in between: a session's FREE_DMA_BUFF). Exactly once; call it when one of
        :meth:`request_release`, :meth:`unpin` or :meth:`drop_mapping` said it is due."""
        with self.lock:
            if self.released:
                return
            host, self._host = self._host, None
            try:
                if host is not None:
                    host.close()
            finally:
                try:
                    if self._before_close is not None:
                        self._before_close(self._fd.fileno())
                finally:
                    self._fd.close()

    def __repr__(self) -> str:
        return (
            f"<DmaBuffer id={self.id} fd={self.fd} size={self.size} {self.origin}"
            f" pins={self._pins} mappings={self._mappings}>"
        )
