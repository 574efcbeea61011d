"""Models as resources of a connection: what a loaded model is and owns.

A client's model (:class:`NpuModel`) is a lease on a *model load* of its
domain (:class:`SharedLoad`: one open handle of the portal_qnn skel with the
model in its slot) plus one DMA-BUF, the model's **arena**, allocated at load
and owned by the client's model: for each of the model's graphs in index
order, from a page boundary, every input tensor of that graph, then (from a
page boundary) every output tensor, each at a multiple of 64 bytes
(:func:`npud.fastrpc.stubs.portal_qnn.arena_layout`); graph 0's regions are where a
one-graph model's are. The arena's fd goes to the
client in the load reply; a run is then one invoke of portal_qnn's ``run`` on
two slices of the arena, so nothing but the fixed-size request and reply
crosses the socket (PROTOCOL.md section 7.9).

Shared loads. Two clients of one domain that load the same model (the same
bytes, by SHA-256 of the file, and the same shapes) share one load: the
weights are held once, in one registry entry with a lease each, and each
client has its own arena. The last lease closes the handle, which unloads
the model on the DSP. Runs of a shared load take turns on the DSP (the skel
runs one call per handle at a time).

The requests that load, describe, run and unload a model are handlers in
:mod:`npud.requests.model_requests` (LoadModel, ModelInfo, RunModel, UnloadModel); several models in
one request are :mod:`npud.requests.chains` (RunChain).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Final

import msgspec

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.domain.digests import FileDigests
from npud.domain.registry import Registry, Shared
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.invoke_args import Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.model_walks import CheckedFile
from npud.fastrpc.stubs.portal_qnn import (
    Backend,
    DataType,
    GraphSpec,
    LoadedModel,
    PortalQnn,
    TensorSpec,
    arena_layout,
)
from npud.formats.onnx_values import Constant

PAGE: Final = 4096


@dataclasses.dataclass(frozen=True)
class ArenaLayout:
    """Where a graph's tensors live in the model's arena: its inputs from ``input_base``
    (offsets relative to it), its outputs from ``output_base`` (likewise)."""

    input_offsets: tuple[int, ...]
    input_bytes: int
    output_base: int
    output_offsets: tuple[int, ...]
    output_bytes: int
    input_base: int = 0

    @classmethod
    def of(cls, graph: GraphSpec, base: int = 0) -> ArenaLayout:
        """``graph``'s regions from ``base`` (a page boundary) on."""
        inputs, input_bytes = arena_layout(graph.inputs)
        outputs, output_bytes = arena_layout(graph.outputs)
        return cls(inputs, input_bytes, base + _pages(input_bytes), outputs, output_bytes, base)

    @classmethod
    def of_model(cls, graphs: tuple[GraphSpec, ...]) -> tuple[ArenaLayout, ...]:
        """Every graph's regions, one after the other, each from a page boundary."""
        layouts: list[ArenaLayout] = []
        for graph in graphs:
            layouts.append(cls.of(graph, layouts[-1].size if layouts else 0))
        return tuple(layouts)

    @property
    def size(self) -> int:
        """Where the graph's regions end: whole pages (the arena's size for the last)."""
        return _pages(self.output_base + self.output_bytes)


def _pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


def _graph_info(graph: GraphSpec, layout: ArenaLayout) -> p.GraphInfo:
    return p.GraphInfo(
        name=graph.name,
        inputs=tuple(
            _tensor(s, layout.input_base + o)
            for s, o in zip(graph.inputs, layout.input_offsets, strict=True)
        ),
        outputs=tuple(
            _tensor(s, layout.output_base + o)
            for s, o in zip(graph.outputs, layout.output_offsets, strict=True)
        ),
    )


def _tensor(spec: TensorSpec, offset: int) -> p.TensorInfo:
    return p.TensorInfo(
        name=spec.name,
        # An unknown code (a newer DSP's): its raw bytes, as a client can hold them.
        dtype=spec.dtype.numpy if isinstance(spec.dtype, DataType) else "uint8",
        qnn_type=int(spec.dtype),
        shape=spec.shape,
        nbytes=spec.nbytes,
        offset=offset,
    )


