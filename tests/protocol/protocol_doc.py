"""The parts of protocol/PROTOCOL.md that are derived from the code.

* ``render_examples()``: example frames, produced by real connections.
* ``render_error_table()``: every ErrorCode with its number and template.
* ``render_constants()``: the protocol's limits.
* ``field_rows(cls)``: the field / type / default cells of a message table.

test_protocol_doc.py checks that PROTOCOL.md holds exactly this text, so the
document cannot drift from the code. After changing the protocol, regenerate
the blocks with ``python -m tests.protocol.protocol_doc`` and paste them (the
field tables' "meaning" column is written by hand).
"""

from __future__ import annotations

import enum
import pathlib
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final

import msgspec
import msgspec.inspect as mi

import npu_protocol as p
from npu_protocol.errors import template

# --- type and default cells -------------------------------------------------------

_NAMED_INT_RANGES: Final = {
    (0, 0xFFFF): "u16",
    (0, 0xFFFF_FFFF): "u32",
    (0, 2**63 - 1): "u63",
}


def describe_type(info: mi.Type) -> str:
    """How a field's type reads in the tables: msgpack family plus bounds."""
    match info:
        case mi.IntType(ge=ge, le=le):
            if ge is None and le is None:
                return "int"
            named = _NAMED_INT_RANGES.get((ge, le)) if ge is not None and le is not None else None
            return named or f"int {ge}..{le}"
        case mi.StrType(max_length=max_length, pattern=pattern):
            if pattern is not None:
                return f"str matching `{pattern}`"
            return f"str ≤ {max_length} chars" if max_length is not None else "str"
        case mi.BytesType(max_length=max_length):
            return f"bin ≤ {max_length} bytes" if max_length is not None else "bin"
        case mi.BoolType() | mi.FloatType():
            return "bool" if isinstance(info, mi.BoolType) else "float"
        case mi.NoneType():
            return "nil"
        case mi.EnumType() | mi.LiteralType():
            return _choices(info)
        case mi.StructType(cls=cls):
            return f"{cls.__name__} map"
        case mi.UnionType(types=types):
            return " or ".join(describe_type(t) for t in types)
        case (
            mi.VarTupleType(item_type=item, max_length=max_length)
            | mi.ListType(item_type=item, max_length=max_length)
        ):
            return f"array ≤ {max_length} of ({describe_type(item)})"
        case mi.DictType(key_type=key, value_type=value, max_length=max_length):
            return f"map ≤ {max_length} of ({describe_type(key)}) → ({describe_type(value)})"
    raise TypeError(f"no description for {info!r}")


def _choices(info: mi.EnumType | mi.LiteralType) -> str:
    """A closed set of strings: an enum's values in order, a literal's sorted."""
    if isinstance(info, mi.EnumType):
        values = [str(member.value) for member in info.cls]
    else:
        values = sorted(str(value) for value in info.values)
    return " \\| ".join(f'"{value}"' for value in values)


def describe_default(field: mi.Field) -> str:
    if field.required:
        return "required"
    if field.default_factory is not msgspec.NODEFAULT:
        made = field.default_factory()
        if isinstance(made, msgspec.Struct):
            return "all defaults"
        return _literal(made)
    return _literal(field.default)


def _literal(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return f'"{value.value}"'
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bytes) and not value:
        return "empty bin"
    if isinstance(value, tuple | list) and not value:
        return "[]"
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"no literal for {value!r}")


