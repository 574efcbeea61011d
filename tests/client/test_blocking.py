"""The blocking client against a real protocol peer: every method, buffers, handles."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import zlib

import pytest

import npu_client
import npu_protocol as p
from npu_protocol.aee import AEE
from tests.client.conftest import open_fds
from tests.client.peer import ECHO_URI, TEST_URI, Peer


def test_connect_shakes_hands_and_exposes_the_welcome(peer: Peer) -> None:
    with npu_client.connect(peer.path, name="voice-stt", priority="realtime") as client:
        assert client.path == peer.path
        assert client.server_version == "0.1.0-peer"
        assert client.backend == "emulator"
        assert client.dsp.arch_ver == 0x73
        assert client.priority is p.Priority.REALTIME
        assert client.limits.max_in_flight == 64
        assert client.epoch == 1
        assert not client.shutting_down
        assert client.shutdown_notice is None
        assert client.welcome.protocol_version == p.PROTOCOL_VERSION
        hello = peer.connection().server.hello
        assert hello is not None
        assert (hello.client_name, hello.priority) == ("voice-stt", p.Priority.REALTIME)
    assert client.closed


def test_alloc_maps_the_dma_buf_shared_both_ways(client: npu_client.Client, peer: Peer) -> None:
    buffer = client.alloc(100)
    assert (buffer.id, buffer.size, len(buffer)) == (1, 4096, 4096)
    assert not buffer.freed
    assert fcntl.fcntl(buffer.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    peer_memory = peer.connection().buffers[buffer.id].memory
    buffer.view()[:5] = b"hello"
    assert peer_memory[:5] == b"hello"
    peer_memory[4096 - 3 :] = b"end"
    assert bytes(buffer.view()[-3:]) == b"end"
    assert client.buffers == (buffer,)
    assert os.fstat(buffer.fd).st_size == 4096


def test_map_is_cached_and_unmap_forgets_it(client: npu_client.Client, peer: Peer) -> None:
    buffer = client.alloc(8192)
    assert buffer.dsp_address is None
    address = buffer.map()
    assert buffer.map() == address == buffer.dsp_address
    requests = peer.connection().requests
    assert sum(isinstance(r, p.MapRequest) for r in requests) == 1
    buffer.unmap()
    assert buffer.dsp_address is None
    buffer.unmap()  # not mapped: nothing to ask
    assert sum(isinstance(r, p.UnmapRequest) for r in requests) == 1
    assert buffer.map() == buffer.dsp_address  # asked again: the mapping was gone
    assert sum(isinstance(r, p.MapRequest) for r in requests) == 2


def test_free_releases_the_daemons_buffer_then_fd_and_mapping(
    client: npu_client.Client, peer: Peer
) -> None:
    before = open_fds()
    buffer = client.alloc(4096)
    assert open_fds() > before  # ours and the peer's (each side's mmap may hold a dup)
    buffer.free()
    assert buffer.freed
    assert open_fds() == before
    assert buffer.id not in peer.connection().buffers
    assert client.buffers == ()
    buffer.free()  # idempotent: no second request
    assert sum(isinstance(r, p.FreeRequest) for r in peer.connection().requests) == 1
    with pytest.raises(ValueError, match="buffer 1 is freed"):
        buffer.view()
    with pytest.raises(ValueError, match="freed"):
        _ = buffer.fd
    with pytest.raises(ValueError, match="freed"):
        buffer.map()


def test_buffer_context_manager_frees(client: npu_client.Client, peer: Peer) -> None:
    with client.alloc(10) as buffer:
        buffer.view()[0] = 7
    assert buffer.freed
    assert peer.connection().buffers == {}


def test_a_view_held_past_free_keeps_memory_until_released(client: npu_client.Client) -> None:
    before = open_fds()
    buffer = client.alloc(4096)
    view = buffer.view()
    view[:3] = b"abc"
    buffer.free()
    assert bytes(view[:3]) == b"abc"  # still mapped: the view holds it
    view.release()
    assert open_fds() == before


@pytest.mark.skipif(sys.version_info < (3, 12), reason="PEP 688 buffer protocol needs 3.12")
def test_the_buffer_itself_is_a_buffer(client: npu_client.Client) -> None:
    with client.alloc(4096) as buffer:
        with memoryview(buffer) as view:  # type: ignore[arg-type, unused-ignore]
            view[:2] = b"ok"
        assert bytes(buffer.view()[:2]) == b"ok"


def test_slices(client: npu_client.Client) -> None:
    with client.alloc(4096) as buffer:
        whole = buffer.slice()
        assert (whole.offset, whole.length, len(whole)) == (0, 4096, 4096)
        tail = buffer.slice(4000)
        assert (tail.offset, tail.length) == (4000, 96)
        empty = buffer.slice(4096)
        assert empty.length == 0
        part = buffer.slice(10, 5)
        part.view()[:] = b"12345"
        assert bytes(buffer.view()[10:15]) == b"12345"


def test_echo_inline_in_and_out(client: npu_client.Client) -> None:
    with client.open(ECHO_URI) as echo:
        assert echo.uri == ECHO_URI
        assert echo.epoch == 1
        [out] = echo.invoke(2, [struct.pack("<II", 5, 8), b"hello"], [8])
        assert out == b"hello\x00\x00\x00"
    assert echo.closed


def test_slices_in_and_out_are_read_and_written_in_place(client: npu_client.Client) -> None:
    with client.alloc(8192) as buffer, client.open(TEST_URI) as skel:
        assert skel.invoke(2, [struct.pack("<II", 0x10, 300)], [buffer.slice(4096, 300)]) == [None]
        assert bytes(buffer.view()[4096 : 4096 + 300]) == bytes(
            (0x10 + i) & 0xFF for i in range(300)
        )
        data = os.urandom(1000)
        buffer.view()[:1000] = data
        [crc] = skel.invoke(3, [struct.pack("<I", 1000), buffer.slice(0, 1000)], [4])
        assert crc is not None
        assert struct.unpack("<I", crc)[0] == zlib.crc32(data)


def test_invoke_with_a_raw_scalars_word(client: npu_client.Client, peer: Peer) -> None:
    with client.open(ECHO_URI) as echo:
        [out] = echo.invoke(None, [struct.pack("<II", 2, 2), b"hi"], [2], sc=0x02020100)
        assert out == b"hi"
    [invoke] = [r for r in peer.connection().requests if isinstance(r, p.InvokeRequest)]
    assert (invoke.method, invoke.sc) == (None, 0x02020100)


def test_timeout_travels_in_milliseconds(client: npu_client.Client, peer: Peer) -> None:
    with client.open(ECHO_URI) as echo:
        echo.invoke(2, [struct.pack("<II", 0, 0), b""], [0], timeout=0.25)
        echo.invoke(2, [struct.pack("<II", 0, 0), b""], [0], timeout=0.0001)
        echo.invoke(2, [struct.pack("<II", 0, 0), b""], [0])
    invokes = [r for r in peer.connection().requests if isinstance(r, p.InvokeRequest)]
    assert [r.timeout_ms for r in invokes] == [250, 1, None]


def test_a_failing_method_raises_invoke_failed_with_its_code(client: npu_client.Client) -> None:
    with client.open(ECHO_URI) as echo, pytest.raises(npu_client.InvokeFailed) as caught:
        echo.invoke(2, [struct.pack("<II", 99, 8), b"hello"], [8])  # primIn lies
    error = caught.value
    assert error.code == p.ErrorCode.INVOKE_FAILED
    assert error.fields["code"] == AEE.EBADPARM.dsp
    assert "AEE_EBADPARM" in error.message
    assert str(error) == error.message
    assert error.name == "INVOKE_FAILED"


def test_open_failure_raises_open_failed(client: npu_client.Client) -> None:
    with pytest.raises(npu_client.OpenFailed, match="no such skel"):
        client.open("file:///libnothing_skel.so?nothing_skel_handle_invoke&_modver=1.0")


def test_handle_close_is_idempotent_and_invoke_after_close_is_refused(
    client: npu_client.Client, peer: Peer
) -> None:
    handle = client.open(ECHO_URI)
    handle.close()
    handle.close()
    assert sum(isinstance(r, p.CloseRequest) for r in peer.connection().requests) == 1
    with pytest.raises(ValueError, match=f"remote handle {handle.id} is closed"):
        handle.invoke(2)


def test_status_and_ping(client: npu_client.Client) -> None:
    status = client.status()
    assert isinstance(status, p.DaemonStatus)
    [row] = status.clients
    assert (row.pid, row.name) == (os.getpid(), "test-client")
    assert client.ping() == b""
    assert client.ping(b"tick") == b"tick"


def test_statistics(client: npu_client.Client) -> None:
    buffer = client.alloc(5000)
    stats = client.statistics()
    assert (stats.buffers, stats.buffer_bytes, stats.requests_in_flight) == (1, 8192, 0)
    assert stats.epoch == 1
    assert not stats.closed
    assert stats.connection.fds_received == 1
    buffer.free()


def test_close_releases_every_buffer_and_nothing_leaks(peer: Peer) -> None:
    before = open_fds()
    client = npu_client.connect(peer.path, name="leaky")
    buffers = [client.alloc(4096 * (i + 1)) for i in range(5)]
    buffers[0].map()
    views = [b.view() for b in buffers]
    for view in views:
        view[:4] = b"data"
        view.release()
    with client.open(ECHO_URI) as echo:
        echo.invoke(2, [struct.pack("<II", 4, 4), buffers[1].slice(0, 4)], [buffers[2].slice(0, 4)])
    buffers[3].free()
    client.close()
    client.close()
    assert all(b.freed for b in buffers)
    peer.wait_closed()
    assert open_fds() == before
    with pytest.raises(npu_client.ConnectionClosedError, match="this client was closed"):
        client.ping()
    buffers[4].free()  # the connection freed it: no error
    with pytest.raises(ValueError, match="buffer 5 is gone: its client was closed"):
        buffers[4].view()


@pytest.mark.parametrize(
    ("size", "error", "match"),
    [
        (
            0,
            ValueError,
            r"size must be between 1 and 268435456 \(npud's largest buffer, limits.max_buffer_size\),"
            " got 0",
        ),
        (-1, ValueError, "got -1"),
        (p.MAX_DMA_SIZE + 1, ValueError, "got 268435457"),
        (True, TypeError, "size must be an int, not bool"),
        (1.5, TypeError, "not float"),
        ("4096", TypeError, "not str"),
    ],
)
def test_bad_alloc_sizes_are_refused_before_sending(
    client: npu_client.Client, peer: Peer, size: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        client.alloc(size)  # type: ignore[arg-type]
    assert peer.connection().requests == []


@pytest.mark.parametrize(
    ("offset", "length", "error", "match"),
    [
        (-1, None, ValueError, "offset must not be negative"),
        (0, -5, ValueError, "length must not be negative"),
        (4097, None, ValueError, "slice offset 4097 length -1 is outside buffer 1 of 4096 bytes"),
        (4000, 97, ValueError, "slice offset 4000 length 97 is outside"),
        (1.0, None, TypeError, "offset must be an int, not float"),
        (0, True, TypeError, "length must be an int, not bool"),
    ],
)
def test_slices_outside_the_buffer_are_refused(
    client: npu_client.Client, offset: object, length: object, error: type[Exception], match: str
) -> None:
    with client.alloc(4096) as buffer, pytest.raises(error, match=match):
        buffer.slice(offset, length)  # type: ignore[arg-type]


def _bad_invokes(
    foreign: npu_client.Slice, stale: npu_client.Slice
) -> list[tuple[dict[str, object], type[Exception], str]]:
    return [
        ({"method": 32}, ValueError, "method must be between 0 and 31, got 32"),
        ({"method": "2"}, TypeError, "method must be an int, not str"),
        ({"method": 2, "sc": 0x02000000}, ValueError, "exactly one of method and sc"),
        ({"method": None}, ValueError, "exactly one of method and sc"),
        ({"method": None, "sc": 1 << 32}, ValueError, "sc must be between"),
        ({"method": None, "sc": 0x02010000}, ValueError, "sc 0x02010000 declares 1 inputs"),
        ({"method": None, "sc": 0x02000011}, ValueError, "handle arguments"),
        ({"method": 2, "inputs": b"abc"}, TypeError, "wrap a single one"),
        ({"method": 2, "inputs": "abc"}, TypeError, "wrap a single one"),
        ({"method": 2, "inputs": {b"a"}}, TypeError, "must be a sequence, not set"),
        ({"method": 2, "inputs": ["text"]}, TypeError, r"inputs\[0\] must be bytes-like"),
        ({"method": 2, "inputs": [7]}, TypeError, r"inputs\[0\] must be bytes-like"),
        ({"method": 2, "outputs": [-1]}, ValueError, r"outputs\[0\] capacity must not be"),
        ({"method": 2, "outputs": [True]}, TypeError, r"outputs\[0\] must be an int capacity"),
        ({"method": 2, "outputs": [b"x"]}, TypeError, r"outputs\[0\] must be an int capacity"),
        ({"method": 2, "inputs": [b""] * 256}, ValueError, "256 inputs; an invoke takes at most"),
        ({"method": 2, "inputs": [bytes(983041)]}, ValueError, "inline inputs total 983041"),
        ({"method": 2, "outputs": [983040, 1]}, ValueError, "output capacities total 983041"),
        ({"method": 2, "inputs": [foreign]}, ValueError, "buffer of another client"),
        ({"method": 2, "outputs": [stale]}, ValueError, "buffer 2, which is freed"),
        ({"method": 2, "timeout": 0}, ValueError, "timeout must be a positive number"),
        ({"method": 2, "timeout": -1.0}, ValueError, "timeout must be a positive number"),
        ({"method": 2, "timeout": float("nan")}, ValueError, "timeout must be a positive"),
        ({"method": 2, "timeout": 601.0}, ValueError, "above this connection's limit of 600 s"),
        ({"method": 2, "timeout": "1"}, TypeError, "timeout must be a number of seconds"),
    ]


def test_bad_invoke_arguments_are_refused_before_sending(
    client: npu_client.Client, peer: Peer
) -> None:
    buffer = client.alloc(4096)
    freed = client.alloc(4096)
    stale = freed.slice()
    freed.free()
    with npu_client.connect(peer.path, name="other") as other, client.open(ECHO_URI) as echo:
        foreign = other.alloc(4096).slice()
        sent_before = len(peer.connection(0).requests)
        for kwargs, error, match in _bad_invokes(foreign, stale):
            with pytest.raises(error, match=match):
                echo.invoke(**kwargs)  # type: ignore[arg-type]
        assert len(peer.connection(0).requests) == sent_before
        # The control: a well-formed invoke does reach the daemon (the skel refuses it).
        with pytest.raises(npu_client.InvokeFailed):
            echo.invoke(2, [buffer.slice(0, 1)])
        assert len(peer.connection(0).requests) == sent_before + 1


@pytest.mark.parametrize(
    ("uri", "error", "match"),
    [
        ("", ValueError, "is not allowed"),
        ("file:///lib echo.so", ValueError, "without spaces"),
        ("x" * 1024, ValueError, "1 to 1023 printable ASCII"),
        ("caf\u00e9", ValueError, "printable ASCII"),
        (b"file:///x", TypeError, "uri must be a str, not bytes"),
    ],
)
def test_bad_uris_are_refused(
    client: npu_client.Client, peer: Peer, uri: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        client.open(uri)  # type: ignore[arg-type]
    assert peer.connection().requests == []


def test_bad_ping_payloads_are_refused(client: npu_client.Client) -> None:
    with pytest.raises(ValueError, match="ping payload of 4097 bytes; the limit is 4096"):
        client.ping(bytes(4097))
    with pytest.raises(TypeError, match="ping payload must be bytes-like, not str"):
        client.ping("x")  # type: ignore[arg-type]
    assert client.ping(bytearray(b"ok")) == b"ok"
