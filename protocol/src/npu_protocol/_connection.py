"""What client and server connections share: framing, codec, fds, statistics.

A connection is fed bytes and fds with ``receive_data()``, hands back events
from ``next_event()`` and turns messages into ``(bytes, fds)`` with
``send()``. It never touches a socket and never closes an fd: received fds
leave it attached to a message or in a StrayFds event, or through
``take_pending_fds()``; fds given to ``send()`` stay the caller's.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import ClassVar, Final, Generic, Literal, TypeVar

import msgspec

from npu_protocol._events import (
    NEED_DATA,
    ConnectionClosed,
    ConnectionState,
    ConnectionStatistics,
    NeedData,
    StrayFds,
)
from npu_protocol._exceptions import LocalProtocolError, RemoteProtocolError
from npu_protocol._framing import Frame, FrameReader, write_frame_header
from npu_protocol._messages import (
    REPLY_TYPES,
    BufferSlice,
    ClientMessage,
    InlineOutput,
    InvokeReply,
    InvokeRequest,
    Message,
    Reply,
    Request,
    ServerMessage,
    tag_of,
)
from npu_protocol._records import ClientLimits
from npu_protocol._unique_keys import TooManyItemsError, repeated_key
from npu_protocol._wire import FRAME_HEADER_SIZE, HANDSHAKE_MAX_FRAME_SIZE, MAX_REQUEST_ITEMS
from npu_protocol.errors import ErrorCode

InT = TypeVar("InT", bound=Message)
OutT = TypeVar("OutT", bound=Message)


class Expectation:
    """What may answer one request in flight (an ErrorMessage always may).

    Made for every request sent or received, so it only keeps references
    (the request's type and, for an invoke, its outputs) and works out the
    rest when a reply comes.
    """

    __slots__ = ("_outputs", "request")

    def __init__(
        self, request: type[Request], outputs: tuple[InlineOutput | BufferSlice, ...] = ()
    ) -> None:
        self.request = request
        self._outputs = outputs
        """Invoke only: the requested outputs, an inline capacity or a buffer slice each."""

    @classmethod
    def of(cls, request: Request) -> Expectation:
        if isinstance(request, InvokeRequest):
            return cls(InvokeRequest, request.outputs)
        return cls(type(request))

    @property
    def reply(self) -> type[Reply]:
        return REPLY_TYPES[self.request]

    def problem_with(self, reply: Reply) -> str | None:
        """Why ``reply`` cannot answer this request, or None if it can."""
        if type(reply) is not REPLY_TYPES[self.request]:
            request, expected = tag_of(self.request), tag_of(self.reply)
            return f"request {reply.id} is a {request}, whose reply is {expected}"
        if isinstance(reply, InvokeReply):
            return self._outputs_problem(reply.outputs)
        return None

    def _outputs_problem(self, outputs: tuple[bytes | None, ...]) -> str | None:
        if len(outputs) != len(self._outputs):
            return f"{len(outputs)} outputs for {len(self._outputs)} requested"
        for index, (data, arg) in enumerate(zip(outputs, self._outputs, strict=True)):
            if not isinstance(arg, InlineOutput):
                if data is not None:
                    return f"output {index} is a buffer slice but bytes came back"
            elif data is None or len(data) > arg.capacity:
                got = "nothing" if data is None else f"{len(data)} bytes"
                return f"output {index} has capacity {arg.capacity}, {got} came back"
        return None


class Connection(abc.ABC, Generic[InT, OutT]):
    """The sans-IO core of one end of an npud connection."""

    _role: ClassVar[str]
    """``"client"`` or ``"server"``: who this side is."""
    _reject_repeated_keys: ClassVar[bool] = False
    """Check every received payload for a map key given twice (section 4)."""

    def __init__(
        self,
        incoming: msgspec.msgpack.Decoder[InT],
        outgoing_types: tuple[type[Message], ...],
    ) -> None:
        self._incoming = incoming
        self._outgoing_types = outgoing_types
        # Exact types: a subclass of a message would travel under its parent's tag.
        self._sendable = frozenset(outgoing_types)
        self._encoder = msgspec.msgpack.Encoder()
        self._reader = FrameReader(max_payload=HANDSHAKE_MAX_FRAME_SIZE)
        self._send_limit = HANDSHAKE_MAX_FRAME_SIZE
        self._state = ConnectionState.START
        self._peer_finished = False  # the peer's stream ended (it may still read: half-close)
        self._error: RemoteProtocolError | None = None
        self._orphaned_fds: list[int] = []  # fds of frames that failed to become events
        self._in_flight: dict[int, Expectation] = {}
        self._limits: ClientLimits | None = None
        self._frames_sent = self._frames_received = 0
        self._bytes_sent = self._bytes_received = 0
        self._fds_sent = self._fds_received = 0

    # --- public API ------------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def limits(self) -> ClientLimits | None:
        """The limits from the Welcome, once it has been exchanged."""
        return self._limits

    @property
    def in_flight(self) -> frozenset[int]:
        """Ids of requests sent (client) or received (server) and not yet answered."""
        return frozenset(self._in_flight)

    def request_type(self, request_id: int) -> type[Request] | None:
        """The type of request ``request_id`` if it is in flight."""
        expectation = self._in_flight.get(request_id)
        return expectation.request if expectation else None

    def receive_data(
        self,
        data: bytes | bytearray | memoryview,
        fds: Iterable[int] = (),
        *,
        fds_truncated: bool = False,
    ) -> None:
        """Feed what one recvmsg returned: its bytes and the fds that came with them.

        ``b""`` means the peer closed its end. The bytes are copied (once, into the
        frame reader) before this returns: a view of a buffer the caller reads into
        again is fine. From here on the connection
        holds the fds until ``next_event()`` or ``take_pending_fds()`` hands
        them back. ``fds_truncated`` reports MSG_CTRUNC, which is fatal.
        """
        self._reader.feed(data, fds)
        self._bytes_received += len(data)
        if fds_truncated:
            self._reader.note_fds_truncated()

    def next_event(self) -> InT | StrayFds | ConnectionClosed | Literal[NeedData.NEED_DATA]:
        """The next message, StrayFds, ConnectionClosed, or NEED_DATA.

        A message's fds are in its fd fields and belong to the caller, as do
        the fds of a StrayFds event. Raises RemoteProtocolError (and moves to
        ERROR) when the peer breaks the protocol; raises it again if called
        after that.
        """
        if self._error is not None:
            raise self._error
        if self._state is ConnectionState.CLOSED:
            held = self.take_pending_fds()
            return StrayFds(tuple(held)) if held else ConnectionClosed()
        try:
            stray = self._reader.take_stray_fds()
            if stray:
                return StrayFds(stray)
            frame = self._reader.next_frame()
            if frame is None:
                if self._reader.at_eof:
                    self._state = ConnectionState.CLOSED
                    self._peer_finished = True
                    return ConnectionClosed()
                return NEED_DATA
            return self._receive_frame(frame)
        except RemoteProtocolError as exc:
            self._state = ConnectionState.ERROR
            self._error = exc
            raise

    def send(self, message: OutT) -> tuple[bytearray, list[int]]:
        """Frame ``message``: the bytes to write and the fds to attach to their first byte.

        The payload is encoded straight after the header's room in the one buffer
        returned: a frame's bytes are made once, never joined (write them with one
        ``sendmsg``; a view of them for what the socket did not take).

        The fds are read from the message's fd fields and stay the caller's.
        Raises LocalProtocolError, with nothing sent and nothing changed, if
        the message may not be sent now (the state machine, the answer it
        claims to be), is over the frame limit, carries an fd field that is
        not an fd, or cannot be encoded.

        What the message types say (field types, bounds) is not checked again
        here: the payload is encoded once and never decoded on this side. A
        value built outside its bounds reaches the peer, whose decoder refuses
        it (BAD_MESSAGE); build messages from checked values.
        """
        if type(message) not in self._sendable:
            raise TypeError(f"{type(self).__name__} cannot send {type(message).__name__}")
        self._check_send(message)
        if message.fd_fields:
            wire, fds = _detach_fds(message)
        else:
            wire, fds = message, []
        frame = self._encode_frame(wire)
        size = len(frame) - FRAME_HEADER_SIZE
        if size > self._send_limit:
            raise LocalProtocolError(ErrorCode.FRAME_TOO_LARGE, size=size, limit=self._send_limit)
        write_frame_header(frame, len(fds))
        self._after_send(message)
        self._frames_sent += 1
        self._bytes_sent += len(frame)
        self._fds_sent += len(fds)
        return frame, fds

    def take_pending_fds(self) -> list[int]:
        """Every fd the connection still holds, now the caller's to close.

        Use it after a protocol error or when abandoning the connection;
        during normal operation next_event() returns all fds by itself.
        """
        held = self._orphaned_fds + self._reader.take_all_fds()
        self._orphaned_fds = []
        return held

    @property
    def bytes_buffered(self) -> int:
        """Bytes received and not yet part of a frame: a frame the peer has begun."""
        return self._reader.buffered

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(
            state=self._state,
            frames_sent=self._frames_sent,
            frames_received=self._frames_received,
            bytes_sent=self._bytes_sent,
            bytes_received=self._bytes_received,
            fds_sent=self._fds_sent,
            fds_received=self._fds_received,
            requests_in_flight=len(self._in_flight),
            bytes_buffered=self._reader.buffered,
        )

    # --- for the roles -------------------------------------------------------------

    @abc.abstractmethod
    def _check_send(self, message: OutT) -> None:
        """Raise LocalProtocolError if ``message`` may not be sent now. No side effects."""

    @abc.abstractmethod
    def _after_send(self, message: OutT) -> None:
        """Advance the state machine for a message that is being sent."""

    @abc.abstractmethod
    def _on_receive(self, message: InT) -> None:
        """Advance the state machine for a received message, or raise RemoteProtocolError."""

    def _adopt_limits(self, limits: ClientLimits) -> None:
        self._limits = limits
        self._reader.max_payload = limits.max_frame_size
        self._send_limit = limits.max_frame_size

    def _refuse_when_closed(self) -> None:
        if self._state in (ConnectionState.CLOSED, ConnectionState.ERROR):
            raise LocalProtocolError(ErrorCode.CONNECTION_CLOSED)

    # --- internals ------------------------------------------------------------------

    def _encode_frame(self, wire: Message) -> bytearray:
        """Room for the header, then ``wire``'s payload."""
        frame = bytearray(FRAME_HEADER_SIZE)
        try:
            self._encoder.encode_into(wire, frame, FRAME_HEADER_SIZE)
        except (TypeError, ValueError) as exc:  # msgspec.EncodeError is a ValueError
            raise LocalProtocolError(ErrorCode.BAD_MESSAGE, detail=str(exc)) from exc
        return frame

    def _receive_frame(self, frame: Frame) -> InT:
        try:
            message = _attach_fds(self._decode(frame.payload), frame.fds)
            self._on_receive(message)
        except RemoteProtocolError:
            self._orphaned_fds.extend(frame.fds)
            raise
        self._frames_received += 1
        self._fds_received += len(frame.fds)
        return message

    def _decode(self, payload: bytes) -> InT:
        try:
            message = self._incoming.decode(payload)
        except msgspec.DecodeError as exc:  # ValidationError included
            tag = _misdirected_tag(payload, self._outgoing_types)
            if tag is not None:
                # A message we know, in the wrong direction: the state machine's
                # code, as for a known message in the wrong state.
                raise RemoteProtocolError(
                    ErrorCode.UNEXPECTED_MESSAGE,
                    message=tag,
                    reason=f"only the {self._role} sends it",
                ) from exc
            raise RemoteProtocolError(ErrorCode.BAD_MESSAGE, detail=_peer_text(str(exc))) from exc
        except RecursionError as exc:  # msgspec's answer to deeply nested (even ignored) values
            raise RemoteProtocolError(ErrorCode.BAD_MESSAGE, detail="nested too deeply") from exc
        if self._reject_repeated_keys:
            try:
                key = repeated_key(payload, MAX_REQUEST_ITEMS)
            except TooManyItemsError as exc:
                raise RemoteProtocolError(ErrorCode.BAD_MESSAGE, detail=str(exc)) from None
            if key is not None:
                raise RemoteProtocolError(
                    ErrorCode.BAD_MESSAGE,
                    detail=_peer_text(f"map key {key!r} appears twice in one map"),
                )
        return message


