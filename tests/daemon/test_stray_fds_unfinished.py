"""Fds sent with every byte of a frame that never ends (issue 27): 4 on each byte took
npud to 16,383 of its 16,384 fds, because a frame's fds were held until the frame ended
and ``max_fds_waiting`` never saw them. Now they are stray as they come: closed off
the shared threads and counted against the sender's ``max_fds_waiting``, so what npud
holds for such a peer stays bounded, before its Hello and after it."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Final

import pytest
import trio

import npu_protocol as p
from npu_client.transport import fds_ancillary
from tests.daemon.wire import serve_daemon

BYTES: Final = 500
FDS_PER_BYTE: Final = p.MAX_FDS_PER_FRAME
MAX_FDS_WAITING: Final = 64
CONFIG: Final = (
    # The frame and the Hello never time out here: the bound alone must hold.
    "[daemon]\nframe_timeout_s = 600\nhello_timeout_s = 600\n"
    f"[uid_limits]\nmax_fds_waiting = {MAX_FDS_WAITING}\n"
)
BOUND: Final = MAX_FDS_WAITING + 8 * FDS_PER_BYTE + 16
"""What npud may hold beyond its own fds: the fds waiting to be closed, those of the
first bytes of one frame, and slack for its own (a log, a thread's)."""


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _attack(sock: trio.socket.SocketType) -> bool:
    """The header of a frame of ``2 * BYTES`` bytes, then ``BYTES`` of it one at a time, each with
    ``FDS_PER_BYTE`` fds; False when npud closed the connection first."""
    header = b"NP\x00\x00" + struct.pack("<I", 2 * BYTES)
    await sock.send(header)
    for _ in range(BYTES):
        fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(FDS_PER_BYTE)]
        try:
            await sock.sendmsg([b"\x80"], fds_ancillary(fds))
        except OSError:  # EPIPE, ECONNRESET: dropped, as the bound says
            return False
        finally:
            for fd in fds:
                os.close(fd)
    return True


@pytest.mark.parametrize("phase", ["before hello", "after hello"])
async def test_fds_on_every_byte_of_an_unfinished_frame_stay_bounded(
    tmp_path: Path, phase: str
) -> None:
    async with serve_daemon(tmp_path, CONFIG):
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(str(tmp_path / "npud.sock"))
        try:
            if phase == "after hello":
                hello, _ = p.ClientConnection().send(
                    p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="strayfds")
                )
                await sock.send(hello)
                assert await sock.recv(65536)
            baseline = open_fds()  # the test's socket included
            await _attack(sock)
            # The closer thread closes what waits; give it the time it needs.
            held = open_fds() - baseline
            with trio.move_on_after(20):
                while held > BOUND:
                    await trio.sleep(0.05)
                    held = open_fds() - baseline
            # Before the fix: all BYTES * FDS_PER_BYTE (2,000) held until the frame ends.
            assert held <= BOUND, f"npud holds {held} fds more than before the attack"
        finally:
            sock.close()
