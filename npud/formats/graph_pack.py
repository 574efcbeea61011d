"""A graph pack: several ONNX graphs of one model in one file, with weights stored once.

A QNN context binary holds several graphs of one model that share their
weights (an LLM's prefill and decode graphs). The emulator's DSP loads ONNX,
which has one graph per file; a graph pack is npud's container for the
emulator that holds up to :data:`MAX_GRAPHS` of them. Layout, little-endian::

    magic           8 bytes   b"NPUGRAPH"
    version         u32       1
    graph_count     u32       1..MAX_GRAPHS (a file with more is refused at load)
    shared_length   u64
    shared          shared_length bytes: a serialized ONNX GraphProto holding only
                    initializers (field 5): the weights every graph may use
    graph_count times:
      name_length   u32       1..MAX_NAME_BYTES - 1
      name          UTF-8, no NUL, unique in the pack
      model_length  u64
      model         an ONNX ModelProto: the graph, without the shared weights

and nothing after the last graph. A graph uses a shared weight by naming it
(a node input or an initializer-less graph input of that name). Loading graph
``i`` gives the runtime :func:`member_model`: graph ``i``'s ModelProto with the
shared GraphProto appended as a second ``graph`` field, which protobuf merges
into the first (repeated fields concatenate), so every graph sees the
weights. They are stored once in the file; the emulated DSP's onnxruntime
sessions each hold their own copy in memory (on the device, a context
binary's graphs share one copy).

:func:`write_pack` builds one (tests and tools); :func:`read_pack` walks one
through a :class:`~npud.formats.onnx_proto.Source`, reading only the
headers and names.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Final

from npud.formats import onnx_proto

MAGIC: Final = b"NPUGRAPH"
VERSION: Final = 1
MAX_GRAPHS: Final = 8
"""portal_qnn's graphs per model (idl/portal_qnn.idl)."""
MAX_NAME_BYTES: Final = 128  # with the NUL, as the DSP's names
MODEL_GRAPH: Final = 7  # ModelProto.graph
GRAPH_INITIALIZER: Final = 5  # GraphProto.initializer
_HEADER: Final = struct.Struct("<8sIIQ")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")


class PackError(ValueError):
    """A damaged or unloadable graph pack; ``too_many`` when it holds more graphs than a
    model may (intact, but outside portal_qnn's limits)."""

    def __init__(self, message: str, *, too_many: bool = False) -> None:
        super().__init__(message)
        self.too_many = too_many


@dataclasses.dataclass(frozen=True)
class PackedGraph:
    name: str
    offset: int
    """Where its ModelProto starts in the file."""
    length: int


@dataclasses.dataclass(frozen=True)
class GraphPack:
    shared_offset: int
    shared_length: int
    graphs: tuple[PackedGraph, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(graph.name for graph in self.graphs)


def is_pack(head: bytes) -> bool:
    return head.startswith(MAGIC)


def read_pack(source: onnx_proto.Source, budget: onnx_proto.Budget | None = None) -> GraphPack:
    """The pack's layout; PackError when it is not a well-formed one (CheckTimeoutError
    when ``budget`` runs out while the shared weights' fields are walked)."""
    count, shared_length = _read_header(source)
    offset = _HEADER.size
    if offset + shared_length > source.size:
        raise PackError("the file ends inside the shared weights")
    try:
        for field in onnx_proto.fields(source, offset, offset + shared_length, budget):
            if field.number != GRAPH_INITIALIZER or field.wire != onnx_proto.LENGTH:
                raise PackError(f"the shared weights hold field {field.number}, not initializers")
    except onnx_proto.DamagedError as exc:
        raise PackError(f"the shared weights are damaged: {exc}") from None
    offset += shared_length
    graphs: list[PackedGraph] = []
    for _ in range(count):
        graph = _read_graph(source, offset, {g.name for g in graphs})
        graphs.append(graph)
        offset = graph.offset + graph.length
    if offset != source.size:
        raise PackError(f"{source.size - offset} bytes follow the last graph")
    return GraphPack(_HEADER.size, shared_length, tuple(graphs))


def _read_header(source: onnx_proto.Source) -> tuple[int, int]:
    """(graph_count, shared_length) of the header."""
    header = source.read(0, _HEADER.size)
    if len(header) < _HEADER.size:
        raise PackError("the file ends inside the graph pack's header")
    magic, version, count, shared_length = _HEADER.unpack(header)
    if magic != MAGIC:
        raise PackError("not a graph pack")
    if version != VERSION:
        raise PackError(f"graph pack version {version}; this npud reads version {VERSION}")
    if count == 0:
        raise PackError("the graph pack holds no graph")
    if count > MAX_GRAPHS:
        raise PackError(f"holds {count} graphs; a model has at most {MAX_GRAPHS}", too_many=True)
    return count, shared_length


def _read_graph(source: onnx_proto.Source, offset: int, taken: set[str]) -> PackedGraph:
    """The graph whose entry starts at ``offset``; ``taken`` are the names before it."""
    name_length = _read_int(source, offset, _U32, "a graph's name length")
    offset += _U32.size
    if not 0 < name_length < MAX_NAME_BYTES:
        raise PackError(f"a graph name of {name_length} bytes (1..{MAX_NAME_BYTES - 1})")
    raw = source.read(offset, name_length)
    if len(raw) < name_length:
        raise PackError("the file ends inside a graph's name")
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PackError("a graph name is not UTF-8") from None
    if "\0" in name or name in taken:
        raise PackError(f"graph name {name!r} holds a NUL or is given twice")
    offset += name_length
    length = _read_int(source, offset, _U64, f"the length of graph {name!r}")
    offset += _U64.size
    if offset + length > source.size:
        raise PackError(f"the file ends inside graph {name!r}")
    return PackedGraph(name, offset, length)


def _read_int(source: onnx_proto.Source, offset: int, form: struct.Struct, what: str) -> int:
    raw = source.read(offset, form.size)
    if len(raw) < form.size:
        raise PackError(f"the file ends inside {what}")
    value: int = form.unpack(raw)[0]
    return value


def member_model(source: onnx_proto.Source, pack: GraphPack, index: int) -> bytes:
    """Graph ``index``'s ModelProto with the shared weights merged into its graph."""
    graph = pack.graphs[index]
    return source.read(graph.offset, graph.length) + shared_suffix(source, pack)


def shared_suffix(source: onnx_proto.Source, pack: GraphPack) -> bytes:
    """What :func:`member_model` appends to a graph's ModelProto: the shared weights as a
    second ``graph`` field (empty when there are none). A reader of the model's main
    graph (onnx_proto.graph_io) reads the ModelProto without it."""
    if not pack.shared_length:
        return b""
    shared = source.read(pack.shared_offset, pack.shared_length)
    return onnx_proto.length_field(MODEL_GRAPH, shared)


def write_pack(graphs: Sequence[tuple[str, bytes]], weights: Sequence[bytes] = ()) -> bytes:
    """A graph pack of ``graphs`` (name, ONNX ModelProto bytes) sharing ``weights``
    (serialized ONNX TensorProtos, e.g. ``numpy_helper.from_array(a, "w")
    .SerializeToString()``). No checks: :func:`read_pack` makes them."""
    shared = b"".join(onnx_proto.length_field(GRAPH_INITIALIZER, w) for w in weights)
    out = bytearray(_HEADER.pack(MAGIC, VERSION, len(graphs), len(shared)))
    out += shared
    for name, model in graphs:
        encoded = name.encode("utf-8")
        out += _U32.pack(len(encoded)) + encoded + _U64.pack(len(model)) + model
    return bytes(out)
