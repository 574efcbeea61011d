"""The protobuf wire format, read and written as protobuf does: :func:`fields` walks
a message's fields one at a time (a generator: never a list of them), skipping
groups and values by their length; :func:`length_field` encodes one.

Tags, lengths and values are read exactly as the ``upb`` parser reads them
(tests/unit/test_onnx_differential.py compares the two): a tag is a varint of at
most 5 bytes whose value fits 32 bits, a length at most 5 bytes and below
2^31 - 1, a value at most 10 bytes (its low 64 bits); a field numbered 0 is
refused, as the C++ parser does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, NamedTuple

from npud.formats.onnx_source import CHECK_EVERY, Budget, DamagedError, Source

MAX_DEPTH: Final = 64
"""Messages (and groups) nested deeper than this are refused (protobuf's own parsers
stop at 100)."""
MAX_TAG_BYTES: Final = 5
MAX_LENGTH_BYTES: Final = 5
MAX_VARINT_BYTES: Final = 10
MAX_LENGTH: Final = (1 << 31) - 2
"""The longest length-delimited field protobuf reads (it refuses a size >= INT32_MAX)."""
_HEADER_BYTES: Final = MAX_TAG_BYTES + MAX_VARINT_BYTES
CHUNK: Final = 4096
"""Bytes a walk takes from its source at a time (FdSource serves them from its window:
one pread per WINDOW of the file read forward)."""
_U32: Final = 0xFFFFFFFF
_U64: Final = (1 << 64) - 1
MAX_SHOWN: Final = 128
"""Bytes of a tensor name or location quoted in a message, at most."""

VARINT, FIXED64, LENGTH, GROUP_START, GROUP_END, FIXED32 = 0, 1, 2, 3, 4, 5


class Field(NamedTuple):
    """One field of a message: its number, wire type, and where its value lies."""

    number: int
    wire: int
    start: int  # the value's first byte (a length-delimited field's payload, a group's first)
    end: int  # one past its last byte (a group's: past its end-group tag)
    value: int  # a varint's value, a length-delimited field's length, else 0
    head: int = 0  # the field's first byte (its key)


class _Chunk:
    """Forward reads of [offset, end) of a source, :data:`CHUNK` bytes at a time."""

    __slots__ = ("base", "data", "end", "source")

    def __init__(self, source: Source, end: int) -> None:
        self.source = source
        self.end = end
        self.base = 0
        self.data = b""

    def at(self, offset: int) -> int:
        """Where ``offset`` is in :attr:`data`, read so that a whole field header (or the
        message's end) follows it there."""
        relative = offset - self.base
        if relative < 0 or (
            relative + _HEADER_BYTES > len(self.data) and self.base + len(self.data) < self.end
        ):
            self.base = offset
            self.data = self.source.read(offset, min(self.end - offset, CHUNK))
            relative = 0
        return relative

    def varint(self, offset: int, longest: int) -> tuple[int, int]:
        """The varint at ``offset`` of at most ``longest`` bytes: (value, offset after)."""
        at = self.at(offset)
        data = self.data
        value, shift, first = 0, 0, at
        stop = min(len(data), at + longest)
        while at < stop:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, self.base + at
            shift += 7
        if at - first == longest:
            raise DamagedError(f"a varint longer than {longest} bytes")
        raise DamagedError("a field ends inside its header")


def _varint(data: bytes, at: int, longest: int) -> tuple[int, int]:
    """The varint at ``data[at]`` of at most ``longest`` bytes: (value, index after)."""
    value, shift, stop = 0, 0, min(len(data), at + longest)
    first = at
    while at < stop:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    if at - first == longest:
        raise DamagedError(f"a varint longer than {longest} bytes")
    raise DamagedError("a field ends inside its header")


def fields(  # noqa: PLR0912, PLR0915 - one loop, inlined: a field per turn is a walk's cost
    source: Source, offset: int, end: int, budget: Budget | None = None
) -> Iterator[Field]:
    """The fields of the message in [offset, end), in order, parsed as they are read;
    DamagedError when malformed (after the fields before the damage), CheckTimeoutError
    when ``budget`` runs out. Reads :data:`CHUNK` bytes at a time, so that a whole
    field header is in hand before it is parsed."""
    base, data = offset, b""
    count = 0
    while offset < end:
        count += 1
        if count >= CHECK_EVERY:
            count = 0
            if budget is not None:
                budget.check()
        at = offset - base
        if at + _HEADER_BYTES > len(data) and base + len(data) < end:
            base, data, at = offset, source.read(offset, min(end - offset, CHUNK)), 0
        if at >= len(data):
            raise DamagedError("a field ends inside its header")  # the file shrank
        key = data[at]
        if key < 0x80:
            at += 1
        else:
            key, at = _varint(data, at, MAX_TAG_BYTES)
            if key > _U32:
                raise DamagedError("a field tag over 32 bits (protobuf refuses it)")
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DamagedError("a field numbered 0")
        if wire == LENGTH:
            value = data[at] if at < len(data) else 0x80
            if value < 0x80:
                at += 1
            else:
                value, at = _varint(data, at, MAX_LENGTH_BYTES)
                if value > MAX_LENGTH:
                    raise DamagedError(f"field {number} of {value} bytes (protobuf reads < 2 GiB)")
            start = base + at
            after = start + value
        elif wire == VARINT:
            start = base + at
            value, at = _varint(data, at, MAX_VARINT_BYTES)
            value &= _U64
            after = base + at
        elif wire in (FIXED64, FIXED32):
            start = base + at
            value, after = 0, start + (8 if wire == FIXED64 else 4)
        elif wire == GROUP_START:
            start = base + at
            value, after = 0, _skip_group(_Chunk(source, end), number, start, end, budget)
        elif wire == GROUP_END:
            raise DamagedError(f"an end-group tag (field {number}) outside a group")
        else:
            raise DamagedError(f"wire type {wire}")
        if after > end:
            raise DamagedError(f"field {number} runs {after - end} bytes past its message")
        yield Field(number, wire, start, after, value, offset)
        offset = after


def _skip_group(chunk: _Chunk, number: int, offset: int, end: int, budget: Budget | None) -> int:
    """Past the end-group tag that closes group ``number`` opened before ``offset`` (its
    fields skipped, nested groups too, as protobuf skips an unknown group)."""
    open_groups = [number]
    count = 0
    while offset < end:
        count += 1
        if count >= CHECK_EVERY:
            count = 0
            if budget is not None:
                budget.check()
        key, offset = chunk.varint(offset, MAX_TAG_BYTES)
        if key > _U32:
            raise DamagedError("a field tag over 32 bits (protobuf refuses it)")
        inner, wire = key >> 3, key & 7
        if inner == 0:
            raise DamagedError("a field numbered 0")
        if wire == GROUP_START:
            if len(open_groups) >= MAX_DEPTH:
                raise DamagedError(f"groups nest deeper than {MAX_DEPTH}")
            open_groups.append(inner)
        elif wire == GROUP_END:
            if open_groups.pop() != inner:
                raise DamagedError(f"group {number} closed by an end-group tag of field {inner}")
            if not open_groups:
                return offset
        else:
            offset = _skip_value(chunk, inner, wire, offset)
    raise DamagedError(f"group {number} has no end")


def _skip_value(chunk: _Chunk, number: int, wire: int, offset: int) -> int:
    """Past the value of field ``number`` of wire type ``wire`` (not a group's)."""
    if wire == VARINT:
        return chunk.varint(offset, MAX_VARINT_BYTES)[1]
    if wire == LENGTH:
        length, offset = chunk.varint(offset, MAX_LENGTH_BYTES)
        if length > MAX_LENGTH:
            raise DamagedError(f"field {number} of {length} bytes (protobuf reads < 2 GiB)")
        return offset + length
    if wire in (FIXED64, FIXED32):
        return offset + (8 if wire == FIXED64 else 4)
    raise DamagedError(f"wire type {wire}")


def shown_text(source: Source, field: Field) -> str:
    """A length-delimited field as text for a message: at most MAX_SHOWN bytes of it."""
    shown = source.read(field.start, min(field.value, MAX_SHOWN))
    text = shown.decode("utf-8", errors="replace")
    return text + "..." if field.value > MAX_SHOWN else text


def field_key(number: int, wire: int) -> bytes:
    """A field's key (its tag), encoded."""
    return encode_varint(number << 3 | wire)


def length_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field ``number`` holding ``payload``, encoded."""
    return field_key(number, LENGTH) + encode_varint(len(payload)) + payload


def encode_varint(value: int) -> bytes:
    """``value`` (unsigned) as a protobuf varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
