"""The Driver seam: the syscall level, the only place the project issues ioctls.

Everything above this interface (FastRpcSession, the shell load, remotectl,
the reverse-RPC listener, marshalling) is one code path for the device and for
the emulator. ``KernelDriver`` talks to the real kernel through libc;
``npud.sim.EmulatedDriver`` receives the very same request numbers and struct
bytes.

Contract shared by every Driver:

* ``open`` returns a new fd that the caller owns and must give back to
  ``close`` exactly once.
* ``ioctl(fd, request, arg)``: ``arg`` is a writable buffer (a ctypes
  structure) whose bytes are read and written in place, as the kernel does
  with a user pointer; ``None`` for argument-less requests. A failing call
  raises ``OSError`` with the errno. Any other return value, a DSP result code
  included, is returned as is (as an unsigned 32-bit value when negative).
* ``mmap(fd, length, offset)`` returns a shared read-write mapping; the caller
  owns it and closes it before closing the fd.
* ``dsp_report()`` after an INVOKE, on the same thread: the DSP time the DSP
  reported with its answer, or None (always, on the kernel's driver).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
from typing import Protocol

from npud.fastrpc.kernel.suspends import SuspendCounter

IoctlArg = ctypes.Structure | ctypes.Array[ctypes.c_char] | None


class FaultControl(Protocol):
    """The DSP's failures, on demand: what ``debug`` injects on a driver that can fake
    them (the emulator's). The kernel's driver has none: a real DSP fails on its own."""

    def subsystem_restart(self, down_for: float | None = None) -> None:
        """The whole DSP restarts (SSR); it is away for ``down_for`` seconds."""
        ...

    def set_latency(self, seconds: float) -> None:
        """Every later invoke takes ``seconds`` longer."""
        ...

    def fail_next_invoke(self, aee: int, handle: int | None = None) -> None:
        """The next invoke (of ``handle``, or any) answers ``aee``."""
        ...

    def clear(self) -> None:
        """No latency and no pending failure."""
        ...

    def crash_process(self, fd: int) -> bool:
        """The DSP process bound to device ``fd`` crashes now; False when there is none."""
        ...


class Driver(Protocol):
    """What FastRpcSession needs from the operating system."""

    def open(self, path: str, flags: int) -> int: ...

    def close(self, fd: int) -> None: ...

    def ioctl(self, fd: int, request: int, arg: IoctlArg) -> int: ...

    def mmap(self, fd: int, length: int, offset: int = 0) -> mmap.mmap: ...

    def shutdown(self) -> None:
        """The owner is done with the driver: let go of what it holds besides the fds it
        gave out (their owners close those). The emulator ends its DSP processes and
        their child processes; the kernel's driver holds nothing."""
        ...

    def suspends(self) -> int:
        """System suspends since the driver was made (only its growth matters). Each
        interrupted every INVOKE then waiting for the DSP, and mainline keeps such a
        call's context until its fd closes (:mod:`npud.fastrpc.kernel.suspends`)."""
        ...

    def fault_control(self) -> FaultControl | None:
        """The DSP's failures on demand, where the driver can fake them; None on the
        kernel's driver."""
        ...

    def dsp_report(self) -> float | None:
        """The DSP time the DSP reported with the calling thread's last INVOKE, in
        seconds, or None when it reported none. The emulator's DSP reports, with each
        dspqueue ``wait_signal`` answer, the time of the work its process did for the
        answered packets (docs/emulator.md); the kernel's driver has no such report
        (mainline's INVOKE returns a result code only), so on a device it is None and
        npud estimates (docs/scheduling.md, "The LLM's batches")."""
        ...


def _load_libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c") or "libc.so.6"
    return ctypes.CDLL(name, use_errno=True)


class KernelDriver:
    """The real kernel: libc ``open``/``ioctl`` through ctypes.

    Not ``fcntl.ioctl``: FastRPC returns the DSP's result code as the ioctl's
    return value, which ``fcntl.ioctl`` turns into an OSError with a stale
    errno, and recent CPython re-issues an ioctl interrupted by a signal, which
    for INVOKE would send the remote call twice. Here EINTR surfaces as an
    OSError and the caller decides.
    """

    def __init__(self) -> None:
        self._suspends = SuspendCounter()
        libc = _load_libc()
        self._ioctl = libc.ioctl
        self._ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
        self._ioctl.restype = ctypes.c_int

    def open(self, path: str, flags: int) -> int:
        return os.open(path, flags | os.O_CLOEXEC)

    def close(self, fd: int) -> None:
        os.close(fd)

    def ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:
        pointer = None if arg is None else ctypes.addressof(arg)
        ret: int = self._ioctl(fd, request, pointer)
        if ret == -1:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        # A DSP AEE code (0x80000400 + n) arrives as a negative int.
        return ret & 0xFFFFFFFF

    def mmap(self, fd: int, length: int, offset: int = 0) -> mmap.mmap:
        return mmap.mmap(
            fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset
        )

    def shutdown(self) -> None:
        """Nothing to let go of: the kernel's state hangs on the fds."""

    def suspends(self) -> int:
        """Counted from the clocks and ``/sys/power/suspend_stats``."""
        return self._suspends.count()

    def fault_control(self) -> FaultControl | None:
        """None: a real DSP's failures are its own."""
        return None

    def dsp_report(self) -> float | None:
        """None: mainline's INVOKE carries no DSP time."""
        return None


def errno_name(err: int) -> str:
    """``EINVAL (Invalid argument)`` for logs and messages."""
    return f"{errno.errorcode.get(err, f'errno {err}')} ({os.strerror(err)})"
