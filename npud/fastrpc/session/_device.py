"""The device: opening its node, and the session's fd on it with its ioctls, errnos
translated."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from typing import Final

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.dma import DeviceFd
from npud.fastrpc.kernel.driver import Driver, IoctlArg
from npud.fastrpc.kernel.errors import DriverCall, RpcError, translate_os_error
from npud.fastrpc.session._life import Life

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


class Device:
    """The session's device fd and the ioctls on it: errnos translated (one place), and
    a restart (EPIPE) told to the session's life. Owns ``rpc_fd`` until :meth:`close`."""

    def __init__(self, driver: Driver, name: str, rpc_fd: DeviceFd, life: Life) -> None:
        self.driver = driver
        self.name = name
        self._rpc_fd = rpc_fd
        self._life = life

    def fileno(self) -> int:
        """The device fd (-1 once closed)."""
        return self._rpc_fd.fileno()

    def ioctl(self, request: int, arg: IoctlArg) -> int:
        """``request`` on the device fd; an errno raises the translated RpcError."""
        try:
            return checked_ioctl(self.driver, self._rpc_fd.fileno(), request, arg, self.name)
        except RpcError as exc:
            if exc.code is ErrorCode.DSP_RESTARTED:
                self._life.mark_dead(str(exc))
            raise

    def raw_ioctl(self, request: int, arg: IoctlArg) -> int:
        """``request`` on the device fd; the errno stays an OSError (for the reverse
        modules, which answer the DSP with an AEE code), EPIPE marks the DSP dead."""
        try:
            return self.driver.ioctl(self._rpc_fd.fileno(), request, arg)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                self._life.mark_dead("the DSP restarted (EPIPE)")
            raise

    def close(self) -> None:
        self._rpc_fd.close()
