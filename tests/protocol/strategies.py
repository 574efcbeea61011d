"""Hypothesis strategies for every message, derived from the msgspec types.

Deriving them from ``msgspec.inspect`` means a field added later is generated
(within its bounds) without touching this file. The few cross-field rules
that live in ``__post_init__`` get hand-written strategies.
"""

from __future__ import annotations

import typing
from typing import Any, Final

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

import npu_protocol as p

_SMALL: Final = 24  # keep generated strings, byte strings and arrays short
_INT64_MIN: Final = -(2**63)
_UINT64_MAX: Final = 2**64 - 1


def for_type(info: mi.Type) -> st.SearchStrategy[Any]:
    """Values of a msgspec type that respect its bounds."""
    match info:
        case mi.IntType(ge=ge, le=le):
            low = _INT64_MIN if ge is None else ge
            high = _UINT64_MAX if le is None else le
            return st.integers(low, high)
        case mi.StrType(max_length=max_length, pattern=pattern):
            if pattern is not None:
                return st.from_regex(pattern, fullmatch=True)
            return st.text(max_size=min(max_length or _SMALL, _SMALL))
        case mi.BytesType(max_length=max_length):
            return st.binary(max_size=min(max_length or _SMALL, _SMALL))
        case mi.BoolType() | mi.FloatType():
            return st.booleans() if isinstance(info, mi.BoolType) else st.floats(allow_nan=False)
        case mi.NoneType():
            return st.none()
        case mi.EnumType(cls=cls):
            return st.sampled_from(list(cls))
        case mi.LiteralType(values=values):
            return st.sampled_from(values)
        case mi.StructType(cls=cls):
            return of(cls)
        case mi.UnionType(types=types):
            return st.one_of(*(for_type(t) for t in types))
        case mi.VarTupleType(item_type=item, min_length=min_length, max_length=max_length):
            least = min_length or 0
            most = max(least, min(max_length or _SMALL, 4))
            return st.lists(for_type(item), min_size=least, max_size=most).map(tuple)
        case mi.DictType(key_type=key, value_type=value, max_length=max_length):
            return st.dictionaries(for_type(key), for_type(value), max_size=min(max_length or 4, 4))
    raise TypeError(f"no strategy for {info!r}")


def _derived(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {field.name: for_type(field.type) for field in info.fields}
    return st.builds(cls, **fields)


def _buffer_slices() -> st.SearchStrategy[p.BufferSlice]:
    return st.integers(0, p.MAX_BUFFER_SIZE).flatmap(
        lambda offset: st.builds(
            p.BufferSlice,
            buffer=st.integers(1, 2**32 - 1),
            offset=st.just(offset),
            length=st.integers(0, p.MAX_BUFFER_SIZE - offset),
        )
    )


@st.composite
def _invokes(draw: st.DrawFn) -> p.InvokeRequest:
    inputs = draw(st.lists(st.one_of(of(p.InlineInput), _buffer_slices()), max_size=4))
    outputs = draw(st.lists(st.one_of(of(p.InlineOutput), _buffer_slices()), max_size=4))
    method = draw(st.integers(0, p.MAX_METHOD))
    use_sc = draw(st.booleans())
    sc = draw(st.integers(0, 7)) << 29 | method << 24 | len(inputs) << 16 | len(outputs) << 8
    return p.InvokeRequest(
        id=draw(st.integers(0, 2**32 - 1)),
        handle=draw(st.integers(1, 2**32 - 1)),
        method=None if use_sc else method,
        sc=sc if use_sc else None,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        timeout_ms=draw(st.none() | st.integers(1, p.MAX_TIMEOUT_MS)),
        deadline_ms=draw(st.none() | st.integers(1, p.MAX_TIMEOUT_MS)),
    )


@st.composite
def _budgets(draw: st.DrawFn) -> p.Budget:
    period = draw(st.integers(100, 10_000_000))
    return p.Budget(period_us=period, budget_us=draw(st.integers(1, period)))


@st.composite
def _limits(draw: st.DrawFn) -> p.ClientLimits:
    frame = draw(st.integers(p.HANDSHAKE_MAX_FRAME_SIZE, p.MAX_FRAME_SIZE_CEILING))
    max_timeout = draw(st.integers(1, p.MAX_TIMEOUT_MS))
    return p.ClientLimits(
        priority=draw(st.sampled_from(list(p.Priority))),
        max_frame_size=frame,
        max_in_flight=draw(st.integers(1, 0xFFFF)),
        max_inline_bytes=draw(st.integers(0, frame - p.INLINE_RESERVE)),
        max_buffers=draw(st.integers(0, 2**32 - 1)),
        max_buffer_bytes=draw(st.integers(0, 2**63 - 1)),
        max_handles=draw(st.integers(0, 2**32 - 1)),
        max_timeout_ms=max_timeout,
        default_timeout_ms=draw(st.none() | st.integers(1, max_timeout)),
    )


_OVERRIDES: Final[dict[type[Any], st.SearchStrategy[Any]]] = {
    p.BufferSlice: _buffer_slices(),
    p.InvokeRequest: _invokes(),
    p.ClientLimits: _limits(),
    p.Budget: _budgets(),
}


def of(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Valid instances of one message or record type."""
    if cls in _OVERRIDES:
        return _OVERRIDES[cls]
    return st.deferred(lambda: _derived(cls))


def any_of(union: Any) -> st.SearchStrategy[Any]:
    """Valid instances of any member of a union such as ClientMessage."""
    return st.one_of(*(of(cls) for cls in typing.get_args(union)))
