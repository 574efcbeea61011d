"""What npud does for each request: one handler class per request type.

A handler does its work in two steps, so that a connection's requests keep
their order (PROTOCOL.md section 6):

* :meth:`Handler.arrive` runs when the request *arrives*, in arrival order,
  on the thread that reads the connection: it checks what can be checked at
  once and resolves or reserves the ids the request names (:class:`ObjectTable`);
* :meth:`Handler.run` does the work, concurrently with other requests, and
  returns the answer; :meth:`Handler.end` runs after it, however it ended,
  and gives back what the arrival step held.

Every failure is a :class:`CodedError`; the connection turns it into the
request's ``error`` reply in one place. :data:`HANDLERS` maps each request type
to its handler, next to the protocol's ``REPLY_TYPES``.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, TypeVar

import trio

import npu_protocol as p
from npu_client.transport import OwnedFd
from npu_protocol import CodedError, ErrorCode
from npud.clients import Client, Entry, Kind, unknown
from npud.fastrpc.dma import SessionBuffer, checked_dma_size
from npud.fastrpc.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg, Slice
from npud.fastrpc.session import FastRpcSession

if TYPE_CHECKING:
    from npud.broker import Broker

R = TypeVar("R", bound=p.Request)

BULK_PRIORITY: Final = {p.Priority.NORMAL: 0, p.Priority.BACKGROUND: 1}


@dataclass
class Answer:
    """A successful reply and the fd that travels with it (closed once sent)."""

    reply: p.AnyReply
    fd: OwnedFd | None = None


class Handler(abc.ABC, Generic[R]):
    """One request, from its arrival to its answer."""

    acquires: ClassVar[bool] = True
    """Takes DSP resources: refused with SHUTTING_DOWN once the daemon stops.
    Releases (free, unmap, close), status and ping are still served then."""

    def __init__(self, broker: Broker, client: Client, request: R) -> None:
        self.broker = broker
        self.client = client
        self.request = request
        self._held: list[Entry] = []

    def start(self) -> None:
        """The arrival step; on a refusal, what it took is given back and it raises."""
        try:
            if self.acquires and self.broker.dsp.stopping:
                raise CodedError(ErrorCode.SHUTTING_DOWN)
            self.arrive()
        except BaseException:
            self.end()
            raise

    def arrive(self) -> None:
        """Checks and id resolution at arrival; raise CodedError to refuse."""

    @abc.abstractmethod
    async def run(self) -> Answer:
        """Do the work; raise CodedError for a refusal."""

    def end(self) -> None:
        """Give back what the arrival step held. Idempotent."""
        held, self._held = self._held, []
        for entry in held:
            self.client.objects.done_with(entry)

    def _use(self, object_id: int, kind: Kind) -> Entry:
        entry = self.client.objects.use(object_id, kind)
        self._held.append(entry)
        return entry

    async def _ready(self, entry: Entry) -> object:
        """The object behind ``entry`` once its creating request has ended."""
        await entry.created.wait()
        if entry.lost:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        if not entry.live:
            raise unknown(entry.kind, entry.id)
        return entry.value

    async def _buffer(self, entry: Entry) -> SessionBuffer:
        buffer = await self._ready(entry)
        assert isinstance(buffer, SessionBuffer)
        return buffer


# --- buffers ----------------------------------------------------------------------


class Alloc(Handler[p.AllocRequest]):
    def arrive(self) -> None:
        broker, client, request = self.broker, self.client, self.request
        self.session = broker.dsp.current()
        size = checked_dma_size(request.size)
        broker.clients.check_buffer(client, size)
        self.entry = client.objects.reserve(Kind.BUFFER, size)

    async def run(self) -> Answer:
        session, dsp = self.session, self.broker.dsp

        def allocate() -> tuple[SessionBuffer, OwnedFd]:
            # The reply's fd is a dup made here, before any later request can
            # free the buffer: the reply must carry this buffer's file, never
            # whatever file reuses a closed fd number.
            buffer = session.alloc(self.entry.size)
            try:
                return buffer, OwnedFd(os.dup(buffer.fd))
            except OSError as exc:
                session.free(buffer)
                raise CodedError(
                    ErrorCode.DMA_BUF_ALLOC, msg=f"no fd for the reply: {exc.strerror}"
                ) from None

        def abandoned(result: tuple[SessionBuffer, OwnedFd]) -> None:
            result[1].close()
            session.free(result[0])

        try:
            buffer, reply_fd = await dsp.call(
                dsp.control, session, allocate, on_abandoned=abandoned, operation="alloc"
            )
        except BaseException:
            self.client.objects.failed(self.entry)
            raise
        if not self.client.objects.created(self.entry, buffer):
            reply_fd.close()
            await self.broker.release(session, buffers=[buffer])
            raise CodedError(ErrorCode.DSP_RESTARTED)
        reply = p.AllocReply(
            id=self.request.id, buffer=self.entry.id, size=buffer.size, fd=reply_fd.fileno()
        )
        return Answer(reply, reply_fd)


class Free(Handler[p.FreeRequest]):
    acquires = False

    def arrive(self) -> None:
        _broker, client, request = self.broker, self.client, self.request
        self.entry = client.objects.doom(request.buffer, Kind.BUFFER)

    async def run(self) -> Answer:
        await _destroyable(self.entry)
        buffer = await self._buffer(self.entry)
        self.client.objects.remove(self.entry)
        # Out of the table: freed even if the client hangs up now (a short call).
        with trio.CancelScope(shield=True):
            await self.broker.release(self.broker.dsp.session, buffers=[buffer], strict=True)
        return Answer(p.FreeReply(id=self.request.id))


class Map(Handler[p.MapRequest]):
    def arrive(self) -> None:
        broker, _client, request = self.broker, self.client, self.request
        self.session = broker.dsp.current()
        self.entry = self._use(request.buffer, Kind.BUFFER)

    async def run(self) -> Answer:
        buffer = await self._buffer(self.entry)
        dsp, session = self.broker.dsp, self.session
        address = await dsp.call(dsp.control, session, lambda: session.map(buffer), operation="map")
        return Answer(p.MapReply(id=self.request.id, dsp_address=address))


class Unmap(Handler[p.UnmapRequest]):
    acquires = False

    def arrive(self) -> None:
        _broker, _client, request = self.broker, self.client, self.request
        self.entry = self._use(request.buffer, Kind.BUFFER)

    async def run(self) -> Answer:
        buffer = await self._buffer(self.entry)
        if buffer.dsp_address is None:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT, detail=f"buffer id {self.entry.id} is not mapped"
            )
        dsp = self.broker.dsp
        session = dsp.session
        if session is None:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        await dsp.call(dsp.control, session, lambda: session.unmap(buffer), operation="unmap")
        return Answer(p.UnmapReply(id=self.request.id))


# --- skels --------------------------------------------------------------------------


class Open(Handler[p.OpenRequest]):
    def arrive(self) -> None:
        broker, client, _request = self.broker, self.client, self.request
        self.session = broker.dsp.current()
        broker.clients.check_handle(client)
        self.entry = client.objects.reserve(Kind.HANDLE)

    async def run(self) -> Answer:
        dsp, session, uri = self.broker.dsp, self.session, self.request.uri
        try:
            handle = await dsp.call(
                dsp.loader,
                session,
                lambda: session.remote_open(uri),
                on_abandoned=session.remote_close,
                operation="open",
            )
        except BaseException:
            self.client.objects.failed(self.entry)
            raise
        if not self.client.objects.created(self.entry, handle):
            await self.broker.release(session, handles=[handle])
            raise CodedError(ErrorCode.DSP_RESTARTED)
        return Answer(p.OpenReply(id=self.request.id, handle=self.entry.id))


class Close(Handler[p.CloseRequest]):
    acquires = False

    def arrive(self) -> None:
        _broker, client, request = self.broker, self.client, self.request
        self.entry = client.objects.doom(request.handle, Kind.HANDLE)

    async def run(self) -> Answer:
        await _destroyable(self.entry)
        handle = await self._ready(self.entry)
        assert isinstance(handle, int)
        self.client.objects.remove(self.entry)
        with trio.CancelScope(shield=True):  # as for free: out of the table, so close it
            await self.broker.release(self.broker.dsp.session, handles=[handle], strict=True)
        return Answer(p.CloseReply(id=self.request.id))


# --- invoke -------------------------------------------------------------------------


class Invoke(Handler[p.InvokeRequest]):
    """A remote call. Its handle and buffers are held from arrival to the end."""

    def arrive(self) -> None:
        broker, client, request = self.broker, self.client, self.request
        self.session = broker.dsp.current()
        limit = broker.config.client_limits.max_calls_in_flight
        if client.calls_in_flight >= limit:
            raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="calls in flight", limit=limit)
        limits = broker.client_limits(client)
        for resource, used in (
            ("inline input bytes", request.inline_input_bytes),
            ("inline output bytes", request.inline_output_bytes),
        ):
            if used > limits.max_inline_bytes:
                raise CodedError(
                    ErrorCode.QUOTA_EXCEEDED, resource=resource, limit=limits.max_inline_bytes
                )
        timeout_ms = request.timeout_ms
        if timeout_ms is not None and timeout_ms > limits.max_timeout_ms:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"timeout_ms {timeout_ms} exceeds max_timeout_ms {limits.max_timeout_ms}",
            )
        self.timeout_ms = timeout_ms if timeout_ms is not None else limits.default_timeout_ms
        self.handle = self._use(request.handle, Kind.HANDLE)
        self.slices = [
            (arg, self._use(arg.buffer, Kind.BUFFER))
            for arg in (*request.inputs, *request.outputs)
            if isinstance(arg, p.BufferSlice)
        ]
        for arg, entry in self.slices:
            if entry.created.is_open:
                _check_slice(arg, entry)
        client.calls_in_flight += 1
        self._counted = True

    _counted = False

    async def run(self) -> Answer:
        handle = await self._ready(self.handle)
        assert isinstance(handle, int)
        buffers = {id(arg): await self._buffer(entry) for arg, entry in self.slices}
        for arg, entry in self.slices:
            _check_slice(arg, entry)

        def argument(arg: p.InputArg | p.OutputArg) -> InArg | OutArg:
            if isinstance(arg, p.InlineInput):
                return Inline(arg.data)
            if isinstance(arg, p.InlineOutput):
                return Capacity(arg.capacity)
            return Slice(buffers[id(arg)], arg.offset, arg.length)

        request, session, dsp = self.request, self.session, self.broker.dsp
        inputs = [argument(arg) for arg in request.inputs]
        outputs = [argument(arg) for arg in request.outputs]
        sc = request.scalars
        if self.client.priority is p.Priority.REALTIME:
            pool, priority = dsp.realtime, 0
        else:
            pool, priority = dsp.bulk, BULK_PRIORITY[self.client.priority]
        timeout = None if self.timeout_ms is None else self.timeout_ms / 1000
        result: InvokeResult = await dsp.call(
            pool,
            session,
            lambda: session.invoke(handle, sc, inputs, outputs),  # type: ignore[arg-type]
            priority=priority,
            timeout=timeout,
            operation="invoke",
        )
        if result.rc != 0:
            raise CodedError(ErrorCode.INVOKE_FAILED, code=result.rc)
        return Answer(p.InvokeReply(id=request.id, outputs=result.outputs))

    def end(self) -> None:
        if self._counted:
            self._counted = False
            self.client.calls_in_flight -= 1
            self.client.calls_done += 1
            self.broker.calls_total += 1
        super().end()


def _check_slice(arg: p.BufferSlice, entry: Entry) -> None:
    """Slices are checked against the allocated size, the one size the client was told."""
    if entry.live and arg.offset + arg.length > entry.size:
        raise CodedError(
            ErrorCode.SLICE_OUT_OF_RANGE,
            offset=arg.offset,
            length=arg.length,
            buffer=entry.id,
            size=entry.size,
        )


# --- daemon ----------------------------------------------------------------------------


class Status(Handler[p.StatusRequest]):
    acquires = False

    async def run(self) -> Answer:
        return Answer(p.StatusReply(id=self.request.id, status=self.broker.status()))


class Ping(Handler[p.PingRequest]):
    acquires = False

    async def run(self) -> Answer:
        return Answer(p.PongReply(id=self.request.id, payload=self.request.payload))


async def _destroyable(entry: Entry) -> None:
    """Wait until every earlier request that named ``entry`` has ended."""
    await entry.created.wait()
    if entry.idle is not None:
        await entry.idle.wait()


HANDLERS: Final[dict[type[p.Request], type[Handler[Any]]]] = {
    p.AllocRequest: Alloc,
    p.FreeRequest: Free,
    p.MapRequest: Map,
    p.UnmapRequest: Unmap,
    p.OpenRequest: Open,
    p.CloseRequest: Close,
    p.InvokeRequest: Invoke,
    p.StatusRequest: Status,
    p.PingRequest: Ping,
}
"""The handler of each request type; every type in ``p.REPLY_TYPES`` has one."""


def release_session_objects(
    session: FastRpcSession, buffers: list[SessionBuffer], handles: list[int]
) -> list[CodedError]:
    """Close ``handles`` and free ``buffers`` on ``session`` (on a lane); the failures."""
    failures: list[CodedError] = []
    for handle in handles:
        try:
            session.remote_close(handle)
        except CodedError as exc:
            failures.append(exc)
    for buffer in buffers:
        try:
            session.free(buffer)  # deferred by the session while an invoke uses it
        except CodedError as exc:
            failures.append(exc)
    return failures
