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
* ``fail_next_ioctl(request, err, after=False)``: the next ioctl with that
  command word fails with errno ``err``; with ``after`` it first takes effect
  (the DSP did it, the answer was lost: a kernel-internal call that timed out
  with ETIMEDOUT after the DSP acted). Several queue up in order.
* ``interrupt_next_invoke(handle=None)``: the next INVOKE on a remote handle
  (or exactly ``handle``, static ones included) reaches the DSP and runs
  there, but the caller gets EINTR and no outputs: a signal or the suspend
  freezer interrupted the kernel's interruptible wait (ERESTARTSYS).
* ``suspend()``: a system suspend now. The freezer ends the wait of every
  INVOKE waiting for the DSP, on every fd at once (each listener's next2,
  each dspqueue wait_signal, any call in flight), with ERESTARTSYS. As
  mainline does, each interrupted call's context keeps its id
  until its fd is released (255 ids per channel: with none free an INVOKE is
  ENOSPC), every MMAP heap buffer of the fd moves to the channel's list (never
  freed; a restart only unlinks them) and the syscall restarts under a new
  context. The call's DSP answer reaches the restarted call.
* ``suspend_next_invoke(handle=None)``: a system suspend during the next
  INVOKE on a remote handle (or exactly ``handle``), just as the DSP answers:
  the DSP runs the call, the freezer ends the kernel's interruptible wait with
  ERESTARTSYS, the context is kept and the buffers move as for ``suspend()``;
  the syscall then restarts on its own, so the call is sent again and the DSP
  runs it a second time. The caller sees only the second run's answer. Later
  MUNMAPs of the moved buffers are EINVAL.
* ``crash_next_invoke(handle=None)``: the next INVOKE on a remote handle (or
  exactly ``handle``) crashes its DSP process in the middle of the call: with
  process isolation its child dies while the method runs. The call and every
  later invoke of that process answer AEE_EBADSTATE; its listener stops.
  ``EmulatedDriver.crash_process(fd)`` crashes one at once.
* ``fail_next_heap_alloc(err=ENOMEM)``: the next DMA-BUF heap allocation that
  passes the argument checks fails with ``err``. Several queue up in order.
* ``clear()``: forget pending failures, interruptions, crashes, latency and the
  session limit.

A DSP result in -4095..-1 (``fail_next_invoke(0xFFFFFFF2)``) reaches the
caller as an errno, as libc reports it.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import threading
from collections.abc import Callable
from typing import Final

LAST_STATIC_HANDLE: Final = 10
ERRNO_MAX: Final = 4095


@dataclasses.dataclass(frozen=True)
class IoctlFault:
    """An injected ioctl failure: ``err`` raised before (or, with ``after``, after) the call."""

    request: int
    err: int
    after: bool


