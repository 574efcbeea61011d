"""Peer garbage: every malformed or hostile input becomes a RemoteProtocolError
with a stable code (never another exception), and the fds it carried are
handed back for closing."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import pytest

import npu_protocol as p
from npu_protocol import ConnectionState, ErrorCode
from tests.protocol.helpers import (
    WELCOME,
    AnyConnection,
    connected_pair,
    drain,
    feed,
    frame,
    transfer,
)


def fatal(conn: AnyConnection, data: bytes, fds: list[int] | None = None) -> p.RemoteProtocolError:
    """Feed ``data`` and return the protocol error it must cause."""
    feed(conn, data, fds or [])
    with pytest.raises(p.RemoteProtocolError) as info:
        drain(conn)
    assert conn.state is ConnectionState.ERROR
    return info.value


def packed(value: Any) -> bytes:
    return frame(msgspec.msgpack.encode(value))


def ready_server() -> p.ServerConnection:
    return connected_pair()[1]


# --- garbage payloads --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        (b"\xc1", "invalid opcode"),
        (msgspec.msgpack.encode([1, 2]), "Expected `object`, got `array`"),
        (msgspec.msgpack.encode({"id": 1}), "missing required field `type`"),
        (msgspec.msgpack.encode({"type": "format_disk"}), "Invalid value 'format_disk'"),
        (msgspec.msgpack.encode({"type": "ping", "id": 1}) + b"\x00", "trailing characters"),
        (b"\x82\xa4type\xa4ping\xa2id", "truncated"),
        (b"\xdf\xff\xff\xff\xff", "truncated"),  # a map claiming 4 billion entries
        (
            b"\x83\xa4type\xa4ping\xa2id\x01\xa1x" + b"\x91" * 50_000 + b"\x01",
            "nested too deeply",
        ),
    ],
)
def test_garbage_payloads(payload: bytes, detail: str) -> None:
    error = fatal(ready_server(), frame(payload))
    assert error.code is ErrorCode.BAD_MESSAGE
    assert detail in str(error)


@pytest.mark.parametrize(
    ("message", "where"),
    [
        ({"type": "alloc", "id": 1, "size": "big"}, "$.size"),
        ({"type": "alloc", "id": 1.0, "size": 1}, "$.id"),
        ({"type": "alloc", "id": True, "size": 1}, "$.id"),
        ({"type": "ping", "id": 1, "payload": "text"}, "$.payload"),
        ({"type": "ping", "id": 1, "payload": None}, "$.payload"),
        ({"type": "invoke", "id": 1, "handle": 1, "method": 0, "inputs": {}}, "$.inputs"),
        (
            {"type": "invoke", "id": 1, "handle": 1, "method": 0, "inputs": [{"data": b""}]},
            "$.inputs[0]",
        ),
        (
            {"type": "invoke", "id": 1, "handle": 1, "method": 0, "inputs": [{"type": "pipe"}]},
            "$.inputs[0].type",
        ),
    ],
)
def test_wrong_types(message: dict[str, Any], where: str) -> None:
    error = fatal(ready_server(), packed(message))
    assert error.code is ErrorCode.BAD_MESSAGE
    assert where in str(error)


@pytest.mark.parametrize(
    ("message", "where"),
    [
        ({"type": "alloc", "id": 2**32, "size": 1}, "$.id"),
        ({"type": "alloc", "id": -1, "size": 1}, "$.id"),
        ({"type": "alloc", "id": 1, "size": 0}, "$.size"),
        ({"type": "alloc", "id": 1, "size": p.MAX_BUFFER_SIZE + 1}, "$.size"),
        ({"type": "free", "id": 1, "buffer": 0}, "$.buffer"),
        ({"type": "close", "id": 1, "handle": 2**32}, "$.handle"),
        ({"type": "open", "id": 1, "uri": "file:///a b"}, "$.uri"),
        ({"type": "open", "id": 1, "uri": "x" * 1024}, "$.uri"),
        ({"type": "ping", "id": 1, "payload": bytes(4097)}, "$.payload"),
        ({"type": "invoke", "id": 1, "handle": 1, "method": 32}, "$.method"),
        ({"type": "invoke", "id": 1, "handle": 1, "method": 0, "timeout_ms": 0}, "$.timeout_ms"),
        (
            {
                "type": "invoke",
                "id": 1,
                "handle": 1,
                "method": 0,
                "outputs": [{"type": "inline", "capacity": 1}] * 256,
            },
            "$.outputs",
        ),
        (
            {
                "type": "invoke",
                "id": 1,
                "handle": 1,
                "method": 0,
                "inputs": [
                    {"type": "slice", "buffer": 1, "offset": p.MAX_BUFFER_SIZE, "length": 1}
                ],
            },
            "ends past",
        ),
    ],
)
def test_values_beyond_their_bounds(message: dict[str, Any], where: str) -> None:
    error = fatal(ready_server(), packed(message))
    assert error.code is ErrorCode.BAD_MESSAGE
    assert where in str(error)


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"method": 1, "sc": 0x01000000}, "exactly one of method and sc"),
        ({}, "exactly one of method and sc"),
        ({"sc": 0x01010000}, "declares 1 inputs and 0 outputs, the invoke has 0 and 0"),
        ({"sc": 0x01000011}, "declares handle arguments"),
    ],
)
def test_inconsistent_invokes(fields: dict[str, int], detail: str) -> None:
    error = fatal(ready_server(), packed({"type": "invoke", "id": 1, "handle": 1, **fields}))
    assert error.code is ErrorCode.BAD_MESSAGE
    assert detail in str(error)


@pytest.mark.parametrize(
    "name", ["", "a b", "evil\nINFO forged log line", "x" * 65, "-leading-dash", "ünïcode"]
)
def test_client_names_that_could_forge_logs_are_refused(name: str) -> None:
    error = fatal(p.ServerConnection(), packed({"type": "hello", "client_name": name}))
    assert error.code is ErrorCode.BAD_MESSAGE
    assert "$.client_name" in str(error)


def test_unknown_priority_class_is_refused() -> None:
    error = fatal(
        p.ServerConnection(), packed({"type": "hello", "client_name": "a", "priority": "urgent"})
    )
    assert "Invalid enum value 'urgent'" in str(error)


def test_unknown_fields_are_ignored() -> None:
    server = p.ServerConnection()
    feed(
        server, packed({"type": "hello", "client_name": "a", "favourite_colour": [1, {"x": None}]})
    )
    assert server.next_event() == p.Hello(protocol_version=1, client_name="a")  # no key: version 1


# --- frames and fds ----------------------------------------------------------------------


def test_oversize_length_prefix_before_the_handshake() -> None:
    server = p.ServerConnection()
    header = b"NP\x00\x00" + (p.HANDSHAKE_MAX_FRAME_SIZE + 1).to_bytes(4, "little")
    error = fatal(server, header)
    assert error.code is ErrorCode.FRAME_TOO_LARGE
    assert server.statistics().bytes_buffered == len(header)  # no payload was waited for


def test_frames_above_the_negotiated_limit() -> None:
    server = ready_server()
    header = b"NP\x00\x00" + (WELCOME.limits.max_frame_size + 1).to_bytes(4, "little")
    assert fatal(server, header).fields == {
        "size": WELCOME.limits.max_frame_size + 1,
        "limit": WELCOME.limits.max_frame_size,
    }


def test_fd_count_over_the_limit() -> None:
    error = fatal(ready_server(), b"NP\x05\x00\x01\x00\x00\x00\xc0", [1, 2, 3, 4, 5])
    assert error.code is ErrorCode.TOO_MANY_FDS


def test_fds_declared_by_a_message_that_carries_none() -> None:
    server = ready_server()
    payload = msgspec.msgpack.encode(p.PingRequest(id=1))
    error = fatal(server, frame(payload, fd_count=1), [90])
    assert error.code is ErrorCode.FD_COUNT_MISMATCH
    assert str(error) == "ping carries 0 fds but its frame declares 1"
    assert server.take_pending_fds() == [90]
    assert server.take_pending_fds() == []


def test_alloc_reply_without_its_fd() -> None:
    client, server = connected_pair()
    transfer(client, server, p.AllocRequest(id=1, size=1))
    payload = msgspec.msgpack.encode(p.AllocReply(id=1, buffer=1, size=4096, fd=0))
    error = fatal(client, frame(payload, fd_count=0))
    assert str(error) == "alloc_reply carries 1 fds but its frame declares 0"


@pytest.mark.parametrize("slot", [1, 3, 4])
def test_alloc_reply_naming_a_slot_it_does_not_have(slot: int) -> None:
    client, server = connected_pair()
    transfer(client, server, p.AllocRequest(id=1, size=1))
    payload = msgspec.msgpack.encode(p.AllocReply(id=1, buffer=1, size=4096, fd=slot))
    error = fatal(client, frame(payload, fd_count=1), [91])
    assert error.code is ErrorCode.BAD_MESSAGE
    assert client.take_pending_fds() == [91]


def test_fewer_fds_than_declared() -> None:
    client, server = connected_pair()
    transfer(client, server, p.AllocRequest(id=1, size=1))
    payload = msgspec.msgpack.encode(p.AllocReply(id=1, buffer=1, size=4096, fd=0))
    error = fatal(client, frame(payload, fd_count=1))
    assert error.code is ErrorCode.MISSING_FDS


def test_truncated_ancillary_data() -> None:
    client, server = connected_pair()
    transfer(client, server, p.AllocRequest(id=1, size=1))
    data, _ = server.send(p.AllocReply(id=1, buffer=1, size=4096, fd=5))
    client.receive_data(data, [], fds_truncated=True)
    with pytest.raises(p.RemoteProtocolError) as info:
        client.next_event()
    assert info.value.code is ErrorCode.FDS_TRUNCATED


# --- the state machine, from the receiving side -------------------------------------------


def test_request_before_hello() -> None:
    error = fatal(p.ServerConnection(), packed(p.PingRequest(id=1)))
    assert error.code is ErrorCode.UNEXPECTED_MESSAGE
    assert str(error) == "unexpected ping message: the first message must be a Hello"


def test_request_before_the_welcome_was_sent() -> None:
    server = p.ServerConnection()
    feed(server, packed(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="eager")))
    server.next_event()
    error = fatal(server, packed(p.PingRequest(id=1)))
    assert "the client must wait for the Welcome" in str(error)


def test_second_hello() -> None:
    error = fatal(
        ready_server(), packed(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="again"))
    )
    assert str(error) == "unexpected hello message: the handshake is over"


def test_duplicate_request_id_in_flight() -> None:
    server = ready_server()
    feed(server, packed(p.PingRequest(id=4)))
    server.next_event()
    error = fatal(server, packed(p.FreeRequest(id=4, buffer=1)))
    assert error.code is ErrorCode.DUPLICATE_REQUEST_ID
    assert str(error) == "request id 4 is already in flight"


def test_id_reuse_after_the_answer_is_fine() -> None:
    client, server = connected_pair()
    transfer(client, server, p.PingRequest(id=4))
    transfer(server, client, p.PongReply(id=4))
    transfer(client, server, p.PingRequest(id=4))


def test_more_requests_in_flight_than_allowed() -> None:
    server = ready_server()
    limit = WELCOME.limits.max_in_flight
    feed(server, b"".join(packed(p.PingRequest(id=i)) for i in range(limit + 1)))
    for _ in range(limit):
        server.next_event()
    with pytest.raises(p.RemoteProtocolError) as info:
        server.next_event()
    assert info.value.code is ErrorCode.TOO_MANY_IN_FLIGHT


def test_reply_to_unknown_id() -> None:
    client, _ = connected_pair()
    error = fatal(client, packed(p.PongReply(id=99)))
    assert error.code is ErrorCode.UNKNOWN_REQUEST_ID
    assert str(error) == "pong answers request id 99, which is not in flight"


def test_error_for_unknown_id() -> None:
    client, _ = connected_pair()
    error = fatal(client, packed(p.ErrorMessage.for_code(ErrorCode.SESSION_BUSY, id=99)))
    assert error.code is ErrorCode.UNKNOWN_REQUEST_ID


def test_reply_of_the_wrong_type() -> None:
    client, _ = connected_pair()
    client.send(p.PingRequest(id=1))
    error = fatal(client, packed(p.FreeReply(id=1)))
    assert str(error) == "unexpected free_reply message: request 1 is a ping, whose reply is pong"


def test_server_speaking_before_the_hello() -> None:
    error = fatal(p.ClientConnection(), packed(WELCOME))
    assert "the server spoke before the Hello" in str(error)


@pytest.mark.parametrize(
    "message",
    [
        p.PongReply(id=1),
        p.SessionRestarted(epoch=2),
        p.ErrorMessage.for_code(ErrorCode.QNN, id=1, msg="x"),
    ],
)
def test_anything_but_welcome_or_refusal_during_the_handshake(message: p.Message) -> None:
    client = p.ClientConnection()
    client.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="c"))
    error = fatal(client, packed(message))
    assert "the handshake is not finished" in str(error)


def test_second_welcome() -> None:
    client, _ = connected_pair()
    assert "the handshake is over" in str(fatal(client, packed(WELCOME)))


def test_welcome_with_limits_that_cannot_hold_an_inline_invoke() -> None:
    client = p.ClientConnection()
    client.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="c"))
    welcome = msgspec.to_builtins(WELCOME)
    welcome["limits"]["max_inline_bytes"] = welcome["limits"]["max_frame_size"]
    error = fatal(client, packed(welcome))
    assert "leaves less than 65536 bytes" in str(error)


# --- after a peer error --------------------------------------------------------------------


def test_after_a_peer_error_the_server_says_why_once_and_closes() -> None:
    server = ready_server()
    error = fatal(server, frame(b"\xc1"))
    with pytest.raises(p.RemoteProtocolError) as again:
        server.next_event()
    assert again.value is error
    with pytest.raises(p.LocalProtocolError):
        server.send(p.SessionRestarted(epoch=2))
    goodbye, fds = server.send(p.ErrorMessage.for_code(error.code, **error.fields))
    assert fds == []
    assert server.state is ConnectionState.CLOSED
    client = p.ClientConnection()
    client.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="c"))
    feed(client, goodbye)
    event = client.next_event()
    assert isinstance(event, p.ErrorMessage)
    assert event.error_code is ErrorCode.BAD_MESSAGE
    assert event.message.startswith("malformed message: MessagePack data is malformed")


def test_peer_text_in_errors_is_escaped_clipped_and_still_sendable() -> None:
    server = ready_server()
    tag = "evil\n\x1b[31mred" + "x" * 60_000
    error = fatal(server, packed({"type": tag}))
    detail = error.fields["detail"]
    assert "\n" not in detail
    assert "\x1b" not in detail
    assert "evil\\n\\x1b[31mred" in detail
    assert len(detail) <= 200
    goodbye, _ = server.send(p.ErrorMessage.for_code(error.code, **error.fields))
    assert len(goodbye) < 1024


# --- repeated keys and messages in the wrong direction -------------------------------------


def _map(*pairs: tuple[bytes, bytes]) -> bytes:
    """A msgpack map written by hand, so a key can appear twice."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


