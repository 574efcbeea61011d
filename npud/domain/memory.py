"""The DMA-BUFs npud hands to clients: where they come from and where they go back.

Buffers come from the system DMA-BUF heap (:mod:`npud.fastrpc.kernel.dma_heap`), as
libcdsprpc's rpcmem allocates them, so they belong to no domain: a restart of a
domain's DSP process leaves them alone, and any domain can map them. Where the
machine has no heap, they come from the FastRPC driver's ALLOC_DMA_BUFF on the
allocating client's domain (the fallback rpcmem uses too). Either way the
daemon owns each buffer until its client frees it or goes.

Between a free and the next allocation of its size a buffer may be kept by
the pool (:mod:`npud.domain.pool`). :class:`Memory` is the one owner of the
buffers handed out: it counts them (``statistics``), and lets go of each once,
however it ends (freed, the client gone, a restart of a version-2 client's
domain, the pool letting go).

Every method may run on any thread; the allocation and the free run on the
requesting domain's control lane.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import structlog

from npu_protocol import CodedError, ErrorCode
from npud.domain.pool import BufferPool, Job, Scope
from npud.domain.registry import MappingLease
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.dma_heap import DmaHeap
from npud.ops.config import PoolConfig

log = structlog.get_logger("npud.memory")


@dataclasses.dataclass(frozen=True)
class MemoryStatistics:
    source: str
    """"heap" (the system DMA-BUF heap) or "fastrpc" (ALLOC_DMA_BUFF: no heap here)."""
    buffers: int
    """Buffers held for clients or kept by the pool (not yet let go)."""
    bytes: int


class Memory:
    """See the module docstring."""

    def __init__(
        self,
        heap: DmaHeap | None,
        pool: PoolConfig,
        *,
        on_filled: Callable[[], None] | None = None,
    ) -> None:
        self.heap = heap
        self._lock = threading.Lock()
        self._held: set[DmaBuffer] = set()
        self.pool = BufferPool(pool, self.release, on_filled=on_filled)

    @property
    def source(self) -> str:
        return "heap" if self.heap is not None else "fastrpc"

    def allocate(
        self,
        size: int,
        scope: Scope,
        domain: object,
        fallback: Callable[[int], DmaBuffer],
        taker: object = None,
    ) -> tuple[DmaBuffer, MappingLease | None]:
        """A buffer of ``size`` bytes (whole pages) for ``scope``: a kept one when the pool
        has one (with its mapping lease when it is mapped in ``domain``), else a new one
        from the heap, or from ``fallback(size)`` (the domain's session) without a heap.
        A new one that cannot be had is tried once more after the pool let go of all it
        kept: the pool never makes an allocation fail."""
        taken = self.pool.take(scope, size, domain, taker)
        if taken is not None:
            return taken
        try:
            buffer = self._new(size, fallback)
        except CodedError as exc:
            if exc.code is not ErrorCode.DMA_BUF_ALLOC or not self.pool.evict_all():
                raise
            log.warning("allocation failed; released the pool's buffers and retried", size=size)
            buffer = self._new(size, fallback)
        return buffer, None

    def allocate_fresh(self, size: int, fallback: Callable[[int], DmaBuffer]) -> DmaBuffer:
        """A new buffer, never a kept one (a model's arena, which the pool never gets)."""
        return self._new(size, fallback)

    def _new(self, size: int, fallback: Callable[[int], DmaBuffer]) -> DmaBuffer:
        buffer = self.heap.allocate(size) if self.heap is not None else fallback(size)
        with self._lock:
            self._held.add(buffer)
        return buffer

    def free(
        self,
        scope: Scope,
        buffer: DmaBuffer,
        mapping: MappingLease | None,
        lane: Callable[[Job], None],
        freed_by: object = None,
    ) -> bool:
        """A client (connection ``freed_by``) freed ``buffer`` (its mapping lease, if still
        held, with it): the pool keeps it, or it is let go. True when the pool kept the
        lease too; False when the caller must give the lease back (then the buffer is let
        go right after)."""
        if self.pool.give(scope, buffer, mapping, lane, freed_by):
            return True
        if mapping is None or not mapping.valid:
            self.release(buffer)
        return False

    def release(self, buffer: DmaBuffer) -> None:
        """Let go of ``buffer`` for good (its holder's mapping lease already given back):
        it is closed now, or by whatever still holds it (an invoke, a mapping) once that
        lets go. Idempotent."""
        with self._lock:
            if buffer not in self._held:
                return
            self._held.discard(buffer)
        buffer.give_up()

    def forget_lost(self) -> None:
        """A subsystem restart removed the compute banks that ALLOC_DMA_BUFF buffers live
        in (no system heap): the pool lets go of those it kept, and none is handed out
        again. Buffers that clients hold are let go by their domains' restart."""
        dropped = self.pool.drop_lost()
        if dropped:
            log.warning("released pooled buffers a DSP restart invalidated", buffers=dropped)

    def close(self) -> None:
        """npud stops: the pool lets go of all it kept, then the heap node is closed (the
        buffers still held are released by their holders, or by the process's exit)."""
        self.pool.drop_all()
        if self.heap is not None:
            self.heap.close()

    def statistics(self) -> MemoryStatistics:
        with self._lock:
            held = list(self._held)
        return MemoryStatistics(self.source, len(held), sum(b.size for b in held))
