"""A DMA-BUF in this process: its fd, its shared mapping, and slices of it.

This is the part of a buffer that both clients share; the blocking
``DmaBuffer`` and the trio ``TrioDmaBuffer`` add the requests (map, unmap,
free) on top. The buffer owns exactly one fd (an :class:`OwnedFd`) and one
``mmap``; :meth:`MappedBuffer._release_local` closes both, once.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import stat
import sys
from dataclasses import dataclass
from typing import Final

from npu_client.transport import OwnedFd

_PROT: Final = mmap.PROT_READ | mmap.PROT_WRITE


def _map_shared(fd: int, size: int) -> mmap.mmap:
    """``size`` bytes of ``fd``, shared and writable.

    A regular file (a memfd, as the emulator hands out) must be sealed against
    shrinking: otherwise whoever else holds it could truncate it under our
    mapping and the next access would kill this process with SIGBUS. A real
    DMA-BUF is not a regular file and cannot shrink.

    The mapping is populated at once (``MAP_POPULATE``). The FastRPC driver
    maps all of a DMA-BUF's pages when it is mmapped, so on the device this
    finds them mapped already; the emulator's memfd then behaves the same,
    instead of taking a page fault per page at first touch (16 MiB that
    npud's pool kept: 1.5 ms mapped at once, 5.4 ms faulted in page by page).
    """
    status = os.fstat(fd)
    if stat.S_ISREG(status.st_mode):
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        if not seals & fcntl.F_SEAL_SHRINK:
            raise ValueError("the buffer npud sent is a file that can shrink; refusing to map it")
        if status.st_size < size:
            raise ValueError(f"the buffer npud sent holds {status.st_size} bytes, not {size}")
    flags = mmap.MAP_SHARED | mmap.MAP_POPULATE
    if sys.version_info >= (3, 13):
        # Without trackfd the mmap object dup()s the fd: two fds per buffer.
        return mmap.mmap(fd, size, flags=flags, prot=_PROT, trackfd=False)
    return mmap.mmap(fd, size, flags=flags, prot=_PROT)


class MappedBuffer:
    """A buffer's id, size, fd and memory.

    ``view()`` is a writable ``memoryview`` of the whole buffer (``size``
    bytes: the size asked for, rounded up to whole pages by the daemon), and
    on Python 3.12+ the buffer itself supports the buffer protocol. Once the
    buffer is freed, its client closed, or its DSP session restarted, the fd
    and the mapping are closed; a view still held at that point keeps the
    memory mapped until it is released, so release views before freeing.
    """

    def __init__(self, buffer_id: int, size: int, fd: OwnedFd, epoch: int) -> None:
        """Take ownership of ``fd`` (closed here if it cannot be mapped)."""
        try:
            memory = _map_shared(fd.fileno(), size)
        except BaseException:
            fd.close()
            raise
        self._id = buffer_id
        self._size = size
        self._fd = fd
        self._epoch = epoch
        self._mmap: mmap.mmap | None = memory
        self._gone = ""
        self._dsp_address: int | None = None

    # --- identity and memory ---------------------------------------------------------

    @property
    def id(self) -> int:
        """The daemon's id for this buffer (scoped to the connection)."""
        return self._id

    @property
    def epoch(self) -> int:
        """The DSP session epoch it was allocated in (before protocol version 3 a restart
        released it; from version 3 a restart only ends its mapping)."""
        return self._epoch

    @property
    def size(self) -> int:
        """Bytes in the buffer: the requested size rounded up to whole pages."""
        return self._size

    @property
    def fd(self) -> int:
        """The DMA-BUF's fd. The buffer owns it: do not close it (dup it to keep it)."""
        self._memory()
        return self._fd.fd

    @property
    def freed(self) -> bool:
        """True once the buffer was freed, its client closed, or its DSP session
        restarted (the daemon released it then)."""
        return self._mmap is None

    def view(self) -> memoryview:
        """A writable memoryview of the whole buffer."""
        return memoryview(self._memory())

    def __buffer__(self, flags: int) -> memoryview:
        """The buffer protocol on Python 3.12+ (PEP 688): ``memoryview(buffer)``."""
        return self.view()

    def __len__(self) -> int:
        return self._size

    def slice(self, offset: int = 0, length: int | None = None) -> Slice:
        """Bytes ``[offset, offset + length)`` (to the end for None), for an invoke argument."""
        self._memory()  # refuse a gone buffer first
        _check_index("offset", offset)
        if length is None:
            length = self._size - offset if offset <= self._size else -1
        else:
            _check_index("length", length)
        if length < 0 or offset + length > self._size:
            raise ValueError(
                f"slice offset {offset} length {length} is outside buffer {self._id} "
                f"of {self._size} bytes"
            )
        return Slice(self, offset, length)

    # --- the DSP mapping cache ---------------------------------------------------------

    @property
    def dsp_address(self) -> int | None:
        """The buffer's DSP address while it is mapped, else None."""
        return self._dsp_address

    def _remember_mapping(self, address: int) -> None:
        self._dsp_address = address

    def _forget_mapping(self) -> None:
        self._dsp_address = None

    # --- ownership ---------------------------------------------------------------------

    def _memory(self) -> mmap.mmap:
        """The mapping; ValueError saying why if the buffer is gone."""
        if self._mmap is None:
            raise ValueError(f"buffer {self._id} is {self._gone}")
        return self._mmap

    def _release_local(self, reason: str = "freed") -> None:
        """Close the mapping and the fd; idempotent. ``reason`` completes
        "buffer N is ..." in the errors of later uses."""
        if self._mmap is not None:
            self._gone = reason
        memory, self._mmap = self._mmap, None
        self._dsp_address = None
        if memory is not None:
            # BufferError: a view is still exported. The mapping then goes when the
            # last view does (the mmap object is freed with it); nothing else holds it.
            with contextlib.suppress(BufferError):
                memory.close()
        self._fd.close()

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"fd {self._fd.fd}"
        return f"<{type(self).__name__} id={self._id} size={self._size} {state}>"


def restart_reason(epoch: int) -> str:
    """How a buffer released by a DSP restart explains itself ("buffer N is ...")."""
    return f"gone: the DSP restarted (session epoch {epoch}); allocate a new buffer"


def _check_index(what: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"slice {what} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"slice {what} must not be negative, got {value}")


@dataclass(frozen=True, slots=True)
class Slice:
    """Bytes ``[offset, offset + length)`` of a buffer: an invoke input or output that
    the DSP reads or writes in place. Make one with ``buffer.slice(offset, length)``."""

    buffer: MappedBuffer
    offset: int
    length: int

    def view(self) -> memoryview:
        """A writable memoryview of these bytes."""
        return self.buffer.view()[self.offset : self.offset + self.length]

    def __len__(self) -> int:
        return self.length
