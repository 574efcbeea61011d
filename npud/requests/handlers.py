"""What npud does for each request: one handler class per request type.

A handler does its work in steps, so that a connection's requests keep their
order (PROTOCOL.md section 6) while running concurrently:

* :meth:`Handler.start` runs when the request *arrives*, in arrival order, on
  the thread that read it: it checks what can be checked at once and resolves
  or reserves the ids the request names (:class:`ObjectTable`);
* :meth:`Handler.gates` names what must exist first (an object that an
  earlier request is still creating, a destroyed object's last user);
* :meth:`Handler.run` does the work, synchronously, on the thread its
  :class:`Route` names, and returns the answer;
* :meth:`Handler.end` runs after the answer went out, however it ended, and
  gives back what the arrival step held.

Every failure is a :class:`CodedError`; the data path turns it into the
request's ``error`` reply in one place. :data:`HANDLERS` maps each request type
to its handler, next to the protocol's ``REPLY_TYPES``.
"""

from __future__ import annotations

import abc
import enum
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, TypeVar

import structlog

import npu_protocol as p
from npu_client.transport import OwnedFd
from npu_protocol import CodedError, ErrorCode
from npud.domain.life import Domain
from npud.fastrpc.kernel.dma import DmaBuffer, checked_dma_size
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg, Slice
from npud.requests.clients import Client, Clients, Entry, Gate, Kind, unknown
from npud.requests.holdings import (
    DSPQUEUE_SIGNAL_SC,
    HeldBuffer,
    OpenHandle,
    is_dspqueue_uri,
    let_go,
)
from npud.runtime.scheduler import Account

if TYPE_CHECKING:  # loaded with the first model load (ModelLoad), not at start-up
    from npud.requests.model_check import FileCheck
    from npud.requests.models import NpuModel

_log = structlog.get_logger("npud.requests.handlers")

R = TypeVar("R", bound=p.Request)


class Route(enum.Enum):
    """Where a request's work runs."""

    DSP = "dsp"
    """Through the scheduler, on a data-path worker: the DSP-bound calls."""
    CONTROL = "control"
    """The domain's control lane: allocation and mapping, short calls that never wait
    behind an invoke."""
    LOADER = "loader"
    """The domain's loader lane: remotectl open and close, model load and unload (a skel
    or a model is read through the listener)."""
    HERE = "here"
    """On the thread that read it: cheap, and touches no DSP."""
    WAIT = "wait"
    """The domain's waits lane: a call that waits for the DSP (invoke with ``wait``) takes
    no scheduler slot and no worker, and the watchdog leaves it alone."""


@dataclass
class Answer:
    """A successful reply and the fd that travels with it (the link closes it once sent)."""

    reply: p.AnyReply
    fd: OwnedFd | None = None


