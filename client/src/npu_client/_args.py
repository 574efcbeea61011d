"""Invoke arguments: check what the caller passed and build the protocol's request.

Everything the daemon would refuse for a reason this side can see (a slice
of a freed or foreign buffer, too many arguments, inline data over the
connection's limit, a timeout above it) is refused here with a ValueError or
TypeError naming the argument, before anything is sent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TypeAlias

from npu_client._memory import MappedBuffer, Slice
from npu_protocol import (
    MAX_ARGS,
    MAX_DMA_SIZE,
    MAX_METHOD,
    MAX_PING_PAYLOAD,
    MAX_URI_LENGTH,
    BufferSlice,
    ClientLimits,
    InlineInput,
    InlineOutput,
    InvokeRequest,
)

InvokeInput: TypeAlias = bytes | bytearray | memoryview | Slice
"""An invoke input: bytes sent inline, or a slice the DSP reads in place."""

InvokeOutput: TypeAlias = int | Slice
"""An invoke output: a capacity (bytes come back inline), or a slice the DSP writes."""

_U32_MAX = 0xFFFF_FFFF


def invoke_request(
    *,
    handle: int,
    method: int | None,
    sc: int | None,
    inputs: Sequence[InvokeInput],
    outputs: Sequence[InvokeOutput],
    timeout: float | None,
    limits: ClientLimits,
    owns: Callable[[MappedBuffer], bool],
) -> Callable[[int], InvokeRequest]:
    """A checked invoke, waiting only for its request id.

    ``owns(buffer)`` says whether a slice's buffer is a live buffer of this
    connection. ``timeout`` is in seconds.
    """
    _check_selector(method, sc)
    wire_inputs = tuple(_input(i, arg, owns) for i, arg in enumerate(_args("inputs", inputs)))
    wire_outputs = tuple(_output(i, arg, owns) for i, arg in enumerate(_args("outputs", outputs)))
    inline_in = sum(len(arg.data) for arg in wire_inputs if isinstance(arg, InlineInput))
    inline_out = sum(arg.capacity for arg in wire_outputs if isinstance(arg, InlineOutput))
    for what, total in (("inputs", inline_in), ("output capacities", inline_out)):
        if total > limits.max_inline_bytes:
            raise ValueError(
                f"inline {what} total {total} bytes, over this connection's limit of "
                f"{limits.max_inline_bytes}: pass large data as a buffer slice"
            )
    timeout_ms = _timeout_ms(timeout, limits)

    def build(request_id: int) -> InvokeRequest:
        # InvokeRequest checks sc against the argument counts (ValueError).
        return InvokeRequest(
            id=request_id,
            handle=handle,
            method=method,
            sc=sc,
            inputs=wire_inputs,
            outputs=wire_outputs,
            timeout_ms=timeout_ms,
        )

    build(0)  # refuse a bad sc now, not when the request is being sent
    return build


def _check_selector(method: int | None, sc: int | None) -> None:
    if (method is None) == (sc is None):
        raise ValueError("give exactly one of method and sc")
    if method is not None:
        _check_int("method", method, 0, MAX_METHOD)
    if sc is not None:
        _check_int("sc", sc, 0, _U32_MAX)


def _check_int(what: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{what} must be between {low} and {high}, got {value}")


def _args(what: str, args: object) -> Sequence[object]:
    if isinstance(args, bytes | bytearray | memoryview | str | Slice):
        raise TypeError(f"{what} must be a sequence of arguments; wrap a single one: [arg]")
    if not isinstance(args, Sequence):
        raise TypeError(f"{what} must be a sequence, not {type(args).__name__}")
    if len(args) > MAX_ARGS:
        raise ValueError(f"{len(args)} {what}; an invoke takes at most {MAX_ARGS}")
    return args


def _input(
    index: int, arg: object, owns: Callable[[MappedBuffer], bool]
) -> InlineInput | BufferSlice:
    if isinstance(arg, Slice):
        return _slice(f"inputs[{index}]", arg, owns)
    if isinstance(arg, bytes | bytearray | memoryview):
        return InlineInput(data=bytes(arg))
    raise TypeError(
        f"inputs[{index}] must be bytes-like or a buffer slice, not {type(arg).__name__}"
    )


def _output(
    index: int, arg: object, owns: Callable[[MappedBuffer], bool]
) -> InlineOutput | BufferSlice:
    if isinstance(arg, Slice):
        return _slice(f"outputs[{index}]", arg, owns)
    if isinstance(arg, int) and not isinstance(arg, bool):
        if arg < 0:
            raise ValueError(f"outputs[{index}] capacity must not be negative, got {arg}")
        return InlineOutput(capacity=arg)
    raise TypeError(
        f"outputs[{index}] must be an int capacity or a buffer slice, not {type(arg).__name__}"
    )


def _slice(what: str, arg: Slice, owns: Callable[[MappedBuffer], bool]) -> BufferSlice:
    if arg.buffer.freed:
        reason = arg.buffer._gone  # same package: "freed", or why else it went
        raise ValueError(f"{what} is a slice of buffer {arg.buffer.id}, which is {reason}")
    if not owns(arg.buffer):
        raise ValueError(f"{what} is a slice of a buffer of another client")
    return BufferSlice(buffer=arg.buffer.id, offset=arg.offset, length=arg.length)


def _timeout_ms(timeout: float | None, limits: ClientLimits) -> int | None:
    if timeout is None:
        return None
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not timeout > 0 or math.isinf(timeout):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    milliseconds = math.ceil(timeout * 1000)
    if milliseconds > limits.max_timeout_ms:
        raise ValueError(
            f"timeout {timeout} s is above this connection's limit of "
            f"{limits.max_timeout_ms / 1000:g} s"
        )
    return milliseconds


# --- the other requests' arguments --------------------------------------------------------

_URI = re.compile(rf"[\x21-\x7e]{{1,{MAX_URI_LENGTH}}}")


def check_size(size: object) -> int:
    """An alloc size: an int from 1 to MAX_DMA_SIZE."""
    _check_int("size", size, 1, MAX_DMA_SIZE)
    assert isinstance(size, int)
    return size


def check_uri(uri: object) -> str:
    """A remotectl URI: 1 to 1023 printable ASCII characters without spaces."""
    if not isinstance(uri, str):
        raise TypeError(f"uri must be a str, not {type(uri).__name__}")
    if not _URI.fullmatch(uri):
        raise ValueError(
            f"uri {uri[:80]!r} is not allowed: use 1 to {MAX_URI_LENGTH} printable ASCII "
            "characters without spaces"
        )
    return uri


def check_ping_payload(payload: object) -> bytes:
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"ping payload must be bytes-like, not {type(payload).__name__}")
    data = bytes(payload)
    if len(data) > MAX_PING_PAYLOAD:
        raise ValueError(f"ping payload of {len(data)} bytes; the limit is {MAX_PING_PAYLOAD}")
    return data
