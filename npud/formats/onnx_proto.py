"""An ONNX model's protobuf, walked for what it would make a runtime open.

An ONNX tensor may keep its bytes outside the model: ``data_location =
EXTERNAL`` and an ``external_data`` entry ``location`` that names a file.
onnxruntime resolves a relative location against the directory of the model
file, or, for a model given as bytes (as the emulated DSP gives it), against
the process's working directory; so a model naming ``etc/shadow`` would make
the DSP read a file its client cannot. npud loads only self-contained
models: :func:`find_external_data` says where a model refers to external
data, without resolving, opening or even decoding any path. Nor does it load a
model that may loop without end: :func:`find_looping_node` finds a ``Loop``.

The walk visits every message of the schema that can hold a tensor (the
graph and its subgraphs in node attributes, initializers, sparse
initializers, Constant-style attribute tensors, model-local functions,
training graphs) and skips everything else by its length, so large weights
(``raw_data``) are never read. Fields with an unexpected wire type are
skipped, as protobuf parsers keep them as unknown fields. The walk is
iterative and bounded in depth, so a hostile file cannot exhaust the stack.

:class:`FdSource` reads a file through its descriptor with ``pread`` in
windows (never ``mmap``: a client could truncate the file underneath and
fault the reader); :class:`BytesSource` reads bytes already in memory.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Final, Protocol

WINDOW: Final = 64 * 1024
MAX_DEPTH: Final = 64
"""Messages nested deeper than this are refused (protobuf's own parsers stop at 100)."""
MAX_SHOWN: Final = 128
"""Bytes of a tensor name or location quoted in a message, at most."""

VARINT, FIXED64, LENGTH, GROUP_START, GROUP_END, FIXED32 = 0, 1, 2, 3, 4, 5

# The messages that can hold a TensorProto, and for each the fields that lead
# to one: field number -> (child message, how a message calls that place).
# tests/unit/test_onnx_proto.py derives this closure from onnx's own
# descriptors, so a field added to the schema cannot be missed silently.
TENSOR_PATHS: Final[dict[str, dict[int, tuple[str, str]]]] = {
    "ModelProto": {
        7: ("GraphProto", "graph"),
        20: ("TrainingInfoProto", "training info"),
        25: ("FunctionProto", "function"),
    },
    "GraphProto": {
        1: ("NodeProto", "node"),
        5: ("TensorProto", "initializer"),
        15: ("SparseTensorProto", "sparse initializer"),
    },
    "NodeProto": {5: ("AttributeProto", "attribute")},
    "AttributeProto": {
        5: ("TensorProto", "attribute tensor"),
        6: ("GraphProto", "subgraph"),
        10: ("TensorProto", "attribute tensor"),
        11: ("GraphProto", "subgraph"),
        22: ("SparseTensorProto", "sparse attribute tensor"),
        23: ("SparseTensorProto", "sparse attribute tensor"),
    },
    "TrainingInfoProto": {
        1: ("GraphProto", "initialization graph"),
        2: ("GraphProto", "algorithm graph"),
    },
    "FunctionProto": {
        7: ("NodeProto", "node"),
        11: ("AttributeProto", "attribute"),
    },
    "SparseTensorProto": {
        1: ("TensorProto", "sparse values"),
        2: ("TensorProto", "sparse indices"),
    },
}

# TensorProto's fields that matter here.
TENSOR_NAME: Final = 8
TENSOR_EXTERNAL_DATA: Final = 13  # repeated StringStringEntryProto {1: key, 2: value}
TENSOR_DATA_LOCATION: Final = 14  # enum: 0 DEFAULT, 1 EXTERNAL

# NodeProto's fields that matter here.
NODE_NAME: Final = 3
NODE_OP_TYPE: Final = 4
NODE_DOMAIN: Final = 7

LOOPING_OPS: Final = frozenset({"Loop"})
"""Ops whose trip count a model may compute at run time: nothing bounds a run of them
(Scan's trip count is its input's length, If runs one branch once). The HTP runs no
control flow; the emulator refuses them for what they would do to its DSP time."""
ENTRY_KEY, ENTRY_VALUE = 1, 2


class DamagedError(ValueError):
    """The bytes are not a well-formed protobuf message (the text says where)."""


class Source(Protocol):
    """Random access to a model's bytes."""

    @property
    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at the end)."""
        ...


class BytesSource:
    """A model already in memory."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._data = memoryview(data).cast("B")

    @property
    def size(self) -> int:
        return len(self._data)

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self._data[offset : offset + length])


