"""The client's bookkeeping, without I/O: the one core both clients drive.

A client (the blocking one, the trio one) is a driver around one
:class:`ClientCore`: it asks :meth:`ClientCore.begin` for the frame of a
:class:`Call`, writes it, feeds what the socket delivered to
:meth:`ClientCore.receive`, waits until the call's :class:`Pending` is
done, and hands it to the call's ``finish``. The core turns every answer
into a reply or an exception on its Pending, keeps the connection's buffers
(adopted, released by a session restart, forgotten when freed), records
server events, and owns every fd that arrives until a Pending hands it on.

Nothing here blocks, sleeps or locks: the blocking client calls the core
under its lock, the trio client from its one thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from npu_client._errors import (
    DspRestarted,
    NpuError,
    code_message,
    error_from_message,
    error_from_protocol,
    make_error,
)
from npu_client._memory import KeptMappings, MappedBuffer, restart_reason
from npu_client._models import ModelState
from npu_client.transport import OwnedFd
from npu_protocol import (
    NEED_DATA,
    PROTOCOL_VERSION,
    AnyRequest,
    Budget,
    ClientConnection,
    ClientLimits,
    ConnectionClosed,
    ConnectionStatistics,
    ErrorCode,
    ErrorMessage,
    Feature,
    Hello,
    LocalProtocolError,
    OwnPool,
    Priority,
    RemoteProtocolError,
    Reply,
    ServerEvent,
    SessionRestarted,
    ShuttingDown,
    StrayFds,
    Welcome,
    speaks,
)

_log: Final = logging.getLogger("npu_client")

T = TypeVar("T")
R = TypeVar("R", bound=Reply)
B = TypeVar("B", bound=MappedBuffer)

EventCallback = Callable[[ServerEvent], None]
"""Called with each SessionRestarted and ShuttingDown by the caller that read it
(a thread of the blocking client, a task of the trio client), with no lock held."""


class Pending:
    """One request in flight and, once answered, its reply or its error.

    One is made per call, so it has no ``__init__``: an attribute is set on the
    instance when it changes, and reads the class's default until then.
    """

    done: bool = False
    reply: Reply | None = None
    error: NpuError | None = None
    fds: tuple[OwnedFd, ...] = ()
    """The reply's fds (an AllocReply's DMA-BUF), owned here until :meth:`take_fd`."""
    abandoned: bool = False
    """The caller stopped waiting (timeout, cancellation): drop the answer."""
    request_id: int = -1
    """The id of its request (-1: none was framed, the connection was over)."""
    sent: bool = False
    """Some byte of its request reached the socket (set by the driver that writes it):
    the server will answer it. A request given up before that is withdrawn."""
    epoch: int = 0
    """The session epoch when the answer arrived: a buffer allocated in an epoch
    that has since ended is gone (the restart event came after its reply)."""

    def result(self, expected: type[R]) -> R:
        """The reply, or raise the error the server (or the connection) gave."""
        if self.error is not None:
            raise self.error
        assert isinstance(self.reply, expected), self.reply  # the protocol checked the type
        return self.reply

    def take_fd(self) -> OwnedFd:
        """Hand over the one fd that came with the reply (the caller owns it now)."""
        assert len(self.fds) == 1, "only an answered alloc carries an fd"
        (fd,), self.fds = self.fds, ()
        return fd

    def close_fds(self) -> None:
        fds, self.fds = self.fds, ()
        for fd in fds:
            fd.close()


class Call(Generic[T]):
    """One request, checked and ready to be numbered, and what its answer becomes.

    ``build(request_id)`` makes the request (once, when it is sent);
    ``finish(pending)`` runs when the answer is in (under the blocking
    client's lock) and returns what the caller gets, or raises. Adding a
    request kind is adding one function that returns a Call
    (``npu_client._requests``); both clients run it the same way.
    """

    __slots__ = ("build", "finish")

    def __init__(self, build: Callable[[int], AnyRequest], finish: Callable[[Pending], T]) -> None:
        self.build = build
        self.finish = finish


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


class ClientCore(Generic[B]):
    """One connection's state: handshake, requests in flight, buffers, events, death."""

    def __init__(
        self, name: str, priority: Priority, budget: Budget | None = None, *, watch: bool = False
    ) -> None:
        self._conn = ClientConnection()
        self._hello = Hello(
            protocol_version=PROTOCOL_VERSION,
            client_name=name,
            priority=priority,
            budget=budget,
            watch=watch,
        )
        self._pending: dict[int, Pending] = {}
        self._max_in_flight = 0  # from the Welcome: nothing is sent before it
        self._limits: ClientLimits | None = None
        self._buffers: dict[int, B] = {}
        self.kept_mappings = KeptMappings()
        """Mappings of buffers freed into npud's pool for this connection (own_pool)."""
        self._models: dict[int, ModelState] = {}
        self.events: list[ServerEvent] = []
        """Server events received and not yet taken (:meth:`take_events`)."""
        self._death: _Death | None = None
        self.epoch = 0
        """The session epoch: from the Welcome, then from each SessionRestarted."""
        self.shutdown_notice: ShuttingDown | None = None
        """The ShuttingDown event, once the server sent it."""

    # --- handshake -------------------------------------------------------------------------

    def hello(self) -> bytes | bytearray:
        """The Hello frame (it carries no fds)."""
        try:
            data, _ = self._conn.send(self._hello)
        except LocalProtocolError as exc:
            raise ValueError(exc.message) from exc
        return data

    @property
    def name(self) -> str:
        """The client name the Hello gave."""
        return self._hello.client_name

    @property
    def welcome(self) -> Welcome | None:
        return self._conn.welcome

    @property
    def protocol_version(self) -> int:
        """The version the Welcome named (0 before it)."""
        welcome = self._conn.welcome
        return 0 if welcome is None else welcome.protocol_version

    @property
    def limits(self) -> ClientLimits:
        """The limits from the Welcome."""
        if self._limits is None:
            raise RuntimeError("the handshake has not finished")
        return self._limits

    def welcomed_or_dead(self) -> bool:
        return self._death is not None or self._conn.welcome is not None

    # --- requests ----------------------------------------------------------------------------

    @property
    def dead(self) -> bool:
        return self._death is not None

    def check_alive(self) -> None:
        if self._death is not None:
            raise self._death.error()

    def can_begin(self) -> bool:
        """Whether :meth:`begin` may be called now: one more request fits under the
        server's in-flight limit, or the connection is over (begin says so)."""
        return self._death is not None or len(self._pending) < self._max_in_flight

    def begin(self, call: Call[T]) -> tuple[Pending, bytes | bytearray, list[int]] | None:
        """Number and frame ``call``'s request; returns its Pending and the bytes and
        fds to write, or None while the server's in-flight limit is reached (wait
        until :meth:`can_begin`).

        On a connection that is over nothing is framed: the Pending comes back
        done, with the reason, and there is nothing to write. A request the
        protocol refuses (too large for a frame) raises ValueError.
        """
        pending = Pending()
        if self._death is not None:
            pending.error = self._death.error()
            pending.done = True
            return pending, b"", []
        if len(self._pending) >= self._max_in_flight:
            return None
        request = call.build(self._conn.next_request_id())
        try:
            data, fds = self._conn.send(request)
        except LocalProtocolError as exc:
            raise ValueError(exc.message) from exc
        pending.request_id = request.id
        self._pending[request.id] = pending
        return pending, data, fds

    def abandon(self, pending: Pending) -> None:
        """The caller gives up on ``pending`` (a timeout, a cancellation).

        A request that went out (``pending.sent``) will be answered: its answer,
        fds included, is dropped when it comes. One not a byte of which went out
        never will be: it is withdrawn, here and in the protocol, so it does not
        hold one of the server's ``max_in_flight`` slots for ever (once every slot
        was held so, every later call of the connection waited for one while the
        daemon sat idle).
        """
        pending.abandoned = True
        pending.close_fds()
        if pending.sent or pending.done:
            return
        if self._pending.pop(pending.request_id, None) is pending:
            self._conn.withdraw(pending.request_id)

    # --- input ----------------------------------------------------------------------------

    def receive(self, data: bytes | memoryview, fds: list[OwnedFd]) -> None:
        """Feed one read's bytes and fds (``b""``: the server closed), then process
        everything complete. The connection takes the fds; nothing leaks on error.
        ``data`` may be a view of the caller's receive buffer: the protocol copies it
        before this returns."""
        if self._death is not None:
            for fd in fds:
                fd.close()
            return
        self._conn.receive_data(data, [fd.detach() for fd in fds] if fds else ())
        while self._death is None:
            try:
                event = self._conn.next_event()
            except RemoteProtocolError as exc:
                error = error_from_protocol(exc)
                self.die(exc.code, f"npud broke the protocol: {error.message}", error.fields)
                return
            if event is NEED_DATA:
                return
            if isinstance(event, Reply):  # the common case first
                self._answer(event.id, event, None)
            else:
                self._handle(event)

    def _handle(
        self, event: Welcome | ErrorMessage | ServerEvent | StrayFds | ConnectionClosed
    ) -> None:
        if isinstance(event, ErrorMessage):
            if event.id is not None:
                self._answer(event.id, None, error_from_message(event))
            else:
                self.die(event.code, event.message, event.fields)
        elif isinstance(event, Welcome):
            self.epoch = event.epoch
            self._limits = event.limits
            self._max_in_flight = event.limits.max_in_flight
        elif isinstance(event, SessionRestarted):
            self.epoch = event.epoch
            self._release_buffers_before(event.epoch)
            self.events.append(event)
        elif isinstance(event, ShuttingDown):
            self.shutdown_notice = event
            self.events.append(event)
        elif isinstance(event, StrayFds):
            for fd in event.fds:
                OwnedFd(fd).close()
        else:
            during = "during the handshake" if self.welcome is None else ""
            self.die(ErrorCode.CONNECTION_CLOSED, f"npud closed the connection {during}".strip())

    def _answer(self, request_id: int, reply: Reply | None, error: NpuError | None) -> None:
        # The protocol object already refused answers to ids not in flight.
        pending = self._pending.pop(request_id)
        if reply is not None and reply.fd_fields:
            # Owned from here on, whatever happens to the caller.
            pending.fds = tuple(OwnedFd(getattr(reply, name)) for name in reply.fd_fields)
            if pending.abandoned:
                pending.close_fds()
        pending.reply, pending.error, pending.epoch = reply, error, self.epoch
        pending.done = True

    # --- buffers ----------------------------------------------------------------------------

    @property
    def buffers(self) -> tuple[B, ...]:
        """The live buffers of this connection."""
        return tuple(self._buffers.values())

    def adopt(self, buffer: B) -> B:
        """Make a freshly allocated and mapped ``buffer`` one of this connection's.

        If the connection ended, or the session the buffer was allocated in
        restarted, the daemon has already released it: it is released here
        too, and the reason raised.
        """
        if self._death is not None:
            buffer._release_local()
            raise self._death.error()
        if buffer.epoch < self.epoch and not self.buffers_outlive_restarts:
            buffer._release_local(restart_reason(self.epoch))
            raise DspRestarted(code_message(ErrorCode.DSP_RESTARTED))
        if buffer.epoch < self.epoch:
            buffer._forget_mapping()  # a mapping made in the old epoch died with it
        self._buffers[buffer.id] = buffer
        return buffer

    @property
    def buffers_outlive_restarts(self) -> bool:
        """Protocol version 3: a restart of the DSP process leaves the buffers (the
        daemon keeps them; only their DSP mappings end)."""
        return speaks(self.protocol_version, Feature.BUFFERS_OUTLIVE_RESTARTS)

    def owns(self, buffer: MappedBuffer) -> bool:
        """Whether ``buffer`` is a live buffer of this connection."""
        return self._buffers.get(buffer.id) is buffer

    def forget(self, buffer: MappedBuffer) -> None:
        """``buffer`` was freed: it is no longer this connection's."""
        if self._buffers.get(buffer.id) is buffer:
            del self._buffers[buffer.id]

    @property
    def own_pool(self) -> OwnPool | None:
        """npud keeps what this connection frees for its own reuse (Welcome.own_pool)."""
        welcome = self._conn.welcome
        return None if welcome is None else welcome.own_pool

    def release_buffers(self, reason: str) -> None:
        """Close every buffer's and model arena's mapping and fd (the connection is closing)."""
        buffers, self._buffers = self._buffers, {}
        for buffer in buffers.values():
            buffer._release_local(reason)
        self.kept_mappings.close()
        models, self._models = self._models, {}
        for model in models.values():
            model.release_local(reason.removeprefix("gone: "))

    def _release_buffers_before(self, epoch: int) -> None:
        """The daemon released every model (and, before version 3, every buffer) of
        earlier sessions: close ours. From version 3 buffers stay, unmapped."""
        stale = [buffer for buffer in self._buffers.values() if buffer.epoch < epoch]
        for buffer in stale:
            if self.buffers_outlive_restarts:
                buffer._forget_mapping()
                continue
            del self._buffers[buffer.id]
            buffer._release_local(restart_reason(epoch))
        for model in [m for m in self._models.values() if m.epoch < epoch]:
            del self._models[model.id]
            model.release_local(f"the DSP restarted (session epoch {epoch}); load it again")

    # --- models -----------------------------------------------------------------------------

    @property
    def models(self) -> tuple[ModelState, ...]:
        return tuple(self._models.values())

    def adopt_model(self, model: ModelState) -> None:
        """Make a freshly loaded and mapped model one of this connection's (released here
        and raised as for :meth:`adopt` when the connection or its epoch is over)."""
        if self._death is not None:
            model.release_local("its connection is over")
            raise self._death.error()
        if model.epoch < self.epoch:
            model.release_local(f"the DSP restarted (session epoch {self.epoch}); load it again")
            raise DspRestarted(code_message(ErrorCode.DSP_RESTARTED))
        self._models[model.id] = model

    def forget_model(self, model: ModelState) -> None:
        if self._models.get(model.id) is model:
            del self._models[model.id]

    # --- events and statistics ---------------------------------------------------------------

    def take_events(self) -> list[ServerEvent]:
        """Server events received since the last call, oldest first (already acted
        on: the epoch moved, old buffers released); for ``on_event``."""
        events, self.events = self.events, []
        return events

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            epoch=self.epoch,
            shutting_down=self.shutdown_notice is not None,
            closed=self._death is not None,
            requests_in_flight=len(self._pending),
            buffers=len(self._buffers),
            buffer_bytes=sum(buffer.size for buffer in self._buffers.values()),
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
            entry.done = True
        for fd in self._conn.take_pending_fds():
            OwnedFd(fd).close()


def deliver_events(events: list[ServerEvent], on_event: EventCallback | None) -> None:
    """Tell ``on_event`` (with no lock held, so it may call the client)."""
    if on_event is None:
        return
    for event in events:
        try:
            on_event(event)
        except Exception:
            # The event is recorded either way; a failing callback must not
            # fail the unrelated request whose caller happened to read it.
            _log.exception("npu_client: the on_event callback failed for %r", event)
