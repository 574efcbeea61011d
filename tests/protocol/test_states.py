"""Every (state, message kind) pair of the state machine's tables, through real
connections: what the table says is what a connection does (PROTOCOL.md section 5)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

import npu_protocol as p
from npu_protocol import ConnectionState, ErrorCode
from npu_protocol._states import (
    CLIENT_RECEIVES,
    CLIENT_SENDS,
    CLIENT_SENDS_KINDS,
    SERVER_RECEIVES,
    SERVER_SENDS,
    SERVER_SENDS_KINDS,
    TALKING,
    Kind,
    Move,
    Table,
    kind_of,
)
from tests.protocol.helpers import WELCOME, connected_pair, drain, feed, frame

HELLO = p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="states")
SAMPLES: dict[Kind, p.Message] = {
    Kind.HELLO: HELLO,
    Kind.WELCOME: WELCOME,
    Kind.REQUEST: p.PingRequest(id=8),
    Kind.ANSWER: p.PongReply(id=7),  # the ping that each READY connection has in flight
    Kind.NOTICE: p.ShuttingDown(reason="states"),
    Kind.FAREWELL: p.ErrorMessage.for_code(ErrorCode.NOT_PERMITTED, detail="states"),
}


def client_in(state: ConnectionState) -> p.ClientConnection:
    if state is ConnectionState.READY:
        client = connected_pair()[0]
        client.send(p.PingRequest(id=7))
        return client
    client = p.ClientConnection()
    if state is ConnectionState.HANDSHAKE:
        client.send(HELLO)
    return client


def server_in(state: ConnectionState) -> p.ServerConnection:
    if state is ConnectionState.READY:
        server = connected_pair()[1]
        feed(server, frame(msgspec.msgpack.encode(p.PingRequest(id=7))))
        drain(server)
        return server
    server = p.ServerConnection()
    if state is ConnectionState.HANDSHAKE:
        feed(server, frame(msgspec.msgpack.encode(HELLO)))
        drain(server)
    return server


Make = Callable[[ConnectionState], p.ClientConnection | p.ServerConnection]
TABLES: list[tuple[str, Table, tuple[Kind, ...], Make]] = [
    ("client sends", CLIENT_SENDS, CLIENT_SENDS_KINDS, client_in),
    ("client receives", CLIENT_RECEIVES, SERVER_SENDS_KINDS, client_in),
    ("server sends", SERVER_SENDS, SERVER_SENDS_KINDS, server_in),
    ("server receives", SERVER_RECEIVES, CLIENT_SENDS_KINDS, server_in),
]
PAIRS = [
    (name, state, kind, table[state, kind], make)
    for name, table, kinds, make in TABLES
    for state in TALKING
    for kind in kinds
]


def test_every_table_covers_every_state_and_kind_of_its_direction() -> None:
    for name, table, kinds, _ in TABLES:
        assert set(table) == {(s, k) for s in TALKING for k in kinds}, name


def test_the_samples_are_of_their_kind() -> None:
    assert all(kind_of(message) is kind for kind, message in SAMPLES.items())


@pytest.mark.parametrize(
    ("name", "state", "kind", "move", "make"),
    PAIRS,
    ids=[f"{name}-{state.value}-{kind.value}" for name, state, kind, _, _ in PAIRS],
)
def test_the_connection_does_what_its_table_says(
    name: str, state: ConnectionState, kind: Kind, move: Move, make: Make
) -> None:
    connection = make(state)
    assert connection.state is state
    message = SAMPLES[kind]
    if name.endswith("sends"):
        if isinstance(move, str):
            with pytest.raises(p.LocalProtocolError) as refused:
                connection.send(message)  # type: ignore[arg-type]
            assert refused.value.code is ErrorCode.UNEXPECTED_MESSAGE
            assert move in str(refused.value)
            assert connection.state is state  # a refused send changes nothing
        else:
            connection.send(message)  # type: ignore[arg-type]
            assert connection.state is move
        return
    feed(connection, frame(msgspec.msgpack.encode(message)))
    if isinstance(move, str):
        with pytest.raises(p.RemoteProtocolError) as broken:
            drain(connection)
        assert broken.value.code is ErrorCode.UNEXPECTED_MESSAGE
        assert move in str(broken.value)
        assert connection.state is ConnectionState.ERROR
    else:
        closing = [p.ConnectionClosed()] if move is ConnectionState.CLOSED else []
        assert drain(connection) == [message, *closing]
        assert connection.state is move
