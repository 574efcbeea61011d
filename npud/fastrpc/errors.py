"""FastRpcError and the one place where an OSError from the Driver becomes one.

``OSError`` with an errno never leaves ``npud.fastrpc``: every Driver call the
session makes goes through :func:`translate_os_error`, which maps the kernel's
errnos (reference section 3.11) to the stable codes of ``npu_protocol``.
"""

from __future__ import annotations

import errno
from typing import Any

from npu_protocol import ErrorCode, format_message
from npud.fastrpc.driver import errno_name


class FastRpcError(Exception):
    """A failure with a stable code; ``str()`` is the stable message."""

    def __init__(self, error: ErrorCode, /, **fields: Any) -> None:
        self.code = error
        self.fields = fields
        super().__init__(format_message(error, **fields))


class ShellVerifyError(FastRpcError):
    """The DSP shell failed verification; nothing was loaded (fail closed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(ErrorCode.SHELL_VERIFY, reason=reason)
        self.reason = reason


def translate_os_error(exc: OSError, operation: str, *, device: str = "") -> FastRpcError:
    """Map a Driver ``OSError`` raised during ``operation`` to a FastRpcError.

    ``operation`` names the call in the message (``"open"``, ``"INVOKE"``,
    ``"MEM_MAP"``...). Errnos with a meaning of their own in the FastRPC driver
    get their own code; the rest keep the errno's name in the message.
    """
    err = exc.errno if exc.errno is not None else 0
    if err == errno.EPIPE:
        return FastRpcError(ErrorCode.DSP_RESTARTED)
    if operation == "open":
        if err == errno.EBUSY:
            return FastRpcError(ErrorCode.NO_FREE_SESSION, device=device)
        if err in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
            return FastRpcError(ErrorCode.DEVICE_NOT_FOUND, tried=device)
    if err in (errno.ENOTTY, errno.EOPNOTSUPP):
        return FastRpcError(
            ErrorCode.UNSUPPORTED, what=f"{operation} is not implemented by this kernel"
        )
    if operation == "ALLOC_DMA_BUFF":
        return FastRpcError(ErrorCode.DMA_BUF_ALLOC, msg=errno_name(err))
    if operation in ("MEM_MAP", "MMAP"):
        return FastRpcError(ErrorCode.MMAP_FAILED, code=errno_name(err))
    where = f"{operation} on {device}" if device else operation
    return FastRpcError(ErrorCode.DEVICE_ERROR, operation=where, reason=errno_name(err))