def field_rows(cls: type[msgspec.Struct]) -> list[tuple[str, str, str]]:
    """(field, type, default) for each key of ``cls``'s map, the tag first."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    rows = []
    if info.tag_field is not None:
        rows.append((f"`{info.tag_field}`", f'"{info.tag}"', "required"))
    for field in info.fields:
        rows.append((f"`{field.encode_name}`", describe_type(field.type), describe_default(field)))
    return rows


DOCUMENTED_STRUCTS: Final[tuple[type[msgspec.Struct], ...]] = (
    p.Hello,
    p.Welcome,
    p.ErrorMessage,
    p.AllocRequest,
    p.AllocReply,
    p.FreeRequest,
    p.FreeReply,
    p.MapRequest,
    p.MapReply,
    p.UnmapRequest,
    p.UnmapReply,
    p.OpenRequest,
    p.OpenReply,
    p.CloseRequest,
    p.CloseReply,
    p.InvokeRequest,
    p.InlineInput,
    p.InlineOutput,
    p.BufferSlice,
    p.InvokeReply,
    p.ModelLoadRequest,
    p.ModelConstant,
    p.ModelLoadReply,
    p.ModelInfo,
    p.GraphInfo,
    p.TensorInfo,
    p.ModelInfoRequest,
    p.ModelInfoReply,
    p.ModelRunRequest,
    p.ModelRunReply,
    p.ModelUnloadRequest,
    p.ModelUnloadReply,
    p.ModelChainRequest,
    p.ChainStep,
    p.ChainSource,
    p.ChainOutput,
    p.ModelChainReply,
    p.ModelRow,
    p.StatusRequest,
    p.StatusReply,
    p.PingRequest,
    p.PongReply,
    p.DebugRequest,
    p.DebugReply,
    p.SessionRestarted,
    p.ShuttingDown,
    p.DspCapabilities,
    p.ClientLimits,
    p.OwnPool,
    p.DaemonStatus,
    p.ShellStatus,
    p.SessionRow,
    p.LaneRow,
    p.SchedulerRow,
    p.PoolRow,
    p.DomainRow,
    p.MemoryRow,
    p.Budget,
    p.Totals,
    p.ClientRow,
    p.HoldRow,
)
"""Every struct that appears on the wire; PROTOCOL.md has a table for each."""


def skeleton_table(cls: type[msgspec.Struct]) -> str:
    """A field table with an empty meaning column, for writing the document."""
    lines = [
        f"<!-- fields: {cls.__name__} -->",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {kind} | {default} | |" for name, kind, default in field_rows(cls)]
    return "\n".join(lines)


# --- the error table and the constants ---------------------------------------------


def render_error_table() -> str:
    lines = ["| code | name | message template |", "|---:|---|---|"]
    lines += [f"| {int(code)} | `{code.name}` | {template(code)} |" for code in p.ErrorCode]
    return "\n".join(lines)


_CONSTANTS: Final = (
    ("PROTOCOL_VERSION", "newest protocol version spoken"),
    ("MIN_PROTOCOL_VERSION", "oldest protocol version spoken"),
    ("FRAME_HEADER_SIZE", "bytes in a frame header"),
    ("HANDSHAKE_MAX_FRAME_SIZE", "largest payload before the Welcome has been exchanged"),
    ("DEFAULT_MAX_FRAME_SIZE", "the usual `limits.max_frame_size`"),
    ("MAX_FRAME_SIZE_CEILING", "largest `limits.max_frame_size` a Welcome may announce"),
    ("INLINE_RESERVE", "`max_inline_bytes` + this ≤ `max_frame_size`"),
    ("MAX_FDS_PER_FRAME", "largest fd count a header may declare"),
    ("MAX_ARGS", "inputs (and outputs) of one invoke"),
    ("MAX_TIMEOUT_MS", "largest `timeout_ms`"),
    ("MAX_DMA_SIZE", "largest buffer before version 6 (bytes)"),
    ("MAX_BUFFER_SIZE", "version 6: largest buffer the wire can name (bytes)"),
    ("MAX_TENSORS", "inputs (and outputs) of one model"),
    ("MAX_RANK", "dimensions of one tensor"),
    ("MAX_CHAIN_STEPS", "version 7: steps of one `model_chain` (section 7.10)"),
    ("MAX_REQUEST_ITEMS", "msgpack items in one request payload (section 4)"),
)


def render_constants() -> str:
    lines = ["| name | value | meaning |", "|---|---:|---|"]
    lines += [f"| `{name}` | {getattr(p, name)} | {meaning} |" for name, meaning in _CONSTANTS]
    return "\n".join(lines)


# --- example frames ------------------------------------------------------------------

EXAMPLE_FD: Final = 42
"""The fd number the examples pretend to pass; on the wire it becomes slot 0."""


def _hexdump(data: bytes | bytearray) -> list[str]:
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{offset:04x}  {chunk.hex(' '):<47}  {text}")
    return lines


def _show(value: Any) -> str:
    """The decoded msgpack value in a JSON-like notation; bin as h'..'."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_show(k)}: {_show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, bytes):
        return f"h'{value.hex()}'"
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _render_frame(title: str, frame: bytes | bytearray, fds: list[int]) -> str:
    header, payload = frame[: p.FRAME_HEADER_SIZE], frame[p.FRAME_HEADER_SIZE :]
    fd_note = f", fds sent with it: {fds}" if fds else ""
    lines = [
        f"#### Example: {title}",
        "",
        "```",
        f'header   {header.hex(" ")}   (magic "NP", fd count {header[2]}, reserved 0, '
        f"payload length {len(payload)}{fd_note})",
        "payload",
        *("  " + line for line in _hexdump(payload)),
        f"msgpack  {_show(msgspec.msgpack.decode(payload))}",
        "```",
    ]
    return "\n".join(lines)


