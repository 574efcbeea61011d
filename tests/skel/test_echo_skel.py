"""The host-built libecho_skel.so driven through echo_skel_handle_invoke with real remote_args."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pytest

from npu_protocol.aee import AEE
from tests.skel.remote_args import (
    OUTPUT_FILL,
    HandleIn,
    HandleOut,
    NullBuffer,
    Out,
    SkelLibrary,
    Slot,
    sc,
    u32s,
)

URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
ECHO = sc(2, 2, 1)


@pytest.fixture
def echo_handle(echo_skel: SkelLibrary) -> Iterator[int]:
    opened = echo_skel.open(URI)
    assert opened.rc == 0
    handle = opened.handles[2]
    assert handle
    yield handle
    assert echo_skel.close(handle) == 0


def echo(skel: SkelLibrary, handle: int, data: bytes, capacity: int) -> tuple[int, bytes | None]:
    result = skel.invoke(handle, ECHO, [u32s(len(data), capacity), data, Out(capacity)])
    return result.rc, result.buffers[2]


def test_echo_sc_is_the_documented_word() -> None:
    assert ECHO == 0x02020100


def test_open_echo_close_through_the_invoke_entry(echo_skel: SkelLibrary) -> None:
    opened = echo_skel.open(URI)
    assert opened.rc == 0
    handle = opened.handles[2]
    assert handle

    assert echo(echo_skel, handle, b"hello, dsp", 10) == (0, b"hello, dsp")

    assert echo_skel.close(handle) == 0
    assert echo(echo_skel, handle, b"x", 1)[0] == AEE.EINVHANDLE
    assert echo_skel.close(handle) == AEE.EINVHANDLE


def test_open_and_close_c_entries(echo_skel: SkelLibrary) -> None:
    echo_open = echo_skel.function(
        "echo_open", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)
    )
    echo_close = echo_skel.function("echo_close", ctypes.c_int, ctypes.c_uint64)
    handle = ctypes.c_uint64(0)
    assert echo_open(URI.encode(), ctypes.byref(handle)) == 0
    assert handle.value != 0
    assert echo(echo_skel, handle.value, b"abc", 3) == (0, b"abc")
    assert echo_open(None, ctypes.byref(handle)) == AEE.EBADPARM
    assert echo_close(handle.value) == 0
    assert echo_close(handle.value) == AEE.EINVHANDLE


def test_short_input_is_zero_filled_and_long_input_truncated(
    echo_skel: SkelLibrary, echo_handle: int
) -> None:
    assert echo(echo_skel, echo_handle, b"abc", 8) == (0, b"abc" + bytes(5))
    assert echo(echo_skel, echo_handle, b"abcdef", 2) == (0, b"ab")


def test_empty_buffers(echo_skel: SkelLibrary, echo_handle: int) -> None:
    slots: list[Slot] = [u32s(0, 0), NullBuffer(0), NullBuffer(0)]
    assert echo_skel.invoke(echo_handle, ECHO, slots).rc == 0
    assert echo(echo_skel, echo_handle, b"", 4) == (0, bytes(4))


def test_one_mebibyte_round_trip(echo_skel: SkelLibrary, echo_handle: int) -> None:
    data = bytes(range(256)) * 4096
    assert echo(echo_skel, echo_handle, data, len(data)) == (0, data)


BAD_ECHO_CALLS: list[tuple[str, int, list[Slot]]] = [
    ("one input buffer", sc(2, 1, 1), [u32s(1, 1), Out(1)]),
    ("three input buffers", sc(2, 3, 1), [u32s(1, 1), b"a", b"b", Out(1)]),
    ("two output buffers", sc(2, 2, 2), [u32s(1, 1), b"a", Out(1), Out(1)]),
    ("an input handle", sc(2, 2, 1, 1, 0), [u32s(1, 1), b"a", Out(1), HandleIn(7)]),
    ("an output handle", sc(2, 2, 1, 0, 1), [u32s(1, 1), b"a", Out(1), HandleOut()]),
    ("primIn too short", ECHO, [u32s(1), b"a", Out(1)]),
    ("primIn too long", ECHO, [u32s(1, 1, 0), b"a", Out(1)]),
    ("primIn NULL", ECHO, [NullBuffer(8), b"a", Out(1)]),
    ("in length above the buffer", ECHO, [u32s(6, 5), b"hello", Out(5)]),
    ("in length below the buffer", ECHO, [u32s(4, 5), b"hello", Out(5)]),
    ("capacity above the out buffer", ECHO, [u32s(5, 8), b"hello", Out(4)]),
    ("capacity below the out buffer", ECHO, [u32s(5, 2), b"hello", Out(4)]),
    ("NULL in buffer", ECHO, [u32s(5, 5), NullBuffer(5), Out(5)]),
    ("NULL out buffer", ECHO, [u32s(5, 5), b"hello", NullBuffer(5)]),
    ("length beyond int", ECHO, [u32s(0x80000000, 5), NullBuffer(0x80000000), Out(5)]),
]


@pytest.mark.parametrize(
    ("scalars", "slots"),
    [(s, c) for _, s, c in BAD_ECHO_CALLS],
    ids=[n for n, *_ in BAD_ECHO_CALLS],
)
def test_badly_marshalled_echo_is_refused_untouched(
    echo_skel: SkelLibrary, echo_handle: int, scalars: int, slots: list[Slot]
) -> None:
    result = echo_skel.invoke(echo_handle, scalars, slots)
    assert result.rc == AEE.EBADPARM
    for slot, after in zip(slots, result.buffers, strict=True):
        if isinstance(slot, Out):
            assert after == bytes([OUTPUT_FILL]) * slot.capacity


@pytest.mark.parametrize("method", [3, 4, 30, 31])
def test_unknown_method(echo_skel: SkelLibrary, echo_handle: int, method: int) -> None:
    slots: list[Slot] = [u32s(1, 1), b"a", Out(1)]
    assert echo_skel.invoke(echo_handle, sc(method, 2, 1), slots).rc == AEE.EUNSUPPORTED


BAD_OPENS: list[tuple[str, int, list[Slot]]] = [
    ("uri without NUL", sc(0, 2, 0, 0, 1), [u32s(3), b"abc", HandleOut()]),
    ("uri with an inner NUL", sc(0, 2, 0, 0, 1), [u32s(4), b"a\0b\0", HandleOut()]),
    ("empty uri", sc(0, 2, 0, 0, 1), [u32s(0), b"", HandleOut()]),
    ("uri length lies", sc(0, 2, 0, 0, 1), [u32s(9), b"abc\0", HandleOut()]),
    ("no handle slot", sc(0, 2, 0), [u32s(4), b"abc\0"]),
    ("handle as a buffer", sc(0, 2, 1), [u32s(4), b"abc\0", Out(8)]),
]


@pytest.mark.parametrize(
    ("scalars", "slots"), [(s, c) for _, s, c in BAD_OPENS], ids=[n for n, *_ in BAD_OPENS]
)
def test_bad_open_is_refused(echo_skel: SkelLibrary, scalars: int, slots: list[Slot]) -> None:
    result = echo_skel.invoke(0, scalars, slots)
    assert result.rc == AEE.EBADPARM
    assert result.handles[-1] in (None, 0)


def test_bad_close_is_refused(echo_skel: SkelLibrary, echo_handle: int) -> None:
    assert echo_skel.close(1 << 63) == AEE.EINVHANDLE  # serial handles never get there
    assert echo_skel.close(0) == AEE.EINVHANDLE
    as_buffer = echo_skel.invoke(
        0, sc(1, 1, 0), [u32s(echo_handle & 0xFFFFFFFF, echo_handle >> 32)]
    )
    assert as_buffer.rc == AEE.EBADPARM
    # The handle is still open after the refused closes (the fixture closes it).
    assert echo(echo_skel, echo_handle, b"ok", 2) == (0, b"ok")


def test_handle_table_is_bounded(echo_skel: SkelLibrary) -> None:
    handles: list[int] = []
    try:
        while True:
            opened = echo_skel.open(URI)
            if opened.rc != 0:
                break
            handle = opened.handles[2]
            assert handle
            handles.append(handle)
        assert opened.rc == AEE.EOUTOFHANDLES
        assert len(handles) == 16
        assert len(set(handles)) == 16
    finally:
        for handle in handles:
            assert echo_skel.close(handle) == 0
    reopened = echo_skel.open(URI)
    assert reopened.rc == 0
    assert reopened.handles[2] is not None
    assert echo_skel.close(reopened.handles[2]) == 0
