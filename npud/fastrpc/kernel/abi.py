"""The FastRPC kernel ABI, mirrored from ``include/uapi/misc/fastrpc.h``.

Pure data: ctypes structures with the kernel's names and field order, request
numbers computed from those structures with the ``_IOC`` encoding, the scalars
word, and the constants that the driver and the userspace protocol use. Tests
compare all of it with a C compiler's view of the real header.

Nothing here performs I/O.
"""

from __future__ import annotations

import ctypes
import enum
from typing import Final

from npud import idl  # --------------------------------------------------------------------------

# _IOC encoding (include/uapi/asm-generic/ioctl.h; identical on x86_64 and
# aarch64): dir in bits 30-31, size in 16-29, type in 8-15, nr in 0-7.

_IOC_NRBITS: Final = 8
_IOC_TYPEBITS: Final = 8
_IOC_SIZEBITS: Final = 14
_IOC_NRSHIFT: Final = 0
_IOC_TYPESHIFT: Final = _IOC_NRSHIFT + _IOC_NRBITS
_IOC_SIZESHIFT: Final = _IOC_TYPESHIFT + _IOC_TYPEBITS
_IOC_DIRSHIFT: Final = _IOC_SIZESHIFT + _IOC_SIZEBITS

_IOC_NONE: Final = 0
_IOC_WRITE: Final = 1
_IOC_READ: Final = 2


def _IOC(direction: int, type_: str, nr: int, size: int) -> int:  # noqa: N802 - kernel macro
    if not 0 <= size < (1 << _IOC_SIZEBITS):
        raise ValueError(f"ioctl argument size {size} does not fit in {_IOC_SIZEBITS} bits")
    return (
        (direction << _IOC_DIRSHIFT)
        | (size << _IOC_SIZESHIFT)
        | (ord(type_) << _IOC_TYPESHIFT)
        | (nr << _IOC_NRSHIFT)
    )


def _IO(type_: str, nr: int) -> int:  # noqa: N802 - kernel macro
    return _IOC(_IOC_NONE, type_, nr, 0)


def _IOWR(type_: str, nr: int, ctype: type[ctypes._CData]) -> int:  # noqa: N802 - kernel macro
    return _IOC(_IOC_READ | _IOC_WRITE, type_, nr, ctypes.sizeof(ctype))


# --------------------------------------------------------------------------
# Structures. Field names and order are the kernel's (including its typo
# ``vesion`` in fastrpc_mem_unmap). ctypes applies the platform's natural
# alignment, which on LP64 (x86_64, aarch64) matches the C compiler.


