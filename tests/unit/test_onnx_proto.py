"""The ONNX walker that finds external data: every place a tensor can hide, the schema
it follows checked against onnx's own descriptors, hostile bytes, and what it reads."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from npud.fastrpc.stubs.model_format import ModelFileError, check_model_file
from npud.formats import onnx_graph, onnx_proto
from npud.formats.onnx_proto import (
    BytesSource,
    DamagedError,
    ExternalData,
    FdSource,
    find_external_data,
)
from tests.emulator import onnx_models

TYPE_MESSAGE = 11  # google.protobuf TYPE_MESSAGE (protobuf ships no stubs)

PLACES = {
    "initializer": "initializer",
    "constant": "attribute tensor",
    "subgraph": "attribute tensor",
    "nested subgraph": "attribute tensor",
    "sparse initializer": "sparse values",
    "function": "attribute tensor",
    "training info": "attribute tensor",
}


@pytest.fixture
def fds() -> Iterator[list[int]]:
    opened: list[int] = []
    yield opened
    for fd in opened:
        os.close(fd)


def fd_source(tmp_path: Path, fds: list[int], data: bytes) -> FdSource:
    path = tmp_path / f"model{len(fds)}.onnx"
    path.write_bytes(data)
    fds.append(os.open(path, os.O_RDONLY))
    return FdSource(fds[-1], len(data))


def test_the_table_matches_every_path_to_a_tensor_in_onnx_schema() -> None:
    """The closure of messages that can (transitively) hold a TensorProto, computed from
    the installed onnx's descriptors, is exactly the walker's table."""
    assert onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].type == TYPE_MESSAGE
    holds: dict[str, bool] = {}

    def can_hold(message: Any, seen: frozenset[str]) -> bool:
        if message.name == "TensorProto":
            return True
        if message.name in seen:
            return False
        if message.name not in holds:
            holds[message.name] = any(
                field.type == TYPE_MESSAGE and can_hold(field.message_type, seen | {message.name})
                for field in message.fields
            )
        return holds[message.name]

    derived: dict[str, dict[int, str]] = {}
    pending: list[Any] = [onnx.ModelProto.DESCRIPTOR]
    while pending:
        message = pending.pop()
        if message.name in derived or message.name == "TensorProto":
            continue
        derived[message.name] = {}
        for field in message.fields:
            if field.type == TYPE_MESSAGE and can_hold(field.message_type, frozenset()):
                derived[message.name][field.number] = field.message_type.name
                pending.append(field.message_type)
    table = {
        message: {number: child for number, (child, _) in paths.items()}
        for message, paths in onnx_proto.TENSOR_PATHS.items()
    }
    assert table == derived


@pytest.mark.parametrize("place", sorted(PLACES))
def test_external_data_is_found_wherever_it_hides(
    tmp_path: Path, fds: list[int], place: str
) -> None:
    data = onnx_models.external_data_everywhere("../etc/shadow")[place]
    for source in (BytesSource(data), fd_source(tmp_path, fds, data)):
        found = find_external_data(source)
        assert found is not None
        assert (found.place, found.location) == (PLACES[place], "../etc/shadow")
        assert found.tensor in ("w", "v")


@pytest.mark.parametrize(
    "data",
    [
        onnx_models.add_one(),
        onnx_models.affine(),
        onnx_models.identity("float16"),
        onnx_models.many_inputs(32),
    ],
)
def test_self_contained_models_pass(data: bytes) -> None:
    assert find_external_data(BytesSource(data)) is None


def test_a_location_alone_or_a_flag_alone_is_enough() -> None:
    """data_location EXTERNAL without entries, and entries without the flag (which
    onnxruntime ignores today), are both refused: nothing in between is trusted."""
    flag_only = TensorProto(name="w", data_type=TensorProto.UINT8, dims=[1])
    flag_only.data_location = TensorProto.EXTERNAL
    entries_only = onnx_models.external_tensor("w", "secret")
    entries_only.data_location = TensorProto.DEFAULT
    for tensor, location in ((flag_only, ""), (entries_only, "secret")):
        data = onnx_models.model(
            [helper.make_node("Identity", ["w"], ["y"])],
            [],
            [onnx_models.tensor("y", "uint8", [1])],
            [tensor],
        )
        assert find_external_data(BytesSource(data)) == ExternalData("initializer", "w", location)


def test_weights_are_skipped_not_read(tmp_path: Path, fds: list[int]) -> None:
    """A model of 8 MiB of raw_data is walked by reading its headers: well under the
    file's size goes through pread."""
    weights = helper.make_tensor("big", TensorProto.UINT8, [8 << 20], b"\x01" * (8 << 20), raw=True)
    data = onnx_models.model(
        [helper.make_node("Identity", ["big"], ["y"])],
        [],
        [onnx_models.tensor("y", "uint8", [8 << 20])],
        [weights],
    )
    source = fd_source(tmp_path, fds, data)
    read = 0
    real = source.read

    def counted(offset: int, length: int) -> bytes:
        nonlocal read
        got = real(offset, length)
        read += len(got)
        return got

    source.read = counted  # type: ignore[method-assign]
    assert find_external_data(source) is None
    assert read < 64 * 1024