class Handler(abc.ABC, Generic[R]):
    """One request, from its arrival to its answer. It is given its client and the
    domain the client's calls run in, and touches nothing else."""

    route: Route
    """Where its work runs (a class's own, or set per request)."""
    acquires: ClassVar[bool] = True
    """Takes DSP resources: refused with SHUTTING_DOWN once the daemon stops.
    Releases (free, unmap, close), status and ping are still served then."""
    since: ClassVar[p.Feature | None] = None
    """The protocol feature that brought this request (None: version 1): on a connection
    that does not speak it, it is answered UNSUPPORTED (PROTOCOL.md section 12)."""
    creates: ClassVar[bool] = False
    """Creates an object (alloc, open, model_load): takes the connection's next id at
    arrival whatever its answer, so a pipelining client can predict every id
    (PROTOCOL.md section 6). Its ``arrive`` reserves with :meth:`_reserve`."""
    _reserved = False

    # DSP-bound handlers set these (the data path reads them).
    account: Account | None = None
    timeout: float | None = None
    timeout_ms: int | None = None
    deadline: float | None = None
    """Absolute, on time.monotonic(); None: no deadline."""
    deadline_ms: int | None = None
    dsp_seconds: float = 0.0

    def __init__(self, client: Client, domain: Domain, request: R) -> None:
        self.client = client
        self.domain = domain
        self.request = request
        self._held: list[Entry] = []
        self._waits: list[Gate] = []

    def start(self) -> None:
        """The arrival step; on a refusal, what it took is given back and it raises."""
        try:
            if self.since is not None and not p.speaks(self.client.protocol_version, self.since):
                # No version numbers in the text: an error names only the request's.
                raise CodedError(
                    ErrorCode.UNSUPPORTED,
                    what=f"{p.tag_of(self.request)} on this connection: it came with a later"
                    " protocol version than this connection speaks; offer that version in"
                    " the hello",
                )
            if self.acquires and self.client.watch_only:
                raise CodedError(
                    ErrorCode.NOT_PERMITTED,
                    detail=f"{p.tag_of(self.request)}: this connection's hello said it only "
                    "watches (hello.watch): it has no DSP process; connect without it",
                )
            if self.acquires and self.domain.device.stopping:
                raise CodedError(ErrorCode.SHUTTING_DOWN)
            self.arrive()
        except BaseException:
            if self.creates and not self._reserved:
                self.client.objects.skip_id()  # refused before its id was reserved
            self.end()
            raise

    def arrive(self) -> None:
        """Checks and id resolution at arrival; raise CodedError to refuse."""

    def _reserve(self, kind: Kind, size: int = 0) -> Entry:
        """The id of the object this request creates (the last step of its arrival)."""
        entry = self.client.objects.reserve(kind, size)
        self._reserved = True
        return entry

    def gates(self) -> list[Gate]:
        """What must be open before :meth:`run` may start."""
        return self._waits

    @abc.abstractmethod
    def run(self) -> Answer:
        """Do the work; raise CodedError for a refusal."""

    def end(self) -> None:
        """Give back what the arrival step held. Idempotent."""
        held, self._held = self._held, []
        for entry in held:
            self.client.objects.done_with(entry)

    @property
    def quotas(self) -> Clients:
        quotas = self.client.quotas
        assert quotas is not None, "a welcomed client was admitted"
        return quotas

    @property
    def limits(self) -> p.ClientLimits:
        limits = self.client.limits
        assert limits is not None, "a welcomed client was told its limits"
        return limits

    def _use(self, object_id: int, kind: Kind) -> Entry:
        entry = self.client.objects.use(object_id, kind)
        self._held.append(entry)
        self._waits.append(entry.created)
        return entry

    @staticmethod
    def _ready(entry: Entry) -> object:
        """The object behind ``entry`` (its creating request has ended)."""
        if entry.lost:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        if not entry.live:
            raise unknown(entry.kind, entry.id)
        return entry.value

    def _held_buffer(self, entry: Entry) -> HeldBuffer:
        held = self._ready(entry)
        assert isinstance(held, HeldBuffer)
        return held

    def _model(self, entry: Entry) -> NpuModel:
        from npud.requests.models import NpuModel  # noqa: PLC0415  (loaded: the entry holds one)

        model = self._ready(entry)
        assert isinstance(model, NpuModel)
        return model

    def _handle(self, entry: Entry) -> OpenHandle:
        handle = self._ready(entry)
        assert isinstance(handle, OpenHandle)
        return handle

    def _fallback(self, size: int) -> DmaBuffer:
        """A buffer from the FastRPC driver (no system heap on this machine)."""
        session = self.domain.current()
        return self.domain.run(session, lambda: session.alloc_unowned(size))


class CallTiming:
    """What a DSP-bound handler (invoke, model run) does at arrival and end: its
    timeout and deadline, and the client's count of calls in flight."""

    client: Client
    limits: p.ClientLimits
    account: Account | None
    timeout: float | None
    timeout_ms: int | None
    deadline: float | None
    deadline_ms: int | None
    _counted = False

    def arrive_as_call(self, timeout_ms: int | None, deadline_ms: int | None) -> None:
        limits = self.limits
        if timeout_ms is not None and timeout_ms > limits.max_timeout_ms:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"timeout_ms {timeout_ms} exceeds max_timeout_ms {limits.max_timeout_ms}",
            )
        self.timeout_ms = timeout_ms if timeout_ms is not None else limits.default_timeout_ms
        self.timeout = None if self.timeout_ms is None else self.timeout_ms / 1000
        self.deadline_ms = deadline_ms
        if deadline_ms is not None:
            self.deadline = time.monotonic() + deadline_ms / 1000
        self.account = self.client.account

    def begin_call(self) -> None:
        """Count the call in flight (the last arrival step: the count is given back by end)."""
        self.client.begin_call(self.limits.max_in_flight)
        self._counted = True

    def end_call(self) -> None:
        if self._counted:
            self._counted = False
            self.client.end_call()


