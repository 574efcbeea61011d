"""DMA-BUF sizing rules and the host side of one DMA-BUF.

A :class:`DmaBuffer` is owned by the FastRpcSession that allocated it: the
session closes its fd and its host mapping exactly once (see
``FastRpcSession.free``). Users get the buffer's memory through
:meth:`DmaBuffer.view` and pass slices of it to invokes.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from typing import Final

from npu_protocol import MAX_DMA_SIZE, ErrorCode
from npud.fastrpc.errors import FastRpcError

PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
_U64_MAX: Final = (1 << 64) - 1


def page_round_up(size: int, page_size: int = PAGE_SIZE) -> int:
    """Round ``size`` up to a page multiple, as a u64 (the kernel's ``size`` field).

    Raises DMA_SIZE_OVERFLOW where the rounded size would not fit in 64 bits.
    """
    if size < 0:
        raise FastRpcError(ErrorCode.INVALID_ARGUMENT, detail=f"negative size {size}")
    rounded = (size + page_size - 1) // page_size * page_size
    if rounded > _U64_MAX:
        raise FastRpcError(ErrorCode.DMA_SIZE_OVERFLOW, size=size)
    return rounded


def checked_dma_size(size: int) -> int:
    """Validate a requested DMA-BUF size and return the page-rounded size to allocate.

    The order is the crate's: the 256 MB ceiling first, then page rounding.
    """
    if isinstance(size, bool) or not isinstance(size, int):
        raise FastRpcError(
            ErrorCode.INVALID_ARGUMENT, detail=f"size must be an integer, got {size!r}"
        )
    if size == 0:
        raise FastRpcError(ErrorCode.DMA_BUF_ALLOC, msg="size 0: a DMA-BUF holds at least one byte")
    if size < 0:
        raise FastRpcError(ErrorCode.INVALID_ARGUMENT, detail=f"negative size {size}")
    if size > MAX_DMA_SIZE:
        raise FastRpcError(ErrorCode.DMA_EXCEEDS_MAX_SIZE, size=size)
    return page_round_up(size)


class DmaBuffer:
    """One DMA-BUF: its fd, its shared host mapping and, once mapped, its DSP address.

    ``fd`` is owned by the allocating session and is -1 once released. The
    host mapping is created at allocation, so invokes can pass a pointer
    inside it (the kernel requires one).
    """

    def __init__(self, buffer_id: int, fd: int, size: int, mapped_size: int, host: mmap.mmap):
        self.id = buffer_id
        self.fd = fd
        self.size = size
        self.mapped_size = mapped_size
        self._host: mmap.mmap | None = host
        anchor = ctypes.c_char.from_buffer(host)
        self.host_address = ctypes.addressof(anchor)
        del anchor  # drop the buffer export so the mapping can be closed later
        self.dsp_address: int | None = None
        # In-flight invokes using this buffer; release waits for zero.
        self._pins = 0
        self._release_pending = False
        self.lock = threading.Lock()

    @property
    def released(self) -> bool:
        return self.fd == -1

    def view(self) -> memoryview:
        """Read-write view of the buffer's ``size`` bytes (not the page padding)."""
        if self._host is None:
            raise FastRpcError(ErrorCode.UNKNOWN_BUFFER, buffer=self.id)
        return memoryview(self._host)[: self.size]

    def check_slice(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FastRpcError(
                ErrorCode.SLICE_OUT_OF_RANGE,
                offset=offset,
                length=length,
                buffer=self.id,
                size=self.size,
            )

    # --- pinning (called by the session under its own rules) -------------
    def pin(self) -> None:
        with self.lock:
            if self.released or self._release_pending:
                raise FastRpcError(ErrorCode.UNKNOWN_BUFFER, buffer=self.id)
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

    def take_host_mapping(self) -> mmap.mmap | None:
        host, self._host = self._host, None
        return host

    def __repr__(self) -> str:
        return f"<DmaBuffer id={self.id} fd={self.fd} size={self.size} dsp={self.dsp_address}>"
