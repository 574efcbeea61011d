"""The portal_qnn RPC methods marshalled by the qaic rules (idl/portal_qnn.idl), over real remote_args."""

from __future__ import annotations

import dataclasses
import struct
from typing import Final

from npud.idl.arena import ARENA_ALIGN
from tests.skel.remote_args import Out, Result, SkelLibrary, sc, u32s, unpack_u32s

MODEL_LOAD: Final = 2
SET_INPUT: Final = 3
EXECUTE: Final = 4
GET_OUTPUT: Final = 5
MODEL_UNLOAD: Final = 6
GRAPH_INFO: Final = 7
RUN: Final = 8
LAST_ERROR: Final = 9
GRAPH_NAME: Final = 10
OUTPUT_DIMS: Final = 11
RUN_DIMS: Final = 14
DIMS_STRIDE: Final = 9

TENSOR_SPEC: Final = struct.Struct("<II8II128s")
"""portal_qnn_tensor_spec: data_type, rank, dims[8], bytes, name[128] (172 bytes)."""

NO_MODEL: Final = 0xFFFFFFFF
UNTOUCHED_U32: Final = 0xA5A5A5A5
"""What a primROut slot reads when the skel did not write it (see remote_args.OUTPUT_FILL)."""


@dataclasses.dataclass(frozen=True)
class Loaded:
    rc: int
    model_index: int
    num_graphs: int
    qnn_status: int


@dataclasses.dataclass(frozen=True)
class Executed:
    rc: int
    qnn_status: int


@dataclasses.dataclass(frozen=True)
class Output:
    rc: int
    data_len: int
    data: bytes


@dataclasses.dataclass(frozen=True)
class Ran:
    rc: int
    qnn_status: int
    outputs: bytes


def arena(*tensors: bytes) -> bytes:
    """Tensors packed as run's arenas lay them out: each at a multiple of 64 bytes."""
    return b"".join(t + bytes(-len(t) % ARENA_ALIGN) for t in tensors)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    data_type: int
    dims: tuple[int, ...]
    size: int
    name: bytes


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    rc: int
    num_inputs: int
    num_outputs: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    raw: tuple[bytes, bytes]


def unpack_specs(data: bytes | None) -> tuple[TensorSpec, ...]:
    assert data is not None
    specs = []
    for offset in range(0, len(data), TENSOR_SPEC.size):
        data_type, rank, *rest = TENSOR_SPEC.unpack_from(data, offset)
        dims, size, name = rest[:8], rest[8], rest[9]
        specs.append(TensorSpec(data_type, tuple(dims[: min(rank, 8)]), size, name.rstrip(b"\0")))
    return tuple(specs)