def _str(text: str) -> bytes:
    return msgspec.msgpack.encode(text)


@pytest.mark.parametrize(
    "payload",
    [
        # the last value would win: id 2 is what the code would act on
        _map((_str("type"), _str("ping")), (_str("id"), b"\x01"), (_str("id"), b"\x02")),
        # the same key as a fixstr and as a str8
        _map((_str("type"), _str("ping")), (_str("id"), b"\x01"), (b"\xd9\x02id", b"\x02")),
        # the tag itself twice
        _map((_str("type"), _str("ping")), (_str("id"), b"\x01"), (_str("type"), _str("ping"))),
        # inside a value under an unknown key, which is otherwise ignored
        _map(
            (_str("type"), _str("ping")),
            (_str("id"), b"\x01"),
            (_str("extra"), _map((b"\x01", b"\xc0"), (b"\xcc\x01", b"\xc0"))),
        ),
    ],
)
def test_a_key_given_twice_is_fatal(payload: bytes) -> None:
    server = connected_pair()[1]
    error = fatal(server, frame(payload))
    assert error.code is ErrorCode.BAD_MESSAGE
    assert "appears twice in one map" in str(error)


def test_a_key_given_twice_in_a_nested_argument_is_fatal() -> None:
    inline = _map(
        (_str("type"), _str("inline")), (_str("data"), b"\xc4\x00"), (_str("data"), b"\xc4\x01x")
    )
    payload = _map(
        (_str("type"), _str("invoke")),
        (_str("id"), b"\x01"),
        (_str("handle"), b"\x01"),
        (_str("method"), b"\x00"),
        (_str("inputs"), b"\x91" + inline),
    )
    error = fatal(connected_pair()[1], frame(payload))
    assert "'data' appears twice" in str(error)


