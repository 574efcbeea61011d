"""npud.formats.graph_pack: the container of several ONNX graphs sharing weights."""

from __future__ import annotations

import struct

import onnx
import pytest

from npud.formats import graph_pack, onnx_proto
from tests.emulator import onnx_models


def test_a_pack_reads_back_as_written_and_each_member_sees_the_shared_weights() -> None:
    data = onnx_models.two_graphs()
    source = onnx_proto.BytesSource(data)
    pack = graph_pack.read_pack(source)
    assert pack.names == ("prefill", "decode")
    assert graph_pack.is_pack(data)
    assert not graph_pack.is_pack(onnx_models.add_one())
    for index, graph in enumerate(pack.graphs):
        alone = onnx.load_from_string(source.read(graph.offset, graph.length))
        assert [t.name for t in alone.graph.initializer] == []  # stored once, in the pack
        merged = onnx.load_from_string(graph_pack.member_model(source, pack, index))
        assert [t.name for t in merged.graph.initializer] == ["w"]
        assert merged.graph.node == alone.graph.node  # the graph itself is untouched
    # Without shared weights a member is its ModelProto as it was.
    lone = graph_pack.write_pack([("g", onnx_models.add_one())])
    lone_pack = graph_pack.read_pack(onnx_proto.BytesSource(lone))
    member = graph_pack.member_model(onnx_proto.BytesSource(lone), lone_pack, 0)
    assert member == onnx_models.add_one()


def _header(version: int = graph_pack.VERSION, count: int = 1, shared: int = 0) -> bytes:
    return struct.pack("<8sIIQ", graph_pack.MAGIC, version, count, shared)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (graph_pack.MAGIC, "ends inside the graph pack's header"),
        (_header(version=2), "graph pack version 2; this npud reads version 1"),
        (_header(count=0), "holds no graph"),
        (_header() + struct.pack("<I", 2), "ends inside a graph's name"),
        (_header() + struct.pack("<I", 128), "a graph name of 128 bytes"),
        (_header() + struct.pack("<I", 2) + b"\xff\xfe", "a graph name is not UTF-8"),
        (_header() + struct.pack("<I", 2) + b"a\0" + bytes(8), "'a\\\\x00' holds a NUL"),
        (_header() + struct.pack("<I", 1) + b"a" + bytes(3), "ends inside the length of graph"),
        (_header(shared=2) + b"\x2a\x05", "the shared weights are damaged"),
    ],
    ids=[
        "cut",
        "version",
        "empty",
        "cut name",
        "long name",
        "utf-8",
        "nul",
        "cut length",
        "shared",
    ],
)
def test_damaged_packs(data: bytes, reason: str) -> None:
    with pytest.raises(graph_pack.PackError, match=reason) as damaged:
        graph_pack.read_pack(onnx_proto.BytesSource(data))
    assert not damaged.value.too_many


def test_more_graphs_than_a_model_holds() -> None:
    with pytest.raises(graph_pack.PackError, match="holds 9 graphs; a model has at most 8") as many:
        graph_pack.read_pack(onnx_proto.BytesSource(_header(count=9)))
    assert many.value.too_many


def test_the_shared_weights_walk_stops_at_its_budget() -> None:
    """A pack whose shared weights are 8 Ki empty initializers: their walk stops when the
    load's budget has run out, as every other walk of the file does."""
    pack = bytearray(graph_pack.write_pack([("g", onnx_models.add_one())]))
    shared = b"\x2a\x00" * 8192
    header = graph_pack._HEADER
    magic, version, count, _ = header.unpack_from(pack)
    data = header.pack(magic, version, count, len(shared)) + shared + bytes(pack[header.size :])
    source = onnx_proto.BytesSource(data)
    assert graph_pack.read_pack(source).shared_length == len(shared)
    with pytest.raises(onnx_proto.CheckTimeoutError):
        graph_pack.read_pack(source, onnx_proto.Budget(0))
