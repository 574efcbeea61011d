"""A client and a server connection talking through memory: every message kind,
pipelining, out-of-order answers, fds, and the state machine."""

from __future__ import annotations

import msgspec
import pytest

import npu_protocol as p
from npu_protocol import ConnectionState, ErrorCode
from tests.protocol.helpers import (
    WELCOME,
    connected_pair,
    daemon_status,
    drain,
    feed,
    frame,
    transfer,
)

CHUNK_SIZES = [None, 1, 5]

URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
STT = p.ClientRow(pid=10, uid=1000, name="voice-stt", priority="realtime")


@pytest.mark.parametrize("chunk", CHUNK_SIZES)
def test_every_message_kind_crosses_intact(chunk: int | None) -> None:
    client, server = p.ClientConnection(), p.ServerConnection()
    hello = p.Hello(
        protocol_version=p.PROTOCOL_VERSION, client_name="voice-stt", priority=p.Priority.REALTIME
    )
    assert transfer(client, server, hello, chunk) == hello
    assert server.hello == hello
    assert transfer(server, client, WELCOME, chunk) == WELCOME
    assert client.welcome == WELCOME
    assert client.limits == server.limits == WELCOME.limits

    invoke = p.InvokeRequest(
        id=7,
        handle=3,
        method=2,
        inputs=(p.InlineInput(data=b"\x00\x01"), p.BufferSlice(buffer=1, offset=8, length=64)),
        outputs=(p.InlineOutput(capacity=4), p.BufferSlice(buffer=1, length=8)),
        timeout_ms=250,
    )
    exchanges: list[tuple[p.AnyRequest, p.AnyReply]] = [
        (p.AllocRequest(id=1, size=5000), p.AllocReply(id=1, buffer=1, size=8192, fd=33)),
        (p.MapRequest(id=2, buffer=1), p.MapReply(id=2, dsp_address=0xC000_0000)),
        (p.OpenRequest(id=3, uri=URI), p.OpenReply(id=3, handle=3)),
        (invoke, p.InvokeReply(id=7, outputs=(b"abcd", None))),
        (p.StatusRequest(id=8), p.StatusReply(id=8, status=daemon_status(STT))),
        (p.PingRequest(id=9, payload=b"tick"), p.PongReply(id=9, payload=b"tick")),
        (p.UnmapRequest(id=10, buffer=1), p.UnmapReply(id=10)),
        (p.CloseRequest(id=11, handle=3), p.CloseReply(id=11)),
        (p.FreeRequest(id=12, buffer=1), p.FreeReply(id=12)),
    ]
    for request, reply in exchanges:
        assert transfer(client, server, request, chunk) == request
        assert server.request_type(request.id) is type(request)
        assert transfer(server, client, reply, chunk) == reply
    for event in (
        p.SessionRestarted(epoch=2, reason="SSR"),
        p.ShuttingDown(reason="stop", grace_ms=100),
    ):
        assert transfer(server, client, event, chunk) == event
    assert client.in_flight == server.in_flight == frozenset()
    stats = client.statistics()
    assert (stats.frames_sent, stats.frames_received) == (10, 12)
    assert (stats.fds_sent, stats.fds_received) == (0, 1)
    assert stats.bytes_buffered == 0
    assert server.statistics().fds_sent == 1


def test_alloc_reply_carries_its_fd_as_slot_zero_on_the_wire() -> None:
    client, server = connected_pair()
    transfer(client, server, p.AllocRequest(id=1, size=4096))
    data, fds = server.send(p.AllocReply(id=1, buffer=1, size=4096, fd=1234))
    assert fds == [1234]
    assert data[2] == 1  # the header's fd count
    assert b"\xa2fd\x00\xa6dsp_fd" in data  # "fd": 0, the slot index (then dsp_fd)
    feed(client, data, fds)
    [reply] = drain(client)
    assert isinstance(reply, p.AllocReply)
    assert reply.fd == 1234