_WELCOME: Final = p.Welcome(  # the answer to the hello example, which offers the newest
    server_version="0.1.0",
    protocol_version=p.PROTOCOL_VERSION,
    backend="emulator",
    dsp=p.DspCapabilities(arch_ver=0x73, hvx_support_128b=4, vtcm_page=0x800000, vtcm_count=1),
    limits=p.ClientLimits(priority=p.Priority.REALTIME),
    epoch=1,
    domain="default",
    own_pool=p.OwnPool(idle_ms=30_000, max_buffer_bytes=64 << 20),
)

_STATUS: Final = p.DaemonStatus(
    daemon_version="0.1.0",
    uptime_ms=93_000,
    backend="emulator",
    device="/dev/fastrpc-cdsp-secure",
    dsp=p.DspCapabilities(arch_ver=0x73),
    shell=p.ShellStatus(verified=True, path="/usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"),
    epoch=1,
    totals=p.Totals(clients=1, buffers=1, bytes=65536, handles=1, calls_done=12),
    clients=(
        p.ClientRow(
            pid=4242,
            uid=1000,
            name="voice-stt",
            priority="realtime",
            buffers=1,
            bytes=65536,
            handles=1,
            calls_done=12,
        ),
    ),
    session=p.SessionRow(
        state="up", buffers=2, remote_handles=1, invokes_done=15, listener_running=True
    ),
    lanes=(p.LaneRow(name="control", threads=1, completed=4),),
)


_VAD_GRAPH_0: Final = p.ModelInfo(
    name="silero_vad.onnx",
    description="an ONNX model (IR version 8, opset 16)",
    file_bytes=2_327_524,
    arena_bytes=8192,
    inputs=(
        p.TensorInfo(
            name="input", dtype="float32", qnn_type=0x232, shape=(1, 576), nbytes=2304, offset=0
        ),
        p.TensorInfo(
            name="state",
            dtype="float32",
            qnn_type=0x232,
            shape=(2, 1, 128),
            nbytes=1024,
            offset=2304,
        ),
        p.TensorInfo(name="sr", dtype="int64", qnn_type=0x64, shape=(), nbytes=8, offset=3328),
    ),
    outputs=(
        p.TensorInfo(
            name="output", dtype="float32", qnn_type=0x232, shape=(1, 1), nbytes=4, offset=4096
        ),
        p.TensorInfo(
            name="stateN",
            dtype="float32",
            qnn_type=0x232,
            shape=(2, 1, 128),
            nbytes=1024,
            offset=4160,
        ),
    ),
)
_VAD: Final = msgspec.structs.replace(
    _VAD_GRAPH_0,
    graphs=(
        p.GraphInfo(name="spox_graph", inputs=_VAD_GRAPH_0.inputs, outputs=_VAD_GRAPH_0.outputs),
    ),
)


