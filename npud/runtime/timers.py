"""One thread for every timed event of the data path: call timeouts, deadlines of
queued calls, replies a client does not read, frames a client leaves half sent.

Timers are cheap to set and cheap to forget: :meth:`Timers.call_at` pushes onto
a heap and wakes the thread only when the new timer is due before the thread
planned to wake; a timer whose work became moot (the call ended first) is
cancelled by a flag, lets go of its callback at once, and is dropped when it
surfaces or when cancelled timers fill half the heap. So a stream of calls
that all end in time costs no wake-up of this thread per call, and no memory
that lasts.

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

    __slots__ = ("_owner", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object], owner: Timers) -> None:
        self.when = when
        self.callback: Callable[[], object] | None = callback
        self.cancelled = False
        self._owner = owner

    def cancel(self) -> None:
        """Forget the timer; what its callback refers to is let go at once."""
        if not self.cancelled:
            self.cancelled = True
            self.callback = None
            self._owner._note_cancelled()


class Timers:
    """A heap of timers and the thread that fires them."""

    def __init__(self, name: str = "timers", clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._planned = float("inf")  # when the thread will wake next
        self._cancelled = 0  # cancelled timers still in the heap
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
        timer = Timer(when, callback, self)
        with self._cond:
            if self._cancelled > len(self._heap) // 2 + COMPACT_SLACK:
                self._compact()
            heapq.heappush(self._heap, (when, next(self._seq), timer))
            if when < self._planned:
                self._cond.notify()
        return timer

    def _note_cancelled(self) -> None:
        with self._cond:
            self._cancelled += 1

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
                callback = timer.callback
                if callback is None:  # cancelled after it was taken off the heap
                    continue
                try:
                    callback()
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
                    if timer.cancelled:
                        self._cancelled -= 1
                    else:
                        due.append(timer)
                if due:
                    self._planned = now
                    return due
                self._planned = self._heap[0][0] if self._heap else float("inf")
                timeout = None if not self._heap else max(0.0, self._planned - now)
                self._cond.wait(timeout)
            return None

    def _drop_cancelled(self) -> None:
        """Pop cancelled timers off the top of the heap."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
            self._cancelled -= 1

    def _compact(self) -> None:
        """Rebuild the heap without its cancelled timers (they are more than half of it)."""
        self._heap = [entry for entry in self._heap if not entry[2].cancelled]
        heapq.heapify(self._heap)
        self._cancelled = 0
