"""The tensor arenas of ``idl/portal_qnn.idl``'s ``run``: where each tensor sits.

A run passes its inputs in one buffer and its outputs in another; in each, the
tensors follow in index order, each starting at a multiple of ``ARENA_ALIGN``.
Both sides of the interface need the layout (npud's stub lays the client's arena
out by it; the emulated DSP reads and writes by it), so it is written once, here,
where both may import it. The C skel (``skel/portal_qnn_imp.c``) computes the same
in C; ``tests/skel`` checks it against this.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

ARENA_ALIGN: Final = 64
"""Each tensor of a run's arena starts at a multiple of this many bytes."""


def arena_layout(sizes: Iterable[int]) -> tuple[tuple[int, ...], int]:
    """The offset of each tensor of ``sizes`` bytes, in order, and the arena's size."""
    offsets: list[int] = []
    size = 0
    for nbytes in sizes:
        offsets.append(size)
        size += -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN
    return tuple(offsets), size
