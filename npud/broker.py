"""The broker: one FastRpcSession shared by every client, with per-client tables and quotas.

Runs on the trio thread; every blocking call goes to a lane:

* ``control``: allocation, mapping, remotectl open/close, client release. One
  thread, so these never wait behind an invoke.
* ``realtime``: invokes of realtime clients (voice), one thread of their own.
* ``bulk``: invokes of normal and background clients; normal work is taken
  before background work (LLM decode) when both wait.

Everything a client holds lives in its :class:`ClientState`; ids are
per-connection (they start at 1 and are never reused), so an id from one
client means nothing to another. A client's resources are released when its
connection ends, after any call of it already on the DSP has returned (the
session pins buffers that an invoke uses).

A DSP restart (EPIPE) ends the session: every client's buffers, mappings and
handles are released, a new session is opened as soon as the device is back,
the epoch grows by one and every client is told.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
import trio

import npu_protocol as p
from npu_client.transport import OwnedFd, close_all
from npu_protocol import ErrorCode
from npud import __version__
from npud.backend import Profile
from npud.config import Config
from npud.fastrpc.dma import DmaBuffer, checked_dma_size
from npud.fastrpc.errors import FastRpcError
from npud.fastrpc.invoke_args import Capacity, InArg, Inline, OutArg, Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.shell import VerifiedShell
from npud.lanes import LanePool, LaneTimeoutError

log = structlog.get_logger("npud.broker")

T = TypeVar("T")

BULK_PRIORITY = {p.Priority.NORMAL: 0, p.Priority.BACKGROUND: 1}
RECOVERY_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)
CONTROL_STUCK_SECONDS = 60.0
"""Allocation, mapping and remotectl calls never take this long on a healthy DSP."""


class BrokerError(Exception):
    """A request refused with a stable code; becomes an ErrorMessage."""

    def __init__(self, error: ErrorCode, /, **fields: Any) -> None:
        super().__init__(p.format_message(error, **fields))
        self.code = error
        self.fields = fields


@dataclass(eq=False)
class ClientState:
    """One connection's view of the NPU. Mutated on the trio thread only."""

    pid: int
    uid: int
    gid: int
    name: str = "?"
    priority: p.Priority = p.Priority.NORMAL
    send_event: Callable[[p.ServerEvent], Awaitable[None]] | None = None
    buffers: dict[int, DmaBuffer] = field(default_factory=dict)
    handles: dict[int, int] = field(default_factory=dict)  # client handle id -> DSP handle
    calls_in_flight: int = 0
    calls_done: int = 0
    reserved_buffers: int = 0
    reserved_bytes: int = 0
    reserved_handles: int = 0
    lost_below: int = 0
    """Ids below this were released by a session restart (DSP_RESTARTED, not unknown)."""
    _next_id: int = 1

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def forget_everything(self) -> None:
        """A session restart released what this client held."""
        self.buffers.clear()
        self.handles.clear()
        self.lost_below = self._next_id

    def missing(self, object_id: int, unknown: ErrorCode, field_name: str) -> BrokerError:
        if object_id < self.lost_below:
            return BrokerError(ErrorCode.DSP_RESTARTED)
        return BrokerError(unknown, **{field_name: object_id})

    @property
    def buffer_bytes(self) -> int:
        return sum(b.mapped_size for b in self.buffers.values())

    @property
    def mappings(self) -> int:
        return sum(b.dsp_address is not None for b in self.buffers.values())

    def row(self) -> p.ClientRow:
        return p.ClientRow(
            pid=self.pid,
            uid=self.uid,
            name=self.name,
            priority=self.priority.value,
            buffers=len(self.buffers),
            bytes=self.buffer_bytes,
            mappings=self.mappings,
            handles=len(self.handles),
            calls_in_flight=self.calls_in_flight,
            calls_done=self.calls_done,
        )


