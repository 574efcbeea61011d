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

The walker's parts, each re-exported here: :mod:`npud.formats.onnx_source` (the
sources, the budget, the errors), :mod:`npud.formats.onnx_wire` (the protobuf wire
format, read and written), :mod:`npud.formats.onnx_scan` (the scan for external
data and looping nodes) and :mod:`npud.formats.onnx_graph` (the main graph's
inputs and outputs, read and rewritten).
"""

from __future__ import annotations

from npud.formats.onnx_graph import (
    DIM_PARAM,
    DIM_VALUE,
    GRAPH_INITIALIZER,
    GRAPH_INPUT,
    GRAPH_OUTPUT,
    MAX_DIMS,
    MAX_GRAPH_IO,
    MODEL_GRAPH,
    SHAPE_DIM,
    TENSOR_TYPE_SHAPE,
    TYPE_TENSOR,
    UNNAMED_DIMS,
    VALUE_NAME,
    VALUE_TYPE,
    Dim,
    GraphTensor,
    dim_name,
    graph_io,
    with_input_shapes,
)
from npud.formats.onnx_scan import (
    ENTRY_KEY,
    ENTRY_VALUE,
    LOOPING_OPS,
    NODE_DOMAIN,
    NODE_NAME,
    NODE_OP_TYPE,
    TENSOR_DATA_LOCATION,
    TENSOR_EXTERNAL_DATA,
    TENSOR_NAME,
    TENSOR_PATHS,
    ExternalData,
    Findings,
    LoopingNode,
    find_external_data,
    find_looping_node,
    scan,
)
from npud.formats.onnx_source import (
    CHECK_EVERY,
    WINDOW,
    Budget,
    BytesSource,
    CheckTimeoutError,
    DamagedError,
    FdSource,
    LimitError,
    Source,
    Window,
)
from npud.formats.onnx_wire import (
    CHUNK,
    FIXED32,
    FIXED64,
    GROUP_END,
    GROUP_START,
    LENGTH,
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_LENGTH_BYTES,
    MAX_SHOWN,
    MAX_TAG_BYTES,
    MAX_VARINT_BYTES,
    VARINT,
    Field,
    fields,
    length_field,
)

__all__ = [
    "CHECK_EVERY",
    "CHUNK",
    "DIM_PARAM",
    "DIM_VALUE",
    "ENTRY_KEY",
    "ENTRY_VALUE",
    "FIXED32",
    "FIXED64",
    "GRAPH_INITIALIZER",
    "GRAPH_INPUT",
    "GRAPH_OUTPUT",
    "GROUP_END",
    "GROUP_START",
    "LENGTH",
    "LOOPING_OPS",
    "MAX_DEPTH",
    "MAX_DIMS",
    "MAX_GRAPH_IO",
    "MAX_LENGTH",
    "MAX_LENGTH_BYTES",
    "MAX_SHOWN",
    "MAX_TAG_BYTES",
    "MAX_VARINT_BYTES",
    "MODEL_GRAPH",
    "NODE_DOMAIN",
    "NODE_NAME",
    "NODE_OP_TYPE",
    "SHAPE_DIM",
    "TENSOR_DATA_LOCATION",
    "TENSOR_EXTERNAL_DATA",
    "TENSOR_NAME",
    "TENSOR_PATHS",
    "TENSOR_TYPE_SHAPE",
    "TYPE_TENSOR",
    "UNNAMED_DIMS",
    "VALUE_NAME",
    "VALUE_TYPE",
    "VARINT",
    "WINDOW",
    "Budget",
    "BytesSource",
    "CheckTimeoutError",
    "DamagedError",
    "Dim",
    "ExternalData",
    "FdSource",
    "Field",
    "Findings",
    "GraphTensor",
    "LimitError",
    "LoopingNode",
    "Source",
    "Window",
    "dim_name",
    "fields",
    "find_external_data",
    "find_looping_node",
    "graph_io",
    "length_field",
    "scan",
    "with_input_shapes",
]
