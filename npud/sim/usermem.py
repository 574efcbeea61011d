"""Reading and writing "user memory": addresses inside this very process.

The kernel reads invoke arguments, buffers and the shell image with
``copy_from_user`` and writes results with ``copy_to_user``; a bad pointer is
EFAULT, never a crash. The emulator gets the same guarantee from
``process_vm_readv``/``process_vm_writev`` aimed at its own pid: the kernel
walks the page tables and answers EFAULT for unmapped (or, when writing,
read-only) pages. Where a seccomp profile forbids those calls, it falls back to
checking the range against ``/proc/self/maps`` before copying with ctypes.

The module also finds the VMA that contains an address, which is how the
kernel works out where in a dma-buf a shared-memory argument points.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from typing import NamedTuple

from npud.sim.errors import fault


class _IoVec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


class Vma(NamedTuple):
    """One line of ``/proc/self/maps``."""

    start: int
    end: int
    readable: bool
    writable: bool
    shared: bool
    offset: int
    device: tuple[int, int]  # (major, minor)
    inode: int


def read_maps() -> list[Vma]:
    """Every mapping of this process, in address order."""
    with open("/proc/self/maps", "rb") as maps:
        text = maps.read()
    return [_parse_maps_line(line) for line in text.splitlines() if line]


def find_vma(address: int) -> Vma | None:
    """The mapping that contains ``address``, or None."""
    with open("/proc/self/maps", "rb") as maps:
        text = maps.read()
    for line in text.splitlines():
        dash = line.index(b"-")
        space = line.index(b" ", dash)
        start = int(line[:dash], 16)
        if start > address:
            return None  # lines are sorted by address
        if address < int(line[dash + 1 : space], 16):
            return _parse_maps_line(line)
    return None


def _parse_maps_line(line: bytes) -> Vma:
    fields = line.split(maxsplit=5)
    start, end = (int(part, 16) for part in fields[0].split(b"-"))
    perms = fields[1]
    major, minor = (int(part, 16) for part in fields[3].split(b":"))
    return Vma(
        start=start,
        end=end,
        readable=perms[0:1] == b"r",
        writable=perms[1:2] == b"w",
        shared=perms[3:4] == b"s",
        offset=int(fields[2], 16),
        device=(major, minor),
        inode=int(fields[4]),
    )


def _range_is_mapped(ptr: int, length: int, *, write: bool) -> bool:
    """True when [ptr, ptr+length) lies in mappings with the needed permission."""
    cursor, end = ptr, ptr + length
    for vma in read_maps():
        if vma.end <= cursor:
            continue
        if vma.start > cursor:
            return False
        if not (vma.writable if write else vma.readable):
            return False
        cursor = vma.end
        if cursor >= end:
            return True
    return False


class UserMemory:
    """Copies between "user" addresses and Python buffers; EFAULT on bad pointers."""

    def __init__(self, *, use_process_vm: bool = True) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._readv = libc.process_vm_readv
        self._writev = libc.process_vm_writev
        for function in (self._readv, self._writev):
            function.restype = ctypes.c_ssize_t
            function.argtypes = (
                ctypes.c_int,
                ctypes.POINTER(_IoVec),
                ctypes.c_ulong,
                ctypes.POINTER(_IoVec),
                ctypes.c_ulong,
                ctypes.c_ulong,
            )
        self._use_process_vm = use_process_vm

    def read(self, ptr: int, length: int) -> bytearray:
        """``length`` bytes from address ``ptr`` (EFAULT when not all readable)."""
        data = bytearray(length)
        if length:
            self._copy(ptr, data, write=False)
        return data

    def write(self, ptr: int, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` at address ``ptr`` (EFAULT when not all writable)."""
        if len(data):
            self._copy(ptr, bytearray(data), write=True)

    def _copy(self, ptr: int, local: bytearray, *, write: bool) -> None:
        length = len(local)
        if ptr == 0 or ptr + length > 1 << 64:
            raise fault(errno.EFAULT, f"bad user pointer {ptr:#x}+{length}")
        if self._use_process_vm:
            done = self._copy_process_vm(ptr, local, write=write)
            if done:
                return
        if not _range_is_mapped(ptr, length, write=write):
            raise fault(errno.EFAULT, f"user range {ptr:#x}+{length} is not mapped")
        buffer = (ctypes.c_char * length).from_buffer(local)
        if write:
            ctypes.memmove(ptr, buffer, length)
        else:
            ctypes.memmove(buffer, ptr, length)

    def _copy_process_vm(self, ptr: int, local: bytearray, *, write: bool) -> bool:
        """Copy with the kernel's own fault handling; False when the syscall is unavailable."""
        length = len(local)
        buffer = (ctypes.c_char * length).from_buffer(local)
        local_iov = _IoVec(ctypes.addressof(buffer), length)
        remote_iov = _IoVec(ptr, length)
        function = self._writev if write else self._readv
        done = function(os.getpid(), ctypes.byref(local_iov), 1, ctypes.byref(remote_iov), 1, 0)
        if done == length:
            return True
        err = ctypes.get_errno() if done < 0 else errno.EFAULT
        if done < 0 and err in (errno.ENOSYS, errno.EPERM):
            # Forbidden by a seccomp profile: from now on check /proc/self/maps.
            self._use_process_vm = False
            return False
        raise fault(errno.EFAULT, f"user range {ptr:#x}+{length} is not accessible")
