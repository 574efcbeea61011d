"""remotectl (reference 5.3): open and close skels by URI.

Two generations, same argument layouts: the domain-style ``remotectl1`` on
static handle 8 (open1 = method 2, close1 = method 3), which libcdsprpc tries
first, and ``remotectl`` on handle 0 (open 0, close 1), which it falls back to
when the DSP answers anything but success. The methods and their layouts come
from ``idl/remotectl.idl`` and ``idl/remotectl1.idl`` through :mod:`npud.idl`
(the emulator serves the same description). Pure packing and unpacking; the
session runs the calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from npud import idl
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.marshal import c_string, from_c_string

REMOTECTL_IDL: Final = idl.load("remotectl")
REMOTECTL1_IDL: Final = idl.load("remotectl1")
OPEN: Final = REMOTECTL_IDL.method("open")
CLOSE: Final = REMOTECTL_IDL.method("close")
OPEN1: Final = REMOTECTL1_IDL.method("open1")
CLOSE1: Final = REMOTECTL1_IDL.method("close1")
OPEN_SC: Final = OPEN.sc  # 0x00020200
CLOSE_SC: Final = CLOSE.sc  # 0x01010200
OPEN1_SC: Final = OPEN1.sc  # 0x02020200, remotectl1.open1
CLOSE1_SC: Final = CLOSE1.sc  # 0x03010200, remotectl1.close1


@dataclass(frozen=True)
class RemotectlGeneration:
    name: str
    handle: int
    open: idl.Method
    close: idl.Method

    @property
    def open_sc(self) -> int:
        return self.open.sc

    @property
    def close_sc(self) -> int:
        return self.close.sc


REMOTECTL1: Final = RemotectlGeneration("remotectl1", abi.REMOTECTL1_HANDLE, OPEN1, CLOSE1)
REMOTECTL: Final = RemotectlGeneration("remotectl", abi.REMOTECTL_HANDLE, OPEN, CLOSE)
DLERROR_CAPACITY: Final = 255  # what libcdsprpc announces
MAX_URI_BYTES: Final = 1024


@dataclass(frozen=True)
class OpenRequest:
    prim_in: bytes
    name: bytes


def pack_open(uri: str) -> OpenRequest:
    """open's two input buffers; RpcError for a URI that cannot travel (empty, a NUL,
    longer than MAX_URI_BYTES with its NUL)."""
    c_string(uri, what="remote module URI", max_len=MAX_URI_BYTES)
    call = OPEN.encode(name=uri, dlerror=DLERROR_CAPACITY)
    prim_in, name = call.inputs
    assert isinstance(prim_in, bytes)
    assert isinstance(name, bytes)
    return OpenRequest(prim_in, name)


@dataclass(frozen=True)
class OpenReply:
    handle: int
    error: int  # the DSP's dlopen status: 0 = success, else an AEE code
    dlerror: str


def unpack_open(prim_out: bytes, dlerror: bytes) -> OpenReply:
    values = OPEN.decode([prim_out, dlerror])
    return OpenReply(
        handle=values.integer("handle"),
        error=values.integer("nErr") & 0xFFFFFFFF,
        dlerror=from_c_string(dlerror),
    )


def pack_close(handle: int) -> bytes:
    (prim_in,) = CLOSE.encode(handle=handle, dlerror=DLERROR_CAPACITY).inputs
    assert isinstance(prim_in, bytes)
    return prim_in


def unpack_close(prim_out: bytes, dlerror: bytes) -> tuple[int, str]:
    values = CLOSE.decode([prim_out, dlerror])
    return values.integer("nErr") & 0xFFFFFFFF, from_c_string(dlerror)