# --- buffers ----------------------------------------------------------------------


class Alloc(Handler[p.AllocRequest]):
    route = Route.CONTROL
    creates = True

    def arrive(self) -> None:
        largest = self.quotas.config.client_limits.max_buffer_size
        if self.request.size > largest:
            raise CodedError(ErrorCode.QUOTA_EXCEEDED, resource="buffer size", limit=largest)
        size = checked_dma_size(self.request.size)
        with self.quotas.reserving:
            self.quotas.check_buffer(self.client, size)
            self.entry = self._reserve(Kind.BUFFER, size)

    def run(self) -> Answer:
        domain, client, objects = self.domain, self.client, self.client.objects
        memory = domain.device.require_memory()
        scope = memory.pool.scope(client, client.uid)
        try:
            buffer, mapping = memory.allocate(
                self.entry.size, scope, domain.registry, self._fallback, taker=client
            )
        except BaseException:
            objects.failed(self.entry)
            raise
        held = HeldBuffer(buffer, mapping)
        try:
            # The reply's fd is a dup made now, before any later request can free
            # the buffer: the reply must carry this buffer's file, never whatever
            # file reuses a closed fd number.
            reply_fd = OwnedFd(os.dup(buffer.fd))
        except OSError as exc:
            objects.failed(self.entry)
            let_go(domain, buffers=[held])
            raise CodedError(
                ErrorCode.DMA_BUF_ALLOC, msg=f"no fd for the reply: {exc.strerror}"
            ) from None
        if not objects.created(self.entry, held):
            reply_fd.close()
            let_go(domain, buffers=[held])
            raise CodedError(ErrorCode.DSP_RESTARTED)
        reply = p.AllocReply(
            id=self.request.id,
            buffer=self.entry.id,
            size=buffer.size,
            fd=reply_fd.fileno(),
            dsp_fd=buffer.fd,
        )
        return Answer(reply, reply_fd)


class Free(Handler[p.FreeRequest]):
    route = Route.CONTROL
    acquires = False

    def arrive(self) -> None:
        self.entry = self.client.objects.doom(self.request.buffer, Kind.BUFFER)
        self._waits += _destroyable(self.entry)

    def run(self) -> Answer:
        held = self._held_buffer(self.entry)
        self.client.objects.remove(self.entry)
        domain, client = self.domain, self.client
        memory = domain.device.require_memory()
        mapping = held.live_mapping()
        held.mapping = None
        if not client.pools_freed_buffers:
            # Version 1 promised that freed memory lives on until the client's fd and
            # mapping are gone: never hand it to anyone else (PROTOCOL.md 7.2).
            let_go(domain, buffers=[HeldBuffer(held.buffer, mapping)], strict=True)
            return Answer(p.FreeReply(id=self.request.id))
        if mapping is not None and not memory.pool.settings.keep_dsp_mappings:
            # The pool keeps buffers unmapped: unmap now, then offer it.
            let_go(domain, buffers=[HeldBuffer(held.buffer, mapping)], strict=True)
            return Answer(p.FreeReply(id=self.request.id))
        scope = memory.pool.scope(client, client.uid)
        if not memory.free(scope, held.buffer, mapping, domain.control.submit, client) and mapping:
            let_go(domain, buffers=[HeldBuffer(held.buffer, mapping)], strict=True)
        return Answer(p.FreeReply(id=self.request.id))


class Map(Handler[p.MapRequest]):
    route = Route.CONTROL

    def arrive(self) -> None:
        self.session = self.domain.current()
        self.entry = self._use(self.request.buffer, Kind.BUFFER)

    def run(self) -> Answer:
        held = self._held_buffer(self.entry)
        address = held.dsp_address
        if address is None:
            session, registry, flags = self.session, self.domain.registry, self.request.flags
            mapping = self.domain.run(session, lambda: registry.map(session, held.buffer, flags))
            held.mapping = mapping
            address = mapping.address
        return Answer(p.MapReply(id=self.request.id, dsp_address=address))


