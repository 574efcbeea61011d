"""Stable error codes: one enum shared by the daemon, the wire and the clients.

Each code has a fixed number and a fixed message template. Both are a runbook
contract: operators grep for them and clients branch on them, so a number is
never reused and a template only ever gains detail at its end. Tests pin the
exact wording.

``format_message(code, **fields)`` renders the template; fields that are DSP
result codes are shown in hex with their AEE name where it is known.
"""

from __future__ import annotations

import enum
import string
from typing import Any, Final

from npu_protocol.aee import describe_result

MAX_DMA_SIZE: Final = 256 * 1024 * 1024
"""Largest DMA-BUF before version 6 (the crate's "256 MB" ceiling): what a client assumes
of a server whose Welcome has no ``limits.max_buffer_size``, and the largest inline
capacity and shared file."""

MAX_BUFFER_SIZE: Final = 1 << 32
"""Version 6: the largest buffer the wire can name (alloc sizes, slice ends). The
server's own largest is ``limits.max_buffer_size``, at most this."""


@enum.unique
class ErrorCode(enum.IntEnum):
    """Stable numbers. 1xx FastRPC/DSP, 2xx memory, 3xx models, 4xx session,
    5xx wire protocol, 6xx admission and service."""

    # --- FastRPC and the DSP -----------------------------------------------
    FASTRPC = 100
    OPEN_FAILED = 101
    INVOKE_FAILED = 102
    MMAP_FAILED = 103
    DSP_RESTARTED = 104
    NO_FREE_SESSION = 105
    UNSUPPORTED = 106
    DEVICE_NOT_FOUND = 107
    DEVICE_ERROR = 108
    UNKNOWN_HANDLE = 109
    SESSION_CLOSED = 110
    # --- memory ------------------------------------------------------------
    DMA_BUF_ALLOC = 200
    DMA_SIZE_OVERFLOW = 201
    DMA_EXCEEDS_MAX_SIZE = 202
    INVALID_FD = 203
    SLICE_OUT_OF_RANGE = 204
    UNKNOWN_BUFFER = 205
    INVALID_ARGUMENT = 206
    # --- models (the QNN skel) --------------------------------------------
    QNN = 300
    MODEL_NOT_LOADED = 301
    INVALID_TENSOR_INDEX = 302
    MODEL_SLOTS_FULL = 303
    TENSOR_MISMATCH = 304
    INPUT_NOT_SET = 305
    MODEL_FILE_UNREADABLE = 306
    MODEL_FORMAT = 307
    MODEL_MALFORMED = 308
    MODEL_REJECTED = 309
    NO_OUTPUTS = 310
    OUTPUT_TOO_LARGE = 311
    # --- session and shell -------------------------------------------------
    SESSION_BUSY = 400
    SHELL_VERIFY = 401
    # --- wire protocol (npu_protocol framing, messages, state machine) -----
    FRAME_TOO_LARGE = 500
    BAD_FRAME_HEADER = 501
    TOO_MANY_FDS = 502
    MISSING_FDS = 503
    FD_COUNT_MISMATCH = 504
    FDS_TRUNCATED = 505
    BAD_MESSAGE = 506
    UNEXPECTED_MESSAGE = 507
    UNSUPPORTED_VERSION = 508
    DUPLICATE_REQUEST_ID = 509
    UNKNOWN_REQUEST_ID = 510
    TOO_MANY_IN_FLIGHT = 511
    TRUNCATED_FRAME = 512
    CONNECTION_CLOSED = 513
    # --- admission and service ---------------------------------------------
    NOT_PERMITTED = 600
    QUOTA_EXCEEDED = 601
    TIMEOUT = 602
    SHUTTING_DOWN = 603
    INTERNAL_ERROR = 604
    DEADLINE_EXCEEDED = 605
    ADMISSION_REFUSED = 606


