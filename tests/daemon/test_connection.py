"""The daemon's connection handler in process: deadlines and limits a peer cannot dodge."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
import trio

import npu_protocol as p
from npud.daemon.broker import Broker
from npud.daemon.connection import PeerConnection
from npud.ops.backend import select_profile
from npud.ops.config import parse_config
from npud.requests.clients import Client


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    config = parse_config("[backend]\nkind = 'emulator'\n[daemon]\nhello_timeout_s = 0.2\n")
    b = Broker(config, select_profile(config))
    try:
        await b.start()
        async with trio.open_nursery() as nursery:
            b.attach(nursery)
            yield b
            nursery.cancel_scope.cancel()
    finally:
        await b.close(grace=5)


async def test_a_peer_that_never_says_hello_is_closed(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    conn = PeerConnection(broker, ours, Client(pid=1, uid=0, gid=0))
    with trio.fail_after(10):
        await conn.serve()  # returns by itself once the deadline passes
    theirs.setblocking(False)
    assert theirs.recv(100) == b""  # closed on the peer
    theirs.close()


async def test_a_welcomed_peer_is_not_cut_by_the_hello_deadline(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    conn = PeerConnection(broker, ours, Client(pid=1, uid=0, gid=0))
    peer = p.ClientConnection()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.serve)
        peer_sock = trio.socket.from_stdlib_socket(theirs)
        data, _ = peer.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="prompt"))
        await peer_sock.send(data)
        peer.receive_data(await peer_sock.recv(65536))
        assert isinstance(peer.next_event(), p.Welcome)
        await trio.sleep(0.5)  # past the deadline: still served
        data, _ = peer.send(p.PingRequest(id=peer.next_request_id(), payload=b"hi"))
        await peer_sock.send(data)
        peer.receive_data(await peer_sock.recv(65536))
        assert peer.next_event() == p.PongReply(id=0, payload=b"hi")
        peer_sock.close()
