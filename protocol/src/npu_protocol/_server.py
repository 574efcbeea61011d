"""The server's end: receives the Hello and requests, sends everything else."""

from __future__ import annotations

import typing
from typing import Final

from npu_protocol._connection import (
    CLIENT_DECODER,
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
from npu_protocol._states import SERVER_RECEIVES, SERVER_SENDS, TALKING, Kind, kind_of
from npu_protocol._wire import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
from npu_protocol.errors import ErrorCode

_SERVER_TYPES: Final = typing.get_args(ServerMessage)


def choose_protocol_version(offered: int) -> int | None:
    """The version to put in the Welcome for a Hello offering ``offered``, or
    None if there is none (answer ``ErrorCode.UNSUPPORTED_VERSION`` and close)."""
    version = min(offered, PROTOCOL_VERSION)
    return version if version >= MIN_PROTOCOL_VERSION else None


class ServerConnection(Connection[ClientMessage, ServerMessage]):
    """Sans-IO server: receive a Hello, send a Welcome (or an ErrorMessage
    without id), then answer each request once, in any order.

    Received payloads are checked for repeated map keys (fatal BAD_MESSAGE):
    the daemon must see exactly what a client meant.
    """

    _role = "server"
    _reject_repeated_keys = True

    def __init__(self) -> None:
        super().__init__(CLIENT_DECODER, _SERVER_TYPES)
        self._hello: Hello | None = None

    @property
    def hello(self) -> Hello | None:
        """The client's Hello, once received."""
        return self._hello

    # --- sending -------------------------------------------------------------------

    def _check_send(self, message: ServerMessage) -> None:
        if isinstance(message, ErrorMessage) and message.id is None:
            # Refusing a client, or saying why we close, is possible at any
            # point until the connection is closed, even after a peer error.
            if self._state is ConnectionState.CLOSED:
                raise LocalProtocolError(ErrorCode.CONNECTION_CLOSED)
            return
        if (
            self._state is ConnectionState.CLOSED
            and self._peer_finished
            and isinstance(message, ErrorMessage | Reply)
        ):
            # The client ended its stream after its last request (a half-close):
            # the requests in flight still get their answers.
            self._check_answer(message)
            return
        self._refuse_when_closed()
        move = SERVER_SENDS[self._state, kind_of(message)]
        if isinstance(move, str):
            raise refused(message, move)
        if isinstance(message, Welcome):
            self._check_welcome(message)
        elif isinstance(message, ErrorMessage | Reply):
            self._check_answer(message)

    def _check_welcome(self, welcome: Welcome) -> None:
        assert self._hello is not None  # HANDSHAKE implies a Hello arrived
        highest = min(self._hello.protocol_version, PROTOCOL_VERSION)
        if not MIN_PROTOCOL_VERSION <= welcome.protocol_version <= highest:
            raise LocalProtocolError(
                ErrorCode.UNSUPPORTED_VERSION,
                version=welcome.protocol_version,
                minimum=MIN_PROTOCOL_VERSION,
                maximum=highest,
            )

    def _check_answer(self, answer: ErrorMessage | Reply) -> None:
        assert answer.id is not None  # an ErrorMessage without id was handled before
        expectation = self._in_flight.get(answer.id)
        if expectation is None:
            raise LocalProtocolError(
                ErrorCode.UNKNOWN_REQUEST_ID, message=tag_of(answer), request_id=answer.id
            )
        if isinstance(answer, Reply):
            problem = expectation.problem_with(answer)
            if problem is not None:
                raise refused(answer, problem)

    def _after_send(self, message: ServerMessage) -> None:
        kind = kind_of(message)
        if kind is Kind.FAREWELL:
            # Also from CLOSED or ERROR (the one message still allowed there).
            self._state = ConnectionState.CLOSED
            return
        if isinstance(message, Welcome):
            self._adopt_limits(message.limits)
        elif isinstance(message, ErrorMessage | Reply):
            assert message.id is not None
            del self._in_flight[message.id]
        if self._state in TALKING:  # a half-closed connection's answers leave it CLOSED
            move = SERVER_SENDS[self._state, kind]
            assert isinstance(move, ConnectionState)  # _check_send refused the others
            self._state = move

    # --- receiving -----------------------------------------------------------------

    def _on_receive(self, message: ClientMessage) -> None:
        move = SERVER_RECEIVES[self._state, kind_of(message)]
        if isinstance(move, str):
            raise unexpected(message, move)
        if isinstance(message, Hello):
            self._hello = message
            self._state = move
            return
        if message.id in self._in_flight:
            raise RemoteProtocolError(ErrorCode.DUPLICATE_REQUEST_ID, request_id=message.id)
        assert self._limits is not None  # READY implies a Welcome
        if len(self._in_flight) >= self._limits.max_in_flight:
            raise RemoteProtocolError(
                ErrorCode.TOO_MANY_IN_FLIGHT, limit=self._limits.max_in_flight
            )
        self._in_flight[message.id] = Expectation.of(message)
