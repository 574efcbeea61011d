"""The trio client: the blocking client's methods, awaited.

Needs trio (``pip install npu-client[trio]``); ``import npu_client`` does not
import this module. Use ``async with npu_client.open_trio_client() as npu:``
or ``npu = await npu_client.trio_client.connect()`` (then ``await
npu.close()``).

Like the blocking client it has no background task: whichever waiting task
finds nobody reading reads for everyone. Tasks may call concurrently; each
waits only for its own answer. Cancelling a call abandons its answer (the
request itself has already gone to the daemon and runs to its end; an
abandoned alloc's fd is closed, its buffer lives until the connection ends).
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final, Self, TypeVar

import trio

from npu_client._args import (
    InvokeInput,
    InvokeOutput,
    check_ping_payload,
    check_size,
    check_uri,
    invoke_request,
)
from npu_client._core import (
    ClientCore,
    ClientStatistics,
    DaemonView,
    EventCallback,
    HandleIdentity,
    Pending,
)
from npu_client._errors import ConnectFailed, ConnectionClosedError, DspRestarted, NpuError
from npu_client._memory import MappedBuffer, restart_reason
from npu_client._settings import (
    client_name,
    connect_failure_message,
    priority_class,
    socket_path,
)
from npu_client.transport import (
    MAX_FDS_PER_MESSAGE,
    RECV_BUFFER,
    OwnedFd,
    TransportError,
    fds_ancillary,
    parse_ancillary,
)
from npu_protocol import (
    AllocReply,
    AllocRequest,
    AnyRequest,
    CloseReply,
    CloseRequest,
    DaemonStatus,
    ErrorCode,
    FreeReply,
    FreeRequest,
    InvokeReply,
    MapReply,
    MapRequest,
    OpenReply,
    OpenRequest,
    PingRequest,
    PongReply,
    Priority,
    Reply,
    ServerEvent,
    SessionRestarted,
    StatusReply,
    StatusRequest,
    UnmapReply,
    UnmapRequest,
)

__all__ = [
    "TrioClient",
    "TrioDmaBuffer",
    "TrioRemoteHandle",
    "connect",
    "open_trio_client",
]

_log: Final = logging.getLogger("npu_client")
_ANCILLARY_SPACE: Final = socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * array.array("i").itemsize)

R = TypeVar("R", bound=Reply)


async def connect(
    path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    priority: Priority | str = Priority.NORMAL,
    on_event: EventCallback | None = None,
) -> TrioClient:
    """Connect to npud and shake hands. Arguments as ``npu_client.connect`` (use
    ``trio.move_on_after`` / ``fail_after`` for timeouts). Close with ``await
    client.close()``."""
    resolved = socket_path(path)
    core = ClientCore(client_name(name), priority_class(priority))
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.connect(resolved)
    except OSError as exc:
        sock.close()
        raise ConnectFailed(connect_failure_message(resolved, exc), path=resolved) from exc
    except BaseException:
        sock.close()
        raise
    client = TrioClient(sock, core, path=resolved, on_event=on_event)
    try:
        await client._handshake()
    except BaseException:
        client._close_now()
        raise
    return client


@contextlib.asynccontextmanager
async def open_trio_client(
    path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    priority: Priority | str = Priority.NORMAL,
    on_event: EventCallback | None = None,
) -> AsyncIterator[TrioClient]:
    """``async with open_trio_client() as npu:`` a connected client, closed on exit."""
    client = await connect(path, name=name, priority=priority, on_event=on_event)
    try:
        yield client
    finally:
        client._close_now()


class TrioClient(DaemonView):
    """A connection to npud for trio code; see ``npu_client.Client`` for the semantics."""

    def __init__(
        self,
        sock: trio.socket.SocketType,
        core: ClientCore,
        *,
        path: str,
        on_event: EventCallback | None,
    ) -> None:
        """Internal: use :func:`connect` or :func:`open_trio_client`. Owns ``sock``."""
        self._sock = sock
        self._core = core
        self._path = path
        self._on_event = on_event
        self._send_lock = trio.Lock()
        self._reading = False
        self._progress = trio.Event()
        self._closed = False
        self._buffers: dict[int, TrioDmaBuffer] = {}

    # --- what the daemon said -----------------------------------------------------------

    @property
    def buffers(self) -> tuple[TrioDmaBuffer, ...]:
        return tuple(self._buffers.values())

    def statistics(self) -> ClientStatistics:
        return self._core.statistics(
            buffers=len(self._buffers), buffer_bytes=sum(b.size for b in self._buffers.values())
        )

    # --- requests ---------------------------------------------------------------------------

    async def alloc(self, size: int) -> TrioDmaBuffer:
        size = check_size(size)
        reply, pending = await self._call(lambda rid: AllocRequest(id=rid, size=size), AllocReply)
        fd = pending.take_fd()
        try:
            buffer = TrioDmaBuffer(self, reply.buffer, reply.size, fd, pending.epoch)
        except (OSError, ValueError):
            await self._free_quietly(reply.buffer)
            raise
        if self._core.dead:  # closed here or by the daemon while this call finished
            buffer._release_local()
            self._core.check_alive()
        if buffer.epoch < self._core.epoch:
            buffer._release_local(restart_reason(self._core.epoch))
            raise self._core.restarted_error()
        self._buffers[buffer.id] = buffer
        return buffer

    async def open(self, uri: str) -> TrioRemoteHandle:
        uri = check_uri(uri)
        epoch = self.epoch
        reply, _ = await self._call(lambda rid: OpenRequest(id=rid, uri=uri), OpenReply)
        return TrioRemoteHandle(self, reply.handle, uri, epoch)

    async def status(self) -> DaemonStatus:
        reply, _ = await self._call(lambda rid: StatusRequest(id=rid), StatusReply)
        return reply.status

    async def ping(self, payload: bytes | bytearray | memoryview = b"") -> bytes:
        data = check_ping_payload(payload)
        reply, _ = await self._call(lambda rid: PingRequest(id=rid, payload=data), PongReply)
        return reply.payload

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection and every buffer's fd and mapping. Idempotent.

        The closing is done before the checkpoint, so it happens even when cancelled.
        """
        self._close_now()
        await trio.lowlevel.checkpoint()

    aclose = close
    """trio's name for it (``trio.abc.AsyncResource``)."""

    def _close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._core.die(ErrorCode.CONNECTION_CLOSED, "this client was closed")
        self._notify()
        # A task blocked on the socket gets trio.ClosedResourceError (handled as closed).
        self._sock.close()
        buffers, self._buffers = self._buffers, {}
        for buffer in buffers.values():
            buffer._release_local("gone: its client was closed")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"epoch {self.epoch}"
        return f"<npu_client.trio_client.TrioClient {self._path} {state}>"

    # --- internals: one request ---------------------------------------------------------------

    async def _call(
        self, build: Callable[[int], AnyRequest], expected: type[R]
    ) -> tuple[R, Pending]:
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._wait(lambda: self._core.dead or self._core.has_room())
        # No checkpoint between the wait and begin(): the free slot is still free.
        pending, data, fds = self._core.begin(build)
        try:
            await self._write(data, fds)
            await self._wait(lambda: pending.done)
        except BaseException:
            self._core.abandon(pending)
            raise
        return pending.result(expected), pending

    async def _write(self, data: bytes, fds: Sequence[int]) -> None:
        """Send one frame. Cancellable: a caller whose frame has not started
        leaves nothing behind; one cut off part-way garbles the stream for every
        task, so the connection dies with it (never an unkillable wait)."""
        async with self._send_lock:
            view = memoryview(data)
            sent = 0
            try:
                sent = await self._sock.sendmsg([view], fds_ancillary(fds))
                while sent < len(view):
                    sent += await self._sock.send(view[sent:])
            except trio.Cancelled:
                if sent:
                    self._core.die(ErrorCode.CONNECTION_CLOSED, "a request was cut off mid-frame")
                    self._sock.close()
                raise
            except trio.ClosedResourceError:
                pass  # closed here: close() already failed every request
            except OSError:
                # The server closed. What it said first (an error saying why, then
                # the end of the stream) is queued on our side: the next read
                # finds it, so requests fail with its reason, not a broken pipe.
                pass

    async def _free_quietly(self, buffer_id: int) -> None:
        with contextlib.suppress(NpuError):
            await self._call(lambda rid: FreeRequest(id=rid, buffer=buffer_id), FreeReply)

    def _drop_buffers_before(self, epoch: int) -> None:
        """The daemon released every buffer of earlier sessions: close ours."""
        stale = [b for b in self._buffers.values() if b.epoch < epoch]
        for buffer in stale:
            del self._buffers[buffer.id]
            buffer._release_local(restart_reason(epoch))

    def _owns(self, buffer: MappedBuffer) -> bool:
        return self._buffers.get(buffer.id) is buffer

    def _forget_buffer(self, buffer: TrioDmaBuffer) -> None:
        if self._buffers.get(buffer.id) is buffer:
            del self._buffers[buffer.id]

    # --- internals: waiting and reading ------------------------------------------------------

    async def _handshake(self) -> None:
        await self._write(self._core.hello(), ())
        await self._wait(lambda: self._core.dead or self._core.welcome is not None)
        self._core.check_alive()

    async def _wait(self, ready: Callable[[], bool]) -> None:
        while True:
            satisfied = await self._read_until(ready)
            self._apply(self._core.take_events())
            if satisfied:
                return

    async def _read_until(self, ready: Callable[[], bool]) -> bool:
        while not ready():
            if self._core.has_events():
                return False
            if self._reading:
                await self._progress.wait()
                continue
            self._reading = True
            try:
                await self._read_once()
            finally:
                self._reading = False
                self._notify()
        return True

    async def _read_once(self) -> None:
        try:
            data, ancdata, flags, _ = await self._sock.recvmsg(
                RECV_BUFFER, _ANCILLARY_SPACE, socket.MSG_CMSG_CLOEXEC
            )
            fds = parse_ancillary(ancdata, flags)
        except TransportError as exc:
            self._core.die(ErrorCode.FDS_TRUNCATED, str(exc))
        except (OSError, trio.ClosedResourceError) as exc:
            self._core.die(ErrorCode.CONNECTION_CLOSED, f"reading failed: {_reason(exc)}")
        else:
            self._core.receive(data, fds)

    def _notify(self) -> None:
        """Wake every waiting task to look at its request again."""
        self._progress.set()
        self._progress = trio.Event()

    def _apply(self, events: list[ServerEvent]) -> None:
        """Act on server events, then tell ``on_event``."""
        for event in events:
            if isinstance(event, SessionRestarted):
                self._drop_buffers_before(event.epoch)
            if self._on_event is None:
                continue
            try:
                self._on_event(event)
            except Exception:
                _log.exception("npu_client: the on_event callback failed for %r", event)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return str(exc) or type(exc).__name__