class Unmap(Handler[p.UnmapRequest]):
    route = Route.CONTROL
    acquires = False

    def arrive(self) -> None:
        self.entry = self._use(self.request.buffer, Kind.BUFFER)

    def run(self) -> Answer:
        held = self._held_buffer(self.entry)
        mapping = held.live_mapping()
        if mapping is None:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT, detail=f"buffer id {self.entry.id} is not mapped"
            )
        domain = self.domain
        session = domain.session
        if session is None:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        domain.run(session, lambda: domain.registry.unmap(session, mapping, going=False))
        held.mapping = None
        return Answer(p.UnmapReply(id=self.request.id))


# --- skels --------------------------------------------------------------------------


class Open(Handler[p.OpenRequest]):
    route = Route.LOADER
    creates = True

    def arrive(self) -> None:
        self.session = self.domain.current()
        with self.quotas.reserving:
            self.quotas.check_handle(self.client)
            self.entry = self._reserve(Kind.HANDLE)

    def run(self) -> Answer:
        session, uri, domain = self.session, self.request.uri, self.domain
        try:
            faults = domain.device.profile.fault_methods(uri)
            handle = domain.run(session, lambda: session.remote_open(uri))
        except BaseException:
            self.client.objects.failed(self.entry)
            raise
        opened = OpenHandle(
            handle,
            domain.registry.opened(handle),
            waiting_methods(uri),
            faults,
            is_dspqueue_uri(uri),
        )
        if not self.client.objects.created(self.entry, opened):
            let_go(domain, handles=[opened])
            raise CodedError(ErrorCode.DSP_RESTARTED)
        return Answer(p.OpenReply(id=self.request.id, handle=self.entry.id))


class Close(Handler[p.CloseRequest]):
    route = Route.LOADER
    acquires = False

    def arrive(self) -> None:
        self.entry = self.client.objects.doom(self.request.handle, Kind.HANDLE)
        self._waits += _destroyable(self.entry)

    def run(self) -> Answer:
        opened = self._handle(self.entry)
        self.client.objects.remove(self.entry)
        let_go(self.domain, handles=[opened], strict=True)
        return Answer(p.CloseReply(id=self.request.id))


# --- invoke -------------------------------------------------------------------------


