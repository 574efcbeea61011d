"""DMA-BUF sizing rules and the host side of one DMA-BUF.

A :class:`SessionBuffer` owns its fd and its host mapping and releases them exactly
once; the FastRpcSession that allocated it decides when (``FastRpcSession.free``
defers the release while an invoke uses the buffer). Users get the buffer's
memory through :meth:`SessionBuffer.view` and pass slices of it to invokes.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections.abc import Callable
from typing import Final

from npu_protocol import MAX_DMA_SIZE, ErrorCode
from npud.fastrpc.errors import RpcError

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

    The order is the crate's: the 256 MB ceiling first, then page rounding.
    """
    if isinstance(size, bool) or not isinstance(size, int):
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"size must be an integer, got {size!r}")
    if size == 0:
        raise RpcError(ErrorCode.DMA_BUF_ALLOC, msg="size 0: a DMA-BUF holds at least one byte")
    if size < 0:
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"negative size {size}")
    if size > MAX_DMA_SIZE:
        raise RpcError(ErrorCode.DMA_EXCEEDS_MAX_SIZE, size=size)
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


class SessionBuffer:
    """One DMA-BUF: its fd, its shared host mapping and, once mapped, its DSP address.

    The buffer owns its fd and its host mapping and releases both exactly once
    in :meth:`release`. Its DSP mapping is made and undone by the session
    (ioctls on the session's fd), which reports each change here with
    :meth:`mapped_at` and :meth:`unmapped`; nothing outside changes its state.

    ``size`` is the allocated size, a whole number of pages: the one size that
    slices are checked against and that quotas count.
    """

    def __init__(self, buffer_id: int, fd: DeviceFd, size: int, host: mmap.mmap) -> None:
        self.id = buffer_id
        self._fd = fd
        self.size = size
        self._host: mmap.mmap | None = host
        anchor = ctypes.c_char.from_buffer(host)
        self.host_address = ctypes.addressof(anchor)
        del anchor  # drop the buffer export so the mapping can be closed later
        self._dsp_address: int | None = None
        # In-flight invokes using this buffer; release waits for zero.
        self._pins = 0
        self._release_pending = False
        # Kept by the buffer pool between a free and the next allocation: no invoke may pin it.
        self._parked = False
        self.lock = threading.Lock()
        """Held by the session across a change of the DSP mapping and the release."""

    @property
    def fd(self) -> int:
        """The DMA-BUF's fd (owned here); -1 once released."""
        return self._fd.fileno()

    @property
    def released(self) -> bool:
        return self._fd.closed

    @property
    def dsp_address(self) -> int | None:
        """Where the buffer is mapped in the DSP process, or None."""
        return self._dsp_address

    def mapped_at(self, address: int) -> None:
        self._dsp_address = address

    def unmapped(self) -> None:
        self._dsp_address = None

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

    # --- pinning (called by the session under its own rules) -------------
    def pin(self) -> None:
        with self.lock:
            if self.released or self._release_pending or self._parked:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=self.id)
            self._pins += 1

    def unpin(self) -> bool:
        """Drop one pin; True when a deferred release is now due."""
        with self.lock:
            self._pins -= 1
            return self._pins == 0 and self._release_pending

    def request_release(self) -> bool:
        """Mark for release; True when it can happen now (no invoke uses it)."""
        with self.lock:
            if self.released or self._release_pending:
                return False
            self._release_pending = True
            return self._pins == 0

    # --- keeping for reuse (npud/pool.py) -----------------------------------
    @property
    def parked(self) -> bool:
        return self._parked

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

    def release(self, before_close: Callable[[int], None]) -> None:
        """Unmap the host mapping, then close the fd; ``before_close(fd)`` runs in
        between (the session's FREE_DMA_BUFF). Exactly once; the caller holds
        ``lock`` and has undone the DSP mapping."""
        if self.released:
            return
        self._dsp_address = None
        host, self._host = self._host, None
        try:
            if host is not None:
                host.close()
        finally:
            try:
                before_close(self._fd.fileno())
            finally:
                self._fd.close()

    def release_host_mapping(self) -> None:
        """Unmap the host mapping but keep the fd (its DSP mapping could not be undone:
        the session parks the fd so its number cannot be reused). The caller holds
        ``lock``."""
        host, self._host = self._host, None
        if host is not None:
            host.close()

    def detach_fd(self) -> DeviceFd:
        """Hand the fd over (to be closed by the caller); the buffer is released."""
        self._dsp_address = None
        fd = DeviceFd(self._fd.fileno(), self._fd._close)
        self._fd._fd = -1
        return fd

    def __repr__(self) -> str:
        return f"<SessionBuffer id={self.id} fd={self.fd} size={self.size} dsp={self._dsp_address}>"
