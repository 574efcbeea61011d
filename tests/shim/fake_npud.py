"""A scripted npud on a socket, for what the real one never sends (bad frames, values
a device answers): the library under test meets it as it meets npud.

It welcomes every Hello with a Welcome made of ``dsp`` (keys of the wire's
DspCapabilities), then answers each request with ``answer(request)``: a list of
(message map, fds to send with it) frames, the request's id filled in where the
map has none. The fds given are sent and closed here.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from npu_protocol._framing import encode_frame_header

Frame = tuple[dict[str, Any], list[int]]
Answer = Callable[[dict[str, Any]], list[Frame]]

HEADER = 8


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _read(conn: socket.socket) -> dict[str, Any]:
    header = _recv_exact(conn, HEADER)
    length = int.from_bytes(header[4:8], "little")
    message = msgspec.msgpack.decode(_recv_exact(conn, length))
    assert isinstance(message, dict)
    return message


def _send(conn: socket.socket, message: Mapping[str, Any], fds: list[int]) -> None:
    payload = msgspec.msgpack.encode(dict(message))
    frame = encode_frame_header(len(payload), len(fds)) + payload
    ancillary = (
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    )
    conn.sendmsg([frame], ancillary)


def welcome(dsp: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "welcome",
        "server_version": "0.0-fake",
        "protocol_version": 6,
        "backend": "emulator",
        "dsp": {"domain": "cdsp", **dsp},
        "limits": {
            "priority": "normal",
            "max_frame_size": 1048576,
            "max_in_flight": 64,
            "max_inline_bytes": 983040,
        },
        "epoch": 1,
        "domain": "fake",
    }


def _serve_one(conn: socket.socket, dsp: Mapping[str, Any], answer: Answer) -> None:
    with conn:
        try:
            _read(conn)  # the Hello
            _send(conn, welcome(dsp), [])
            while True:
                request = _read(conn)
                for message, fds in answer(request):
                    try:
                        _send(conn, {"id": request.get("id"), **message}, fds)
                    finally:
                        for fd in fds:
                            os.close(fd)
        except (EOFError, ConnectionError, OSError):
            return


@contextlib.contextmanager
def fake_npud(path: Path, answer: Answer, dsp: Mapping[str, Any] | None = None) -> Iterator[Path]:
    """Serve ``path`` in a thread (one connection at a time) for the block's duration."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    server.settimeout(0.1)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            _serve_one(conn, dsp or {}, answer)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()