class FaultInjector:
    def __init__(
        self,
        *,
        restart: Callable[[float | None], None],
        boot: Callable[[], None],
        interrupt_listeners: Callable[[], None],
        sessions: int,
        suspend: Callable[[], None],
    ) -> None:
        self._suspend = suspend
        self._restart = restart
        self._boot = boot
        self._interrupt_listeners = interrupt_listeners
        self._sessions = sessions
        self._lock = threading.Lock()
        self._failures: list[tuple[int, int | None]] = []
        self._ioctl_faults: list[IoctlFault] = []
        self._interrupts: list[int | None] = []
        self._suspends: list[int | None] = []
        self._crashes: list[int | None] = []
        self._heap_failures: list[int] = []
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

    def suspend(self) -> None:
        self._suspend()

    def fail_next_invoke(self, aee: int, handle: int | None = None) -> None:
        if not 1 <= aee <= 0xFFFFFFFF:
            raise ValueError(f"aee={aee:#x}: a failure code is a non-zero u32")
        if handle is not None and not 0 <= handle <= 0xFFFFFFFF:
            raise ValueError(f"handle={handle:#x} is not a u32")
        with self._lock:
            self._failures.append((aee, handle))

    def fail_next_ioctl(self, request: int, err: int, *, after: bool = False) -> None:
        if not 0 <= request <= 0xFFFFFFFF:
            raise ValueError(f"request={request:#x} is not a u32 command word")
        if not 1 <= err <= ERRNO_MAX:
            raise ValueError(f"err={err}: an errno is 1..{ERRNO_MAX}")
        with self._lock:
            self._ioctl_faults.append(IoctlFault(request, err, after))

    def interrupt_next_invoke(self, handle: int | None = None) -> None:
        if handle is not None and not 0 <= handle <= 0xFFFFFFFF:
            raise ValueError(f"handle={handle:#x} is not a u32")
        with self._lock:
            self._interrupts.append(handle)

    def suspend_next_invoke(self, handle: int | None = None) -> None:
        if handle is not None and not 0 <= handle <= 0xFFFFFFFF:
            raise ValueError(f"handle={handle:#x} is not a u32")
        with self._lock:
            self._suspends.append(handle)

    def crash_next_invoke(self, handle: int | None = None) -> None:
        if handle is not None and not 0 <= handle <= 0xFFFFFFFF:
            raise ValueError(f"handle={handle:#x} is not a u32")
        with self._lock:
            self._crashes.append(handle)

    def fail_next_heap_alloc(self, err: int = errno.ENOMEM) -> None:
        if not 1 <= err <= ERRNO_MAX:
            raise ValueError(f"err={err}: an errno is 1..{ERRNO_MAX}")
        with self._lock:
            self._heap_failures.append(err)

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
            self._ioctl_faults.clear()
            self._interrupts.clear()
            self._suspends.clear()
            self._crashes.clear()
            self._heap_failures.clear()
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

    def take_ioctl_fault(self, request: int) -> IoctlFault | None:
        """The injected failure for the next ``request``, consuming it; None if none."""
        if not self._ioctl_faults:
            return None  # the common case, without the lock (a list's truth is atomic)
        with self._lock:
            for index, injected in enumerate(self._ioctl_faults):
                if injected.request == request:
                    del self._ioctl_faults[index]
                    return injected
            return None

    def take_interrupt(self, handle: int) -> bool:
        """True (consuming it) when an interruption waits for an invoke on ``handle``."""
        if not self._interrupts:
            return False
        with self._lock:
            for index, wanted in enumerate(self._interrupts):
                if wanted == handle or (wanted is None and handle > LAST_STATIC_HANDLE):
                    del self._interrupts[index]
                    return True
            return False

    def take_suspend(self, handle: int) -> bool:
        """True (consuming it) when a suspend waits for an invoke on ``handle``."""
        if not self._suspends:
            return False
        with self._lock:
            for index, wanted in enumerate(self._suspends):
                if wanted == handle or (wanted is None and handle > LAST_STATIC_HANDLE):
                    del self._suspends[index]
                    return True
            return False

    def take_crash(self, handle: int) -> bool:
        """True (consuming it) when a crash waits for an invoke on ``handle``."""
        if not self._crashes:
            return False
        with self._lock:
            for index, wanted in enumerate(self._crashes):
                if wanted == handle or (wanted is None and handle > LAST_STATIC_HANDLE):
                    del self._crashes[index]
                    return True
            return False

    def take_heap_failure(self) -> int | None:
        """The errno for the next heap allocation, consuming it; None if none."""
        if not self._heap_failures:
            return None
        with self._lock:
            return self._heap_failures.pop(0) if self._heap_failures else None

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
        """Injected failures not yet consumed: invoke results, ioctl errnos, interruptions,
        suspends, crashes and heap failures."""
        with self._lock:
            return (
                len(self._failures)
                + len(self._ioctl_faults)
                + len(self._interrupts)
                + len(self._suspends)
                + len(self._crashes)
                + len(self._heap_failures)
            )
