"""The error templates as published (PROTOCOL.md section 11), by code number: for the
codes of version 1, its text; for later codes, the text they were published with.

A template may only gain detail at its end; test_errors.py holds every current
template to this table. A new code is added here in the commit that adds it; a
published template is never edited here, so a break is never an accident.
"""

from __future__ import annotations

from typing import Final

PUBLISHED: Final[dict[int, str]] = {
    100: "FastRPC call failed with DSP result {rc}",  # FASTRPC
    101: "cannot open remote module {uri!r}: {code}: {detail}",  # OPEN_FAILED
    102: "remote invoke failed with DSP result {code}",  # INVOKE_FAILED
    103: "mapping buffer into the DSP failed: {code}",  # MMAP_FAILED
    104: "the DSP restarted (subsystem restart, EPIPE): every DSP handle and mapping is gone; reopen the session",  # DSP_RESTARTED
    105: "no free FastRPC session on {device} (EBUSY): every compute context bank is in use",  # NO_FREE_SESSION
    106: "not supported: {what}",  # UNSUPPORTED
    107: "no FastRPC device node: tried {tried}",  # DEVICE_NOT_FOUND
    108: "{operation} failed on the FastRPC device: {reason}",  # DEVICE_ERROR
    109: "unknown remote handle {handle}",  # UNKNOWN_HANDLE
    110: "the FastRPC session is closed",  # SESSION_CLOSED
    200: "DMA-BUF allocation failed: {msg}",  # DMA_BUF_ALLOC
    201: "DMA buffer size {size} overflows when rounded up to a page",  # DMA_SIZE_OVERFLOW
    202: "DMA buffer size {size} exceeds the maximum of 256 MB",  # DMA_EXCEEDS_MAX_SIZE
    203: "invalid file descriptor {fd}",  # INVALID_FD
    204: "slice offset {offset} length {length} is outside buffer {buffer} of {size} bytes",  # SLICE_OUT_OF_RANGE
    205: "unknown buffer {buffer}",  # UNKNOWN_BUFFER
    206: "invalid argument: {detail}",  # INVALID_ARGUMENT
    300: "QNN error: {msg}",  # QNN
    301: "no model is loaded",  # MODEL_NOT_LOADED
    302: "invalid tensor index {index}",  # INVALID_TENSOR_INDEX
    303: "no free model slot: {detail}",  # MODEL_SLOTS_FULL
    304: "tensor mismatch: {detail}",  # TENSOR_MISMATCH
    305: "input not set: {detail}",  # INPUT_NOT_SET
    306: "unreadable model file: {detail}",  # MODEL_FILE_UNREADABLE
    307: "wrong model format: {detail}",  # MODEL_FORMAT
    308: "malformed model: {detail}",  # MODEL_MALFORMED
    309: "model rejected: {detail}",  # MODEL_REJECTED
    310: "no outputs: {detail}",  # NO_OUTPUTS
    311: "output too large: {detail}",  # OUTPUT_TOO_LARGE
    400: "the NPU session is busy",  # SESSION_BUSY
    401: "DSP shell verification failed: {reason}",  # SHELL_VERIFY
    500: "frame of {size} bytes exceeds the limit of {limit} bytes",  # FRAME_TOO_LARGE
    501: "bad frame header: {detail}",  # BAD_FRAME_HEADER
    502: "frame declares {count} fds, more than the limit of {limit}",  # TOO_MANY_FDS
    503: "frame declares {declared} fds but {received} arrived with its first byte",  # MISSING_FDS
    504: "{message} carries {expected} fds but its frame declares {declared}",  # FD_COUNT_MISMATCH
    505: "ancillary data was truncated (MSG_CTRUNC): file descriptors were lost",  # FDS_TRUNCATED
    506: "malformed message: {detail}",  # BAD_MESSAGE
    507: "unexpected {message} message: {reason}",  # UNEXPECTED_MESSAGE
    508: "protocol version {version} is not supported: this side speaks {minimum} to {maximum}",  # UNSUPPORTED_VERSION
    509: "request id {request_id} is already in flight",  # DUPLICATE_REQUEST_ID
    510: "{message} answers request id {request_id}, which is not in flight",  # UNKNOWN_REQUEST_ID
    511: "more than {limit} requests in flight",  # TOO_MANY_IN_FLIGHT
    512: "the connection closed in the middle of a frame ({buffered} bytes buffered)",  # TRUNCATED_FRAME
    513: "the connection is closed",  # CONNECTION_CLOSED
    600: "not permitted: {detail}",  # NOT_PERMITTED
    601: "{resource} quota exceeded: the limit is {limit}",  # QUOTA_EXCEEDED
    602: "{operation} did not finish within {timeout_ms} ms",  # TIMEOUT
    603: "npud is shutting down",  # SHUTTING_DOWN
    604: "internal error in npud ({detail}); see the daemon's log",  # INTERNAL_ERROR
    605: "{operation} was not dispatched within its deadline of {deadline_ms} ms",  # DEADLINE_EXCEEDED
    606: "realtime budget refused: {detail}",  # ADMISSION_REFUSED
}

CORRECTED: Final[dict[int, str]] = {
    # Version 6 raised a buffer's ceiling past 256 MiB (to the wire's 4 GiB; a client's own
    # is its Welcome's limits.max_buffer_size): the fixed "256 MB" had become false. The
    # text up to "maximum of " is kept for operators' greps; the ceiling is a field now.
    202: "DMA buffer size {size} exceeds the maximum of {limit} bytes",  # DMA_EXCEEDS_MAX_SIZE
}
"""Templates corrected on purpose because their fixed text became false (the code's
meaning is unchanged; a client shows the message its server rendered, so an older
client is not affected). From the correction on, the corrected text is the one that
may only gain detail at its end."""
