"""The far end of bench/transfer.py's baseline: 16 MiB through a plain Unix socket, no npud.

``python -m bench.unix_sink SOCKET`` connects to SOCKET and then, for every frame it
receives (a little-endian u32 length, then that many bytes, received into one buffer
it reuses), answers with the frame's first 64 bytes: what the echo skel sends back in
the subject. It exits when the other end closes.
"""

from __future__ import annotations

import socket
import struct
import sys
from typing import Final

HEADER: Final = struct.Struct("<I")
ECHOED: Final = 64
CAPACITY: Final = 64 * 1024 * 1024


def _receive_exactly(sock: socket.socket, into: memoryview) -> bool:
    """Fill ``into``; False if the peer closed first."""
    while into:
        received = sock.recv_into(into)
        if received == 0:
            return False
        into = into[received:]
    return True


def serve(sock: socket.socket) -> None:
    frame = memoryview(bytearray(CAPACITY))
    header = memoryview(bytearray(HEADER.size))
    while _receive_exactly(sock, header):
        (length,) = HEADER.unpack(header)
        if length > CAPACITY or not _receive_exactly(sock, frame[:length]):
            return
        sock.sendall(frame[: min(ECHOED, length)])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench.unix_sink SOCKET", file=sys.stderr)
        return 2
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(argv[1])
        serve(sock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