class PortalQnn:
    """One open portal_qnn handle, driven through ``portal_qnn_skel_handle_invoke``."""

    def __init__(self, skel: SkelLibrary, handle: int) -> None:
        self.skel = skel
        self.handle = handle

    def invoke(self, scalars: int, slots: list[bytes | Out]) -> Result:
        return self.skel.invoke(self.handle, scalars, list(slots))

    def model_load(self, uri: str | bytes) -> Loaded:
        text = (uri.encode() if isinstance(uri, str) else uri) + b"\0"
        result = self.invoke(sc(MODEL_LOAD, 2, 1), [u32s(len(text)), text, Out(12)])
        index, graphs, status = unpack_u32s(result.buffers[2])
        return Loaded(result.rc, index, graphs, status)

    def set_input(self, model: int, graph: int, tensor: int, data: bytes) -> int:
        slots: list[bytes | Out] = [u32s(model, graph, tensor, len(data)), data]
        return self.invoke(sc(SET_INPUT, 2, 0), slots).rc

    def execute(self, model: int, graph: int) -> Executed:
        result = self.invoke(sc(EXECUTE, 1, 1), [u32s(model, graph), Out(4)])
        (status,) = unpack_u32s(result.buffers[1])
        return Executed(result.rc, status)

    def get_output(self, model: int, graph: int, tensor: int, capacity: int) -> Output:
        slots: list[bytes | Out] = [u32s(model, graph, tensor, capacity), Out(4), Out(capacity)]
        result = self.invoke(sc(GET_OUTPUT, 1, 2), slots)
        (data_len,) = unpack_u32s(result.buffers[1])
        data = result.buffers[2]
        assert data is not None
        return Output(result.rc, data_len, data)

    def run(self, model: int, graph: int, inputs: bytes, capacity: int) -> Ran:
        slots: list[bytes | Out] = [
            u32s(model, graph, len(inputs), capacity),
            inputs,
            Out(4),
            Out(capacity),
        ]
        result = self.invoke(sc(RUN, 2, 2), slots)
        (status,) = unpack_u32s(result.buffers[2])
        outputs = result.buffers[3]
        assert outputs is not None
        return Ran(result.rc, status, outputs)

    def last_error(self, model: int, capacity: int = 256) -> tuple[int, bytes]:
        """(rc, the text copied): text_len bytes of the text buffer, the rest checked zero."""
        result = self.invoke(sc(LAST_ERROR, 1, 2), [u32s(model, capacity), Out(4), Out(capacity)])
        if result.rc != 0:
            return result.rc, b""
        (length,) = unpack_u32s(result.buffers[1])
        text = result.buffers[2]
        assert text is not None
        assert length <= capacity
        assert text[length:] == bytes(capacity - length)
        return 0, text[:length]

    def graph_name(self, model: int, graph: int, capacity: int = 128) -> tuple[int, bytes]:
        """(rc, the name copied): name_len bytes of the name buffer, the rest checked zero."""
        result = self.invoke(
            sc(GRAPH_NAME, 1, 2), [u32s(model, graph, capacity), Out(4), Out(capacity)]
        )
        if result.rc != 0:
            return result.rc, b""
        (length,) = unpack_u32s(result.buffers[1])
        name = result.buffers[2]
        assert name is not None
        assert length <= capacity
        assert name[length:] == bytes(capacity - length)
        return 0, name[:length]

    def output_dims(self, model: int, graph: int, capacity: int = 18) -> tuple[int, int, list[int]]:
        """(rc, num_outputs, dims): capacity counts u32s."""
        result = self.invoke(
            sc(OUTPUT_DIMS, 1, 2), [u32s(model, graph, capacity), Out(4), Out(4 * capacity)]
        )
        if result.rc != 0:
            return result.rc, 0, []
        (count,) = unpack_u32s(result.buffers[1])
        return 0, count, list(unpack_u32s(result.buffers[2]))

    def run_dims(
        self, model: int, graph: int, inputs: bytes, capacity: int, dims: int = 18
    ) -> tuple[Ran, int, list[int]]:
        """(what run reports, num_outputs, dims): dims counts u32s."""
        slots: list[bytes | Out] = [
            u32s(model, graph, len(inputs), capacity, dims),
            inputs,
            Out(8),
            Out(capacity),
            Out(4 * dims),
        ]
        result = self.invoke(sc(RUN_DIMS, 2, 3), slots)
        status, count = unpack_u32s(result.buffers[2])
        outputs = result.buffers[3]
        assert outputs is not None
        shapes = list(unpack_u32s(result.buffers[4])) if result.rc == 0 else []
        return Ran(result.rc, status, outputs), count, shapes

    def model_unload(self, model: int) -> int:
        return self.invoke(sc(MODEL_UNLOAD, 1, 0), [u32s(model)]).rc

    def graph_info(self, model: int, graph: int, inputs: int = 32, outputs: int = 32) -> GraphInfo:
        """Capacities are in records; every spec the skel returned comes back (filled or not)."""
        slots: list[bytes | Out] = [
            u32s(model, graph, inputs, outputs),
            Out(8),
            Out(inputs * TENSOR_SPEC.size),
            Out(outputs * TENSOR_SPEC.size),
        ]
        result = self.invoke(sc(GRAPH_INFO, 1, 3), slots)
        num_inputs, num_outputs = unpack_u32s(result.buffers[1])
        raw_in, raw_out = result.buffers[2], result.buffers[3]
        assert raw_in is not None
        assert raw_out is not None
        return GraphInfo(
            result.rc,
            num_inputs,
            num_outputs,
            unpack_specs(raw_in),
            unpack_specs(raw_out),
            (raw_in, raw_out),
        )
