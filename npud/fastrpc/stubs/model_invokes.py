"""portal_qnn's invokes on the wire: a run's invoke marshalled once, the invoke
arguments of encoded IDL values, and the shapes a run reports."""

from __future__ import annotations

import dataclasses

from npud import idl
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, OutArg, Slice
from npud.fastrpc.stubs.model_specs import GraphSpec
from npud.fastrpc.stubs.portal_limits import MAX_RANK, OUTPUT_DIMS_STRIDE


@dataclasses.dataclass(frozen=True)
class Marshalled:
    """A run's invoke, marshalled once: a graph's runs on the same arena slices have
    the same arguments every time (the slot, the graph, the two slices, the dims'
    capacity), so a decoder's steps pay the IDL's encoding once per graph, not once
    per step."""

    inputs: Slice
    outputs: Slice
    method: idl.Method
    sc: int
    in_args: tuple[InArg, ...]
    out_args: tuple[OutArg, ...]


def produced_shapes(values: idl.Values, spec: GraphSpec) -> tuple[tuple[int, ...], ...]:
    """The outputs' shapes in output_dims' (and run_dims') ``dims``: each output's rank,
    then its dimensions, 9 entries apiece."""
    dims = values.integers("dims")
    shapes = []
    for i in range(min(values.integer("num_outputs"), len(spec.outputs))):
        rank = min(dims[OUTPUT_DIMS_STRIDE * i], MAX_RANK)
        start = OUTPUT_DIMS_STRIDE * i + 1
        shapes.append(tuple(dims[start : start + rank]))
    return tuple(shapes)


def check_slice(data: object) -> None:
    if not isinstance(data, Slice):
        raise TypeError(f"tensor data must be a DMA-BUF Slice, not {type(data).__name__}")


def in_arg(item: bytes | idl.BufferRef) -> InArg:
    if isinstance(item, bytes):
        return Inline(item)
    assert isinstance(item, Slice)
    return item


def out_arg(item: int | idl.BufferRef) -> OutArg:
    if isinstance(item, int):
        return Capacity(item)
    assert isinstance(item, Slice)
    return item
