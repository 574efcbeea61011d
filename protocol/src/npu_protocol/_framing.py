"""Frames: an 8-byte header, then a msgpack payload; fds follow the first byte.

Header (little-endian): ``b"NP"`` magic, u8 fd count, u8 reserved (0), u32
payload length. The reader checks the header against its limits the moment the
8 bytes are there, so an oversized frame is refused before a single payload
byte is awaited or stored beyond what the peer already pushed.

Fd accounting. The transport passes each recvmsg's bytes together with the fds
that came with them. A frame owns the first ``fd count`` fds that arrived in the
same chunk as its first byte (the sender attaches them to the sendmsg that
carries that byte). Fds whose chunk has been consumed without a frame claiming
them are *stray*: the reader hands them back so the transport can close them.
The reader never closes anything itself.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from npu_protocol._exceptions import RemoteProtocolError
from npu_protocol._wire import FRAME_HEADER_SIZE, FRAME_MAGIC, MAX_FDS_PER_FRAME
from npu_protocol.errors import ErrorCode

_HEADER: Final = struct.Struct("<2sBBI")
assert _HEADER.size == FRAME_HEADER_SIZE


def encode_frame_header(payload_length: int, fd_count: int) -> bytes:
    """The 8 header bytes of a frame (the caller checks the limits)."""
    return _HEADER.pack(FRAME_MAGIC, fd_count, 0, payload_length)


def write_frame_header(frame: bytearray, fd_count: int) -> None:
    """Fill the first 8 bytes of ``frame``, whose payload follows them, with its header
    (the caller checks the limits): a frame encoded in place is never joined."""
    _HEADER.pack_into(frame, 0, FRAME_MAGIC, fd_count, 0, len(frame) - FRAME_HEADER_SIZE)


@dataclass(frozen=True, slots=True)
class Frame:
    """One complete frame: its payload bytes and the fds that travelled with it."""

    payload: bytes
    fds: tuple[int, ...]


@dataclass(slots=True)
class _FdChunk:
    """Fds that arrived with stream bytes ``[start, end)``."""

    start: int
    end: int
    fds: deque[int]


@dataclass(slots=True)
class FrameReader:
    """Splits a byte stream plus fd chunks into frames; pure bookkeeping."""

    max_payload: int
    _buffer: bytearray = field(default_factory=bytearray)
    _start: int = 0  # _buffer[:_start] is consumed; compacted on the next feed
    _offset: int = 0  # stream offset of _buffer[_start]
    _received: int = 0  # stream bytes fed so far
    _chunks: deque[_FdChunk] = field(default_factory=deque)
    _stray: list[int] = field(default_factory=list)
    _eof: bool = False
    _fds_truncated: bool = False

    # --- input ----------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview, fds: Iterable[int] = ()) -> None:
        """Append one chunk (copied); ``fds`` arrived with it. Empty ``data`` means end
        of stream."""
        if self._eof:
            raise RuntimeError("data fed to a frame reader after the end of the stream")
        arrived = deque(fds)
        if not data:
            self._eof = True
            self._stray.extend(arrived)
            for chunk in self._chunks:
                self._stray.extend(chunk.fds)
            self._chunks.clear()
            return
        start = self._received
        self._received += len(data)
        if self._start:
            # Compact once per chunk, not once per frame: a chunk full of
            # small frames would otherwise be copied again for each of them.
            del self._buffer[: self._start]
            self._start = 0
        self._buffer += data
        if arrived:
            self._chunks.append(_FdChunk(start, self._received, arrived))

    def note_fds_truncated(self) -> None:
        """The transport saw MSG_CTRUNC: fds were lost, so the stream cannot be trusted."""
        self._fds_truncated = True

    # --- output -----------------------------------------------------------------

    @property
    def at_eof(self) -> bool:
        return self._eof

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed as part of a frame."""
        return len(self._buffer) - self._start

    def take_stray_fds(self) -> tuple[int, ...]:
        """Fds that no frame claimed and no later frame can claim."""
        self._sweep()
        stray, self._stray = tuple(self._stray), []
        return stray

    def take_all_fds(self) -> list[int]:
        """Every fd still held (stray or waiting for a frame), for closing."""
        held = list(self._stray)
        for chunk in self._chunks:
            held.extend(chunk.fds)
        self._stray.clear()
        self._chunks.clear()
        return held

    def next_frame(self) -> Frame | None:
        """Consume exactly one complete frame, or nothing and return None.

        Raises RemoteProtocolError for a bad header, an oversized or fd-heavy
        frame, missing fds, lost fds, or a stream that ended mid-frame.
        """
        if self._fds_truncated:
            raise RemoteProtocolError(ErrorCode.FDS_TRUNCATED)
        if self.buffered < FRAME_HEADER_SIZE:
            self._check_eof()
            return None
        fd_count, length = self._parse_header()
        if self.buffered < FRAME_HEADER_SIZE + length:
            self._check_eof()
            return None
        fds = self._claim_fds(fd_count)
        begin = self._start + FRAME_HEADER_SIZE
        with memoryview(self._buffer) as view:
            payload = bytes(view[begin : begin + length])
        self._start = begin + length
        self._offset += FRAME_HEADER_SIZE + length
        if self._start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        return Frame(payload, fds)

    # --- internals ----------------------------------------------------------------

    def _parse_header(self) -> tuple[int, int]:
        magic, fd_count, reserved, length = _HEADER.unpack_from(self._buffer, self._start)
        if magic != FRAME_MAGIC:
            raise RemoteProtocolError(
                ErrorCode.BAD_FRAME_HEADER, detail=f"magic {bytes(magic)!r} is not {FRAME_MAGIC!r}"
            )
        if reserved != 0:
            raise RemoteProtocolError(
                ErrorCode.BAD_FRAME_HEADER, detail=f"reserved byte is {reserved:#04x}, not 0"
            )
        if fd_count > MAX_FDS_PER_FRAME:
            raise RemoteProtocolError(
                ErrorCode.TOO_MANY_FDS, count=fd_count, limit=MAX_FDS_PER_FRAME
            )
        if length == 0:
            raise RemoteProtocolError(ErrorCode.BAD_FRAME_HEADER, detail="empty payload")
        if length > self.max_payload:
            raise RemoteProtocolError(
                ErrorCode.FRAME_TOO_LARGE, size=length, limit=self.max_payload
            )
        return fd_count, length

    def _check_eof(self) -> None:
        if self._eof and self.buffered:
            raise RemoteProtocolError(ErrorCode.TRUNCATED_FRAME, buffered=self.buffered)

    def _sweep(self) -> None:
        """Fds no frame can claim any more are stray: those of chunks wholly consumed,
        and, once the header of the frame being received is there, those that came
        after its first byte with bytes wholly inside it (no frame begins there). So
        the fds a peer sends on every byte of a frame it never ends are handed back as
        they come, not held until the frame ends (issue 27: 4 fds on each byte took a
        daemon to its fd limit): what a connection holds waiting for frames is bounded
        by the fds of the recvmsg()s of one frame's first bytes."""
        while self._chunks and self._chunks[0].end <= self._offset:
            self._stray.extend(self._chunks.popleft().fds)
        if not self._chunks or self.buffered < FRAME_HEADER_SIZE:
            return
        length = _HEADER.unpack_from(self._buffer, self._start)[3]
        end = self._offset + FRAME_HEADER_SIZE + length
        kept: deque[_FdChunk] = deque()
        for chunk in self._chunks:
            if chunk.start > self._offset and chunk.end <= end:
                self._stray.extend(chunk.fds)
            else:
                kept.append(chunk)
        if len(kept) != len(self._chunks):
            self._chunks = kept

    def _claim_fds(self, count: int) -> tuple[int, ...]:
        self._sweep()
        head = self._chunks[0] if self._chunks else None
        arrived = head is not None and head.start <= self._offset
        available = len(head.fds) if head is not None and arrived else 0
        if available < count:
            raise RemoteProtocolError(ErrorCode.MISSING_FDS, declared=count, received=available)
        if head is None or count == 0:
            return ()
        return tuple(head.fds.popleft() for _ in range(count))
