"""remotectl (reference 5.3): open and close skels by URI.

Two generations, same argument layouts: the domain-style ``remotectl1`` on
static handle 8 (open1 = method 2, close1 = method 3), which libcdsprpc tries
first, and ``remotectl`` on handle 0 (open 0, close 1), which it falls back to
when the DSP answers anything but success. Pure packing and unpacking;
the session runs the calls.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from npud.fastrpc import abi
from npud.fastrpc.marshal import c_string, from_c_string

OPEN_SC: Final = abi.remote_scalars_make(0, 2, 2)  # 0x00020200
CLOSE_SC: Final = abi.remote_scalars_make(1, 1, 2)  # 0x01010200
OPEN1_SC: Final = abi.remote_scalars_make(2, 2, 2)  # 0x02020200, remotectl1.open1
CLOSE1_SC: Final = abi.remote_scalars_make(3, 1, 2)  # 0x03010200, remotectl1.close1


@dataclass(frozen=True)
class RemotectlGeneration:
    name: str
    handle: int
    open_sc: int
    close_sc: int


REMOTECTL1: Final = RemotectlGeneration("remotectl1", abi.REMOTECTL1_HANDLE, OPEN1_SC, CLOSE1_SC)
REMOTECTL: Final = RemotectlGeneration("remotectl", abi.REMOTECTL_HANDLE, OPEN_SC, CLOSE_SC)
DLERROR_CAPACITY: Final = 255  # what libcdsprpc announces
MAX_URI_BYTES: Final = 1024


@dataclass(frozen=True)
class OpenRequest:
    prim_in: bytes
    name: bytes


def pack_open(uri: str) -> OpenRequest:
    name = c_string(uri, what="remote module URI", max_len=MAX_URI_BYTES)
    return OpenRequest(struct.pack("<II", len(name), DLERROR_CAPACITY), name)


@dataclass(frozen=True)
class OpenReply:
    handle: int
    error: int  # the DSP's dlopen status: 0 = success, else an AEE code
    dlerror: str


def unpack_open(prim_out: bytes, dlerror: bytes) -> OpenReply:
    handle, error = struct.unpack("<Ii", prim_out[:8])
    return OpenReply(handle=handle, error=error & 0xFFFFFFFF, dlerror=from_c_string(dlerror))


def pack_close(handle: int) -> bytes:
    return struct.pack("<II", handle, DLERROR_CAPACITY)


def unpack_close(prim_out: bytes, dlerror: bytes) -> tuple[int, str]:
    (error,) = struct.unpack("<i", prim_out[:4])
    return error & 0xFFFFFFFF, from_c_string(dlerror)
