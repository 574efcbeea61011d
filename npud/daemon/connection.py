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
from collections.abc import Callable, Sequence
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
from npud.datapath.drain import drain
from npud.datapath.link import FRAME_ANCILLARY_SPACE, Link
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
                finished = trio.Event()
                link = self._make_link(finished)
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

    def _make_link(self, finished: trio.Event) -> Link:
        broker, domain = self.broker, self.domain
        assert domain is not None, "a welcomed client has its domain"
        owner = ClientLink(broker, self.client, domain, finished)
        return Link(
            self.sock,
            self.protocol,
            owner,
            log_context=self.log,
            fds_waiting_cap=broker.config.uid_limits.max_fds_waiting,
            log_budget=self.log_budget,
            refusals_cap=broker.config.daemon.refused_requests_before_drop,
        )

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
            messages, ending = drain(
                self.protocol,
                close_later=self._close_later,
                log=self.log,
                log_budget=self.log_budget,
                fds_waiting_cap=self.broker.config.uid_limits.max_fds_waiting,
                first_only=True,  # what follows the Hello waits for the Welcome
            )
            if messages:
                (hello,) = messages
                assert isinstance(hello, p.Hello)  # the protocol allows nothing else first
                if await self._welcome(hello):
                    return True, ""
                return False, "refused at hello"
            if ending is None:
                continue
            if ending.farewell is None:
                return False, "closed before its Hello"
            # Charged before it is told: its next connection sees this drop.
            self.broker.charge_dropped(self.client, ending.reason)
            await self._send_final(ending.farewell)
            return False, ending.reason

    def _close_later(self, fds: Sequence[int]) -> bool:
        return self.broker.device.close_later(self.client.uid, fds)

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


class ClientLink:
    """A welcomed client's :class:`~npud.datapath.link.LinkOwner`: its requests become
    handlers in its domain, its fds go to the device's closer, the data path watches its
    socket, a violation is charged to its user, a hang-up ends what waits for it (the
    data path's queued calls, an isolated domain's DSP process), and the finish wakes
    the connection's task, which releases the client."""

    def __init__(self, broker: Broker, client: Client, domain: Domain, done: trio.Event) -> None:
        self._broker = broker
        self._client = client
        self._domain = domain
        self._done = done
        self._token = trio.lowlevel.current_trio_token()

    def arrive(self, request: p.AnyRequest) -> Handler[Any]:
        handler = HANDLERS[type(request)](self._client, self._domain, request, self._broker)
        handler.start()
        return handler

    def close_later(self, fds: Sequence[int]) -> bool:
        return self._broker.device.close_later(self._client.uid, fds)

    def arm_write(self, link: Link) -> None:
        self._broker.datapath.arm_write(link)

    def violated(self, link: Link, reason: str) -> None:
        self._broker.charge_dropped(self._client, reason)

    def hung_up(self, link: Link) -> None:
        self._broker.datapath.release_queued(link)  # first: what never started never will
        self._domain.abandoned(link.reason or "hung up")

    def finished(self, link: Link) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._done.set)