class fastrpc_invoke_args(ctypes.Structure):
    _fields_ = (
        ("ptr", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("fd", ctypes.c_int32),
        ("attr", ctypes.c_uint32),
    )


class fastrpc_invoke(ctypes.Structure):
    _fields_ = (
        ("handle", ctypes.c_uint32),
        ("sc", ctypes.c_uint32),
        ("args", ctypes.c_uint64),
    )


class fastrpc_init_create(ctypes.Structure):
    _fields_ = (
        ("filelen", ctypes.c_uint32),
        ("filefd", ctypes.c_int32),
        ("attrs", ctypes.c_uint32),
        ("siglen", ctypes.c_uint32),
        ("file", ctypes.c_uint64),
    )


class fastrpc_init_create_static(ctypes.Structure):
    _fields_ = (
        ("namelen", ctypes.c_uint32),
        ("memlen", ctypes.c_uint32),
        ("name", ctypes.c_uint64),
    )


class fastrpc_alloc_dma_buf(ctypes.Structure):
    _fields_ = (
        ("fd", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("size", ctypes.c_uint64),
    )


class fastrpc_req_mmap(ctypes.Structure):
    _fields_ = (
        ("fd", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("vaddrin", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("vaddrout", ctypes.c_uint64),
    )


class fastrpc_mem_map(ctypes.Structure):
    _fields_ = (
        ("version", ctypes.c_int32),
        ("fd", ctypes.c_int32),
        ("offset", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("vaddrin", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("vaddrout", ctypes.c_uint64),
        ("attrs", ctypes.c_int32),
        ("reserved", ctypes.c_int32 * 4),
    )


class fastrpc_req_munmap(ctypes.Structure):
    _fields_ = (
        ("vaddrout", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
    )


class fastrpc_mem_unmap(ctypes.Structure):
    _fields_ = (
        ("vesion", ctypes.c_int32),
        ("fd", ctypes.c_int32),
        ("vaddr", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("reserved", ctypes.c_int32 * 5),
    )


class fastrpc_ioctl_capability(ctypes.Structure):
    _fields_ = (
        ("domain", ctypes.c_uint32),
        ("attribute_id", ctypes.c_uint32),
        ("capability", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32 * 4),
    )


class dma_heap_allocation_data(ctypes.Structure):
    """include/uapi/linux/dma-heap.h: an allocation from a DMA-BUF heap."""

    _fields_ = (
        ("len", ctypes.c_uint64),
        ("fd", ctypes.c_uint32),
        ("fd_flags", ctypes.c_uint32),
        ("heap_flags", ctypes.c_uint64),
    )


# --------------------------------------------------------------------------
# Request numbers. The kernel compares the full 32-bit word; any other value
# (right nr, wrong direction or size) is ENOTTY.


class Ioctl(enum.IntEnum):
    """Every request npud issues, by the name traces and errors show; each value is
    computed from its struct as the kernel's macros compute it (``_IOWR`` and ``_IO``),
    and ``tests/unit/test_abi.py`` checks them against the C compiler."""

    ALLOC_DMA_BUFF = _IOWR("R", 1, fastrpc_alloc_dma_buf)
    FREE_DMA_BUFF = _IOWR("R", 2, ctypes.c_uint32)  # ENOTTY in mainline
    INVOKE = _IOWR("R", 3, fastrpc_invoke)
    INIT_ATTACH = _IO("R", 4)
    INIT_CREATE = _IOWR("R", 5, fastrpc_init_create)
    MMAP = _IOWR("R", 6, fastrpc_req_mmap)
    MUNMAP = _IOWR("R", 7, fastrpc_req_munmap)
    INIT_ATTACH_SNS = _IO("R", 8)
    INIT_CREATE_STATIC = _IOWR("R", 9, fastrpc_init_create_static)
    MEM_MAP = _IOWR("R", 10, fastrpc_mem_map)
    MEM_UNMAP = _IOWR("R", 11, fastrpc_mem_unmap)
    GET_DSP_INFO = _IOWR("R", 13, fastrpc_ioctl_capability)
    # The system DMA-BUF heap (drivers/dma-buf/dma-heap.c), where libcdsprpc's rpcmem
    # allocates: any other command word is ENOTTY.
    DMA_HEAP_IOCTL_ALLOC = _IOWR("H", 0, dma_heap_allocation_data)


def ioctl_name(request: int) -> str:
    """The name a trace or an error shows for ``request``: the member's, else its hex."""
    try:
        return Ioctl(request).name
    except ValueError:
        return f"0x{request:08X}"


# The uapi header's names, for code that reads like the kernel's.
FASTRPC_IOCTL_ALLOC_DMA_BUFF: Final = Ioctl.ALLOC_DMA_BUFF
FASTRPC_IOCTL_FREE_DMA_BUFF: Final = Ioctl.FREE_DMA_BUFF
FASTRPC_IOCTL_INVOKE: Final = Ioctl.INVOKE
FASTRPC_IOCTL_INIT_ATTACH: Final = Ioctl.INIT_ATTACH
FASTRPC_IOCTL_INIT_CREATE: Final = Ioctl.INIT_CREATE
FASTRPC_IOCTL_MMAP: Final = Ioctl.MMAP
FASTRPC_IOCTL_MUNMAP: Final = Ioctl.MUNMAP
FASTRPC_IOCTL_INIT_ATTACH_SNS: Final = Ioctl.INIT_ATTACH_SNS
FASTRPC_IOCTL_INIT_CREATE_STATIC: Final = Ioctl.INIT_CREATE_STATIC
FASTRPC_IOCTL_MEM_MAP: Final = Ioctl.MEM_MAP
FASTRPC_IOCTL_MEM_UNMAP: Final = Ioctl.MEM_UNMAP
FASTRPC_IOCTL_GET_DSP_INFO: Final = Ioctl.GET_DSP_INFO
DMA_HEAP_IOCTL_ALLOC: Final = Ioctl.DMA_HEAP_IOCTL_ALLOC

# --------------------------------------------------------------------------
# The scalars word (kernel FASTRPC_BUILD_SCALARS, userspace REMOTE_SCALARS_MAKEX):
# attr 29-31, method 24-28, in-buffers 16-23, out-buffers 8-15,
# in-handles 4-7, out-handles 0-3. Built in one place, npud.idl.make_scalars; the
# accessors below read it.


def remote_scalars_makex(attr: int, method: int, nin: int, nout: int, hin: int, hout: int) -> int:
    """Build a scalars word (npud.idl builds it for both sides); every field is
    range-checked instead of silently masked."""
    return idl.make_scalars(method, nin, nout, hin, hout, attr=attr)


def remote_scalars_make(method: int, nin: int, nout: int) -> int:
    return remote_scalars_makex(0, method, nin, nout, 0, 0)


def remote_scalars_attr(sc: int) -> int:
    return (sc >> 29) & 0x7


def remote_scalars_method(sc: int) -> int:
    return (sc >> 24) & 0x1F


def remote_scalars_inbufs(sc: int) -> int:
    return (sc >> 16) & 0xFF


def remote_scalars_outbufs(sc: int) -> int:
    return (sc >> 8) & 0xFF


def remote_scalars_inhandles(sc: int) -> int:
    return (sc >> 4) & 0xF


def remote_scalars_outhandles(sc: int) -> int:
    return sc & 0xF


def remote_scalars_length(sc: int) -> int:
    """Number of ``fastrpc_invoke_args`` entries the kernel reads for ``sc``."""
    return (
        remote_scalars_inbufs(sc)
        + remote_scalars_outbufs(sc)
        + remote_scalars_inhandles(sc)
        + remote_scalars_outhandles(sc)
    )


# --------------------------------------------------------------------------
# Constants (shared/reference/fastrpc-abi.md, section 2).

# enum fastrpc_map_flags
FASTRPC_MAP_STATIC: Final = 0
FASTRPC_MAP_RESERVED: Final = 1
FASTRPC_MAP_FD: Final = 2
FASTRPC_MAP_FD_DELAYED: Final = 3
FASTRPC_MAP_FD_NOMAP: Final = 16
FASTRPC_MAP_MAX: Final = 17

# enum fastrpc_proc_attr (init_create.attrs)
FASTRPC_MODE_DEBUG: Final = 1 << 0
FASTRPC_MODE_PTRACE: Final = 1 << 1
FASTRPC_MODE_CRC: Final = 1 << 2
FASTRPC_MODE_UNSIGNED_MODULE: Final = 1 << 3
FASTRPC_MODE_ADAPTIVE_QOS: Final = 1 << 4
FASTRPC_MODE_SYSTEM_PROCESS: Final = 1 << 5
FASTRPC_MODE_PRIVILEGED: Final = 1 << 6

# fastrpc_invoke_args.attr
FASTRPC_ATTR_SECUREMAP: Final = 1

# fastrpc_req_mmap.flags
ADSP_MMAP_HEAP_ADDR: Final = 4
ADSP_MMAP_DMA_BUFFER: Final = 6
ADSP_MMAP_REMOTE_HEAP_ADDR: Final = 8
ADSP_MMAP_ADD_PAGES: Final = 0x1000
ADSP_MMAP_ADD_PAGES_LLC: Final = 0x3000

# Domain ids.
ADSP_DOMAIN_ID: Final = 0
MDSP_DOMAIN_ID: Final = 1
SDSP_DOMAIN_ID: Final = 2
CDSP_DOMAIN_ID: Final = 3
CDSP1_DOMAIN_ID: Final = 4

# enum remote_dsp_attributes (fastrpc_ioctl_capability.attribute_id)
DOMAIN_SUPPORT: Final = 0
UNSIGNED_PD_SUPPORT: Final = 1
HVX_SUPPORT_64B: Final = 2
HVX_SUPPORT_128B: Final = 3
VTCM_PAGE: Final = 4
VTCM_COUNT: Final = 5
ARCH_VER: Final = 6
HMX_SUPPORT_DEPTH: Final = 7
HMX_SUPPORT_SPATIAL: Final = 8
ASYNC_FASTRPC_SUPPORT: Final = 9
STATUS_NOTIFICATION_SUPPORT: Final = 10
MCID_MULTICAST: Final = 11

# Kernel limits.
FASTRPC_MAX_SESSIONS: Final = 14
FASTRPC_CTX_MAX: Final = 256
FASTRPC_MAX_FDLIST: Final = 16
FASTRPC_MAX_CRCLIST: Final = 64
FASTRPC_ALIGN: Final = 128
INIT_FILELEN_MAX: Final = 2 * 1024 * 1024
INIT_FILE_NAMELEN_MAX: Final = 128
FASTRPC_MAX_DSP_ATTRIBUTES: Final = 256
DSP_UNSUPPORTED_API: Final = 0x80000414

# Static remote handles (reference 5.2).
REMOTECTL_HANDLE: Final = 0
FASTRPC_INIT_HANDLE: Final = 1  # kernel only: EPERM from userspace
FASTRPC_DSP_UTILITIES_HANDLE: Final = 2
ADSP_LISTENER_HANDLE: Final = 3
ADSP_CURRENT_PROCESS1_HANDLE: Final = 4
ADSP_LISTENER1_HANDLE: Final = 7
REMOTECTL1_HANDLE: Final = 8

# The system DMA-BUF heap: fd_flags may hold O_CLOEXEC and an access mode only,
# heap_flags must be 0 (DMA_HEAP_VALID_FD_FLAGS, DMA_HEAP_VALID_HEAP_FLAGS).
DMA_HEAP_SYSTEM: Final = "/dev/dma_heap/system"
DMA_HEAP_VALID_FD_FLAGS: Final = 0o2000000 | 0o3  # O_CLOEXEC | O_ACCMODE
DMA_HEAP_VALID_HEAP_FLAGS: Final = 0

# Device nodes of the compute DSP. The secure node is tried first, as
# libcdsprpc does; on X1E80100 both behave identically.
CDSP_SECURE_NODE: Final = "/dev/fastrpc-cdsp-secure"
CDSP_NODE: Final = "/dev/fastrpc-cdsp"
CDSP_NODES: Final = (CDSP_SECURE_NODE, CDSP_NODE)
