"""The client's end: sends the Hello and requests, receives the server's messages."""

from __future__ import annotations

import typing
from typing import Final

from npu_protocol._connection import (
    SERVER_DECODER,
    Connection,
    Expectation,
    refused,
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
from npu_protocol._states import CLIENT_RECEIVES, CLIENT_SENDS, kind_of
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

    def withdraw(self, request_id: int) -> None:
        """Forget request ``request_id``, framed by ``send()`` but never written (not
        one byte of it reached the socket): it is no longer in flight, so it takes
        none of the server's ``max_in_flight`` slots, and its id may be used again.

        Only for a request the server cannot have seen: one any byte of which was
        written will be answered, and its answer would then name an unknown id
        (fatal). The statistics keep counting its frame as sent. Raises
        ValueError if ``request_id`` is not in flight.
        """
        if self._in_flight.pop(request_id, None) is None:
            raise ValueError(f"request {request_id} is not in flight")

    # --- sending -------------------------------------------------------------------

    def _check_send(self, message: ClientMessage) -> None:
        self._refuse_when_closed()
        move = CLIENT_SENDS[self._state, kind_of(message)]
        if isinstance(move, str):
            raise refused(message, move)
        if isinstance(message, Hello):
            self._check_hello(message)
            return
        if message.id in self._in_flight:
            raise LocalProtocolError(ErrorCode.DUPLICATE_REQUEST_ID, request_id=message.id)
        assert self._limits is not None  # READY implies a Welcome
        if len(self._in_flight) >= self._limits.max_in_flight:
            raise LocalProtocolError(ErrorCode.TOO_MANY_IN_FLIGHT, limit=self._limits.max_in_flight)

    def _check_hello(self, hello: Hello) -> None:
        if not MIN_PROTOCOL_VERSION <= hello.protocol_version <= PROTOCOL_VERSION:
            raise LocalProtocolError(
                ErrorCode.UNSUPPORTED_VERSION,
                version=hello.protocol_version,
                minimum=MIN_PROTOCOL_VERSION,
                maximum=PROTOCOL_VERSION,
            )

    def _after_send(self, message: ClientMessage) -> None:
        move = CLIENT_SENDS[self._state, kind_of(message)]
        assert isinstance(move, ConnectionState)  # _check_send refused the others
        if isinstance(message, Hello):
            self._hello = message
        else:
            self._in_flight[message.id] = Expectation.of(message)
        self._state = move

    # --- receiving -----------------------------------------------------------------

    def _on_receive(self, message: ServerMessage) -> None:
        move = CLIENT_RECEIVES[self._state, kind_of(message)]
        if isinstance(move, str):
            raise unexpected(message, move)
        if isinstance(message, Welcome):
            self._on_welcome(message)
        elif isinstance(message, ErrorMessage) and message.id is not None:
            self._on_error(message)
        elif isinstance(message, Reply):
            self._on_reply(message)
        # A farewell and the events (SessionRestarted, ShuttingDown) need no bookkeeping.
        self._state = move

    def _on_welcome(self, message: Welcome) -> None:
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

    def _on_error(self, message: ErrorMessage) -> None:
        assert message.id is not None  # a farewell has no bookkeeping
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
