"""The watchdog of the data path: DSP calls that never return.

One timer watches every call on the DSP: it is set for the oldest one only, so a
stream of calls costs no timer each. A call on the DSP for longer than the
watchdog's seconds is reported once (the data path ends its domain's DSP process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from npud.runtime.timers import Timer, Timers

CallT = TypeVar("CallT", bound=Hashable)


class CallWatchdog(Generic[CallT]):
    """Watches calls from :meth:`watch` to :meth:`unwatch`; ``report`` gets each one
    found on the DSP for ``seconds`` or more (on the timer thread). Zero seconds: off."""

    def __init__(self, timers: Timers, seconds: float, report: Callable[[CallT], None]) -> None:
        self.timers = timers
        self.seconds = seconds
        self._report = report
        self._running: dict[CallT, float] = {}
        """Calls on the DSP now, and since when."""
        self._reported: set[CallT] = set()
        self._lock = threading.Lock()
        self._timer: Timer | None = None

    def watch(self, call: CallT) -> None:
        """``call`` goes on the DSP now."""
        if not self.seconds:
            return
        now = time.monotonic()
        with self._lock:
            self._running[call] = now
            if self._timer is None:
                self._timer = self.timers.call_at(now + self.seconds, self._inspect)

    def unwatch(self, call: CallT) -> None:
        if self.seconds:
            with self._lock:
                self._running.pop(call, None)

    def _inspect(self) -> None:
        """The watchdog's round (timer thread): report the calls on the DSP for longer
        than ``seconds``, then set the timer for the oldest of the others."""
        now = time.monotonic()
        with self._lock:
            hung = [
                call
                for call, since in self._running.items()
                if now - since >= self.seconds and call not in self._reported
            ]
            self._reported.update(hung)
            self._reported.intersection_update(self._running)
            waiting = [since for call, since in self._running.items() if call not in self._reported]
            self._timer = (
                self.timers.call_at(min(waiting) + self.seconds, self._inspect) if waiting else None
            )
        for call in hung:
            self._report(call)