class Invoke(CallTiming, Handler[p.InvokeRequest]):
    """A remote call. Its handle and buffers are held from arrival to the end. A call
    that waits for the DSP (``wait``) runs on the domain's waits lane."""

    route = Route.DSP
    _waiting = False

    def __init__(self, client: Client, domain: Domain, request: p.InvokeRequest) -> None:
        super().__init__(client, domain, request)
        if request.wait:
            self.route = Route.WAIT

    def _may_fault(self) -> None:
        """The method crashes the DSP process on purpose (the emulator's fault injection):
        root's and ``[emulator] fault_uids``' calls only (PROTOCOL.md section 7.4)."""
        client = self.client
        quotas = client.quotas
        allowed = quotas.config.emulator.fault_uids if quotas is not None else ()
        if client.uid != 0 and client.uid not in allowed:
            raise CodedError(
                ErrorCode.NOT_PERMITTED,
                detail=f"method {self.request.method} of handle {self.request.handle} crashes "
                "its DSP process on purpose (fault injection): for root and the users "
                "[emulator] fault_uids lists only",
            )

    def arrive(self) -> None:
        request = self.request
        self.session = self.domain.current()
        if request.wait:
            if request.timeout_ms is not None or request.deadline_ms is not None:
                raise CodedError(
                    ErrorCode.INVALID_ARGUMENT,
                    detail="a call that waits for the DSP has no timeout_ms or deadline_ms",
                )
            if not self.domain.isolated:
                # Nothing but its own DSP process's end stops a wait whose client left:
                # in a shared process that would hold a waits thread for good.
                raise CodedError(
                    ErrorCode.NOT_PERMITTED,
                    detail="a call that waits for the DSP needs a DSP process of its own "
                    "(hello.isolate, or an isolating [domains] rule)",
                )
            self.client.begin_wait(MAX_WAITS)
            self._waiting = True
        limits = self.limits
        for resource, used in (
            ("inline input bytes", request.inline_input_bytes),
            ("inline output bytes", request.inline_output_bytes),
        ):
            if used > limits.max_inline_bytes:
                raise CodedError(
                    ErrorCode.QUOTA_EXCEEDED, resource=resource, limit=limits.max_inline_bytes
                )
        self.arrive_as_call(request.timeout_ms, request.deadline_ms)
        self.handle = self._use(request.handle, Kind.HANDLE)
        opened = self.handle.value
        if isinstance(opened, OpenHandle) and request.method in opened.faults:
            self._may_fault()  # refused at once, before a slot is given (again in run)
        self.slices = [
            (arg, self._use(arg.buffer, Kind.BUFFER))
            for arg in (*request.inputs, *request.outputs)
            if isinstance(arg, p.BufferSlice)
        ]
        for arg, entry in self.slices:
            if entry.created.is_open:
                _check_slice(arg, entry)
        self.begin_call()

    @property
    def doorbell(self) -> bool:
        """Is this dspqueue's ``signal`` (an op batch's doorbell, docs/scheduling.md)?
        Asked when the call is submitted, its handle open by then."""
        if self.request.wait or self.request.scalars != DSPQUEUE_SIGNAL_SC:
            return False
        entry = self.handle
        return entry.live and isinstance(entry.value, OpenHandle) and entry.value.dspqueue

    def run(self) -> Answer:
        opened = self._handle(self.handle)
        if self.request.method in opened.faults:
            self._may_fault()
        handle = opened.handle
        if self.request.wait:
            _check_waits(self.request, opened, self.handle.id)
        buffers = {id(arg): self._held_buffer(entry).buffer for arg, entry in self.slices}
        for arg, entry in self.slices:
            _check_slice(arg, entry)

        def argument(arg: p.InputArg | p.OutputArg) -> InArg | OutArg:
            if isinstance(arg, p.InlineInput):
                return Inline(arg.data)
            if isinstance(arg, p.InlineOutput):
                return Capacity(arg.capacity)
            return Slice(buffers[id(arg)], arg.offset, arg.length)

        request, session = self.request, self.session
        inputs = [argument(arg) for arg in request.inputs]
        outputs = [argument(arg) for arg in request.outputs]
        started = time.perf_counter()
        try:
            result: InvokeResult = self.domain.run(
                session,
                lambda: session.invoke(handle, request.scalars, inputs, outputs),  # type: ignore[arg-type]
            )
        finally:
            self.dsp_seconds = time.perf_counter() - started
        if result.rc != 0:
            raise CodedError(ErrorCode.INVOKE_FAILED, code=result.rc)
        return Answer(p.InvokeReply(id=request.id, outputs=result.outputs))

    def end(self) -> None:
        if self._waiting:
            self._waiting = False
            self.client.end_wait()
        self.end_call()
        super().end()


MAX_WAITS: Final = 2
"""Calls of one client that wait for the DSP at once (dspqueue keeps one)."""
WAITING_METHODS: Final[Mapping[str, frozenset[int]]] = MappingProxyType(
    {"libdspqueue_rpc_skel.so": frozenset({6})}  # dspqueue_rpc.wait_signal
)
"""By skel library, the methods that wait for the DSP (until it has something to say)
rather than compute: what ``invoke.wait`` is for. A call with ``wait`` takes no slot
and escapes the watchdog, so a method that computes may not be sent with it."""


def waiting_methods(uri: str) -> frozenset[int]:
    """The methods of the skel ``uri`` names that wait for the DSP (none for most)."""
    library = uri.partition("?")[0].rpartition("/")[2]
    return WAITING_METHODS.get(library, frozenset())


def _check_waits(request: p.InvokeRequest, opened: OpenHandle, handle_id: int) -> None:
    method = (request.scalars >> 24) & 0x1F
    if method not in opened.waits:
        raise CodedError(
            ErrorCode.INVALID_ARGUMENT,
            detail=f"wait is only for a method that waits for the DSP (dspqueue's "
            f"wait_signal); method {method} of handle {handle_id} computes: send it "
            "without wait",
        )


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


