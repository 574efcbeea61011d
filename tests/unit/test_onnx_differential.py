"""npud's protobuf walker against the protobuf library, on random and crafted bytes.

For every input, the fields npud's walker sees in a message (npud.formats.onnx_proto
.fields) are the fields protobuf's parser (``upb``, as ``google.protobuf`` runs it)
keeps as unknown fields of an empty message: the same numbers, wire types and values
in the same order, or both refuse the bytes. The one difference is deliberate: a field
numbered 0, which upb keeps and onnxruntime's C++ parser refuses, npud refuses.

On whole models: whenever protobuf parses a model, npud's walk finds a Loop node and
external data exactly where protobuf's message has them, or refuses the file (issue 27:
a Loop hidden behind a 5-byte tag whose high bits npud read and protobuf drops).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import onnx
import pytest
from google.protobuf import empty_pb2, unknown_fields
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from npud.formats import onnx_proto
from npud.formats.onnx_proto import BytesSource, DamagedError
from tests.emulator import onnx_models

Seen = list[tuple[int, int, object]]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _padded(value: int, length: int) -> bytes:
    """``value`` as a varint of exactly ``length`` bytes (non-canonical when longer than
    it needs): what a hostile writer may do with any tag or length."""
    out = bytearray()
    for index in range(length):
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if index < length - 1 else 0))
    return bytes(out)


def protobuf_fields(data: bytes) -> Seen | None:
    """What protobuf keeps of ``data`` as an empty message's unknown fields (a group
    by number and wire type), or None when it refuses the bytes."""
    try:
        message = empty_pb2.Empty.FromString(data)
    except DecodeError:
        return None
    seen: Seen = []
    for field in unknown_fields.UnknownFieldSet(message):
        value: object = field.data
        if field.wire_type == onnx_proto.GROUP_START:
            value = None
        elif field.wire_type in (onnx_proto.FIXED32, onnx_proto.FIXED64):
            value = int(field.data)
        seen.append((field.field_number, field.wire_type, value))
    return seen


def npud_fields(data: bytes) -> Seen | None:
    """What npud's walker sees in ``data``, in the same terms, or None when it refuses."""
    source = BytesSource(data)
    seen: Seen = []
    try:
        for field in onnx_proto.fields(source, 0, len(data)):
            value: object
            if field.wire == onnx_proto.VARINT:
                value = field.value
            elif field.wire == onnx_proto.LENGTH:
                value = data[field.start : field.end]
            elif field.wire == onnx_proto.GROUP_START:
                value = None
            else:
                value = int.from_bytes(data[field.start : field.end], "little")
            seen.append((field.number, field.wire, value))
    except DamagedError:
        return None
    return seen


def _has_field_zero(data: bytes) -> bool:
    """Protobuf kept a field numbered 0 somewhere (npud refuses it, as onnxruntime does)."""
    try:
        message = empty_pb2.Empty.FromString(data)
    except DecodeError:
        return False

    def walk(found: Any) -> bool:
        return any(
            field.field_number == 0
            or (field.wire_type == onnx_proto.GROUP_START and walk(field.data))
            for field in found
        )

    return walk(unknown_fields.UnknownFieldSet(message))


def assert_agree(data: bytes) -> None:
    theirs, ours = protobuf_fields(data), npud_fields(data)
    if theirs is not None and ours is None and _has_field_zero(data):
        return  # the deliberate difference (see the module docstring)
    assert ours == theirs, f"npud and protobuf differ on {data.hex()}"


# --- inputs ----------------------------------------------------------------------------------


