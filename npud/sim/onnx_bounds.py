"""An output's largest shape, where the model itself bounds a size the data decides.

A duration-driven TTS's audio is as long as the durations it predicts; a
``NonZero`` has as many entries as the data has non-zero elements. Such an
output's shape does not follow from the inputs' shapes, and a QNN graph needs
its largest at load: its *room*. The client may give it; this module finds
the model's own bound where the graph makes one visible:

* a value bounded by constants of the graph: ``Clip`` / ``Min`` / ``Max`` /
  ``Relu`` with constant limits, an input of a bounded element type (bool,
  8-bit), arithmetic on bounded values (``Add``, ``Sub``, ``Mul``, ``Div`` by
  a value that is never 0, ``Ceil``, ``Floor``, ``Round``, ``Cast``, ``Exp``),
  a ``ReduceSum`` of bounded values (the count of its elements times their
  bound: the durations of a voice whose durations are clipped);
* a dimension bounded by such a value: ``Range`` from bounded ``start`` and
  ``limit`` by a positive ``delta``, ``NonZero`` (at most every element),
  and a ``Reshape`` whose ``-1`` takes a bounded element count;
* shapes carried through the ops that move them: elementwise ops with
  broadcasting, ``Identity``, ``Cast``, ``Unsqueeze`` / ``Squeeze``,
  ``Transpose``, ``Concat``, and the small integer tensors shapes are made of
  (``Shape``, ``Concat``, ``Gather``, ``Unsqueeze`` of constants).

Anything else (an op not listed, a value with no bound: Piper's durations are
``exp`` of a prediction, clipped only from below) gives no bound, and the
output needs its room given. Every bound is an upper bound: a run that
produces less fills the start of the room and reports its shape. Values are
intervals over all of a tensor's elements, dimensions upper bounds (exact
where they are known exactly); the graph is read with
:mod:`npud.formats.onnx_proto`'s walker (no ``onnx`` package at run time),
its main graph only, in node order (ONNX's topological order).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from npud.formats import onnx_proto
from npud.formats.onnx_proto import FIXED32, FIXED64, LENGTH, VARINT, BytesSource, Field, fields

MAX_EXACT: Final = 64
"""Elements of a constant tensor kept as values (shapes, limits); larger ones keep
their interval only."""
MAX_NODES: Final = 100_000

# GraphProto: node 1, initializer 5, input 11; NodeProto: input 1, output 2, op_type 4,
# attribute 5, domain 7; AttributeProto: name 1, f 2, i 3, t 5, floats 7, ints 8;
# TensorProto: dims 1, data_type 2, float_data 4, int32_data 5, int64_data 7, name 8,
# raw_data 9, double_data 10; ValueInfoProto: name 1, type 2; TypeProto.tensor_type 1
# {elem_type 1}.
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT = 1, 5, 11
NODE_INPUT, NODE_OUTPUT, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 2, 4, 5, 7
ATTR_NAME, ATTR_F, ATTR_I, ATTR_T, ATTR_FLOATS, ATTR_INTS = 1, 2, 3, 5, 7, 8
TENSOR_DIMS, TENSOR_TYPE, TENSOR_FLOATS, TENSOR_INT32S, TENSOR_INT64S = 1, 2, 4, 5, 7
TENSOR_NAME, TENSOR_RAW, TENSOR_DOUBLES = 8, 9, 10

# TensorProto.DataType -> (struct code of raw_data, smallest and largest value).
_RAW: Final[Mapping[int, tuple[str, float, float]]] = {
    1: ("f", -math.inf, math.inf),
    2: ("B", 0, 255),
    3: ("b", -128, 127),
    4: ("H", 0, 65535),
    5: ("h", -32768, 32767),
    6: ("i", -(2**31), 2**31 - 1),
    7: ("q", -(2**63), 2**63 - 1),
    9: ("?", 0, 1),
    11: ("d", -math.inf, math.inf),
    12: ("I", 0, 2**32 - 1),
    13: ("Q", 0, 2**64 - 1),
}
_BOUNDED_INPUTS: Final = frozenset({2, 3, 9})  # uint8, int8, bool: their range bounds them
_FLOATS: Final = frozenset({1, 10, 11, 16})


@dataclasses.dataclass(frozen=True)
class Value:
    """What is known of one tensor: each dimension's upper bound (None: unknown) and
    whether it is exact, the interval of its elements, its values when few and known."""

    dims: tuple[int | None, ...] | None = None
    exact: tuple[bool, ...] = ()
    lo: float = -math.inf
    hi: float = math.inf
    values: tuple[float, ...] | None = None

    @classmethod
    def of(cls, values: Sequence[float], dims: Sequence[int]) -> Value:
        kept = tuple(values) if len(values) <= MAX_EXACT else None
        low, high = (min(values), max(values)) if values else (0.0, 0.0)
        return cls(tuple(dims), (True,) * len(dims), low, high, kept)

    @property
    def elements(self) -> int | None:
        """The bound of its element count, or None."""
        if self.dims is None or None in self.dims:
            return None
        return math.prod(d for d in self.dims if d is not None)

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)


UNKNOWN: Final = Value()


@dataclasses.dataclass(frozen=True)
class _Node:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ints: dict[str, int]
    int_lists: dict[str, tuple[int, ...]]
    floats: dict[str, float]
    tensors: dict[str, Value]


def output_bounds(
    data: bytes, input_shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int | None, ...]]:
    """Each main-graph tensor's dimension bounds (None where there is none) that the
    graph shows, given the inputs' fixed shapes; {} for a model it cannot read."""
    try:
        known = _walk(data, input_shapes)
    except (onnx_proto.DamagedError, onnx_proto.LimitError, ValueError, struct.error):
        return {}
    return {name: value.dims for name, value in known.items() if value.dims is not None}


