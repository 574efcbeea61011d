"""The trio client: the blocking client's methods, awaited.

Needs trio (``pip install npu-client[trio]``); ``import npu_client`` does not
import this module. Use ``async with npu_client.open_trio_client() as npu:``
or ``npu = await npu_client.trio_client.connect()`` (then ``await
npu.close()``).

Like the blocking client it drives the shared core (``npu_client._core``)
and runs the same request kinds (``npu_client._requests``), and it has no
background task: whichever waiting task finds nobody reading reads for
everyone, into one buffer the client keeps. Tasks may call concurrently;
each waits only for its own answer. Cancelling a call abandons its answer
(the request itself has already gone to the daemon and runs to its end; an
abandoned alloc's fd is closed, its buffer lives until the connection ends);
a call cancelled before a byte of its request was written withdraws it (it is
never sent and frees its in-flight slot).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Self, TypeVar

import trio

from npu_client import _llm
from npu_client import _requests as requests
from npu_client._args import InvokeInput, InvokeOutput, budget_record
from npu_client._chain import Ref, Step, TrioChain
from npu_client._core import (
    Call,
    ClientCore,
    ClientStatistics,
    EventCallback,
    Pending,
    deliver_events,
)
from npu_client._errors import ConnectFailed, NpuError
from npu_client._llm_client import DEFAULT_N_CTX
from npu_client._llm_trio import TrioLlm
from npu_client._memory import MappedBuffer
from npu_client._model_base import ModelBase
from npu_client._models import (
    ModelSource,
    ModelState,
    TensorValue,
    check_constants,
    ignored_constants,
    ignored_sizes,
    model_file,
    split_shapes,
)
from npu_client._settings import (
    client_name,
    connect_failure_message,
    priority_class,
    socket_origin,
    socket_path,
)
from npu_client._views import DaemonView, HandleIdentity, dsp_is_up, utilization_of
from npu_client.transport import (
    ANCILLARY_SPACE,
    RECEIVE_BUFFER_SIZE,
    OwnedFd,
    TransportError,
    fds_ancillary,
    parse_ancillary,
)
from npu_protocol import DaemonStatus, ErrorCode, ModelInfo, Priority

__all__ = [
    "TrioClient",
    "TrioDmaBuffer",
    "TrioLlm",
    "TrioRemoteHandle",
    "connect",
    "open_trio_client",
]

T = TypeVar("T")

_CLOEXEC = int(socket.MSG_CMSG_CLOEXEC)  # an IntFlag member as a plain int


async def connect(
    path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    priority: Priority | str = Priority.NORMAL,
    budget: tuple[float, float] | None = None,
    on_event: EventCallback | None = None,
    watch: bool = False,
) -> TrioClient:
    """Connect to npud and shake hands. Arguments as ``npu_client.connect`` (use
    ``trio.move_on_after`` / ``fail_after`` for timeouts). Close with ``await
    client.close()``."""
    resolved = socket_path(path)
    core: ClientCore[TrioDmaBuffer] = ClientCore(
        client_name(name), priority_class(priority), budget_record(budget), watch=watch
    )
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.connect(resolved)
    except OSError as exc:
        sock.close()
        raise ConnectFailed(
            connect_failure_message(resolved, exc, socket_origin(path)), path=resolved
        ) from exc
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


async def is_available(path: str | os.PathLike[str] | None = None, *, timeout: float = 0.5) -> bool:
    """As ``npu_client.is_available``, from trio."""
    try:
        with trio.fail_after(timeout):
            client = await connect(path, name="npu-probe", watch=True)  # no DSP process
            try:
                return dsp_is_up(client.welcome)
            finally:
                await client.close()
    except (NpuError, OSError, trio.TooSlowError):
        return False


@contextlib.asynccontextmanager
async def open_trio_client(
    path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    priority: Priority | str = Priority.NORMAL,
    budget: tuple[float, float] | None = None,
    on_event: EventCallback | None = None,
    watch: bool = False,
) -> AsyncIterator[TrioClient]:
    """``async with open_trio_client() as npu:`` a connected client, closed on exit."""
    client = await connect(
        path, name=name, priority=priority, budget=budget, on_event=on_event, watch=watch
    )
    try:
        yield client
    finally:
        client._close_now()
        await client._close_llms()


class TrioClient(DaemonView["TrioDmaBuffer"]):
    """A connection to npud for trio code; see ``npu_client.Client`` for the semantics."""

    def __init__(
        self,
        sock: trio.socket.SocketType,
        core: ClientCore[TrioDmaBuffer],
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
        self._receive_buffer = bytearray(RECEIVE_BUFFER_SIZE)  # the reader's, reused
        self._received = memoryview(self._receive_buffer)
        self._llms: set[TrioLlm] = set()
        """The LLMs loaded through this client (closed with it)."""

    # --- what the daemon said -----------------------------------------------------------

    @property
    def buffers(self) -> tuple[TrioDmaBuffer, ...]:
        return self._core.buffers

    def statistics(self) -> ClientStatistics:
        return self._core.statistics()

    # --- requests ---------------------------------------------------------------------------

    async def alloc(self, size: int) -> TrioDmaBuffer:
        """Allocate a DMA-BUF of at least ``size`` bytes (rounded up to whole pages), at
        most ``limits.max_buffer_size`` (ValueError before sending)."""
        allocation = await self._run(requests.alloc(self._core, size))
        try:
            buffer = TrioDmaBuffer(self, *allocation)
        except (OSError, ValueError):
            await self._free_quietly(allocation.buffer)
            raise
        return self._core.adopt(buffer)

    async def open(self, uri: str) -> TrioRemoteHandle:
        return TrioRemoteHandle(self, *await self._run(requests.open_skel(self._core, uri)))

    def chain(self, steps: Sequence[Step], outputs: Sequence[Ref]) -> TrioChain:
        """Several of this client's loaded models run as one request, built once and run
        per chunk (``chain.run(inputs)``): each :class:`npu_client.Step` a graph of a
        model, its inputs fed by earlier steps' outputs (``"<step>:<output>"``) or given
        to ``run``; ``outputs`` the ``"<step>:<output>"`` a run returns. Checked here
        (InvalidArgument, InvalidTensorIndex, TensorMismatch naming the step);
        Unsupported against an npud before protocol version 7, which has no chains.
        See client/README.md (Several models per chunk)."""
        return TrioChain(self, steps, outputs)

    async def load_model(
        self,
        source: ModelSource,
        *,
        shapes: Mapping[str, Sequence[int | Sequence[int]]] | None = None,
        name: str | None = None,
        constants: Mapping[str, object] | None = None,
    ) -> TrioModel:
        """As ``Client.load_model``: the file is opened here and only its fd is sent."""
        checked, sizes = split_shapes(shapes)
        fixed = check_constants(constants)
        with model_file(source) as (fd, shown):
            loaded = await self._run(
                requests.load_model(self._core, fd, (name or shown)[:1024], checked, fixed, sizes)
            )
        try:
            state = ModelState(*loaded)
        except (OSError, ValueError):
            with contextlib.suppress(NpuError):
                await self._run(requests.discard_model(loaded.model))
            raise
        state.sized = frozenset(sizes)
        ignored = ignored_constants(state, fixed)
        if ignored_sizes(state, sizes):
            with contextlib.suppress(NpuError):
                await self._run(requests.discard_model(loaded.model))
            state.release_local("npud ignored its sizes")
            raise requests.ignored_sizes_error()
        if ignored:
            with contextlib.suppress(NpuError):
                await self._run(requests.discard_model(loaded.model))
            state.release_local("npud ignored its constants")
            raise requests.ignored_constants_error(ignored)
        self._core.adopt_model(state)
        return TrioModel(self, state)

    async def load_llm(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
    ) -> TrioLlm:
        """As :meth:`npu_client.Client.load_llm` (the load runs on a worker thread)."""
        self._core.check_alive()
        connection = _llm.Connection(
            socket=self._path, name=f"{self._core.name[:60]}-llm", priority=str(self.priority)
        )
        core = await trio.to_thread.run_sync(
            lambda: _llm.load(connection, path, n_ctx=n_ctx, n_threads=n_threads)
        )
        llm = TrioLlm(core, self._llms.discard)
        if self._closed:  # meanwhile: nothing of a client outlives it
            await llm.close()
            self._core.check_alive()  # raises ConnectionClosedError
        self._llms.add(llm)
        return llm

    async def status(self) -> DaemonStatus:
        return await self._run(requests.status())

    async def ping(self, payload: bytes | bytearray | memoryview = b"") -> bytes:
        return await self._run(requests.ping(payload))

    async def utilization(self) -> float:
        """As ``Client.utilization``."""
        return utilization_of(await self.status())

    async def debug_fault(
        self, action: str, duration: float = 0.0, code: int = 0, *, domain: str = ""
    ) -> str:
        """As :meth:`npu_client.Client.debug_fault`."""
        return await self._run(requests.debug_fault(action, duration, code, domain))

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection and every buffer's fd and mapping. Idempotent.

        The closing is done before the checkpoint, so it happens even when cancelled;
        its LLMs are closed then (shielded: each waits at most for a token being made).
        """
        self._close_now()
        await self._close_llms()
        await trio.lowlevel.checkpoint()

    aclose = close
    """trio's name for it (``trio.abc.AsyncResource``)."""

    async def _close_llms(self) -> None:
        """Close the LLMs loaded through this client (each shielded: done even when
        cancelled, waiting at most for a token being made)."""
        llms, self._llms = list(self._llms), set()
        for llm in llms:
            await llm.close()

    def _close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._core.die(ErrorCode.CONNECTION_CLOSED, "this client was closed")
        self._notify()
        # A task blocked on the socket gets trio.ClosedResourceError (handled as closed).
        self._sock.close()
        self._core.release_buffers("gone: its client was closed")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"epoch {self.epoch}"
        return f"<npu_client.trio_client.TrioClient {self._path} {state}>"

    # --- internals: one call ---------------------------------------------------------------------

    async def _run(self, call: Call[T]) -> T:
        """Send ``call``'s request, wait for its answer, and return what it becomes."""
        await trio.lowlevel.checkpoint_if_cancelled()
        core = self._core
        begun = core.begin(call)
        while begun is None:  # every slot is taken: wait (reading) for one
            await self._wait_until(core.can_begin)
            # No checkpoint between the wait and begin(): the free slot is still free.
            begun = core.begin(call)
        pending, data, fds = begun
        if data:  # empty when the connection is over: the Pending says why
            try:
                await self._write(data, fds, pending)
                await self._wait_until(lambda: pending.done)
            except BaseException:
                core.abandon(pending)
                self._notify()  # a withdrawn request freed its slot
                raise
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return call.finish(pending)

    async def _free_quietly(self, buffer_id: int) -> None:
        with contextlib.suppress(NpuError):
            await self._run(requests.discard(buffer_id))

    async def _handshake(self) -> None:
        await self._write(self._core.hello(), ())
        await self._wait_until(self._core.welcomed_or_dead)
        self._core.check_alive()

    async def _write(
        self, data: bytes | bytearray, fds: Sequence[int], pending: Pending | None = None
    ) -> None:
        """Send one frame. Cancellable: a caller whose frame has not started
        leaves nothing behind (its request is withdrawn: ``pending.sent`` is set
        only once a byte went out); one cut off part-way garbles the stream for
        every task, so the connection dies with it (never an unkillable wait)."""
        async with self._send_lock:
            view = memoryview(data)
            sent = 0
            try:
                if fds:
                    sent = await self._sock.sendmsg([view], fds_ancillary(fds))
                else:
                    sent = await self._sock.send(view)
                if pending is not None:
                    pending.sent = True  # a send returns once it took a byte at least
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

    # --- internals: waiting and reading ------------------------------------------------------

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Return once ``ready()``, reading for every task while nobody else reads;
        server events read meanwhile are handed to ``on_event``."""
        while True:
            if self._core.events:
                deliver_events(self._core.take_events(), self._on_event)
            elif ready():
                return
            elif self._reading:
                await self._progress.wait()
            else:
                self._reading = True
                try:
                    await self._read_once()
                finally:
                    self._reading = False
                    self._notify()

    async def _read_once(self) -> None:
        try:
            size, ancdata, flags, _ = await self._sock.recvmsg_into(
                [self._receive_buffer], ANCILLARY_SPACE, _CLOEXEC
            )
            fds = parse_ancillary(ancdata, flags)
        except TransportError as exc:
            self._core.die(ErrorCode.FDS_TRUNCATED, str(exc))
        except (OSError, trio.ClosedResourceError) as exc:
            self._core.die(ErrorCode.CONNECTION_CLOSED, f"reading failed: {_reason(exc)}")
        else:
            self._core.receive(self._received[:size], fds)  # copied by the protocol

    def _notify(self) -> None:
        """Wake every waiting task to look at its request again."""
        self._progress.set()
        self._progress = trio.Event()


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
        super().__init__(buffer_id, size, fd, epoch, client._core.kept_mappings)
        self._client = client

    async def map(self) -> int:
        address = self.dsp_address
        if address is not None:
            await trio.lowlevel.checkpoint()
            return address
        return await self._client._run(requests.map_buffer(self))

    async def unmap(self) -> None:
        if self.dsp_address is None:
            await trio.lowlevel.checkpoint()
            return
        await self._client._run(requests.unmap_buffer(self))

    async def free(self) -> None:
        if self.freed:
            await trio.lowlevel.checkpoint()
            return
        await self._client._run(requests.free(self._client._core, self))

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
        deadline: float | None = None,
    ) -> list[bytes | None]:
        """As :meth:`npu_client.RemoteHandle.invoke`."""
        client = self._client
        return await client._run(
            requests.invoke(client._core, self, method, inputs, outputs, sc, timeout, deadline)
        )

    async def close(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        await self._client._run(requests.close_skel(self))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<TrioRemoteHandle {self._id} {self._uri!r}{' closed' if self._closed else ''}>"


class TrioModel(ModelBase["TrioClient"]):
    """A model loaded in npud; as the blocking ``Model``, with the requests awaited
    (``run``, ``execute``, ``info``, ``unload``) and the rest synchronous (they touch
    only the shared arena). Everything but the waiting is
    :class:`npu_client._model_base.ModelBase`, shared with ``Model``."""

    async def run(
        self,
        inputs: Mapping[str, TensorValue] | None = None,
        *,
        graph: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """As ``Model.run``."""
        index = self._run_graph(graph, inputs)
        self._set_inputs(inputs, index)
        await self._client._run(self._execute_call(timeout, deadline, index))
        return self._outputs(index)

    async def execute(
        self,
        *,
        graph: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> None:
        """As ``Model.execute``."""
        await self._client._run(self._execute_call(timeout, deadline, self._graph(graph)))

    async def info(self) -> ModelInfo:
        """As ``Model.info``."""
        return await self._client._run(self._info_call())

    async def unload(self) -> None:
        """As ``Model.unload``."""
        call = self._unload_call()
        if call is None:
            await trio.lowlevel.checkpoint()
            return
        await self._client._run(call)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.unload()
