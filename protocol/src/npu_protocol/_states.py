"""The connection's state machine as one table (PROTOCOL.md section 5, "States").

Each side sends and receives a few kinds of message (:class:`Kind`). For every
state a side can be in while it still talks (START, HANDSHAKE, READY) and every
kind it may send or receive, the table gives the next state, or the reason the
message is not allowed there. The connection classes consult it and keep only
the bookkeeping a state cannot hold (request ids, versions, limits). CLOSED and
ERROR are not in the table: nothing is sent there (CONNECTION_CLOSED) but a
server's last ErrorMessage without id, and the half-close's answers, which the
server checks itself.

``tests/protocol/test_states.py`` walks every (state, kind) pair of each table
through real connections.
"""

from __future__ import annotations

import enum
from typing import Final

from npu_protocol._events import ConnectionState
from npu_protocol._messages import ErrorMessage, Hello, Message, Reply, Request, Welcome


class Kind(enum.Enum):
    """What a message is to the state machine."""

    HELLO = "hello"
    WELCOME = "welcome"
    REQUEST = "request"
    ANSWER = "answer"  # a reply, or an ErrorMessage with the id of a request
    NOTICE = "notice"  # an event: session_restarted, shutting_down
    FAREWELL = "farewell"  # an ErrorMessage without id: the sender closes


def kind_of(message: Message) -> Kind:
    if isinstance(message, Hello):
        return Kind.HELLO
    if isinstance(message, Welcome):
        return Kind.WELCOME
    if isinstance(message, Request):
        return Kind.REQUEST
    if isinstance(message, ErrorMessage):
        return Kind.FAREWELL if message.id is None else Kind.ANSWER
    if isinstance(message, Reply):
        return Kind.ANSWER
    return Kind.NOTICE


Move = ConnectionState | str
"""The next state, or why the message is not allowed in this state."""
Table = dict[tuple[ConnectionState, Kind], Move]

START, HANDSHAKE, READY, CLOSED = (
    ConnectionState.START,
    ConnectionState.HANDSHAKE,
    ConnectionState.READY,
    ConnectionState.CLOSED,
)
TALKING: Final = (START, HANDSHAKE, READY)
CLIENT_SENDS_KINDS: Final = (Kind.HELLO, Kind.REQUEST)
SERVER_SENDS_KINDS: Final = (Kind.WELCOME, Kind.ANSWER, Kind.NOTICE, Kind.FAREWELL)

CLIENT_SENDS: Final[Table] = {
    (START, Kind.HELLO): HANDSHAKE,
    (START, Kind.REQUEST): "requests wait for the Welcome",
    (HANDSHAKE, Kind.HELLO): "the Hello was already sent",
    (HANDSHAKE, Kind.REQUEST): "requests wait for the Welcome",
    (READY, Kind.HELLO): "the Hello was already sent",
    (READY, Kind.REQUEST): READY,
}
CLIENT_RECEIVES: Final[Table] = {
    **{(START, kind): "the server spoke before the Hello" for kind in SERVER_SENDS_KINDS},
    (HANDSHAKE, Kind.WELCOME): READY,
    (HANDSHAKE, Kind.ANSWER): "the handshake is not finished",
    (HANDSHAKE, Kind.NOTICE): "the handshake is not finished",
    (HANDSHAKE, Kind.FAREWELL): CLOSED,  # the server refused the Hello
    (READY, Kind.WELCOME): "the handshake is over",
    (READY, Kind.ANSWER): READY,
    (READY, Kind.NOTICE): READY,
    (READY, Kind.FAREWELL): CLOSED,  # the server is closing the connection
}
SERVER_SENDS: Final[Table] = {
    (START, Kind.WELCOME): "no Hello has arrived",
    (START, Kind.ANSWER): "the Welcome has not been sent",
    (START, Kind.NOTICE): "the Welcome has not been sent",
    (START, Kind.FAREWELL): CLOSED,  # refusing a peer before its Hello
    (HANDSHAKE, Kind.WELCOME): READY,
    (HANDSHAKE, Kind.ANSWER): "the Welcome has not been sent",
    (HANDSHAKE, Kind.NOTICE): "the Welcome has not been sent",
    (HANDSHAKE, Kind.FAREWELL): CLOSED,  # refusing the Hello
    (READY, Kind.WELCOME): "the Welcome was already sent",
    (READY, Kind.ANSWER): READY,
    (READY, Kind.NOTICE): READY,
    (READY, Kind.FAREWELL): CLOSED,
}
SERVER_RECEIVES: Final[Table] = {
    (START, Kind.HELLO): HANDSHAKE,
    (START, Kind.REQUEST): "the first message must be a Hello",
    (HANDSHAKE, Kind.HELLO): "the client must wait for the Welcome",
    (HANDSHAKE, Kind.REQUEST): "the client must wait for the Welcome",
    (READY, Kind.HELLO): "the handshake is over",
    (READY, Kind.REQUEST): READY,
}