def test_reads_across_window_edges_agree_with_the_bytes(tmp_path: Path, fds: list[int]) -> None:
    data = bytes(range(256)) * 1024  # 256 KiB, four windows
    source = fd_source(tmp_path, fds, data)
    for offset, length in [(0, 1), (65535, 2), (65536, 70000), (200000, 100), (262140, 10)]:
        assert source.read(offset, length) == data[offset : offset + length]


def _message(field: int, payload: bytes) -> bytes:
    """One length-delimited field."""
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_nesting_is_bounded_without_recursion() -> None:
    """Graph -> node -> attribute -> graph, 10,000 levels deep: refused as damaged,
    never a RecursionError."""
    graph = b""
    for _ in range(10_000):
        graph = _message(1, _message(5, _message(6, graph)))  # node{attribute{g{...}}}
    data = b"\x08\x08" + _message(7, graph)
    with pytest.raises(DamagedError, match="nest deeper than 64"):
        find_external_data(BytesSource(data))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x08\x08" + _message(7, b"\x0a\x05abc"), "runs 2 bytes past its message"),
        (b"\x08\x08" + _message(7, b"\x0b"), "group 1 has no end"),
        (b"\x08\x08" + _message(7, b"\x0a"), "ends inside its header"),
        (b"\x08\x08" + _message(7, b"\x00"), "numbered 0"),
        (b"\x08" + b"\xff" * 10, "longer than 10 bytes"),
    ],
)
def test_damaged_bytes(data: bytes, reason: str) -> None:
    with pytest.raises(DamagedError, match=reason):
        find_external_data(BytesSource(data))


def test_a_long_location_is_quoted_short() -> None:
    data = onnx_models.external_initializer("a/" * 500)
    found = find_external_data(BytesSource(data))
    assert found is not None
    assert len(found.location) == onnx_proto.MAX_SHOWN + 3
    assert found.location.endswith("...")


def test_the_daemons_gate_refuses_with_a_reason(tmp_path: Path, fds: list[int]) -> None:
    data = onnx_models.external_initializer("tmp/secret.bin")
    path = tmp_path / "leaky.onnx"
    path.write_bytes(data)
    fds.append(os.open(path, os.O_RDONLY))
    with pytest.raises(ModelFileError, match="initializer 'w' names the external file") as caught:
        check_model_file(fds[-1], "emulator")
    assert caught.value.kind == "refused"
    assert "'tmp/secret.bin'" in str(caught.value)
    # Damage inside the graph (past the top-level walk) is "damaged", not a traceback.
    broken = b"\x08\x08" + _message(7, b"\x0a\x05abc")
    path.write_bytes(broken)
    fds.append(os.open(path, os.O_RDONLY))
    with pytest.raises(ModelFileError, match="damaged ONNX model: field 1 runs") as damaged:
        check_model_file(fds[-1], "emulator")
    assert damaged.value.kind == "damaged"


# --- loops ------------------------------------------------------------------------------


def _with_loop_in(where: str) -> bytes:
    """A model whose Loop sits in the main graph, an If branch, or a model-local function."""
    loop = onnx.load_from_string(onnx_models.endless_loop())
    if where == "graph":
        return bytes(loop.SerializeToString())
    if where == "subgraph":
        branch = helper.make_graph(
            list(loop.graph.node), "then", [], [helper.make_tensor_value_info("y", 1, [1])]
        )
        other = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y2"])],
            "else",
            [],
            [helper.make_tensor_value_info("y2", 1, [1])],
        )
        graph = helper.make_graph(
            [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)],
            "g",
            [helper.make_tensor_value_info("c", TensorProto.BOOL, []), *loop.graph.input],
            [helper.make_tensor_value_info("y", 1, [1])],
            list(loop.graph.initializer),
        )
        return bytes(helper.make_model(graph).SerializeToString())
    function = helper.make_function(
        "local", "spin", ["trips", "keep_going", "x"], ["y"], list(loop.graph.node), []
    )
    model = onnx.ModelProto()
    model.CopyFrom(loop)
    model.functions.append(function)
    del model.graph.node[:]
    model.graph.node.append(
        helper.make_node("spin", ["trips", "keep_going", "x"], ["y"], domain="local")
    )
    return bytes(model.SerializeToString())


