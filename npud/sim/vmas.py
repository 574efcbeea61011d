"""The kernel's view of this process's mappings: which VMA holds an address.

The kernel works out where in a dma-buf a shared-memory argument points with
``find_vma``; the emulator asks the kernel the same question about its own
process. Two ways, both exact at the moment they are asked:

* ``PROCMAP_QUERY`` (Linux 6.11 and later): one ioctl on ``/proc/self/maps``
  answers for one address, a few microseconds;
* reading and parsing ``/proc/self/maps``: hundreds of lines, hundreds of
  microseconds; used where the kernel has no ``PROCMAP_QUERY`` (ENOTTY).

Nothing here is cached: a mapping can change between two calls (Python code
may mmap and munmap freely). :mod:`npud.sim.mappings` keeps the cache, for the
mappings the emulator itself handed out.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from typing import Final, NamedTuple

MAPS_PATH: Final = "/proc/self/maps"

# include/uapi/linux/fs.h: struct procmap_query and _IOWR('f', 17, struct procmap_query).
_PROCMAP_QUERY_STRUCT: Final = struct.Struct("<QQQQQQQQQIIIIQQ")
PROCMAP_QUERY: Final = 0xC0686611
_PROCMAP_VMA_READABLE: Final = 0x1
_PROCMAP_VMA_WRITABLE: Final = 0x2
_PROCMAP_VMA_SHARED: Final = 0x8


class Vma(NamedTuple):
    """One mapping, as a line of ``/proc/self/maps`` shows it."""

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
    with open(MAPS_PATH, "rb") as maps:
        text = maps.read()
    return [_parse_maps_line(line) for line in text.splitlines() if line]


class VmaFinder:
    """Finds the mapping that contains an address, asking the kernel every time.

    ``procmap_query=False`` reads ``/proc/self/maps`` even where the kernel
    answers ``PROCMAP_QUERY`` (tests use it to exercise the older kernels' path).
    The finder holds no fd between calls.
    """

    def __init__(self, *, procmap_query: bool = True) -> None:
        self._procmap_query = procmap_query

    @property
    def uses_procmap_query(self) -> bool:
        """False once the kernel said it has no ``PROCMAP_QUERY`` (or when disabled)."""
        return self._procmap_query

    def find(self, address: int) -> Vma | None:
        """The mapping that contains ``address``, or None."""
        if self._procmap_query:
            try:
                return _query(address)
            except _NoProcmapQueryError:
                self._procmap_query = False  # an older kernel: from now on read the maps
        return _find_in_maps(address)


class _NoProcmapQueryError(Exception):
    """The kernel has no PROCMAP_QUERY ioctl."""


def _query(address: int) -> Vma | None:
    if not 0 <= address < 1 << 64:
        return None
    request = bytearray(_PROCMAP_QUERY_STRUCT.size)
    _PROCMAP_QUERY_STRUCT.pack_into(request, 0, _PROCMAP_QUERY_STRUCT.size, 0, address, *([0] * 12))
    fd = os.open(MAPS_PATH, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, PROCMAP_QUERY, request)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None  # no mapping contains the address
        if exc.errno in (errno.ENOTTY, errno.EPERM):  # no such ioctl, or seccomp forbids it
            raise _NoProcmapQueryError from None
        raise
    finally:
        os.close(fd)
    fields = _PROCMAP_QUERY_STRUCT.unpack(request)
    flags = fields[5]
    return Vma(
        start=fields[3],
        end=fields[4],
        readable=bool(flags & _PROCMAP_VMA_READABLE),
        writable=bool(flags & _PROCMAP_VMA_WRITABLE),
        shared=bool(flags & _PROCMAP_VMA_SHARED),
        offset=fields[7],
        device=(fields[9], fields[10]),
        inode=fields[8],
    )


def _find_in_maps(address: int) -> Vma | None:
    with open(MAPS_PATH, "rb") as maps:
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


def range_is_mapped(ptr: int, length: int, *, write: bool) -> bool:
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
