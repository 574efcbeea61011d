"""One client connection: bytes and fds in, requests to the broker, replies out.

The sans-IO ``npu_protocol.ServerConnection`` does the framing and the
bookkeeping; this module does the socket I/O on trio. Each request runs in its
own task, so requests are pipelined and replies go out in completion order.

Peer garbage never becomes a traceback: a protocol violation is answered with
one ErrorMessage (no id) and the connection is closed; a refused request gets
an ErrorMessage with its id. However the connection ends, the client's
resources are released (after calls already on the DSP have returned).
"""

from __future__ import annotations

import contextlib
import errno
import socket
from typing import Final

import structlog
import trio

import npu_protocol as p
from npu_client.transport import (
    ANCILLARY_SPACE,
    RECV_BUFFER,
    OwnedFd,
    TransportError,
    close_all,
    fds_ancillary,
    parse_ancillary,
)
from npu_protocol import ErrorCode
from npud import __version__
from npud.broker import Broker, BrokerError, ClientState

SEND_TIMEOUT: Final = 30.0
"""A client that does not read its replies for this long is dropped."""


class ClientConnection:
    def __init__(self, broker: Broker, sock: trio.socket.SocketType, client: ClientState) -> None:
        self.broker = broker
        self.sock = sock
        self.client = client
        self.protocol = p.ServerConnection()
        self.log = structlog.get_logger("npud.client").bind(
            pid=client.pid, uid=client.uid, client="?"
        )
        self._send_lock = trio.Lock()
        self._closing = False

    # ------------------------------------------------------------------ run
    async def serve(self) -> None:
        """Serve until the peer leaves or breaks the protocol; then release everything."""
        self.log.info("client connected")
        reason = "closed by the client"
        try:
            async with trio.open_nursery() as nursery:
                reason = await self._receive_loop(nursery)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.broker.release_client(self.client)
                self.sock.close()
            self.log.info("client disconnected", reason=reason, calls_done=self.client.calls_done)

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
                self._close_fds(self.protocol.take_pending_fds())
                self.log.warning("protocol violation", code=exc.code.name, error=str(exc))
                await self._send_final(p.ErrorMessage.for_code(exc.code, **exc.fields))
                return f"protocol violation: {exc}"
            if event is p.NEED_DATA:
                return None
            if isinstance(event, p.ConnectionClosed):
                return "closed by the client"
            if isinstance(event, p.StrayFds):
                self._close_fds(event.fds)
                self.log.warning("closed fds the client sent unasked", count=len(event.fds))
                continue
            if isinstance(event, p.Hello):
                if not await self._welcome(event):
                    return "refused at hello"
                continue
            nursery.start_soon(self._answer, event)

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
            self.broker.admit(client)
        except BrokerError as exc:
            self.log.warning("refused", code=exc.code.name, error=str(exc))
            await self._send_final(p.ErrorMessage.for_code(exc.code, **exc.fields))
            return False
        client.priority = self.broker.grant_priority(client, hello.priority)
        client.send_event = self._send_event
        welcome = p.Welcome(
            server_version=__version__,
            protocol_version=version,
            backend=self.broker.profile.kind,
            dsp=self.broker.capabilities(),
            limits=self.broker.client_limits(client),
            epoch=self.broker.epoch,
        )
        await self._send(welcome)
        self.log.info("client welcomed", priority=client.priority.value, asked=hello.priority.value)
        return True

    # ------------------------------------------------------------ requests
    async def _answer(self, request: p.AnyRequest) -> None:
        try:
            reply = await self._handle(request)
        except Exception as exc:
            if not isinstance(exc, BrokerError):
                # A bug of ours: log it whole, answer the client, keep serving.
                self.log.exception("request failed", request=p.tag_of(request), id=request.id)
                exc = BrokerError(ErrorCode.INTERNAL_ERROR, detail=type(exc).__name__)
            self.log.info(
                "request refused",
                request=p.tag_of(request),
                id=request.id,
                code=exc.code.name,
                error=str(exc),
            )
            await self._send(p.ErrorMessage.for_code(exc.code, id=request.id, **exc.fields))
            return
        await self._send(reply)

    async def _handle(self, request: p.AnyRequest) -> p.AnyReply:
        broker, client = self.broker, self.client
        if isinstance(request, p.InvokeRequest):
            outputs = await broker.invoke(client, request)
            return p.InvokeReply(id=request.id, outputs=outputs)
        if isinstance(request, p.AllocRequest):
            buffer_id, buffer = await broker.alloc(client, request.size)
            return p.AllocReply(
                id=request.id, buffer=buffer_id, size=buffer.mapped_size, fd=buffer.fd
            )
        if isinstance(request, p.FreeRequest):
            await broker.free(client, request.buffer)
            return p.FreeReply(id=request.id)
        if isinstance(request, p.MapRequest):
            address = await broker.map(client, request.buffer)
            return p.MapReply(id=request.id, dsp_address=address)
        if isinstance(request, p.UnmapRequest):
            await broker.unmap(client, request.buffer)
            return p.UnmapReply(id=request.id)
        if isinstance(request, p.OpenRequest):
            handle = await broker.open(client, request.uri)
            return p.OpenReply(id=request.id, handle=handle)
        if isinstance(request, p.CloseRequest):
            await broker.close_handle(client, request.handle)
            return p.CloseReply(id=request.id)
        if isinstance(request, p.StatusRequest):
            return p.StatusReply(id=request.id, status=broker.status())
        return p.PongReply(id=request.id, payload=request.payload)

    # ---------------------------------------------------------------- send
    async def _send_event(self, event: p.ServerEvent) -> None:
        # A client that is leaving is cleaned up by its own connection task.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await self._send(event)

    async def _send(self, message: p.ServerMessage) -> None:
        async with self._send_lock:
            if self._closing:
                return
            try:
                data, fds = self.protocol.send(message)
            except p.LocalProtocolError as exc:
                # Our own bug or a closed connection: never crash the daemon for it.
                self.log.error("reply not sendable", error=str(exc), message=p.tag_of(message))
                return
            with trio.move_on_after(SEND_TIMEOUT) as scope:
                await self._write(data, fds)
            if scope.cancelled_caught:
                self.log.warning("client stopped reading; dropping it")
                self._closing = True
                self.sock.close()

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
            self._closing = True
            self.log.info("send failed", error=errno.errorcode.get(exc.errno or 0, str(exc)))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._closing = True

    @staticmethod
    def _close_fds(fds: list[int] | tuple[int, ...]) -> None:
        close_all(OwnedFd(fd) for fd in fds)
