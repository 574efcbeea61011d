"""Frames and fd accounting, fed whole, one byte at a time, and with trailing bytes."""

from __future__ import annotations

import pytest

from npu_protocol import FRAME_HEADER_SIZE, MAX_FDS_PER_FRAME, ErrorCode, RemoteProtocolError
from npu_protocol._framing import Frame, FrameReader, encode_frame_header
from tests.protocol.helpers import chunks, frame

CHUNK_SIZES = [None, 1, 3, 7]
"""None: the whole input in one receive; 1: one byte per call."""


def reader(limit: int = 1024) -> FrameReader:
    return FrameReader(max_payload=limit)


def frames_from(r: FrameReader) -> list[Frame]:
    found = []
    while (f := r.next_frame()) is not None:
        found.append(f)
    return found


def test_header_layout_is_little_endian_with_magic_and_counts() -> None:
    assert encode_frame_header(0x01020304, 1) == b"NP\x01\x00\x04\x03\x02\x01"
    assert len(encode_frame_header(5, 0)) == FRAME_HEADER_SIZE


@pytest.mark.parametrize("chunk", CHUNK_SIZES)
def test_one_frame_arrives_whole_only_when_complete(chunk: int | None) -> None:
    r = reader()
    data = frame(b"\x80")
    pieces = list(chunks(data, chunk))
    for piece in pieces[:-1]:
        r.feed(piece)
        assert r.next_frame() is None
    r.feed(pieces[-1])
    assert r.next_frame() == Frame(b"\x80", ())
    assert r.next_frame() is None
    assert r.buffered == 0


@pytest.mark.parametrize("chunk", CHUNK_SIZES)
def test_back_to_back_frames_and_trailing_bytes(chunk: int | None) -> None:
    stream = frame(b"one") + frame(b"two!") + frame(b"3") + b"NP\x00"  # a partial fourth header
    r = reader()
    got: list[Frame] = []
    for piece in chunks(stream, chunk):
        r.feed(piece)
        got += frames_from(r)
    assert [f.payload for f in got] == [b"one", b"two!", b"3"]
    assert r.buffered == 3  # exactly the trailing bytes, nothing consumed from them


def test_exactly_one_frame_per_call() -> None:
    r = reader()
    r.feed(frame(b"a") + frame(b"b"))
    assert r.next_frame() == Frame(b"a", ())
    assert r.buffered == len(frame(b"b"))
    assert r.next_frame() == Frame(b"b", ())


def test_oversize_length_is_refused_from_the_header_alone() -> None:
    r = reader(limit=1024)
    r.feed(encode_frame_header(0xFFFF_FFFF, 0))  # 4 GiB announced, no payload sent
    with pytest.raises(RemoteProtocolError) as info:
        r.next_frame()
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert info.value.fields == {"size": 0xFFFF_FFFF, "limit": 1024}
    assert r.buffered == FRAME_HEADER_SIZE  # nothing was allocated for the payload


def test_limit_is_inclusive() -> None:
    r = reader(limit=4)
    r.feed(frame(b"1234"))
    assert r.next_frame() == Frame(b"1234", ())
    r.feed(frame(b"12345"))
    with pytest.raises(RemoteProtocolError, match="frame of 5 bytes exceeds the limit of 4 bytes"):
        r.next_frame()


@pytest.mark.parametrize(
    ("data", "code", "text"),
    [
        (frame(b"x", magic=b"HT"), ErrorCode.BAD_FRAME_HEADER, "magic b'HT' is not b'NP'"),
        (frame(b"x", reserved=1), ErrorCode.BAD_FRAME_HEADER, "reserved byte is 0x01, not 0"),
        (frame(b""), ErrorCode.BAD_FRAME_HEADER, "empty payload"),
        (
            frame(b"x", fd_count=MAX_FDS_PER_FRAME + 1),
            ErrorCode.TOO_MANY_FDS,
            f"frame declares {MAX_FDS_PER_FRAME + 1} fds, more than the limit of {MAX_FDS_PER_FRAME}",
        ),
        (b"GET / HTTP/1.1\r\n", ErrorCode.BAD_FRAME_HEADER, "magic b'GE'"),
    ],
)
def test_bad_headers_are_refused(data: bytes, code: ErrorCode, text: str) -> None:
    r = reader()
    r.feed(data)
    with pytest.raises(RemoteProtocolError) as info:
        r.next_frame()
    assert info.value.code is code
    assert text in str(info.value)


@pytest.mark.parametrize(
    "cut", [1, FRAME_HEADER_SIZE - 1, FRAME_HEADER_SIZE, FRAME_HEADER_SIZE + 2]
)
def test_end_of_stream_inside_a_frame_is_truncation(cut: int) -> None:
    r = reader()
    r.feed(frame(b"abcd")[:cut])
    assert r.next_frame() is None
    r.feed(b"")
    with pytest.raises(RemoteProtocolError, match=f"middle of a frame \\({cut} bytes buffered\\)"):
        r.next_frame()


def test_end_of_stream_between_frames_is_clean() -> None:
    r = reader()
    r.feed(frame(b"a"))
    r.feed(b"")
    assert r.next_frame() == Frame(b"a", ())
    assert r.next_frame() is None
    assert r.at_eof
    with pytest.raises(RuntimeError):
        r.feed(b"more")


