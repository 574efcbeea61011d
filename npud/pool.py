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
can be.

Zeroing. Every buffer is zeroed before anyone gets it again, the connection that freed
it included (an allocation always reads zeros, as a new buffer does). The zeroing runs
on the control lane as a job of its own, queued when the buffer enters the pool: the
free's reply does not wait for it, and an allocation that arrives after the free on the
same lane runs after it, so it finds the buffer zeroed. An allocation takes only
zeroed buffers; it never zeroes one itself.

What is never kept: a buffer that an invoke still uses when it is freed (the DSP may
still write into it: the session releases it when the invoke returns, as without the
pool); a buffer larger than ``pool.max_buffer_bytes``; the buffers a connection still
held when it ended (its threads may still be writing them); anything while the pool is
off. A DSP restart drops every kept buffer (their session is gone, and with it their
DSP mappings).

Ownership. A kept buffer stays registered with its FastRpcSession, which stays the one
owner of its fd and mappings: the session's close (at a restart, at shutdown) releases
kept buffers with the rest. The pool holds the policy: which kept buffer goes to which
allocation, and when one goes back to the session to be released (to stay within
``pool.max_bytes``, after ``pool.idle_seconds`` unused, when its scope ends).

Threads. take, give, zeroing and trimming run on the control lane; dropping a
connection's buffers may run on the loader lane; ``row`` on any thread. One lock guards
the pool's tables; zeroing and releases run outside it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Final

import structlog

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.config import PoolConfig
from npud.fastrpc.dma import SessionBuffer
from npud.fastrpc.session import FastRpcSession

log = structlog.get_logger("npud.pool")

Scope = Hashable
"""Whose a kept buffer is: a connection (share = client) or a uid (share = user)."""

MIN_TRIM_WAIT: Final = 0.05
"""Seconds the idle trimmer sleeps at least between two looks."""


