"""One client connection: bytes and fds in, requests to their handlers, replies out.

The sans-IO ``npu_protocol.ServerConnection`` does the framing and the
bookkeeping; this module does the socket I/O on trio. Each request's arrival
step runs in the receive loop, in arrival order (``npud.requests``); its work
then runs in a task of its own, so requests are pipelined and replies go out
in completion order.

Peer garbage never becomes a traceback: a protocol violation is answered with
one ErrorMessage (no id) and the connection is closed; a refused request gets
an ErrorMessage with its id. However the connection ends, the client's
resources are released (after calls already on the DSP have returned).
"""

from __future__ import annotations

import errno
import socket
from typing import Final

import structlog
import trio

import npu_protocol as p
from npu_client.transport import (
    ANCILLARY_SPACE,
    RECV_BUFFER,
    TransportError,
    fds_ancillary,
    parse_ancillary,
)
from npu_protocol import CodedError, ErrorCode
from npud import __version__
from npud.broker import Broker
from npud.clients import Client
from npud.requests import HANDLERS, Answer, Handler

SEND_TIMEOUT: Final = 30.0
"""A client that does not read its replies for this long is dropped."""
EVENT_SEND_TIMEOUT: Final = 2.0
"""Broadcast events (restart, shutdown) wait this long for a slow reader, then drop it."""
HELLO_TIMEOUT: Final = 10.0
"""A connection that has not said Hello by then is closed."""


