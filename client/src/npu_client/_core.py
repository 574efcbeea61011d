"""The client's bookkeeping, without I/O: requests in flight, answers, events, failure.

Both the blocking and the trio client wrap one :class:`ClientCore` around a
``npu_protocol.ClientConnection``: they write what :meth:`ClientCore.begin`
returns, feed what the socket delivered to :meth:`ClientCore.receive`, and
wait until the request's :class:`Pending` is done. The core turns every
answer into a reply or an exception on its Pending, records server events,
and owns every fd that arrives until a Pending hands it to its caller.

It is not thread-safe: the blocking client calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from npu_client._errors import (
    DspRestarted,
    NpuError,
    code_message,
    error_from_message,
    error_from_protocol,
    make_error,
)
from npu_client.transport import OwnedFd
from npu_protocol import (
    NEED_DATA,
    AllocReply,
    AnyRequest,
    ClientConnection,
    ClientLimits,
    ConnectionClosed,
    ConnectionStatistics,
    DspCapabilities,
    ErrorCode,
    ErrorMessage,
    Hello,
    LocalProtocolError,
    Priority,
    RemoteProtocolError,
    Reply,
    ServerEvent,
    SessionRestarted,
    ShuttingDown,
    StrayFds,
    Welcome,
)

R = TypeVar("R", bound=Reply)

EventCallback = Callable[[ServerEvent], None]
"""Called with each SessionRestarted and ShuttingDown by the caller that read it
(a thread of the blocking client, a task of the trio client), with no lock held."""


@dataclass(eq=False)
class Pending:
    """One request in flight and, once answered, its reply or its error."""

    request: AnyRequest
    reply: Reply | None = None
    error: NpuError | None = None
    fd: OwnedFd | None = None
    """An AllocReply's DMA-BUF, owned here until :meth:`take_fd`."""
    abandoned: bool = False
    """The caller stopped waiting (timeout, cancellation): drop the answer."""
    epoch: int = 0
    """The session epoch when the answer arrived: a buffer allocated in an epoch
    that has since ended is gone (the restart event came after its reply)."""

    @property
    def done(self) -> bool:
        return self.reply is not None or self.error is not None

    def result(self, expected: type[R]) -> R:
        """The reply, or raise the error the server (or the connection) gave."""
        if self.error is not None:
            raise self.error
        assert isinstance(self.reply, expected), self.reply  # the protocol checked the type
        return self.reply

    def take_fd(self) -> OwnedFd:
        """Hand over the fd that came with the reply (the caller owns it now)."""
        fd, self.fd = self.fd, None
        assert fd is not None, "only an answered alloc carries an fd"
        return fd


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """A snapshot of one client."""

    epoch: int
    shutting_down: bool
    closed: bool
    """The connection is over (closed here, by the daemon, or broken)."""
    requests_in_flight: int
    """Requests sent and not answered, including ones whose callers gave up."""
    buffers: int
    buffer_bytes: int
    connection: ConnectionStatistics
    """The protocol connection's counters (frames, bytes, fds)."""


@dataclass(frozen=True)
class _Death:
    """Why the connection is over; every later request fails with a fresh copy."""

    code: int
    message: str
    fields: Mapping[str, int | str] = field(default_factory=dict)

    def error(self) -> NpuError:
        return make_error(self.code, self.message, self.fields)


