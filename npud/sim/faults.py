"""Fault injection for the emulated driver, reachable as ``EmulatedDriver.faults``.

* ``subsystem_restart(down_for=None)``: the DSP crashes (SSR). Every in-flight
  call on every fd fails with EPIPE, later calls on those fds with EPIPE, and
  both device nodes vanish (open -> ENOENT) until ``boot()`` or until
  ``down_for`` seconds have passed (checked lazily by ``open``; no timer thread).
* ``boot()``: the DSP comes back on a fresh channel (no-op when it is up).
* ``fail_next_invoke(aee, handle=None)``: the next INVOKE on a remote handle
  (a handle from remotectl open; or exactly ``handle``, static ones included)
  returns ``aee`` without running the skel. Several queue up in order.
* ``set_latency(seconds)``: added to every INVOKE on a remote handle; a
  subsystem restart cuts it short (EPIPE).
* ``limit_sessions(n)``: at most ``n`` device fds may be open on the channel
  (``None`` restores the configured count); sessions already open stay.
* ``interrupt_listeners()``: listeners blocked in next2 return
  AEE_EINTERRUPTED (46) and must retry with ctx 0; requests they were serving
  are re-sent under new ctx ids.
* ``clear()``: forget pending invoke failures, latency and the session limit.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Final

LAST_STATIC_HANDLE: Final = 10


class FaultInjector:
    def __init__(
        self,
        *,
        restart: Callable[[float | None], None],
        boot: Callable[[], None],
        interrupt_listeners: Callable[[], None],
        sessions: int,
    ) -> None:
        self._restart = restart
        self._boot = boot
        self._interrupt_listeners = interrupt_listeners
        self._sessions = sessions
        self._lock = threading.Lock()
        self._failures: list[tuple[int, int | None]] = []
        self._latency = 0.0
        self._session_limit = sessions

    def subsystem_restart(self, down_for: float | None = None) -> None:
        if down_for is not None and not (math.isfinite(down_for) and down_for >= 0):
            raise ValueError(f"down_for={down_for} must be a finite number of seconds >= 0")
        self._restart(down_for)

    def boot(self) -> None:
        self._boot()

    def interrupt_listeners(self) -> None:
        self._interrupt_listeners()

    def fail_next_invoke(self, aee: int, handle: int | None = None) -> None:
        if not 1 <= aee <= 0xFFFFFFFF:
            raise ValueError(f"aee={aee:#x}: a failure code is a non-zero u32")
        if handle is not None and not 0 <= handle <= 0xFFFFFFFF:
            raise ValueError(f"handle={handle:#x} is not a u32")
        with self._lock:
            self._failures.append((aee, handle))

    def set_latency(self, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"latency {seconds} must be a finite number of seconds >= 0")
        with self._lock:
            self._latency = seconds

    def limit_sessions(self, n: int | None) -> None:
        if n is not None and not 0 <= n <= self._sessions:
            raise ValueError(f"session limit {n} is outside 0..{self._sessions}")
        with self._lock:
            self._session_limit = self._sessions if n is None else n

    def clear(self) -> None:
        with self._lock:
            self._failures.clear()
            self._latency = 0.0
            self._session_limit = self._sessions

    # -- what the driver consults ----------------------------------------------

    def take_invoke_failure(self, handle: int) -> int | None:
        """The injected result for an invoke on ``handle``, consuming it; None if none matches."""
        with self._lock:
            for index, (aee, wanted) in enumerate(self._failures):
                if wanted == handle or (wanted is None and handle > LAST_STATIC_HANDLE):
                    del self._failures[index]
                    return aee
            return None

    @property
    def latency(self) -> float:
        with self._lock:
            return self._latency

    @property
    def session_limit(self) -> int:
        with self._lock:
            return self._session_limit

    @property
    def pending_failures(self) -> int:
        with self._lock:
            return len(self._failures)
