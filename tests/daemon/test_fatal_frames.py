"""Every fatal frame closes its connection (PROTOCOL.md section 1: the receiver stops
reading, sends one ``error`` without id naming the violation, and closes), before the
Hello (the handshake) and after it (the data path). Issue 27's review counted two
fatal frames that left their connection open; each kind is checked here."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import msgspec
import pytest
import trio

import npu_protocol as p
from npu_client.transport import fds_ancillary
from npu_protocol import ErrorCode
from tests.daemon.wire import serve_daemon

CLOSE_WITHIN: Final = 10.0
"""Seconds after which a connection still open fails the test (it would stay open)."""


def frame(payload: bytes, fd_count: int = 0) -> bytes:
    return b"NP" + bytes([fd_count, 0]) + struct.pack("<I", len(payload)) + payload


def message(**fields: object) -> bytes:
    return msgspec.msgpack.encode(fields)


PING: Final = message(type="ping", id=1)
Send = Callable[[trio.socket.SocketType], Awaitable[object]]


def plain(data: bytes) -> Send:
    async def send(sock: trio.socket.SocketType) -> None:
        await sock.sendmsg([data])

    return send


def with_fds(data: bytes, count: int) -> Send:
    async def send(sock: trio.socket.SocketType) -> None:
        fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(count)]
        try:
            await sock.sendmsg([data], fds_ancillary(fds))
        finally:
            for fd in fds:
                os.close(fd)

    return send


FATAL: Final[dict[str, tuple[Send, ErrorCode]]] = {
    "bad magic": (plain(b"XX\x00\x00" + struct.pack("<I", 4) + b"abcd"), ErrorCode.BAD_FRAME_HEADER),
    "reserved byte": (plain(b"NP\x00\x01" + struct.pack("<I", 1) + b"\x80"), ErrorCode.BAD_FRAME_HEADER),
    "empty payload": (plain(frame(b"")), ErrorCode.BAD_FRAME_HEADER),
    "too many fds": (plain(b"NP\xff\x00" + struct.pack("<I", 1) + b"\x80"), ErrorCode.TOO_MANY_FDS),
    "too large": (plain(b"NP\x00\x00" + struct.pack("<I", 1 << 30)), ErrorCode.FRAME_TOO_LARGE),
    "not msgpack": (plain(frame(b"\xc1")), ErrorCode.BAD_MESSAGE),
    "not a map": (plain(frame(msgspec.msgpack.encode([1, 2]))), ErrorCode.BAD_MESSAGE),
    "unknown type": (plain(frame(message(type="format_me"))), ErrorCode.BAD_MESSAGE),
    "repeated key": (plain(frame(b"\x83\xa4type\xa4ping\xa2id\x01\xa2id\x02")), ErrorCode.BAD_MESSAGE),
    "id of the wrong type": (plain(frame(b"\x82\xa4type\xa4ping\xa2id\xcb" + bytes(8))), ErrorCode.BAD_MESSAGE),
    "server's message": (plain(frame(message(type="welcome", epoch=1))), ErrorCode.UNEXPECTED_MESSAGE),
    "missing fds": (plain(frame(PING, fd_count=1)), ErrorCode.MISSING_FDS),
    "fds the message does not carry": (with_fds(frame(PING, fd_count=1), 1), ErrorCode.FD_COUNT_MISMATCH),
}  # fmt: skip


async def _outcome(sock: trio.socket.SocketType) -> tuple[list[p.ErrorMessage], bool]:
    """The errors the daemon sends until it closes; whether it closed in time."""
    received = b""
    with trio.move_on_after(CLOSE_WITHIN):
        while chunk := await sock.recv(65536):
            received += chunk
        return _errors(received), True
    return _errors(received), False


def _errors(data: bytes) -> list[p.ErrorMessage]:
    """The ``error`` frames in ``data``, parsed apart from any state machine."""
    messages: list[p.ErrorMessage] = []
    view = memoryview(data)
    while len(view) >= 8:
        (length,) = struct.unpack_from("<I", view, 4)
        payload = bytes(view[8 : 8 + length])
        view = view[8 + length :]
        decoded = msgspec.msgpack.decode(payload)
        if isinstance(decoded, dict) and decoded.get("type") == "error":
            messages.append(msgspec.convert(decoded, p.ErrorMessage))
    return messages


@pytest.mark.parametrize("phase", ["before hello", "after hello"])
@pytest.mark.parametrize("kind", list(FATAL))
async def test_a_fatal_frame_is_answered_once_and_closes_the_connection(
    tmp_path: Path, kind: str, phase: str
) -> None:
    send, code = FATAL[kind]
    async with serve_daemon(tmp_path):
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(str(tmp_path / "npud.sock"))
        try:
            if phase == "after hello":
                hello, _ = p.ClientConnection().send(
                    p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="fatal")
                )
                await sock.send(hello)
                welcome = await sock.recv(65536)
                assert welcome
            await send(sock)
            errors, closed = await _outcome(sock)
        finally:
            sock.close()
    assert closed, f"{kind} ({phase}): the connection stayed open"
    assert [error.error_code for error in errors if error.id is None] == [code]