class TrioDmaBuffer(MappedBuffer):
    """``npu_client.DmaBuffer`` for trio: ``map``, ``unmap`` and ``free`` are awaited;
    ``async with`` frees it."""

    def __init__(
        self, client: TrioClient, buffer_id: int, size: int, fd: OwnedFd, epoch: int
    ) -> None:
        """Internal: use :meth:`TrioClient.alloc`. Takes ownership of ``fd``."""
        super().__init__(buffer_id, size, fd, epoch)
        self._client = client

    async def map(self) -> int:
        address = self.dsp_address
        if address is not None:
            await trio.lowlevel.checkpoint()
            return address
        self._memory()
        reply, _ = await self._client._call(
            lambda rid: MapRequest(id=rid, buffer=self.id), MapReply
        )
        self._remember_mapping(reply.dsp_address)
        return reply.dsp_address

    async def unmap(self) -> None:
        if self.dsp_address is None:
            await trio.lowlevel.checkpoint()
            return
        await self._client._call(lambda rid: UnmapRequest(id=rid, buffer=self.id), UnmapReply)
        self._forget_mapping()

    async def free(self) -> None:
        if self.freed:
            await trio.lowlevel.checkpoint()
            return
        with contextlib.suppress(ConnectionClosedError):
            await self._client._call(lambda rid: FreeRequest(id=rid, buffer=self.id), FreeReply)
        self._client._forget_buffer(self)
        self._release_local()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.free()


