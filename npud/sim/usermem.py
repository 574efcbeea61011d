"""Reading and writing "user memory": addresses inside this very process.

The kernel reads invoke arguments, buffers and the shell image with
``copy_from_user`` and writes results with ``copy_to_user``; a bad pointer is
EFAULT, never a crash. The emulator gets the same guarantee from
``process_vm_readv``/``process_vm_writev`` aimed at its own pid: the kernel
walks the page tables and answers EFAULT for unmapped (or, when writing,
read-only) pages. Several ranges go in one call (one iovec each), so an
invoke's plain inputs cost one system call, not one per argument. Where a
seccomp profile forbids those calls, it falls back to checking each range
against ``/proc/self/maps`` before copying with ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from npud.sim.errors import fault
from npud.sim.vmas import range_is_mapped

_ADDRESS_LIMIT: Final = 1 << 64
IOV_MAX: Final = 1024


class Copy(NamedTuple):
    """One range to copy: ``length`` bytes between user address ``user`` and ``local``.

    ``local`` is the address of memory the caller owns and keeps alive for the call.
    """

    user: int
    local: int
    length: int


class UserMemory:
    """Copies between "user" addresses and local memory; EFAULT on bad pointers."""

    def __init__(self, *, use_process_vm: bool = True) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._readv = libc.process_vm_readv
        self._writev = libc.process_vm_writev
        for function in (self._readv, self._writev):
            function.restype = ctypes.c_ssize_t
            function.argtypes = (
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_ulong,
                ctypes.c_void_p,
                ctypes.c_ulong,
                ctypes.c_ulong,
            )
        self._use_process_vm = use_process_vm

    def read(self, ptr: int, length: int) -> bytearray:
        """``length`` bytes from address ``ptr`` (EFAULT when not all readable)."""
        data = bytearray(length)
        if length:
            anchor = ctypes.c_char.from_buffer(data)
            local = ctypes.addressof(anchor)
            del anchor  # no export may outlive the call; the bytearray is never resized
            self._copy((Copy(ptr, local, length),), write=False)
        return data

    def write(self, ptr: int, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` at address ``ptr`` (EFAULT when not all writable)."""
        length = len(data)
        if length:
            local = ctypes.create_string_buffer(bytes(data), length)
            self._copy((Copy(ptr, ctypes.addressof(local), length),), write=True)

    def read_many(self, copies: Sequence[Copy]) -> None:
        """Copy each user range to its local memory, in order; EFAULT at the first bad one."""
        self._copy(copies, write=False)

    def write_many(self, copies: Sequence[Copy]) -> None:
        """Copy each local range to its user address, in order; EFAULT at the first bad one."""
        self._copy(copies, write=True)

    def _copy(self, copies: Sequence[Copy], *, write: bool) -> None:
        local: list[int] = []
        remote: list[int] = []
        total = 0
        for user, address, length in copies:
            if not length:
                continue
            if user == 0 or user + length > _ADDRESS_LIMIT:
                raise fault(errno.EFAULT, f"bad user pointer {user:#x}+{length}")
            local += (address, length)
            remote += (user, length)
            total += length
        count = len(local) // 2
        if not count:
            return
        if count > IOV_MAX:  # more than one call may take
            live = [copy for copy in copies if copy.length]
            for start in range(0, count, IOV_MAX):
                self._copy(live[start : start + IOV_MAX], write=write)
            return
        if self._use_process_vm:
            layout = _iovecs(count)
            # The kernel only reads the iovec arrays: immutable bytes will do.
            function = self._writev if write else self._readv
            done = function(_own_pid(), layout.pack(*local), count, layout.pack(*remote), count, 0)
            if done == total:
                return
            err = ctypes.get_errno() if done < 0 else errno.EFAULT
            if not (done < 0 and err in (errno.ENOSYS, errno.EPERM)):
                raise fault(
                    errno.EFAULT, f"user range {_first_short(copies, done)} is not accessible"
                )
            # Forbidden by a seccomp profile: from now on check /proc/self/maps.
            self._use_process_vm = False
        self._copy_checked([copy for copy in copies if copy.length], write=write)

    @staticmethod
    def _copy_checked(copies: Sequence[Copy], *, write: bool) -> None:
        for copy in copies:
            if not range_is_mapped(copy.user, copy.length, write=write):
                raise fault(errno.EFAULT, f"user range {copy.user:#x}+{copy.length} is not mapped")
            if write:
                ctypes.memmove(copy.user, copy.local, copy.length)
            else:
                ctypes.memmove(copy.local, copy.user, copy.length)


@functools.cache
def _iovecs(count: int) -> struct.Struct:
    """``count`` struct iovec {void *iov_base; size_t iov_len;} in a row."""
    return struct.Struct("<" + "QQ" * count)


_pid = os.getpid()


def _own_pid() -> int:
    return _pid


def _forked() -> None:
    global _pid  # noqa: PLW0603  (the one process-wide fact this module caches)
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def _first_short(copies: Sequence[Copy], done: int) -> str:
    """The range a partial transfer stopped in (the calls never split an iovec)."""
    copies = [copy for copy in copies if copy.length]
    for copy in copies:
        if done < copy.length:
            return f"{copy.user:#x}+{copy.length}"
        done -= copy.length
    return f"{copies[-1].user:#x}+{copies[-1].length}"  # pragma: no cover - done == total