def test_pipelined_requests_answered_out_of_order() -> None:
    client, server = connected_pair()
    wire = b""
    for request_id in range(5):
        data, _ = client.send(p.PingRequest(id=request_id, payload=bytes([request_id])))
        wire += data
    feed(server, wire, chunk=2)
    received = drain(server)
    assert [m.id for m in received if isinstance(m, p.PingRequest)] == [0, 1, 2, 3, 4]
    assert server.in_flight == frozenset(range(5))
    answers = b""
    for request_id in (3, 0, 4, 1, 2):
        if request_id == 4:
            data, _ = server.send(p.ErrorMessage.for_code(ErrorCode.SESSION_BUSY, id=4))
        else:
            data, _ = server.send(p.PongReply(id=request_id, payload=bytes([request_id])))
        answers += data
    feed(client, answers)
    events = drain(client)
    assert [getattr(e, "id", None) for e in events] == [3, 0, 4, 1, 2]
    assert isinstance(events[2], p.ErrorMessage)
    assert events[2].error_code is ErrorCode.SESSION_BUSY
    assert client.in_flight == server.in_flight == frozenset()


def test_next_request_id_skips_ids_in_flight() -> None:
    client, _ = connected_pair()
    client.send(p.PingRequest(id=1))
    assert [client.next_request_id() for _ in range(3)] == [0, 2, 3]


def test_a_withdrawn_request_frees_its_slot_and_its_id() -> None:
    limits = p.ClientLimits(priority=p.Priority.NORMAL, max_in_flight=1)
    client, _ = connected_pair(msgspec.structs.replace(WELCOME, limits=limits))
    request_id = client.next_request_id()
    client.send(p.PingRequest(id=request_id))  # framed, never written
    with pytest.raises(p.LocalProtocolError, match="in flight"):
        client.send(p.PingRequest(id=client.next_request_id()))
    client.withdraw(request_id)
    assert client.in_flight == frozenset()
    client.send(p.PingRequest(id=request_id))  # its slot and its id are free again
    assert client.in_flight == {request_id}


def test_withdrawing_a_request_not_in_flight_is_refused() -> None:
    client, _ = connected_pair()
    with pytest.raises(ValueError, match="request 7 is not in flight"):
        client.withdraw(7)


def test_statistics_snapshot_counts_bytes() -> None:
    client, server = connected_pair()
    data, _ = client.send(p.PingRequest(id=1))
    feed(server, data[:4])
    assert server.statistics().bytes_buffered == 4
    feed(server, data[4:])
    drain(server)
    stats = server.statistics()
    assert stats.requests_in_flight == 1
    assert stats.bytes_received == client.statistics().bytes_sent
    assert stats.state is ConnectionState.READY


# --- handshake ---------------------------------------------------------------------------


def test_handshake_refusal_closes_both_sides() -> None:
    client, server = p.ClientConnection(), p.ServerConnection()
    transfer(client, server, p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="intruder"))
    refusal = p.ErrorMessage.for_code(ErrorCode.NOT_PERMITTED, detail="uid 1001")
    data, _ = server.send(refusal)
    feed(client, data)
    assert drain(client) == [refusal, p.ConnectionClosed()]  # nothing is read after it
    assert client.state is server.state is ConnectionState.CLOSED
    with pytest.raises(p.LocalProtocolError, match="the connection is closed"):
        client.send(p.PingRequest(id=1))
    with pytest.raises(p.LocalProtocolError, match="the connection is closed"):
        server.send(refusal)


def test_server_may_refuse_before_the_hello() -> None:
    server = p.ServerConnection()
    server.send(p.ErrorMessage.for_code(ErrorCode.SHUTTING_DOWN))
    assert server.state is ConnectionState.CLOSED


def test_choose_protocol_version() -> None:
    assert p.choose_protocol_version(1) == 1
    assert p.choose_protocol_version(900) == p.PROTOCOL_VERSION
    assert p.choose_protocol_version(0) is None


def test_a_newer_client_is_answered_with_our_version() -> None:
    server = p.ServerConnection()
    hello = {"type": "hello", "protocol_version": 9, "client_name": "future"}
    feed(server, frame(msgspec.msgpack.encode(hello)))
    [received] = drain(server)
    assert isinstance(received, p.Hello)
    assert p.choose_protocol_version(received.protocol_version) == p.PROTOCOL_VERSION
    with pytest.raises(p.LocalProtocolError) as info:
        server.send(msgspec.structs.replace(WELCOME, protocol_version=p.PROTOCOL_VERSION + 1))
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    server.send(WELCOME)
    assert server.state is ConnectionState.READY


