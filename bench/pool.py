"""16 MiB allocated and touched: a buffer from npud's pool beside a fresh memfd in the client.

Subject: ``client.alloc(16 MiB)`` through npud (emulator, a child process) and a write
to every page of it, as a client that allocates and fills a buffer does. The client
allocated and freed a buffer of that size before, so this is what a client gets on a
second allocation of a size: a kept buffer, zeroed by npud when it was freed, its pages
in place. Every timed allocation is checked (untimed) to be that same buffer and to
read zeros where the touch did not write.

Baseline: the same in the client alone, with nothing shared: ``memfd_create``,
``ftruncate``, ``mmap`` and a write to every page, so the kernel allocates and zeroes
every page at its first touch. That is what a client would pay to get fresh shared
memory without npud; without the pool npud paid about the same and more (the issue
measured 0.91x).

Not timed on either side: the release (the client's ``free`` and unmapping; the
baseline's ``munmap`` and ``close``). Its medians go along as figures.

Ratio: fresh time / pooled time, per round (each round runs both, several times, and
takes their medians).
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Final

import npu_client
from bench.harness import Context, Goal, Row, interleave, median, ratio_row
from bench.processes import npud

NAME = "pool"
SUMMARY = "16 MiB alloc + first touch: a buffer from npud's pool vs a fresh memfd in the client"

BIG: Final = 16 * 1024 * 1024
PAGE: Final = mmap.PAGESIZE
ONES: Final = b"\x01" * (BIG // PAGE)


def _touch(memory: memoryview) -> None:
    """Write one byte in every page (in C: a strided slice assignment)."""
    memory[::PAGE] = ONES


def _untouched_are_zero(memory: memoryview) -> bool:
    return not any(memory[1::PAGE])


class _Pooled:
    """One connection; each ``round`` allocates, touches and frees ``times`` times."""

    def __init__(self, path: Path, times: int) -> None:
        self._client = npu_client.connect(str(path), name="bench-pool")
        self._times = times
        first = self._client.alloc(BIG)  # a miss: the pool has nothing yet
        self._inode = os.fstat(first.fd).st_ino
        first.free()
        self.releases: list[float] = []
        self.allocations = 0

    def round(self) -> float:
        times = []
        for _ in range(self._times):
            start = time.perf_counter()
            buffer = self._client.alloc(BIG)
            view = buffer.view()
            _touch(view)
            times.append(time.perf_counter() - start)
            self.allocations += 1
            if os.fstat(buffer.fd).st_ino != self._inode:
                raise AssertionError("the allocation did not get the pooled buffer")
            if not _untouched_are_zero(view):
                raise AssertionError("the pooled buffer was not zeroed")
            view.release()
            start = time.perf_counter()
            buffer.free()
            self.releases.append(time.perf_counter() - start)
        return median(times)

    def hits(self) -> int:
        pool = self._client.status().pool
        if pool is None:
            raise AssertionError("npud reports no pool")
        return pool.hits

    def close(self) -> None:
        self._client.close()


class _Fresh:
    """A new memfd per allocation, in this process."""

    def __init__(self, times: int) -> None:
        self._times = times
        self.releases: list[float] = []

    def round(self) -> float:
        times = []
        for _ in range(self._times):
            start = time.perf_counter()
            fd = os.memfd_create("bench-fresh", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, BIG)
                memory = mmap.mmap(fd, BIG, flags=mmap.MAP_SHARED)
                view = memoryview(memory)
                _touch(view)
                times.append(time.perf_counter() - start)
                if not _untouched_are_zero(view):
                    raise AssertionError("a fresh memfd did not read zeros")
                view.release()
                start = time.perf_counter()
                memory.close()
            finally:
                os.close(fd)
            self.releases.append(time.perf_counter() - start)
        return median(times)


def measure(
    workdir: Path, rounds: int, times: int
) -> tuple[list[float], list[float], dict[str, float]]:
    """Per round, the medians of ``times`` pooled and fresh allocations; the figures."""
    with npud(workdir) as path:
        pooled, fresh = _Pooled(path, times), _Fresh(times)
        try:
            pooled.round()  # warm both up: the pool, the page cache, the allocator
            fresh.round()
            pooled.releases.clear()
            fresh.releases.clear()
            hits_before = pooled.hits()
            subject, baseline = interleave(rounds, pooled.round, fresh.round)
            hits = pooled.hits() - hits_before
            if hits != rounds * times:
                raise AssertionError(f"{hits} pool hits for {rounds * times} allocations")
        finally:
            pooled.close()
    figures = {
        "pooled_ms": median(subject) * 1000,
        "fresh_ms": median(baseline) * 1000,
        "pooled_release_ms": median(pooled.releases) * 1000,
        "fresh_release_ms": median(fresh.releases) * 1000,
    }
    return subject, baseline, figures


def rows(ctx: Context) -> list[Row]:
    subject, baseline, figures = measure(ctx.workdir, ctx.rounds(9, 3), ctx.rounds(5, 2))
    return [
        ratio_row(
            "pool.alloc16m",
            "fresh memfd / npud pool (16 MiB alloc + a write to every page)",
            [b / s for s, b in zip(subject, baseline, strict=True)],
            figures,
            Goal("ratio", 10, "at_least"),
        )
    ]
