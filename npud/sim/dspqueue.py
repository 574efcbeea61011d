"""dspqueue's shared memory, as qualcomm/fastrpc's ``src/dspqueue/dspqueue_cpu.c`` lays it
out and uses it: the layouts and the ring protocol, for either side, without threads.

A queue is one buffer the CPU allocates and maps into the DSP process
(``inc/dspqueue_shared.h``)::

    0      struct dspqueue_header (48 bytes): version u32 @0, error i32 @4, flags u32 @8,
           req_queue and resp_queue {queue_offset, queue_length, read_state_offset,
           write_state_offset} u32 x 4 @12 and @28, queue_count u32 @44
    ...    the request ring (CPU -> DSP), its read state (the DSP's) and write state
           (the CPU's), the response ring (DSP -> CPU), its read state (the CPU's) and
           write state (the DSP's); each state {position, packet_count, wait_count} u32

A packet is a u64 header ``len | flags << 32 | n_buffers << 48 | seq << 56`` (``len``
= 8 + 24 * n_buffers + message length, unpadded), the buffer references (24 bytes
each: fd, size, offset, flags u32, ptr u64), then the message, padded to 8 bytes.
A packet never straddles the ring's end: when it does not fit before the end, the
writer writes the header where it is and again at 0, and the packet from 8 on; the
reader, seeing that ``len`` does not fit before the end, reads from 8. A position
that reaches the ring's length becomes 0. The writer has ``length - 8`` bytes when
both positions are equal (one packet slot of 8 bytes always stays free).

The writer publishes a packet by storing its write position after the data, then
counting it in ``packet_count``; the reader likewise with its read position.

Python cannot issue a memory barrier: the stores happen in program order, which is
the publication order the protocol needs on a CPU that does not reorder stores
(x86); see docs/emulator.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from npu_protocol.aee import AEE

HEADER_SIZE: Final = 48
VERSION_OFFSET: Final = 0
ERROR_OFFSET: Final = 4
FLAGS_OFFSET: Final = 8
REQUEST_OFFSET: Final = 12
RESPONSE_OFFSET: Final = 28
QUEUE_COUNT_OFFSET: Final = 44

CURRENT_VERSION: Final = 2
"""DSPQUEUE_HEADER_CURRENT_VERSION: a CPU that checks versions creates queues with it."""
FLAG_WAIT_COUNTS: Final = 1
FLAG_DRIVER_SIGNALING: Final = 2

MAX_QUEUE_SIZE: Final = 16 * 1024 * 1024
MAX_BUFFERS: Final = 64
MAX_MESSAGE: Final = 64 * 1024
MAX_PROCESS_QUEUES: Final = 64
CACHE_ALIGN: Final = 256
"""QUEUE_CACHE_ALIGN: where the CPU places each piece of a queue."""

PACKET_MESSAGE: Final = 0x01
PACKET_BUFFERS: Final = 0x02
PACKET_WAKEUP: Final = 0x04
PACKET_USER_READY: Final = 0x10

BUFFER_FLUSH_SENDER: Final = 0x10
BUFFER_INVALIDATE_RECIPIENT: Final = 0x80

U32: Final = struct.Struct("<I")
I32: Final = struct.Struct("<i")
U64: Final = struct.Struct("<Q")
RING: Final = struct.Struct("<IIII")  # queue_offset, queue_length, read/write state offsets
STATE: Final = struct.Struct("<III")  # position, packet_count, wait_count
BUFFER: Final = struct.Struct("<IIIIQ")  # fd, size, offset, flags, ptr
PACKET_HEADER_SIZE: Final = 8

WAIT_COUNT_OFFSET: Final = 8
PACKET_COUNT_OFFSET: Final = 4

PROCESS_STATE_SIZE: Final = 4 * MAX_PROCESS_QUEUES * 4
"""struct dspqueue_process_queue_state: four u32[64] arrays."""
REQ_PACKET_COUNT: Final = 0
REQ_SPACE_COUNT: Final = 1
RESP_PACKET_COUNT: Final = 2
RESP_SPACE_COUNT: Final = 3


class QueueError(Exception):
    """A queue the DSP cannot use, or a packet it refuses; ``code`` is the AEE result."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def align8(size: int) -> int:
    return (size + 7) & ~7