@pytest.mark.parametrize(("offered", "answered"), [(1, 2), (2, 3), (1, 3)])
def test_client_refuses_a_welcome_in_a_version_it_does_not_speak(
    offered: int, answered: int
) -> None:
    client = p.ClientConnection()
    client.send(p.Hello(client_name="c", protocol_version=offered))
    welcome = msgspec.structs.replace(WELCOME, protocol_version=answered)
    feed(client, frame(msgspec.msgpack.encode(welcome)))
    with pytest.raises(p.RemoteProtocolError) as info:
        client.next_event()
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert str(info.value) == (
        f"protocol version {answered} is not supported: this side speaks 1 to {offered}"
    )


def test_a_version_1_peer_is_still_spoken_to() -> None:
    client, server = p.ClientConnection(), p.ServerConnection()
    feed(server, client.send(p.Hello(client_name="old", protocol_version=1))[0])
    [hello] = drain(server)
    assert isinstance(hello, p.Hello)
    assert p.choose_protocol_version(hello.protocol_version) == 1
    welcome = msgspec.structs.replace(WELCOME, protocol_version=1)
    feed(client, server.send(welcome)[0])
    assert drain(client) == [welcome]


def test_client_only_offers_versions_it_speaks() -> None:
    with pytest.raises(p.LocalProtocolError) as info:
        p.ClientConnection().send(p.Hello(client_name="c", protocol_version=p.PROTOCOL_VERSION + 1))
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION


# --- state machine: refused sends leave the connection as it was ------------------------


def test_request_before_the_welcome_is_refused_locally() -> None:
    client = p.ClientConnection()
    with pytest.raises(p.LocalProtocolError, match="requests wait for the Welcome"):
        client.send(p.PingRequest(id=1))
    client.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="c"))
    with pytest.raises(p.LocalProtocolError, match="unexpected ping message"):
        client.send(p.PingRequest(id=1))
    assert client.state is ConnectionState.HANDSHAKE


def test_second_hello_is_refused() -> None:
    client, _ = connected_pair()
    with pytest.raises(p.LocalProtocolError, match="the Hello was already sent"):
        client.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="again"))
    assert client.state is ConnectionState.READY


def test_duplicate_id_in_flight_is_refused_locally_and_the_connection_lives() -> None:
    client, _ = connected_pair()
    client.send(p.PingRequest(id=5))
    with pytest.raises(p.LocalProtocolError) as info:
        client.send(p.FreeRequest(id=5, buffer=1))
    assert info.value.code is ErrorCode.DUPLICATE_REQUEST_ID
    assert client.request_type(5) is p.PingRequest
    client.send(p.PingRequest(id=6))  # still usable


def test_in_flight_limit_is_enforced_on_send() -> None:
    client, _ = connected_pair()
    limit = WELCOME.limits.max_in_flight
    for request_id in range(limit):
        client.send(p.PingRequest(id=request_id))
    with pytest.raises(p.LocalProtocolError, match=f"more than {limit} requests in flight"):
        client.send(p.PingRequest(id=limit))


def test_server_cannot_answer_what_was_not_asked() -> None:
    _, server = connected_pair()
    with pytest.raises(p.LocalProtocolError) as info:
        server.send(p.PongReply(id=1))
    assert info.value.code is ErrorCode.UNKNOWN_REQUEST_ID
    with pytest.raises(p.LocalProtocolError) as info:
        server.send(p.ErrorMessage.for_code(ErrorCode.SESSION_BUSY, id=1))
    assert info.value.code is ErrorCode.UNKNOWN_REQUEST_ID


def test_server_reply_must_match_the_request() -> None:
    client, server = connected_pair()
    transfer(client, server, p.PingRequest(id=1))
    with pytest.raises(p.LocalProtocolError, match="request 1 is a ping, whose reply is pong"):
        server.send(p.FreeReply(id=1))
    transfer(server, client, p.PongReply(id=1))


