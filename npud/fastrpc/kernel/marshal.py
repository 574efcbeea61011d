"""qaic-style marshalling helpers (reference 5.4) and the listener's packed buffers (5.6).

Pure functions over bytes; no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.errors import RpcError


def c_string(text: str, *, what: str, max_len: int) -> bytes:
    """UTF-8 with a terminating NUL, as IDL ``string`` arguments travel."""
    data = text.encode("utf-8")
    if not data:
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"{what} is empty")
    if b"\0" in data:
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"{what} contains a NUL byte")
    if len(data) + 1 > max_len:
        raise RpcError(
            ErrorCode.INVALID_ARGUMENT,
            detail=f"{what} is {len(data)} bytes; the limit is {max_len - 1}",
        )
    return data + b"\0"


def from_c_string(data: bytes) -> str:
    """Text up to the first NUL (or the whole buffer), with bad UTF-8 replaced."""
    end = data.find(b"\0")
    return (data if end < 0 else data[:end]).decode("utf-8", errors="replace")


def _align8(blob: bytearray) -> None:
    blob.extend(b"\0" * (-len(blob) % 8))


def pack_buffers(buffers: Sequence[bytes]) -> bytes:
    """Each buffer as u32 length, then (if non-empty) 8-aligned data."""
    blob = bytearray()
    for data in buffers:
        blob += struct.pack("<I", len(data))
        if data:
            _align8(blob)
            blob += data
    return bytes(blob)


def pack_lengths(lengths: Sequence[int]) -> bytes:
    return b"".join(struct.pack("<I", n) for n in lengths)


class PackedReader:
    """Reads a packed request blob; every read is bounds-checked (the DSP is a peer)."""

    def __init__(self, blob: bytes) -> None:
        self._blob = blob
        self._pos = 0

    def _u32(self) -> int:
        if self._pos + 4 > len(self._blob):
            raise ValueError("packed blob truncated in a length field")
        (value,) = struct.unpack_from("<I", self._blob, self._pos)
        self._pos += 4
        return int(value)

    def buffers(self, count: int) -> list[bytes]:
        out: list[bytes] = []
        for _ in range(count):
            length = self._u32()
            if length:
                self._pos += -self._pos % 8
                end = self._pos + length
                if end > len(self._blob):
                    raise ValueError("packed blob truncated in a buffer")
                out.append(self._blob[self._pos : end])
                self._pos = end
            else:
                out.append(b"")
        return out

    def lengths(self, count: int) -> list[int]:
        return [self._u32() for _ in range(count)]