class PeerConnection:
    """The daemon's end of one client's connection."""

    def __init__(self, broker: Broker, sock: trio.socket.SocketType, client: Client) -> None:
        self.broker = broker
        self.sock = sock
        self.client = client
        self.protocol = p.ServerConnection()
        self.log = structlog.get_logger("npud.client").bind(
            pid=client.pid, uid=client.uid, client="?"
        )
        self._send_lock = trio.Lock()
        self._closing = False
        self._welcomed = False

    # ------------------------------------------------------------------ run
    async def serve(self) -> None:
        """Serve until the peer leaves or breaks the protocol; then release everything."""
        self.log.info("client connected")
        reason = "closed by the client"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._hello_deadline, nursery.cancel_scope)
                reason = await self._receive_loop(nursery)
                nursery.cancel_scope.cancel()
            if not self._welcomed and reason == "closed by the client":
                reason = "no Hello in time or closed before it"
        finally:
            with trio.CancelScope(shield=True):
                await self.broker.release_client(self.client)
                self.sock.close()
            self.log.info("client disconnected", reason=reason, calls_done=self.client.calls_done)

    async def _hello_deadline(self, scope: trio.CancelScope) -> None:
        await trio.sleep(HELLO_TIMEOUT)
        if not self._welcomed:
            self.log.warning("no Hello within the deadline; closing", seconds=HELLO_TIMEOUT)
            scope.cancel()

    async def _receive_loop(self, nursery: trio.Nursery) -> str:
        while True:
            try:
                data, ancdata, flags, _ = await self.sock.recvmsg(
                    RECV_BUFFER, ANCILLARY_SPACE, socket.MSG_CMSG_CLOEXEC
                )
            except OSError as exc:
                return f"receive failed: {errno.errorcode.get(exc.errno or 0, exc)}"
            except trio.ClosedResourceError:
                return "dropped by npud"
            truncated = False
            try:
                fds = parse_ancillary(ancdata, flags)
            except TransportError:
                fds, truncated = [], True
            # Ownership of the fds passes to the protocol object, which hands
            # each one back (as a stray or pending fd) for us to close.
            self.protocol.receive_data(data, [fd.detach() for fd in fds], fds_truncated=truncated)
            outcome = await self._drain_events(nursery)
            if outcome is not None:
                return outcome

    async def _drain_events(self, nursery: trio.Nursery) -> str | None:
        while True:
            try:
                event = self.protocol.next_event()
            except p.RemoteProtocolError as exc:
                self.broker.dsp.close_later(self.protocol.take_pending_fds())
                self.log.warning("protocol violation", code=exc.code.name, error=str(exc))
                await self._send_final(p.ErrorMessage.for_code(exc.code, **exc.fields))
                return f"protocol violation: {exc}"
            if event is p.NEED_DATA:
                return None
            if isinstance(event, p.ConnectionClosed):
                return "closed by the client"
            if isinstance(event, p.StrayFds):
                self.broker.dsp.close_later(event.fds)
                self.log.warning("closed fds the client sent unasked", count=len(event.fds))
                continue
            if isinstance(event, p.Hello):
                if not await self._welcome(event):
                    return "refused at hello"
                continue
            self._arrive(event, nursery)

    def _arrive(self, request: p.AnyRequest, nursery: trio.Nursery) -> None:
        """The request's arrival step, here and now (arrival order); its work in a task."""
        handler = HANDLERS[type(request)](self.broker, self.client, request)
        try:
            handler.start()
        except CodedError as exc:
            nursery.start_soon(self._refuse, request, exc)
            return
        nursery.start_soon(self._answer, handler)

    # ----------------------------------------------------------- handshake
    async def _welcome(self, hello: p.Hello) -> bool:
        version = p.choose_protocol_version(hello.protocol_version)
        client = self.client
        client.name = hello.client_name
        self.log = self.log.bind(client=hello.client_name)
        if version is None:
            error = p.ErrorMessage.for_code(
                ErrorCode.UNSUPPORTED_VERSION,
                version=hello.protocol_version,
                minimum=p.MIN_PROTOCOL_VERSION,
                maximum=p.PROTOCOL_VERSION,
            )
            self.log.warning("refused: protocol version", offered=hello.protocol_version)
            await self._send_final(error)
            return False
        try:
            self.broker.clients.admit(client)
        except CodedError as exc:
            self.log.warning("refused", code=exc.code.name, error=str(exc))
            await self._send_final(p.ErrorMessage.for_code(exc.code, **exc.fields))
            return False
        client.priority = self.broker.grant_priority(client, hello.priority)
        client.send_event = self._send_event
        welcome = p.Welcome(
            server_version=__version__,
            protocol_version=version,
            backend=self.broker.profile.kind,
            dsp=self.broker.dsp.capabilities(),
            limits=self.broker.client_limits(client),
            epoch=self.broker.dsp.epoch,
        )
        await self._send(welcome)
        self._welcomed = True
        self.log.info("client welcomed", priority=client.priority.value, asked=hello.priority.value)
        return True

    # ------------------------------------------------------------ requests
    async def _answer(self, handler: Handler[p.AnyRequest]) -> None:
        """Run the request, send its one answer, then let go of what it held: a
        later free or close of those objects answers after this request."""
        answer: Answer | None = None
        try:
            try:
                answer = await handler.run()
            except CodedError as exc:
                await self._refuse(handler.request, exc)
            except Exception as exc:
                # A bug of ours: log it whole, answer the client, keep serving.
                self.log.exception(
                    "request failed", request=p.tag_of(handler.request), id=handler.request.id
                )
                await self._refuse(
                    handler.request,
                    CodedError(ErrorCode.INTERNAL_ERROR, detail=type(exc).__name__),
                )
            if answer is not None:
                await self._send(answer.reply)
        finally:
            if answer is not None and answer.fd is not None:
                answer.fd.close()
            handler.end()

    async def _refuse(self, request: p.AnyRequest, exc: CodedError) -> None:
        """The one place where a refusal becomes the request's ``error`` reply."""
        self.log.info(
            "request refused",
            request=p.tag_of(request),
            id=request.id,
            code=exc.code.name,
            error=str(exc),
        )
        await self._send(p.ErrorMessage.for_code(exc.code, id=request.id, **exc.fields))

    # ---------------------------------------------------------------- send
    async def _send_event(self, event: p.ServerEvent) -> None:
        await self._send(event, timeout=EVENT_SEND_TIMEOUT)

    async def _send(self, message: p.ServerMessage, *, timeout: float = SEND_TIMEOUT) -> None:
        """Write one message; a peer that does not take it within ``timeout`` is dropped.

        A write cut short leaves a partial frame on the stream, so the only
        safe thing after a timeout is to close the connection.
        """
        with trio.move_on_after(timeout) as scope:
            async with self._send_lock:
                if self._closing:
                    return
                try:
                    data, fds = self.protocol.send(message)
                except p.LocalProtocolError as exc:
                    # Our own bug, or a reply too large for the frame limit: the
                    # request still gets its one answer.
                    self.log.error("reply not sendable", error=str(exc), message=p.tag_of(message))
                    request_id = getattr(message, "id", None)
                    if request_id is None or isinstance(message, p.ErrorMessage):
                        return
                    fallback = p.ErrorMessage.for_code(
                        ErrorCode.INTERNAL_ERROR, id=request_id, detail=f"reply not sendable: {exc}"
                    )
                    data, fds = self.protocol.send(fallback)
                await self._write(data, fds)
        if scope.cancelled_caught:
            self.log.warning("client stopped reading; dropping it", timeout=timeout)
            self._drop()

    def _drop(self) -> None:
        self._closing = True
        self.sock.close()  # the receive loop sees it and the connection ends

    async def _send_final(self, message: p.ErrorMessage) -> None:
        await self._send(message)
        self._closing = True

    async def _write(self, data: bytes, fds: list[int]) -> None:
        view = memoryview(data)
        try:
            sent = await self.sock.sendmsg([view], fds_ancillary(fds))
            while sent < len(view):
                sent += await self.sock.send(view[sent:])
        except OSError as exc:
            self.log.info("send failed", error=errno.errorcode.get(exc.errno or 0, str(exc)))
            self._drop()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._closing = True