@pytest.mark.parametrize(
    ("outputs", "problem"),
    [
        ((b"1234",), "1 outputs for 2 requested"),
        ((b"12345", None), "output 0 has capacity 4, 5 bytes came back"),
        ((None, None), "output 0 has capacity 4, nothing came back"),
        ((b"1234", b"x"), "output 1 is a buffer slice but bytes came back"),
    ],
)
def test_invoke_reply_must_fit_the_requested_outputs(
    outputs: tuple[bytes | None, ...], problem: str
) -> None:
    client, server = connected_pair()
    request = p.InvokeRequest(
        id=1,
        handle=1,
        method=0,
        outputs=(p.InlineOutput(capacity=4), p.BufferSlice(buffer=1, length=4)),
    )
    transfer(client, server, request)
    with pytest.raises(p.LocalProtocolError, match=problem):
        server.send(p.InvokeReply(id=1, outputs=outputs))
    # A client hearing the same from a broken server treats it as fatal.
    feed(client, frame(msgspec.msgpack.encode(p.InvokeReply(id=1, outputs=outputs))))
    with pytest.raises(p.RemoteProtocolError, match=problem):
        client.next_event()


def test_shorter_inline_output_is_accepted() -> None:
    client, server = connected_pair()
    transfer(
        client,
        server,
        p.InvokeRequest(id=1, handle=1, method=0, outputs=(p.InlineOutput(capacity=4),)),
    )
    assert transfer(server, client, p.InvokeReply(id=1, outputs=(b"12",))) == p.InvokeReply(
        id=1, outputs=(b"12",)
    )


def test_events_and_replies_wait_for_the_welcome() -> None:
    client, server = p.ClientConnection(), p.ServerConnection()
    with pytest.raises(p.LocalProtocolError, match="no Hello has arrived"):
        server.send(WELCOME)
    transfer(client, server, p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="c"))
    with pytest.raises(p.LocalProtocolError, match="the Welcome has not been sent"):
        server.send(p.SessionRestarted(epoch=2))
    server.send(WELCOME)
    with pytest.raises(p.LocalProtocolError, match="the Welcome was already sent"):
        server.send(WELCOME)


def test_sending_the_wrong_direction_is_a_type_error() -> None:
    client, server = connected_pair()
    with pytest.raises(TypeError):
        client.send(WELCOME)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        server.send(p.PingRequest(id=1))  # type: ignore[arg-type]


def test_values_the_encoder_cannot_encode_are_refused_before_anything_is_sent() -> None:
    client, _ = connected_pair()
    with pytest.raises(p.LocalProtocolError) as info:
        client.send(p.PingRequest(id=1, payload=object()))  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.BAD_MESSAGE
    assert client.in_flight == frozenset()
    assert client.statistics().frames_sent == 1  # only the Hello


