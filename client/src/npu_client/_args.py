"""Request arguments: check what the caller passed, before anything is sent.

Everything the daemon would refuse for a reason this side can see (a slice
of a freed or foreign buffer, too many arguments, inline data over the
connection's limit, a timeout above it, a bad size or URI) is refused here
with a ValueError or TypeError naming the argument. What passes is what the
protocol's message types accept, so the request built from it is sent as it
is (the protocol does not check it again).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TypeAlias

from npu_client._errors import code_message, make_error
from npu_client._memory import MappedBuffer, Slice
from npu_protocol import (
    MAX_ARGS,
    MAX_BUFFER_SIZE,
    MAX_METHOD,
    MAX_PING_PAYLOAD,
    MAX_TIMEOUT_MS,
    MAX_URI_LENGTH,
    PROTOCOL_VERSION,
    SINCE,
    Budget,
    BufferSlice,
    ClientLimits,
    ErrorCode,
    Feature,
    InlineInput,
    InlineOutput,
    InvokeRequest,
    speaks,
)

InvokeInput: TypeAlias = bytes | bytearray | memoryview | Slice
"""An invoke input: bytes sent inline, or a slice the DSP reads in place."""

InvokeOutput: TypeAlias = int | Slice
"""An invoke output: a capacity (bytes come back inline), or a slice the DSP writes."""

_U32_MAX = 0xFFFF_FFFF
_BYTES_LIKE = (bytes, bytearray, memoryview)


def invoke_request(
    handle: int,
    method: int | None,
    sc: int | None,
    inputs: Sequence[InvokeInput],
    outputs: Sequence[InvokeOutput],
    timeout: float | None,
    limits: ClientLimits,
    owns: Callable[[MappedBuffer], bool],
    deadline: float | None = None,
    protocol_version: int = PROTOCOL_VERSION,
) -> Callable[[int], InvokeRequest]:
    """A checked invoke, waiting only for its request id (it is built once, then).

    ``owns(buffer)`` says whether a slice's buffer is a live buffer of this
    connection. ``timeout`` and ``deadline`` are in seconds from now;
    ``protocol_version`` is the one the Welcome named (deadlines need 2).
    """
    # Every call of every client comes through here: the common cases are
    # tested first and cheaply; anything unusual gets the careful check.
    if sc is not None or type(method) is not int or not 0 <= method <= MAX_METHOD:
        _check_selector(method, sc)
    wire_inputs, inline_in = _inputs(inputs, owns)
    wire_outputs, inline_out = _outputs(outputs, owns)
    if inline_in > limits.max_inline_bytes or inline_out > limits.max_inline_bytes:
        what, total = ("inputs", inline_in)
        if inline_in <= limits.max_inline_bytes:
            what, total = ("output capacities", inline_out)
        raise ValueError(
            f"inline {what} total {total} bytes, over this connection's limit of "
            f"{limits.max_inline_bytes}: pass large data as a buffer slice"
        )
    timeout_ms = None if timeout is None else _timeout_ms(timeout, limits)
    deadline_ms = None if deadline is None else _deadline_ms(deadline, protocol_version)

    def build(request_id: int) -> InvokeRequest:
        return InvokeRequest(
            id=request_id,
            handle=handle,
            method=method,
            sc=sc,
            inputs=wire_inputs,
            outputs=wire_outputs,
            timeout_ms=timeout_ms,
            deadline_ms=deadline_ms,
        )

    if sc is not None:
        build(0)  # InvokeRequest checks sc against the argument counts: refuse a bad one now
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
    """``args`` if it is a sequence of at most MAX_ARGS arguments."""
    if isinstance(args, bytes | bytearray | memoryview | str | Slice):
        raise TypeError(f"{what} must be a sequence of arguments; wrap a single one: [arg]")
    if not isinstance(args, Sequence):
        raise TypeError(f"{what} must be a sequence, not {type(args).__name__}")
    if len(args) > MAX_ARGS:
        raise ValueError(f"{len(args)} {what}; an invoke takes at most {MAX_ARGS}")
    return args


def _inputs(
    args: object, owns: Callable[[MappedBuffer], bool]
) -> tuple[tuple[InlineInput | BufferSlice, ...], int]:
    """The wire inputs and the total of their inline bytes."""
    if (type(args) is not list and type(args) is not tuple) or len(args) > MAX_ARGS:
        args = _args("inputs", args)
    wire: list[InlineInput | BufferSlice] = []
    inline = 0
    for arg in args:
        if type(arg) is bytes:
            inline += len(arg)
            wire.append(InlineInput(data=arg))
        elif isinstance(arg, _BYTES_LIKE):
            data = bytes(arg)
            inline += len(data)
            wire.append(InlineInput(data=data))
        elif isinstance(arg, Slice):
            wire.append(_slice("inputs", len(wire), arg, owns))
        else:
            raise TypeError(
                f"inputs[{len(wire)}] must be bytes-like or a buffer slice, "
                f"not {type(arg).__name__}"
            )
    return tuple(wire), inline


def _outputs(
    args: object, owns: Callable[[MappedBuffer], bool]
) -> tuple[tuple[InlineOutput | BufferSlice, ...], int]:
    """The wire outputs and the total of their inline capacities."""
    if (type(args) is not list and type(args) is not tuple) or len(args) > MAX_ARGS:
        args = _args("outputs", args)
    wire: list[InlineOutput | BufferSlice] = []
    inline = 0
    for arg in args:
        if type(arg) is int or (isinstance(arg, int) and not isinstance(arg, bool)):
            if arg < 0:
                raise ValueError(f"outputs[{len(wire)}] capacity must not be negative, got {arg}")
            inline += arg
            wire.append(InlineOutput(capacity=arg))
        elif isinstance(arg, Slice):
            wire.append(_slice("outputs", len(wire), arg, owns))
        else:
            raise TypeError(
                f"outputs[{len(wire)}] must be an int capacity or a buffer slice, "
                f"not {type(arg).__name__}"
            )
    return tuple(wire), inline


def _slice(what: str, index: int, arg: Slice, owns: Callable[[MappedBuffer], bool]) -> BufferSlice:
    buffer = arg.buffer
    if buffer.freed:
        reason = buffer._gone  # same package: "freed", or why else it went
        raise ValueError(f"{what}[{index}] is a slice of buffer {buffer.id}, which is {reason}")
    if not owns(buffer):
        raise ValueError(f"{what}[{index}] is a slice of a buffer of another client")
    return BufferSlice(buffer=buffer.id, offset=arg.offset, length=arg.length)


def call_timing(
    timeout: float | None, deadline: float | None, limits: ClientLimits, protocol_version: int
) -> tuple[int | None, int | None]:
    """A DSP call's ``timeout`` and ``deadline`` (seconds) as the request's milliseconds."""
    return (
        None if timeout is None else _timeout_ms(timeout, limits),
        None if deadline is None else _deadline_ms(deadline, protocol_version),
    )


def _timeout_ms(timeout: object, limits: ClientLimits) -> int:
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


def _deadline_ms(deadline: object, protocol_version: int) -> int:
    if not isinstance(deadline, int | float) or isinstance(deadline, bool):
        raise TypeError(f"deadline must be a number of seconds, not {type(deadline).__name__}")
    if not deadline > 0 or math.isinf(deadline):
        raise ValueError(f"deadline must be a positive number of seconds, got {deadline}")
    milliseconds = math.ceil(deadline * 1000)
    if milliseconds > MAX_TIMEOUT_MS:
        raise ValueError(f"deadline {deadline} s is above {MAX_TIMEOUT_MS / 1000:g} s")
    if not speaks(protocol_version, Feature.DEADLINES):
        # An older npud would ignore the key and run the call whenever.
        raise make_error(
            ErrorCode.UNSUPPORTED,
            code_message(
                ErrorCode.UNSUPPORTED,
                what=f"deadlines (npud speaks protocol version {protocol_version};"
                f" they need {SINCE[Feature.DEADLINES]})",
            ),
        )
    return milliseconds


def budget_record(budget: tuple[float, float] | None) -> Budget | None:
    """``(period, budget)`` in seconds as the Hello's record, checked."""
    if budget is None:
        return None
    if not isinstance(budget, tuple) or len(budget) != 2:
        raise TypeError("budget must be (period, budget) in seconds")
    period, share = budget
    for what, value in (("period", period), ("budget", share)):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"budget {what} must be a number of seconds")
    period_us, budget_us = round(period * 1e6), round(share * 1e6)
    if not 100 <= period_us <= 10_000_000:
        raise ValueError(f"budget period must be between 100 µs and 10 s, got {period} s")
    if not 1 <= budget_us <= period_us:
        raise ValueError(f"budget must be positive and at most its period, got {share} s")
    return Budget(period_us=period_us, budget_us=budget_us)