# --- fds -------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", CHUNK_SIZES)
def test_fds_ride_with_the_first_byte(chunk: int | None) -> None:
    r = reader()
    pieces = list(chunks(frame(b"alloc", fd_count=1), chunk))
    r.feed(pieces[0], [7])
    for piece in pieces[1:]:
        r.feed(piece)
    assert r.next_frame() == Frame(b"alloc", (7,))
    assert r.take_stray_fds() == ()


def test_fds_in_a_chunk_that_starts_with_the_previous_frames_tail() -> None:
    first, second = frame(b"first"), frame(b"second", fd_count=2)
    r = reader()
    r.feed(first[:3])
    r.feed(first[3:] + second, [10, 11])  # recvmsg glued the tail of one frame to the next
    assert r.next_frame() == Frame(b"first", ())
    assert r.next_frame() == Frame(b"second", (10, 11))


def test_two_frames_sharing_one_chunk_take_fds_in_order() -> None:
    r = reader()
    r.feed(frame(b"a", fd_count=1) + frame(b"b", fd_count=1), [5, 6])
    assert frames_from(r) == [Frame(b"a", (5,)), Frame(b"b", (6,))]


def test_fds_that_arrive_after_the_first_byte_are_missing() -> None:
    data = frame(b"alloc", fd_count=1)
    r = reader()
    r.feed(data[:1])
    r.feed(data[1:], [9])  # too late: not with the first byte
    with pytest.raises(RemoteProtocolError) as info:
        r.next_frame()
    assert info.value.code is ErrorCode.MISSING_FDS
    assert str(info.value) == "frame declares 1 fds but 0 arrived with its first byte"
    assert r.take_all_fds() == [9]  # still held, for the caller to close


def test_fewer_fds_than_declared() -> None:
    r = reader()
    r.feed(frame(b"x", fd_count=3), [1, 2])
    with pytest.raises(RemoteProtocolError, match="declares 3 fds but 2 arrived"):
        r.next_frame()
    assert sorted(r.take_all_fds()) == [1, 2]


def test_surplus_fds_become_stray_once_their_bytes_are_consumed() -> None:
    r = reader()
    r.feed(frame(b"x", fd_count=1), [1, 2, 3])
    assert r.take_stray_fds() == ()  # a later frame in these bytes could still claim them
    assert r.next_frame() == Frame(b"x", (1,))
    assert r.take_stray_fds() == (2, 3)


def test_fds_arriving_mid_frame_are_stray() -> None:
    data = frame(b"payload")
    r = reader()
    r.feed(data[:5])
    r.feed(data[5:9], [4])  # no frame starts in these bytes
    r.feed(data[9:] + frame(b"next")[:2])
    assert r.next_frame() == Frame(b"payload", ())
    assert r.take_stray_fds() == (4,)


def test_fds_on_every_byte_of_an_unfinished_frame_are_stray_as_they_come() -> None:
    """Issue 27: fds sent with each byte of a frame that never ends were held until the
    frame ended, and it never did. Once the frame's header is there, fds that come with
    bytes wholly inside it are stray at once; the frame's own (with its first byte) and
    those that may belong to the next frame (with bytes past its end) are kept."""
    data = frame(b"x" * 1000, fd_count=1)
    r = reader(limit=4096)
    r.feed(data[:1], [100])  # the first byte: the frame's own fd
    for i in range(1, FRAME_HEADER_SIZE - 1):
        r.feed(data[i : i + 1], [200 + i])
        assert r.next_frame() is None
        assert r.take_stray_fds() == ()  # the header is incomplete: its length unknown
    r.feed(data[FRAME_HEADER_SIZE - 1 : FRAME_HEADER_SIZE], [207])  # the header is whole
    assert r.next_frame() is None
    assert r.take_stray_fds() == (201, 202, 203, 204, 205, 206, 207)
    for i in range(FRAME_HEADER_SIZE, 500):
        r.feed(data[i : i + 1], [1000 + i, 2000 + i, 3000 + i, 4000 + i])
        assert r.next_frame() is None
        assert r.take_stray_fds() == (1000 + i, 2000 + i, 3000 + i, 4000 + i)
    r.feed(data[500:] + frame(b"next", fd_count=1)[:1], [7])  # the rest, and the next frame's
    assert r.next_frame() == Frame(b"x" * 1000, (100,))
    assert r.take_stray_fds() == ()  # 7 is the next frame's
    r.feed(frame(b"next", fd_count=1)[1:])
    assert r.next_frame() == Frame(b"next", (7,))


def test_fds_without_bytes_are_stray() -> None:
    r = reader()
    r.feed(frame(b"a"))
    r.feed(b"", [8, 9])  # end of stream carrying fds
    assert r.take_stray_fds() == (8, 9)
    assert r.next_frame() == Frame(b"a", ())


def test_queued_fds_turn_stray_at_end_of_stream() -> None:
    data = frame(b"a", fd_count=1)
    r = reader()
    r.feed(data[:2], [3])
    r.feed(b"")
    assert r.take_stray_fds() == (3,)


def test_truncated_ancillary_data_is_fatal() -> None:
    r = reader()
    r.feed(frame(b"a", fd_count=1), [3])
    r.note_fds_truncated()
    with pytest.raises(RemoteProtocolError) as info:
        r.next_frame()
    assert info.value.code is ErrorCode.FDS_TRUNCATED
    assert r.take_all_fds() == [3]
