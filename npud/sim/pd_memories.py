"""A PD child's table of memories: buffers mapped by id (``AddMemory``), also by the
fd number the DSP was told (``BindFd``, ``BindAlias``), dropped on ``DropMemory``
once no id names them and no call uses them (npud.sim.pd_child runs the child)."""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Iterable


class Memory:
    """One mapping in the child: the ids that name it and the calls using it now."""

    __slots__ = ("holders", "mapping", "users")

    def __init__(self, mapping: mmap.mmap) -> None:
        self.mapping = mapping
        self.holders = 1  # ids that name it
        self.users = 0  # calls using it now


class MemoryTable:
    """Buffers mapped in this child, by id; MEM_MAP'd ones also by the DSP's fd number."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, Memory] = {}
        self._by_fd: dict[int, list[tuple[int, int, int]]] = {}  # fd -> [(id, offset, length)]

    def add(self, memory_id: int, fd: int, size: int) -> None:
        """Map ``size`` bytes of ``fd`` as ``memory_id``; takes (and closes) ``fd``."""
        try:
            mapping = map_shared(fd, size)
        finally:
            os.close(fd)
        with self._lock:
            replaced = self._by_id.get(memory_id)
            self._by_id[memory_id] = Memory(mapping)
            if replaced is not None:  # an id sent again: it names the new mapping now
                replaced.holders -= 1
                if replaced.holders or replaced.users:
                    return
        if replaced is not None:
            close_mapping(replaced.mapping)

    def bind(self, memory_id: int, fd_number: int, offset: int, length: int) -> None:
        with self._lock:
            if memory_id in self._by_id:
                self._by_fd.setdefault(fd_number, []).append((memory_id, offset, length))

    def alias(self, memory_id: int, target: int, fd_number: int, offset: int, length: int) -> None:
        with self._lock:
            memory = self._by_id.get(target)
            if memory is None:
                return
            memory.holders += 1
            self._by_id[memory_id] = memory
            self._by_fd.setdefault(fd_number, []).append((memory_id, offset, length))

    def drop(self, memory_ids: list[int]) -> None:
        closing: list[mmap.mmap] = []
        with self._lock:
            for memory_id in memory_ids:
                memory = self._by_id.pop(memory_id, None)
                if memory is None:
                    continue
                for fd_number, bound in list(self._by_fd.items()):
                    kept = [entry for entry in bound if entry[0] != memory_id]
                    if kept:
                        self._by_fd[fd_number] = kept
                    else:
                        del self._by_fd[fd_number]
                memory.holders -= 1
                if memory.holders == 0 and memory.users == 0:
                    closing.append(memory.mapping)
        for mapping in closing:
            close_mapping(mapping)

    def acquire(self, memory_id: int) -> Memory | None:
        """The memory ``memory_id`` names, for one call (:meth:`release` it after); None
        when this child holds no such memory."""
        with self._lock:
            memory = self._by_id.get(memory_id)
            if memory is None:
                return None
            memory.users += 1
            return memory

    def acquire_all(self, memory_ids: Iterable[int]) -> dict[int, Memory] | int:
        """The memories of every id, acquired at once (:meth:`release` each); or the
        first id this child does not hold (nothing is then acquired)."""
        acquired: dict[int, Memory] = {}
        with self._lock:
            for memory_id in memory_ids:
                if memory_id in acquired:
                    continue
                memory = self._by_id.get(memory_id)
                if memory is None:
                    for taken in acquired.values():
                        taken.users -= 1
                    return memory_id
                memory.users += 1
                acquired[memory_id] = memory
        return acquired

    def release(self, memory: Memory) -> None:
        """A call is done with ``memory``: its mapping closes with its last user once no
        id names it any more (dropped while calls used it)."""
        with self._lock:
            memory.users -= 1
            if memory.users or memory.holders:
                return
        close_mapping(memory.mapping)

    def acquire_by_fd(self, fd_number: int) -> tuple[Memory, int, int] | None:
        """(memory, offset, length) of the newest MEM_MAP made through ``fd_number``,
        acquired as by :meth:`acquire` (:meth:`release` it); None when there is none."""
        with self._lock:
            bound = self._by_fd.get(fd_number)
            if not bound:
                return None
            memory_id, offset, length = bound[-1]
            memory = self._by_id.get(memory_id)
            if memory is None:  # bound and dropped together: never, but never a crash
                return None
            memory.users += 1
            return memory, offset, length

    def find_by_fd(self, fd_number: int) -> tuple[int, int, int] | None:
        """(id, offset, length) of the newest MEM_MAP made through ``fd_number``."""
        with self._lock:
            bound = self._by_fd.get(fd_number)
            return bound[-1] if bound else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)


def map_shared(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def close_mapping(mapping: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # skel code still holds a view: it goes with it
        mapping.close()