@dataclasses.dataclass(eq=False)
class _Kept:
    """One kept buffer."""

    buffer: SessionBuffer
    session: FastRpcSession
    scope: Scope
    since: float
    """When it entered the pool (on the pool's clock)."""
    zeroed: bool = False
    doomed: bool = False
    """Let go while being zeroed: the zeroing job releases it when done."""


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
    """Freed buffers of the current session, by scope and size. One per daemon (its
    counters span restarts); :meth:`attach` binds it to each new session."""

    def __init__(
        self,
        settings: PoolConfig,
        schedule: Callable[[Callable[[], None]], None],
        *,
        on_filled: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``schedule(job)`` runs ``job`` later on the control lane (zeroing, trimming);
        ``on_filled()`` is called (on the thread that keeps it) when an empty pool keeps a
        buffer: the owner's cue to trim it until it is empty again."""
        self._settings = settings
        self._schedule = schedule
        self._on_filled = on_filled
        self._clock = clock
        self._lock = threading.Lock()
        self._session: FastRpcSession | None = None
        self._order: dict[int, _Kept] = {}  # by buffer id, oldest first
        self._zeroed: dict[tuple[Scope, int], list[_Kept]] = {}  # by (scope, size), newest last
        self._dirty: collections.deque[_Kept] = collections.deque()
        self._zeroing: _Kept | None = None
        self._zero_job_queued = False
        self._bytes = 0
        self._counters = _Counters()

    # --- settings and sessions ------------------------------------------------------
    @property
    def settings(self) -> PoolConfig:
        return self._settings

    def scope(self, connection: object, uid: int) -> Scope:
        """The scope of buffers freed by ``connection`` (of user ``uid``)."""
        return connection if self._settings.share == "client" else ("uid", uid)

    def reconfigure(self, settings: PoolConfig) -> None:
        """A reload. Buffers kept under rules that changed are released (on the control lane)."""
        with self._lock:
            old, self._settings = self._settings, settings
        restart = (
            not settings.enabled
            or settings.share != old.share
            or (old.keep_dsp_mappings and not settings.keep_dsp_mappings)
        )
        self._schedule(self.drop_all if restart else self.trim)

    def attach(self, session: FastRpcSession) -> None:
        """Keep buffers of ``session`` from now on (a new session, at start or after a restart)."""
        self.detach()
        with self._lock:
            self._session = session

    def detach(self) -> None:
        """Forget every kept buffer without releasing it: the session is being closed, and
        its close releases them."""
        with self._lock:
            self._session = None
            self._counters.dropped += len(self._forget_locked_all(list(self._order.values())))

    # --- the control lane -------------------------------------------------------------
    def allocate(self, session: FastRpcSession, scope: Scope, size: int) -> SessionBuffer:
        """A buffer of ``size`` bytes (whole pages) for ``scope``: a kept one if there is
        one, else a new one from the session. A new one that cannot be had is tried once
        more after every kept buffer was released: the pool never makes an allocation fail."""
        buffer = self.take(session, scope, size)
        if buffer is not None:
            return buffer
        try:
            return session.alloc(size)
        except CodedError as exc:
            if exc.code is not ErrorCode.DMA_BUF_ALLOC or not self._evict_all():
                raise
            log.warning("allocation failed; released the pool's buffers and retried", size=size)
        return session.alloc(size)

    def take(self, session: FastRpcSession, scope: Scope, size: int) -> SessionBuffer | None:
        """A kept, zeroed buffer of exactly ``size`` bytes for ``scope``, back in use; or None."""
        with self._lock:
            if not self._settings.enabled or session is not self._session:
                return None
            bucket = self._zeroed.get((scope, size))
            while bucket:
                kept = bucket[-1]  # the most recently kept: the likeliest to be warm
                self._forget_locked(kept)
                if session.owns(kept.buffer):
                    break
            else:
                self._counters.misses += 1
                return None
            self._counters.hits += 1
        kept.buffer.unpark()
        return kept.buffer

    def give(self, session: FastRpcSession | None, scope: Scope, buffer: SessionBuffer) -> bool:
        """Offer a buffer its client freed. True: the pool keeps it (the caller must not
        release it); False: the caller releases it, as without the pool."""
        settings = self._settings
        if (
            session is None
            or not settings.enabled
            or buffer.size > min(settings.max_buffer_bytes, settings.max_bytes)
            or session is not self._session
            or session.dead
            or not session.owns(buffer)
            or not buffer.park()  # an invoke still uses it
        ):
            self._count_passed()
            return False
        if buffer.dsp_address is not None and not settings.keep_dsp_mappings:
            try:
                session.unmap(buffer)
            except CodedError as exc:
                log.warning("unmapping a freed buffer failed; releasing it", error=str(exc))
                buffer.unpark()
                self._count_passed()
                return False
        kept = _Kept(buffer, session, scope, self._clock())
        with self._lock:
            if session is not self._session:  # a restart meanwhile: its close releases it
                self._counters.passed += 1
                buffer.unpark()
                return False
            filled = not self._order
            self._order[buffer.id] = kept
            self._dirty.append(kept)
            self._bytes += buffer.size
            self._counters.kept += 1
            evicted = self._evict_locked(self._settings.max_bytes)
            queue_job = not self._zero_job_queued
            self._zero_job_queued = True
        self._release(evicted)
        if queue_job:
            self._schedule(self.zero_kept)
        if filled and self._on_filled is not None:
            self._on_filled()
        return True

    def zero_kept(self) -> None:
        """Zero every kept buffer that is not zeroed yet (a control-lane job)."""
        while True:
            with self._lock:
                if not self._dirty:
                    self._zero_job_queued = False
                    return
                kept = self._dirty.popleft()
                self._zeroing = kept
            started = time.perf_counter()
            zeroed = kept.buffer.zero()
            elapsed = time.perf_counter() - started
            with self._lock:
                self._zeroing = None
                self._counters.scrub_seconds += elapsed
                if zeroed:
                    self._counters.scrubbed_bytes += kept.buffer.size
                release = kept.doomed and zeroed
                if kept.doomed:
                    pass  # forgotten while being zeroed: released here, below
                elif zeroed:
                    kept.zeroed = True
                    self._zeroed.setdefault((kept.scope, kept.buffer.size), []).append(kept)
                elif self._order.pop(kept.buffer.id, None) is kept:
                    self._bytes -= kept.buffer.size  # released under us: its session closed
            if release:
                self._release([kept])

    def trim(self) -> None:
        """Release what was kept longer than ``idle_seconds``, and what a lowered bound no
        longer allows (a control-lane job)."""
        now = self._clock()
        with self._lock:
            settings = self._settings
            expired = [
                kept
                for kept in self._order.values()
                if kept.zeroed and now - kept.since >= settings.idle_seconds
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
        """Release every kept buffer (the rules they were kept under changed)."""
        with self._lock:
            everything = list(self._order.values())
            self._counters.dropped += len(everything)
            released = self._forget_locked_all(everything)
        self._release(released)

    def _evict_all(self) -> bool:
        """Release every kept buffer to make room; True if there was any."""
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
        """Seconds until the oldest zeroed buffer has been kept for ``idle_seconds`` (a
        buffer entering the pool now is due no sooner than that)."""
        with self._lock:
            idle = self._settings.idle_seconds
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
            mapped=sum(k.buffer.dsp_address is not None for k in kept),
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
        if self._order.pop(kept.buffer.id, None) is not kept:
            return False
        self._bytes -= kept.buffer.size
        if self._zeroing is kept:
            kept.doomed = True
            return False
        if kept.zeroed:
            key = (kept.scope, kept.buffer.size)
            bucket = self._zeroed[key]
            bucket.remove(kept)
            if not bucket:
                del self._zeroed[key]
        else:
            self._dirty.remove(kept)
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
        """Give buffers back to their session to be released (DSP unmap, munmap, close).
        Not those of a session the pool let go of: its close releases them (a hung DSP
        must not be asked to unmap them first)."""
        for kept in gone:
            session = kept.session
            if session is not self._session or not session.owns(kept.buffer):
                continue
            try:
                session.free(kept.buffer)
            except CodedError as exc:
                log.warning("releasing a kept buffer failed", error=str(exc))