@pytest.mark.parametrize("where", ["graph", "subgraph", "function"])
def test_a_loop_is_found_wherever_it_sits(where: str) -> None:
    found = onnx_proto.find_looping_node(BytesSource(_with_loop_in(where)))
    assert found is not None
    assert found.op_type == "Loop"


def test_models_without_a_loop_pass() -> None:
    for data in (onnx_models.affine(), onnx_models.add_one()):
        assert onnx_proto.find_looping_node(BytesSource(data)) is None


def test_an_op_named_loop_in_another_domain_is_not_onnx_loop() -> None:
    node = helper.make_node("Loop", ["x"], ["y"], domain="com.example", name="mine")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", 1, [1])],
        [helper.make_tensor_value_info("y", 1, [1])],
    )
    data = helper.make_model(graph).SerializeToString()
    assert onnx_proto.find_looping_node(BytesSource(data)) is None


def test_a_named_loop_is_described_by_its_name() -> None:
    model = onnx.load_from_string(onnx_models.endless_loop())
    model.graph.node[0].name = "spinner"
    found = onnx_proto.find_looping_node(BytesSource(model.SerializeToString()))
    assert found is not None
    assert found.describe() == "node 'spinner' (Loop)"


def test_check_model_file_refuses_a_loop(tmp_path: Path, fds: list[int]) -> None:
    source = fd_source(tmp_path, fds, onnx_models.endless_loop())
    with pytest.raises(ModelFileError, match="a Loop node: a loop whose trip count") as caught:
        check_model_file(fds[-1], "emulator")
    assert caught.value.kind == "refused"
    assert source.size > 0


def test_graph_io_reads_names_and_dimensions_and_leaves_initializers_out() -> None:
    """Old IR versions list initializers among the inputs: they are weights, not inputs.
    A dimension is its size, its dim_param name, or None (neither given)."""
    unknown = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    weight = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [unknown, weight],
        [out],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0] * 4)],
    )
    data = helper.make_model(graph).SerializeToString()
    assert onnx_proto.graph_io(onnx_proto.BytesSource(data)) == [
        onnx_proto.GraphTensor("input", "x", (None, 4)),
        onnx_proto.GraphTensor("output", "y", ("batch", 4)),
    ]


def test_graph_io_of_a_damaged_model_is_a_damaged_error() -> None:
    with pytest.raises(onnx_proto.DamagedError):
        onnx_proto.graph_io(onnx_proto.BytesSource(onnx_models.add_one()[:-3]))


def test_with_input_shapes_declares_exactly_the_given_inputs_shapes() -> None:
    """Only the named inputs' shapes change (a declared one replaced, a missing one
    added); everything else is what onnx parses from the original."""
    free = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, "n"])
    untouched = helper.make_tensor_value_info("u", TensorProto.FLOAT, ["m"])
    shapeless = helper.make_tensor_value_info("s", TensorProto.INT64, None)  # rank unknown
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
        "g",
        [free, untouched, shapeless],
        [out],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])],
        doc_string="kept",
    )
    original = helper.make_model(graph, producer_name="p")
    data = original.SerializeToString()
    rewritten = onnx_proto.with_input_shapes(
        onnx_proto.BytesSource(data), {"x": [3, 4], "s": [2], "nothing": [1]}
    )
    parsed = onnx.load_from_string(rewritten)
    onnx.checker.check_model(parsed)
    assert onnx_proto.graph_io(onnx_proto.BytesSource(rewritten)) == [
        onnx_proto.GraphTensor("input", "x", (3, 4)),
        onnx_proto.GraphTensor("input", "u", ("m",)),
        onnx_proto.GraphTensor("input", "s", (2,)),
        onnx_proto.GraphTensor("output", "y", (None, None)),
    ]
    assert parsed.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert parsed.graph.input[2].type.tensor_type.elem_type == TensorProto.INT64
    for proto in (parsed, original):  # all else the same
        for value in proto.graph.input:
            value.type.tensor_type.ClearField("shape")
    assert parsed == original
    assert onnx_proto.with_input_shapes(onnx_proto.BytesSource(data), {}) == data


def test_with_input_shapes_of_a_damaged_model_is_a_damaged_error() -> None:
    with pytest.raises(onnx_proto.DamagedError):
        onnx_proto.with_input_shapes(
            onnx_proto.BytesSource(onnx_models.add_one()[:-3]), {"x": [2, 4]}
        )


# --- bounds (issue 27: a file of tiny fields) ------------------------------------------------