class QueueBuffer(NamedTuple):
    """struct dspqueue_buffer."""

    fd: int
    size: int
    offset: int
    flags: int
    ptr: int = 0


@dataclasses.dataclass(frozen=True)
class Packet:
    flags: int
    buffers: tuple[QueueBuffer, ...]
    message: bytes
    seq: int
    end: int
    """The read position after this packet."""


@dataclasses.dataclass(frozen=True)
class RingLayout:
    offset: int
    length: int
    read_state: int
    write_state: int


@dataclasses.dataclass(frozen=True)
class QueueHeader:
    version: int
    flags: int
    request: RingLayout
    response: RingLayout
    queue_count: int

    @property
    def wait_counts(self) -> bool:
        return bool(self.flags & FLAG_WAIT_COUNTS)


def read_header(memory: memoryview) -> QueueHeader:
    """The header of the queue in ``memory``; QueueError when it cannot hold one."""
    if len(memory) < HEADER_SIZE:
        raise QueueError(
            f"a queue of {len(memory)} bytes has no room for its header", AEE.EBADPARM.dsp
        )
    (version,) = U32.unpack_from(memory, VERSION_OFFSET)
    (flags,) = U32.unpack_from(memory, FLAGS_OFFSET)
    request = RingLayout(*RING.unpack_from(memory, REQUEST_OFFSET))
    response = RingLayout(*RING.unpack_from(memory, RESPONSE_OFFSET))
    (count,) = U32.unpack_from(memory, QUEUE_COUNT_OFFSET)
    return QueueHeader(version, flags, request, response, count)


def check_layout(header: QueueHeader, size: int) -> None:
    """QueueError (AEE_EBADPARM) unless both rings and their four states lie inside the
    ``size`` bytes of the queue, after the header, apart from each other, with positions
    the protocol can use (lengths multiples of 8, at least one packet header plus 8)."""
    pieces: list[tuple[int, int, str]] = [(0, HEADER_SIZE, "header")]
    for name, ring in (("request", header.request), ("response", header.response)):
        if ring.length % 8 or not 16 <= ring.length <= MAX_QUEUE_SIZE:
            raise QueueError(
                f"the {name} ring's length {ring.length} is not a multiple of 8 in"
                f" 16..{MAX_QUEUE_SIZE}",
                AEE.EBADPARM.dsp,
            )
        if ring.offset % 8 or ring.read_state % 4 or ring.write_state % 4:
            raise QueueError(f"the {name} ring's offsets are misaligned", AEE.EBADPARM.dsp)
        pieces += [
            (ring.offset, ring.length, f"{name} ring"),
            (ring.read_state, STATE.size, f"{name} read state"),
            (ring.write_state, STATE.size, f"{name} write state"),
        ]
    for start, length, what in pieces:
        if start + length > size:
            raise QueueError(f"the {what} lies outside the {size}-byte queue", AEE.EBADPARM.dsp)
    pieces.sort()
    for (start, length, what), (following, _, other) in itertools.pairwise(pieces):
        if start + length > following:
            raise QueueError(f"the {what} overlaps the {other}", AEE.EBADPARM.dsp)


def write_error(memory: memoryview, code: int) -> None:
    """Record ``code`` in the header's ``error`` field (the CPU library does not read it;
    the emulator's DSP writes why it stopped serving a queue)."""
    I32.pack_into(memory, ERROR_OFFSET, code - (1 << 32) if code & 0x8000_0000 else code)