def _conversation() -> Iterator[tuple[str, Callable[[], p.Message], str]]:
    """(title, message factory, direction) in the order a session would send them."""
    yield (
        "`hello`",
        lambda: p.Hello(
            protocol_version=p.PROTOCOL_VERSION,
            client_name="voice-stt",
            priority=p.Priority.REALTIME,
        ),
        "c",
    )
    yield "`welcome`", lambda: _WELCOME, "s"
    yield "`alloc` (id 1, 64 KiB)", lambda: p.AllocRequest(id=1, size=65536), "c"
    yield (
        "`alloc_reply` carrying the DMA-BUF fd",
        lambda: p.AllocReply(id=1, buffer=1, size=65536, fd=EXAMPLE_FD),
        "s",
    )
    yield "`map`", lambda: p.MapRequest(id=2, buffer=1), "c"
    yield "`map_reply`", lambda: p.MapReply(id=2, dsp_address=0xC0000000), "s"
    uri = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
    yield "`open`", lambda: p.OpenRequest(id=3, uri=uri), "c"
    yield (
        "`open_reply` (ids are one space per connection: buffer 1, then handle 2)",
        (lambda: p.OpenReply(id=3, handle=2)),
        "s",
    )
    yield (
        "`invoke` of echo (method 2): primIn {u32 in_len 5, u32 out_capacity 5} inline, "
        "the input as a slice of buffer 1, the output inline",
        lambda: p.InvokeRequest(
            id=4,
            handle=2,
            method=2,
            inputs=(
                p.InlineInput(data=struct.pack("<II", 5, 5)),
                p.BufferSlice(buffer=1, offset=0, length=5),
            ),
            outputs=(p.InlineOutput(capacity=5),),
            timeout_ms=1000,
        ),
        "c",
    )
    yield (
        "`invoke` of echo by raw scalars word 0x02020100, whose primIn claims 99 input "
        "bytes where 1 is given, output into a slice",
        lambda: p.InvokeRequest(
            id=5,
            handle=2,
            sc=0x02020100,
            inputs=(p.InlineInput(data=struct.pack("<II", 99, 4096)), p.InlineInput(data=b"x")),
            outputs=(p.BufferSlice(buffer=1, offset=4096, length=4096),),
        ),
        "c",
    )
    yield (
        "`error` answering id 5 (the skel returned AEE_EBADPARM)",
        lambda: p.ErrorMessage.for_code(p.ErrorCode.INVOKE_FAILED, id=5, code=0x8000040E),
        "s",
    )
    yield (
        "`invoke_reply` answering id 4: the 5 bytes echoed",
        lambda: p.InvokeReply(id=4, outputs=(b"hello",)),
        "s",
    )
    yield (
        "`model_load` of a VAD model, its file's fd as slot 0, one free dimension fixed",
        lambda: p.ModelLoadRequest(
            id=11, fd=EXAMPLE_FD, name="silero_vad.onnx", shapes={"input": (1, 576)}
        ),
        "c",
    )
    yield (
        "`model_load_reply`: model 3, its arena (the DMA-BUF) as slot 0",
        lambda: p.ModelLoadReply(id=11, model=3, info=_VAD, fd=EXAMPLE_FD),
        "s",
    )
    yield "`model_info`", lambda: p.ModelInfoRequest(id=12, model=3), "c"
    yield (
        "`model_info_reply`",
        lambda: p.ModelInfoReply(id=12, info=msgspec.structs.replace(_VAD, runs=0)),
        "s",
    )
    yield (
        "`model_run` (the inputs are in the arena already)",
        lambda: p.ModelRunRequest(id=13, model=3, deadline_ms=30),
        "c",
    )
    yield "`model_run_reply`", lambda: p.ModelRunReply(id=13, dsp_us=412), "s"
    yield (
        "`model_chain`: three models, step 1 fed by step 0's output, step 2 by step 1's",
        lambda: p.ModelChainRequest(
            id=15,
            steps=(
                p.ChainStep(model=3),
                p.ChainStep(model=4, inputs={"input_1": p.ChainSource(step=0, output="mel")}),
                p.ChainStep(model=5, inputs={"x": p.ChainSource(step=1, output="embedding")}),
            ),
            outputs=(p.ChainOutput(step=2, output="score"),),
        ),
        "c",
    )
    yield (
        "`model_chain_reply`",
        lambda: p.ModelChainReply(id=15, dsp_us=1130, output_shapes=((1, 1),)),
        "s",
    )
    yield "`model_unload`", lambda: p.ModelUnloadRequest(id=14, model=3), "c"
    yield "`model_unload_reply`", lambda: p.ModelUnloadReply(id=14), "s"
    yield "`ping`", lambda: p.PingRequest(id=6), "c"
    yield "`pong`", lambda: p.PongReply(id=6), "s"
    yield "`status`", lambda: p.StatusRequest(id=7), "c"
    yield "`status_reply`", lambda: p.StatusReply(id=7, status=_STATUS), "s"
    yield "`unmap`", lambda: p.UnmapRequest(id=8, buffer=1), "c"
    yield "`unmap_reply`", lambda: p.UnmapReply(id=8), "s"
    yield "`close`", lambda: p.CloseRequest(id=9, handle=2), "c"
    yield "`close_reply`", lambda: p.CloseReply(id=9), "s"
    yield "`free`", lambda: p.FreeRequest(id=10, buffer=1), "c"
    yield "`free_reply`", lambda: p.FreeReply(id=10), "s"
    yield (
        "`debug`: a subsystem restart of 1 s on the emulator",
        lambda: p.DebugRequest(id=11, action="ssr", duration_ms=1000),
        "c",
    )
    yield (
        "`debug_reply`",
        lambda: p.DebugReply(id=11, detail="subsystem restart: the DSP is away for 1 s"),
        "s",
    )
    yield (
        "`session_restarted`",
        lambda: p.SessionRestarted(epoch=2, reason="DSP crashed", domain="default"),
        "s",
    )
    yield "`shutting_down`", lambda: p.ShuttingDown(reason="systemctl stop", grace_ms=5000), "s"


