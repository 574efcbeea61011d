"""The same-work floor served through shared memory instead of the socket: the trial of
issue 22's shared-memory call path (see bench/ring_trial.py, which measures it).

A client connects to the Unix socket and sends, with one byte, three fds
(SCM_RIGHTS): a memfd of two slots (requests at offset 0, replies at ``SLOT``) and
two eventfds (request ready, reply ready). From then on every frame, the hello
included, travels through the slots: the writer puts a little-endian u32 length
and the frame's bytes (exactly the bytes the socket would carry) in its slot and
adds one to its eventfd; the reader blocks in ``read`` on that eventfd, then takes
the frame. A length of zero ends the connection. The decoding, the
``FastRpcSession.invoke`` on the emulator and the encoding are the same-work
floor's own (bench/same_work_server.py), so a difference between the two is the
transport's alone.

One slot per direction is enough for one call at a time, which is what the trial
times; a ring deeper than one changes what can be pipelined, not the latency of a
call.

Run as ``python -m bench.ring_server SOCKET``; it serves until killed. (A benchmark
prototype, not a daemon: no limits, no error handling beyond answering an error.)
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import sys
from typing import Final

import npu_protocol as p
from bench.same_work_server import _answer, open_session, serve_forever
from npu_client.transport import ANCILLARY_SPACE, parse_ancillary
from npud.fastrpc.session import FastRpcSession

SLOT: Final = 1 << 20
"""Bytes per direction: the largest frame (1 MiB) and its length."""
LENGTH: Final = struct.Struct("<I")
ONE: Final = (1).to_bytes(8, sys.byteorder)


class Slots:
    """The shared memory and the two eventfds of one connection; closes all three."""

    def __init__(self, memfd: int, requests: int, replies: int) -> None:
        self.memory = mmap.mmap(memfd, 2 * SLOT)
        os.close(memfd)  # the mapping keeps the memory
        self.requests = requests
        self.replies = replies

    def close(self) -> None:
        self.memory.close()
        os.close(self.requests)
        os.close(self.replies)


def put(memory: mmap.mmap, offset: int, frame: bytes, eventfd: int) -> None:
    """Write ``frame`` into the slot at ``offset`` and wake its reader."""
    if len(frame) > SLOT - LENGTH.size:
        raise ValueError(f"a frame of {len(frame)} bytes does not fit a slot")
    LENGTH.pack_into(memory, offset, len(frame))
    memory[offset + LENGTH.size : offset + LENGTH.size + len(frame)] = frame
    os.write(eventfd, ONE)


def take(memory: mmap.mmap, offset: int, eventfd: int) -> bytes:
    """Block until the slot at ``offset`` is written; its frame (empty: the end)."""
    os.read(eventfd, 8)
    (length,) = LENGTH.unpack_from(memory, offset)
    return memory[offset + LENGTH.size : offset + LENGTH.size + length]


def serve(sock: socket.socket, session: FastRpcSession) -> None:
    with sock:
        _, ancdata, flags, _ = sock.recvmsg(1, ANCILLARY_SPACE)
        fds = [fd.detach() for fd in parse_ancillary(ancdata, flags)]
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return
    slots = Slots(*fds)
    conn = p.ServerConnection()
    handles: dict[int, int] = {}
    try:
        while True:
            frame = take(slots.memory, 0, slots.requests)
            if not frame:
                return
            conn.receive_data(frame)
            while True:
                event = conn.next_event()
                if event is p.NEED_DATA or isinstance(event, p.ConnectionClosed):
                    break
                reply = _answer(event, session, handles)
                if reply is not None:
                    out, _ = conn.send(reply)
                    put(slots.memory, SLOT, out, slots.replies)
    finally:
        slots.close()


def main(argv: list[str]) -> None:
    serve_forever(argv[0], open_session(0), serve)


if __name__ == "__main__":
    main(sys.argv[1:])