# --- the other requests' arguments --------------------------------------------------------

_URI = re.compile(rf"[\x21-\x7e]{{1,{MAX_URI_LENGTH}}}")


def largest_buffer(limits: ClientLimits) -> int:
    """The largest alloc the daemon takes: the ``max_buffer_size`` its Welcome announced
    (an npud older than protocol version 6 announces none: MAX_DMA_SIZE, 256 MiB, the
    field's default), never more than the wire can name (MAX_BUFFER_SIZE, 4 GiB)."""
    return min(limits.max_buffer_size, MAX_BUFFER_SIZE)


def check_size(size: object, largest: int) -> int:
    """An alloc size: an int from 1 to ``largest`` (:func:`largest_buffer`)."""
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"size must be an int, not {type(size).__name__}")
    if not 1 <= size <= largest:
        raise ValueError(
            f"size must be between 1 and {largest} (npud's largest buffer,"
            f" limits.max_buffer_size), got {size}"
        )
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
    if not isinstance(payload, _BYTES_LIKE):
        raise TypeError(f"ping payload must be bytes-like, not {type(payload).__name__}")
    data = bytes(payload)
    if len(data) > MAX_PING_PAYLOAD:
        raise ValueError(f"ping payload of {len(data)} bytes; the limit is {MAX_PING_PAYLOAD}")
    return data