# --- models (npud/requests/models.py) ------------------------------------------------------------


class LoadModel(Handler[p.ModelLoadRequest]):
    since = p.Feature.MODELS
    route = Route.LOADER
    creates = True
    check: FileCheck

    def __init__(self, client: Client, domain: Domain, request: p.ModelLoadRequest) -> None:
        super().__init__(client, domain, request)
        # The client's file: ours from now on, closed once when the request ends.
        self.file = OwnedFd(self.request.fd)

    def arrive(self) -> None:
        self.session = self.domain.current()
        try:
            size = os.fstat(self.file.fileno()).st_size
        except OSError as exc:
            raise CodedError(
                ErrorCode.MODEL_FILE_UNREADABLE, detail=f"cannot stat the file: {exc.strerror}"
            ) from None
        with self.quotas.reserving:
            self.quotas.check_model(self.client, size)
            self.quotas.begin_load(self.client)
            self._loading = True
            self.entry = self._reserve(Kind.MODEL, size)
        from npud.formats.onnx_values import Constant  # noqa: PLC0415  (as NpuModel)
        from npud.requests.model_check import FileCheck  # noqa: PLC0415  (the first model load loads it)

        # The file's checks run on a thread of this load's own, not on the domain's loader
        # lane (npud/requests/model_check.py); the load goes there once they have ended, with
        # what they found (the rooms and the outputs left to the DSP, for each size).
        request = self.request
        backend = self.domain.device.kind
        assert backend in ("kernel", "emulator")
        self.shapes = {name: tuple(dims) for name, dims in request.shapes.items()}
        self.constants = {
            name: Constant(c.dtype, tuple(c.shape), tuple(c.values))
            for name, c in request.constants.items()
        }
        self.sizes = {n: tuple(tuple(s) for s in v) for n, v in request.sizes.items()}
        self.check = FileCheck(
            self.file.fileno(),
            backend,  # type: ignore[arg-type]
            self.shapes,
            self.domain.device.model_check_seconds,
            self.constants,
            self.sizes,
        )
        self._waits.append(self.check.done)

    def run(self) -> Answer:
        from npud.requests.models import NpuModel  # noqa: PLC0415  (the first model load loads it)

        session, request, objects, domain = (
            self.session,
            self.request,
            self.client.objects,
            self.domain,
        )
        backend = domain.device.kind
        assert backend in ("kernel", "emulator")
        memory = domain.device.require_memory()
        try:
            checked = self.check.outcome()
            model = domain.run(
                session,
                lambda: NpuModel.load(
                    session,
                    domain.registry,
                    backend,  # type: ignore[arg-type]
                    self.file.fileno(),
                    name=request.name,
                    shapes=self.shapes,
                    constants=self.constants,
                    sizes=self.sizes,
                    digests=domain.digests,
                    allocate=lambda size: memory.allocate_fresh(size, self._fallback),
                    release_arena=memory.release,
                    checked=checked,
                ),
            )
        except BaseException:
            objects.failed(self.entry)
            raise
        try:
            self.entry.size = model.bytes
            self.quotas.check_model_bytes(self.client)
            reply_fd = OwnedFd(os.dup(model.arena.fd))
        except BaseException as exc:
            objects.failed(self.entry)
            let_go(domain, models=[model])
            if isinstance(exc, OSError):
                raise CodedError(
                    ErrorCode.DMA_BUF_ALLOC, msg=f"no fd for the reply: {exc.strerror}"
                ) from None
            raise
        if not objects.created(self.entry, model):
            reply_fd.close()
            let_go(domain, models=[model])
            raise CodedError(ErrorCode.DSP_RESTARTED)
        reply = p.ModelLoadReply(
            id=request.id,
            model=self.entry.id,
            info=model.info(self.client.protocol_version),
            fd=reply_fd.fileno(),
        )
        return Answer(reply, reply_fd)

    _loading = False

    def end(self) -> None:
        if self._loading:
            self._loading = False
            self.quotas.end_load(self.client)
        # The client's file: its close may block (FUSE), and this may be the loader lane.
        if self.file.fd >= 0:
            self.domain.device.close_later(self.client.uid, [self.file.detach()])
        super().end()