def _random_field(rng: random.Random, depth: int = 0) -> bytes:
    """One field as a hostile writer would encode it: any number, any wire type, tags
    and lengths padded to any length, tags over 32 bits, groups, cut-short values."""
    number = rng.choice([1, 2, 5, 7, 15, 16, 2047, 2048, (1 << 29) - 1, rng.randrange(1, 1 << 29)])
    wire = rng.choice([0, 0, 1, 2, 2, 2, 3, 4, 5, 6, 7])
    key = number << 3 | wire
    roll = rng.random()
    if roll < 0.1:
        key |= rng.randrange(1, 16) << 32  # the high bits of a 5-byte tag
        tag = _padded(key, 5)
    elif roll < 0.25:
        tag = _padded(key, rng.randrange(len(_varint(key)), 7))
    else:
        tag = _varint(key)
    if wire == onnx_proto.VARINT:
        value = rng.choice([0, 1, 127, 128, (1 << 63), (1 << 64) - 1, rng.getrandbits(70)])
        body = _padded(value, rng.randrange(len(_varint(value)), 12)) if value else b"\x00"
    elif wire == onnx_proto.LENGTH:
        payload = (
            b"".join(_random_field(rng, depth + 1) for _ in range(rng.randrange(3)))
            if depth < 3 and rng.random() < 0.5
            else rng.randbytes(rng.randrange(6))
        )
        size = len(payload) + rng.choice([0, 0, 0, 0, 1, -1, 1 << 31, 1 << 32])
        size = max(size, 0)
        body = _padded(size, rng.randrange(len(_varint(size)), 7)) + payload
    elif wire == onnx_proto.GROUP_START:
        inner = b"".join(_random_field(rng, depth + 1) for _ in range(rng.randrange(3)))
        end = rng.choice([number, number, rng.randrange(1, 30)])
        body = inner + (_varint(end << 3 | 4) if rng.random() < 0.9 else b"")
    elif wire == onnx_proto.FIXED32:
        body = rng.randbytes(rng.choice([4, 4, 4, 2]))
    elif wire == onnx_proto.FIXED64:
        body = rng.randbytes(rng.choice([8, 8, 8, 5]))
    else:
        body = rng.randbytes(rng.randrange(3))
    return tag + body


def random_messages(seed: int, count: int) -> Iterator[bytes]:
    rng = random.Random(seed)  # noqa: S311 - reproducible inputs, not secrets
    for _ in range(count):
        kind = rng.random()
        if kind < 0.3:
            yield rng.randbytes(rng.randrange(24))
        else:
            yield b"".join(_random_field(rng) for _ in range(rng.randrange(1, 5)))


def mutations(data: bytes, seed: int, count: int) -> Iterator[bytes]:
    """``data`` with bytes flipped, cut, inserted or a varint padded."""
    rng = random.Random(seed)  # noqa: S311 - reproducible inputs, not secrets
    for _ in range(count):
        mutated = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            where = rng.randrange(len(mutated))
            roll = rng.random()
            if roll < 0.4:
                mutated[where] ^= 1 << rng.randrange(8)
            elif roll < 0.6:
                del mutated[where:]
            elif roll < 0.8:
                mutated[where:where] = rng.randbytes(rng.randrange(1, 4))
            else:
                mutated[where] = rng.choice([0x80, 0xFF, 0x00, 0x8F, 0x10])
            if not mutated:
                break
        yield bytes(mutated)


CRAFTED = [
    b"",
    b"\x08\x01",
    b"\x88\x80\x80\x80\x00\x01",  # field 1, tag padded to 5 bytes
    b"\x88\x80\x80\x80\x0f\x01",  # a 5-byte tag of 32 bits
    b"\x88\x80\x80\x80\x10\x01",  # a 5-byte tag over 32 bits: low 32 bits field 1
    b"\x88\x80\x80\x80\x80\x00\x01",  # a 6-byte tag
    b"\x0a\x81\x80\x80\x80\x00x",  # a length padded to 5 bytes
    b"\x0a\x81\x80\x80\x80\x80\x00x",  # a 6-byte length
    b"\x0a\x81\x80\x80\x80\x10x",  # a 5-byte length over 32 bits: low bits 1
    b"\x08" + b"\xff" * 9 + b"\x01",  # the largest 10-byte value
    b"\x08" + b"\xff" * 9 + b"\x7f",  # 10 bytes: its low 64 bits
    b"\x08" + b"\xff" * 10 + b"\x01",  # 11 bytes
    b"\x0b\x10\x05\x0c",  # a group holding a varint
    b"\x0b\x13\x0c\x14\x0c",  # nested groups
    b"\x0b\x14",  # a group closed by another field's end tag
    b"\x0c",  # an end-group tag outside a group
    b"\x0b",  # a group without its end
    b"\x0e\x00",  # wire type 6
    b"\x0f\x00",  # wire type 7
    b"\x00\x01",  # field 0
    b"\x0d\x01\x02",  # fixed32 cut short
    b"\x09" + bytes(8),
]


