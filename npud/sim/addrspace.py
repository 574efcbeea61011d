"""The 32-bit virtual address space of a simulated DSP process.

MMAP (heap growth) and MEM_MAP (user dma-bufs) both get their DSP addresses
from here: page-aligned, first fit, inside [0x10000000, 0xFFFFF000).
"""

from __future__ import annotations

import bisect
from typing import Final

DSP_PAGE: Final = 4096
DSP_VA_START: Final = 0x1000_0000
DSP_VA_END: Final = 0xFFFF_F000


class AddressSpaceFullError(Exception):
    """No gap is large enough."""


class DspAddressSpace:
    """Hands out page-aligned ranges; not thread-safe (its process's lock guards it)."""

    def __init__(self, start: int = DSP_VA_START, end: int = DSP_VA_END) -> None:
        self._start = start
        self._end = end
        self._starts: list[int] = []  # sorted
        self._sizes: dict[int, int] = {}  # start -> page-rounded size

    def allocate(self, size: int) -> int:
        """The start of a free range of at least ``size`` bytes."""
        if size <= 0:
            raise ValueError(f"cannot map {size} bytes")
        rounded = (size + DSP_PAGE - 1) // DSP_PAGE * DSP_PAGE
        cursor = self._start
        for index, start in enumerate(self._starts):
            if start - cursor >= rounded:
                return self._take(index, cursor, rounded)
            cursor = start + self._sizes[start]
        if self._end - cursor >= rounded:
            return self._take(len(self._starts), cursor, rounded)
        raise AddressSpaceFullError(f"no {rounded}-byte gap in the DSP address space")

    def _take(self, index: int, start: int, size: int) -> int:
        self._starts.insert(index, start)
        self._sizes[start] = size
        return start

    def release(self, start: int) -> None:
        index = bisect.bisect_left(self._starts, start)
        if index == len(self._starts) or self._starts[index] != start:
            raise KeyError(f"{start:#x} was not allocated")
        del self._starts[index]
        del self._sizes[start]

    def __len__(self) -> int:
        return len(self._starts)
