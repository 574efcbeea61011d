"""RpcError and the one place where an OSError from the Driver becomes one.

``OSError`` with an errno never leaves ``npud.fastrpc``: every Driver call the
session makes goes through :func:`translate_os_error`, which maps the kernel's
errnos (reference section 3.11) to the stable codes of ``npu_protocol``. The
mapping is keyed on the call itself (an ioctl request number, or
:class:`DriverCall` for the calls that are not ioctls), never on a string.
"""

from __future__ import annotations

import enum
import errno
from typing import Final

from npu_protocol import CodedError, ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import errno_name


class RpcError(CodedError):
    """A failure of the FastRPC session, with a stable code; ``str()`` is its message."""


class ShellVerifyError(RpcError):
    """The DSP shell failed verification; nothing was loaded (fail closed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(ErrorCode.SHELL_VERIFY, reason=reason)
        self.reason = reason


class InterruptedCallError(RpcError):
    """EINTR: a signal (or the suspend freezer) interrupted the kernel's wait for the DSP.

    The message was already sent: the DSP may run the call anyway, so the
    session never repeats a user INVOKE by itself. The listener repeats its
    own calls, which are safe to repeat.
    """


KERNEL_INTERNAL_TIMEOUT_MS: Final = 10_000
"""How long the kernel waits for its own calls to the DSP (INIT_*, MMAP, MEM_MAP, ...)."""

INVOKE_ERRNOS: Final = frozenset(
    {
        errno.EPERM,
        errno.EINTR,
        errno.EBADF,
        errno.ENOMEM,
        errno.EFAULT,
        errno.EINVAL,
        errno.ENOTTY,
        errno.ENOSPC,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.ECONNRESET,  # Android's downstream driver, on a restart
        errno.ECANCELED,  # a cancelled context: the kernel's, never read as a DSP result
    }
)
"""Every errno an INVOKE can fail with in the kernel (reference 3.2, 3.11)."""


def dsp_result_in_errno_range(exc: OSError, call: int | DriverCall) -> int | None:
    """The DSP result an INVOKE's "errno" really is, or None when it is the kernel's.

    The kernel returns the DSP's result as the ioctl's return value, so a
    result in -4095..-1 reaches us as -1 and an errno (libc cannot tell them
    apart). An INVOKE errno the kernel never produces must be such a result;
    one it does produce (EINVAL, EPIPE...) is taken as the kernel's.
    """
    err = exc.errno
    if call != abi.FASTRPC_IOCTL_INVOKE or err is None or err in INVOKE_ERRNOS:
        return None
    if not 0 < err <= 4095:
        return None
    return (-err) & 0xFFFFFFFF


class DriverCall(enum.Enum):
    """Driver calls that are not ioctls."""

    OPEN = "open"
    MMAP = "mmap"


def call_name(call: int | DriverCall) -> str:
    """How a call reads in messages: the ioctl's name (``MEM_MAP``) or ``open``/``mmap``."""
    if isinstance(call, DriverCall):
        return call.value
    try:
        return abi.Ioctl(call).name
    except ValueError:
        return f"ioctl 0x{call:08X}"


def translate_os_error(exc: OSError, call: int | DriverCall, *, device: str = "") -> RpcError:
    """Map the ``OSError`` that Driver call ``call`` raised to an RpcError.

    ``call`` is the ioctl request number, or a :class:`DriverCall`. Errnos with
    a meaning of their own in the FastRPC driver get their own code; the rest
    keep the errno's name in the message.
    """
    err = exc.errno if exc.errno is not None else 0
    if err == errno.EPIPE:
        return RpcError(ErrorCode.DSP_RESTARTED)
    where = f"{call_name(call)} on {device}" if device else call_name(call)
    if err == errno.EINTR:
        return InterruptedCallError(
            ErrorCode.DEVICE_ERROR,
            operation=where,
            reason=f"{errno_name(err)}: a signal or a system suspend interrupted the wait; "
            "the DSP may still run the call, which npud does not repeat",
        )
    if err == errno.ETIMEDOUT:
        # Only the kernel's own calls to the DSP time out (after 10 s): the DSP is stuck.
        return RpcError(ErrorCode.TIMEOUT, operation=where, timeout_ms=KERNEL_INTERNAL_TIMEOUT_MS)
    if call is DriverCall.OPEN:
        if err == errno.EBUSY:
            return RpcError(ErrorCode.NO_FREE_SESSION, device=device)
        if err in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
            return RpcError(ErrorCode.DEVICE_NOT_FOUND, tried=device)
    if err in (errno.ENOTTY, errno.EOPNOTSUPP):
        return RpcError(
            ErrorCode.UNSUPPORTED, what=f"{call_name(call)} is not implemented by this kernel"
        )
    if call == abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF:
        return RpcError(ErrorCode.DMA_BUF_ALLOC, msg=errno_name(err))
    if call is DriverCall.MMAP:
        return RpcError(
            ErrorCode.DMA_BUF_ALLOC, msg=f"mmap of the new DMA-BUF failed: {errno_name(err)}"
        )
    if call in (abi.FASTRPC_IOCTL_MEM_MAP, abi.FASTRPC_IOCTL_MMAP):
        return RpcError(ErrorCode.MMAP_FAILED, code=errno_name(err))
    return RpcError(ErrorCode.DEVICE_ERROR, operation=where, reason=errno_name(err))