def render_examples() -> str:
    """A whole session, frame by frame, as two real connections produce it."""
    client, server = p.ClientConnection(), p.ServerConnection()
    sections = []
    for title, make, direction in _conversation():
        sender, receiver = (client, server) if direction == "c" else (server, client)
        arrow = "client → server" if direction == "c" else "server → client"
        frame, fds = sender.send(make())  # type: ignore[arg-type]
        receiver.receive_data(frame, fds)
        event = receiver.next_event()
        assert isinstance(event, p.Message), event
        sections.append(_render_frame(f"{title} ({arrow})", frame, fds))
    refused = p.ServerConnection()
    refused.receive_data(
        *p.ClientConnection().send(
            p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="old-tool")
        )
    )
    refused.next_event()
    frame, fds = refused.send(
        p.ErrorMessage.for_code(p.ErrorCode.NOT_PERMITTED, detail="uid 1001 may not use the NPU")
    )
    sections.append(
        _render_frame("`error` without id: a refused Hello (server → client)", frame, fds)
    )
    return "\n\n".join(sections)


BLOCKS: Final[dict[str, Callable[[], str]]] = {
    "examples": render_examples,
    "errors": render_error_table,
    "constants": render_constants,
}
"""PROTOCOL.md holds each between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``."""


def fill_blocks(document: str) -> str:
    """``document`` with every generated block replaced by what the code produces now."""
    for name, render in BLOCKS.items():
        begin, end = f"<!-- begin {name} -->\n", f"<!-- end {name} -->"
        start = document.index(begin) + len(begin)
        stop = document.index(end, start)
        document = document[:start] + render() + "\n" + document[stop:]
    return document


def main(argv: list[str]) -> None:
    """``protocol_doc.py PROTOCOL.md`` refreshes its blocks; ``--skeleton`` prints tables."""
    if argv == ["--skeleton"]:
        for cls in DOCUMENTED_STRUCTS:
            print(skeleton_table(cls), end="\n\n")
        return
    [path] = argv
    document = pathlib.Path(path)
    document.write_text(fill_blocks(document.read_text()))


if __name__ == "__main__":
    main(sys.argv[1:])