def test_distinct_keys_of_every_shape_pass() -> None:
    server = connected_pair()[1]
    payload = _map(
        (_str("type"), _str("ping")),
        (_str("id"), b"\x01"),
        (_str("x"), _map((b"\x01", b"\xc0"), (b"\xcc\x02", b"\xc0"), (b"\xff", b"\xc0"))),
        (_str("y"), b"\xd4\x01\x00"),  # an extension value under an unknown key is skipped
    )
    feed(server, frame(payload))
    assert server.next_event() == p.PingRequest(id=1)


def test_an_extension_value_under_a_known_key_is_bad() -> None:
    payload = _map((_str("type"), _str("ping")), (_str("id"), b"\xd4\x01\x00"))
    assert fatal(connected_pair()[1], frame(payload)).code is ErrorCode.BAD_MESSAGE


@pytest.mark.parametrize("ready", [False, True])
@pytest.mark.parametrize(
    "message",
    [
        WELCOME,
        p.PongReply(id=1),
        p.ShuttingDown(),
        p.ErrorMessage.for_code(ErrorCode.TIMEOUT, id=1, operation="x", timeout_ms=1),
    ],
    ids=p.tag_of,
)
def test_a_server_message_sent_to_the_server_is_unexpected(message: p.Message, ready: bool) -> None:
    server = connected_pair()[1] if ready else p.ServerConnection()
    error = fatal(server, packed(message))
    assert error.code is ErrorCode.UNEXPECTED_MESSAGE
    assert str(error) == f"unexpected {p.tag_of(message)} message: only the server sends it"


