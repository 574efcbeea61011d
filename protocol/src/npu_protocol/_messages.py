"""Every message on the wire: one tagged union per direction.

A message is a msgpack map; its ``type`` key names it and the other keys are
its fields. Decoders ignore keys they do not know, and every field added after
version 1 must have a default, so either side can grow fields without breaking
the other. A new message *type* needs a new protocol version (see PROTOCOL.md).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal, TypeAlias

import msgspec

from npu_protocol._records import (
    MAX_CONSTANTS,
    Budget,
    ClientLimits,
    DaemonStatus,
    DspCapabilities,
    ModelConstant,
    ModelInfo,
    OwnPool,
    Priority,
)
from npu_protocol._scalars import make_scalars, split_scalars
from npu_protocol._wire import (
    MAX_ARGS,
    MAX_CHAIN_STEPS,
    MAX_ERROR_FIELDS,
    MAX_GRAPHS,
    MAX_PING_PAYLOAD,
    MAX_TENSORS,
    U16,
    U32,
    U63,
    BufferOffset,
    BufferSize,
    ClientName,
    DspFd,
    FdSlot,
    InlineBytes,
    InlineCapacity,
    LongText,
    Method,
    Name,
    ObjectId,
    ProducedShape,
    ProtocolVersion,
    RequestId,
    Shape,
    TensorName,
    Text,
    TimeoutMs,
    Uri,
)
from npu_protocol.errors import MAX_BUFFER_SIZE, ErrorCode, format_message


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every top-level message."""

    fd_fields: ClassVar[tuple[str, ...]] = ()
    """Fields that hold an fd. In Python they hold the fd number of this process;
    on the wire they hold the fd's index among the frame's fds."""


# --- handshake ------------------------------------------------------------------


class Hello(Message, tag="hello", frozen=True, kw_only=True):
    """The client's first frame."""

    protocol_version: ProtocolVersion = 1
    """The newest version the client speaks; the server answers with one it also speaks.
    A hello without it offers version 1, as it did in version 1: the hello is frozen
    (PROTOCOL.md section 12), so a client offering more says so."""
    client_name: ClientName
    priority: Priority = Priority.NORMAL
    """The class the client asks for."""
    budget: Budget | None = None
    """Version 2: a realtime client's declared period and budget (admission control)."""
    isolate: bool = False
    """Version 4: the client needs a DSP process of its own (its DSP-side state, such as
    dspqueue's, is per process); refused with NOT_PERMITTED where the server does not
    allow it."""
    watch: bool = False
    """Version 6: the client only watches (status, ping): the server opens no DSP process
    for it, and answers its requests that need one NOT_PERMITTED."""


class Welcome(Message, tag="welcome", frozen=True, kw_only=True):
    """The server's answer to an acceptable Hello."""

    server_version: Name
    protocol_version: ProtocolVersion
    """The version both sides speak from now on."""
    backend: Name
    """``kernel`` on a device, ``emulator`` on the in-process emulator."""
    dsp: DspCapabilities
    limits: ClientLimits
    epoch: U63
    """The current session epoch of the client's domain (see SessionRestarted)."""
    domain: Name = ""
    """Version 3: the domain (DSP process) the client's calls run in."""
    own_pool: OwnPool | None = None
    """Version 4: present while npud keeps the buffers this connection frees for its
    own next allocations (see OwnPool); absent when the pool is off or shared."""


class ErrorMessage(Message, tag="error", frozen=True, kw_only=True):
    """A failure: the answer to request ``id``, or, with no id, the reason the
    server is closing the connection (a refused Hello or a protocol violation)."""

    id: RequestId | None = None
    code: U16
    """An ErrorCode number; a client must accept numbers it does not know."""
    message: LongText
    """The code's template rendered with ``fields``."""
    fields: Annotated[dict[Name, int | Text], msgspec.Meta(max_length=MAX_ERROR_FIELDS)] = {}

    @classmethod
    def for_code(cls, code: ErrorCode, /, *, id: int | None = None, **fields: Any) -> ErrorMessage:
        """Render ``code``'s template; integer fields travel as integers, others as text."""
        return cls(
            id=id,
            code=int(code),
            message=_clip(format_message(code, **fields), _MESSAGE_LIMIT),
            fields={name: _wire_field(value) for name, value in fields.items()},
        )

    @property
    def error_code(self) -> ErrorCode | None:
        """The code as an ErrorCode, or None for a number this package does not know."""
        try:
            return ErrorCode(self.code)
        except ValueError:
            return None


