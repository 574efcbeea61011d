"""Where this process has its dma-bufs mapped: the emulator's cache of address lookups.

The kernel finds the VMA behind every dma-buf argument of an invoke. Asking
the kernel (:mod:`npud.sim.vmas`) costs microseconds with ``PROCMAP_QUERY``
and a millisecond where ``/proc/self/maps`` must be read, on every argument
of every call. Most arguments point into mappings the emulator made itself
(``EmulatedDriver.mmap``, which is how FastRpcSession maps every buffer), so
the emulator remembers those:

* ``EmulatedDriver.mmap`` of an emulator dma-buf returns a :class:`UserMapping`,
  an ``mmap.mmap`` that tells the table when it ends: ``close()`` (and the
  ``with`` statement's exit), garbage collection (``__del__`` runs before the
  munmap), and ``madvise()`` / ``resize()`` (they can split or move the
  kernel's VMA) all drop its entry first, so an address is never answered
  from an entry after its munmap.
* An argument inside a live entry, made at offset 0, that stays inside it is
  answered from the table. Anything else (a mapping made by other code, a
  range that runs past the entry, a buffer mapped at an offset) asks the
  kernel: every refusal (EINVAL) is the kernel's answer, never the cache's.
* Python code cannot change a live entry's pages without the table seeing
  it: ``mmap.mmap`` never maps over an existing range (no MAP_FIXED), and the
  mapping's own methods are the ones above. Raw ``munmap``/``mprotect``
  through ctypes on a live mapping's range is not seen (the mapping object
  itself would crash on its next use).

The DSP also needs its own mapping of a buffer for the duration of a call
(the caller may unmap meanwhile, as with the kernel's SMMU mapping). For an
argument answered from the table that mapping is kept with the entry and
reused by later calls; it is closed when the entry goes and no call uses it,
so it never keeps a buffer alive longer than the caller's own mapping does.
Other arguments get a mapping for the call only.

``enabled=False`` (``SimConfig.address_cache``) turns both caches off: every
lookup asks the kernel and every call maps and unmaps, as before the cache.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import dataclasses
import errno
import mmap
import threading
from collections.abc import Callable
from typing import Final

from npud.sim.dmabuf import DmaBuf
from npud.sim.errors import fault
from npud.sim.memory import new_memory_id
from npud.sim.vmas import VmaFinder

_SHARED_RW: Final = {"flags": mmap.MAP_SHARED, "prot": mmap.PROT_READ | mmap.PROT_WRITE}


def dsp_mapping(fd: int, buffer: DmaBuf) -> mmap.mmap:
    """The emulated DSP's own mapping of the whole buffer (a reference that keeps it alive)."""
    return mmap.mmap(fd, buffer.size, **_SHARED_RW)


class UserMapping(mmap.mmap):
    """A mapping of an emulator dma-buf made by ``EmulatedDriver.mmap``; see the module doc.

    It is an ordinary shared ``mmap.mmap``; the methods below only tell the
    table first that the kernel's VMA is about to go or change.
    """

    _table: MappingTable | None = None
    _start = 0

    def close(self) -> None:
        self._forget()
        super().close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()  # mmap's own __exit__ calls the C close, bypassing ours

    def madvise(self, option: int, start: int = 0, length: int | None = None) -> None:
        self._forget()  # MADV_DONTFORK and friends split the VMA: let the kernel answer
        if length is None:
            super().madvise(option, start)
        else:
            super().madvise(option, start, length)

    def resize(self, newsize: int) -> None:
        self._forget()  # mremap may move the mapping
        super().resize(newsize)

    def __del__(self) -> None:
        # Runs before mmap's own dealloc unmaps, possibly from the garbage
        # collector while this thread holds the table's lock: only queue it.
        table, self._table = self._table, None
        if table is not None:
            table.forget_later(self._start)

    def _forget(self) -> None:
        table, self._table = self._table, None
        if table is not None:
            table.forget(self._start)


