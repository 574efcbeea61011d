"""Opening the device node and calling its ioctls, errnos translated (the open job's helpers)."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from typing import Final

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.driver import Driver, IoctlArg
from npud.fastrpc.kernel.errors import DriverCall, RpcError, translate_os_error

OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK


def as_ioctl_arg(value: ctypes.c_uint32) -> IoctlArg:
    return (ctypes.c_char * ctypes.sizeof(value)).from_buffer(value)


def checked_ioctl(driver: Driver, fd: int, request: int, arg: IoctlArg, device: str) -> int:
    try:
        return driver.ioctl(fd, request, arg)
    except OSError as exc:
        raise translate_os_error(exc, request, device=device) from None


def open_first(driver: Driver, nodes: Sequence[str]) -> tuple[str, int]:
    """The first node that opens; ENOENT/EACCES/ENODEV try the next one."""
    if not nodes:
        raise RpcError(ErrorCode.DEVICE_NOT_FOUND, tried="(no device nodes configured)")
    failures: list[str] = []
    for path in nodes:
        try:
            return path, driver.open(path, OPEN_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENODEV, errno.ENXIO):
                failures.append(f"{path} ({errno.errorcode.get(exc.errno or 0, '?')})")
                continue
            raise translate_os_error(exc, DriverCall.OPEN, device=path) from None
    raise RpcError(ErrorCode.DEVICE_NOT_FOUND, tried=", ".join(failures))