def tiny_fields_model(size: int, *, top_level: bool = False) -> bytes:
    """About ``size`` bytes of a model made of 2-byte fields: empty nodes in its graph, or
    (``top_level``) empty doc_strings beside a small graph: the review's crafted file."""
    head = b"\x08\x08" + onnx_proto.length_field(8, b"\x10\x11")
    if top_level:
        return head + b"\x32\x00" * ((size - len(head)) // 2) + onnx_proto.length_field(7, b"")
    return head + onnx_proto.length_field(7, b"\x0a\x00" * ((size - len(head) - 6) // 2))


def test_a_walk_of_tiny_fields_holds_little_memory(tmp_path: Path, fds: list[int]) -> None:
    """A model of 128 Ki empty nodes: the walks keep one frame per level, never a list of
    a message's fields (they kept a Field per field: tens of MB per MiB of file)."""
    data = tiny_fields_model(256 * 1024)
    path = tmp_path / "tiny.onnx"
    path.write_bytes(data)
    fds.append(os.open(path, os.O_RDONLY))
    tracemalloc.start()
    try:
        check_model_file(fds[-1], "emulator")
        onnx_proto.graph_io(FdSource(fds[-1], len(data)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_model_file_is_read_in_windows_not_bytes(
    tmp_path: Path, fds: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of the checks is a window of the file (it was a pread per byte of each
    field header at the top level)."""
    data = tiny_fields_model(256 * 1024, top_level=True)
    path = tmp_path / "tiny.onnx"
    path.write_bytes(data)
    fds.append(os.open(path, os.O_RDONLY))
    calls = 0
    real = os.pread

    def counted(fd: int, length: int, offset: int) -> bytes:
        nonlocal calls
        calls += 1
        return real(fd, length, offset)

    monkeypatch.setattr(os, "pread", counted)
    check_model_file(fds[-1], "emulator")
    assert calls < 64  # 4 windows per walk


def test_a_budget_bounds_the_walks(tmp_path: Path, fds: list[int]) -> None:
    """A budget that has run out stops every walk at its next look at the clock; the
    load is refused as one not checked in time."""
    data = tiny_fields_model(64 * 1024)
    with pytest.raises(onnx_proto.CheckTimeoutError, match="longer than 0 s"):
        onnx_proto.scan(BytesSource(data), budget=onnx_proto.Budget(0))
    flat = tiny_fields_model(64 * 1024, top_level=True)
    with pytest.raises(onnx_proto.CheckTimeoutError):
        list(onnx_proto.fields(BytesSource(flat), 0, len(flat), onnx_proto.Budget(0)))
    path = tmp_path / "tiny.onnx"
    path.write_bytes(data)
    fds.append(os.open(path, os.O_RDONLY))
    with pytest.raises(ModelFileError, match="not checked in time") as caught:
        check_model_file(fds[-1], "emulator", onnx_proto.Budget(0))
    assert caught.value.kind == "refused"
    check_model_file(fds[-1], "emulator", onnx_proto.Budget(3600))  # the same, in time
    assert onnx_proto.scan(BytesSource(data), budget=onnx_proto.Budget(None)).looping is None


def test_graph_io_keeps_a_bounded_number_of_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    many = onnx_models.model(
        [helper.make_node("Identity", ["x0"], ["y"])],
        [onnx_models.tensor(f"x{i}", "float32", [1]) for i in range(5)],
        [onnx_models.tensor("y", "float32", [1])],
    )
    assert len(onnx_proto.graph_io(BytesSource(many))) == 6
    monkeypatch.setattr(onnx_graph, "MAX_GRAPH_IO", 5)  # where graph_io reads it
    with pytest.raises(onnx_proto.LimitError, match="more than 5 inputs and outputs"):
        onnx_proto.graph_io(BytesSource(many))
    wide = onnx_models.model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [onnx_models.tensor("x", "float32", [1] * 65)],
        [onnx_models.tensor("y", "float32", [1])],
    )
    with pytest.raises(onnx_proto.LimitError, match="input 'x' has more than 64 dimensions"):
        onnx_proto.graph_io(BytesSource(wide))


def test_groups_are_skipped_as_protobuf_skips_them() -> None:
    """An unknown group (wire types 3 and 4, unused by ONNX) in a node: skipped whole,
    the node's Loop still found after it."""
    group = b"\x9b\x01" + b"\x08\x01" + b"\x9c\x01"  # field 19, a varint inside
    node = group + b"\x22\x04Loop"
    data = b"\x08\x08" + onnx_proto.length_field(7, onnx_proto.length_field(1, node))
    found = onnx_proto.find_looping_node(BytesSource(data))
    assert found is not None
    assert found.op_type == "Loop"