def _walk(data: bytes, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Value]:
    source = BytesSource(data)
    graph = next(
        (
            f
            for f in fields(source, 0, source.size)
            if f.number == onnx_proto.MODEL_GRAPH and f.wire == LENGTH
        ),
        None,
    )
    if graph is None:
        return {}
    known: dict[str, Value] = {"": UNKNOWN}
    nodes: list[_Node] = []
    for part in fields(source, graph.start, graph.end):
        if part.wire != LENGTH:
            continue
        if part.number == GRAPH_INITIALIZER:
            name, value = _tensor(source, part)
            known[name] = value
        elif part.number == GRAPH_INPUT:
            name, elem_type = _input(source, part)
            if name in input_shapes and name not in known:
                known[name] = _input_value(input_shapes[name], elem_type)
        elif part.number == GRAPH_NODE:
            nodes.append(_node(source, part))
            if len(nodes) > MAX_NODES:
                return {}
    for node in nodes:
        rule = _RULES.get(node.op)
        ins = [known.get(name, UNKNOWN) for name in node.inputs]
        out = rule(node, ins) if rule is not None else UNKNOWN
        for index, name in enumerate(node.outputs):
            known[name] = out if index == 0 else UNKNOWN
    return known


def _input_value(shape: tuple[int, ...], elem_type: int) -> Value:
    low, high = -math.inf, math.inf
    if elem_type in _BOUNDED_INPUTS:
        _, low, high = _RAW[elem_type]
    return Value(shape, (True,) * len(shape), low, high)


def _text(source: BytesSource, field: Field) -> str:
    return source.read(field.start, field.value).decode("utf-8", "replace")


