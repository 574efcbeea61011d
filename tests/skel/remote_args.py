"""ctypes mirror of the skels' ``remote_arg`` and a caller that builds real argument arrays.

The structures keep the names and field order of ``skel/include/sdk/remote.h``
(test_skel_headers.py checks them against the C compiler's view). A call is
described slot by slot, in the order the skel receives them (input buffers,
output buffers, input handles, output handles), with the scalars word given
separately so tests can make the two disagree on purpose.
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from npud.fastrpc.kernel.abi import remote_scalars_length, remote_scalars_makex


class remote_buf(ctypes.Structure):
    _fields_ = (("pv", ctypes.c_void_p), ("nLen", ctypes.c_size_t))


class remote_dma_handle(ctypes.Structure):
    _fields_ = (("fd", ctypes.c_int32), ("offset", ctypes.c_uint32))


class remote_arg(ctypes.Union):
    _fields_ = (
        ("buf", remote_buf),
        ("h", ctypes.c_uint32),
        ("h64", ctypes.c_uint64),
        ("dma", remote_dma_handle),
    )


OUTPUT_FILL: Final = 0xA5
"""Output buffers start filled with this byte, so a skel that leaves bytes unwritten shows."""


@dataclasses.dataclass(frozen=True)
class Out:
    """An output buffer of ``capacity`` bytes."""

    capacity: int


@dataclasses.dataclass(frozen=True)
class NullBuffer:
    """A buffer slot whose pointer is NULL while its length says ``n_len``."""

    n_len: int


@dataclasses.dataclass(frozen=True)
class HandleIn:
    """An input handle slot carrying ``value`` in ``h64``."""

    value: int


@dataclasses.dataclass(frozen=True)
class HandleOut:
    """An output handle slot; the skel writes ``h64``."""


Slot = bytes | Out | NullBuffer | HandleIn | HandleOut


@dataclasses.dataclass(frozen=True)
class Result:
    """What a call left behind: the skel's return value and every slot afterwards."""

    rc: int
    buffers: list[bytes | None]
    """Per slot: the buffer's bytes after the call (None for NULL buffers and handle slots)."""
    handles: list[int | None]
    """Per slot: ``h64`` after the call (None for buffer slots)."""


def u32s(*values: int) -> bytes:
    """A primIn / primROut block of little-endian u32s."""
    return struct.pack(f"<{len(values)}I", *values)


def unpack_u32s(data: bytes | None) -> tuple[int, ...]:
    assert data is not None
    return struct.unpack(f"<{len(data) // 4}I", data)


def sc(method: int, inbufs: int, outbufs: int, inhandles: int = 0, outhandles: int = 0) -> int:
    return remote_scalars_makex(0, method, inbufs, outbufs, inhandles, outhandles)


class SkelLibrary:
    """One host-built skel library: its ``<iface>_skel_handle_invoke`` and C API."""

    def __init__(self, path: Path, interface: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self._invoke: Any = getattr(self.lib, f"{interface}_skel_handle_invoke")
        self._invoke.argtypes = (ctypes.c_uint64, ctypes.c_uint32, ctypes.POINTER(remote_arg))
        self._invoke.restype = ctypes.c_int

    def function(self, name: str, restype: Any, *argtypes: Any) -> Any:
        """A C function of the library with its prototype set."""
        fn: Any = getattr(self.lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
        return fn

    def invoke(self, handle: int, scalars: int, slots: Sequence[Slot]) -> Result:
        """Call the invoke entry with a remote_arg array built from ``slots``."""
        # As many entries as the sc announces, like the kernel passes: a skel that trusted
        # a lying count would read zeroed entries rather than past the array.
        args = (remote_arg * max(len(slots), remote_scalars_length(scalars), 1))()
        keep: list[ctypes.Array[ctypes.c_char] | None] = []
        for i, slot in enumerate(slots):
            storage: ctypes.Array[ctypes.c_char] | None = None
            if isinstance(slot, bytes):
                storage = ctypes.create_string_buffer(slot, len(slot))
                args[i].buf.nLen = len(slot)
            elif isinstance(slot, Out):
                storage = ctypes.create_string_buffer(
                    bytes([OUTPUT_FILL]) * slot.capacity, slot.capacity
                )
                args[i].buf.nLen = slot.capacity
            elif isinstance(slot, NullBuffer):
                args[i].buf.pv = None
                args[i].buf.nLen = slot.n_len
            elif isinstance(slot, HandleIn):
                args[i].h64 = slot.value
            if storage is not None:
                args[i].buf.pv = ctypes.cast(storage, ctypes.c_void_p).value
            keep.append(storage)
        pointer = args if slots or remote_scalars_length(scalars) else ctypes.POINTER(remote_arg)()
        rc = int(self._invoke(handle, scalars, pointer))
        buffers: list[bytes | None] = [None if s is None else s.raw for s in keep]
        handles: list[int | None] = [
            int(args[i].h64) if isinstance(slot, HandleIn | HandleOut) else None
            for i, slot in enumerate(slots)
        ]
        return Result(rc=rc, buffers=buffers, handles=handles)

    def open(self, uri: str) -> Result:
        """Method 0 the way remotectl runs it: primIn {uri length}, the URI, an out handle."""
        text = uri.encode() + b"\0"
        return self.invoke(0, sc(0, 2, 0, 0, 1), [u32s(len(text)), text, HandleOut()])

    def close(self, handle: int) -> int:
        """Method 1: one input handle."""
        return self.invoke(0, sc(1, 0, 0, 1, 0), [HandleIn(handle)]).rc
