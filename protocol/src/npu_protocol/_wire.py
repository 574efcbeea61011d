"""Protocol constants and the bounded field types every message is built from.

Every integer, string, byte string and collection on the wire has an explicit
bound here, so a decoder rejects an out-of-range value before any code that
trusts it runs. PROTOCOL.md lists the same numbers; a test keeps them equal.
"""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import Meta

from npu_protocol.errors import MAX_BUFFER_SIZE

# --- versions ----------------------------------------------------------------

PROTOCOL_VERSION: Final = 7
"""The newest protocol version this package speaks (PROTOCOL.md section 12)."""

MIN_PROTOCOL_VERSION: Final = 1
"""The oldest protocol version this package still speaks."""

# --- framing -------------------------------------------------------------------

FRAME_MAGIC: Final = b"NP"
FRAME_HEADER_SIZE: Final = 8
"""Magic (2 bytes), fd count (u8), reserved (u8, zero), payload length (u32 LE)."""

HANDSHAKE_MAX_FRAME_SIZE: Final = 64 * 1024
"""Largest payload either side accepts until the Welcome has been exchanged."""

DEFAULT_MAX_FRAME_SIZE: Final = 1024 * 1024
"""The payload limit a server announces unless configured otherwise."""

MAX_FRAME_SIZE_CEILING: Final = 16 * 1024 * 1024
"""No Welcome may announce a payload limit above this."""

INLINE_RESERVE: Final = 64 * 1024
"""Room an invoke frame keeps for everything but inline bytes: a Welcome's
``max_inline_bytes`` is at most ``max_frame_size - INLINE_RESERVE``, so an invoke
or its reply that respects the inline limit always fits in one frame."""

MAX_FDS_PER_FRAME: Final = 4
"""Upper bound for a frame's fd count; it sizes the receiver's SCM_RIGHTS buffer.
Version 1 messages carry 0 fds, except AllocReply which carries exactly 1."""

# --- message limits ---------------------------------------------------------------

MAX_ARGS: Final = 255
"""Input (or output) arguments of one invoke: the scalars word has 8 bits for each."""

MAX_METHOD: Final = 31
"""Method indices are 5 bits in the scalars word."""

MAX_TIMEOUT_MS: Final = 3_600_000
MAX_PING_PAYLOAD: Final = 4096
MAX_URI_LENGTH: Final = 1023
"""remotectl receives the URI NUL-terminated; 1023 characters + NUL = 1 KiB."""

MAX_ERROR_FIELDS: Final = 16
MAX_TENSORS: Final = 32
"""Inputs (and outputs) of one model graph (portal_qnn's limit)."""
MAX_GRAPHS: Final = 8
"""Graphs of one model (portal_qnn's limit)."""
MAX_RANK: Final = 8
"""Dimensions of one tensor."""
MAX_CHAIN_STEPS: Final = 16
"""Steps of one model_chain (npud refuses more with INVALID_ARGUMENT; the decoder takes
up to four times as many, so that a longer chain is an error reply, not a broken
connection)."""
MAX_REQUEST_ITEMS: Final = 16384
"""Msgpack items (each scalar, string, array and map counts once) in one payload a
client sends; more is BAD_MESSAGE (the server walks every item for repeated keys)."""
MAX_STATUS_CLIENTS: Final = 1024

_U16_MAX: Final = 0xFFFF
_U32_MAX: Final = 0xFFFF_FFFF
_I64_MAX: Final = 0x7FFF_FFFF_FFFF_FFFF  # msgspec bounds stop at int64

U16 = Annotated[int, Meta(ge=0, le=_U16_MAX)]
U32 = Annotated[int, Meta(ge=0, le=_U32_MAX)]
U63 = Annotated[int, Meta(ge=0, le=_I64_MAX)]
"""A non-negative counter: u64 on the wire, never above 2**63 - 1."""

RequestId = Annotated[int, Meta(ge=0, le=_U32_MAX)]
"""Chosen by the client, unique among its requests in flight."""

ObjectId = Annotated[int, Meta(ge=1, le=_U32_MAX)]
"""Server-assigned buffer and handle ids, scoped to one connection; 0 is never used."""

ProtocolVersion = Annotated[int, Meta(ge=1, le=_U16_MAX)]

BufferSize = Annotated[int, Meta(ge=1, le=MAX_BUFFER_SIZE)]
BufferOffset = Annotated[int, Meta(ge=0, le=MAX_BUFFER_SIZE)]

FdSlot = Annotated[int, Meta(ge=0, le=MAX_FDS_PER_FRAME - 1)]
"""On the wire: the index of an fd among the frame's fds. In Python: the fd itself
(the connection swaps one for the other)."""

Method = Annotated[int, Meta(ge=0, le=MAX_METHOD)]
TimeoutMs = Annotated[int, Meta(ge=1, le=MAX_TIMEOUT_MS)]
InlineBytes = Annotated[bytes, Meta(max_length=MAX_FRAME_SIZE_CEILING)]
InlineCapacity = Annotated[int, Meta(ge=0, le=MAX_FRAME_SIZE_CEILING)]
FrameSizeLimit = Annotated[int, Meta(ge=HANDSHAKE_MAX_FRAME_SIZE, le=MAX_FRAME_SIZE_CEILING)]

ClientName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,63}$")]
"""1 to 64 characters, printable ASCII without spaces: it goes into logs verbatim."""

Uri = Annotated[str, Meta(pattern=rf"^[\x21-\x7e]{{1,{MAX_URI_LENGTH}}}$")]
"""A remotectl URI: 1 to 1023 printable ASCII characters, no spaces."""

Name = Annotated[str, Meta(max_length=64)]
TensorName = Annotated[str, Meta(max_length=127)]
Shape = Annotated[tuple[Annotated[int, Meta(ge=1, le=_U32_MAX)], ...], Meta(max_length=MAX_RANK)]
"""A tensor's dimensions (rank 0..8; rank 0 is a scalar)."""
ProducedShape = Annotated[
    tuple[Annotated[int, Meta(ge=0, le=_U32_MAX)], ...], Meta(max_length=MAX_RANK)
]
"""The dimensions a run produced: as Shape, and a dimension may be 0 (no data)."""
Text = Annotated[str, Meta(max_length=1024)]
LongText = Annotated[str, Meta(max_length=4096)]

DspFd = Annotated[int, Meta(ge=-1, le=0x7FFF_FFFF)]
"""The number the DSP knows a buffer by (the server's fd of it); -1: not told."""