class ClientCore:
    """One connection's state: handshake, requests in flight, events, death."""

    def __init__(self, name: str, priority: Priority) -> None:
        self._conn = ClientConnection()
        self._hello = Hello(client_name=name, priority=priority)
        self._pending: dict[int, Pending] = {}
        self._events: list[ServerEvent] = []
        self._death: _Death | None = None
        self.epoch = 0
        """The session epoch: from the Welcome, then from each SessionRestarted."""
        self.shutdown_notice: ShuttingDown | None = None
        """The ShuttingDown event, once the server sent it."""

    # --- handshake -------------------------------------------------------------------------

    def hello(self) -> bytes:
        """The Hello frame (it carries no fds)."""
        try:
            data, _ = self._conn.send(self._hello)
        except LocalProtocolError as exc:
            raise ValueError(exc.message) from exc
        return data

    @property
    def welcome(self) -> Welcome | None:
        return self._conn.welcome

    @property
    def limits(self) -> ClientLimits:
        limits = self._conn.limits
        if limits is None:
            raise RuntimeError("the handshake has not finished")
        return limits

    # --- requests ----------------------------------------------------------------------------

    @property
    def dead(self) -> bool:
        return self._death is not None

    def check_alive(self) -> None:
        if self._death is not None:
            raise self._death.error()

    def has_room(self) -> bool:
        """Whether one more request fits under the server's in-flight limit."""
        return len(self._conn.in_flight) < self.limits.max_in_flight

    def begin(self, build: Callable[[int], AnyRequest]) -> tuple[Pending, bytes, list[int]]:
        """Register the request ``build(id)``; returns it and the bytes and fds to write.

        Call only when :meth:`has_room`. Raises the connection's error if it is
        over, ValueError if the request is not valid.
        """
        self.check_alive()
        request = build(self._conn.next_request_id())
        try:
            data, fds = self._conn.send(request)
        except LocalProtocolError as exc:
            raise ValueError(exc.message) from exc
        pending = Pending(request)
        self._pending[request.id] = pending
        return pending, data, fds

    def abandon(self, pending: Pending) -> None:
        """The caller gives up on ``pending``; its answer, fds included, is dropped."""
        pending.abandoned = True
        if pending.fd is not None:
            pending.take_fd().close()

    # --- input ----------------------------------------------------------------------------

    def receive(self, data: bytes, fds: list[OwnedFd]) -> None:
        """Feed one recvmsg's bytes and fds (``b""``: the server closed), then process
        everything complete. The connection takes the fds; nothing leaks on error."""
        if self._death is not None:
            for fd in fds:
                fd.close()
            return
        self._conn.receive_data(data, [fd.detach() for fd in fds])
        self.process()

    def process(self) -> None:
        """Turn every complete frame into answers and events."""
        while self._death is None:
            try:
                event = self._conn.next_event()
            except RemoteProtocolError as exc:
                error = error_from_protocol(exc)
                detail = f"npud broke the protocol: {error.message}"
                self.die(exc.code, detail, error.fields)
                return
            if event is NEED_DATA:
                return
            self._handle(event)

    def _handle(
        self,
        event: Welcome | ErrorMessage | Reply | ServerEvent | StrayFds | ConnectionClosed,
    ) -> None:
        if isinstance(event, Reply):
            self._answer(event.id, reply=event)
        elif isinstance(event, ErrorMessage):
            if event.id is not None:
                self._answer(event.id, error=error_from_message(event))
            else:
                self.die(event.code, event.message, event.fields)
        elif isinstance(event, Welcome):
            self.epoch = event.epoch
        elif isinstance(event, SessionRestarted):
            self.epoch = event.epoch
            self._events.append(event)
        elif isinstance(event, ShuttingDown):
            self.shutdown_notice = event
            self._events.append(event)
        elif isinstance(event, StrayFds):
            for fd in event.fds:
                OwnedFd(fd).close()
        else:
            during = "during the handshake" if self.welcome is None else ""
            self.die(ErrorCode.CONNECTION_CLOSED, f"npud closed the connection {during}".strip())

    def _answer(
        self, request_id: int, *, reply: Reply | None = None, error: NpuError | None = None
    ) -> None:
        # The protocol object already refused answers to ids not in flight.
        pending = self._pending.pop(request_id)
        if isinstance(reply, AllocReply):
            fd = OwnedFd(reply.fd)
            if pending.abandoned:
                fd.close()
            else:
                pending.fd = fd
        pending.reply, pending.error, pending.epoch = reply, error, self.epoch

    def has_events(self) -> bool:
        return bool(self._events)

    def restarted_error(self) -> DspRestarted:
        return DspRestarted(code_message(ErrorCode.DSP_RESTARTED))

    def take_events(self) -> list[ServerEvent]:
        """Server events received since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def statistics(self, *, buffers: int, buffer_bytes: int) -> ClientStatistics:
        return ClientStatistics(
            epoch=self.epoch,
            shutting_down=self.shutdown_notice is not None,
            closed=self._death is not None,
            requests_in_flight=len(self._pending),
            buffers=buffers,
            buffer_bytes=buffer_bytes,
            connection=self._conn.statistics(),
        )

    # --- the end -------------------------------------------------------------------------------

    def die(self, code: int, detail: str, fields: Mapping[str, int | str] | None = None) -> None:
        """End the connection: every request in flight and every later one fails with
        ``code``. For CONNECTION_CLOSED ``detail`` follows the standard message;
        otherwise it is the server's whole message. Idempotent: the first cause wins."""
        if self._death is not None:
            return
        if code == ErrorCode.CONNECTION_CLOSED:
            message = code_message(ErrorCode.CONNECTION_CLOSED, detail)
        else:
            message = detail
        self._death = _Death(code, message, dict(fields or {}))
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            entry.error = self._death.error()
        for fd in self._conn.take_pending_fds():
            OwnedFd(fd).close()


class DaemonView:
    """What the daemon said, as both clients expose it (read-only properties).

    Mixed into the blocking and the trio client, which set ``_core``, ``_path``
    and ``_closed``.
    """

    _core: ClientCore
    _path: str
    _closed: bool

    @property
    def path(self) -> str:
        """The socket this client connected to."""
        return self._path

    @property
    def welcome(self) -> Welcome:
        """The daemon's Welcome: versions, backend, DSP capabilities, limits, epoch."""
        welcome = self._core.welcome
        assert welcome is not None  # connect() returns only after it
        return welcome

    @property
    def server_version(self) -> str:
        return self.welcome.server_version

    @property
    def backend(self) -> str:
        """``kernel`` (a real FastRPC device) or ``emulator``."""
        return self.welcome.backend

    @property
    def dsp(self) -> DspCapabilities:
        return self.welcome.dsp

    @property
    def limits(self) -> ClientLimits:
        """The limits the daemon applies to this connection."""
        return self._core.limits

    @property
    def priority(self) -> Priority:
        """The priority class granted (possibly lower than asked)."""
        return self._core.limits.priority

    @property
    def epoch(self) -> int:
        """The DSP session epoch: from the Welcome, then from each SessionRestarted."""
        return self._core.epoch

    @property
    def shutting_down(self) -> bool:
        """True once the daemon announced that it is shutting down."""
        return self._core.shutdown_notice is not None

    @property
    def shutdown_notice(self) -> ShuttingDown | None:
        """The daemon's ShuttingDown event (reason, grace period), once it came."""
        return self._core.shutdown_notice

    @property
    def closed(self) -> bool:
        return self._closed


class HandleIdentity:
    """What a remote handle is, as both clients' handles expose it."""

    def __init__(self, handle_id: int, uri: str, epoch: int) -> None:
        self._id = handle_id
        self._uri = uri
        self._epoch = epoch
        self._closed = False

    @property
    def id(self) -> int:
        """The daemon's id for this handle (scoped to the connection)."""
        return self._id

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def epoch(self) -> int:
        """The session epoch it was opened in; a restart closes it in the daemon (re-open)."""
        return self._epoch

    @property
    def closed(self) -> bool:
        return self._closed