class Ring:
    """One direction of a queue in ``memory`` (the whole queue buffer)."""

    def __init__(self, memory: memoryview, layout: RingLayout) -> None:
        self.length = layout.length
        self.data = memory[layout.offset : layout.offset + layout.length]
        self.read_state = memory[layout.read_state : layout.read_state + STATE.size]
        self.write_state = memory[layout.write_state : layout.write_state + STATE.size]

    def release(self) -> None:
        for view in (self.data, self.read_state, self.write_state):
            view.release()

    @property
    def read_position(self) -> int:
        return int(U32.unpack_from(self.read_state, 0)[0])

    @property
    def write_position(self) -> int:
        return int(U32.unpack_from(self.write_state, 0)[0])

    def available(self) -> int:
        """Bytes the reader may read."""
        read, write = self._positions()
        if read == write:
            return 0
        return write - read if write > read else self.length - read + write

    def space(self) -> int:
        """Bytes the writer may write (8 always stay free)."""
        read, write = self._positions()
        if read == write:
            return self.length - 8
        return self.length - write + read - 8 if write > read else read - write - 8

    def _positions(self) -> tuple[int, int]:
        read, write = self.read_position, self.write_position
        if read % 8 or write % 8 or read >= self.length or write >= self.length:
            raise QueueError(
                f"ring positions {read}/{write} are not 8-aligned positions of a"
                f" {self.length}-byte ring",
                AEE.EBADITEM.dsp,
            )
        return read, write

    @staticmethod
    def _count(state: memoryview, offset: int) -> int:
        return int(U32.unpack_from(state, offset)[0])

    @staticmethod
    def _bump(state: memoryview, offset: int, by: int = 1) -> int:
        value = (int(U32.unpack_from(state, offset)[0]) + by) & 0xFFFFFFFF
        U32.pack_into(state, offset, value)
        return value

    # -- the reader's side -----------------------------------------------------------------

    def peek(self) -> Packet | None:
        """The next packet, not consumed (:meth:`consume` it); None when there is none.
        QueueError (AEE_EBADITEM) for a packet the reader must refuse: a header whose
        length does not fit its buffers and flags, more than 64 buffers, no USER_READY,
        or a packet that reaches past what the writer published."""
        available = self.available()
        if available < PACKET_HEADER_SIZE:
            return None
        read = self.read_position
        (raw,) = U64.unpack_from(self.data, read)
        length = raw & 0xFFFFFFFF
        flags = (raw >> 32) & 0xFFFF
        count = (raw >> 48) & 0xFF if flags & PACKET_BUFFERS else 0
        seq = raw >> 56
        buffers_size = BUFFER.size * count
        if length < PACKET_HEADER_SIZE + buffers_size:
            raise QueueError(
                f"a packet of {length} bytes cannot hold {count} buffers", AEE.EBADITEM.dsp
            )
        if count > MAX_BUFFERS:
            raise QueueError(f"a packet with {count} buffers (at most 64)", AEE.EBADITEM.dsp)
        message_length = length - PACKET_HEADER_SIZE - buffers_size
        if message_length and not flags & PACKET_MESSAGE:
            raise QueueError(
                f"a packet of {length} bytes without the MESSAGE flag", AEE.EBADITEM.dsp
            )
        if message_length > MAX_MESSAGE:
            raise QueueError(f"a message of {message_length} bytes", AEE.EBADITEM.dsp)
        wrapped = self.length - read < length
        start = PACKET_HEADER_SIZE if wrapped else read + PACKET_HEADER_SIZE
        used = (self.length - read if wrapped else 0) + align8(length)
        if used > available:
            raise QueueError(
                f"a packet of {length} bytes at {read} reaches past the written data",
                AEE.EBADITEM.dsp,
            )
        if not flags & PACKET_USER_READY:
            raise QueueError("a packet without the USER_READY flag", AEE.EBADITEM.dsp)
        buffers = tuple(
            QueueBuffer(*BUFFER.unpack_from(self.data, start + BUFFER.size * index))
            for index in range(count)
        )
        message_start = start + buffers_size
        message = bytes(self.data[message_start : message_start + message_length])
        end = message_start + align8(message_length)
        return Packet(flags, buffers, message, seq, 0 if end >= self.length else end)

    def consume(self, packet: Packet) -> int:
        """Publish that ``packet`` was read; the reader's new packet count."""
        U32.pack_into(self.read_state, 0, packet.end)
        return self._bump(self.read_state, PACKET_COUNT_OFFSET)

    # -- the writer's side -------------------------------------------------------------------

    def write(self, flags: int, buffers: Sequence[QueueBuffer], message: bytes, seq: int) -> bool:
        """Write a packet (USER_READY, and BUFFERS / MESSAGE as they are present, are set
        here); False when it does not fit now. QueueError (AEE_EBADPARM) for a packet that
        can never fit, more than 64 buffers or a message above 64 KiB."""
        if len(buffers) > MAX_BUFFERS or len(message) > MAX_MESSAGE:
            raise QueueError(
                f"{len(buffers)} buffers and {len(message)} message bytes", AEE.EBADPARM.dsp
            )
        length = PACKET_HEADER_SIZE + BUFFER.size * len(buffers) + len(message)
        size = align8(length)
        if size > self.length - 8:
            raise QueueError(
                f"a packet of {length} bytes never fits a {self.length}-byte ring",
                AEE.EBADPARM.dsp,
            )
        space = self.space()
        write = self.write_position
        if space < size:
            return False
        wrapped = self.length - write < size
        if wrapped and space - (self.length - write) < size:
            return False
        flags = (flags & ~(PACKET_BUFFERS | PACKET_MESSAGE)) | PACKET_USER_READY
        if buffers:
            flags |= PACKET_BUFFERS
        if message:
            flags |= PACKET_MESSAGE
        raw = length | (flags & 0xFFFF) << 32 | (len(buffers) & 0xFF) << 48 | (seq & 0xFF) << 56
        U64.pack_into(self.data, write, raw)
        position = write + PACKET_HEADER_SIZE
        if wrapped:
            U64.pack_into(self.data, 0, raw)  # the replica the reader starts from
            position = PACKET_HEADER_SIZE
        elif position >= self.length:
            position = 0
        for buffer in buffers:
            BUFFER.pack_into(self.data, position, *buffer)
            position += BUFFER.size
        if message:
            self.data[position : position + len(message)] = message
            position += align8(len(message))
        if position >= self.length:
            position = 0
        U32.pack_into(self.write_state, 0, position)
        self._bump(self.write_state, PACKET_COUNT_OFFSET)
        return True

    # -- wait counts -------------------------------------------------------------------------

    def reader_waits(self) -> int:
        return self._count(self.read_state, WAIT_COUNT_OFFSET)

    def writer_waits(self) -> int:
        return self._count(self.write_state, WAIT_COUNT_OFFSET)

    def set_reader_waits(self, value: int) -> None:
        U32.pack_into(self.read_state, WAIT_COUNT_OFFSET, value)

    def add_writer_wait(self, by: int) -> None:
        self._bump(self.write_state, WAIT_COUNT_OFFSET, by)


class ProcessState:
    """struct dspqueue_process_queue_state in ``memory``: what the CPU's signal threads
    compare after a signal (the DSP writes ``req_space_count`` and ``resp_packet_count``)."""

    def __init__(self, memory: memoryview) -> None:
        if len(memory) < PROCESS_STATE_SIZE:
            raise QueueError(
                f"a process state block of {len(memory)} bytes (needs {PROCESS_STATE_SIZE})",
                AEE.EBADPARM.dsp,
            )
        self.memory = memory[:PROCESS_STATE_SIZE]

    def release(self) -> None:
        self.memory.release()

    def _offset(self, array: int, queue: int) -> int:
        return (array * MAX_PROCESS_QUEUES + queue) * 4

    def get(self, array: int, queue: int) -> int:
        return int(U32.unpack_from(self.memory, self._offset(array, queue))[0])

    def set(self, array: int, queue: int, value: int) -> None:
        U32.pack_into(self.memory, self._offset(array, queue), value & 0xFFFFFFFF)

    def bump(self, array: int, queue: int) -> int:
        value = (self.get(array, queue) + 1) & 0xFFFFFFFF
        self.set(array, queue, value)
        return value
