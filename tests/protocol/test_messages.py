"""Messages on their own: validation rules, helpers, and hypothesis round-trips."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npu_protocol as p
from npu_protocol import ErrorCode
from npu_protocol._scalars import make_scalars, split_scalars
from npud.fastrpc.kernel import abi
from tests.protocol.helpers import connected_pair, drain
from tests.protocol.strategies import any_of, of

# --- the scalars word ---------------------------------------------------------------------


@given(st.integers(0, 31), st.integers(0, 255), st.integers(0, 255))
def test_scalars_match_the_daemons_abi(method: int, nin: int, nout: int) -> None:
    assert make_scalars(method, nin, nout) == abi.remote_scalars_make(method, nin, nout)


@given(st.integers(0, 2**32 - 1))
def test_split_scalars_matches_the_daemons_abi(sc: int) -> None:
    fields = split_scalars(sc)
    assert fields == (
        abi.remote_scalars_attr(sc),
        abi.remote_scalars_method(sc),
        abi.remote_scalars_inbufs(sc),
        abi.remote_scalars_outbufs(sc),
        abi.remote_scalars_inhandles(sc),
        abi.remote_scalars_outhandles(sc),
    )


def test_make_scalars_refuses_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="scalars out of range"):
        make_scalars(32, 0, 0)


def test_invoke_scalars_from_method_or_given() -> None:
    args: dict[str, Any] = {
        "id": 1,
        "handle": 1,
        "inputs": (p.InlineInput(data=b"ab"), p.BufferSlice(buffer=1, length=3)),
        "outputs": (p.InlineOutput(capacity=5),),
    }
    by_method = p.InvokeRequest(method=2, **args)
    assert by_method.scalars == 0x02020100
    assert p.InvokeRequest(sc=0xE2020100, **args).scalars == 0xE2020100  # attributes pass through
    assert by_method.inline_input_bytes == 2
    assert by_method.inline_output_bytes == 5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one of method and sc"),
        ({"method": 1, "sc": 0x01000000}, "exactly one of method and sc"),
        ({"sc": 0x00010000}, "sc 0x00010000 declares 1 inputs and 0 outputs"),
        ({"sc": 0x00000010}, "declares handle arguments"),
    ],
)
def test_invoke_consistency_is_checked_on_construction(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        p.InvokeRequest(id=1, handle=1, **fields)


def test_limits_keep_room_for_an_inline_invoke() -> None:
    with pytest.raises(ValueError, match="leaves less than"):
        p.ClientLimits(priority=p.Priority.NORMAL, max_frame_size=1 << 20, max_inline_bytes=1 << 20)
    with pytest.raises(ValueError, match="default_timeout_ms 10 exceeds max_timeout_ms 5"):
        p.ClientLimits(priority=p.Priority.NORMAL, max_timeout_ms=5, default_timeout_ms=10)


# --- errors -------------------------------------------------------------------------------


def test_error_message_renders_the_template_and_keeps_raw_fields() -> None:
    error = p.ErrorMessage.for_code(ErrorCode.INVOKE_FAILED, id=3, code=0x8000040E)
    assert error.code == 102
    assert error.message == "remote invoke failed with DSP result 0x8000040E (AEE_EBADPARM)"
    assert error.fields == {"code": 0x8000040E}
    assert error.error_code is ErrorCode.INVOKE_FAILED
    tried = p.ErrorMessage.for_code(ErrorCode.DEVICE_NOT_FOUND, tried=["/dev/a", "/dev/b"])
    assert tried.fields == {"tried": "['/dev/a', '/dev/b']"}
    flag = p.ErrorMessage.for_code(ErrorCode.INVALID_ARGUMENT, detail=True)
    assert flag.fields == {"detail": "True"}


def test_error_codes_unknown_to_this_package_still_decode() -> None:
    raw = {"type": "error", "code": 999, "message": "from the future"}
    error = msgspec.msgpack.decode(msgspec.msgpack.encode(raw), type=p.ErrorMessage)
    assert error.error_code is None


def test_protocol_errors_carry_code_fields_and_message() -> None:
    error = p.RemoteProtocolError(ErrorCode.DUPLICATE_REQUEST_ID, request_id=7)
    assert error.code is ErrorCode.DUPLICATE_REQUEST_ID
    assert error.fields == {"request_id": 7}
    assert error.message == str(error) == "request id 7 is already in flight"
    assert isinstance(error, p.ProtocolError)
    with pytest.raises(TypeError):
        p.LocalProtocolError(ErrorCode.DUPLICATE_REQUEST_ID)  # a missing field is a bug


def test_wire_error_codes_are_in_their_ranges() -> None:
    wire = [c for c in ErrorCode if c.name in _WIRE_CODES]
    assert [int(c) for c in wire] == list(range(500, 500 + len(_WIRE_CODES)))
    admission = [
        ErrorCode[n] for n in ("NOT_PERMITTED", "QUOTA_EXCEEDED", "TIMEOUT", "SHUTTING_DOWN")
    ]
    assert [int(c) for c in admission] == [600, 601, 602, 603]


_WIRE_CODES = (
    "FRAME_TOO_LARGE",
    "BAD_FRAME_HEADER",
    "TOO_MANY_FDS",
    "MISSING_FDS",
    "FD_COUNT_MISMATCH",
    "FDS_TRUNCATED",
    "BAD_MESSAGE",
    "UNEXPECTED_MESSAGE",
    "UNSUPPORTED_VERSION",
    "DUPLICATE_REQUEST_ID",
    "UNKNOWN_REQUEST_ID",
    "TOO_MANY_IN_FLIGHT",
    "TRUNCATED_FRAME",
    "CONNECTION_CLOSED",
)


# --- the unions ----------------------------------------------------------------------------


def test_every_request_has_exactly_one_reply_type() -> None:
    requests = set(typing.get_args(p.AnyRequest))
    replies = set(typing.get_args(p.AnyReply))
    assert set(p.REPLY_TYPES) == requests
    assert set(p.REPLY_TYPES.values()) == replies


@pytest.mark.parametrize("union", [p.ClientMessage, p.ServerMessage])
def test_tags_are_unique_per_direction(union: Any) -> None:
    tags = [p.tag_of(cls) for cls in typing.get_args(union)]
    assert len(tags) == len(set(tags))


def test_the_fd_carriers_carry_one_fd_each() -> None:
    carriers = {
        cls
        for union in (p.ClientMessage, p.ServerMessage)
        for cls in typing.get_args(union)
        if cls.fd_fields
    }
    assert carriers == {p.AllocReply, p.ModelLoadRequest, p.ModelLoadReply}
    for cls in carriers:
        assert cls.fd_fields == ("fd",)


def test_a_model_load_carries_its_fd_both_ways() -> None:
    client, server = p.ClientConnection(), p.ServerConnection()
    data, _ = client.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="t"))
    server.receive_data(data)
    assert isinstance(server.next_event(), p.Hello)
    welcome = p.Welcome(
        server_version="0",
        protocol_version=2,
        backend="emulator",
        dsp=p.DspCapabilities(),
        limits=p.ClientLimits(priority=p.Priority.NORMAL),
        epoch=1,
    )
    data, _ = server.send(welcome)
    client.receive_data(data)
    client.next_event()
    request = p.ModelLoadRequest(id=1, fd=17, name="vad.onnx", shapes={"x": (1, 576)})
    data, fds = client.send(request)
    assert fds == [17]
    server.receive_data(data, [99])
    received = server.next_event()
    assert received == p.ModelLoadRequest(id=1, fd=99, name="vad.onnx", shapes={"x": (1, 576)})
    info = p.ModelInfo(arena_bytes=4096)
    data, fds = server.send(p.ModelLoadReply(id=1, model=1, info=info, fd=5))
    assert fds == [5]
    client.receive_data(data, [6])
    assert client.next_event() == p.ModelLoadReply(id=1, model=1, info=info, fd=6)


@pytest.mark.parametrize(
    "shapes",
    [{"x": (0,)}, {"x": tuple(range(1, 10))}, {"x": (2**32,)}, {"n" * 128: (1,)}],
    ids=["zero dim", "rank 9", "dim too big", "long name"],
)
def test_model_load_shapes_are_bounded(shapes: dict[str, tuple[int, ...]]) -> None:
    frame = msgspec.msgpack.encode({"type": "model_load", "id": 1, "fd": 0, "shapes": shapes})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(frame, type=p.ModelLoadRequest)


def test_messages_are_immutable() -> None:
    ping = p.PingRequest(id=1)
    with pytest.raises(AttributeError):
        ping.id = 2  # type: ignore[misc]


# --- round trips ------------------------------------------------------------------------------

_CLIENT = msgspec.msgpack.Decoder(p.ClientMessage)
_SERVER = msgspec.msgpack.Decoder(p.ServerMessage)


@settings(deadline=None)  # generation cost varies; speed is bench/'s business
@given(any_of(p.ClientMessage))
def test_client_messages_round_trip(message: p.Message) -> None:
    assert _CLIENT.decode(msgspec.msgpack.encode(message)) == message


@settings(deadline=None)  # generation cost varies; speed is bench/'s business
@given(any_of(p.ServerMessage))
def test_server_messages_round_trip(message: p.Message) -> None:
    assert _SERVER.decode(msgspec.msgpack.encode(message)) == message


@st.composite
def _reply_to(draw: st.DrawFn, request: p.AnyRequest) -> p.Message:
    """A valid answer to ``request``: its reply type, or sometimes an error."""
    if draw(st.integers(0, 4)) == 0:
        return p.ErrorMessage.for_code(ErrorCode.SESSION_BUSY, id=request.id)
    reply_type = p.REPLY_TYPES[type(request)]
    if isinstance(request, p.InvokeRequest):
        outputs = tuple(
            draw(st.binary(max_size=arg.capacity)) if isinstance(arg, p.InlineOutput) else None
            for arg in request.outputs
        )
        return p.InvokeReply(id=request.id, outputs=outputs)
    reply: p.Reply = draw(of(reply_type))
    return msgspec.structs.replace(reply, id=request.id)


@settings(deadline=None)  # generation cost varies; speed is bench/'s business
@given(
    st.lists(any_of(p.AnyRequest), max_size=8, unique_by=lambda r: r.id),
    st.randoms(use_true_random=False),
    st.data(),
)
def test_pipelined_sessions_round_trip_in_any_order_and_any_chunking(
    requests: list[p.AnyRequest], random: Any, data: st.DataObject
) -> None:
    client, server = connected_pair()
    for request in requests:
        frame, fds = client.send(request)
        _deliver(server, frame, fds, data)  # a model_load's fd goes with its first byte
    assert drain(server) == requests

    answers = [data.draw(_reply_to(request)) for request in requests]
    random.shuffle(answers)
    for answer in answers:
        frame, frame_fds = server.send(answer)  # type: ignore[arg-type]
        _deliver(client, frame, frame_fds, data)  # each frame is its own sendmsg
    received = drain(client)
    assert received == answers
    assert client.in_flight == server.in_flight == frozenset()


def _deliver(conn: Any, frame: bytes | bytearray, fds: list[int], data: st.DataObject) -> None:
    """Feed ``frame`` in random pieces, its fds with the first piece (b"" would mean EOF)."""
    if not frame:
        return
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(frame) - 1)), max_size=6)))
    start = 0
    for cut in [*cuts, len(frame)]:
        if cut > start:
            conn.receive_data(frame[start:cut], fds if start == 0 else [])
            start = cut


def test_error_message_clips_long_text_so_it_stays_sendable() -> None:
    error = p.ErrorMessage.for_code(ErrorCode.INVALID_ARGUMENT, detail="y" * 5000)
    detail = error.fields["detail"]
    assert isinstance(detail, str)
    assert len(detail) == 1024
    assert detail.endswith("...")
    assert len(error.message) <= 4096
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(error), type=p.ServerMessage) == error


def test_the_hello_never_changes() -> None:
    """PROTOCOL.md section 12: the hello's version 1 keys keep their types and defaults
    forever (a hello without ``protocol_version`` offers 1), and every key added later
    has a default that means what version 1 meant."""
    fields = {field.name: field for field in mi.type_info(p.Hello).fields}  # type: ignore[attr-defined]
    frozen = {
        "protocol_version": (mi.IntType, 1),
        "client_name": (mi.StrType, msgspec.NODEFAULT),
        "priority": (mi.EnumType, p.Priority.NORMAL),
    }
    for name, (kind, default) in frozen.items():
        assert isinstance(fields[name].type, kind), name
        assert fields[name].default == default, name
    later = {name: field.default for name, field in fields.items() if name not in frozen}
    assert later == {"budget": None, "isolate": False, "watch": False}
    assert msgspec.msgpack.decode(
        msgspec.msgpack.encode({"type": "hello", "client_name": "old-tool"}), type=p.Hello
    ) == p.Hello(protocol_version=1, client_name="old-tool")