class Window:
    """``length`` bytes of another source from ``offset`` on, as a source of their own
    (one member of a graph pack, npud.formats.graph_pack)."""

    def __init__(self, source: Source, offset: int, length: int) -> None:
        self._source = source
        self._offset = offset
        self._size = length

    @property
    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self._size - offset))
        return self._source.read(self._offset + offset, length)


class FdSource:
    """A file read through ``fd`` (borrowed: the caller owns and closes it) in windows."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._size = size
        self._start = 0
        self._window = b""

    @property
    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        end = offset + length
        if not (self._start <= offset and end <= self._start + len(self._window)):
            if length > WINDOW:
                return os.pread(self._fd, length, offset)
            self._start, self._window = offset, os.pread(self._fd, WINDOW, offset)
        return self._window[offset - self._start : end - self._start]


@dataclasses.dataclass(frozen=True)
class ExternalData:
    """A tensor that keeps its bytes in a file: where it sits and the location it names."""

    place: str  # e.g. "initializer", "attribute tensor"
    tensor: str  # the tensor's name, may be empty
    location: str  # the path it names, may be empty; never resolved

    def describe(self) -> str:
        what = f"{self.place} {self.tensor!r}" if self.tensor else f"an unnamed {self.place}"
        if self.location:
            return f"{what} names the external file {self.location!r}"
        return f"{what} keeps its data in an external file"


def _varint(source: Source, offset: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    for index in range(10):
        if offset + index >= end:
            raise DamagedError("a field ends inside its header")
        byte = source.read(offset + index, 1)[0]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, offset + index + 1
    raise DamagedError("a varint longer than 10 bytes")


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of a message: its number, wire type, and where its value lies."""

    number: int
    wire: int
    start: int  # the value's first byte (a length-delimited field's payload)
    end: int  # one past its last byte
    value: int  # a varint's value, a length-delimited field's length, else 0
    head: int = 0  # the field's first byte (its key)


def fields(source: Source, offset: int, end: int) -> list[Field]:
    """The fields of the message in [offset, end), in order; DamagedError when malformed."""
    found: list[Field] = []
    while offset < end:
        head = offset
        key, offset = _varint(source, offset, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DamagedError("a field numbered 0")
        if wire == VARINT:
            value, after = _varint(source, offset, end)
        elif wire == LENGTH:
            value, start = _varint(source, offset, end)
            after = start + value
            offset = start
        elif wire in (FIXED64, FIXED32):
            value, after = 0, offset + (8 if wire == FIXED64 else 4)
        else:
            raise DamagedError(f"wire type {wire} (groups are not part of ONNX)")
        if after > end:
            raise DamagedError(f"field {number} runs {after - end} bytes past its message")
        found.append(Field(number, wire, offset, after, value, head))
        offset = after
    return found


def _text(source: Source, field: Field) -> str:
    shown = source.read(field.start, min(field.value, MAX_SHOWN))
    text = shown.decode("utf-8", errors="replace")
    return text + "..." if field.value > MAX_SHOWN else text


def _tensor(source: Source, start: int, end: int, place: str) -> ExternalData | None:
    name, location, external = "", "", False
    for field in fields(source, start, end):
        if field.number == TENSOR_NAME and field.wire == LENGTH:
            name = _text(source, field)
        elif field.number == TENSOR_DATA_LOCATION and field.wire == VARINT:
            external = external or field.value != 0
        elif field.number == TENSOR_EXTERNAL_DATA and field.wire == LENGTH:
            external = True
            entry = {
                f.number: f for f in fields(source, field.start, field.end) if f.wire == LENGTH
            }
            key = entry.get(ENTRY_KEY)
            if key and source.read(key.start, key.value) == b"location" and ENTRY_VALUE in entry:
                location = _text(source, entry[ENTRY_VALUE])
    return ExternalData(place, name, location) if external else None


def _messages(
    source: Source, start: int = 0, end: int | None = None, root: str = "ModelProto"
) -> Iterator[tuple[str, int, int, str]]:
    """Every message of the ``root`` message (a ModelProto) in [start, end) that is or
    leads to a tensor or a node: (its type, where it starts and ends, how its parent
    calls it). DamagedError when the bytes are not a well-formed message or nest deeper
    than MAX_DEPTH."""
    place = "model" if root == "ModelProto" else "graph"
    pending = [(root, start, source.size if end is None else end, 0, place)]
    while pending:
        message, offset, stop, depth, place = pending.pop()
        yield message, offset, stop, place
        if message == "TensorProto":
            continue
        if depth >= MAX_DEPTH:
            raise DamagedError(f"messages nest deeper than {MAX_DEPTH}")
        paths = TENSOR_PATHS[message]
        for field in fields(source, offset, stop):
            child = paths.get(field.number)
            if child is not None and field.wire == LENGTH:
                pending.append((child[0], field.start, field.end, depth + 1, child[1]))


def find_external_data(
    source: Source, start: int = 0, end: int | None = None, root: str = "ModelProto"
) -> ExternalData | None:
    """The first tensor of the ModelProto (or the ``root`` message, e.g. a GraphProto) in
    [start, end) that refers to external data.

    None when the model is self-contained. DamagedError when the bytes are not
    a well-formed message or nest deeper than MAX_DEPTH.
    """
    if root not in TENSOR_PATHS:
        raise ValueError(f"{root} holds no tensor")
    for message, offset, stop, place in _messages(source, start, end, root):
        if message == "TensorProto":
            found = _tensor(source, offset, stop, place)
            if found is not None:
                return found
    return None


@dataclasses.dataclass(frozen=True)
class LoopingNode:
    """A node that repeats its body until a value computed at run time says stop."""

    op_type: str
    name: str  # may be empty

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})" if self.name else f"a {self.op_type} node"