M = TypeVar("M", bound=Message)


class _TagOnly(msgspec.Struct):
    type: str = ""


_TAG_DECODER: Final = msgspec.msgpack.Decoder(_TagOnly)


def _misdirected_tag(payload: bytes, outgoing: tuple[type[Message], ...]) -> str | None:
    """The ``type`` of a payload that failed to decode, if it names a message that
    travels the other way (one this side sends)."""
    try:
        tag = _TAG_DECODER.decode(payload).type
    except msgspec.DecodeError:
        return None
    return tag if any(tag_of(cls) == tag for cls in outgoing) else None


_PEER_TEXT_LIMIT: Final = 200


def _peer_text(text: str) -> str:
    """Text that quotes peer bytes (msgspec echoes bad values), made safe for a log
    line and an ErrorMessage field: control characters escaped, length capped."""
    escaped = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    if len(escaped) <= _PEER_TEXT_LIMIT:
        return escaped
    return escaped[: _PEER_TEXT_LIMIT - 3] + "..."


def _attach_fds(message: M, fds: tuple[int, ...]) -> M:
    """Replace the fd-slot numbers of a received message by the fds themselves."""
    names = message.fd_fields
    if len(names) != len(fds):
        raise RemoteProtocolError(
            ErrorCode.FD_COUNT_MISMATCH,
            message=tag_of(message),
            expected=len(names),
            declared=len(fds),
        )
    if not names:
        return message
    slots = [getattr(message, name) for name in names]
    if sorted(slots) != list(range(len(names))):
        raise RemoteProtocolError(
            ErrorCode.BAD_MESSAGE,
            detail=f"{tag_of(message)} fd slots {slots} do not number its {len(fds)} fds",
        )
    return msgspec.structs.replace(
        message, **{name: fds[slot] for name, slot in zip(names, slots, strict=True)}
    )


