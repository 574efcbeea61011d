"""The buffer pool: DMA-BUFs that clients free, kept zeroed for the next allocation of
their size.

A new DMA-BUF costs an ioctl, the kernel's allocation and zeroing of its pages, and
then, in the client, a fault for every page it touches first. A kept buffer skips all
of it: its pages stay allocated, npud's host mapping of it stays, and (with
``pool.keep_dsp_mappings``) so does its DSP mapping, so ``map`` answers at once.

Who gets a kept buffer. Only an allocation of exactly its size (the size a client is
told is the size it gets, as without the pool), and only within the buffer's *scope*
(``pool.share``): with ``client``, the connection that freed it (whose kept buffers
are released when it disconnects); with ``user``, any connection of the same uid.
npud cannot take back an fd or a mapping it gave out, so a process that keeps either
after its free sees whatever the next holder writes there: the scope bounds who that
can be. A buffer kept with its DSP mapping goes only to an allocation of the same
domain (another domain's DSP process must never see it).

Zeroing. Every buffer is zeroed before anyone gets it again, the connection that freed
it included (an allocation always reads zeros, as a new buffer does). The zeroing is a
job of its own on the freeing domain's control lane, queued when the buffer enters the
pool: the free's reply does not wait for it, and an allocation of that domain that
arrives after the free runs after it on the same lane, so it finds the buffer zeroed.
An allocation takes only zeroed buffers, and zeroes one again when another connection
than the one that freed it takes it (``share = "user"``): the freeing connection may
have kept an fd or a mapping and written through it after its free.

What is never kept: a buffer that an invoke still uses when it is freed (the DSP may
still write into it: it is released when the invoke returns, as without the pool); a
buffer larger than ``pool.max_buffer_bytes``; the buffers a connection still held when
it ended (its threads may still be writing them); anything while the pool is off. A
restart of a domain ends the DSP mappings kept there (the buffers stay kept), except
that a subsystem restart ends the buffers allocated in a compute bank (no system
heap): those are released and never handed out again.

Ownership. The pool holds each kept buffer as its owner would (one reference, see
:class:`~npud.fastrpc.kernel.dma.DmaBuffer`) and, when mapped, one mapping lease of the
domain's registry. Releasing a kept buffer gives the lease back on its domain's control
lane and then lets go of the buffer (``release``, given by the daemon's memory).

Threads: take and give run on control lanes, zeroing on the freeing domain's control
lane, trimming on the closer lane; ``row`` on any thread. One lock guards the pool's
tables; zeroing and releases run outside it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Final

import structlog

import npu_protocol as p
from npud.domain.registry import MappingLease
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.ops.config import PoolConfig

log = structlog.get_logger("npud.pool")

Scope = Hashable
"""Whose a kept buffer is: a connection (share = client) or a uid (share = user)."""

MIN_TRIM_WAIT: Final = 0.05
"""Seconds the idle trimmer sleeps at least between two looks."""

Job = Callable[[], None]


@dataclasses.dataclass(eq=False)
class _Kept:
    """One kept buffer."""

    buffer: DmaBuffer
    scope: Scope
    since: float
    """When it entered the pool (on the pool's clock)."""
    mapping: MappingLease | None
    zeroed: bool = False
    zeroing: bool = False
    doomed: bool = False
    """Let go while being zeroed: the zeroing job releases it when done."""
    freed_by: object = None
    """The connection that freed it: anyone else gets it zeroed once more."""

    @property
    def domain(self) -> object | None:
        """The registry (one per domain) its mapping lives in, while it is valid."""
        mapping = self.mapping
        return mapping.registry if mapping is not None and mapping.valid else None


@dataclasses.dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    kept: int = 0
    passed: int = 0
    evicted: int = 0
    trimmed: int = 0
    dropped: int = 0
    scrubbed_bytes: int = 0
    scrub_seconds: float = 0.0


class BufferPool:
    """Freed buffers by scope and size, for the whole daemon."""

    def __init__(
        self,
        settings: PoolConfig,
        release: Callable[[DmaBuffer], None],
        *,
        on_filled: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``release(buffer)`` lets go of a buffer the pool no longer keeps (its mapping
        lease already given back); ``on_filled()`` is called (on the thread that keeps it)
        when an empty pool keeps a buffer: the owner's cue to trim it until it is empty."""
        self._settings = settings
        self._release_buffer = release
        self._on_filled = on_filled
        self._clock = clock
        self._lock = threading.Lock()
        self._order: dict[DmaBuffer, _Kept] = {}  # oldest first
        self._zeroed: dict[tuple[Scope, int], list[_Kept]] = {}  # by (scope, size), newest last
        self._bytes = 0
        self._counters = _Counters()

    # --- settings --------------------------------------------------------------------
    @property
    def settings(self) -> PoolConfig:
        return self._settings

    def scope(self, connection: object, uid: int) -> Scope:
        """The scope of buffers freed by ``connection`` (of user ``uid``)."""
        return connection if self._settings.share == "client" else ("uid", uid)

    def reconfigure(self, settings: PoolConfig) -> None:
        """A reload. Buffers kept under rules that changed are released."""
        with self._lock:
            old, self._settings = self._settings, settings
        restart = (
            not settings.enabled
            or settings.share != old.share
            or (old.keep_dsp_mappings and not settings.keep_dsp_mappings)
        )
        if restart:
            self.drop_all()
        else:
            self.trim()

    # --- allocation and free (control lanes) -------------------------------------------------
    def take(
        self, scope: Scope, size: int, domain: object, taker: object = None
    ) -> tuple[DmaBuffer, MappingLease | None] | None:
        """A kept, zeroed buffer of exactly ``size`` bytes for ``scope``, back in use, with
        its mapping lease when it is mapped in ``domain`` (a registry); or None. The
        caller now holds the buffer (and the lease). A buffer that ``taker`` (a
        connection) did not free itself is zeroed again first: the connection that freed
        it may have kept an fd or a mapping and written through it since."""
        with self._lock:
            if not self._settings.enabled:
                return None
            bucket = self._zeroed.get((scope, size), [])
            for kept in reversed(bucket):  # the most recently kept: the likeliest to be warm
                if kept.buffer.bank_lost:
                    continue  # its compute bank went with a restart: never handed out
                if kept.domain is None or kept.domain is domain:
                    break
            else:
                self._counters.misses += 1
                return None
            self._forget_locked(kept)
            self._counters.hits += 1
        if kept.freed_by is not taker:
            kept.buffer.zero()
        kept.buffer.unpark()
        mapping = kept.mapping if kept.mapping is not None and kept.mapping.valid else None
        return kept.buffer, mapping

    def give(
        self,
        scope: Scope,
        buffer: DmaBuffer,
        mapping: MappingLease | None,
        lane: Callable[[Job], None],
        freed_by: object = None,
    ) -> bool:
        """Offer a buffer its client (connection ``freed_by``) freed, with its mapping
        lease if the client had it mapped and the pool keeps mappings. True: the pool
        keeps both (the caller lets go of neither); False: the caller releases them, as
        without the pool. The zeroing is queued on ``lane`` (the freeing domain's control
        lane)."""
        settings = self._settings
        if (
            not settings.enabled
            or buffer.size > min(settings.max_buffer_bytes, settings.max_bytes)
            or (mapping is not None and not settings.keep_dsp_mappings)
            or not buffer.park()  # an invoke still uses it
        ):
            self._count_passed()
            return False
        kept = _Kept(buffer, scope, self._clock(), mapping, zeroing=True, freed_by=freed_by)
        with self._lock:
            filled = not self._order
            self._order[buffer] = kept
            self._bytes += buffer.size
            self._counters.kept += 1
            evicted = self._evict_locked(self._settings.max_bytes)
        self._release(evicted)
        lane(lambda: self._zero(kept))
        if filled and self._on_filled is not None:
            self._on_filled()
        return True

    def _zero(self, kept: _Kept) -> None:
        """Zero one kept buffer (a job on the freeing domain's control lane)."""
        started = time.perf_counter()
        zeroed = kept.buffer.zero()
        elapsed = time.perf_counter() - started
        with self._lock:
            kept.zeroing = False
            self._counters.scrub_seconds += elapsed
            if zeroed:
                self._counters.scrubbed_bytes += kept.buffer.size
            release = kept.doomed
            if not release:
                kept.zeroed = True
                self._zeroed.setdefault((kept.scope, kept.buffer.size), []).append(kept)
        if release:
            self._release([kept])

    # --- letting go ------------------------------------------------------------------------
    def trim(self) -> None:
        """Release what was kept longer than ``idle_s``, and what a lowered bound no
        longer allows."""
        now = self._clock()
        with self._lock:
            settings = self._settings
            expired = [
                kept
                for kept in self._order.values()
                if kept.zeroed and now - kept.since >= settings.idle_s
            ]
            self._counters.trimmed += len(expired)
            largest = min(settings.max_buffer_bytes, settings.max_bytes)
            too_big = [
                kept
                for kept in self._order.values()
                if kept.buffer.size > largest and kept not in expired
            ]
            released = self._forget_locked_all(expired + too_big)
            evicted = self._evict_locked(settings.max_bytes)
            self._counters.evicted += len(too_big)
        self._release([*released, *evicted])

    def drop(self, scope: Scope) -> None:
        """Release the buffers kept for ``scope`` (its connection ended)."""
        with self._lock:
            mine = [kept for kept in self._order.values() if kept.scope == scope]
            self._counters.dropped += len(mine)
            released = self._forget_locked_all(mine)
        self._release(released)

    def drop_all(self) -> None:
        """Release every kept buffer (the rules they were kept under changed, or npud stops)."""
        with self._lock:
            everything = list(self._order.values())
            self._counters.dropped += len(everything)
            released = self._forget_locked_all(everything)
        self._release(released)

    def drop_lost(self) -> int:
        """Release every kept buffer whose compute bank a subsystem restart removed (no
        system heap: ALLOC_DMA_BUFF buffers); the number released."""
        with self._lock:
            lost = [kept for kept in self._order.values() if kept.buffer.bank_lost]
            self._counters.dropped += len(lost)
            released = self._forget_locked_all(lost)
        self._release(released)
        return len(lost)

    def evict_all(self) -> bool:
        """Release every kept buffer to make room (an allocation failed); True if any."""
        with self._lock:
            everything = list(self._order.values())
            self._counters.evicted += len(everything)
            released = self._forget_locked_all(everything)
        self._release(released)
        return bool(everything)

    # --- for the trio thread -------------------------------------------------------------
    def holds(self, scope: Scope | None = None) -> bool:
        """Whether any buffer is kept (for ``scope``, if given)."""
        with self._lock:
            if scope is None:
                return bool(self._order)
            return any(kept.scope == scope for kept in self._order.values())

    def next_trim_in(self) -> float:
        """Seconds until the oldest zeroed buffer has been kept for ``idle_s`` (a
        buffer entering the pool now is due no sooner than that)."""
        with self._lock:
            idle = self._settings.idle_s
            oldest = next((kept for kept in self._order.values() if kept.zeroed), None)
            wait = idle if oldest is None else oldest.since + idle - self._clock()
        return max(MIN_TRIM_WAIT, wait)

    def row(self) -> p.PoolRow:
        with self._lock:
            kept = list(self._order.values())
            counters = dataclasses.replace(self._counters)
            settings = self._settings
            total = self._bytes
        return p.PoolRow(
            enabled=settings.enabled,
            share=settings.share,
            buffers=len(kept),
            bytes=total,
            max_bytes=settings.max_bytes,
            mapped=sum(k.domain is not None for k in kept),
            scrubbing=sum(not k.zeroed for k in kept),
            hits=counters.hits,
            misses=counters.misses,
            kept=counters.kept,
            passed=counters.passed,
            evicted=counters.evicted,
            trimmed=counters.trimmed,
            dropped=counters.dropped,
            scrubbed_bytes=counters.scrubbed_bytes,
            scrub_us=round(counters.scrub_seconds * 1_000_000),
        )

    # --- helpers ---------------------------------------------------------------------------
    def _count_passed(self) -> None:
        with self._lock:
            self._counters.passed += 1

    def _forget_locked(self, kept: _Kept) -> bool:
        """Take ``kept`` out of every table (the lock is held). True: the caller releases
        it; False: it is being zeroed (the zeroing job releases it) or was forgotten already."""
        if self._order.pop(kept.buffer, None) is not kept:
            return False
        self._bytes -= kept.buffer.size
        if kept.zeroing:
            kept.doomed = True
            return False
        key = (kept.scope, kept.buffer.size)
        bucket = self._zeroed[key]
        bucket.remove(kept)
        if not bucket:
            del self._zeroed[key]
        return True

    def _forget_locked_all(self, gone: Iterable[_Kept]) -> list[_Kept]:
        """:meth:`_forget_locked` for each; the ones the caller releases."""
        return [kept for kept in list(gone) if self._forget_locked(kept)]

    def _evict_locked(self, limit: int) -> list[_Kept]:
        """Forget the longest-kept buffers until the pool holds at most ``limit`` bytes;
        the ones the caller releases (the lock is held)."""
        evicted: list[_Kept] = []
        while self._bytes > limit and self._order:
            kept = next(iter(self._order.values()))
            self._counters.evicted += 1
            if self._forget_locked(kept):
                evicted.append(kept)
        return evicted

    def _release(self, gone: Iterable[_Kept]) -> None:
        """Let go of buffers: a valid mapping lease is given back on its domain's control
        lane first (never a DSP call here), then the buffer is released."""
        for kept in gone:
            buffer = kept.buffer
            buffer.unpark()
            mapping = kept.mapping
            if mapping is not None and mapping.valid:
                mapping.release_later(functools.partial(self._release_buffer, buffer))
            else:
                self._release_buffer(buffer)
