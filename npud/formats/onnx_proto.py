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

Every walk is linear in the file and bounded in memory, whatever its fields: fields
are parsed as they are read (:func:`fields` is a generator, never a list of a
message's fields), the walk keeps one frame per level of nesting (at most
:data:`MAX_DEPTH`), and what it keeps of a model (names, dimensions) is bounded
(:data:`MAX_GRAPH_IO`, :data:`MAX_DIMS`): past a bound it raises
:class:`LimitError`. A :class:`Budget` bounds its time: a walk given one raises
:class:`CheckTimeoutError` once the budget's deadline has passed.

Tags, lengths and values are read exactly as protobuf reads them (the ``upb``
parser of the ``protobuf`` package; tests/unit/test_onnx_differential.py compares
the two on random and crafted bytes): a tag is a varint of at most 5 bytes whose
value fits 32 bits (protobuf refuses a larger one, where onnxruntime's C++ parser
keeps its low 32 bits: a checker that read the tag whole would see another field
than the runtime), a length at most 5 bytes and below 2^31 - 1, a value at most 10
bytes (its low 64 bits). A field numbered 0 is refused, as the C++ parser does
(upb keeps it as an unknown field). Groups (wire types 3 and 4), which ONNX does not
use, are skipped as protobuf skips unknown ones.

:class:`FdSource` reads a file through its descriptor with ``pread`` in
windows (never ``mmap``: a client could truncate the file underneath and
fault the reader); :class:`BytesSource` reads bytes already in memory.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Final, NamedTuple, Protocol

WINDOW: Final = 64 * 1024
MAX_DEPTH: Final = 64
"""Messages (and groups) nested deeper than this are refused (protobuf's own parsers
stop at 100)."""
MAX_TAG_BYTES: Final = 5
MAX_LENGTH_BYTES: Final = 5
MAX_VARINT_BYTES: Final = 10
MAX_LENGTH: Final = (1 << 31) - 2
"""The longest length-delimited field protobuf reads (it refuses a size >= INT32_MAX)."""
_HEADER_BYTES: Final = MAX_TAG_BYTES + MAX_VARINT_BYTES
CHUNK: Final = 4096
"""Bytes a walk takes from its source at a time (FdSource serves them from its window:
one pread per WINDOW of the file read forward)."""
_U32: Final = 0xFFFFFFFF
_U64: Final = (1 << 64) - 1
CHECK_EVERY: Final = 4096
"""Fields between two looks at a budget's clock."""
MAX_GRAPH_IO: Final = 16_384
"""Inputs and outputs of the main graph that :func:`graph_io` keeps, at most (a model
for portal_qnn has at most 32 of each; old IR versions also list initializers)."""
MAX_DIMS: Final = 64
"""Dimensions of one input or output :func:`graph_io` keeps, at most (portal_qnn takes
rank 8)."""
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


class LimitError(ValueError):
    """The walk went past one of npud's bounds (time, or what it would keep); the model
    may be intact. The text says which bound."""


class CheckTimeoutError(LimitError):
    """The walk's :class:`Budget` ran out."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"checking it took longer than {seconds:g} s")
        self.seconds = seconds


class Budget:
    """The time one model's walks may take together: they raise CheckTimeoutError once
    ``seconds`` have passed since the budget was made (None: no bound). Looked at every
    :data:`CHECK_EVERY` fields, so a walk overruns by at most that many fields."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._deadline = None if seconds is None else time.monotonic() + seconds

    def check(self) -> None:
        if self._deadline is not None and time.monotonic() > self._deadline:
            assert self.seconds is not None
            raise CheckTimeoutError(self.seconds)


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


class Field(NamedTuple):
    """One field of a message: its number, wire type, and where its value lies."""

    number: int
    wire: int
    start: int  # the value's first byte (a length-delimited field's payload, a group's first)
    end: int  # one past its last byte (a group's: past its end-group tag)
    value: int  # a varint's value, a length-delimited field's length, else 0
    head: int = 0  # the field's first byte (its key)


class _Chunk:
    """Forward reads of [offset, end) of a source, :data:`CHUNK` bytes at a time."""

    __slots__ = ("base", "data", "end", "source")

    def __init__(self, source: Source, end: int) -> None:
        self.source = source
        self.end = end
        self.base = 0
        self.data = b""

    def at(self, offset: int) -> int:
        """Where ``offset`` is in :attr:`data`, read so that a whole field header (or the
        message's end) follows it there."""
        relative = offset - self.base
        if relative < 0 or (
            relative + _HEADER_BYTES > len(self.data) and self.base + len(self.data) < self.end
        ):
            self.base = offset
            self.data = self.source.read(offset, min(self.end - offset, CHUNK))
            relative = 0
        return relative

    def varint(self, offset: int, longest: int) -> tuple[int, int]:
        """The varint at ``offset`` of at most ``longest`` bytes: (value, offset after)."""
        at = self.at(offset)
        data = self.data
        value, shift, first = 0, 0, at
        stop = min(len(data), at + longest)
        while at < stop:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, self.base + at
            shift += 7
        if at - first == longest:
            raise DamagedError(f"a varint longer than {longest} bytes")
        raise DamagedError("a field ends inside its header")