# Templates use str.format fields; fields named ``rc`` or ``code`` are DSP
# result codes and are rendered by describe_result().
_TEMPLATES: Final[dict[ErrorCode, str]] = {
    ErrorCode.FASTRPC: "FastRPC call failed with DSP result {rc}",
    ErrorCode.OPEN_FAILED: "cannot open remote module {uri!r}: {code}: {detail}",
    ErrorCode.INVOKE_FAILED: "remote invoke failed with DSP result {code}",
    ErrorCode.MMAP_FAILED: "mapping buffer into the DSP failed: {code}",
    ErrorCode.DSP_RESTARTED: (
        "the DSP restarted (subsystem restart, EPIPE): every DSP handle and mapping is gone; "
        "reopen the session (or the client's DSP process alone ended: it crashed, or a call "
        "hung past the watchdog)"
    ),
    ErrorCode.NO_FREE_SESSION: (
        "no free FastRPC session on {device} (EBUSY): every compute context bank is in use"
    ),
    ErrorCode.UNSUPPORTED: "not supported: {what}",
    ErrorCode.DEVICE_NOT_FOUND: "no FastRPC device node: tried {tried}",
    ErrorCode.DEVICE_ERROR: "{operation} failed on the FastRPC device: {reason}",
    ErrorCode.UNKNOWN_HANDLE: "unknown remote handle {handle}",
    ErrorCode.SESSION_CLOSED: "the FastRPC session is closed",
    ErrorCode.DMA_BUF_ALLOC: "DMA-BUF allocation failed: {msg}",
    ErrorCode.DMA_SIZE_OVERFLOW: "DMA buffer size {size} overflows when rounded up to a page",
    ErrorCode.DMA_EXCEEDS_MAX_SIZE: "DMA buffer size {size} exceeds the maximum of {limit} bytes",
    ErrorCode.INVALID_FD: "invalid file descriptor {fd}",
    ErrorCode.SLICE_OUT_OF_RANGE: (
        "slice offset {offset} length {length} is outside buffer {buffer} of {size} bytes"
    ),
    ErrorCode.UNKNOWN_BUFFER: "unknown buffer {buffer}",
    ErrorCode.INVALID_ARGUMENT: "invalid argument: {detail}",
    ErrorCode.QNN: "QNN error: {msg}",
    ErrorCode.MODEL_NOT_LOADED: "no model is loaded: model {model}",
    ErrorCode.INVALID_TENSOR_INDEX: "invalid tensor index {index}",
    ErrorCode.MODEL_SLOTS_FULL: "no free model slot: {detail}",
    ErrorCode.TENSOR_MISMATCH: "tensor mismatch: {detail}",
    ErrorCode.INPUT_NOT_SET: "input not set: {detail}",
    ErrorCode.MODEL_FILE_UNREADABLE: "unreadable model file: {detail}",
    ErrorCode.MODEL_FORMAT: "wrong model format: {detail}",
    ErrorCode.MODEL_MALFORMED: "malformed model: {detail}",
    ErrorCode.MODEL_REJECTED: "model rejected: {detail}",
    ErrorCode.NO_OUTPUTS: "no outputs: {detail}",
    ErrorCode.OUTPUT_TOO_LARGE: "output too large: {detail}",
    ErrorCode.SESSION_BUSY: "the NPU session is busy",
    ErrorCode.SHELL_VERIFY: "DSP shell verification failed: {reason}",
    ErrorCode.FRAME_TOO_LARGE: "frame of {size} bytes exceeds the limit of {limit} bytes",
    ErrorCode.BAD_FRAME_HEADER: "bad frame header: {detail}",
    ErrorCode.TOO_MANY_FDS: "frame declares {count} fds, more than the limit of {limit}",
    ErrorCode.MISSING_FDS: (
        "frame declares {declared} fds but {received} arrived with its first byte"
    ),
    ErrorCode.FD_COUNT_MISMATCH: (
        "{message} carries {expected} fds but its frame declares {declared}"
    ),
    ErrorCode.FDS_TRUNCATED: (
        "ancillary data was truncated (MSG_CTRUNC): file descriptors were lost"
    ),
    ErrorCode.BAD_MESSAGE: "malformed message: {detail}",
    ErrorCode.UNEXPECTED_MESSAGE: "unexpected {message} message: {reason}",
    ErrorCode.UNSUPPORTED_VERSION: (
        "protocol version {version} is not supported: this side speaks {minimum} to {maximum}"
    ),
    ErrorCode.DUPLICATE_REQUEST_ID: "request id {request_id} is already in flight",
    ErrorCode.UNKNOWN_REQUEST_ID: (
        "{message} answers request id {request_id}, which is not in flight"
    ),
    ErrorCode.TOO_MANY_IN_FLIGHT: "more than {limit} requests in flight",
    ErrorCode.TRUNCATED_FRAME: (
        "the connection closed in the middle of a frame ({buffered} bytes buffered)"
    ),
    ErrorCode.CONNECTION_CLOSED: "the connection is closed",
    ErrorCode.NOT_PERMITTED: "not permitted: {detail}",
    ErrorCode.QUOTA_EXCEEDED: "{resource} quota exceeded: the limit is {limit}",
    ErrorCode.TIMEOUT: "{operation} did not finish within {timeout_ms} ms",
    ErrorCode.SHUTTING_DOWN: "npud is shutting down",
    ErrorCode.INTERNAL_ERROR: "internal error in npud ({detail}); see the daemon's log",
    ErrorCode.DEADLINE_EXCEEDED: (
        "{operation} was not dispatched within its deadline of {deadline_ms} ms"
    ),
    ErrorCode.ADMISSION_REFUSED: "realtime budget refused: {detail}",
}

_RESULT_FIELDS: Final = frozenset({"rc", "code"})


def template(code: ErrorCode) -> str:
    return _TEMPLATES[code]


def template_fields(code: ErrorCode) -> frozenset[str]:
    """The field names a code's message needs."""
    return frozenset(name for _, name, _, _ in string.Formatter().parse(_TEMPLATES[code]) if name)


def format_message(code: ErrorCode, /, **fields: Any) -> str:
    """Render ``code``'s message; missing or surplus fields are a programming error."""
    needed = template_fields(code)
    if set(fields) != needed:
        raise TypeError(f"{code.name} needs fields {sorted(needed)}, got {sorted(fields)}")
    shown = {
        name: describe_result(value) if name in _RESULT_FIELDS and isinstance(value, int) else value
        for name, value in fields.items()
    }
    return _TEMPLATES[code].format(**shown)


class CodedError(Exception):
    """Base of every failure that carries a stable code: ``code`` and the
    template's ``fields``; ``str()`` is the rendered, stable message.

    The protocol's errors, the FastRPC session's and the daemon's all have this
    one shape, so the daemon turns any of them into an ``ErrorMessage`` in one
    place (``ErrorMessage.for_code(exc.code, **exc.fields)``), without copying
    one kind into another.
    """

    code: ErrorCode
    fields: dict[str, Any]

    def __init__(self, code: ErrorCode, /, **fields: Any) -> None:
        self.code = code
        self.fields = fields
        super().__init__(format_message(code, **fields))

    @property
    def message(self) -> str:
        return str(self)
