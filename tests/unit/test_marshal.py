"""Marshalling of remotectl calls and the listener's packed buffers."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.marshal import (
    PackedReader,
    c_string,
    from_c_string,
    pack_buffers,
    pack_lengths,
)
from npud.fastrpc.session import _remotectl as remotectl


def test_pack_buffers_aligns_data_to_eight_from_the_blob_start() -> None:
    blob = pack_buffers([b"abc", b"", b"xy"])
    # u32 3 | pad to 8 | "abc" | u32 0 (no data) | u32 2 | pad to 24 | "xy"
    expected = (
        struct.pack("<I", 3) + b"\0" * 4 + b"abc"
        + struct.pack("<I", 0)
        + struct.pack("<I", 2) + b"\0" * 5 + b"xy"
    )  # fmt: skip
    assert blob == expected
    reader = PackedReader(blob)
    assert reader.buffers(3) == [b"abc", b"", b"xy"]


@given(
    st.lists(st.binary(max_size=40), max_size=6), st.lists(st.integers(0, 2**32 - 1), max_size=4)
)
def test_packed_round_trip(buffers: list[bytes], lengths: list[int]) -> None:
    reader = PackedReader(pack_buffers(buffers) + pack_lengths(lengths))
    assert reader.buffers(len(buffers)) == buffers
    assert reader.lengths(len(lengths)) == lengths


@pytest.mark.parametrize(
    "blob",
    [b"", b"\x01\x00", struct.pack("<I", 100) + b"\0" * 4 + b"short", struct.pack("<I", 2**32 - 1)],
)
def test_truncated_or_hostile_blobs_are_refused(blob: bytes) -> None:
    with pytest.raises(ValueError, match="truncated"):
        PackedReader(blob).buffers(1)


def test_c_string_rules() -> None:
    assert c_string("abc", what="x", max_len=10) == b"abc\0"
    assert from_c_string(b"abc\0junk") == "abc"
    assert from_c_string(b"no-nul") == "no-nul"
    for bad, match in (("", "is empty"), ("a\0b", "NUL"), ("a" * 10, "limit is 9")):
        with pytest.raises(RpcError, match=match) as caught:
            c_string(bad, what="x", max_len=10)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_remotectl_open_layout() -> None:
    uri = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
    request = remotectl.pack_open(uri)
    assert request.name == uri.encode() + b"\0"
    assert request.prim_in == struct.pack("<II", len(uri) + 1, 255)
    assert remotectl.OPEN_SC == 0x00020200
    assert remotectl.CLOSE_SC == 0x01010200
    reply = remotectl.unpack_open(struct.pack("<Ii", 0x1234, -2147482562), b"oops\0\0")
    assert reply.handle == 0x1234
    assert reply.error == 0x8000043E
    assert reply.dlerror == "oops"


def test_remotectl_close_layout() -> None:
    assert remotectl.pack_close(0x1234) == struct.pack("<II", 0x1234, 255)
    assert remotectl.unpack_close(struct.pack("<i", 0), b"\0") == (0, "")


def test_overlong_uri_is_refused() -> None:
    with pytest.raises(RpcError, match="limit is 1023"):
        remotectl.pack_open("x" * 2000)