@dataclasses.dataclass(eq=False)
class _Entry:
    start: int
    end: int
    buffer: DmaBuf
    offset: int  # the file offset the mapping was made at
    dsp: mmap.mmap | None = None  # the DSP's cached mapping of the whole buffer
    leases: int = 0  # calls using ``dsp`` now
    gone: bool = False
    id: int = dataclasses.field(default_factory=new_memory_id)  # names ``dsp`` for PD children


class DspMemory:
    """The DSP's mapping of one buffer for one call; :meth:`release` exactly once.

    ``id`` names it for PD children; ``cached``: it outlives the call (kept with the
    caller's mapping), and the table reports its end to ``on_retire``."""

    def __init__(self, mapping: mmap.mmap, table: MappingTable, entry: _Entry | None) -> None:
        self.mapping = mapping
        self._table = table
        self._entry = entry
        self.id = entry.id if entry is not None else new_memory_id()
        self.cached = entry is not None

    def release(self) -> None:
        """End this call's use: a per-call mapping is closed, a cached one returned."""
        if self._entry is None:
            self.mapping.close()
        else:
            self._table.return_lease(self._entry)


class MappingTable:
    """The live :class:`UserMapping` objects by address, and the DSP mappings kept with them."""

    def __init__(
        self,
        vmas: VmaFinder,
        *,
        enabled: bool = True,
        on_retire: Callable[[list[int]], None] | None = None,
    ) -> None:
        self._vmas = vmas
        self._enabled = enabled
        self._on_retire = on_retire
        self._retired: list[int] = []  # ids of closed DSP mappings, reported outside the lock
        self._lock = threading.Lock()
        self._starts: list[int] = []  # sorted
        self._entries: dict[int, _Entry] = {}
        self._pending: collections.deque[int] = collections.deque()  # from __del__
        self._dsp_mappings = 0  # cached DSP mappings open, of live and retired entries

    # -- mappings handed out -------------------------------------------------

    def map(self, fd: int, buffer: DmaBuf, length: int, offset: int) -> mmap.mmap:
        """A shared read-write mapping of ``fd`` for the caller, remembered while it lives."""
        if not self._enabled:
            return mmap.mmap(fd, length, offset=offset, **_SHARED_RW)
        mapping = UserMapping(fd, length, offset=offset, **_SHARED_RW)
        anchor = ctypes.c_char.from_buffer(mapping)
        start = ctypes.addressof(anchor)
        del anchor  # no export may outlive this call: the caller must be able to close it
        entry = _Entry(start, start + len(mapping), buffer, offset)
        with self._lock:
            self._drain_pending()
            stale = self._entries.pop(start, None)
            if stale is None:
                bisect.insort(self._starts, start)
            else:  # pragma: no cover - the old mapping's end was seen before this munmap
                self._retire(stale)
            self._entries[start] = entry
        self._report_retired()
        mapping._table = self
        mapping._start = start
        return mapping

    def forget(self, start: int) -> None:
        """The mapping at ``start`` is about to be unmapped or changed."""
        with self._lock:
            self._drain_pending()
            self._remove(start)
        self._report_retired()

    def forget_later(self, start: int) -> None:
        """Like :meth:`forget`, from a finalizer: done before the next lookup."""
        self._pending.append(start)

    def _drain_pending(self) -> None:
        """Under the lock."""
        while self._pending:
            self._remove(self._pending.popleft())

    def _remove(self, start: int) -> None:
        """Under the lock."""
        entry = self._entries.pop(start, None)
        if entry is None:
            return
        del self._starts[bisect.bisect_left(self._starts, start)]
        self._retire(entry)

    def _retire(self, entry: _Entry) -> None:
        """Under the lock: close the DSP mapping now, or when its last call ends."""
        entry.gone = True
        if entry.leases == 0 and entry.dsp is not None:
            entry.dsp.close()
            entry.dsp = None
            self._dsp_mappings -= 1
            if self._on_retire is not None:
                self._retired.append(entry.id)

    def _report_retired(self) -> None:
        """Outside the lock: tell ``on_retire`` which cached DSP mappings closed."""
        if not self._retired or self._on_retire is None:
            return
        with self._lock:
            retired, self._retired = self._retired, []
        if retired:
            self._on_retire(retired)

    # -- lookups -------------------------------------------------------------

    def locate(self, buffer: DmaBuf, ptr: int, length: int, operation: str) -> int:
        """Offset of ``ptr`` in ``buffer``, checked the way the kernel finds it: via the VMA.

        The pointer must lie in a mapping of that same buffer made at offset 0,
        and ``ptr..ptr+length`` must stay inside that mapping and the buffer.
        The kernel silently computes a wrong address when these do not hold;
        the emulator refuses with EINVAL, the kernel's error for mapping failures.
        """
        with self._lock:
            self._drain_pending()
            entry = self._covering(buffer, ptr, length)
        self._report_retired()
        if entry is not None:
            return ptr - entry.start
        return self._locate_exactly(buffer, ptr, length, operation)

    def dsp_memory(
        self, fd: int, buffer: DmaBuf, ptr: int, length: int, operation: str
    ) -> tuple[int, DspMemory]:
        """:meth:`locate`, and the DSP's mapping of ``buffer`` for one call."""
        with self._lock:
            self._drain_pending()
            entry = self._covering(buffer, ptr, length)
            if entry is not None:
                entry.leases += 1
        self._report_retired()
        if entry is None:
            offset = self._locate_exactly(buffer, ptr, length, operation)
            return offset, DspMemory(dsp_mapping(fd, buffer), self, None)
        try:
            mapping = entry.dsp
            if mapping is None:
                mapping = dsp_mapping(fd, buffer)
                with self._lock:
                    if entry.dsp is None:
                        entry.dsp = mapping
                        self._dsp_mappings += 1
                    else:  # another call mapped it meanwhile
                        mapping.close()
                        mapping = entry.dsp
        except BaseException:
            self.return_lease(entry)
            raise
        return ptr - entry.start, DspMemory(mapping, self, entry)

    def return_lease(self, entry: _Entry) -> None:
        with self._lock:
            entry.leases -= 1
            if entry.gone:
                self._retire(entry)
        self._report_retired()

    def _covering(self, buffer: DmaBuf, ptr: int, length: int) -> _Entry | None:
        """Under the lock: the entry that answers for [ptr, ptr+length), if one may."""
        index = bisect.bisect_right(self._starts, ptr) - 1
        if index < 0:
            return None
        entry = self._entries[self._starts[index]]
        if (
            entry.buffer.key != buffer.key
            or entry.offset != 0
            or ptr >= entry.end
            or ptr + length > entry.end
            or ptr - entry.start + length > buffer.size
        ):
            return None  # the kernel decides, including every refusal
        return entry

    def _locate_exactly(self, buffer: DmaBuf, ptr: int, length: int, operation: str) -> int:
        vma = self._vmas.find(ptr)
        if vma is None or (vma.device, vma.inode) != buffer.maps_identity:
            raise fault(
                errno.EINVAL, f"{operation}: {ptr:#x} is not inside a mapping of the dma-buf"
            )
        if vma.offset != 0:
            raise fault(errno.EINVAL, f"{operation}: the dma-buf is mapped at a non-zero offset")
        offset = ptr - vma.start
        if ptr + length > vma.end or offset + length > buffer.size:
            raise fault(errno.EINVAL, f"{operation}: {ptr:#x}+{length} runs past the mapping")
        return offset

    # -- observation ---------------------------------------------------------

    def counts(self) -> tuple[int, int]:
        """(user mappings remembered, DSP mappings open), after pending ends.

        A DSP mapping whose user mapping is gone counts until its last call ends.
        """
        with self._lock:
            self._drain_pending()
            counts = len(self._entries), self._dsp_mappings
        self._report_retired()
        return counts