def test_send_does_not_decode_what_it_encoded_the_peer_checks_the_bounds() -> None:
    # The message types give the shape; their bounds (Meta constraints) are the
    # receiving decoder's to enforce. Building a message outside them is the
    # sender's bug, and the peer refuses it as BAD_MESSAGE naming the field.
    client, server = connected_pair()
    data, fds = client.send(p.AllocRequest(id=1, size=p.MAX_BUFFER_SIZE + 1))
    assert client.in_flight == frozenset({1})
    feed(server, data, fds)
    with pytest.raises(p.RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code is ErrorCode.BAD_MESSAGE
    assert "$.size" in str(info.value)


def test_only_the_exact_message_types_of_the_direction_are_sent() -> None:
    class Disguised(p.PingRequest, frozen=True, kw_only=True):
        pass

    client, _ = connected_pair()
    with pytest.raises(TypeError, match="ClientConnection cannot send Disguised"):
        client.send(Disguised(id=1))
    assert client.in_flight == frozenset()


def test_negative_fd_is_refused() -> None:
    client, server = connected_pair()
    transfer(client, server, p.AllocRequest(id=1, size=1))
    with pytest.raises(p.LocalProtocolError) as info:
        server.send(p.AllocReply(id=1, buffer=1, size=4096, fd=-1))
    assert info.value.code is ErrorCode.INVALID_FD
    assert server.in_flight == frozenset({1})


def test_outgoing_frames_respect_the_limit() -> None:
    small = msgspec.structs.replace(
        WELCOME,
        limits=p.ClientLimits(
            priority=p.Priority.NORMAL,
            max_frame_size=p.HANDSHAKE_MAX_FRAME_SIZE,
            max_inline_bytes=0,
        ),
    )
    client, _ = connected_pair(small)
    big = p.InvokeRequest(
        id=1, handle=1, method=0, inputs=(p.InlineInput(data=bytes(p.HANDSHAKE_MAX_FRAME_SIZE)),)
    )
    with pytest.raises(p.LocalProtocolError) as info:
        client.send(big)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE


def test_the_welcome_raises_the_frame_limit_for_both_sides() -> None:
    client, server = connected_pair()  # WELCOME announces 1 MiB
    payload = bytes(200_000)
    request = p.InvokeRequest(id=1, handle=1, method=0, inputs=(p.InlineInput(data=payload),))
    assert transfer(client, server, request) == request


def test_worst_case_invoke_within_the_inline_limit_fits_a_frame() -> None:
    client, server = connected_pair()
    limits = WELCOME.limits
    share = limits.max_inline_bytes // p.MAX_ARGS
    inputs = tuple(p.InlineInput(data=bytes(share)) for _ in range(p.MAX_ARGS))
    outputs = tuple(
        p.BufferSlice(buffer=2**32 - 1, offset=2**27, length=2**27) for _ in range(p.MAX_ARGS)
    )
    request = p.InvokeRequest(
        id=2**32 - 1,
        handle=2**32 - 1,
        sc=0xFFFFFF00,
        inputs=inputs,
        outputs=outputs,
        timeout_ms=p.MAX_TIMEOUT_MS,
    )
    transfer(client, server, request)
    wide = p.InvokeRequest(
        id=1,
        handle=1,
        method=0,
        outputs=tuple(p.InlineOutput(capacity=share) for _ in range(p.MAX_ARGS)),
    )
    transfer(client, server, wide)
    transfer(
        server, client, p.InvokeReply(id=1, outputs=tuple(bytes(share) for _ in range(p.MAX_ARGS)))
    )


# --- closing ---------------------------------------------------------------------------------


def test_end_of_stream_closes_and_keeps_unanswered_ids() -> None:
    client, _ = connected_pair()
    client.send(p.PingRequest(id=1))
    client.receive_data(b"")
    assert isinstance(client.next_event(), p.ConnectionClosed)
    assert client.state is ConnectionState.CLOSED
    assert client.in_flight == frozenset({1})  # for the caller to fail
    assert isinstance(client.next_event(), p.ConnectionClosed)  # and again
    with pytest.raises(RuntimeError):
        client.receive_data(b"late")


def test_fds_still_queued_are_handed_back_before_closed() -> None:
    client, server = connected_pair()
    transfer(client, server, p.AllocRequest(id=1, size=1))
    refusal = p.ErrorMessage.for_code(ErrorCode.SHUTTING_DOWN)
    data, _ = server.send(refusal)
    tail = frame(b"\x80", fd_count=1)  # a frame after the goodbye, with an fd
    feed(client, data + tail, [77])
    assert drain(client) == [refusal, p.StrayFds((77,)), p.ConnectionClosed()]


def test_surplus_fds_surface_as_stray_and_the_connection_goes_on() -> None:
    client, server = connected_pair()
    data, _ = client.send(p.PingRequest(id=1))
    feed(server, data, [50, 51])  # the header declares no fds
    assert drain(server) == [p.PingRequest(id=1), p.StrayFds((50, 51))]
    assert server.state is ConnectionState.READY


def test_stray_fds_from_mid_frame_chunks() -> None:
    client, server = connected_pair()
    data, _ = client.send(p.PingRequest(id=1))
    server.receive_data(data[:3])
    server.receive_data(data[3:6], [60])
    server.receive_data(data[6:])
    # Stray as soon as the frame's header says no frame starts in their bytes.
    assert drain(server) == [p.StrayFds((60,)), p.PingRequest(id=1)]
    assert server.state is ConnectionState.READY
