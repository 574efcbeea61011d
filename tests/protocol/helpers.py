"""Two real connections wired together in memory (no sockets, no mocks).

Fds are plain integers here: the protocol never touches them, it only says
which frame they belong to, so any number stands for an fd.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

import npu_protocol as p

WELCOME: Final = p.Welcome(
    server_version="0.1.0",
    protocol_version=p.PROTOCOL_VERSION,
    backend="emulator",
    dsp=p.DspCapabilities(arch_ver=0x73),
    limits=p.ClientLimits(priority=p.Priority.NORMAL, max_in_flight=8),
    epoch=1,
)

AnyConnection = p.Connection[Any, Any]


def daemon_status(*clients: p.ClientRow) -> p.DaemonStatus:
    """A daemon's status with ``clients`` as its client rows, the rest fixed."""
    return p.DaemonStatus(
        daemon_version="0.1.0",
        uptime_ms=5,
        backend="emulator",
        device="/dev/fastrpc-cdsp",
        dsp=p.DspCapabilities(),
        shell=p.ShellStatus(verified=True, sha256="ab" * 32),
        epoch=1,
        clients=clients,
    )


Event = p.Message | p.StrayFds | p.ConnectionClosed | p.NeedData


def chunks(data: bytes | bytearray, size: int | None) -> Iterator[bytes | bytearray]:
    """``data`` in pieces of ``size`` bytes (all of it at once for None)."""
    if size is None:
        yield data
        return
    for start in range(0, len(data), size):
        yield data[start : start + size]


def feed(
    receiver: AnyConnection,
    data: bytes | bytearray,
    fds: Sequence[int] = (),
    chunk: int | None = None,
) -> None:
    """Deliver one sendmsg's worth: the fds ride with the first chunk, as on a socket."""
    pending = list(fds)
    for piece in chunks(data, chunk):
        receiver.receive_data(piece, pending)
        pending = []


def drain(receiver: AnyConnection) -> list[Event]:
    """Every event up to NEED_DATA or ConnectionClosed (which is included)."""
    events: list[Event] = []
    while True:
        event = receiver.next_event()
        if event is p.NEED_DATA:
            return events
        events.append(event)
        if isinstance(event, p.ConnectionClosed):
            return events


def transfer(
    sender: AnyConnection,
    receiver: AnyConnection,
    message: p.Message,
    chunk: int | None = None,
) -> p.Message:
    """Send one message across and return what the receiver made of it."""
    data, fds = sender.send(message)
    feed(receiver, data, fds, chunk)
    events = drain(receiver)
    assert len(events) == 1, events
    [event] = events
    assert isinstance(event, p.Message), event
    return event


def connected_pair(
    welcome: p.Welcome = WELCOME, chunk: int | None = None
) -> tuple[p.ClientConnection, p.ServerConnection]:
    """A client and a server that have finished the handshake."""
    client, server = p.ClientConnection(), p.ServerConnection()
    transfer(
        client,
        server,
        p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="test-client"),
        chunk,
    )
    transfer(server, client, welcome, chunk)
    assert client.state is server.state is p.ConnectionState.READY
    return client, server


def frame(payload: bytes, fd_count: int = 0, *, magic: bytes = b"NP", reserved: int = 0) -> bytes:
    """A hand-built frame, for feeding a connection bytes its own send() would refuse."""
    header = magic + bytes([fd_count, reserved]) + len(payload).to_bytes(4, "little")
    return header + payload
