"""One thread for every timed event of the data path: call timeouts, deadlines of
queued calls, replies a client does not read, frames a client leaves half sent.

Timers are cheap to set and cheap to forget: :meth:`Timers.call_at` pushes onto
a heap and wakes the thread only when the new timer is due before the thread
planned to wake; a timer whose work became moot (the call ended first) is
cancelled by a flag and dropped when it surfaces. So a stream of calls that
all end in time costs no wake-up of this thread per call.

Callbacks run on the timer thread and must not block (sends on the data path
never do).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

COMPACT_SLACK: Final = 256
"""Cancelled timers tolerated in the heap beyond twice the live ones."""


class Timer:
    """A handle to cancel one timer."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """A heap of timers and the thread that fires them."""

    def __init__(self, name: str = "timers", clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._planned = float("inf")  # when the thread will wake next
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` on the timer thread at ``when`` (this clock), unless cancelled."""
        timer = Timer(when, callback)
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), timer))
            if when < self._planned:
                self._cond.notify()
        return timer

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return self.call_at(self._clock() + delay, callback)

    def pending(self) -> int:
        """Timers not yet fired and not cancelled."""
        with self._cond:
            return sum(not entry[2].cancelled for entry in self._heap)

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            due = self._next_due()
            if due is None:
                return
            for timer in due:
                try:
                    timer.callback()
                except Exception:  # one bad timer must not end the others
                    log.exception("timer callback failed")

    def _next_due(self) -> list[Timer] | None:
        """Wait until timers are due and return them; None once stopped."""
        with self._cond:
            while not self._stopping:
                self._drop_cancelled()
                now = self._clock()
                due: list[Timer] = []
                while self._heap and self._heap[0][0] <= now:
                    timer = heapq.heappop(self._heap)[2]
                    if not timer.cancelled:
                        due.append(timer)
                if due:
                    self._planned = now
                    return due
                self._planned = self._heap[0][0] if self._heap else float("inf")
                timeout = None if not self._heap else max(0.0, self._planned - now)
                self._cond.wait(timeout)
            return None

    def _drop_cancelled(self) -> None:
        """Pop cancelled timers off the top; rebuild the heap when too many hide inside."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        live = sum(not entry[2].cancelled for entry in heap) if len(heap) > COMPACT_SLACK else 0
        if len(heap) > 2 * live + COMPACT_SLACK:
            self._heap = [entry for entry in heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