class ModelInfo(Handler[p.ModelInfoRequest]):
    since = p.Feature.MODELS
    route = Route.HERE
    acquires = False

    def arrive(self) -> None:
        self.entry = self._use(self.request.model, Kind.MODEL)

    def run(self) -> Answer:
        info = self._model(self.entry).info(self.client.protocol_version)
        return Answer(p.ModelInfoReply(id=self.request.id, info=info))


class RunModel(CallTiming, Handler[p.ModelRunRequest]):
    """One run, scheduled like an invoke; the model is held from arrival to the end."""

    since = p.Feature.MODELS

    route = Route.DSP

    def arrive(self) -> None:
        if self.request.graph and not p.speaks(self.client.protocol_version, p.Feature.GRAPHS):
            # Served as the connection's version knows it: no graph but the first.
            raise CodedError(
                ErrorCode.UNSUPPORTED,
                what="model_run.graph on this connection: it came with a later protocol"
                " version than this connection speaks; offer that version in the hello",
            )
        self.session = self.domain.current()
        self.arrive_as_call(self.request.timeout_ms, self.request.deadline_ms)
        self.entry = self._use(self.request.model, Kind.MODEL)
        self.begin_call()

    def run(self) -> Answer:
        model = self._model(self.entry)
        graph = model.graph_index(self.request.graph)
        started = time.perf_counter()
        try:
            shapes = self.domain.run(model.session, lambda: model.run(graph))
        finally:
            self.dsp_seconds = time.perf_counter() - started
        model.count_run(self.dsp_seconds)
        dsp_us = round(self.dsp_seconds * 1_000_000)
        return Answer(p.ModelRunReply(id=self.request.id, dsp_us=dsp_us, output_shapes=shapes))

    def end(self) -> None:
        self.end_call()
        super().end()


class RunChain(CallTiming, Handler[p.ModelChainRequest]):
    """Several loaded models in one request (npud/requests/chains.py), scheduled like one run;
    every model it names is held from arrival to the end."""

    since = p.Feature.CHAIN
    route = Route.DSP

    def arrive(self) -> None:
        from npud.requests.chains import MAX_STEPS, too_many_steps  # noqa: PLC0415  (as RunModel)

        steps = self.request.steps
        if len(steps) > MAX_STEPS:
            raise too_many_steps(len(steps))
        self.session = self.domain.current()
        self.arrive_as_call(self.request.timeout_ms, self.request.deadline_ms)
        self.entries: dict[int, Entry] = {}
        for step in steps:
            if step.model not in self.entries:
                self.entries[step.model] = self._use(step.model, Kind.MODEL)
        self.begin_call()

    def run(self) -> Answer:
        from npud.requests import chains  # noqa: PLC0415  (loaded with the first chain)

        models = [self._model(self.entries[step.model]) for step in self.request.steps]
        session = models[0].session
        plan = chains.plan_chain(self.request, models, session)
        started = time.perf_counter()
        try:
            shapes = self.domain.run(session, lambda: chains.run_chain(plan))
        finally:
            self.dsp_seconds = time.perf_counter() - started
        for model in plan.models:
            model.count_run(self.dsp_seconds / len(plan.models))
        dsp_us = round(self.dsp_seconds * 1_000_000)
        return Answer(p.ModelChainReply(id=self.request.id, dsp_us=dsp_us, output_shapes=shapes))

    def end(self) -> None:
        self.end_call()
        super().end()


class UnloadModel(Handler[p.ModelUnloadRequest]):
    since = p.Feature.MODELS
    route = Route.LOADER
    acquires = False

    def arrive(self) -> None:
        self.entry = self.client.objects.doom(self.request.model, Kind.MODEL)
        self._waits += _destroyable(self.entry)

    def run(self) -> Answer:
        model = self._model(self.entry)
        self.client.objects.remove(self.entry)
        let_go(self.domain, models=[model], strict=True)
        return Answer(p.ModelUnloadReply(id=self.request.id))


# --- daemon ----------------------------------------------------------------------------


class Status(Handler[p.StatusRequest]):
    route = Route.HERE
    acquires = False

    def run(self) -> Answer:
        daemon = self.client.daemon
        assert daemon is not None, "a welcomed client sees the daemon"
        return Answer(p.StatusReply(id=self.request.id, status=daemon.status(self.client)))


