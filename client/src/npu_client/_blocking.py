"""The blocking client: one socket to npud, safe to share between threads.

The requests' plumbing (pipelining over one socket, waiting, reading and writing)
is :mod:`npu_client._pipeline`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Self

from npu_client import _llm
from npu_client import _requests as requests
from npu_client._args import InvokeInput, InvokeOutput, budget_record
from npu_client._chain import Chain, Ref, Step
from npu_client._core import (
    ClientCore,
    ClientStatistics,
    EventCallback,
)
from npu_client._errors import ConnectFailed, NpuError
from npu_client._llm_client import DEFAULT_N_CTX, Llm
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
from npu_client._pipeline import Pipeline
from npu_client._settings import (
    SocketOrigin,
    client_name,
    connect_failure_message,
    priority_class,
    socket_origin,
    socket_path,
)
from npu_client._views import DaemonView, HandleIdentity, dsp_is_up, utilization_of
from npu_client.transport import OwnedFd
from npu_protocol import DaemonStatus, ErrorCode, ModelInfo, Priority


def connect(
    path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    priority: Priority | str = Priority.NORMAL,
    budget: tuple[float, float] | None = None,
    timeout: float | None = None,
    on_event: EventCallback | None = None,
    watch: bool = False,
) -> Client:
    """Connect to npud and shake hands; the returned client is ready for requests.

    ``path``: the socket; default ``$NPUD_SOCKET``, else ``/run/npud/npud.sock``.
    ``name``: shown in ``npuctl status`` and the daemon's log; default the
    program's name. ``priority``: ``"realtime"``, ``"normal"`` or
    ``"background"`` (the daemon may grant less: see ``client.priority``).
    ``budget``: a realtime client's ``(period, budget)`` in seconds: at most
    ``budget`` of DSP time every ``period`` (e.g. ``(0.032, 0.004)``); the
    daemon admits it only while the DSP is not overcommitted, else
    :class:`AdmissionRefused`.
    ``timeout``: seconds to wait for the connection and for each answer
    (``TimeoutError`` when exceeded); None waits as long as it takes.
    ``on_event``: called with each server event (see :class:`Client`).
    ``watch``: the client only asks for status and pings (``npuctl status``): npud
    opens no DSP process for it, and refuses its requests that need one
    (:class:`NotPermitted`).

    Raises :class:`ConnectFailed` when npud cannot be reached, or the error
    the daemon refused the connection with (e.g. :class:`NotPermitted`).
    """
    resolved = socket_path(path)
    core: ClientCore[DmaBuffer] = ClientCore(
        client_name(name), priority_class(priority), budget_record(budget), watch=watch
    )
    _check_timeout(timeout)
    sock = _open_socket(resolved, timeout, socket_origin(path))
    client = Client(sock, core, path=resolved, timeout=timeout, on_event=on_event)
    try:
        client._handshake()
    except BaseException:
        client.close()
        raise
    return client


def is_available(path: str | os.PathLike[str] | None = None, *, timeout: float = 0.5) -> bool:
    """True when npud answers at ``path`` (default as :func:`connect`) within ``timeout``
    seconds and its DSP is up (it reports the DSP's capabilities: it does not while the
    DSP restarts). Never raises for an unreachable, refusing or slow daemon: False."""
    try:
        # watch: the probe opens no DSP process (a user's own would be opened for it).
        with connect(path, name="npu-probe", timeout=timeout, watch=True) as client:
            return dsp_is_up(client.welcome)
    except (NpuError, OSError, TimeoutError):
        return False


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")


def _open_socket(path: str, timeout: float | None, origin: SocketOrigin) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.settimeout(None)  # deadlines are kept by poll(), so the socket itself stays blocking
    except OSError as exc:
        sock.close()
        raise ConnectFailed(connect_failure_message(path, exc, origin), path=path) from exc
    return sock


class Client(Pipeline["DmaBuffer"], DaemonView["DmaBuffer"]):
    """A connection to npud. Make one with :func:`connect`; close it (or use ``with``).

    Closing releases everything the connection holds, here (every buffer's fd
    and mapping) and in the daemon (buffers, mappings, handles).

    Server events are read while some request waits for its answer (an idle
    client sees them with its next request). A ``SessionRestarted`` moves
    :attr:`epoch`: the DSP process of the client's domain restarted, and every
    handle, model and DSP mapping of earlier epochs is gone: open, load and map
    again. Buffers stay (protocol version 3: they belong to no DSP process),
    unmapped; from a daemon of version 2 they go too, and are closed here (they
    report ``freed``). A ``ShuttingDown`` sets
    :attr:`shutting_down`. Each event is then passed to ``on_event``.
    Requests naming what is gone, or made while the daemon shuts down, fail
    with its errors (``DspRestarted``, ``ShuttingDownError``); once the
    connection is over, every request fails with the reason it ended.
    """

    def __init__(
        self,
        sock: socket.socket,
        core: ClientCore[DmaBuffer],
        *,
        path: str,
        timeout: float | None,
        on_event: EventCallback | None,
    ) -> None:
        """Internal: use :func:`connect`. Takes ownership of ``sock``."""
        super().__init__(sock, core, timeout=timeout, on_event=on_event)
        self._path = path
        self._llms: set[Llm] = set()
        """The LLMs loaded through this client (closed with it)."""

    # --- what the daemon said -----------------------------------------------------------

    @property
    def buffers(self) -> tuple[DmaBuffer, ...]:
        """The live buffers of this connection."""
        with self._lock:
            return self._core.buffers

    def statistics(self) -> ClientStatistics:
        with self._lock:
            return self._core.statistics()

    # --- requests ---------------------------------------------------------------------------

    def alloc(self, size: int) -> DmaBuffer:
        """Allocate a DMA-BUF of at least ``size`` bytes (rounded up to whole pages), at
        most ``limits.max_buffer_size`` (ValueError before sending)."""
        allocation = self._run(requests.alloc(self._core, size))
        try:
            buffer = DmaBuffer(self, *allocation)
        except (OSError, ValueError):
            self._free_quietly(allocation.buffer)
            raise
        with self._lock:
            return self._core.adopt(buffer)

    def open(self, uri: str) -> RemoteHandle:
        """Open a skel on the DSP (remotectl), e.g.
        ``file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp``."""
        return RemoteHandle(self, *self._run(requests.open_skel(self._core, uri)))

    def chain(self, steps: Sequence[Step], outputs: Sequence[Ref]) -> Chain:
        """Several of this client's loaded models run as one request, built once and run
        per chunk (``chain.run(inputs)``): each :class:`npu_client.Step` a graph of a
        model, its inputs fed by earlier steps' outputs (``"<step>:<output>"``) or given
        to ``run``; ``outputs`` the ``"<step>:<output>"`` a run returns. Checked here
        (InvalidArgument, InvalidTensorIndex, TensorMismatch naming the step);
        Unsupported against an npud before protocol version 7, which has no chains.
        See client/README.md (Several models per chunk)."""
        return Chain(self, steps, outputs)

    def load_model(
        self,
        source: ModelSource,
        *,
        shapes: Mapping[str, Sequence[int | Sequence[int]]] | None = None,
        name: str | None = None,
        constants: Mapping[str, object] | None = None,
    ) -> Model:
        """Load a model onto the NPU: a path (opened here, with this process's
        permissions), an open binary file or an fd; only its fd travels to npud, which
        reads the file through it. ``shapes`` gives ONNX model tensors' whole shapes
        by name (the emulator backend): every input with a free dimension, and an
        output only when its shape does not follow from the inputs'; a dimension given
        as several sizes (a list, tuple or range: ``{"preds": (1, [1, 2, 4])}``, at most
        8) makes a graph of each, and ``run`` without ``graph`` runs the one whose inputs
        take the data's shapes. ``name`` is what ``npuctl
        status`` shows (default: the file's name). ``constants`` fixes ONNX model inputs
        to values by name (``{"sr": 16000}``): npud folds them into the model before
        shape inference, so outputs that hang on them (an ``If`` on the value) get their
        shapes, and those inputs are gone from the model. The model's tensors live in
        one DMA-BUF mapped here: see :class:`Model`."""
        checked, sizes = split_shapes(shapes)
        fixed = check_constants(constants)
        with model_file(source) as (fd, shown):
            loaded = self._run(
                requests.load_model(self._core, fd, (name or shown)[:1024], checked, fixed, sizes)
            )
        try:
            state = ModelState(*loaded)
        except (OSError, ValueError):
            with contextlib.suppress(NpuError, TimeoutError):
                self._run(requests.discard_model(loaded.model))
            raise
        state.sized = frozenset(sizes)
        ignored = ignored_constants(state, fixed)
        if ignored_sizes(state, sizes):
            with contextlib.suppress(NpuError, TimeoutError):
                self._run(requests.discard_model(loaded.model))
            state.release_local("npud ignored its sizes")
            raise requests.ignored_sizes_error()
        if ignored:
            with contextlib.suppress(NpuError, TimeoutError):
                self._run(requests.discard_model(loaded.model))
            state.release_local("npud ignored its constants")
            raise requests.ignored_constants_error(ignored)
        with self._lock:
            self._core.adopt_model(state)
        return Model(self, state)

    def load_llm(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
    ) -> Llm:
        """Load an LLM (a GGUF file) onto the NPU: llama.cpp in this process, with its
        Hexagon backend, its work on the DSP through this client's npud (a DSP process
        of its own). ``n_ctx``: tokens of context, prompt and answer together;
        ``n_threads``: llama.cpp's CPU threads for what stays on the CPU (default:
        llama.cpp's). Needs the ``llm`` extra and llama.cpp's libraries (``make llm``):
        :class:`LlmUnavailable` says what is missing and how to get it;
        :class:`DeviceNotFound` when llama.cpp finds no NPU through npud.

        The first ``load_llm`` of a process decides the npud that llama.cpp reaches (this
        client's socket) and its name and class there (this client's name with
        ``-llm``, this client's class). See :class:`Llm`."""
        with self._lock:
            self._core.check_alive()
            connection = _llm.Connection(
                socket=self._path,
                name=f"{self._core.name[:60]}-llm",
                priority=str(self.priority),
            )
        core = _llm.load(connection, path, n_ctx=n_ctx, n_threads=n_threads)
        llm = Llm(core, self._forget_llm)
        with self._lock:
            closed = self._closed
            if not closed:
                self._llms.add(llm)
        if closed:  # meanwhile: nothing of a client outlives it
            llm.close()
            self._core.check_alive()  # raises ConnectionClosedError
        return llm

    def _forget_llm(self, llm: Llm) -> None:
        with self._lock:
            self._llms.discard(llm)

    def status(self) -> DaemonStatus:
        """The daemon's status: what ``npuctl status`` shows."""
        return self._run(requests.status())

    def ping(self, payload: bytes | bytearray | memoryview = b"") -> bytes:
        """A round trip through the daemon; returns the payload it echoed."""
        return self._run(requests.ping(payload))

    def utilization(self) -> float:
        """The DSP's busy share, 0..1: the daemon's average over its last 10 s of all its
        slots (what ``npuctl top``'s header shows as "DSP busy")."""
        return utilization_of(self.status())

    def debug_fault(
        self, action: str, duration: float = 0.0, code: int = 0, *, domain: str = ""
    ) -> str:
        """Inject a fault into the emulated DSP, to exercise recovery: ``"ssr"`` (a
        subsystem restart, the DSP away for ``duration`` seconds; with ``domain``, that
        domain's DSP process crashes and it restarts alone), ``"latency"`` (every invoke
        ``duration`` longer), ``"fail_next_invoke"`` (answers ``code``), ``"clear"``. Root
        only, and the emulator only (``NotPermitted``, ``Unsupported``). Returns what the
        daemon did."""
        return self._run(requests.debug_fault(action, duration, code, domain))

    # --- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and every buffer's fd and mapping. Idempotent.

        Requests still waiting fail with :class:`ConnectionClosedError`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._core.die(ErrorCode.CONNECTION_CLOSED, "this client was closed")
            self._wake(handoff=False)
            # Wakes a reader blocked in recvmsg and a writer blocked in sendmsg
            # (OSError: not connected any more, nothing to wake).
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            while self._reading:  # the socket is closed only once nobody is in recvmsg
                self._park(lambda: not self._reading, None, reads=False)
            self._core.release_buffers("gone: its client was closed")
        with self._send_lock:
            self._sock.close()
        for llm in self._take_llms():
            llm.close()

    def _take_llms(self) -> list[Llm]:
        with self._lock:
            llms, self._llms = list(self._llms), set()
        return llms

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"epoch {self.epoch}"
        return f"<npu_client.Client {self._path} {state}>"

    def _free_quietly(self, buffer_id: int) -> None:
        """Free a buffer this side could not use; the connection's end frees it anyway."""
        with contextlib.suppress(NpuError, TimeoutError):
            self._run(requests.discard(buffer_id))


class DmaBuffer(MappedBuffer):
    """A DMA-BUF allocated by npud and mapped into this process (``MAP_SHARED``, RW).

    ``view()`` gives a writable memoryview; ``slice(offset, length)`` an invoke
    argument the DSP reads or writes in place. ``map()`` maps it into the DSP
    (later calls answer the cached address until ``unmap()``).
    ``free()`` (or leaving a ``with`` block) releases it in the daemon, then
    closes the fd and the mapping here. ``id``, ``size`` and ``fd`` are
    read-only; the buffer owns its fd.
    """

    def __init__(self, client: Client, buffer_id: int, size: int, fd: OwnedFd, epoch: int) -> None:
        """Internal: use :meth:`Client.alloc`. Takes ownership of ``fd``."""
        super().__init__(buffer_id, size, fd, epoch, client._core.kept_mappings)
        self._client = client

    def map(self) -> int:
        """Map the buffer into the DSP; returns its DSP address (cached until unmap)."""
        address = self.dsp_address
        if address is not None:
            return address
        return self._client._run(requests.map_buffer(self))

    def unmap(self) -> None:
        """Remove the DSP mapping; nothing to do if it is not mapped."""
        if self.dsp_address is not None:
            self._client._run(requests.unmap_buffer(self))

    def free(self) -> None:
        """Release the buffer in the daemon, then its fd and mapping here. Idempotent.

        If the connection is gone the daemon already freed it: no error. Other
        errors leave the buffer as it was (the client's close releases it).
        """
        if not self.freed:
            self._client._run(requests.free(self._client._core, self))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.free()


class RemoteHandle(HandleIdentity):
    """A skel opened on the DSP; call its methods with :meth:`invoke`."""

    def __init__(self, client: Client, handle_id: int, uri: str, epoch: int) -> None:
        """Internal: use :meth:`Client.open`."""
        super().__init__(handle_id, uri, epoch)
        self._client = client

    def invoke(
        self,
        method: int | None,
        inputs: Sequence[InvokeInput] = (),
        outputs: Sequence[InvokeOutput] = (),
        *,
        sc: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> list[bytes | None]:
        """Call ``method`` (0..31; or pass ``method=None`` and a raw scalars word ``sc``).

        ``inputs``: bytes-like (sent inline) or ``buffer.slice(...)`` (read in
        place). ``outputs``: an int capacity (the bytes come back) or a slice
        (written in place). Returns one entry per output: bytes for a
        capacity, None for a slice. ``timeout`` (seconds) bounds the daemon's
        wait for the DSP. ``deadline`` (seconds from now): if the call cannot
        start on the DSP by then it fails with :class:`DeadlineExceeded`
        without running; finishing later counts as a miss in ``npuctl top``.
        A non-zero result from the method raises :class:`InvokeFailed` with
        ``fields["code"]``.
        """
        client = self._client
        return client._run(
            requests.invoke(client._core, self, method, inputs, outputs, sc, timeout, deadline)
        )

    def close(self) -> None:
        """Close the handle on the DSP. Idempotent; no error if the handle is already
        gone with the connection or with a DSP restart."""
        if not self._closed:
            self._client._run(requests.close_skel(self))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RemoteHandle {self._id} {self._uri!r}{' closed' if self._closed else ''}>"


class Model(ModelBase["Client"]):
    """A model loaded in npud (:meth:`Client.load_model`); its tensors are shared memory.

    ``inputs`` / ``outputs`` describe the tensors (name, dtype, shape, nbytes,
    offset). :meth:`run` gives inputs, runs once and returns every output: numpy
    arrays when numpy is installed, ``bytes`` otherwise. Inputs keep their value
    between runs, so ``run({"audio": chunk})`` changes only the audio. For
    callers that keep state between calls: :meth:`set_input`, :meth:`execute`,
    :meth:`get_output`, and :meth:`input_view` / :meth:`output_view`, views of
    the tensors in the shared arena (write an input in place: no copy at all).
    A run sends only its small request; no tensor bytes cross the socket.
    :meth:`unload` (or leaving a ``with`` block) releases it in npud and here.
    Everything but the waiting is :class:`npu_client._model_base.ModelBase`,
    shared with the trio client's ``TrioModel``.
    """

    def run(
        self,
        inputs: Mapping[str, TensorValue] | None = None,
        *,
        graph: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """Set ``inputs`` (by name), run graph ``graph`` (by name; the first when None)
        once, return every output of it by name (copies). ``timeout`` and ``deadline``
        (seconds) as for ``RemoteHandle.invoke``."""
        index = self._run_graph(graph, inputs)
        self._set_inputs(inputs, index)
        self._client._run(self._execute_call(timeout, deadline, index))
        return self._outputs(index)

    def execute(
        self,
        *,
        graph: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> None:
        """Run graph ``graph`` (the first when None) once on its inputs in the arena
        (InputNotSet if one never had a value)."""
        self._client._run(self._execute_call(timeout, deadline, self._graph(graph)))

    def info(self) -> ModelInfo:
        """What npud knows of the model now (its runs included)."""
        return self._client._run(self._info_call())

    def unload(self) -> None:
        """Unload it in npud, then unmap it here. Idempotent; no error if it is gone
        already (its connection, a DSP restart)."""
        call = self._unload_call()
        if call is not None:
            self._client._run(call)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unload()