@dataclasses.dataclass(eq=False)
class SharedLoad:
    """One model load of a domain: a portal_qnn handle with the model in a slot."""

    portal: PortalQnn
    loaded: LoadedModel

    def close(self) -> list[CodedError]:
        """Close the handle (the DSP unloads the model); the failures."""
        try:
            self.portal.close()
        except CodedError as exc:
            return [exc]
        return []


def load_key(
    digests: FileDigests,
    fd: int,
    size: int,
    backend: Backend,
    shapes: Mapping[str, tuple[int, ...]],
    constants: Mapping[str, Constant] | None = None,
    sizes: Mapping[str, tuple[tuple[int, ...], ...]] | None = None,
) -> Hashable:
    """What makes two loads the same: the SHA-256 of the file's first ``size`` bytes (its
    size when it was checked: a file that grows meanwhile is not read forever), known to
    ``digests`` or read through ``fd`` with pread (the caller's offset stays), the backend
    and the shapes and input values."""
    digest, length = digests.sha256(fd, size)
    fixed = tuple(sorted((constants or {}).items()))
    sized = tuple(sorted((sizes or {}).items()))
    return ("model", backend, length, digest, tuple(sorted(shapes.items())), fixed, sized)


class NpuModel:
    """One client's loaded model: its lease on a shared load and its arena, released once."""

    def __init__(
        self,
        session: FastRpcSession,
        registry: Registry,
        shared: Shared[SharedLoad],
        arena: DmaBuffer,
        release_arena: Callable[[DmaBuffer], None],
        layouts: tuple[ArenaLayout, ...],
        name: str,
    ) -> None:
        self.session = session
        self._registry = registry
        self._shared = shared
        loaded = shared.value.loaded
        self._portal = shared.value.portal
        self._slot = loaded.slot
        self.arena = arena
        self._release_arena = release_arena
        self._slices = tuple(
            (
                Slice(arena, layout.input_base, layout.input_bytes),
                Slice(arena, layout.output_base, layout.output_bytes),
            )
            for layout in layouts
        )
        self.bytes = loaded.file.size + arena.size
        """What the model counts against ``max_model_bytes``."""
        self.name = name
        self.graph_names = tuple(graph.name for graph in loaded.graphs)
        self.graph_specs = loaded.graphs
        self.layouts = layouts
        """Where each graph's tensors are in the arena (a chain gathers and scatters)."""
        graphs = tuple(
            _graph_info(graph, layout) for graph, layout in zip(loaded.graphs, layouts, strict=True)
        )
        self._info = p.ModelInfo(
            name=name,
            description=loaded.file.description[:1024],
            file_bytes=loaded.file.size,
            arena_bytes=arena.size,
            inputs=graphs[0].inputs,
            outputs=graphs[0].outputs,
            graphs=graphs,
        )
        self._lock = threading.Lock()
        self.runs = 0
        self.dsp_seconds = 0.0
        self._released = False

    @property
    def portal(self) -> PortalQnn:
        """The handle the model's load is in (shared with the clients sharing the load)."""
        return self._portal

    @property
    def slot(self) -> int:
        return self._slot

    @property
    def shared_by(self) -> int:
        """Leases on this model's load (1: this client alone)."""
        return self._shared.leases

    @classmethod
    def load(
        cls,
        session: FastRpcSession,
        registry: Registry,
        backend: Backend,
        fd: int,
        *,
        digests: FileDigests,
        name: str,
        shapes: dict[str, tuple[int, ...]],
        constants: Mapping[str, Constant] | None = None,
        sizes: Mapping[str, tuple[tuple[int, ...], ...]] | None = None,
        allocate: Callable[[int], DmaBuffer],
        release_arena: Callable[[DmaBuffer], None],
        checked: CheckedFile | None = None,
    ) -> NpuModel:
        """The model open on ``fd`` (the caller keeps it), loaded or shared in the domain
        (its ``registry`` and ``digests``), with an arena from ``allocate(size)``. On any
        failure what was made is released again before raising. ``checked``: what
        :meth:`PortalQnn.check` found for the file, ``shapes``, ``constants`` and
        ``sizes`` (made here when None; the daemon makes it on a thread of the loading
        client's own, npud.requests.model_check)."""
        # The file is checked before a byte of it is hashed: a regular file, of the format
        # the backend takes, self-contained (npud.fastrpc.stubs.model_format).
        if checked is None:
            checked = PortalQnn.check(fd, backend, shapes, constants=constants, sizes=sizes)
        sniffed = checked.file
        try:
            key = load_key(digests, fd, sniffed.size, backend, shapes, constants, sizes)
        except OSError as exc:
            raise CodedError(
                ErrorCode.MODEL_FILE_UNREADABLE, detail=f"cannot read the file: {exc.strerror}"
            ) from None
        shared = registry.acquire(key)
        if shared is None:
            portal = PortalQnn.open(session, backend=backend)
            try:
                loaded = portal.load(
                    fd, shapes=shapes, constants=constants, sizes=sizes, checked=checked
                )
            except BaseException:
                _quietly(portal.close)
                raise
            mine = SharedLoad(portal, loaded)
            shared = registry.share(key, mine)
            if shared.value is not mine:  # another load of the same model won the race
                _quietly(portal.close)
        assert isinstance(shared.value, SharedLoad)
        typed: Shared[SharedLoad] = shared  # type: ignore[assignment]
        try:
            layouts = ArenaLayout.of_model(typed.value.loaded.graphs)
            arena = allocate(layouts[-1].size)
        except BaseException:
            if registry.give_back(typed):
                typed.value.close()
            raise
        return cls(session, registry, typed, arena, release_arena, layouts, name)

    def info(self, protocol_version: int) -> p.ModelInfo:
        """What the load reply and model_info tell the client, with the runs so far;
        ``graphs`` from protocol version 5 on (an older client knows only graph 0)."""
        if not p.speaks(protocol_version, p.Feature.GRAPHS):
            return msgspec.structs.replace(self._info, runs=self.runs, graphs=())
        return msgspec.structs.replace(self._info, runs=self.runs)

    def graph_index(self, name: str) -> int:
        """The graph ``model_run.graph`` names ("" the first); CodedError
        INVALID_TENSOR_INDEX, naming the model's graphs, when it has none of that name."""
        if not name:
            return 0
        if name in self.graph_names:
            return self.graph_names.index(name)
        graphs = ", ".join(repr(n) for n in self.graph_names if n) or "none with a name"
        raise CodedError(
            ErrorCode.INVALID_TENSOR_INDEX,
            index=f"graph {name!r} (the model's graphs: {graphs})",
        )

    def run(self, graph: int = 0) -> tuple[tuple[int, ...], ...]:
        """One run of graph ``graph``: its inputs in the arena in, its outputs into it
        (one invoke; two when an output's size is the data's). Every output's shape as
        the run produced it when the graph has outputs with rooms, else ()."""
        inputs, outputs = self._slices[graph]
        return self._portal.run_arena(self._slot, inputs, outputs, graph=graph) or ()

    def count_run(self, dsp_seconds: float) -> None:
        with self._lock:
            self.runs += 1
            self.dsp_seconds += dsp_seconds

    def row(self, model_id: int) -> p.ModelRow:
        return p.ModelRow(
            id=model_id,
            name=self.name,
            bytes=self.bytes,
            runs=self.runs,
            dsp_us=round(self.dsp_seconds * 1_000_000),
        )

    def release(self) -> list[CodedError]:
        """Give back the lease (the last one closes the handle: the DSP unloads the
        model) and let go of the arena; the failures. Idempotent. Call on the domain's
        loader lane, after every run of it has ended."""
        with self._lock:
            if self._released:
                return []
            self._released = True
        failures: list[CodedError] = []
        if self._registry.give_back(self._shared):
            failures += self._shared.value.close()
        self._release_arena(self.arena)
        return failures

    def forget(self) -> None:
        """Its domain's DSP process is gone (a restart): only the arena is let go."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._release_arena(self.arena)


def _quietly(step: Callable[[], object]) -> None:
    with contextlib.suppress(CodedError):
        step()