def test_a_client_message_sent_to_the_client_is_unexpected() -> None:
    client = connected_pair()[0]
    error = fatal(client, packed(p.PingRequest(id=1)))
    assert error.code is ErrorCode.UNEXPECTED_MESSAGE
    assert str(error) == "unexpected ping message: only the client sends it"


def test_a_misdirected_message_with_bad_fields_is_still_unexpected() -> None:
    error = fatal(p.ServerConnection(), packed({"type": "welcome", "epoch": "soon"}))
    assert error.code is ErrorCode.UNEXPECTED_MESSAGE


def test_a_repeated_key_hidden_by_a_float_that_grows_in_a_round_trip_is_caught() -> None:
    # A float32 grows by 4 bytes when msgspec re-encodes it (as float64); a repeated
    # key of 4 bytes ("id": 2 is 4 bytes) shrinks the round trip by as much. Equal
    # lengths must not pass: a payload with a float marker is always walked.
    payload = _map(
        (_str("type"), _str("ping")),
        (_str("id"), b"\x01"),
        (_str("id"), b"\x02"),
        (_str("f"), b"\xca" + struct.pack(">f", 1.5)),
    )
    assert len(msgspec.msgpack.encode(msgspec.msgpack.decode(payload))) == len(payload)
    error = fatal(connected_pair()[1], frame(payload))
    assert "'id' appears twice" in str(error)