def _varint(data: bytes, at: int, longest: int) -> tuple[int, int]:
    """The varint at ``data[at]`` of at most ``longest`` bytes: (value, index after)."""
    value, shift, stop = 0, 0, min(len(data), at + longest)
    first = at
    while at < stop:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    if at - first == longest:
        raise DamagedError(f"a varint longer than {longest} bytes")
    raise DamagedError("a field ends inside its header")


def fields(  # noqa: PLR0912, PLR0915 - one loop, inlined: a field per turn is a walk's cost
    source: Source, offset: int, end: int, budget: Budget | None = None
) -> Iterator[Field]:
    """The fields of the message in [offset, end), in order, parsed as they are read;
    DamagedError when malformed (after the fields before the damage), CheckTimeoutError
    when ``budget`` runs out. Reads :data:`CHUNK` bytes at a time, so that a whole
    field header is in hand before it is parsed."""
    base, data = offset, b""
    count = 0
    while offset < end:
        count += 1
        if count >= CHECK_EVERY:
            count = 0
            if budget is not None:
                budget.check()
        at = offset - base
        if at + _HEADER_BYTES > len(data) and base + len(data) < end:
            base, data, at = offset, source.read(offset, min(end - offset, CHUNK)), 0
        if at >= len(data):
            raise DamagedError("a field ends inside its header")  # the file shrank
        key = data[at]
        if key < 0x80:
            at += 1
        else:
            key, at = _varint(data, at, MAX_TAG_BYTES)
            if key > _U32:
                raise DamagedError("a field tag over 32 bits (protobuf refuses it)")
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DamagedError("a field numbered 0")
        if wire == LENGTH:
            value = data[at] if at < len(data) else 0x80
            if value < 0x80:
                at += 1
            else:
                value, at = _varint(data, at, MAX_LENGTH_BYTES)
                if value > MAX_LENGTH:
                    raise DamagedError(f"field {number} of {value} bytes (protobuf reads < 2 GiB)")
            start = base + at
            after = start + value
        elif wire == VARINT:
            start = base + at
            value, at = _varint(data, at, MAX_VARINT_BYTES)
            value &= _U64
            after = base + at
        elif wire in (FIXED64, FIXED32):
            start = base + at
            value, after = 0, start + (8 if wire == FIXED64 else 4)
        elif wire == GROUP_START:
            start = base + at
            value, after = 0, _skip_group(_Chunk(source, end), number, start, end, budget)
        elif wire == GROUP_END:
            raise DamagedError(f"an end-group tag (field {number}) outside a group")
        else:
            raise DamagedError(f"wire type {wire}")
        if after > end:
            raise DamagedError(f"field {number} runs {after - end} bytes past its message")
        yield Field(number, wire, start, after, value, offset)
        offset = after


def _skip_group(chunk: _Chunk, number: int, offset: int, end: int, budget: Budget | None) -> int:
    """Past the end-group tag that closes group ``number`` opened before ``offset`` (its
    fields skipped, nested groups too, as protobuf skips an unknown group)."""
    open_groups = [number]
    count = 0
    while offset < end:
        count += 1
        if count >= CHECK_EVERY:
            count = 0
            if budget is not None:
                budget.check()
        key, offset = chunk.varint(offset, MAX_TAG_BYTES)
        if key > _U32:
            raise DamagedError("a field tag over 32 bits (protobuf refuses it)")
        inner, wire = key >> 3, key & 7
        if inner == 0:
            raise DamagedError("a field numbered 0")
        if wire == GROUP_START:
            if len(open_groups) >= MAX_DEPTH:
                raise DamagedError(f"groups nest deeper than {MAX_DEPTH}")
            open_groups.append(inner)
        elif wire == GROUP_END:
            if open_groups.pop() != inner:
                raise DamagedError(f"group {number} closed by an end-group tag of field {inner}")
            if not open_groups:
                return offset
        else:
            offset = _skip_value(chunk, inner, wire, offset)
    raise DamagedError(f"group {number} has no end")


def _skip_value(chunk: _Chunk, number: int, wire: int, offset: int) -> int:
    """Past the value of field ``number`` of wire type ``wire`` (not a group's)."""
    if wire == VARINT:
        return chunk.varint(offset, MAX_VARINT_BYTES)[1]
    if wire == LENGTH:
        length, offset = chunk.varint(offset, MAX_LENGTH_BYTES)
        if length > MAX_LENGTH:
            raise DamagedError(f"field {number} of {length} bytes (protobuf reads < 2 GiB)")
        return offset + length
    if wire in (FIXED64, FIXED32):
        return offset + (8 if wire == FIXED64 else 4)
    raise DamagedError(f"wire type {wire}")


def _text(source: Source, field: Field) -> str:
    shown = source.read(field.start, min(field.value, MAX_SHOWN))
    text = shown.decode("utf-8", errors="replace")
    return text + "..." if field.value > MAX_SHOWN else text