def _detach_fds(message: M) -> tuple[M, list[int]]:
    """The message as it goes on the wire (fd fields numbered) and its fds in slot order."""
    names = message.fd_fields
    fds = [getattr(message, name) for name in names]
    for fd in fds:
        if not isinstance(fd, int) or isinstance(fd, bool) or fd < 0:
            raise LocalProtocolError(ErrorCode.INVALID_FD, fd=fd)
    if not names:
        return message, fds
    return msgspec.structs.replace(message, **{n: i for i, n in enumerate(names)}), fds


# One decoder per direction, shared: msgspec decoders hold no per-message state.
SERVER_DECODER: Final = msgspec.msgpack.Decoder(ServerMessage)
CLIENT_DECODER: Final = msgspec.msgpack.Decoder(ClientMessage)


def unexpected(message: Message, reason: str) -> RemoteProtocolError:
    """The peer sent ``message`` where the state machine does not allow it."""
    return RemoteProtocolError(ErrorCode.UNEXPECTED_MESSAGE, message=tag_of(message), reason=reason)


def refused(message: Message, reason: str) -> LocalProtocolError:
    """We were asked to send ``message`` where the state machine does not allow it."""
    return LocalProtocolError(ErrorCode.UNEXPECTED_MESSAGE, message=tag_of(message), reason=reason)