_MESSAGE_LIMIT: Final = 4096
_FIELD_LIMIT: Final = 1024


def _wire_field(value: object) -> int | str:
    """Integers travel as integers (DSP result codes stay machine-readable), the rest as text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _clip(str(value), _FIELD_LIMIT)


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, so a long detail never makes an error unsendable."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- requests -------------------------------------------------------------------


class Request(Message, frozen=True, kw_only=True):
    """Base of the client's requests."""

    id: RequestId


class AllocRequest(Request, tag="alloc", frozen=True, kw_only=True):
    """Allocate a DMA-BUF; the reply carries its fd."""

    size: BufferSize


class FreeRequest(Request, tag="free", frozen=True, kw_only=True):
    """Release a buffer (unmapping it from the DSP first if it is mapped)."""

    buffer: ObjectId


class MapRequest(Request, tag="map", frozen=True, kw_only=True):
    """Map a whole buffer into the DSP's address space."""

    buffer: ObjectId
    flags: U32 = 2
    """Version 4: the fastrpc_map_flags value the DSP gets: 2 FASTRPC_MAP_FD (mapped now),
    3 FASTRPC_MAP_FD_DELAYED (the DSP maps it when it first uses it); version 6 also
    takes the others libcdsprpc passes on (0 STATIC, 16 FD_NOMAP, 17 and 18 the
    extended FD and FD_DELAYED, the reserved 4..15): any value below 19 but 1."""


class UnmapRequest(Request, tag="unmap", frozen=True, kw_only=True):
    buffer: ObjectId


class OpenRequest(Request, tag="open", frozen=True, kw_only=True):
    """remotectl open: load a skel on the DSP."""

    uri: Uri


class CloseRequest(Request, tag="close", frozen=True, kw_only=True):
    handle: ObjectId


