"""Fix an ONNX model's inputs to values, and fold what those values decide.

A model's outputs can hang on an input's *value*, not its shape: Silero VAD's
come out of an ``If`` on ``sr == 16000``, and shape inference, which sees only
shapes, must take both branches (and fails in the one 16 kHz chunks never
take). A load that fixes such an input (``constants={"sr": 16000}``) makes it
part of the model: :func:`fold_constants` turns each fixed input into an
initializer of the input's own element type, then replaces every ``If`` of the
main graph whose condition those values (and the model's own constants)
decide by the branch it takes, inlined. What is left is a model whose shapes
follow from the other inputs' shapes, as onnxruntime's inference sees them.

The bytes are rewritten as protobuf fields (:mod:`npud.formats.onnx_proto`'s
walker, no ``onnx`` package at run time); a condition is computed by
onnxruntime on a model of only the nodes that make it. :class:`FoldError`
says why a value cannot be taken (no such input, a shape or a kind that does
not fit); folding that finds nothing to fold leaves the model as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from npud.formats import onnx_proto
from npud.formats.onnx_proto import LENGTH, VARINT, BytesSource, Field, fields, length_field
from npud.formats.onnx_values import Constant

MAX_FOLDS: Final = 16
"""``If`` nodes folded at most (an inlined branch may hold another, folded next)."""

# GraphProto: node 1, initializer 5, input 11; NodeProto: input 1, output 2,
# op_type 4, attribute 5, domain 7; AttributeProto: name 1, g 6; TensorProto:
# dims 1, data_type 2, name 8, raw_data 9; ValueInfoProto: name 1, type 2;
# TypeProto.tensor_type 1 {elem_type 1, shape 2}.
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT = 1, 5, 11, 12
NODE_INPUT, NODE_OUTPUT, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 2, 4, 5, 7
ATTRIBUTE_NAME, ATTRIBUTE_GRAPH = 1, 6
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_NAME, TENSOR_RAW_DATA = 1, 2, 8, 9
ELEM_TYPE: Final = 1
ONNX_BOOL: Final = 9

# TensorProto.DataType -> numpy dtype name, for the types an input may be fixed to.
ONNX_DTYPES: Final[Mapping[int, str]] = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
}


class FoldError(ValueError):
    """A value the model cannot take as an input; the message says which and why."""


def fold_constants(data: bytes, constants: Mapping[str, Constant]) -> bytes:
    """The model with each input named in ``constants`` fixed to its value (an initializer
    of the input's element type) and every ``If`` those values decide folded away."""
    if not constants:
        return data
    source = BytesSource(data)
    top = list(fields(source, 0, source.size))  # walked more than once
    graphs = [f for f in top if f.number == onnx_proto.MODEL_GRAPH and f.wire == LENGTH]
    if not graphs:
        raise FoldError("the model has no graph to fix inputs of")
    declared = {t.name: t.dims for t in onnx_proto.graph_io(source) if t.kind == "input"}
    graph = _fix_inputs(source, graphs[-1], constants, declared)
    for _ in range(MAX_FOLDS):
        folded = _fold_one_if(data, top, graph)
        if folded is None:
            break
        graph = folded
    out = bytearray()
    for field in top:
        if field is graphs[-1]:
            out += length_field(onnx_proto.MODEL_GRAPH, graph)
        elif not (field.number == onnx_proto.MODEL_GRAPH and field.wire == LENGTH):
            out += source.read(field.head, field.end - field.head)
    return bytes(out)


def _fix_inputs(
    source: BytesSource,
    graph: Field,
    constants: Mapping[str, Constant],
    declared: Mapping[str, tuple[onnx_proto.Dim, ...] | None],
) -> bytes:
    out = bytearray()
    found: set[str] = set()
    initializers = bytearray()
    inputs: list[str] = []
    for field in fields(source, graph.start, graph.end):
        if field.number == GRAPH_INPUT and field.wire == LENGTH:
            name, elem_type = _value_info(source, field)
            inputs.append(name)
            if name in constants and name not in found:
                found.add(name)
                dims = declared.get(name)
                shape = constants[name].shape if dims is None else dims
                tensor = _tensor_proto(name, elem_type, shape, constants[name])
                initializers += length_field(GRAPH_INITIALIZER, tensor)
                continue
        out += source.read(field.head, field.end - field.head)
    missing = sorted(set(constants) - found)
    if missing:
        listed = ", ".join(repr(n) for n in inputs) or "none"
        raise FoldError(f"the model has no input {missing[0]!r} to fix (its inputs: {listed})")
    return bytes(out + initializers)


def _value_info(source: BytesSource, value: Field) -> tuple[str, int]:
    """An input's name and element type (0: unknown)."""
    name, elem_type = "", 0
    for part in fields(source, value.start, value.end):
        if part.number == onnx_proto.VALUE_NAME and part.wire == LENGTH:
            name = source.read(part.start, part.value).decode("utf-8", "replace")
        elif part.number == onnx_proto.VALUE_TYPE and part.wire == LENGTH:
            for typed in fields(source, part.start, part.end):
                if typed.number == onnx_proto.TYPE_TENSOR and typed.wire == LENGTH:
                    for item in fields(source, typed.start, typed.end):
                        if item.number == ELEM_TYPE and item.wire == VARINT:
                            elem_type = item.value
    return name, elem_type


def _tensor_proto(
    name: str, elem_type: int, dims: Sequence[onnx_proto.Dim], constant: Constant
) -> bytes:
    """The TensorProto of ``constant`` as input ``name`` declares it; FoldError when it
    does not fit (another rank, a fixed dimension that differs, another kind)."""
    dtype = ONNX_DTYPES.get(elem_type)
    if dtype is None:
        raise FoldError(f"input {name!r} is of ONNX type {elem_type}, which no value is taken as")
    if len(dims) != len(constant.shape) or any(
        isinstance(want, int) and want > 0 and want != have
        for want, have in zip(dims, constant.shape, strict=True)
    ):
        shown = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
        raise FoldError(
            f"input {name!r} is {dtype} {shown}; the value given has shape {list(constant.shape)}"
        )
    given = np.dtype(constant.dtype)
    want = np.dtype(dtype)
    if (given.kind == "f" and want.kind in "iub") or (given.kind == "b") != (want.kind == "b"):
        kind = {"f": "a floating point", "b": "a boolean"}.get(given.kind, "an integer")
        raise FoldError(f"input {name!r} is {dtype}; {kind} value is not taken as it")
    array = np.array(constant.values, dtype=constant.dtype).reshape(constant.shape)
    if want.kind in "iu" and array.size:
        info = np.iinfo(want)
        if array.min() < info.min or array.max() > info.max:
            raise FoldError(f"the value of {name!r} does not fit in {dtype}")
    raw = np.ascontiguousarray(array.astype(want)).reshape(-1).view(np.uint8).tobytes()
    out = bytearray()
    for size in constant.shape:
        out += _varint_field(TENSOR_DIMS, size)
    out += _varint_field(TENSOR_DATA_TYPE, elem_type)
    out += length_field(TENSOR_NAME, name.encode("utf-8"))
    out += length_field(TENSOR_RAW_DATA, raw)
    return bytes(out)


@dataclasses.dataclass(frozen=True)
class _Node:
    field: Field
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    branches: dict[str, Field]


def _node(source: BytesSource, field: Field) -> _Node:
    op_type, domain = "", ""
    inputs: list[str] = []
    outputs: list[str] = []
    branches: dict[str, Field] = {}
    for part in fields(source, field.start, field.end):
        if part.wire != LENGTH:
            continue
        text = (
            source.read(part.start, part.value).decode("utf-8", "replace")
            if part.number != NODE_ATTRIBUTE
            else ""
        )
        if part.number == NODE_INPUT:
            inputs.append(text)
        elif part.number == NODE_OUTPUT:
            outputs.append(text)
        elif part.number == NODE_OP_TYPE:
            op_type = text
        elif part.number == NODE_DOMAIN:
            domain = text
        elif part.number == NODE_ATTRIBUTE:
            name, graph = "", None
            for item in fields(source, part.start, part.end):
                if item.number == ATTRIBUTE_NAME and item.wire == LENGTH:
                    name = source.read(item.start, item.value).decode("utf-8", "replace")
                elif item.number == ATTRIBUTE_GRAPH and item.wire == LENGTH:
                    graph = item
            if graph is not None:
                branches[name] = graph
    return _Node(field, op_type, domain, tuple(inputs), tuple(outputs), branches)


def _fold_one_if(model: bytes, top: Sequence[Field], graph: bytes) -> bytes | None:
    """``graph`` with its first ``If`` whose condition is known from constants replaced by
    the branch it takes; None when there is none."""
    source = BytesSource(graph)
    parts = list(fields(source, 0, source.size))  # walked more than once
    known = {
        _tensor_name(source, f) for f in parts if f.number == GRAPH_INITIALIZER and f.wire == LENGTH
    }
    nodes = [_node(source, f) for f in parts if f.number == GRAPH_NODE and f.wire == LENGTH]
    makers: list[_Node] = []
    for node in nodes:
        decided = node.op_type == "If" and node.domain in ("", "ai.onnx") and node.inputs
        if decided and node.inputs[0] in known:
            taken = _condition(model, top, graph, parts, makers, node.inputs[0])
            branch = node.branches.get("then_branch" if taken else "else_branch")
            if branch is not None:
                return _inline(source, parts, node, branch)
        if all(not name or name in known for name in node.inputs) and not node.branches:
            known.update(node.outputs)
            makers.append(node)
    return None


def _tensor_name(source: BytesSource, tensor: Field) -> str:
    for part in fields(source, tensor.start, tensor.end):
        if part.number == TENSOR_NAME and part.wire == LENGTH:
            return source.read(part.start, part.value).decode("utf-8", "replace")
    return ""


def _condition(
    model: bytes,
    top: Sequence[Field],
    graph: bytes,
    parts: Sequence[Field],
    makers: Sequence[_Node],
    name: str,
) -> bool:
    """The value of ``name`` (a bool the constants decide), computed by onnxruntime on a
    model of the main graph's initializers, the nodes that make constants, and ``name``
    as its one output."""
    import onnxruntime as ort  # noqa: PLC0415  (the emulated DSP's runtime)

    source = BytesSource(graph)
    body = bytearray()
    for field in parts:
        if field.number == GRAPH_INITIALIZER and field.wire == LENGTH:
            body += source.read(field.head, field.end - field.head)
    for node in makers:
        body += source.read(node.field.head, node.field.end - node.field.head)
    tensor_type = length_field(onnx_proto.TYPE_TENSOR, _varint_field(ELEM_TYPE, ONNX_BOOL))
    output = length_field(onnx_proto.VALUE_NAME, name.encode("utf-8")) + length_field(
        onnx_proto.VALUE_TYPE, tensor_type
    )
    body += length_field(2, b"condition") + length_field(GRAPH_OUTPUT, output)
    whole = BytesSource(model)
    out = bytearray()
    for field in top:
        if field.number == onnx_proto.MODEL_GRAPH:
            continue
        out += whole.read(field.head, field.end - field.head)
    out += length_field(onnx_proto.MODEL_GRAPH, bytes(body))
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.load_model_format", "ONNX")
    session = ort.InferenceSession(bytes(out), options, providers=["CPUExecutionProvider"])
    (value,) = session.run(None, {})
    return bool(np.asarray(value).reshape(-1)[0])


def _inline(source: BytesSource, parts: Sequence[Field], node: _Node, branch: Field) -> bytes:
    """The graph with ``node`` replaced by ``branch``'s nodes and initializers, and an
    Identity from each branch output to the If's output of the same place."""
    branch_parts = list(fields(source, branch.start, branch.end))  # walked more than once
    branch_outputs = [
        _value_name(source, f)
        for f in branch_parts
        if f.number == GRAPH_OUTPUT and f.wire == LENGTH
    ]
    out = bytearray()
    for field in parts:
        if field is not node.field:
            out += source.read(field.head, field.end - field.head)
            continue
        for part in branch_parts:
            if part.number in (GRAPH_NODE, GRAPH_INITIALIZER) and part.wire == LENGTH:
                out += source.read(part.head, part.end - part.head)
        for inner, outer in zip(branch_outputs, node.outputs, strict=False):
            if outer:
                identity = (
                    length_field(NODE_INPUT, inner.encode("utf-8"))
                    + length_field(NODE_OUTPUT, outer.encode("utf-8"))
                    + length_field(NODE_OP_TYPE, b"Identity")
                )
                out += length_field(GRAPH_NODE, identity)
    return bytes(out)


def _value_name(source: BytesSource, value: Field) -> str:
    for part in fields(source, value.start, value.end):
        if part.number == onnx_proto.VALUE_NAME and part.wire == LENGTH:
            return source.read(part.start, part.value).decode("utf-8", "replace")
    return ""


def _varint_field(number: int, value: int) -> bytes:
    out = bytearray([number << 3 | VARINT])
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)
