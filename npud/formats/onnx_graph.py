"""The main graph's declared inputs and outputs: read (:func:`graph_io`, bounded
by :data:`MAX_GRAPH_IO` tensors and :data:`MAX_DIMS` dimensions of one) and
rewritten with fixed input shapes (:func:`with_input_shapes`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Final

from npud.formats.onnx_scan import TENSOR_NAME
from npud.formats.onnx_source import Budget, LimitError, Source
from npud.formats.onnx_wire import (
    LENGTH,
    VARINT,
    Field,
    encode_varint,
    field_key,
    fields,
    length_field,
    shown_text,
)

MAX_GRAPH_IO: Final = 16_384
"""Inputs and outputs of the main graph that :func:`graph_io` keeps, at most (a model
for portal_qnn has at most 32 of each; old IR versions also list initializers)."""
MAX_DIMS: Final = 64
"""Dimensions of one input or output :func:`graph_io` keeps, at most (portal_qnn takes
rank 8)."""

# The main graph's inputs and outputs: ModelProto.graph (7), GraphProto.initializer (5),
# .input (11), .output (12); ValueInfoProto {1: name, 2: type}; TypeProto.tensor_type
# (1) {2: shape}; TensorShapeProto {1: dim}; Dimension {1: dim_value, 2: dim_param}.
MODEL_GRAPH: Final = 7
GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT = 5, 11, 12
VALUE_NAME, VALUE_TYPE = 1, 2
TYPE_TENSOR, TENSOR_TYPE_SHAPE, SHAPE_DIM = 1, 2, 1
DIM_VALUE, DIM_PARAM = 1, 2

Dim = int | str | None
"""A dimension: its size, the name of a symbolic one (dim_param), or None (unknown)."""

UNNAMED_DIMS: Final = frozenset({"", "?"})
"""dim_params that name nothing: each such dimension is free on its own (ONNX's rule;
exporters write ``?`` for a dimension they could not name)."""


def dim_name(dim: Dim) -> str | None:
    """The name that ties ``dim`` to every other dimension of that name, or None: a size,
    an unknown dimension, or a ``?`` / empty dim_param, which ties it to none."""
    return dim if isinstance(dim, str) and dim not in UNNAMED_DIMS else None


@dataclasses.dataclass(frozen=True)
class GraphTensor:
    """One input or output of the main graph, as the model declares it."""

    kind: str  # "input" or "output"
    name: str
    dims: tuple[Dim, ...] | None  # None: the model gives no shape (not a tensor, or unknown)


def graph_io(source: Source, budget: Budget | None = None) -> list[GraphTensor]:
    """The main graph's inputs (initializers listed as inputs left out: old IR versions
    list them) and outputs, in order. DamagedError when malformed; LimitError past
    :data:`MAX_GRAPH_IO` tensors or :data:`MAX_DIMS` dimensions of one;
    CheckTimeoutError when ``budget`` runs out. Two passes over the graph's fields: its
    inputs and outputs, then its initializers' names (none kept but those of inputs)."""
    graph = _only(source, Field(0, LENGTH, 0, source.size, source.size), MODEL_GRAPH, budget)
    if graph is None:
        return []
    found: list[GraphTensor] = []
    for field in fields(source, graph.start, graph.end, budget):
        if field.wire != LENGTH or field.number not in (GRAPH_INPUT, GRAPH_OUTPUT):
            continue
        if len(found) >= MAX_GRAPH_IO:
            raise LimitError(f"its graph has more than {MAX_GRAPH_IO} inputs and outputs")
        kind = "input" if field.number == GRAPH_INPUT else "output"
        found.append(_value_info(source, field, kind, budget))
    inputs = {t.name for t in found if t.kind == "input"}
    initialized: set[str] = set()
    if inputs:
        for field in fields(source, graph.start, graph.end, budget):
            if field.number != GRAPH_INITIALIZER or field.wire != LENGTH:
                continue
            for name in fields(source, field.start, field.end, budget):
                if name.number == TENSOR_NAME and name.wire == LENGTH:
                    text = shown_text(source, name)
                    if text in inputs:
                        initialized.add(text)
    return [t for t in found if t.kind == "output" or t.name not in initialized]


