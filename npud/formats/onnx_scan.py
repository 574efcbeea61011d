"""The safety scan of an ONNX model: every message of the schema that can hold a
tensor, for what would make a runtime open a file (:func:`find_external_data`)
or loop without end (:func:`find_looping_node`); iterative and bounded in depth
(:data:`~npud.formats.onnx_wire.MAX_DEPTH`), everything else skipped by its
length, so large weights are never read."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Final

from npud.formats.onnx_source import Budget, DamagedError, Source
from npud.formats.onnx_wire import LENGTH, MAX_DEPTH, VARINT, Field, fields, shown_text

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


def _tensor(
    source: Source, start: int, end: int, place: str, budget: Budget | None
) -> ExternalData | None:
    name, location, external = "", "", False
    for field in fields(source, start, end, budget):
        if field.number == TENSOR_NAME and field.wire == LENGTH:
            name = shown_text(source, field)
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
                location = shown_text(source, value)
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
                setattr(frame, _NODE_TEXT[field.number], shown_text(source, field))
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
