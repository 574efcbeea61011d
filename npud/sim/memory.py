"""What an fd has mapped into its DSP process: MMAP heap buffers and MEM_MAP dma-bufs.

The kernel keeps both lists per fd and drops them on close(); the DSP gives
each a range of the process's 32-bit address space. A MEM_MAP mapping holds
the emulator's own ``mmap`` of the dma-buf: that is the reference that keeps
the memory alive after the caller closed its fd, like the kernel's map refcount.
DSP code that holds a MEM_MAP'd buffer (found by fd number, :meth:`pin_by_fd`)
pins that mmap: a MEM_UNMAP or the process's release meanwhile leaves it open
until the last pin goes (:meth:`unpin`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import mmap
import threading

from npud.sim.addrspace import DspAddressSpace
from npud.sim.dmabuf import DmaBuf

_memory_ids = itertools.count(1)


def new_memory_id() -> int:
    """A number naming one DSP-side view of a buffer, unique in this process: a MEM_MAP
    mapping, or a buffer the address cache keeps mapped for calls (a PD child knows the
    buffers it may reach by these numbers)."""
    return next(_memory_ids)


@dataclasses.dataclass(eq=False)
class HeapBuffer:
    vaddr: int
    size: int
    flags: int


@dataclasses.dataclass(eq=False)
class MemMapping:
    vaddr: int
    fd: int  # the fd number given to MEM_MAP; MEM_UNMAP matches on it
    buffer: DmaBuf
    offset: int
    length: int
    flags: int
    mapping: mmap.mmap
    region: int  # start of the address-space range
    alias_of: int | None = None  # an old kernel's map by fd number: the target's id
    id: int = dataclasses.field(default_factory=new_memory_id)


class ProcessMemory:
    """Thread-safe bookkeeping of one DSP process's mappings."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._space = DspAddressSpace()
        self._heap: list[HeapBuffer] = []
        self._maps: list[MemMapping] = []
        self._pins: dict[int, int] = {}  # id(mmap) -> pins held by DSP code

    def add_heap(self, size: int, flags: int) -> int:
        """Reserve DSP addresses for a heap buffer; raises AddressSpaceFullError."""
        with self._lock:
            vaddr = self._space.allocate(size)
            self._heap.append(HeapBuffer(vaddr, size, flags))
            return vaddr

    def remove_heap(self, vaddr: int, size: int) -> bool:
        """Drop the buffer with exactly this (address, size); False when there is none."""
        with self._lock:
            for buffer in self._heap:
                if buffer.vaddr == vaddr and buffer.size == size:
                    self._heap.remove(buffer)
                    self._space.release(vaddr)
                    return True
            return False

    def give_up_heap(self) -> list[HeapBuffer]:
        """An interrupted invoke (76e8e4ace1ed): the kernel moves every MMAP buffer of the fd
        to the channel's list. The DSP keeps using them (their addresses stay taken);
        the fd no longer finds them, so a later MUNMAP of one is EINVAL."""
        with self._lock:
            moved, self._heap = self._heap, []
            return moved

    def has_heap(self, vaddr: int, size: int) -> bool:
        with self._lock:
            return any(b.vaddr == vaddr and b.size == size for b in self._heap)

    def add_map(
        self,
        fd: int,
        buffer: DmaBuf,
        mapping: mmap.mmap,
        offset: int,
        length: int,
        flags: int,
    ) -> MemMapping:
        """Map ``length`` bytes of ``buffer`` from ``offset``; takes ownership of ``mapping``.

        Returns the new mapping (``vaddr``: the DSP address of byte ``offset``);
        raises AddressSpaceFullError (``mapping`` then stays the caller's).
        """
        page_offset = offset % mmap.PAGESIZE
        with self._lock:
            region = self._space.allocate(page_offset + length)
            entry = MemMapping(
                region + page_offset, fd, buffer, offset, length, flags, mapping, region
            )
            self._maps.append(entry)
            return entry

    def add_alias(self, fd: int, target: MemMapping, offset: int, length: int) -> MemMapping:
        """A MEM_MAP through ``fd`` that an old kernel resolved to ``target``'s buffer
        (found by fd number): a new DSP range over the same memory. Raises
        AddressSpaceFullError."""
        page_offset = offset % mmap.PAGESIZE
        with self._lock:
            region = self._space.allocate(page_offset + length)
            entry = MemMapping(
                region + page_offset,
                fd,
                target.buffer,
                offset,
                length,
                target.flags,
                target.mapping,  # shared: closed with the last entry that uses it
                region,
                alias_of=target.id,
            )
            self._maps.append(entry)
            return entry

    def find_map(self, vaddr: int, fd: int) -> MemMapping | None:
        """The mapping at ``vaddr`` made through ``fd`` (any fd when ``fd < 0``)."""
        with self._lock:
            for entry in self._maps:
                if entry.vaddr == vaddr and (fd < 0 or entry.fd == fd):
                    return entry
            return None

    def find_by_fd(self, fd: int) -> MemMapping | None:
        """The newest mapping made through fd number ``fd``: how the DSP finds a buffer
        the host names by fd, and how kernels before linux-next look a map up."""
        with self._lock:
            for entry in reversed(self._maps):
                if entry.fd == fd:
                    return entry
            return None

    def pin_by_fd(self, fd: int) -> MemMapping | None:
        """The newest mapping made through fd number ``fd``, its mmap pinned (kept open
        through a MEM_UNMAP or release) until :meth:`unpin`; None when there is none."""
        with self._lock:
            for entry in reversed(self._maps):
                if entry.fd == fd:
                    key = id(entry.mapping)
                    self._pins[key] = self._pins.get(key, 0) + 1
                    return entry
            return None

    def unpin(self, entry: MemMapping) -> None:
        """Let go of a :meth:`pin_by_fd`; the mmap closes if no mapping uses it any more."""
        with self._lock:
            key = id(entry.mapping)
            left = self._pins[key] - 1
            if left:
                self._pins[key] = left
                return
            del self._pins[key]
            close = not any(m.mapping is entry.mapping for m in self._maps)
        if close:
            _close(entry.mapping)

    def remove_map(self, entry: MemMapping) -> bool:
        """Drop ``entry``; False when another thread already did."""
        with self._lock:
            if entry not in self._maps:
                return False
            self._maps.remove(entry)
            self._space.release(entry.region)
            # An alias shares its target's mapping: the last entry using it closes it,
            # unless DSP code holds it (the last unpin closes it then).
            close = (
                not any(m.mapping is entry.mapping for m in self._maps)
                and id(entry.mapping) not in self._pins
            )
        if close:
            entry.mapping.close()
        return True

    def release_all(self) -> None:
        """close(): every mapping and heap buffer goes (a pinned one at its last unpin)."""
        with self._lock:
            maps, self._maps = self._maps, []
            self._heap.clear()
            self._space = DspAddressSpace()
            closing = {
                id(entry.mapping): entry.mapping
                for entry in maps
                if id(entry.mapping) not in self._pins
            }
        for mapping in closing.values():
            mapping.close()

    @property
    def heap_count(self) -> int:
        with self._lock:
            return len(self._heap)

    @property
    def map_count(self) -> int:
        with self._lock:
            return len(self._maps)


def _close(mapping: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # DSP code kept a view: it goes with it
        mapping.close()