class Ping(Handler[p.PingRequest]):
    route = Route.HERE
    acquires = False

    def run(self) -> Answer:
        return Answer(p.PongReply(id=self.request.id, payload=self.request.payload))


class Debug(Handler[p.DebugRequest]):
    """Fault injection on the emulator, for exercising recovery on a running daemon."""

    since = p.Feature.MODELS

    route = Route.HERE
    acquires = False

    def arrive(self) -> None:
        if self.client.uid != 0:
            raise CodedError(
                ErrorCode.NOT_PERMITTED,
                detail=f"debug faults need root (this client is uid {self.client.uid})",
            )
        if self.domain.device.kind != "emulator":
            raise CodedError(
                ErrorCode.UNSUPPORTED,
                what="debug faults on the kernel backend: they are the emulator's",
            )
        self.target: Domain | None = None
        if self.request.domain:
            daemon = self.client.daemon
            target = daemon.domain_named(self.request.domain) if daemon is not None else None
            if target is None:
                raise CodedError(
                    ErrorCode.INVALID_ARGUMENT, detail=f"no domain {self.request.domain!r}"
                )
            if self.request.action != "ssr":
                raise CodedError(
                    ErrorCode.INVALID_ARGUMENT,
                    detail="a domain is a target of ssr only (the other faults are the DSP's)",
                )
            self.target = target

    def run(self) -> Answer:
        driver: Any = self.domain.device.driver
        faults = driver.faults
        request = self.request
        seconds = request.duration_ms / 1000
        if request.action == "ssr" and self.target is not None:
            detail = _crash_domain(driver, self.target)
        elif request.action == "ssr":
            faults.subsystem_restart(down_for=seconds)
            detail = f"subsystem restart: the DSP is away for {seconds:g} s"
        elif request.action == "latency":
            faults.set_latency(seconds)
            detail = f"every invoke now takes {seconds:g} s longer"
        elif request.action == "fail_next_invoke":
            if request.code == 0:
                raise CodedError(
                    ErrorCode.INVALID_ARGUMENT, detail="fail_next_invoke needs a non-zero code"
                )
            faults.fail_next_invoke(request.code)
            detail = f"the next invoke answers 0x{request.code:08X}"
        else:
            faults.clear()
            detail = "latency and pending failures cleared"
        _log.warning(
            "debug fault injected", action=request.action, detail=detail, pid=self.client.pid
        )
        return Answer(p.DebugReply(id=request.id, detail=detail))


def _crash_domain(driver: Any, domain: Domain) -> str:
    """The domain's DSP process crashes (the emulator kills it): the domain recovers alone."""
    session = domain.session
    if session is None:
        raise CodedError(ErrorCode.DSP_RESTARTED)
    if not driver.crash_process(session.fileno()):
        raise CodedError(
            ErrorCode.INVALID_ARGUMENT, detail=f"domain {domain.name!r} has no DSP process"
        )
    domain.notice_restart("the DSP process crashed (debug ssr of the domain)", session)
    return f"the DSP process of domain {domain.name!r} crashed; it restarts alone"


def _destroyable(entry: Entry) -> list[Gate]:
    """What a destroying request waits for: the object exists, and every earlier
    request that named it has ended."""
    return [entry.created] + ([entry.idle] if entry.idle is not None else [])


HANDLERS: Final[dict[type[p.Request], type[Handler[Any]]]] = {
    p.AllocRequest: Alloc,
    p.FreeRequest: Free,
    p.MapRequest: Map,
    p.UnmapRequest: Unmap,
    p.OpenRequest: Open,
    p.CloseRequest: Close,
    p.InvokeRequest: Invoke,
    p.ModelLoadRequest: LoadModel,
    p.ModelInfoRequest: ModelInfo,
    p.ModelRunRequest: RunModel,
    p.ModelUnloadRequest: UnloadModel,
    p.ModelChainRequest: RunChain,
    p.StatusRequest: Status,
    p.PingRequest: Ping,
    p.DebugRequest: Debug,
}
"""The handler of each request type; every type in ``p.REPLY_TYPES`` has one."""