@pytest.mark.parametrize("data", CRAFTED, ids=lambda data: data.hex() or "empty")
def test_crafted_fields_agree_with_protobuf(data: bytes) -> None:
    assert_agree(data)


def test_random_fields_agree_with_protobuf() -> None:
    for data in random_messages(seed=27, count=4000):
        assert_agree(data)


@settings(max_examples=1500, deadline=None)  # speed is bench/'s business
@given(st.binary(max_size=48))
def test_any_bytes_agree_with_protobuf(data: bytes) -> None:
    assert_agree(data)


def test_mutated_models_agree_with_protobuf_field_by_field() -> None:
    model = onnx_models.add_one()
    for data in mutations(model, seed=3, count=1500):
        assert_agree(data)


# --- whole models ----------------------------------------------------------------------------


def _graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    pending = [model.graph]
    pending += [info.initialization for info in model.training_info]
    pending += [info.algorithm for info in model.training_info]
    while pending:
        graph = pending.pop()
        yield graph
        for node in graph.node:
            for attribute in node.attribute:
                pending += [attribute.g, *attribute.graphs]


def protobuf_loops(model: onnx.ModelProto) -> bool:
    nodes = [node for graph in _graphs(model) for node in graph.node]
    nodes += [node for function in model.functions for node in function.node]
    return any(node.op_type == "Loop" and node.domain in ("", "ai.onnx") for node in nodes)


def protobuf_external(model: onnx.ModelProto) -> bool:
    tensors = [t for graph in _graphs(model) for t in graph.initializer]
    for graph in _graphs(model):
        for node in graph.node:
            for attribute in node.attribute:
                tensors += [attribute.t, *attribute.tensors]
    return any(t.data_location == TensorProto.EXTERNAL or t.external_data for t in tensors)


def assert_models_agree(data: bytes) -> None:
    """Protobuf parses ``data``: npud finds what its message holds, or refuses the bytes."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        return  # onnxruntime refuses it too; npud may or may not walk that far
    try:
        found = onnx_proto.scan(BytesSource(data))
    except DamagedError:
        return
    assert (found.looping is not None) == protobuf_loops(model), data.hex()
    assert (found.external is not None) == protobuf_external(model), data.hex()


def _loop_model() -> bytes:
    return onnx_models.endless_loop()


def test_a_loop_behind_a_tag_over_32_bits_is_refused_not_missed() -> None:
    """The review's hidden Loop: the node's op_type tag written as 5 bytes with bits above
    32 set. npud read it whole (field 4 + 2^29: unknown, skipped) while onnxruntime kept
    its low 32 bits (op_type "Loop"); npud now refuses the file, as protobuf does."""
    model = onnx.load_from_string(_loop_model())
    loop = next(node for node in model.graph.node if node.op_type == "Loop")
    loop.op_type = "Xoop"  # a unique spelling to find its bytes; put back below
    data = model.SerializeToString().replace(b"\x22\x04Xoop", b"\x22\x04Loop")
    assert onnx_proto.find_looping_node(BytesSource(data)) is not None
    hidden = data.replace(b"\x22\x04Loop", _padded(4 << 3 | 2 | 1 << 32, 5) + b"\x04Loop")
    with pytest.raises(DecodeError):
        onnx.ModelProto().ParseFromString(hidden)
    with pytest.raises(DamagedError, match="tag over 32 bits"):
        onnx_proto.find_looping_node(BytesSource(hidden))


def test_external_data_behind_a_tag_over_32_bits_is_refused_not_missed() -> None:
    """A tensor whose data_location (EXTERNAL) has its tag written as 5 bytes with bits
    above 32 set: refused, as protobuf refuses it, not read as an unknown field."""
    tensor = TensorProto(name="w", data_type=TensorProto.UINT8, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    plain = tensor.SerializeToString()
    assert plain.endswith(b"\x70\x01")  # data_location = EXTERNAL, last
    hidden_tensor = TensorProto()
    hidden_tensor.ParseFromString(plain)
    data = onnx_models.model(
        [helper.make_node("Identity", ["w"], ["y"])],
        [],
        [onnx_models.tensor("y", "uint8", [4])],
        [hidden_tensor],
    )
    assert onnx_proto.find_external_data(BytesSource(data)) is not None
    assert data.count(plain) == 1
    hidden = data.replace(plain, plain[:-2] + _padded(0x70 | 1 << 33, 5) + b"\x01")
    # The lengths around it grew by 4 bytes: fix them as a writer would.
    hidden = _relength(hidden, data, plain)
    with pytest.raises(DecodeError):
        onnx.ModelProto().ParseFromString(hidden)
    with pytest.raises(DamagedError, match="tag over 32 bits"):
        onnx_proto.find_external_data(BytesSource(hidden))


def _relength(hidden: bytes, data: bytes, plain: bytes) -> bytes:
    """``data`` re-encoded with the tensor ``plain`` replaced as in ``hidden``: the model's
    graph and the graph's initializer field carry the new lengths."""
    model = onnx.ModelProto()
    model.ParseFromString(data)
    graph = model.graph
    graph.ClearField("initializer")
    new_tensor = hidden[hidden.index(plain[:-2]) : hidden.index(plain[:-2]) + len(plain) + 4]
    graph_bytes = graph.SerializeToString() + onnx_proto.length_field(5, new_tensor)
    model.ClearField("graph")
    return bytes(model.SerializeToString()) + onnx_proto.length_field(7, graph_bytes)