def _value_info(source: Source, field: Field, kind: str, budget: Budget | None) -> GraphTensor:
    name, dims = "", None
    for part in fields(source, field.start, field.end, budget):
        if part.wire != LENGTH:
            continue
        if part.number == VALUE_NAME:
            name = shown_text(source, part)
        elif part.number == VALUE_TYPE:
            dims = _tensor_dims(source, part, budget)
    if dims is not None and len(dims) > MAX_DIMS:
        raise LimitError(f"{kind} {name!r} has more than {MAX_DIMS} dimensions")
    return GraphTensor(kind, name, dims)


def _only(source: Source, field: Field, number: int, budget: Budget | None = None) -> Field | None:
    """The last length-delimited field ``number`` in ``field``'s message (protobuf's
    rule for a repeated singular field), or None."""
    chosen = None
    for part in fields(source, field.start, field.end, budget):
        if part.number == number and part.wire == LENGTH:
            chosen = part
    return chosen


def _tensor_dims(
    source: Source, type_field: Field, budget: Budget | None
) -> tuple[Dim, ...] | None:
    tensor = _only(source, type_field, TYPE_TENSOR, budget)
    shape = _only(source, tensor, TENSOR_TYPE_SHAPE, budget) if tensor is not None else None
    if shape is None:
        return None
    dims: list[Dim] = []
    for dim in fields(source, shape.start, shape.end, budget):
        if dim.number != SHAPE_DIM or dim.wire != LENGTH:
            continue
        if len(dims) > MAX_DIMS:
            break  # one more than the bound: the caller refuses it
        size: Dim = None
        for part in fields(source, dim.start, dim.end, budget):
            if part.number == DIM_VALUE and part.wire == VARINT:
                size = part.value if part.value < 1 << 63 else None  # int64: negative is unknown
            elif part.number == DIM_PARAM and part.wire == LENGTH:
                size = shown_text(source, part) or None
        dims.append(size)
    return tuple(dims)


def with_input_shapes(source: Source, shapes: Mapping[str, Sequence[int]]) -> bytes:
    """The model with the main graph's inputs named in ``shapes`` declared with exactly
    those dimensions (each a ``dim_value``; their element types and everything else kept,
    byte for byte), so that a runtime's shape inference starts from them. DamagedError
    when malformed."""
    out = bytearray()
    for field in fields(source, 0, source.size):
        if field.number == MODEL_GRAPH and field.wire == LENGTH:
            out += length_field(MODEL_GRAPH, _graph_with_shapes(source, field, shapes))
        else:
            out += source.read(field.head, field.end - field.head)
    return bytes(out)


def _graph_with_shapes(source: Source, graph: Field, shapes: Mapping[str, Sequence[int]]) -> bytes:
    out = bytearray()
    for field in fields(source, graph.start, graph.end):
        if field.number == GRAPH_INPUT and field.wire == LENGTH:
            name = _only_text(source, field, VALUE_NAME)
            if name is not None and name in shapes:
                out += length_field(GRAPH_INPUT, _value_with_shape(source, field, shapes[name]))
                continue
        out += source.read(field.head, field.end - field.head)
    return bytes(out)


def _only_text(source: Source, field: Field, number: int) -> str | None:
    chosen = _only(source, field, number)
    if chosen is None:
        return None
    return source.read(chosen.start, chosen.value).decode("utf-8", errors="replace")


def _value_with_shape(source: Source, value: Field, dims: Sequence[int]) -> bytes:
    """ValueInfoProto ``value`` with its TypeProto.tensor_type's shape replaced."""
    out = bytearray()
    for part in fields(source, value.start, value.end):
        if part.number == VALUE_TYPE and part.wire == LENGTH:
            typed = bytearray()
            for item in fields(source, part.start, part.end):
                if item.number == TYPE_TENSOR and item.wire == LENGTH:
                    tensor = bytearray()
                    for piece in fields(source, item.start, item.end):
                        if piece.number != TENSOR_TYPE_SHAPE:
                            tensor += source.read(piece.head, piece.end - piece.head)
                    shape = b"".join(
                        length_field(SHAPE_DIM, field_key(DIM_VALUE, VARINT) + encode_varint(d))
                        for d in dims
                    )
                    tensor += length_field(TENSOR_TYPE_SHAPE, shape)
                    typed += length_field(TYPE_TENSOR, bytes(tensor))
                else:
                    typed += source.read(item.head, item.end - item.head)
            out += length_field(VALUE_TYPE, bytes(typed))
        else:
            out += source.read(part.head, part.end - part.head)
    return bytes(out)