class TrioRemoteHandle(HandleIdentity):
    """``npu_client.RemoteHandle`` for trio: ``invoke`` and ``close`` are awaited."""

    def __init__(self, client: TrioClient, handle_id: int, uri: str, epoch: int) -> None:
        super().__init__(handle_id, uri, epoch)
        self._client = client

    async def invoke(
        self,
        method: int | None,
        inputs: Sequence[InvokeInput] = (),
        outputs: Sequence[InvokeOutput] = (),
        *,
        sc: int | None = None,
        timeout: float | None = None,
    ) -> list[bytes | None]:
        if self._closed:
            raise ValueError(f"remote handle {self._id} is closed")
        build = invoke_request(
            handle=self._id,
            method=method,
            sc=sc,
            inputs=inputs,
            outputs=outputs,
            timeout=timeout,
            limits=self._client.limits,
            owns=self._client._owns,
        )
        reply, _ = await self._client._call(build, InvokeReply)
        return list(reply.outputs)

    async def close(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        with contextlib.suppress(ConnectionClosedError, DspRestarted):
            await self._client._call(lambda rid: CloseRequest(id=rid, handle=self._id), CloseReply)
        self._closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<TrioRemoteHandle {self._id} {self._uri!r}{' closed' if self._closed else ''}>"
