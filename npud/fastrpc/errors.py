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

from npu_protocol import CodedError, ErrorCode
from npud.fastrpc import abi
from npud.fastrpc.driver import errno_name


class RpcError(CodedError):
    """A failure of the FastRPC session, with a stable code; ``str()`` is its message."""


class ShellVerifyError(RpcError):
    """The DSP shell failed verification; nothing was loaded (fail closed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(ErrorCode.SHELL_VERIFY, reason=reason)
        self.reason = reason


class DriverCall(enum.Enum):
    """Driver calls that are not ioctls."""

    OPEN = "open"
    MMAP = "mmap"


def call_name(call: int | DriverCall) -> str:
    """How a call reads in messages: the ioctl's name (``MEM_MAP``) or ``open``/``mmap``."""
    if isinstance(call, DriverCall):
        return call.value
    return abi.IOCTL_NAMES.get(call, f"ioctl 0x{call:08X}")


def translate_os_error(exc: OSError, call: int | DriverCall, *, device: str = "") -> RpcError:
    """Map the ``OSError`` that Driver call ``call`` raised to an RpcError.

    ``call`` is the ioctl request number, or a :class:`DriverCall`. Errnos with
    a meaning of their own in the FastRPC driver get their own code; the rest
    keep the errno's name in the message.
    """
    err = exc.errno if exc.errno is not None else 0
    if err == errno.EPIPE:
        return RpcError(ErrorCode.DSP_RESTARTED)
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
    where = f"{call_name(call)} on {device}" if device else call_name(call)
    return RpcError(ErrorCode.DEVICE_ERROR, operation=where, reason=errno_name(err))
