"""The DSP's compute, shared: calls that run at once slow each other down.

A real NPU does not get faster with more calls in flight: the calls share its
vector and tensor units. Without a model of that, an emulated ``busy(20 ms)``
takes 20 ms however many run beside it, and no scheduler can be measured
against the emulator (more slots would simply mean more throughput).

:class:`SharedCompute` is processor sharing over ``units`` execution units:
with ``n`` calls working, each progresses at ``min(1, units / n)`` of full
speed, so the total work done per second never exceeds ``units``. A call asks
for ``seconds`` of work and returns when that much is done. ``units = 0``
turns the model off (every call runs as if alone, the emulator's behaviour
before the model). A subsystem restart interrupts every wait, and the end of
the calling process interrupts its own (as ending a hung DSP process does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from npud.sim.errors import ProcessExitedError, SubsystemDownError


class Cancellation(Protocol):
    """What ends a call's work early: the process's end (a ``threading.Event``, or
    anything that answers ``is_set``; it is asked at least every 50 ms)."""

    def is_set(self) -> bool: ...


class _Work:
    __slots__ = ("remaining",)

    def __init__(self, seconds: float) -> None:
        self.remaining = seconds


class SharedCompute:
    """Processor sharing over ``units`` units; ``units = 0``: unlimited."""

    def __init__(
        self, units: int, down: threading.Event, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if units < 0:
            raise ValueError("units must be 0 (unlimited) or more")
        self.units = units
        self._down = down
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._active: list[_Work] = []
        self._since = clock()

    def work(self, seconds: float, cancelled: Cancellation | None = None) -> None:
        """Do ``seconds`` of work, sharing the units; SubsystemDownError on a restart,
        ProcessExitedError when ``cancelled`` is set (the calling process ended)."""
        if seconds <= 0:
            return
        if self.units == 0:
            deadline = self._clock() + seconds
            while (left := deadline - self._clock()) > 0:
                if self._down.wait(min(left, 0.05)):
                    raise SubsystemDownError
                if cancelled is not None and cancelled.is_set():
                    raise ProcessExitedError
            return
        job = _Work(seconds)
        with self._cond:
            self._advance()
            self._active.append(job)
            self._cond.notify_all()  # everyone's share just shrank
            try:
                while job.remaining > 1e-9:
                    if self._down.is_set():
                        raise SubsystemDownError
                    if cancelled is not None and cancelled.is_set():
                        raise ProcessExitedError
                    rate = min(1.0, self.units / len(self._active))
                    # Wake at the finish, or when the set changes (notify), and at
                    # most every 50 ms to notice a restart.
                    self._cond.wait(min(job.remaining / rate, 0.05))
                    self._advance()
            finally:
                self._advance()
                self._active.remove(job)
                self._cond.notify_all()  # everyone's share just grew

    @property
    def active(self) -> int:
        with self._cond:
            return len(self._active)

    def _advance(self) -> None:
        """Credit every active call with the work done since the last change."""
        now = self._clock()
        elapsed, self._since = now - self._since, now
        if not self._active or elapsed <= 0:
            return
        done = elapsed * min(1.0, self.units / len(self._active))
        for job in self._active:
            job.remaining -= done
