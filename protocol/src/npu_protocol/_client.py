"""The client's end: sends the Hello and requests, receives the server's messages."""

from __future__ import annotations

import typing
from typing import Final

from npu_protocol._connection import (
    SERVER_DECODER,
    Connection,
    Expectation,
    unexpected,
)
from npu_protocol._events import ConnectionState
from npu_protocol._exceptions import LocalProtocolError, RemoteProtocolError
from npu_protocol._messages import (
    ClientMessage,
    ErrorMessage,
    Hello,
    Reply,
    ServerMessage,
    Welcome,
    tag_of,
)
from npu_protocol._wire import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
from npu_protocol.errors import ErrorCode

_CLIENT_TYPES: Final = typing.get_args(ClientMessage)

_REQUEST_ID_SPACE: Final = 1 << 32


class ClientConnection(Connection[ServerMessage, ClientMessage]):
    """Sans-IO client: ``send(Hello(...))`` first, then requests once the Welcome is in."""

    _role = "client"

    def __init__(self) -> None:
        super().__init__(SERVER_DECODER, _CLIENT_TYPES)
        self._hello: Hello | None = None
        self._welcome: Welcome | None = None
        self._next_id = 0

    @property
    def welcome(self) -> Welcome | None:
        """The server's Welcome, once received."""
        return self._welcome

    def next_request_id(self) -> int:
        """A request id not in flight (counting up from 0, wrapping at 2**32)."""
        if len(self._in_flight) >= _REQUEST_ID_SPACE:  # pragma: no cover - needs 2**32 requests
            raise LocalProtocolError(ErrorCode.TOO_MANY_IN_FLIGHT, limit=_REQUEST_ID_SPACE)
        while self._next_id in self._in_flight:
            self._next_id = (self._next_id + 1) % _REQUEST_ID_SPACE
        request_id = self._next_id
        self._next_id = (self._next_id + 1) % _REQUEST_ID_SPACE
        return request_id

    # --- sending -------------------------------------------------------------------

    def _check_send(self, message: ClientMessage) -> None:
        self._refuse_when_closed()
        if isinstance(message, Hello):
            self._check_hello(message)
            return
        if self._state is not ConnectionState.READY:
            raise LocalProtocolError(
                ErrorCode.UNEXPECTED_MESSAGE,
                message=tag_of(message),
                reason="requests wait for the Welcome",
            )
        if message.id in self._in_flight:
            raise LocalProtocolError(ErrorCode.DUPLICATE_REQUEST_ID, request_id=message.id)
        assert self._limits is not None  # READY implies a Welcome
        if len(self._in_flight) >= self._limits.max_in_flight:
            raise LocalProtocolError(ErrorCode.TOO_MANY_IN_FLIGHT, limit=self._limits.max_in_flight)

    def _check_hello(self, hello: Hello) -> None:
        if self._state is not ConnectionState.START:
            raise LocalProtocolError(
                ErrorCode.UNEXPECTED_MESSAGE, message="hello", reason="the Hello was already sent"
            )
        if not MIN_PROTOCOL_VERSION <= hello.protocol_version <= PROTOCOL_VERSION:
            raise LocalProtocolError(
                ErrorCode.UNSUPPORTED_VERSION,
                version=hello.protocol_version,
                minimum=MIN_PROTOCOL_VERSION,
                maximum=PROTOCOL_VERSION,
            )

    def _after_send(self, message: ClientMessage) -> None:
        if isinstance(message, Hello):
            self._hello = message
            self._state = ConnectionState.HANDSHAKE
        else:
            self._in_flight[message.id] = Expectation.of(message)

    # --- receiving -----------------------------------------------------------------

    def _on_receive(self, message: ServerMessage) -> None:
        if self._state is ConnectionState.START:
            raise unexpected(message, "the server spoke before the Hello")
        if self._state is ConnectionState.HANDSHAKE:
            self._on_handshake(message)
        elif isinstance(message, Welcome):
            raise unexpected(message, "the handshake is over")
        elif isinstance(message, ErrorMessage):
            self._on_error(message)
        elif isinstance(message, Reply):
            self._on_reply(message)
        # SessionRestarted and ShuttingDown need no bookkeeping here.

    def _on_handshake(self, message: ServerMessage) -> None:
        if isinstance(message, ErrorMessage) and message.id is None:
            self._state = ConnectionState.CLOSED  # the server refused the Hello
            return
        if not isinstance(message, Welcome):
            raise unexpected(message, "the handshake is not finished")
        assert self._hello is not None  # HANDSHAKE implies a Hello was sent
        highest = min(self._hello.protocol_version, PROTOCOL_VERSION)
        if not MIN_PROTOCOL_VERSION <= message.protocol_version <= highest:
            raise RemoteProtocolError(
                ErrorCode.UNSUPPORTED_VERSION,
                version=message.protocol_version,
                minimum=MIN_PROTOCOL_VERSION,
                maximum=highest,
            )
        self._welcome = message
        self._adopt_limits(message.limits)
        self._state = ConnectionState.READY

    def _on_error(self, message: ErrorMessage) -> None:
        if message.id is None:
            self._state = ConnectionState.CLOSED  # the server is closing the connection
            return
        if self._in_flight.pop(message.id, None) is None:
            raise RemoteProtocolError(
                ErrorCode.UNKNOWN_REQUEST_ID, message="error", request_id=message.id
            )

    def _on_reply(self, reply: Reply) -> None:
        expectation = self._in_flight.get(reply.id)
        if expectation is None:
            raise RemoteProtocolError(
                ErrorCode.UNKNOWN_REQUEST_ID, message=tag_of(reply), request_id=reply.id
            )
        problem = expectation.problem_with(reply)
        if problem is not None:
            raise unexpected(reply, problem)
        del self._in_flight[reply.id]