class Broker:
    def __init__(self, config: Config, profile: Profile) -> None:
        self.config = config
        self.profile = profile
        self.started = time.monotonic()
        self.driver = profile.make_driver()
        self.control = LanePool("control", 1)
        self.loader = LanePool("loader", 1)  # remotectl open/close: skel loads can be slow
        self.realtime = LanePool("realtime", 1)
        self.bulk = LanePool("bulk", config.backend.lanes)
        self.closer = LanePool("closer", 1)  # closes peer-supplied fds off the trio thread
        self.session: FastRpcSession | None = None
        self.shell: VerifiedShell | None = None
        self.epoch = 0
        self.restarts = 0
        self.clients: set[ClientState] = set()
        self.shutting_down = False
        self.calls_total = 0
        self._recovering = False
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ life
    def attach(self, nursery: trio.Nursery) -> None:
        """Where background work (session recovery) runs."""
        self._nursery = nursery

    async def start(self) -> None:
        """Verify the shell, open the session and load it. Raises on any failure."""
        for pool in self._pools:
            pool.start()
        self.shell = await self.control.call(self.profile.verify_shell)
        self.session = await self._open_session()
        self.epoch = 1
        log.info(
            "session ready",
            backend=self.profile.kind,
            device=self.session.device if self.session else "",
            arch=self.session.capabilities.arch if self.session else "",
            shell=str(self.shell.path),
            shell_sha256=self.shell.sha256,
            epoch=self.epoch,
        )

    async def _open_session(self) -> FastRpcSession:
        assert self.shell is not None
        shell = self.shell

        def open_and_load() -> FastRpcSession:
            session = FastRpcSession.open(
                self.driver, nodes=self.profile.nodes, library_path=self.profile.library_path
            )
            try:
                session.load_shell(shell.data)
            except BaseException:
                session.close()
                raise
            return session

        return await self.control.call(open_and_load)

    async def close(self, grace: float) -> None:
        """Close the session and stop the lanes; calls still on the DSP get ``grace`` seconds."""
        session, self.session = self.session, None
        if session is not None:
            try:
                await self.control.call(lambda: session.close(timeout=grace), timeout=grace + 5)
            except (FastRpcError, LaneTimeoutError) as exc:
                log.error("session not closed cleanly; the kernel frees it at exit", error=str(exc))
        for pool in self._pools:
            if not await trio.to_thread.run_sync(pool.stop, 1.0):
                log.warning("lane still busy at exit", lane=pool.name)

    @property
    def _pools(self) -> tuple[LanePool, ...]:
        return (self.control, self.loader, self.realtime, self.bulk, self.closer)

    def healthy(self) -> bool:
        """Lane threads alive, the control lane not wedged (it only runs short calls),
        and the session usable or being recovered."""
        if not all(pool.alive() for pool in self._pools):
            return False
        if self.control.statistics().oldest_running_seconds >= CONTROL_STUCK_SECONDS:
            return False
        session = self.session
        if session is None:
            return self._recovering or self.shutting_down
        if session.dead:
            return self._recovering
        return session.listener_running

    def check_session(self) -> None:
        """Notice a restart that no request has run into yet (the listener sees it first)."""
        if self.session is not None and self.session.dead:
            self._start_recovery("the DSP restarted (noticed while idle)")

    def close_later(self, fds: Sequence[int]) -> None:
        """Close peer-supplied fds on a lane: a close can block (SO_LINGER, FUSE...)."""
        if fds:
            owned = [OwnedFd(fd) for fd in fds]
            self.closer.submit(lambda: close_all(owned))

    def describe(self) -> str:
        """One line for systemd's STATUS=."""
        if self.session is None:
            dsp = "DSP restarting"
        else:
            arch = self.session.capabilities.arch
            dsp = f"DSP up ({self.profile.kind}, {arch}, epoch {self.epoch})"
        return f"{len(self.clients)} clients; {dsp}"

    # --------------------------------------------------------------- clients
    def admit(self, client: ClientState) -> None:
        limits = self.config.limits
        if len(self.clients) >= limits.max_clients:
            raise BrokerError(
                ErrorCode.QUOTA_EXCEEDED, resource="clients", limit=limits.max_clients
            )
        self.clients.add(client)

    def grant_priority(self, client: ClientState, asked: p.Priority) -> p.Priority:
        access = self.config.access
        if asked is p.Priority.REALTIME and (access.realtime_uids or access.realtime_gids):
            allowed = (
                client.uid in (0, os.getuid())
                or client.uid in access.realtime_uids
                or client.gid in access.realtime_gids
            )
            if not allowed:
                return p.Priority.NORMAL
        return asked

    def client_limits(self, client: ClientState) -> p.ClientLimits:
        limits = self.config.client_limits
        return p.ClientLimits(
            priority=client.priority,
            max_in_flight=limits.max_calls_in_flight,
            max_buffers=limits.max_buffers,
            max_buffer_bytes=limits.max_buffer_bytes,
            max_handles=limits.max_handles,
        )

    def capabilities(self) -> p.DspCapabilities:
        caps = self.session.capabilities if self.session else None
        if caps is None or not caps.available:
            return p.DspCapabilities()
        return p.DspCapabilities(
            unsigned_pd_support=int(caps.unsigned_pd),
            hvx_support_64b=caps.hvx_64b,
            hvx_support_128b=caps.hvx_128b,
            vtcm_page=caps.vtcm_page,
            vtcm_count=caps.vtcm_count,
            arch_ver=caps.arch_version,
            hmx_support_depth=caps.hmx_depth,
            hmx_support_spatial=caps.hmx_spatial,
            async_fastrpc_support=int(caps.async_fastrpc),
        )

    async def release_client(self, client: ClientState) -> None:
        """Free everything ``client`` holds. Call after its requests have ended."""
        self.clients.discard(client)
        buffers = list(client.buffers.values())
        handles = list(client.handles.values())
        client.buffers.clear()
        client.handles.clear()
        session = self.session
        if session is None or (not buffers and not handles) or self.shutting_down:
            return  # at shutdown, closing the session releases everything at once

        def release() -> None:
            for handle in handles:
                try:
                    session.remote_close(handle)
                except FastRpcError as exc:
                    log.warning("remote close at release failed", handle=handle, error=str(exc))
            for buffer in buffers:
                try:
                    session.free(buffer)  # deferred by the session while an invoke uses it
                except FastRpcError as exc:
                    log.warning("free at release failed", buffer=buffer.id, error=str(exc))

        with trio.CancelScope(shield=True):
            await self.control.call(release)

    # -------------------------------------------------------------- requests
    async def alloc(self, client: ClientState, size: int) -> tuple[int, DmaBuffer, OwnedFd]:
        """A new buffer for ``client``, with a dup of its fd for the reply.

        The dup is made on the lane, before any other request can free the
        buffer: the reply must carry this buffer's file, never whatever file
        reuses a closed fd number. The caller closes the dup once sent.
        """
        session = self._session()
        try:
            rounded = checked_dma_size(size)
        except FastRpcError as exc:
            raise BrokerError(exc.code, **exc.fields) from None
        self._check_buffer_quota(client, rounded)

        def allocate() -> tuple[DmaBuffer, OwnedFd]:
            buffer = session.alloc(size)
            try:
                return buffer, OwnedFd(os.dup(buffer.fd))
            except OSError as exc:
                session.free(buffer)
                raise FastRpcError(
                    ErrorCode.DMA_BUF_ALLOC, msg=f"no fd for the reply: {exc.strerror}"
                ) from None

        def abandoned(result: tuple[DmaBuffer, OwnedFd]) -> None:
            result[1].close()
            session.free(result[0])

        client.reserved_buffers += 1
        client.reserved_bytes += rounded
        try:
            buffer, reply_fd = await self._run(self.control, allocate, on_abandoned=abandoned)
        finally:
            client.reserved_buffers -= 1
            client.reserved_bytes -= rounded
        buffer_id = client.new_id()
        client.buffers[buffer_id] = buffer
        return buffer_id, buffer, reply_fd

    def _check_buffer_quota(self, client: ClientState, size: int) -> None:
        mine = self.config.client_limits
        if len(client.buffers) + client.reserved_buffers >= mine.max_buffers:
            raise BrokerError(ErrorCode.QUOTA_EXCEEDED, resource="buffers", limit=mine.max_buffers)
        if client.buffer_bytes + client.reserved_bytes + size > mine.max_buffer_bytes:
            raise BrokerError(
                ErrorCode.QUOTA_EXCEEDED, resource="buffer bytes", limit=mine.max_buffer_bytes
            )
        everyone = self.config.limits
        buffers = sum(len(c.buffers) + c.reserved_buffers for c in self.clients)
        if buffers >= everyone.max_buffers:
            raise BrokerError(
                ErrorCode.QUOTA_EXCEEDED, resource="daemon buffers", limit=everyone.max_buffers
            )
        used = sum(c.buffer_bytes + c.reserved_bytes for c in self.clients)
        if used + size > everyone.max_buffer_bytes:
            raise BrokerError(
                ErrorCode.QUOTA_EXCEEDED,
                resource="daemon buffer bytes",
                limit=everyone.max_buffer_bytes,
            )

    async def free(self, client: ClientState, buffer_id: int) -> None:
        session = self._session()
        buffer = self._buffer(client, buffer_id)
        del client.buffers[buffer_id]
        # Shielded: once out of the table, the buffer must be freed even if the
        # client hangs up now (it is a short call).
        with trio.CancelScope(shield=True):
            await self._run(self.control, lambda: session.free(buffer))

    async def map(self, client: ClientState, buffer_id: int) -> int:
        session = self._session()
        buffer = self._buffer(client, buffer_id)
        return await self._run(self.control, lambda: session.map(buffer))

    async def unmap(self, client: ClientState, buffer_id: int) -> None:
        session = self._session()
        buffer = self._buffer(client, buffer_id)
        if buffer.dsp_address is None:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT, detail=f"buffer {buffer_id} is not mapped"
            )
        await self._run(self.control, lambda: session.unmap(buffer))

    async def open(self, client: ClientState, uri: str) -> int:
        session = self._session()
        limit = self.config.client_limits.max_handles
        if len(client.handles) + client.reserved_handles >= limit:
            raise BrokerError(ErrorCode.QUOTA_EXCEEDED, resource="handles", limit=limit)
        client.reserved_handles += 1
        try:
            handle = await self._run(
                self.loader, lambda: session.remote_open(uri), on_abandoned=session.remote_close
            )
        finally:
            client.reserved_handles -= 1
        handle_id = client.new_id()
        client.handles[handle_id] = handle
        return handle_id

    async def close_handle(self, client: ClientState, handle_id: int) -> None:
        session = self._session()
        handle = client.handles.pop(handle_id, None)
        if handle is None:
            raise client.missing(handle_id, ErrorCode.UNKNOWN_HANDLE, "handle")
        with trio.CancelScope(shield=True):  # as for free: out of the table, so close it
            await self._run(self.loader, lambda: session.remote_close(handle))

    async def invoke(
        self, client: ClientState, request: p.InvokeRequest
    ) -> tuple[bytes | None, ...]:
        session = self._session()
        handle = client.handles.get(request.handle)
        if handle is None:
            raise client.missing(request.handle, ErrorCode.UNKNOWN_HANDLE, "handle")
        limit = self.config.client_limits.max_calls_in_flight
        if client.calls_in_flight >= limit:
            raise BrokerError(ErrorCode.QUOTA_EXCEEDED, resource="calls in flight", limit=limit)
        limits = self.client_limits(client)
        for resource, used in (
            ("inline input bytes", request.inline_input_bytes),
            ("inline output bytes", request.inline_output_bytes),
        ):
            if used > limits.max_inline_bytes:
                raise BrokerError(
                    ErrorCode.QUOTA_EXCEEDED, resource=resource, limit=limits.max_inline_bytes
                )
        if request.timeout_ms is not None and request.timeout_ms > limits.max_timeout_ms:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"timeout_ms {request.timeout_ms} exceeds max_timeout_ms "
                f"{limits.max_timeout_ms}",
            )
        inputs: list[InArg] = [
            Inline(arg.data) if isinstance(arg, p.InlineInput) else self._slice(client, arg)
            for arg in request.inputs
        ]
        outputs: list[OutArg] = [
            Capacity(arg.capacity) if isinstance(arg, p.InlineOutput) else self._slice(client, arg)
            for arg in request.outputs
        ]
        sc = request.scalars
        timeout = request.timeout_ms
        if client.priority is p.Priority.REALTIME:
            pool, priority = self.realtime, 0
        else:
            pool, priority = self.bulk, BULK_PRIORITY[client.priority]
        client.calls_in_flight += 1
        try:
            result = await self._run(
                pool,
                lambda: session.invoke(handle, sc, inputs, outputs),
                priority=priority,
                timeout=None if timeout is None else timeout / 1000,
                operation="invoke",
                timeout_ms=timeout,
            )
        finally:
            client.calls_in_flight -= 1
            client.calls_done += 1
            self.calls_total += 1
        if result.rc != 0:
            raise BrokerError(ErrorCode.INVOKE_FAILED, code=result.rc)
        return result.outputs

    def status(self) -> p.DaemonStatus:
        clients = sorted(self.clients, key=lambda c: c.pid)
        totals = p.Totals(
            clients=len(clients),
            buffers=sum(len(c.buffers) for c in clients),
            bytes=sum(c.buffer_bytes for c in clients),
            mappings=sum(c.mappings for c in clients),
            handles=sum(len(c.handles) for c in clients),
            calls_in_flight=sum(c.calls_in_flight for c in clients),
            calls_done=sum(c.calls_done for c in clients),
        )
        shell = (
            p.ShellStatus(
                verified=True,
                path=str(self.shell.path),
                sha256=self.shell.sha256,
                detail=f"{self.shell.size} bytes, key {self.shell.key_fingerprint[:16]}"
                + (" (development key)" if self.profile.allow_development_key else ""),
            )
            if self.shell
            else p.ShellStatus(verified=False)
        )
        return p.DaemonStatus(
            daemon_version=__version__,
            uptime_ms=int((time.monotonic() - self.started) * 1000),
            backend=self.profile.kind,
            device=self.session.device if self.session else "",
            dsp=self.capabilities(),
            shell=shell,
            epoch=self.epoch,
            restarts=self.restarts,
            totals=totals,
            clients=tuple(c.row() for c in clients[: p.MAX_STATUS_CLIENTS]),
        )

    # --------------------------------------------------------------- helpers
    def _session(self) -> FastRpcSession:
        if self.shutting_down:
            raise BrokerError(ErrorCode.SHUTTING_DOWN)
        if self.session is None:
            raise BrokerError(ErrorCode.DSP_RESTARTED)
        if self.session.dead:
            self._start_recovery("the DSP restarted")
            raise BrokerError(ErrorCode.DSP_RESTARTED)
        return self.session

    @staticmethod
    def _buffer(client: ClientState, buffer_id: int) -> DmaBuffer:
        buffer = client.buffers.get(buffer_id)
        if buffer is None:
            raise client.missing(buffer_id, ErrorCode.UNKNOWN_BUFFER, "buffer")
        return buffer

    def _slice(self, client: ClientState, arg: p.BufferSlice) -> Slice:
        buffer = self._buffer(client, arg.buffer)
        if arg.offset + arg.length > buffer.size:
            raise BrokerError(
                ErrorCode.SLICE_OUT_OF_RANGE,
                offset=arg.offset,
                length=arg.length,
                buffer=arg.buffer,
                size=buffer.size,
            )
        return Slice(buffer, arg.offset, arg.length)

    async def _run(
        self,
        pool: LanePool,
        fn: Callable[[], T],
        *,
        priority: int = 0,
        timeout: float | None = None,
        on_abandoned: Callable[[T], object] | None = None,
        operation: str = "",
        timeout_ms: int | None = None,
    ) -> T:
        """Run on a lane; translate failures to BrokerError; notice DSP restarts."""
        session = self.session
        try:
            result = await pool.call(
                fn, priority=priority, timeout=timeout, on_abandoned=on_abandoned
            )
        except LaneTimeoutError:
            raise BrokerError(
                ErrorCode.TIMEOUT, operation=operation, timeout_ms=timeout_ms
            ) from None
        except FastRpcError as exc:
            if exc.code is ErrorCode.DSP_RESTARTED and session is self.session:
                self._start_recovery(str(exc))
            raise BrokerError(exc.code, **exc.fields) from None
        if session is not self.session:
            # The DSP restarted while this ran: what it made died with the old
            # session (whose close releases it).
            raise BrokerError(ErrorCode.DSP_RESTARTED)
        return result

    # -------------------------------------------------------------- restarts
    def _start_recovery(self, reason: str) -> None:
        if self._recovering or self.shutting_down or self._nursery is None:
            return
        self._recovering = True
        self._nursery.start_soon(self._recover, reason)

    async def _recover(self, reason: str) -> None:
        old, self.session = self.session, None
        log.error("DSP restarted; releasing every client's DSP state", reason=reason)
        for client in self.clients:
            client.forget_everything()
        if old is not None:
            await self._release_dead_session(old)
        for attempt in itertools.count():
            if self.shutting_down:
                return
            try:
                session = await self._open_session()
                break
            except FastRpcError as exc:
                delay = RECOVERY_BACKOFF[min(attempt, len(RECOVERY_BACKOFF) - 1)]
                log.warning("DSP not back yet", error=str(exc), retry_in=delay)
                await trio.sleep(delay)
        self.epoch += 1
        self.restarts += 1
        # Every client hears of the new epoch before any answer from the new
        # session can reach it: clients drop what they held when they see it.
        await self.broadcast(p.SessionRestarted(epoch=self.epoch, reason=reason))
        self.session = session
        self._recovering = False
        log.info("session reopened", epoch=self.epoch)

    async def _release_dead_session(self, session: FastRpcSession) -> None:
        with trio.CancelScope(shield=True):
            await self.control.call(session.close)

    async def broadcast(self, event: p.ServerEvent) -> None:
        """Tell every client at once; one that cannot take it promptly is dropped."""
        async with trio.open_nursery() as nursery:
            for client in list(self.clients):
                if client.send_event is not None:
                    nursery.start_soon(client.send_event, event)

    def stop_waiting(self) -> None:
        for pool in self._pools:
            pool.stop_waiting()
