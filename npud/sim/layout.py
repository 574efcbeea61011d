"""The emulator's own description of the FastRPC ioctl ABI.

Deliberately independent of ``npud.fastrpc.kernel.abi``: command words are literal
hex copied from the reference (shared/reference/fastrpc-abi.md, section 1),
structures are ``struct`` formats written from its section 2. Tests drive the
emulator with the ctypes classes of ``npud.fastrpc.kernel.abi``, so a drift in either
description shows up as a failing test instead of two wrongs agreeing.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from npud import idl  # --------------------------------------------------------------------------

# Command words. The kernel switches on the full 32-bit value: the right nr
# with another direction or size is ENOTTY like any unknown word.

ALLOC_DMA_BUFF: Final = 0xC0105201
FREE_DMA_BUFF: Final = 0xC0045202  # defined by the uapi header, never handled: ENOTTY
INVOKE: Final = 0xC0105203
INIT_ATTACH: Final = 0x00005204
INIT_CREATE: Final = 0xC0185205
MMAP: Final = 0xC0205206
MUNMAP: Final = 0xC0105207
INIT_ATTACH_SNS: Final = 0x00005208
INIT_CREATE_STATIC: Final = 0xC0105209
MEM_MAP: Final = 0xC040520A
MEM_UNMAP: Final = 0xC030520B
SET_OPTION: Final = 0xC020520C  # only in an unmerged patch series: ENOTTY
GET_DSP_INFO: Final = 0xC01C520D

COMMAND_NAMES: Final[dict[int, str]] = {
    ALLOC_DMA_BUFF: "ALLOC_DMA_BUFF",
    INVOKE: "INVOKE",
    INIT_ATTACH: "INIT_ATTACH",
    INIT_CREATE: "INIT_CREATE",
    MMAP: "MMAP",
    MUNMAP: "MUNMAP",
    INIT_ATTACH_SNS: "INIT_ATTACH_SNS",
    INIT_CREATE_STATIC: "INIT_CREATE_STATIC",
    MEM_MAP: "MEM_MAP",
    MEM_UNMAP: "MEM_UNMAP",
    GET_DSP_INFO: "GET_DSP_INFO",
}
"""The words the emulated driver handles; anything else is ENOTTY."""

# --------------------------------------------------------------------------
# Structures, little-endian with explicit padding (LP64 layout).

INVOKE_STRUCT: Final = struct.Struct("<IIQ")  # handle, sc, args
INVOKE_ARG_STRUCT: Final = struct.Struct("<QQiI")  # ptr, length, fd, attr
INIT_CREATE_STRUCT: Final = struct.Struct("<IiIIQ")  # filelen, filefd, attrs, siglen, file
INIT_CREATE_STATIC_STRUCT: Final = struct.Struct("<IIQ")  # namelen, memlen, name
ALLOC_DMA_BUF_STRUCT: Final = struct.Struct("<iIQ")  # fd, flags, size
REQ_MMAP_STRUCT: Final = struct.Struct("<iIQQQ")  # fd, flags, vaddrin, size, vaddrout
REQ_MUNMAP_STRUCT: Final = struct.Struct("<QQ")  # vaddrout, size
# version, fd, offset, flags, vaddrin, length, vaddrout, attrs, reserved[4], tail pad
MEM_MAP_STRUCT: Final = struct.Struct("<iiiIQQQi16x4x")
# vesion, fd, vaddr, length, reserved[5], tail pad
MEM_UNMAP_STRUCT: Final = struct.Struct("<iiQQ20x4x")
CAPABILITY_STRUCT: Final = struct.Struct("<III16x")  # domain, attribute_id, capability, reserved

# Offsets of the fields the driver writes back.
ALLOC_DMA_BUF_FD_OFFSET: Final = 0
REQ_MMAP_VADDROUT_OFFSET: Final = 24
MEM_MAP_VADDROUT_OFFSET: Final = 32
CAPABILITY_DOMAIN_OFFSET: Final = 0
CAPABILITY_VALUE_OFFSET: Final = 8

U32: Final = struct.Struct("<I")
S32: Final = struct.Struct("<i")
U64: Final = struct.Struct("<Q")

# --------------------------------------------------------------------------
# The system DMA-BUF heap (include/uapi/linux/dma-heap.h), where rpcmem
# allocates (reference section 7): not a FastRPC command.

DMA_HEAP_IOCTL_ALLOC: Final = 0xC0184800  # _IOWR('H', 0, struct dma_heap_allocation_data)
DMA_HEAP_ALLOCATION_STRUCT: Final = struct.Struct("<QIIQ")  # len, fd, fd_flags, heap_flags
DMA_HEAP_ALLOCATION_FD_OFFSET: Final = 8
DMA_HEAP_VALID_FD_FLAGS: Final = 0o2000000 | 0o3  # O_CLOEXEC | O_ACCMODE
DMA_HEAP_VALID_HEAP_FLAGS: Final = 0


class InvokeRequest(NamedTuple):
    handle: int
    sc: int
    args: int


class InvokeArg(NamedTuple):
    ptr: int
    length: int
    fd: int
    attr: int


class InitCreate(NamedTuple):
    filelen: int
    filefd: int
    attrs: int
    siglen: int
    file: int


class InitCreateStatic(NamedTuple):
    namelen: int
    memlen: int
    name: int


class AllocDmaBuf(NamedTuple):
    fd: int
    flags: int
    size: int


class ReqMmap(NamedTuple):
    fd: int
    flags: int
    vaddrin: int
    size: int
    vaddrout: int


class ReqMunmap(NamedTuple):
    vaddrout: int
    size: int


class MemMap(NamedTuple):
    version: int
    fd: int
    offset: int
    flags: int
    vaddrin: int
    length: int
    vaddrout: int
    attrs: int


class MemUnmap(NamedTuple):
    version: int
    fd: int
    vaddr: int
    length: int


class Capability(NamedTuple):
    domain: int
    attribute_id: int
    capability: int


class DmaHeapAllocation(NamedTuple):
    len: int
    fd: int
    fd_flags: int
    heap_flags: int


# --------------------------------------------------------------------------
# The scalars word: attr 29-31, method 24-28, in-buffers 16-23,
# out-buffers 8-15, in-handles 4-7, out-handles 0-3.


class Scalars(NamedTuple):
    attr: int
    method: int
    inbufs: int
    outbufs: int
    inhandles: int
    outhandles: int

    @property
    def length(self) -> int:
        """How many 24-byte invoke args the kernel reads for this word."""
        return self.inbufs + self.outbufs + self.inhandles + self.outhandles

    @property
    def counts(self) -> tuple[int, int, int, int]:
        return (self.inbufs, self.outbufs, self.inhandles, self.outhandles)


def decode_scalars(sc: int) -> Scalars:
    return Scalars(
        attr=(sc >> 29) & 0x7,
        method=(sc >> 24) & 0x1F,
        inbufs=(sc >> 16) & 0xFF,
        outbufs=(sc >> 8) & 0xFF,
        inhandles=(sc >> 4) & 0xF,
        outhandles=sc & 0xF,
    )


def make_scalars(method: int, inbufs: int, outbufs: int) -> int:
    """The word for a method with buffers only (no handles, attr 0), from npud.idl,
    which builds it for both sides; ValueError for a field out of range."""
    return idl.make_scalars(method, inbufs, outbufs)
