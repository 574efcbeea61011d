"""A real daemon in this process and a raw protocol peer for it, for tests of the wire.

``serve_daemon`` runs ``npud.daemon.server.Daemon`` on the emulator inside the test's
trio run, bound to a temporary socket. ``RawPeer`` speaks the protocol through
``npu_protocol.ClientConnection`` and lets a test put several frames into one
write, which the client library never does on purpose.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import trio

import npu_protocol as p
from npu_client.transport import ANCILLARY_SPACE, parse_ancillary
from npud.daemon.broker import Broker
from npud.daemon.server import Daemon, bind_socket
from npud.ops.backend import select_profile
from npud.ops.config import parse_config

ECHO_URI: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI: Final = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"


@asynccontextmanager
async def serve_daemon(tmp: Path, config: str = "") -> AsyncIterator[Daemon]:
    """npud on the emulator, serving ``tmp/npud.sock`` until the block ends."""
    parsed = parse_config("[backend]\nkind = 'emulator'\n" + config)
    bound = bind_socket(tmp / "npud.sock", 0o600, "")
    daemon = Daemon(parsed, Broker(parsed, select_profile(parsed)), bound.sock)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.stop()
    bound.sock.close()


SETTLE_SECONDS: Final = 10.0
"""How long :func:`settle` waits for a condition before it fails the test."""


async def settle(condition: Callable[[], bool], what: Callable[[], str]) -> None:
    """Poll ``condition`` until it holds; the test fails with ``what()`` (the state then)
    if it does not within :data:`SETTLE_SECONDS` (a bound for a loaded machine, not a
    speed check)."""
    try:
        with trio.fail_after(SETTLE_SECONDS):
            while not condition():
                await trio.sleep(0.01)
    except trio.TooSlowError:
        raise AssertionError(f"not settled within {SETTLE_SECONDS:g} s: {what()}") from None


async def connections_ended(daemon: Daemon, remaining: int) -> None:
    """Wait until the daemon serves ``remaining`` connections and no peer's fd waits to be
    closed: every other connection has ended (its client's holdings let go on the
    domain's lane, its socket closed) and the closer threads have closed what the peers
    sent. A client's row and the status totals go before that (npud.daemon.broker.release_client
    drops the client first), so an fd count taken when the totals settle can still see
    the departed client's socket and model arena."""
    closer = daemon.broker.device.peer_fds
    await settle(
        lambda: daemon.connections == remaining and closer.pending() == 0,
        lambda: (
            f"{daemon.connections} connections (expected {remaining}),"
            f" {closer.pending()} peer fds waiting to be closed"
        ),
    )


class RawPeer:
    """A client made of the sans-IO protocol and a socket, nothing else."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.protocol = p.ClientConnection()
        self.events: list[p.ServerMessage] = []
        self.fds: list[int] = []
        self.welcome: p.Welcome | None = None

    @classmethod
    async def connect(
        cls, path: Path, name: str = "raw-peer", version: int | None = p.PROTOCOL_VERSION
    ) -> RawPeer:
        """Connected and welcomed; ``version`` None sends a hello without the key."""
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(str(path))
        peer = cls(sock)
        hello = p.Hello(client_name=name)
        if version is not None:
            hello = p.Hello(protocol_version=version, client_name=name)
        await peer.write(hello)
        welcome = await peer.next()
        assert isinstance(welcome, p.Welcome), welcome
        peer.welcome = welcome
        return peer

    async def write(self, *messages: p.ClientMessage) -> None:
        """All ``messages`` in one write, so the daemon reads them together."""
        view = memoryview(b"".join(self.protocol.send(m)[0] for m in messages))
        while view:
            view = view[await self.sock.send(view) :]

    async def next(self) -> p.ServerMessage:
        while True:
            event = self.protocol.next_event()
            if isinstance(event, p.StrayFds):
                continue
            if event is not p.NEED_DATA:
                assert not isinstance(event, p.ConnectionClosed), "the daemon closed"
                return event
            data, ancdata, flags, _ = await self.sock.recvmsg(1 << 20, ANCILLARY_SPACE)
            fds = [fd.detach() for fd in parse_ancillary(ancdata, flags)]
            self.fds.extend(fds)
            self.protocol.receive_data(data, fds)

    async def answers(self, count: int) -> list[p.ServerMessage]:
        """The next ``count`` answers in the order they arrived."""
        return [await self.next() for _ in range(count)]

    def close(self) -> None:
        import os

        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        self.sock.close()


def busy(request_id: int, handle: int, micros: int) -> p.InvokeRequest:
    """npu_test.busy: blocks on the DSP for ``micros``."""
    return p.InvokeRequest(
        id=request_id,
        handle=handle,
        method=4,
        inputs=(p.InlineInput(data=struct.pack("<I", micros)),),
    )


def echo_slice(request_id: int, handle: int, buffer: int, length: int) -> p.InvokeRequest:
    """echo of ``length`` bytes of ``buffer`` (a slice) into an inline output."""
    return p.InvokeRequest(
        id=request_id,
        handle=handle,
        method=2,
        inputs=(
            p.InlineInput(data=struct.pack("<II", length, length)),
            p.BufferSlice(buffer=buffer, offset=0, length=length),
        ),
        outputs=(p.InlineOutput(capacity=length),),
    )
