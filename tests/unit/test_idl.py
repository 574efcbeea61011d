"""The IDL parser and the qaic marshalling it derives: layouts, both directions, every refusal."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npud import idl
from npud.fastrpc.kernel import abi

MIXED = """
// apps_mem_request_map64's shape (reference 5.4): primIn at 0, 4, 8, 16, 24; 32 bytes
#include "AEEStdDef.idl"
/* a block
   comment */
struct pair { uint8 tag; uint64 value; };
interface mem {
   long map64(in long heapid, in uint32 lflags, in uint32 rflags, in uint64 vin,
              in int64 len, rout uint64 vapps, rout uint64 vadsp);
   long put(in pair p, in sequence<pair> many, rout pair back, rout sequence<uint16> shorts);
   AEEResult text(in string s, rout sequence<char> reply);
   long nothing();
};
"""


@dataclass(frozen=True)
class Ref:
    """A stand-in for a DMA-BUF slice: the stub passes it through by its length."""

    length: int


@pytest.fixture(scope="module")
def mem() -> idl.Interface:
    return idl.parse(MIXED).interfaces["mem"]


def test_plain_interface_numbers_methods_from_zero(mem: idl.Interface) -> None:
    assert not mem.domain
    assert [(m.index, m.name) for m in mem.methods] == [
        (0, "map64"),
        (1, "put"),
        (2, "text"),
        (3, "nothing"),
    ]
    assert mem.user_methods == mem.methods
    assert mem.by_index(3) is mem.method("nothing")
    assert mem.by_index(9) is None
    with pytest.raises(KeyError):
        mem.method("absent")


def test_natural_alignment_in_prim_buffers(mem: idl.Interface) -> None:
    map64 = mem.method("map64")
    assert [s.offset for s in map64.prim_in.slots] == [0, 4, 8, 16, 24]
    assert (map64.prim_in.size, map64.prim_rout.size) == (32, 16)
    assert map64.sc == abi.remote_scalars_make(0, 1, 1)
    call = map64.encode(heapid=-1, lflags=1, rflags=2, vin=3, len=-4)
    assert call.inputs == (struct.pack("<iIIxxxxQq", -1, 1, 2, 3, -4),)
    assert call.outputs == (16,)
    assert dict(map64.decode([struct.pack("<QQ", 5, 6)])) == {"vapps": 5, "vadsp": 6}


def test_structs_in_prim_buffers_and_sequences(mem: idl.Interface) -> None:
    pair = idl.parse(MIXED).structs["pair"]
    assert (pair.size, pair.align, [m.offset for m in pair.members]) == (16, 8, [0, 8])
    put = mem.method("put")
    # primIn: p (a 16-byte struct at 0), count(many) at 16, count(shorts) at 20 -> 24
    assert [(s.param, s.kind, s.offset) for s in put.prim_in.slots] == [
        ("p", "value", 0),
        ("many", "count", 16),
        ("shorts", "count", 20),
    ]
    assert put.prim_in.size == 24
    assert put.sc == abi.remote_scalars_make(1, 2, 2)
    call = put.encode(p={"tag": 1, "value": 2}, many=[{"tag": 3}, {"value": 4}], shorts=3)
    prim, many = call.inputs
    assert prim == struct.pack("<B7xQII", 1, 2, 2, 3)
    assert many == struct.pack("<B7xQB7xQ", 3, 0, 0, 4)
    assert call.outputs == (16, 6)
    back = put.decode([struct.pack("<B7xQ", 9, 10), struct.pack("<3H", 1, 2, 3)])
    record = back["back"]
    assert isinstance(record, idl.Values)
    assert (record.integer("tag"), record.integer("value")) == (9, 10)
    assert back.integers("shorts") == [1, 2, 3]


def test_strings_count_their_nul_and_char_sequences_are_text(mem: idl.Interface) -> None:
    text = mem.method("text")
    call = text.encode(s="héllo", reply=16)
    assert call.inputs == (struct.pack("<II", 7, 16), "héllo".encode() + b"\0")
    assert call.outputs == (16,)
    assert text.decode([b"ok\0junk" + bytes(9)]).text("reply") == "ok"


def test_a_method_without_arguments_has_no_buffers(mem: idl.Interface) -> None:
    nothing = mem.method("nothing")
    assert nothing.sc == abi.remote_scalars_make(3, 0, 0)
    assert nothing.encode() == idl.EncodedCall(nothing.sc, (), ())
    assert dict(nothing.decode([])) == {}


def test_buffer_refs_pass_through_by_length() -> None:
    echo = idl.load("echo").method("echo")
    source, target = Ref(5), Ref(8)
    call = echo.encode(in_buf=source, out_buf=target)
    assert call.inputs == (struct.pack("<II", 5, 8), source)
    assert call.outputs == (target,)
    assert echo.decode([None]) == idl.Values({"out_buf": None})


def test_methods_from_31_travel_in_the_escape() -> None:
    body = "\n".join(f"long m{i}(in uint32 x);" for i in range(33))
    wide = idl.parse(f"interface wide : remote_handle64 {{ {body} }};").interfaces["wide"]
    m28 = wide.method("m28")  # index 30: still in the word
    assert (m28.index, m28.sc) == (30, abi.remote_scalars_make(30, 1, 0))
    m29 = wide.method("m29")  # index 31: the escape, real index first in primIn
    assert (m29.index, m29.sc) == (31, abi.remote_scalars_make(31, 1, 0))
    assert m29.encode(x=7).inputs == (struct.pack("<II", 31, 7),)
    m32 = wide.method("m32")
    assert m32.encode(x=8).inputs == (struct.pack("<II", 34, 8),)
    assert dict(m32.unpack([memoryview(struct.pack("<II", 34, 8))], [])) == {"x": 8}


def test_domain_interfaces_inherit_open_and_close() -> None:
    portal = idl.load("portal_qnn")
    assert portal.domain
    assert [m.name for m in portal.methods[:2]] == ["open", "close"]
    assert portal.user_methods[0].name == "model_load"
    assert (portal.method("open").outhandles, portal.method("close").inhandles) == (1, 1)
    with pytest.raises(idl.MarshalError, match="remotectl runs it"):
        portal.method("open").encode(uri="x")


def test_skel_side_unpack_and_pack_routs() -> None:
    load = idl.load("portal_qnn").method("model_load")
    call = load.encode(model_uri="model.onnx")
    prim_rout = memoryview(bytearray(12))
    inputs = [memoryview(b) for b in call.inputs if isinstance(b, bytes)]
    values = load.unpack(inputs, [prim_rout])
    assert values.text("model_uri") == "model.onnx"
    load.pack_routs([prim_rout], {"model_index": 1, "num_graphs": 1, "qnn_status": 0})
    assert bytes(prim_rout) == struct.pack("<III", 1, 1, 0)
    with pytest.raises(idl.MarshalError, match="has no value"):
        load.pack_routs([prim_rout], {"model_index": 1})

    info = idl.load("portal_qnn").method("graph_info")
    call = info.encode(model_index=0, graph_index=0, inputs=2, outputs=1)
    outs = [memoryview(bytearray(size)) for size in call.outputs if isinstance(size, int)]
    outs[1][:] = b"\xff" * len(outs[1])
    args = info.unpack([memoryview(call.inputs[0])], outs)  # type: ignore[arg-type]
    assert args.view("inputs") is outs[1]
    record = {"data_type": 0x232, "rank": 2, "dims": [1, 576], "bytes": 2304, "name": "input"}
    info.pack_routs(outs, {"num_inputs": 1, "num_outputs": 0, "inputs": [record]})
    decoded = info.decode([bytes(o) for o in outs])
    first, second = decoded.records("inputs")
    assert first.text("name") == "input"
    assert first.integers("dims") == [1, 576, 0, 0, 0, 0, 0, 0]
    assert second.integer("bytes") == 0  # the rest of the sequence is zeroed
    with pytest.raises(idl.MarshalError, match="do not fit"):
        info.pack_routs(outs, {"num_inputs": 0, "num_outputs": 0, "outputs": [record, record]})


SKEL_REFUSALS = [
    ("counts", [b"\0" * 8, b"ab"], []),
    ("primIn short", [b"\0" * 4, b"ab"], [b"\0" * 2]),
    ("in length lies", [struct.pack("<II", 3, 2), b"ab"], [b"\0" * 2]),
    ("out length lies", [struct.pack("<II", 2, 4), b"ab"], [b"\0" * 2]),
]


@pytest.mark.parametrize(
    ("name", "inputs", "outputs"), SKEL_REFUSALS, ids=[r[0] for r in SKEL_REFUSALS]
)
def test_skel_side_refuses_mismatched_buffers(
    name: str, inputs: list[bytes], outputs: list[bytes]
) -> None:
    echo = idl.load("echo").method("echo")
    with pytest.raises(idl.MarshalError):
        echo.unpack([memoryview(b) for b in inputs], [memoryview(bytearray(b)) for b in outputs])


@pytest.mark.parametrize(
    "data", [b"\0" * 3, b"ab", b"a\0b\0", b"abc\0", b""], ids=["nuls", "no-nul", "inner", "x", "e"]
)
def test_skel_side_string_rules(data: bytes) -> None:
    load = idl.load("portal_qnn").method("model_load")
    prim = struct.pack("<I", len(data) + (1 if data == b"abc\0" else 0))
    with pytest.raises(idl.MarshalError):
        load.unpack([memoryview(prim), memoryview(data)], [memoryview(bytearray(12))])


def test_primrout_must_be_exact() -> None:
    execute = idl.load("portal_qnn").method("execute")
    with pytest.raises(idl.MarshalError, match="primROut"):
        execute.unpack([memoryview(bytes(8))], [memoryview(bytearray(8))])
    with pytest.raises(idl.MarshalError, match="primROut"):
        execute.decode([bytes(8)])
    with pytest.raises(idl.MarshalError, match="output buffers"):
        execute.decode([])


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"model_index": 0}, "missing"),
        (
            {"model_index": 0, "graph_index": 0, "tensor_index": 0, "data": b"", "x": 1},
            "unexpected",
        ),
        ({"model_index": -1, "graph_index": 0, "tensor_index": 0, "data": b""}, "does not fit"),
        ({"model_index": 1 << 32, "graph_index": 0, "tensor_index": 0, "data": b""}, "fit"),
        ({"model_index": True, "graph_index": 0, "tensor_index": 0, "data": b""}, "integer"),
        ({"model_index": "0", "graph_index": 0, "tensor_index": 0, "data": b""}, "integer"),
        ({"model_index": 0, "graph_index": 0, "tensor_index": 0, "data": "text"}, "list"),
        ({"model_index": 0, "graph_index": 0, "tensor_index": 0, "data": [256]}, "fit"),
    ],
)
def test_stub_side_refuses_bad_values(arguments: dict[str, object], match: str) -> None:
    with pytest.raises(idl.MarshalError, match=match):
        idl.load("portal_qnn").method("set_input").encode(**arguments)


def test_stub_side_refuses_bad_capacities_strings_and_records() -> None:
    portal = idl.load("portal_qnn")
    output = portal.method("get_output")
    for capacity in (-1, 1.5, "8", None, 1 << 32):
        with pytest.raises(idl.MarshalError):
            output.encode(model_index=0, graph_index=0, tensor_index=0, data=capacity)
    with pytest.raises(idl.MarshalError, match="NUL"):
        portal.method("model_load").encode(model_uri="a\0b")
    with pytest.raises(idl.MarshalError, match="text"):
        portal.method("model_load").encode(model_uri=b"bytes")
    spec = idl.parse((Path(idl.IDL_DIR) / "portal_qnn.idl").read_text()).structs[
        "portal_qnn_tensor_spec"
    ]
    buffer = bytearray(spec.size)
    with pytest.raises(idl.MarshalError, match="at most 127"):
        spec.pack_into(buffer, 0, {"name": "n" * 128}, "spec")
    with pytest.raises(idl.MarshalError, match="at most 8"):
        spec.pack_into(buffer, 0, {"dims": [1] * 9}, "spec")
    with pytest.raises(idl.MarshalError, match="no member"):
        spec.pack_into(buffer, 0, {"colour": 1}, "spec")
    with pytest.raises(idl.MarshalError, match="mapping"):
        spec.pack_into(buffer, 0, [1, 2], "spec")
    wide = idl.parse("interface w { long f(in sequence<uint32> xs); };").interfaces["w"]
    with pytest.raises(idl.MarshalError, match="whole number"):
        wide.method("f").encode(xs=b"\0" * 6)
    with pytest.raises(idl.MarshalError, match="whole number"):
        wide.method("f").encode(xs=Ref(6))


@given(st.lists(st.integers(0, 2**32 - 1), max_size=8), st.binary(max_size=64))
def test_stub_and_skel_sides_agree(seeds: list[int], blob: bytes) -> None:
    source = "interface t { long f(in sequence<uint32> xs, in sequence<octet> b, rout uint32 n); };"
    method = idl.parse(source).interfaces["t"].method("f")
    call = method.encode(xs=seeds, b=blob)
    inputs = [memoryview(x) for x in call.inputs if isinstance(x, bytes)]
    values = method.unpack(inputs, [memoryview(bytearray(4))])
    assert list(values.view("xs").cast("I")) == seeds
    assert bytes(values.view("b")) == blob


PARSE_ERRORS = [
    ("interface x { long f(inrout uint32 a); };", ":1: parameter direction 'inrout'"),
    ("interface x { void f(); };", "methods return long"),
    ("interface x : other { };", "only remote_handle64"),
    ("interface x { long f(rout string s); };", "rout string is not supported"),
    ("interface x { long f(in mystery a); };", "unknown type 'mystery'"),
    ("struct s { sequence<uint8> a; };", "struct members must be primitives"),
    ("struct s { uint8 a[0]; };", "array size must be positive"),
    ("struct s { uint8 a; uint8 a; };", "declared twice"),
    ("struct s { };", "is empty"),
    ("struct s { uint8 a; }; struct s { uint8 b; };", "defined twice"),
    ("interface x { long f(); long f(); };", "x.f is declared twice"),
    ("interface x { long f(in uint8 a, in uint8 a); };", "used twice"),
    ("interface x { long f(); };\ninterface x { long g(); };", "declared twice"),
    ("typedef uint8 byte;", "'typedef' is outside the supported IDL subset"),
    ("interface x { long f() }", "expected ';'"),
    ("interface x {\n long f(in uint8 @); };", ":2: unexpected character '@'"),
    ("/* open", "unterminated comment"),
    ("interface x { long f(", "at the end: expected 'in' or 'rout'"),
    ("struct s { uint8 a[", "unexpected end of file"),
    ("struct s { uint8 a[n]; };", "expected a number"),
]


@pytest.mark.parametrize(("text", "message"), PARSE_ERRORS, ids=[e[1] for e in PARSE_ERRORS])
def test_parse_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(idl.IdlError, match=message.replace("(", r"\(").replace(")", r"\)")):
        idl.parse(text)


def test_spellings_of_the_sized_types() -> None:
    text = """interface t { long f(in unsigned long a, in long b, in unsigned long long c,
        in long long d, in short e, in unsigned short g, in unsigned int h, in int i,
        in unsigned char j, in octet k, in boolean l, in float m, in double n); };"""
    method = idl.parse(text).interfaces["t"].method("f")
    names = [s.type.name for s in method.prim_in.slots]
    assert names == [
        "uint32",
        "int32",
        "uint64",
        "int64",
        "int16",
        "uint16",
        "uint32",
        "int32",
        "uint8",
        "octet",
        "boolean",
        "float",
        "double",
    ]
    call = method.encode(a=1, b=-1, c=2, d=-2, e=-3, g=3, h=4, i=-4, j=5, k=6, l=1, m=0.5, n=2.5)
    assert len(call.inputs[0]) == method.prim_in.size == 56  # type: ignore[arg-type]
    with pytest.raises(idl.MarshalError, match="number"):
        method.encode(a=1, b=-1, c=2, d=-2, e=-3, g=3, h=4, i=-4, j=5, k=6, l=1, m="x", n=2.5)


def test_load_reads_the_shipped_files(tmp_path: Path) -> None:
    assert idl.IDL_DIR.joinpath("portal_qnn.idl").is_file()
    (tmp_path / "other.idl").write_text("interface different { long f(); };")
    with pytest.raises(idl.IdlError, match="does not declare interface other"):
        idl.load("other", directory=tmp_path)