def _with_node_bytes(data: bytes, rewrite: Any) -> bytes:
    """The model ``data`` with each main-graph node's bytes passed through ``rewrite``,
    the graph and model lengths encoded anew around them."""
    model = onnx.ModelProto()
    model.ParseFromString(data)
    nodes = [rewrite(node.SerializeToString()) for node in model.graph.node]
    model.graph.ClearField("node")
    graph = model.graph.SerializeToString()
    graph += b"".join(onnx_proto.length_field(1, node) for node in nodes)
    model.ClearField("graph")
    return bytes(model.SerializeToString()) + onnx_proto.length_field(7, graph)


def test_a_loop_behind_padded_tags_and_lengths_is_found() -> None:
    """Tags and lengths padded to 5 bytes (non-canonical, and legal): protobuf reads
    the Loop, and so does npud."""
    padded = _with_node_bytes(
        _loop_model(),
        lambda node: node.replace(
            b"\x22\x04Loop", _padded(4 << 3 | 2, 5) + _padded(4, 5) + b"Loop"
        ),
    )
    model = onnx.ModelProto()
    model.ParseFromString(padded)
    assert protobuf_loops(model)
    assert onnx_proto.find_looping_node(BytesSource(padded)) is not None


def test_a_loop_behind_a_tag_over_32_bits_in_a_well_formed_file_is_refused() -> None:
    """The same Loop with every length right and its tag over 32 bits: protobuf refuses
    the file (onnxruntime would read "Loop"), npud refuses it too."""
    hidden = _with_node_bytes(
        _loop_model(),
        lambda node: node.replace(b"\x22\x04Loop", _padded(4 << 3 | 2 | 1 << 32, 5) + b"\x04Loop"),
    )
    with pytest.raises(DecodeError):
        onnx.ModelProto().ParseFromString(hidden)
    with pytest.raises(DamagedError, match="tag over 32 bits"):
        onnx_proto.scan(BytesSource(hidden))


@pytest.mark.parametrize(
    "make", [_loop_model, lambda: onnx_models.external_initializer("x.bin"), onnx_models.add_one]
)
def test_mutated_models_find_what_protobuf_finds(make: Any) -> None:
    data = make()
    for mutated in mutations(data, seed=len(data), count=1500):
        assert_models_agree(mutated)


def test_a_loop_in_a_subgraph_is_found_by_both() -> None:
    body = helper.make_graph(
        [helper.make_node("Loop", ["n", "c"], ["o"], name="inner")], "b", [], []
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    data = helper.make_model(helper.make_graph([node], "g", [], [])).SerializeToString()
    assert_models_agree(data)
    found = onnx_proto.find_looping_node(BytesSource(data))
    assert found is not None
    assert found.name == "inner"
    for mutated in mutations(data, seed=5, count=500):
        assert_models_agree(mutated)
