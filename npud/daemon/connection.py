"""One client connection on the trio side: the handshake, then the hand-over.

The peer's first frame must be a Hello within ``HELLO_TIMEOUT``; it is
answered with a Welcome (or an error without id, and the connection ends).
From the Welcome on, the connection's requests travel on the data path
(:mod:`npud.datapath.workers`): this module waits, without touching a request, until
the data path reports the connection finished (the peer left, broke the
protocol or was dropped, and every request of it ended), then releases what
the client held and closes the socket. Events reach the client through the
data path's link, which never blocks.

Peer garbage never becomes a traceback: a protocol violation is answered with
one ErrorMessage (no id) and the connection is closed; a client leaving,
however it leaves, is one info line.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable
from typing import Any, Final

import structlog
import trio

import npu_protocol as p
from npu_client.transport import (
    TransportError,
    fds_ancillary,
    parse_ancillary,
)
from npu_protocol import CodedError, ErrorCode
from npud import __version__
from npud.daemon.broker import Broker
from npud.datapath.link import FRAME_ANCILLARY_SPACE, Link, fds_waiting_refusal
from npud.domain.life import Domain
from npud.ops.loglimit import LogBudget
from npud.ops.loglimit import fields as log_fields
from npud.requests import HANDLERS, Handler
from npud.requests.clients import Client

HANDSHAKE_READ: Final = 64 * 1024


class PeerConnection:
    """The daemon's end of one client's connection."""

    def __init__(self, broker: Broker, sock: socket.socket, client: Client) -> None:
        self.broker = broker
        self.sock = sock
        self._trio_sock = trio.socket.from_stdlib_socket(sock)
        self.client = client
        self.protocol = p.ServerConnection()
        self.log = structlog.get_logger("npud.client").bind(
            pid=client.pid, uid=client.uid, client="?"
        )
        self._admitted = False
        self.log_budget = LogBudget(
            broker.config.daemon.log_burst, broker.config.daemon.log_summary_interval_s
        )
        """The lines this peer may cause, from its first byte on (the link's too)."""
        self.domain: Domain | None = None
        """The domain the client's calls run in (from its Hello on)."""
        self._link: Link | None = None
        self._revoked: str | None = None
        self._handshake_scope: trio.CancelScope | None = None

    # ------------------------------------------------------------------ run
    async def serve(self, handshake_over: Callable[[], None] = lambda: None) -> None:
        """Serve until the peer leaves or breaks the protocol; then release everything.

        ``handshake_over`` is called once the Hello was answered or the handshake
        failed: the connection no longer holds a handshake slot.
        """
        self.log.info("client connected")
        reason = "closed by the client"
        held_back = 0
        link: Link | None = None
        timeout = self.broker.config.daemon.hello_timeout_s
        try:
            try:
                with trio.move_on_after(timeout) as hello_deadline:
                    self._handshake_scope = hello_deadline
                    welcomed, reason = await self._handshake()
            finally:
                self._handshake_scope = None
                handshake_over()
            if self._revoked is not None:
                welcomed, reason = False, "access revoked"
            elif hello_deadline.cancelled_caught:
                self.log.warning("no Hello within the deadline; closing", seconds=timeout)
                welcomed, reason = False, "no Hello in time"
            if welcomed:
                link = self._make_link()
                finished = trio.Event()
                token = trio.lowlevel.current_trio_token()
                link.on_finished = lambda _link: _set_soon(token, finished)
                domain = self.domain
                assert domain is not None
                link.on_hangup = lambda gone: domain.abandoned(gone.reason or "hung up")
                self.client.send_event = link.send
                self._link = link
                self.broker.welcomed(self.client, self.revoke)
                self.broker.datapath.add(link)
                reason = "npud is stopping"  # unless the link ends first
                await finished.wait()
                reason = "closed by the client"
        finally:
            if link is not None:
                reason = link.reason or reason
            held_back = self.log_budget.held_back
            with trio.CancelScope(shield=True):
                # Fds of a frame the peer began and never finished are closed here,
                # however the connection ended (hang-up, reset, refusal, timeout).
                if link is not None:
                    self.broker.datapath.remove(link)
                    link.release_pending_fds()  # a worker may still be inside its read
                else:
                    self.broker.device.close_later(
                        self.client.uid, self.protocol.take_pending_fds()
                    )
                if self._admitted:
                    await self.broker.release_client(self.client, self.domain)
                self._trio_sock.close()
            self.log.info(
                "client disconnected",
                reason=reason,
                calls_done=self.client.calls_done,
                **log_fields(held_back),
            )

    def revoke(self, detail: str) -> None:
        """The client may no longer use npud (a reload took it off the allow-list): tell
        it (an error without id, NOT_PERMITTED) and close. Trio thread."""
        self._revoked = detail
        self.log.warning("access revoked; closing", detail=detail)
        link = self._link
        if link is not None:
            link.send(p.ErrorMessage.for_code(ErrorCode.NOT_PERMITTED, detail=detail))
            link.drop("access revoked")
        elif self._handshake_scope is not None:
            self._handshake_scope.cancel()

    def _make_link(self) -> Link:
        broker, client, domain = self.broker, self.client, self.domain
        assert domain is not None, "a welcomed client has its domain"

        def arrive(request: p.AnyRequest) -> Handler[Any]:
            handler = HANDLERS[type(request)](client, domain, request)
            handler.start()
            return handler

        link = Link(
            self.sock,
            self.protocol,
            log_context=self.log,
            arrive=arrive,
            on_finished=lambda _link: None,
            close_later=lambda fds: broker.device.close_later(client.uid, fds),
            fds_waiting_cap=broker.config.uid_limits.max_fds_waiting,
            log_budget=self.log_budget,
            refusals_cap=broker.config.daemon.refused_requests_before_drop,
        )
        link.on_violation = lambda reason: broker.charge_dropped(client, reason)
        return link

    # ----------------------------------------------------------- handshake
    async def _handshake(self) -> tuple[bool, str]:
        """Read until the Hello and answer it: (welcomed, why not)."""
        while True:
            try:
                data, ancdata, flags, _ = await self._trio_sock.recvmsg(
                    HANDSHAKE_READ, FRAME_ANCILLARY_SPACE, socket.MSG_CMSG_CLOEXEC
                )
            except OSError as exc:
                return False, f"receive failed: {errno.errorcode.get(exc.errno or 0, exc)}"
            truncated = False
            try:
                fds = parse_ancillary(ancdata, flags)
            except TransportError:
                fds, truncated = [], True
            # The protocol object owns the fds from here; it hands each back.
            self.protocol.receive_data(data, [fd.detach() for fd in fds], fds_truncated=truncated)
            while True:
                try:
                    event = self.protocol.next_event()
                except p.RemoteProtocolError as exc:
                    self.broker.device.close_later(
                        self.client.uid, self.protocol.take_pending_fds()
                    )
                    self.log.warning("protocol violation", code=exc.code.name, error=str(exc))
                    # Charged before it is told: its next connection sees this drop.
                    self.broker.charge_dropped(self.client, f"protocol violation: {exc}")
                    await self._send_final(p.ErrorMessage.for_code(exc.code, **exc.fields))
                    return False, f"protocol violation: {exc}"
                if event is p.NEED_DATA:
                    break
                if isinstance(event, p.ConnectionClosed):
                    return False, "closed before its Hello"
                if isinstance(event, p.StrayFds):
                    held = self.log_budget.take()  # fds on every byte: an event each
                    if held is not None:
                        self.log.warning(
                            "closed fds the client sent unasked",
                            count=len(event.fds),
                            **log_fields(held),
                        )
                    if not self.broker.device.close_later(self.client.uid, event.fds):
                        # As the data path does (Link._drop_for_fds_locked): say why, then close.
                        self.log.warning("dropped: its user's fds pile up waiting to be closed")
                        self.broker.charge_dropped(self.client, "too many fds waiting")
                        await self._send_final(
                            fds_waiting_refusal(self.broker.config.uid_limits.max_fds_waiting)
                        )
                        return False, "too many of its user's fds wait to be closed"
                    continue
                assert isinstance(event, p.Hello)  # the protocol allows nothing else first
                if await self._welcome(event):
                    return True, ""
                return False, "refused at hello"

    async def _welcome(self, hello: p.Hello) -> bool:
        version = p.choose_protocol_version(hello.protocol_version)
        client = self.client
        client.name = hello.client_name
        self.log = self.log.bind(client=hello.client_name)
        if version is None:
            self.log.warning("refused: protocol version", offered=hello.protocol_version)
            await self._send_final(
                p.ErrorMessage.for_code(
                    ErrorCode.UNSUPPORTED_VERSION,
                    version=hello.protocol_version,
                    minimum=p.MIN_PROTOCOL_VERSION,
                    maximum=p.PROTOCOL_VERSION,
                )
            )
            return False
        client.priority = self.broker.grant_priority(client, hello.priority)
        client.protocol_version = version
        try:
            domain = await self.broker.admit(
                client, hello.budget, isolate=hello.isolate, watch=hello.watch
            )
        except CodedError as exc:
            self.log.warning("refused", code=exc.code.name, error=str(exc))
            await self._send_final(p.ErrorMessage.for_code(exc.code, **exc.fields))
            return False
        self._admitted = True
        self.domain = domain
        self.log = self.log.bind(domain=domain.name)
        assert client.limits is not None
        welcome = p.Welcome(
            server_version=__version__,
            protocol_version=version,
            backend=self.broker.profile.kind,
            dsp=domain.capabilities(),
            limits=client.limits,
            epoch=0 if client.watch_only else domain.epoch,
            domain="" if client.watch_only else domain.name,
            own_pool=self._own_pool(version),
        )
        if not await self._send(welcome):
            return False
        self.log.info(
            "client welcomed",
            priority=client.priority.value,
            asked=hello.priority.value,
            protocol_version=version,
            budget_us=None if hello.budget is None else hello.budget.budget_us,
            period_us=None if hello.budget is None else hello.budget.period_us,
        )
        return True

    def _own_pool(self, version: int) -> p.OwnPool | None:
        """What the Welcome says of the pool: only when what this client frees comes
        back to it alone (share = client), which lets it keep its mappings."""
        memory = self.broker.device.memory
        if (
            not p.speaks(version, p.Feature.LIBCDSPRPC)
            or memory is None
            or not self.client.pools_freed_buffers
        ):
            return None
        settings = memory.pool.settings
        if not settings.enabled or settings.share != "client":
            return None
        return p.OwnPool(
            idle_ms=round(settings.idle_s * 1000), max_buffer_bytes=settings.max_buffer_bytes
        )

    # ---------------------------------------------------------------- send
    async def _send(self, message: p.ServerMessage) -> bool:
        """Write one handshake message; False if the peer is gone."""
        try:
            data, fds = self.protocol.send(message)
        except p.LocalProtocolError as exc:
            self.log.info("message not sent", error=str(exc), message=p.tag_of(message))
            return False
        view = memoryview(data)
        try:
            sent = await self._trio_sock.sendmsg([view], fds_ancillary(fds))
            while sent < len(view):
                sent += await self._trio_sock.send(view[sent:])
        except OSError as exc:
            self.log.info("send failed", error=errno.errorcode.get(exc.errno or 0, str(exc)))
            return False
        return True

    async def _send_final(self, message: p.ErrorMessage) -> None:
        with trio.move_on_after(1.0):
            await self._send(message)


def _set_soon(token: trio.lowlevel.TrioToken, event: trio.Event) -> None:
    with contextlib.suppress(trio.RunFinishedError):
        token.run_sync_soon(event.set)