def test_keys_written_longer_than_they_need_are_not_repeats() -> None:
    server = connected_pair()[1]
    payload = _map((b"\xd9\x04type", b"\xd9\x04ping"), (b"\xd9\x02id", b"\xcc\x01"))
    feed(server, frame(payload))
    assert server.next_event() == p.PingRequest(id=1)


def _array_under_unknown_key(items: int) -> bytes:
    """A ping whose unknown key holds an array of ``items`` one-byte integers: with the
    map, its three keys, two values and the array itself, ``items`` + 7 items in all."""
    array = b"\xdd" + struct.pack(">I", items) + b"\x00" * items
    return _map((_str("type"), _str("ping")), (_str("id"), b"\x01"), (_str("pad"), array))


def test_a_request_of_more_items_than_the_walk_allows_is_fatal() -> None:
    """Half a megabyte of one-byte integers would cost the key walk 80 ms of a
    worker's GIL (issue 16, item 11): past MAX_REQUEST_ITEMS the walk stops and the
    request is refused."""
    payload = _array_under_unknown_key(1 << 19)
    error = fatal(connected_pair()[1], frame(payload))
    assert error.code is ErrorCode.BAD_MESSAGE
    assert f"more than {p.MAX_REQUEST_ITEMS} msgpack items" in str(error)


def test_a_request_within_the_item_bound_passes() -> None:
    server = connected_pair()[1]
    payload = _array_under_unknown_key(p.MAX_REQUEST_ITEMS - 7)  # exactly the bound
    feed(server, frame(payload))
    assert isinstance(server.next_event(), p.PingRequest)