def _input(source: BytesSource, value: Field) -> tuple[str, int]:
    name, elem_type = "", 0
    for part in fields(source, value.start, value.end):
        if part.number == onnx_proto.VALUE_NAME and part.wire == LENGTH:
            name = _text(source, part)
        elif part.number == onnx_proto.VALUE_TYPE and part.wire == LENGTH:
            for kind in fields(source, part.start, part.end):
                if kind.number == onnx_proto.TYPE_TENSOR and kind.wire == LENGTH:
                    for item in fields(source, kind.start, kind.end):
                        if item.number == 1 and item.wire == VARINT:
                            elem_type = item.value
    return name, elem_type


def _varints(source: BytesSource, field: Field, signed: bool) -> list[int]:
    """A repeated integer field's values: one (VARINT) or a packed run (LENGTH)."""
    if field.wire == VARINT:
        raw = [field.value]
    else:
        raw = []
        data, at = source.read(field.start, field.value), 0
        while at < len(data):
            value, shift = 0, 0
            while True:
                byte = data[at]
                at += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            raw.append(value)
    return [v - (1 << 64) if signed and v >= 1 << 63 else v for v in raw]


def _fixed(source: BytesSource, field: Field, code: str) -> list[float]:
    size = struct.calcsize(code)
    if field.wire in (FIXED32, FIXED64):
        data = source.read(field.start, size)
    else:
        data = source.read(field.start, field.value)
    return [float(v) for (v,) in struct.iter_unpack(f"<{code}", data[: len(data) // size * size])]


def _tensor(source: BytesSource, tensor: Field) -> tuple[str, Value]:
    """A TensorProto's name and what its data says (its interval and, when small, its
    values); a tensor of a kind not read here is known by its shape alone."""
    name, dims = "", []
    parts = list(fields(source, tensor.start, tensor.end))
    for part in parts:
        if part.number == TENSOR_NAME and part.wire == LENGTH:
            name = _text(source, part)
        elif part.number == TENSOR_DIMS:
            dims += _varints(source, part, signed=True)
    if any(d < 0 for d in dims):
        return name, UNKNOWN
    shape_only = Value(tuple(dims), (True,) * len(dims))
    if math.prod(dims) > MAX_EXACT:  # weights: their values bound no shape here
        return name, shape_only
    values = _tensor_values(source, parts)
    if len(values) != math.prod(dims) or any(math.isnan(v) for v in values):
        return name, shape_only
    return name, Value.of(values, dims)


def _tensor_values(source: BytesSource, parts: Sequence[Field]) -> list[float]:
    """A small TensorProto's values: raw_data or the typed field its type uses."""
    elem_type = 0
    values: list[float] = []
    raw: bytes | None = None
    for part in parts:
        if part.number == TENSOR_TYPE and part.wire == VARINT:
            elem_type = part.value
        elif part.number in (TENSOR_INT32S, TENSOR_INT64S):
            values += _varints(source, part, signed=True)
        elif part.number in (TENSOR_FLOATS, TENSOR_DOUBLES):
            values += _fixed(source, part, "f" if part.number == TENSOR_FLOATS else "d")
        elif part.number == TENSOR_RAW and part.wire == LENGTH:
            raw = source.read(part.start, part.value)
    if elem_type == 6:  # int32_data holds int32s as sign-extended varints
        values = [v - (1 << 32) if v >= 1 << 31 else v for v in values]
    if raw is not None:
        if elem_type not in _RAW:
            return []
        code = _RAW[elem_type][0]
        values = [float(v) for (v,) in struct.iter_unpack(f"<{code}", raw)]
    return values


@dataclasses.dataclass
class _Attributes:
    ints: dict[str, int] = dataclasses.field(default_factory=dict)
    int_lists: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    floats: dict[str, float] = dataclasses.field(default_factory=dict)
    tensors: dict[str, Value] = dataclasses.field(default_factory=dict)

    def read(self, source: BytesSource, attribute: Field) -> None:
        """One AttributeProto: the kinds the rules use (int, ints, float, tensor)."""
        items = list(fields(source, attribute.start, attribute.end))
        name = next(
            (_text(source, i) for i in items if i.number == ATTR_NAME and i.wire == LENGTH), ""
        )
        for item in items:
            if item.number == ATTR_I and item.wire == VARINT:
                self.ints[name] = _varints(source, item, signed=True)[0]
            elif item.number == ATTR_F and item.wire == FIXED32:
                self.floats[name] = _fixed(source, item, "f")[0]
            elif item.number == ATTR_INTS:
                more = _varints(source, item, signed=True)
                self.int_lists[name] = (*self.int_lists.get(name, ()), *more)
            elif item.number == ATTR_FLOATS and name == "value_floats":
                values = _fixed(source, item, "f")
                self.tensors[name] = Value.of(values, [len(values)])
            elif item.number == ATTR_T and item.wire == LENGTH:
                self.tensors[name] = _tensor(source, item)[1]


def _node(source: BytesSource, field: Field) -> _Node:
    op, domain = "", ""
    inputs: list[str] = []
    outputs: list[str] = []
    attributes = _Attributes()
    for part in fields(source, field.start, field.end):
        if part.wire != LENGTH:
            continue
        if part.number in (NODE_INPUT, NODE_OUTPUT):
            (inputs if part.number == NODE_INPUT else outputs).append(_text(source, part))
        elif part.number == NODE_OP_TYPE:
            op = _text(source, part)
        elif part.number == NODE_DOMAIN:
            domain = _text(source, part)
        elif part.number == NODE_ATTRIBUTE:
            attributes.read(source, part)
    if domain not in ("", "ai.onnx"):
        op = f"{domain}.{op}"  # no rule: another domain's op of the same name differs
    return _Node(
        op,
        tuple(inputs),
        tuple(outputs),
        attributes.ints,
        attributes.int_lists,
        attributes.floats,
        attributes.tensors,
    )


# --- the rules: what each op's first output is, from its inputs -----------------------------

Rule = Callable[[_Node, list[Value]], Value]


def _broadcast(values: Sequence[Value]) -> tuple[tuple[int | None, ...] | None, tuple[bool, ...]]:
    """The shape of an elementwise result (numpy's broadcasting of the bounds)."""
    if any(v.dims is None for v in values):
        return None, ()
    rank = max(len(v.dims or ()) for v in values)
    dims: list[int | None] = []
    exact: list[bool] = []
    for axis in range(rank):
        sizes, exacts = [], []
        for v in values:
            assert v.dims is not None
            offset = axis - (rank - len(v.dims))
            if offset >= 0:
                sizes.append(v.dims[offset])
                exacts.append(v.exact[offset] if offset < len(v.exact) else False)
        if None in sizes:
            dims.append(None)
            exact.append(False)
            continue
        known = [s for s in sizes if s is not None]
        dims.append(max(known))
        exact.append(all(exacts) and len({s for s in known if s != 1}) <= 1)
    return tuple(dims), tuple(exact)


def _elementwise(combine: Callable[[list[tuple[float, float]]], tuple[float, float]]) -> Rule:
    def rule(node: _Node, ins: list[Value]) -> Value:
        dims, exact = _broadcast(ins)
        try:
            low, high = combine([(v.lo, v.hi) for v in ins])
        except (ArithmeticError, ValueError):
            low, high = -math.inf, math.inf
        if math.isnan(low) or math.isnan(high):
            low, high = -math.inf, math.inf
        return Value(dims, exact, low, high)

    return rule


def _products(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    corners = [
        x * y
        for x in a
        for y in b
        if not ((math.isinf(x) and y == 0) or (math.isinf(y) and x == 0))
    ]
    return (min(corners), max(corners)) if corners else (-math.inf, math.inf)


def _quotients(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    if b[0] <= 0 <= b[1]:
        return -math.inf, math.inf
    return _products(a, (1 / b[1], 1 / b[0]))


def _fold(pair: Callable[[tuple[float, float], tuple[float, float]], tuple[float, float]]) -> Rule:
    def combine(bounds: list[tuple[float, float]]) -> tuple[float, float]:
        if len(bounds) != 2:
            return -math.inf, math.inf
        return pair(bounds[0], bounds[1])

    return _elementwise(combine)


def _same_shape(interval: Callable[[float, float], tuple[float, float]]) -> Rule:
    def rule(node: _Node, ins: list[Value]) -> Value:
        if not ins:
            return UNKNOWN
        x = ins[0]
        low, high = interval(x.lo, x.hi)
        return Value(x.dims, x.exact, low, high)

    return rule


def _clip(node: _Node, ins: list[Value]) -> Value:
    if not ins:
        return UNKNOWN
    x = ins[0]
    # Opset 11 on: min and max are inputs (a name may be empty: UNKNOWN); before: attributes.
    floor = ins[1].lo if len(ins) > 1 else node.floats.get("min", -math.inf)
    ceiling = ins[2].hi if len(ins) > 2 else node.floats.get("max", math.inf)
    low, high = max(x.lo, floor), min(x.hi, ceiling)
    return Value(x.dims, x.exact, low, max(low, high))


def _extreme(smallest: bool) -> Rule:
    def combine(bounds: list[tuple[float, float]]) -> tuple[float, float]:
        pick = min if smallest else max
        return pick(b[0] for b in bounds), pick(b[1] for b in bounds)

    return _elementwise(combine)


def _cast(node: _Node, ins: list[Value]) -> Value:
    if not ins:
        return UNKNOWN
    x = ins[0]
    to = node.ints.get("to", 0)
    values = x.values
    if to not in _FLOATS and values is not None:
        values = tuple(float(math.trunc(v)) for v in values)
    return dataclasses.replace(x, values=values)


def _rounding(node: _Node, ins: list[Value]) -> Value:
    return _same_shape(lambda lo, hi: (math.floor(lo), math.ceil(hi)))(node, ins)


def _reduce_sum(node: _Node, ins: list[Value]) -> Value:
    if not ins or ins[0].dims is None:
        return UNKNOWN
    x = ins[0]
    assert x.dims is not None
    rank = len(x.dims)
    if len(ins) > 1 and ins[1].values is not None:
        axes = [int(a) % rank for a in ins[1].values] if rank else []
    else:
        axes = [a % rank for a in node.int_lists.get("axes", ())] if rank else []
    if not axes:
        if node.ints.get("noop_with_empty_axes", 0) and len(ins) > 1:
            return x
        axes = list(range(rank))
    reduced = [x.dims[a] for a in axes]
    if None in reduced:
        return UNKNOWN
    count = math.prod(d for d in reduced if d is not None)
    keep = node.ints.get("keepdims", 1)
    dims = tuple(1 if a in axes else d for a, d in enumerate(x.dims) if keep or a not in axes)
    exact = tuple(True if a in axes else x.exact[a] for a in range(rank) if keep or a not in axes)
    low, high = _products((x.lo, x.hi), (0, count)) if count else (0.0, 0.0)
    return Value(dims, exact, low, high)


def _range(node: _Node, ins: list[Value]) -> Value:
    if len(ins) != 3:
        return UNKNOWN
    start, limit, delta = ins
    if delta.lo <= 0 or math.isinf(start.lo) or math.isinf(limit.hi):
        return UNKNOWN  # a negative step counts down from start: not bounded here
    count = max(0, math.ceil((limit.hi - start.lo) / delta.lo))
    return Value((count,), (False,), start.lo, max(start.lo, limit.hi))


def _nonzero(node: _Node, ins: list[Value]) -> Value:
    if not ins or ins[0].elements is None or ins[0].rank is None:
        return UNKNOWN
    x = ins[0]
    assert x.dims is not None
    assert x.elements is not None
    largest = max((d for d in x.dims if d is not None), default=1)
    return Value((len(x.dims), x.elements), (True, False), 0, max(0, largest - 1))


def _shape(node: _Node, ins: list[Value]) -> Value:
    if not ins or ins[0].dims is None:
        return UNKNOWN
    x = ins[0]
    assert x.dims is not None
    rank = len(x.dims)
    start = node.ints.get("start", 0) % (rank + 1) if rank else 0
    end = node.ints.get("end", rank)
    end = min(rank, end % (rank + 1) if end < 0 else end)
    dims, exact = x.dims[start:end], x.exact[start:end]
    high = max((d for d in dims if d is not None), default=0) if None not in dims else math.inf
    if all(exact) and None not in dims:
        return Value.of([float(d) for d in dims if d is not None], [len(dims)])
    return Value((len(dims),), (True,), 0, high)


def _constant(node: _Node, ins: list[Value]) -> Value:
    if "value" in node.tensors:
        return node.tensors["value"]
    if "value_int" in node.ints:
        return Value.of([float(node.ints["value_int"])], [])
    if "value_ints" in node.int_lists:
        values = node.int_lists["value_ints"]
        return Value.of([float(v) for v in values], [len(values)])
    if "value_float" in node.floats:
        return Value.of([node.floats["value_float"]], [])
    return node.tensors.get("value_floats", UNKNOWN)


def _concat(node: _Node, ins: list[Value]) -> Value:
    if not ins or any(v.dims is None for v in ins):
        return UNKNOWN
    rank = len(ins[0].dims or ())
    if not rank or any(len(v.dims or ()) != rank for v in ins):
        return UNKNOWN
    axis = node.ints.get("axis", 0) % rank
    total: int | None = 0
    exact = True
    for v in ins:
        assert v.dims is not None
        size = v.dims[axis]
        total = None if total is None or size is None else total + size
        exact = exact and v.exact[axis]
    first = ins[0]
    assert first.dims is not None
    dims = tuple(total if a == axis else first.dims[a] for a in range(rank))
    exacts = tuple(exact if a == axis else first.exact[a] for a in range(rank))
    values = None
    if rank == 1 and all(v.values is not None for v in ins):
        values = tuple(x for v in ins for x in (v.values or ()))
    low, high = min(v.lo for v in ins), max(v.hi for v in ins)
    return Value(dims, exacts, low, high, values)


def _gather(node: _Node, ins: list[Value]) -> Value:
    if len(ins) != 2 or ins[0].dims is None or ins[1].dims is None:
        return UNKNOWN
    data, indices = ins
    assert data.dims is not None
    assert indices.dims is not None
    if not data.dims:
        return UNKNOWN
    axis = node.ints.get("axis", 0) % len(data.dims)
    dims = (*data.dims[:axis], *indices.dims, *data.dims[axis + 1 :])
    exact = (*data.exact[:axis], *indices.exact, *data.exact[axis + 1 :])
    values = None
    if len(data.dims) == 1 and data.values is not None and indices.values is not None:
        size = len(data.values)
        picked = [int(i) % size if size else 0 for i in indices.values]
        if size:
            values = tuple(data.values[i] for i in picked)
    if values is not None:
        return Value(dims, exact, min(values, default=0), max(values, default=0), values)
    return Value(dims, exact, data.lo, data.hi)


def _axes(node: _Node, ins: list[Value]) -> list[int] | None:
    if len(ins) > 1:
        return None if ins[1].values is None else [int(a) for a in ins[1].values]
    return list(node.int_lists.get("axes", ()))


def _unsqueeze(node: _Node, ins: list[Value]) -> Value:
    axes = _axes(node, ins)
    if not ins or ins[0].dims is None or axes is None:
        return UNKNOWN
    x = ins[0]
    assert x.dims is not None
    rank = len(x.dims) + len(axes)
    wanted = {a % rank for a in axes}
    dims: list[int | None] = []
    exact: list[bool] = []
    source = iter(zip(x.dims, x.exact, strict=True))
    for axis in range(rank):
        if axis in wanted:
            dims.append(1)
            exact.append(True)
        else:
            size, is_exact = next(source)
            dims.append(size)
            exact.append(is_exact)
    return Value(tuple(dims), tuple(exact), x.lo, x.hi, x.values)


def _squeeze(node: _Node, ins: list[Value]) -> Value:
    axes = _axes(node, ins)
    if not ins or ins[0].dims is None or axes is None:
        return UNKNOWN
    x = ins[0]
    assert x.dims is not None
    rank = len(x.dims)
    dropped = {a % rank for a in axes} if axes else {a for a, d in enumerate(x.dims) if d == 1}
    if not axes and not all(x.exact):
        return UNKNOWN  # which axes are 1 is the data's
    kept = [a for a in range(rank) if a not in dropped]
    return Value(
        tuple(x.dims[a] for a in kept), tuple(x.exact[a] for a in kept), x.lo, x.hi, x.values
    )


def _transpose(node: _Node, ins: list[Value]) -> Value:
    if not ins or ins[0].dims is None:
        return UNKNOWN
    x = ins[0]
    assert x.dims is not None
    perm = node.int_lists.get("perm") or tuple(reversed(range(len(x.dims))))
    if sorted(perm) != list(range(len(x.dims))):
        return UNKNOWN
    return Value(tuple(x.dims[p] for p in perm), tuple(x.exact[p] for p in perm), x.lo, x.hi)


def _reshape(node: _Node, ins: list[Value]) -> Value:
    if len(ins) != 2 or ins[1].values is None:
        return UNKNOWN
    x, target = ins
    dims: list[int | None] = []
    exact: list[bool] = []
    free = None
    for axis, raw in enumerate(int(v) for v in target.values or ()):
        if raw == 0 and not node.ints.get("allowzero", 0):
            if x.dims is None or axis >= len(x.dims):
                return UNKNOWN
            dims.append(x.dims[axis])
            exact.append(x.exact[axis])
        elif raw == -1 and free is None:
            free = axis
            dims.append(None)
            exact.append(False)
        elif raw >= 0:
            dims.append(raw)
            exact.append(True)
        else:
            return UNKNOWN
    if free is not None:
        others = [d for a, d in enumerate(dims) if a != free]
        elements = x.elements
        if elements is not None and None not in others:
            product = math.prod(d for d in others if d is not None)
            dims[free] = elements // product if product else None
            exact[free] = all(x.exact) and all(exact[a] for a in range(len(dims)) if a != free)
    return Value(tuple(dims), tuple(exact), x.lo, x.hi, x.values if free is None else None)


def _identity(node: _Node, ins: list[Value]) -> Value:
    return ins[0] if ins else UNKNOWN


def _add(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def _sub(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] - b[1], a[1] - b[0]


def _exp(lo: float, hi: float) -> tuple[float, float]:
    return math.exp(min(lo, 700)), (math.exp(hi) if hi < 700 else math.inf)


_RULES: Final[Mapping[str, Rule]] = {
    "Add": _fold(_add),
    "Sub": _fold(_sub),
    "Mul": _fold(_products),
    "Div": _fold(_quotients),
    "Min": _extreme(smallest=True),
    "Max": _extreme(smallest=False),
    "Clip": _clip,
    "Relu": _same_shape(lambda lo, hi: (max(0.0, lo), max(0.0, hi))),
    "Exp": _same_shape(_exp),
    "Ceil": _rounding,
    "Floor": _rounding,
    "Round": _rounding,
    "Cast": _cast,
    "Identity": _identity,
    "ReduceSum": _reduce_sum,
    "Range": _range,
    "NonZero": _nonzero,
    "Shape": _shape,
    "Constant": _constant,
    "Concat": _concat,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Transpose": _transpose,
    "Reshape": _reshape,
}