def find_looping_node(source: Source, start: int = 0, end: int | None = None) -> LoopingNode | None:
    """The first node of the ModelProto in [start, end), in any graph, subgraph or
    function, whose op is one of :data:`LOOPING_OPS` of the default domain. None when
    there is none; DamagedError as :func:`find_external_data`."""
    for message, offset, stop, _ in _messages(source, start, end):
        if message != "NodeProto":
            continue
        op_type = name = domain = ""
        for field in fields(source, offset, stop):
            if field.wire != LENGTH:
                continue
            if field.number == NODE_OP_TYPE:
                op_type = _text(source, field)
            elif field.number == NODE_NAME:
                name = _text(source, field)
            elif field.number == NODE_DOMAIN:
                domain = _text(source, field)
        if op_type in LOOPING_OPS and domain in ("", "ai.onnx"):
            return LoopingNode(op_type, name)
    return None


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


def graph_io(source: Source) -> list[GraphTensor]:
    """The main graph's inputs (initializers listed as inputs left out: old IR versions
    list them) and outputs, in order. DamagedError when malformed."""
    graphs = [f for f in fields(source, 0, source.size) if f.number == MODEL_GRAPH]
    if not graphs or graphs[-1].wire != LENGTH:
        return []
    graph = fields(source, graphs[-1].start, graphs[-1].end)
    initializers = {
        _text(source, name)
        for f in graph
        if f.number == GRAPH_INITIALIZER and f.wire == LENGTH
        for name in fields(source, f.start, f.end)
        if name.number == TENSOR_NAME and name.wire == LENGTH
    }
    found: list[GraphTensor] = []
    for field in graph:
        if field.wire != LENGTH or field.number not in (GRAPH_INPUT, GRAPH_OUTPUT):
            continue
        tensor = _value_info(source, field, "input" if field.number == GRAPH_INPUT else "output")
        if tensor.kind == "output" or tensor.name not in initializers:
            found.append(tensor)
    return found


def _value_info(source: Source, field: Field, kind: str) -> GraphTensor:
    name, dims = "", None
    for part in fields(source, field.start, field.end):
        if part.wire != LENGTH:
            continue
        if part.number == VALUE_NAME:
            name = _text(source, part)
        elif part.number == VALUE_TYPE:
            dims = _tensor_dims(source, part)
    return GraphTensor(kind, name, dims)


def _only(source: Source, field: Field, number: int) -> Field | None:
    """The last length-delimited field ``number`` in ``field``'s message (protobuf's
    rule for a repeated singular field), or None."""
    chosen = None
    for part in fields(source, field.start, field.end):
        if part.number == number and part.wire == LENGTH:
            chosen = part
    return chosen


def _tensor_dims(source: Source, type_field: Field) -> tuple[Dim, ...] | None:
    tensor = _only(source, type_field, TYPE_TENSOR)
    shape = _only(source, tensor, TENSOR_TYPE_SHAPE) if tensor is not None else None
    if shape is None:
        return None
    dims: list[Dim] = []
    for dim in fields(source, shape.start, shape.end):
        if dim.number != SHAPE_DIM or dim.wire != LENGTH:
            continue
        size: Dim = None
        for part in fields(source, dim.start, dim.end):
            if part.number == DIM_VALUE and part.wire == VARINT:
                size = part.value if part.value < 1 << 63 else None  # int64: negative is unknown
            elif part.number == DIM_PARAM and part.wire == LENGTH:
                size = _text(source, part) or None
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
                        length_field(SHAPE_DIM, _key(DIM_VALUE, VARINT) + _encode_varint(d))
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


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def length_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field ``number`` holding ``payload``, encoded."""
    return _key(number, LENGTH) + _encode_varint(len(payload)) + payload


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
