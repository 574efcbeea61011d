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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from npu_client.transport import OwnedFd
from npu_protocol import OwnPool

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


MAX_KEPT_BYTES: Final = 64 << 20
"""Bytes of freed buffers' mappings a connection keeps at most (see KeptMappings)."""


@dataclass(eq=False, slots=True)
class _Kept:
    memory: mmap.mmap
    size: int
    until: float
    """When npud's pool stops keeping the buffer if no allocation takes it."""


class KeptMappings:
    """Mappings of buffers this connection freed into npud's pool for its own reuse.

    With ``Welcome.own_pool`` npud keeps what this connection frees for this
    connection's next allocation of the same size, and hands back the same DMA-BUF.
    Mapping its pages again costs about a millisecond per 16 MiB (a page table entry
    per page); keeping the mapping costs nothing when the buffer comes back. The
    buffer is recognised by its inode (``st_dev``, ``st_ino`` of the fd received):
    while a mapping is kept here its file lives, so no other buffer can have that
    inode.

    The memory is this connection's own (share = client): a kept mapping lets this
    process see nothing it could not see by keeping a view, which npud cannot
    prevent anyway. But a kept mapping holds the buffer's pages even when npud's pool
    lets the buffer go. So the mappings kept are bounded (``MAX_KEPT_BYTES``), each
    only until npud's pool would release its buffer (``idle_ms``), dropped at the
    next allocation or free after that, and all closed with the connection.

    Thread-safe (the blocking client allocates and frees from any thread).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[tuple[int, int], _Kept] = {}  # by inode, oldest first
        self._bytes = 0
        self.reused = 0
        """Allocations that found their mapping here (a figure for tests and benches)."""

    @property
    def bytes(self) -> int:
        return self._bytes

    def keep(self, fd: int, memory: mmap.mmap, size: int, terms: OwnPool | None) -> bool:
        """Keep ``memory`` (the mapping of ``fd``, a buffer just freed) for its return;
        False (the caller closes it) when npud will not keep the buffer for us."""
        if terms is None or size > min(terms.max_buffer_bytes, MAX_KEPT_BYTES):
            return False
        key = _inode(fd)
        now = self._clock()
        with self._lock:
            dropped = self._expire(now)
            while self._kept and self._bytes + size > MAX_KEPT_BYTES:
                dropped.append(self._pop(next(iter(self._kept))))
            stale = self._kept.pop(key, None)  # cannot happen: a live inode is unique
            if stale is not None:
                self._bytes -= stale.size
                dropped.append(stale.memory)
            self._kept[key] = _Kept(memory, size, now + terms.idle_ms / 1000)
            self._bytes += size
        _close_all(dropped)
        return True

    def take(self, fd: int, size: int) -> mmap.mmap | None:
        """The kept mapping of the buffer ``fd`` refers to, if it is one we freed."""
        if not self._kept:
            return None
        key = _inode(fd)
        with self._lock:
            dropped = self._expire(self._clock())
            kept = self._kept.get(key)
            memory = None
            if kept is not None and kept.size == size:
                memory = self._pop(key)
                self.reused += 1
        _close_all(dropped)
        return memory

    def close(self) -> None:
        """Unmap everything kept (the connection is over)."""
        with self._lock:
            dropped = [kept.memory for kept in self._kept.values()]
            self._kept.clear()
            self._bytes = 0
        _close_all(dropped)

    def _expire(self, now: float) -> list[mmap.mmap]:
        return [self._pop(key) for key, kept in list(self._kept.items()) if kept.until <= now]

    def _pop(self, key: tuple[int, int]) -> mmap.mmap:
        kept = self._kept.pop(key)
        self._bytes -= kept.size
        return kept.memory


def _inode(fd: int) -> tuple[int, int]:
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def _close_all(mappings: list[mmap.mmap]) -> None:
    for memory in mappings:
        # BufferError: a view of the old buffer is still exported; the mapping goes
        # with the last view.
        with contextlib.suppress(BufferError):
            memory.close()


class MappedBuffer:
    """A buffer's id, size, fd and memory.

    ``view()`` is a writable ``memoryview`` of the whole buffer (``size``
    bytes: the size asked for, rounded up to whole pages by the daemon), and
    on Python 3.12+ the buffer itself supports the buffer protocol. Once the
    buffer is freed, its client closed, or its DSP session restarted, the fd
    and the mapping are closed; a view still held at that point keeps the
    memory mapped until it is released, so release views before freeing.
    """

    def __init__(
        self,
        buffer_id: int,
        size: int,
        fd: OwnedFd,
        epoch: int,
        kept: KeptMappings | None = None,
    ) -> None:
        """Take ownership of ``fd`` (closed here if it cannot be mapped). A mapping in
        ``kept`` of the same buffer is used instead of mapping it again."""
        try:
            memory = kept.take(fd.fileno(), size) if kept is not None else None
            if memory is None:
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

    def _release_local(
        self,
        reason: str = "freed",
        *,
        kept: KeptMappings | None = None,
        terms: OwnPool | None = None,
    ) -> None:
        """Close the mapping and the fd; idempotent. ``reason`` completes
        "buffer N is ..." in the errors of later uses. A buffer freed into npud's pool
        for this connection (``terms``) leaves its mapping in ``kept`` instead."""
        if self._mmap is not None:
            self._gone = reason
        memory, self._mmap = self._mmap, None
        self._dsp_address = None
        if (
            memory is not None
            and kept is not None
            and kept.keep(self._fd.fd, memory, self._size, terms)
        ):
            memory = None  # kept for the buffer's return
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