def _tensor(
    source: Source, start: int, end: int, place: str, budget: Budget | None
) -> ExternalData | None:
    name, location, external = "", "", False
    for field in fields(source, start, end, budget):
        if field.number == TENSOR_NAME and field.wire == LENGTH:
            name = _text(source, field)
        elif field.number == TENSOR_DATA_LOCATION and field.wire == VARINT:
            external = external or field.value != 0
        elif field.number == TENSOR_EXTERNAL_DATA and field.wire == LENGTH:
            external = True
            key = value = None
            for entry in fields(source, field.start, field.end, budget):
                if entry.wire == LENGTH and entry.number == ENTRY_KEY:
                    key = entry  # protobuf keeps the last of a singular field
                elif entry.wire == LENGTH and entry.number == ENTRY_VALUE:
                    value = entry
            if key and value and source.read(key.start, key.value) == b"location":
                location = _text(source, value)
    return ExternalData(place, name, location) if external else None


@dataclasses.dataclass(frozen=True)
class LoopingNode:
    """A node that repeats its body until a value computed at run time says stop."""

    op_type: str
    name: str  # may be empty

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})" if self.name else f"a {self.op_type} node"


@dataclasses.dataclass(frozen=True)
class Findings:
    """What a walk found that npud refuses: the first tensor that refers to external data
    and the first looping node, in the order of the file (None: there is none)."""

    external: ExternalData | None = None
    looping: LoopingNode | None = None


_NODE_TEXT: Final = {NODE_OP_TYPE: "op_type", NODE_NAME: "name", NODE_DOMAIN: "domain"}


class _Frame:
    """A message being walked: its type, how its parent calls it, its fields still to
    come, and a node's op_type, name and domain so far."""

    __slots__ = ("domain", "fields", "message", "name", "op_type", "place")

    def __init__(self, message: str, place: str, remaining: Iterator[Field]) -> None:
        self.message = message
        self.place = place
        self.fields = remaining
        self.op_type = self.name = self.domain = ""


def scan(
    source: Source,
    start: int = 0,
    end: int | None = None,
    root: str = "ModelProto",
    budget: Budget | None = None,
) -> Findings:
    """One walk of the ``root`` message (a ModelProto, or e.g. a GraphProto) in
    [start, end): every tensor and node of every graph, subgraph, function and training
    graph, depth first in the order of the file (so a file is read forward, once). It
    keeps one frame per level of nesting. DamagedError when the bytes are not a
    well-formed message or nest deeper than MAX_DEPTH; CheckTimeoutError when ``budget``
    runs out."""
    if root not in TENSOR_PATHS:
        raise ValueError(f"{root} holds no tensor")
    stop = source.size if end is None else end
    place = "model" if root == "ModelProto" else "graph"
    stack = [_Frame(root, place, fields(source, start, stop, budget))]
    external: ExternalData | None = None
    looping: LoopingNode | None = None
    while stack:
        frame = stack[-1]
        paths = TENSOR_PATHS[frame.message]
        node = frame.message == "NodeProto"
        for field in frame.fields:
            if field.wire != LENGTH:
                continue
            if node and field.number in _NODE_TEXT:
                # protobuf keeps the last of a singular field
                setattr(frame, _NODE_TEXT[field.number], _text(source, field))
                continue
            child = paths.get(field.number)
            if child is None:
                continue
            if child[0] == "TensorProto":
                found = _tensor(source, field.start, field.end, child[1], budget)
                external = external or found
                continue
            if len(stack) >= MAX_DEPTH:
                raise DamagedError(f"messages nest deeper than {MAX_DEPTH}")
            stack.append(_Frame(child[0], child[1], fields(source, field.start, field.end, budget)))
            break
        else:
            stack.pop()
            if node and frame.op_type in LOOPING_OPS and frame.domain in ("", "ai.onnx"):
                looping = looping or LoopingNode(frame.op_type, frame.name)
    return Findings(external, looping)


def find_external_data(
    source: Source,
    start: int = 0,
    end: int | None = None,
    root: str = "ModelProto",
    budget: Budget | None = None,
) -> ExternalData | None:
    """The first tensor of the ModelProto (or the ``root`` message, e.g. a GraphProto) in
    [start, end) that refers to external data (:func:`scan`).

    None when the model is self-contained. DamagedError when the bytes are not
    a well-formed message or nest deeper than MAX_DEPTH.
    """
    return scan(source, start, end, root, budget).external


def find_looping_node(
    source: Source, start: int = 0, end: int | None = None, budget: Budget | None = None
) -> LoopingNode | None:
    """The first node of the ModelProto in [start, end), in any graph, subgraph or
    function, whose op is one of :data:`LOOPING_OPS` of the default domain (:func:`scan`).
    None when there is none; DamagedError as :func:`find_external_data`."""
    return scan(source, start, end, budget=budget).looping


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
                    text = _text(source, name)
                    if text in inputs:
                        initialized.add(text)
    return [t for t in found if t.kind == "output" or t.name not in initialized]


def _value_info(source: Source, field: Field, kind: str, budget: Budget | None) -> GraphTensor:
    name, dims = "", None
    for part in fields(source, field.start, field.end, budget):
        if part.wire != LENGTH:
            continue
        if part.number == VALUE_NAME:
            name = _text(source, part)
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
