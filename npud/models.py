"""Models as resources of a connection: what a loaded model is and owns.

A client's model (:class:`NpuModel`) is one open handle of the portal_qnn
skel with the model in its slot, plus one DMA-BUF, the model's **arena**,
allocated at load and owned by the model: every input tensor, then (from a
page boundary) every output tensor, each at a multiple of 64 bytes
(:func:`npud.fastrpc.portal_qnn.arena_layout`). The arena's fd goes to the
client in the load reply; a run is then one invoke of portal_qnn's ``run``
on two slices of the arena, so nothing but the fixed-size request and reply
crosses the socket (PROTOCOL.md section 7.9).

One handle per model keeps ownership simple (closing the handle unloads the
model on the DSP, whatever state it is in) and leaves the skel's 4-slot
table out of the client's sight: the quotas are npud's (``max_models``,
``max_model_bytes``).

The requests that load, describe, run and unload a model are handlers in
:mod:`npud.requests` (LoadModel, ModelInfo, RunModel, UnloadModel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import Final

import msgspec

import npu_protocol as p
from npu_protocol import CodedError
from npud.fastrpc.dma import SessionBuffer
from npud.fastrpc.invoke_args import Slice
from npud.fastrpc.portal_qnn import (
    Backend,
    DataType,
    GraphSpec,
    LoadedModel,
    PortalQnn,
    TensorSpec,
    arena_layout,
)
from npud.fastrpc.session import FastRpcSession

PAGE: Final = 4096


@dataclasses.dataclass(frozen=True)
class ArenaLayout:
    """Where a graph's tensors live in the model's arena."""

    input_offsets: tuple[int, ...]
    input_bytes: int
    output_base: int
    output_offsets: tuple[int, ...]
    output_bytes: int

    @classmethod
    def of(cls, graph: GraphSpec) -> ArenaLayout:
        inputs, input_bytes = arena_layout(graph.inputs)
        outputs, output_bytes = arena_layout(graph.outputs)
        return cls(inputs, input_bytes, _pages(input_bytes), outputs, output_bytes)

    @property
    def size(self) -> int:
        """Bytes of the arena: whole pages."""
        return _pages(self.output_base + self.output_bytes)


def _pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


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


class NpuModel:
    """One client's loaded model: its portal_qnn handle and its arena, released once."""

    def __init__(
        self,
        session: FastRpcSession,
        portal: PortalQnn,
        loaded: LoadedModel,
        arena: SessionBuffer,
        layout: ArenaLayout,
        name: str,
    ) -> None:
        self.session = session
        self._portal = portal
        self._slot = loaded.slot
        self.arena = arena
        graph = loaded.graphs[0]
        self._inputs = Slice(arena, 0, layout.input_bytes)
        self._outputs = Slice(arena, layout.output_base, layout.output_bytes)
        self.bytes = loaded.file.size + arena.size
        """What the model counts against ``max_model_bytes``."""
        self.name = name
        self._info = p.ModelInfo(
            name=name,
            description=loaded.file.description[:1024],
            file_bytes=loaded.file.size,
            arena_bytes=arena.size,
            inputs=tuple(
                _tensor(s, o) for s, o in zip(graph.inputs, layout.input_offsets, strict=True)
            ),
            outputs=tuple(
                _tensor(s, layout.output_base + o)
                for s, o in zip(graph.outputs, layout.output_offsets, strict=True)
            ),
        )
        self._lock = threading.Lock()
        self.runs = 0
        self.dsp_seconds = 0.0
        self._released = False

    @classmethod
    def load(
        cls,
        session: FastRpcSession,
        backend: Backend,
        fd: int,
        *,
        name: str,
        shapes: dict[str, tuple[int, ...]],
    ) -> NpuModel:
        """Open portal_qnn, load the model open on ``fd`` (the caller keeps it), allocate
        its arena. On any failure what was made is released again before raising."""
        portal = PortalQnn.open(session, backend=backend)
        try:
            loaded = portal.load(fd, shapes=shapes)
            layout = ArenaLayout.of(loaded.graphs[0])
            arena = session.alloc(layout.size)
        except BaseException:
            _quietly(portal.close)
            raise
        return cls(session, portal, loaded, arena, layout, name)

    @property
    def info(self) -> p.ModelInfo:
        """What the load reply and model_info tell the client, with the runs so far."""
        return msgspec.structs.replace(self._info, runs=self.runs)

    def run(self) -> None:
        """One run: the inputs in the arena in, the outputs into it (one invoke)."""
        self._portal.run_arena(self._slot, self._inputs, self._outputs)

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
        """Close the handle (the DSP unloads the model) and free the arena; the failures.
        Idempotent. Call on the session's thread of choice, after every run has ended."""
        with self._lock:
            if self._released:
                return []
            self._released = True
        failures = []
        for step in (self._portal.close, lambda: self.session.free(self.arena)):
            try:
                step()
            except CodedError as exc:
                failures.append(exc)
        return failures


def _quietly(step: Callable[[], object]) -> None:
    with contextlib.suppress(CodedError):
        step()


def release_models(models: list[NpuModel]) -> list[CodedError]:
    """Release each of ``models``; the failures."""
    return [failure for model in models for failure in model.release()]
