"""The reverse-RPC services and remotectl through npud.idl: the IDL-derived scalars and
layouts equal the constants both sides packed by hand before (issue 23, item 2), the
nested sequences they declare, and the one scalars word."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_protocol._scalars import make_scalars as protocol_make_scalars
from npud import idl
from npud.fastrpc.kernel import abi
from npud.sim import layout

# The hand-packed constants, as npud.fastrpc and npud.sim wrote them before.
OLD_SCALARS = {
    ("remotectl", "open"): 0x00020200,
    ("remotectl", "close"): 0x01010200,
    ("remotectl1", "open1"): 0x02020200,
    ("remotectl1", "close1"): 0x03010200,
    ("adsp_current_process1", "exit"): 0x02000000,
    ("adsp_listener", "init2"): 0x03000000,
    ("adsp_listener", "next2"): 0x04020200,
    ("adsp_listener", "get_in_bufs2"): 0x05010200,
    ("adsp_listener1", "init2"): 0x05000000,
    ("adsp_listener1", "next2"): 0x06020200,
    ("adsp_listener1", "get_in_bufs2"): 0x07010200,
    ("apps_std", "fopen"): 0x00030100,
    ("apps_std", "fclose"): 0x03010000,
    ("apps_std", "fread"): 0x04010200,
    ("apps_std", "fseek"): 0x09010000,
    ("apps_std", "flen"): 0x0A010100,
    ("apps_std", "fopen_with_env"): 0x13050100,
    ("apps_std", "fileExists"): 0x16020100,
    ("apps_std", "stat"): 0x1F020100,
    ("apps_std", "fopen_fd"): 0x1F030100,
    ("apps_std", "fclose_fd"): 0x1F010000,
    ("apps_std", "fopen_with_env_fd"): 0x1F050100,
}

# The primIn / primROut formats both sides packed with struct before.
OLD_LAYOUTS = {
    ("remotectl", "open"): ("<II", "<Ii"),
    ("remotectl", "close"): ("<II", "<i"),
    ("adsp_listener", "next2"): ("<IiII", "<IIII"),
    ("adsp_listener", "get_in_bufs2"): ("<III", "<I"),
    ("apps_std", "fopen_with_env"): ("<IIII", "<I"),
    ("apps_std", "fread"): ("<II", "<ii"),
    ("apps_std", "fseek"): ("<IiI", ""),
    ("apps_std", "flen"): ("<I", "<Q"),
    ("apps_std", "fclose"): ("<I", ""),
    ("apps_std", "stat"): ("<II", "<QQQIIQQqqqqqq"),
    ("apps_std", "fopen_fd"): ("<III", "<ii"),
    ("apps_std", "fclose_fd"): ("<Ii", ""),
    ("apps_std", "fopen_with_env_fd"): ("<IIIII", "<ii"),
}


@pytest.mark.parametrize(("interface", "method"), sorted(OLD_SCALARS))
def test_idl_scalars_equal_the_old_constants(interface: str, method: str) -> None:
    assert idl.load(interface).method(method).sc == OLD_SCALARS[interface, method]


@pytest.mark.parametrize(("interface", "method"), sorted(OLD_LAYOUTS))
def test_idl_prim_buffers_equal_the_old_struct_formats(interface: str, method: str) -> None:
    declared = idl.load(interface).method(method)
    prim_in, prim_rout = OLD_LAYOUTS[interface, method]
    assert declared.prim_in.size == struct.calcsize(prim_in)
    assert declared.prim_rout.size == (struct.calcsize(prim_rout) if prim_rout else 0)


def test_method_ids_of_apps_std_are_the_old_ones() -> None:
    apps_std = idl.load("apps_std")
    old = {"fopen": 0, "fclose": 3, "fread": 4, "fseek": 9, "flen": 10, "fopen_with_env": 19}
    old |= {"get_search_paths_with_env": 21, "fileExists": 22, "stat": 31, "fopen_fd": 34}
    old |= {"fclose_fd": 35, "fopen_with_env_fd": 36}
    assert {name: apps_std.method(name).index for name in old} == old


def test_remotectl_open_bytes_are_the_old_ones() -> None:
    uri = "file:///libecho_skel.so?echo_skel_handle_invoke"
    call = idl.load("remotectl").method("open").encode(name=uri, dlerror=255)
    assert call.inputs == (struct.pack("<II", len(uri) + 1, 255), uri.encode() + b"\0")
    assert call.outputs == (8, 255)


def test_next2_bytes_are_the_old_ones() -> None:
    next2 = idl.load("adsp_listener1").method("next2")
    call = next2.encode(prevCtx=7, prevResult=-1, prevbufs=b"abc", bufs=65536)
    assert call.inputs == (struct.pack("<IiII", 7, -1, 3, 65536), b"abc")
    reply = next2.decode([struct.pack("<IIII", 1, 2, 3, 4), b"data"])
    assert [reply.integer(n) for n in ("ctx", "handle", "sc", "bufsLenReq")] == [1, 2, 3, 4]


def test_escaped_apps_std_call_carries_its_id() -> None:
    stat = idl.load("apps_std").method("stat")
    call = stat.encode(name="/x")
    assert call.inputs == (struct.pack("<II", 31, 3), b"/x\0")


def test_called_resolves_the_escape() -> None:
    apps_std = idl.load("apps_std")
    fopen_fd = apps_std.called(31, struct.pack("<II", 34, 0))
    assert fopen_fd is not None
    assert fopen_fd.name == "fopen_fd"
    assert apps_std.called(4, b"").name == "fread"  # type: ignore[union-attr]
    assert apps_std.called(31, struct.pack("<I", 99)) is None
    assert apps_std.called(31, struct.pack("<I", 4)) is None  # ids below 31 never escape
    with pytest.raises(idl.MarshalError, match="without its index"):
        apps_std.called(31, b"\0")


def test_nested_sequences_parse_but_do_not_marshal() -> None:
    parsed = idl.parse(
        "interface n { long many(in sequence<sequence<octet>> bufs); long after(in uint32 x); };"
    )
    many, after = parsed.interfaces["n"].methods
    assert many.runtime_counted == "bufs"
    assert after.index == 1
    assert after.sc == idl.make_scalars(1, 1, 0)
    for attempt in (
        lambda: many.sc,
        lambda: many.encode(bufs=[]),
        lambda: many.decode([]),
        lambda: many.unpack([], []),
        lambda: many.pack_routs([], {}),
    ):
        with pytest.raises(idl.MarshalError, match="counted at run time"):
            attempt()


def test_nested_sequence_must_close() -> None:
    with pytest.raises(idl.IdlError, match="expected '>'"):
        idl.parse("interface n { long many(in sequence<sequence<octet> bufs); };")


@given(
    st.integers(0, 31),
    st.integers(0, 255),
    st.integers(0, 255),
)
def test_one_scalars_word_and_its_checked_copy(method: int, nin: int, nout: int) -> None:
    # npud.idl builds it; abi and the emulator call it; npu_protocol keeps a copy
    # because it installs without npud.
    word = idl.make_scalars(method, nin, nout)
    assert abi.remote_scalars_make(method, nin, nout) == word
    assert layout.make_scalars(method, nin, nout) == word
    assert protocol_make_scalars(method, nin, nout) == word


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ((32, 0, 0), "method=32"),
        ((0, 256, 0), "nin=256"),
        ((0, 0, -1), "nout=-1"),
        ((0, 0, 0, 16), "hin=16"),
    ],
)
def test_scalars_fields_out_of_range_are_refused(arguments: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        idl.make_scalars(*arguments)
    with pytest.raises(ValueError, match="outside"):
        idl.make_scalars(0, 0, 0, attr=8)


def test_prim_in_values_and_pack_prim_rout() -> None:
    close = idl.load("remotectl").method("close")
    values = close.prim_in_values(struct.pack("<II", 0x1234, 255) + b"extra")
    assert dict(values) == {"handle": 0x1234}  # the dlerror count is not a value
    with pytest.raises(idl.MarshalError, match="primIn has 4 bytes, expected 8"):
        close.prim_in_values(b"\0" * 4)
    assert close.pack_prim_rout({"nErr": -2}) == struct.pack("<i", -2)
    with pytest.raises(idl.MarshalError, match="rout nErr has no value"):
        close.pack_prim_rout({})
    with pytest.raises(idl.MarshalError, match="does not fit in int32"):
        close.pack_prim_rout({"nErr": 0x80000000})


def test_pack_routs_refuses_a_primrout_of_another_size() -> None:
    close = idl.load("remotectl").method("close")
    outputs = [memoryview(bytearray(5)), memoryview(bytearray(1))]
    with pytest.raises(idl.MarshalError, match="primROut must be 4 bytes"):
        close.pack_routs(outputs, {"nErr": 0})


ITEMS = """
interface files {
   long list(in string where, rout sequence<sequence<char>> names, rout uint32 count);
   long blobs(rout sequence<uint16> sizes, rout sequence<sequence<uint16>> parts);
};
"""


def test_search_paths_bytes_are_the_old_ones() -> None:
    method = idl.load("apps_std").method("get_search_paths_with_env")
    call = method.encode(envvarname="ADSP_LIBRARY_PATH", delim=";", paths=[256] * 8)
    env, delim = b"ADSP_LIBRARY_PATH\0", b";\0"
    old_prim = struct.pack("<III", len(env), len(delim), 8)
    assert call.inputs == (old_prim, env, delim, struct.pack("<8I", *([256] * 8)))
    assert call.outputs == (8, *([256] * 8))
    assert call.sc == abi.remote_scalars_make(21, 4, 1 + 8) == method.sc_for(8)
    reply = [struct.pack("<IH2x", 2, 9), b"/a/cdsp\0".ljust(256, b"\0"), b"/a\0".ljust(256, b"\0")]
    values = method.decode(reply)
    assert (values.integer("numPaths"), values.integer("maxPathLen")) == (2, 9)
    assert values.texts("paths") == ["/a/cdsp", "/a"]


def test_rout_items_both_sides() -> None:
    listing = idl.parse(ITEMS).interfaces["files"].method("list")
    with pytest.raises(idl.MarshalError, match="depends on how many names"):
        _ = listing.sc
    call = listing.encode(where="/x", names=[4, 0, 2])
    assert call.outputs == (4, 4, 0, 2)  # primROut, then one buffer per item
    inputs = [memoryview(bytes(item)) for item in call.inputs if isinstance(item, bytes)]
    outputs = [memoryview(bytearray(size)) for size in call.outputs if isinstance(size, int)]
    values = listing.unpack(inputs, outputs)
    names = values["names"]
    assert isinstance(names, list)
    assert [len(view) for view in names if isinstance(view, memoryview)] == [4, 0, 2]
    listing.pack_routs(outputs, {"count": 2, "names": ["abc", b"", "z"]})
    decoded = listing.decode([bytes(view) for view in outputs])
    assert decoded.texts("names") == ["abc", "", "z"]
    assert decoded.integer("count") == 2
    with pytest.raises(idl.MarshalError, match="do not fit"):
        listing.pack_routs(outputs, {"count": 0, "names": ["abcd"]})  # no room for the NUL
    with pytest.raises(idl.MarshalError, match="1 bytes do not fit in 0"):
        listing.pack_routs(outputs, {"count": 0, "names": ["abc", ""]})  # "" is its NUL
    with pytest.raises(idl.MarshalError, match="3 buffers"):
        listing.pack_routs(outputs, {"count": 0, "names": ["a", "b", "c", "d"]})


def test_rout_items_after_another_sequence() -> None:
    blobs = idl.parse(ITEMS).interfaces["files"].method("blobs")
    call = blobs.encode(sizes=2, parts=[1, 3])
    assert call.inputs == (struct.pack("<II", 2, 2), struct.pack("<II", 1, 3))
    assert call.outputs == (4, 2, 6)
    assert call.sc == idl.make_scalars(1, 2, 3)
    decoded = blobs.decode([b"\1\0\2\0", b"\7\0", b"\1\0\2\0\3\0"])
    assert decoded.integers("sizes") == [1, 2]
    assert decoded["parts"] == [[7], [1, 2, 3]]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda i, o: ([*i[:-1], memoryview(b"\0" * 8)], o), "capacities take 8 bytes"),
        (lambda i, o: (i, o[:-1]), "got 2 buffers"),
        (lambda i, o: (i, [*o[:-1], memoryview(bytearray(3))]), r"names\[2\]: its capacity is 2"),
        (lambda i, o: (i[:-1], o), "takes 3 in"),
    ],
)
def test_rout_items_refused_when_the_buffers_disagree(change: object, match: str) -> None:
    listing = idl.parse(ITEMS).interfaces["files"].method("list")
    call = listing.encode(where="/x", names=[4, 0, 2])
    inputs = [memoryview(bytes(item)) for item in call.inputs if isinstance(item, bytes)]
    outputs = [memoryview(bytearray(size)) for size in call.outputs if isinstance(size, int)]
    assert callable(change)
    bad_inputs, bad_outputs = change(inputs, outputs)
    with pytest.raises(idl.MarshalError, match=match):
        listing.unpack(bad_inputs, bad_outputs)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "interface b { long m(rout sequence<sequence<octet>> a, rout sequence<octet> c); };",
            "a must come after every sequence and string",
        ),
        (
            "interface b { long m(rout sequence<sequence<octet>> a,"
            " rout sequence<sequence<octet>> c); };",
            "at most one rout sequence of sequences",
        ),
    ],
)
def test_rout_items_subset_rules(text: str, match: str) -> None:
    with pytest.raises(idl.IdlError, match=match):
        idl.parse(text)


def test_rout_items_refuse_bad_capacities_and_stray_outputs() -> None:
    listing = idl.parse(ITEMS).interfaces["files"].method("list")
    for bad in (["4"], [-1], 4, [True]):
        with pytest.raises(idl.MarshalError, match="names"):
            listing.encode(where="/x", names=bad)
    with pytest.raises(idl.MarshalError, match="no rout sequence of sequences"):
        idl.load("remotectl").method("open").sc_for(2)
    close = idl.load("remotectl").method("close")
    with pytest.raises(idl.MarshalError, match="output buffers"):
        close.decode([b"\0" * 4, b"", b"extra"])
