"""The argument of an emulated ioctl, as the kernel reads it, and the result it returns.

What :class:`npud.sim.driver.EmulatedDriver` does at both ends of every FastRPC
command: ``copy_from_user`` of the caller's struct (EFAULT when it is not a
buffer or too short) and the DSP result that libc reports as the return value.
"""

from __future__ import annotations

import ctypes
import errno
from typing import Any

from npud.sim.errors import ERRNO_MAX, fault

IoctlBuffer = ctypes.Structure | ctypes.Array[Any] | bytearray | memoryview | None
"""What ``ioctl`` accepts as ``arg``: any writable buffer (or None)."""


def arg_view(arg: IoctlBuffer, size: int, *, writable: bool) -> memoryview:
    """The first ``size`` bytes of the user's struct, as the kernel's copy_from_user sees them."""
    if arg is None:
        raise fault(errno.EFAULT, "NULL ioctl argument")
    try:
        view = memoryview(arg).cast("B")
    except TypeError:
        raise fault(errno.EFAULT, "the ioctl argument is not a buffer") from None
    if view.nbytes < size:
        raise fault(errno.EFAULT, f"the ioctl argument has {view.nbytes} bytes, needs {size}")
    if writable and view.readonly:
        raise fault(errno.EFAULT, "the ioctl argument is read-only")
    return view[:size]


def ioctl_result(result: int) -> int:
    """What ioctl(2) returns for the DSP's ``result`` (as libc would report it)."""
    result &= 0xFFFFFFFF
    signed = result - (1 << 32) if result & 0x8000_0000 else result
    if -ERRNO_MAX <= signed < 0:
        # libc cannot tell such a DSP result from an errno either.
        raise fault(-signed, f"DSP result {result:#x} lies in libc's errno range")
    return result