class _Arg(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of invoke arguments: small tagged maps."""


class InlineInput(_Arg, tag="inline", frozen=True, kw_only=True):
    """Input bytes carried in the frame."""

    data: InlineBytes


class InlineOutput(_Arg, tag="inline", frozen=True, kw_only=True):
    """An output the server returns in the reply, ``capacity`` bytes long."""

    capacity: InlineCapacity


class BufferSlice(_Arg, tag="slice", frozen=True, kw_only=True):
    """Bytes ``[offset, offset + length)`` of one of this connection's buffers."""

    buffer: ObjectId
    offset: BufferOffset = 0
    length: BufferOffset

    def __post_init__(self) -> None:
        if self.offset + self.length > MAX_BUFFER_SIZE:
            raise ValueError(
                f"slice offset {self.offset} length {self.length} ends past {MAX_BUFFER_SIZE}"
            )


InputArg: TypeAlias = InlineInput | BufferSlice
OutputArg: TypeAlias = InlineOutput | BufferSlice


class InvokeRequest(Request, tag="invoke", frozen=True, kw_only=True):
    """Call method ``method`` (or scalars word ``sc``) on an open handle.

    Exactly one of ``method`` and ``sc`` is set. With ``method`` the scalars
    word is built from the argument counts; with ``sc`` its buffer counts must
    equal the argument counts and its handle counts must be zero.
    """

    handle: ObjectId
    method: Method | None = None
    sc: U32 | None = None
    inputs: Annotated[tuple[InputArg, ...], msgspec.Meta(max_length=MAX_ARGS)] = ()
    outputs: Annotated[tuple[OutputArg, ...], msgspec.Meta(max_length=MAX_ARGS)] = ()
    timeout_ms: TimeoutMs | None = None
    """None: the connection's default_timeout_ms applies."""
    deadline_ms: TimeoutMs | None = None
    """Version 2: the call must be dispatched within this many ms of its arrival, or it
    fails with DEADLINE_EXCEEDED; finishing later counts as a miss. None: no deadline."""
    wait: bool = False
    """Version 4: the call waits for the DSP rather than computing (dspqueue's
    wait_signal): it takes no scheduler slot, the watchdog leaves it alone, and it runs
    on a thread of its own; at most two of a client's calls wait at once."""

    def __post_init__(self) -> None:
        if (self.method is None) == (self.sc is None):
            raise ValueError("exactly one of method and sc must be given")
        if self.sc is None:
            return
        fields = split_scalars(self.sc)
        if (fields.inbufs, fields.outbufs) != (len(self.inputs), len(self.outputs)):
            raise ValueError(
                f"sc 0x{self.sc:08X} declares {fields.inbufs} inputs and {fields.outbufs} "
                f"outputs, the invoke has {len(self.inputs)} and {len(self.outputs)}"
            )
        if fields.inhandles or fields.outhandles:
            raise ValueError(
                f"sc 0x{self.sc:08X} declares handle arguments, which are not supported"
            )

    @property
    def scalars(self) -> int:
        """The scalars word the DSP receives."""
        if self.sc is not None:
            return self.sc
        assert self.method is not None  # __post_init__ guarantees one of the two
        return make_scalars(self.method, len(self.inputs), len(self.outputs))

    @property
    def inline_input_bytes(self) -> int:
        return sum(len(arg.data) for arg in self.inputs if isinstance(arg, InlineInput))

    @property
    def inline_output_bytes(self) -> int:
        return sum(arg.capacity for arg in self.outputs if isinstance(arg, InlineOutput))


class ModelLoadRequest(Request, tag="model_load", frozen=True, kw_only=True):
    """Version 2: load the model file the client opened; its fd travels as the
    frame's only fd. The daemon reads the file only through that fd."""

    fd_fields: ClassVar[tuple[str, ...]] = ("fd",)
    fd: FdSlot
    name: Text = ""
    """How status shows the model (the client library sends the file's name)."""
    shapes: Annotated[dict[TensorName, Shape], msgspec.Meta(max_length=2 * MAX_TENSORS)] = {}
    """Fixes free dimensions of an ONNX model's tensors, by tensor name: every input
    with one, outputs only where they do not follow from the inputs' shapes (the
    emulator backend; a QNN model library's shapes are fixed already)."""
    sizes: Annotated[
        dict[
            TensorName,
            Annotated[tuple[Shape, ...], msgspec.Meta(min_length=1, max_length=MAX_GRAPHS)],
        ],
        msgspec.Meta(max_length=MAX_GRAPHS),
    ] = {}
    """Version 6 (additive): several whole shapes of an ONNX model's input, by name; the
    server makes one graph of the model per shape (the i-th shape of every entry makes
    graph i; entries hold as many shapes each), its weights stored once, and a client
    runs the graph whose input shapes fit its data. An older server ignores the key."""
    constants: Annotated[
        dict[TensorName, ModelConstant], msgspec.Meta(max_length=MAX_CONSTANTS)
    ] = {}
    """Version 6 (additive): fixes ONNX model inputs to values, by input name; the
    server folds them into the model before shape inference (an ``If`` they decide
    becomes the branch taken), and the inputs are gone from the loaded model's
    tensors. An older server ignores the key: its model still lists them as inputs."""


class ModelInfoRequest(Request, tag="model_info", frozen=True, kw_only=True):
    """Version 2: describe a loaded model."""

    model: ObjectId


class ModelRunRequest(Request, tag="model_run", frozen=True, kw_only=True, omit_defaults=True):
    """Version 2: run a model once on the inputs in its arena; the outputs replace
    the previous ones in the arena. No tensor bytes travel in the frame."""

    model: ObjectId
    timeout_ms: TimeoutMs | None = None
    """As for invoke: None applies the connection's default_timeout_ms."""
    deadline_ms: TimeoutMs | None = None
    """As for invoke: the run must be dispatched within this many ms."""
    graph: TensorName = ""
    """Version 5: the graph to run, by its name in ``ModelInfo.graphs``; empty: the
    first graph."""


class ChainSource(msgspec.Struct, frozen=True, kw_only=True):
    """Version 7: where a chain step's input comes from: output ``output`` of the
    chain's step ``step`` (an earlier one)."""

    step: Annotated[int, msgspec.Meta(ge=0, le=4 * MAX_CHAIN_STEPS)]
    output: TensorName


class ChainStep(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Version 7: one step of a model_chain: a graph of a loaded model."""

    model: ObjectId
    graph: TensorName = ""
    """The graph to run, by its name in ``ModelInfo.graphs``; empty: the first."""
    inputs: Annotated[dict[TensorName, ChainSource], msgspec.Meta(max_length=MAX_TENSORS)] = {}
    """The graph's inputs that an earlier step's outputs feed, by input name. Every
    other input is the caller's: its value is what the model's arena holds."""


class ChainOutput(msgspec.Struct, frozen=True, kw_only=True):
    """Version 7: an output a model_chain answers with: output ``output`` of step
    ``step``, written into that step's model's arena where model_run writes it."""

    step: Annotated[int, msgspec.Meta(ge=0, le=4 * MAX_CHAIN_STEPS)]
    output: TensorName


class ModelChainRequest(Request, tag="model_chain", frozen=True, kw_only=True, omit_defaults=True):
    """Version 7: run graphs of several loaded models in order, in one request, the
    outputs of one step feeding inputs of later ones (PROTOCOL.md section 7.10). No
    tensor bytes travel in the frame: the caller's inputs and the outputs asked for
    are in the models' arenas."""

    steps: Annotated[
        tuple[ChainStep, ...], msgspec.Meta(min_length=1, max_length=4 * MAX_CHAIN_STEPS)
    ]
    """At most MAX_CHAIN_STEPS (more is INVALID_ARGUMENT)."""
    outputs: Annotated[tuple[ChainOutput, ...], msgspec.Meta(min_length=1, max_length=MAX_TENSORS)]
    timeout_ms: TimeoutMs | None = None
    """As for invoke: None applies the connection's default_timeout_ms."""
    deadline_ms: TimeoutMs | None = None
    """As for invoke: the chain must be dispatched within this many ms."""


class ModelUnloadRequest(Request, tag="model_unload", frozen=True, kw_only=True):
    """Version 2: unload a model and free its arena."""

    model: ObjectId


class StatusRequest(Request, tag="status", frozen=True, kw_only=True):
    pass


DebugAction = Literal["ssr", "latency", "fail_next_invoke", "clear"]


class DebugRequest(Request, tag="debug", frozen=True, kw_only=True):
    """Version 2: inject a fault into the emulated DSP (root only; the emulator only)."""

    action: DebugAction
    """``ssr`` a subsystem restart, the DSP away for ``duration_ms``; ``latency`` every
    later invoke takes ``duration_ms`` longer; ``fail_next_invoke`` the next invoke
    answers ``code`` (an AEE result); ``clear`` undoes latency and pending failures."""
    duration_ms: U32 = 0
    code: U32 = 0
    domain: Name = ""
    """Version 3: for ``ssr``, the domain whose DSP process crashes and restarts alone;
    empty: the whole DSP restarts (every domain)."""


class PingRequest(Request, tag="ping", frozen=True, kw_only=True):
    payload: Annotated[bytes, msgspec.Meta(max_length=MAX_PING_PAYLOAD)] = b""


# --- replies ----------------------------------------------------------------------


class Reply(Message, frozen=True, kw_only=True):
    """Base of the server's successful answers; ``id`` is the request's."""

    id: RequestId


class AllocReply(Reply, tag="alloc_reply", frozen=True, kw_only=True):
    """The new buffer. Its DMA-BUF travels as the frame's only fd."""

    fd_fields: ClassVar[tuple[str, ...]] = ("fd",)
    buffer: ObjectId
    size: BufferSize
    """The allocated size: the requested size rounded up to whole pages."""
    fd: FdSlot
    dsp_fd: DspFd = -1
    """Version 4: the number the DSP knows the buffer by (the fd the server maps it
    with): what DSP code that names buffers by fd (a dspqueue packet, HAP_mmap) must be
    given, never the client's own fd number. Unique among the server's live buffers."""


class FreeReply(Reply, tag="free_reply", frozen=True, kw_only=True):
    pass


class MapReply(Reply, tag="map_reply", frozen=True, kw_only=True):
    dsp_address: U63


class UnmapReply(Reply, tag="unmap_reply", frozen=True, kw_only=True):
    pass


class OpenReply(Reply, tag="open_reply", frozen=True, kw_only=True):
    handle: ObjectId


class CloseReply(Reply, tag="close_reply", frozen=True, kw_only=True):
    pass


class InvokeReply(Reply, tag="invoke_reply", frozen=True, kw_only=True):
    """One entry per requested output, in order: the bytes of an inline output
    (at most its capacity), None for a buffer slice (the data is in the buffer)."""

    outputs: Annotated[tuple[InlineBytes | None, ...], msgspec.Meta(max_length=MAX_ARGS)] = ()


class ModelLoadReply(Reply, tag="model_load_reply", frozen=True, kw_only=True):
    """The loaded model. Its arena (one DMA-BUF holding every input and output tensor
    at the offsets ``info`` gives) travels as the frame's only fd."""

    fd_fields: ClassVar[tuple[str, ...]] = ("fd",)
    model: ObjectId
    info: ModelInfo
    fd: FdSlot


class ModelInfoReply(Reply, tag="model_info_reply", frozen=True, kw_only=True):
    info: ModelInfo


class ModelRunReply(Reply, tag="model_run_reply", frozen=True, kw_only=True):
    """The run succeeded: the outputs are in the arena."""

    dsp_us: U63 = 0
    """The run's DSP time (dispatch to return), µs."""
    output_shapes: Annotated[tuple[ProducedShape, ...], msgspec.Meta(max_length=MAX_TENSORS)] = ()
    """Version 6 (additive): every output's shape as the run produced it, in the graph's
    order, when the graph has an output sized by the data (a room given at load); empty
    otherwise: every output has its ``TensorInfo`` shape. An older client ignores it."""


class ModelChainReply(Reply, tag="model_chain_reply", frozen=True, kw_only=True):
    """Version 7: every step succeeded; the outputs asked for are in their models'
    arenas."""

    dsp_us: U63 = 0
    """The chain's DSP time (dispatch to return), µs."""
    output_shapes: Annotated[tuple[ProducedShape, ...], msgspec.Meta(max_length=MAX_TENSORS)] = ()
    """The shape each output asked for was produced with, in the request's order."""


class ModelUnloadReply(Reply, tag="model_unload_reply", frozen=True, kw_only=True):
    pass


class StatusReply(Reply, tag="status_reply", frozen=True, kw_only=True):
    status: DaemonStatus


class PongReply(Reply, tag="pong", frozen=True, kw_only=True):
    payload: Annotated[bytes, msgspec.Meta(max_length=MAX_PING_PAYLOAD)] = b""


class DebugReply(Reply, tag="debug_reply", frozen=True, kw_only=True):
    detail: Text = ""
    """What was done, for people."""


# --- server events --------------------------------------------------------------------


class SessionRestarted(Message, tag="session_restarted", frozen=True, kw_only=True):
    """The DSP process of the client's domain restarted: every handle, model and DSP
    mapping of earlier epochs is gone (requests naming them fail with DSP_RESTARTED);
    so are buffers before version 3, while from version 3 on buffers stay (unmapped)."""

    epoch: U63
    reason: Text = ""
    domain: Name = ""
    """Version 3: the domain that restarted (the client's)."""


class ShuttingDown(Message, tag="shutting_down", frozen=True, kw_only=True):
    """The server stops accepting requests (new ones fail with SHUTTING_DOWN),
    answers those in flight and then closes the connection."""

    reason: Text = ""
    grace_ms: U32 | None = None
    """How long in-flight requests may still take before they are failed."""


# --- the unions ------------------------------------------------------------------------

AnyRequest: TypeAlias = (
    AllocRequest
    | FreeRequest
    | MapRequest
    | UnmapRequest
    | OpenRequest
    | CloseRequest
    | InvokeRequest
    | ModelLoadRequest
    | ModelInfoRequest
    | ModelRunRequest
    | ModelUnloadRequest
    | ModelChainRequest
    | StatusRequest
    | PingRequest
    | DebugRequest
)
AnyReply: TypeAlias = (
    AllocReply
    | FreeReply
    | MapReply
    | UnmapReply
    | OpenReply
    | CloseReply
    | InvokeReply
    | ModelLoadReply
    | ModelInfoReply
    | ModelRunReply
    | ModelUnloadReply
    | ModelChainReply
    | StatusReply
    | PongReply
    | DebugReply
)
ServerEvent: TypeAlias = SessionRestarted | ShuttingDown

ClientMessage: TypeAlias = Hello | AnyRequest
"""What a client sends and a server receives."""

ServerMessage: TypeAlias = Welcome | ErrorMessage | AnyReply | ServerEvent
"""What a server sends and a client receives."""

REPLY_TYPES: Final[dict[type[Request], type[Reply]]] = {
    AllocRequest: AllocReply,
    FreeRequest: FreeReply,
    MapRequest: MapReply,
    UnmapRequest: UnmapReply,
    OpenRequest: OpenReply,
    CloseRequest: CloseReply,
    InvokeRequest: InvokeReply,
    ModelLoadRequest: ModelLoadReply,
    ModelInfoRequest: ModelInfoReply,
    ModelRunRequest: ModelRunReply,
    ModelUnloadRequest: ModelUnloadReply,
    ModelChainRequest: ModelChainReply,
    StatusRequest: StatusReply,
    PingRequest: PongReply,
    DebugRequest: DebugReply,
}
"""The successful reply type of each request type (an ErrorMessage may answer any)."""


def tag_of(message: Message | type[Message]) -> str:
    """The ``type`` string a message travels under."""
    cls = message if isinstance(message, type) else type(message)
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag
