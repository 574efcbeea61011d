"""Counting system suspends: how npud learns that its waiting calls were interrupted.

A suspend's freezer ends every interruptible wait in the kernel with ERESTARTSYS.
For an INVOKE, mainline's fastrpc then keeps the call's context
on the fd's pending list, its id taken until the fd is released (255 ids per
channel, shared by every fd on it), and the syscall restarts by itself: userspace
sees nothing but a longer call. So npud counts suspends, and every INVOKE that
was waiting when one happened counts as one context the kernel keeps.

CLOCK_BOOTTIME runs on through a suspend, CLOCK_MONOTONIC stops: their
difference grows by the time suspended and by nothing else. When it has grown,
``/sys/power/suspend_stats/success`` says by how many suspends (one when the file
cannot be read). The common path is two vDSO clock reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

SUSPEND_STATS: Final = Path("/sys/power/suspend_stats/success")
SLEEP_NOISE_NS: Final = 50_000_000
"""Growth of BOOTTIME - MONOTONIC below this is not a suspend. Reading BOOTTIME first
makes a preempted read come out smaller, never larger, than the true difference; a
suspend lasts seconds."""


def clock_offset_ns() -> int:
    """CLOCK_BOOTTIME - CLOCK_MONOTONIC: the time spent suspended since boot (BOOTTIME
    read first: a delay between the two reads only makes it smaller)."""
    boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return boot - time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def read_suspend_successes(path: Path = SUSPEND_STATS) -> int | None:
    """The kernel's count of successful suspends, None when it cannot be read."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class SuspendCounter:
    """Suspends since this counter was made; :meth:`count` is cheap and thread-safe."""

    def __init__(
        self,
        offset: Callable[[], int] = clock_offset_ns,
        successes: Callable[[], int | None] = read_suspend_successes,
    ) -> None:
        self._offset = offset
        self._successes = successes
        self._lock = threading.Lock()
        self._slept = offset()
        self._success = successes()
        self._count = 0

    def count(self) -> int:
        offset = self._offset()
        with self._lock:
            if offset - self._slept < SLEEP_NOISE_NS:
                return self._count
            self._slept = offset
            success = self._successes()
            grew = 0
            if success is not None and self._success is not None:
                grew = success - self._success
            self._success = success
            self._count += max(grew, 1)
            return self._count
