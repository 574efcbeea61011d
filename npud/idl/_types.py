"""The IDL's types and the values that travel in them (see npud.idl)."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Final, Literal, Protocol, TypeAlias, TypeGuard, runtime_checkable

DOMAIN_BASE: Final = "remote_handle64"

Writable: TypeAlias = bytearray | memoryview


class IdlError(ValueError):
    """The IDL text is outside the subset this parser understands."""


class MarshalError(ValueError):
    """Values or buffers that do not fit a method (a skel answers AEE_EBADPARM)."""


@dataclasses.dataclass(frozen=True)
class Primitive:
    """A fixed-size scalar type; ``code`` is its :mod:`struct` format character."""

    name: str
    code: str

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.code)

    @property
    def align(self) -> int:
        return self.size

    @property
    def is_text(self) -> bool:
        """``char``: arrays and sequences of it are text."""
        return self.name == "char"

    def check(self, value: object, what: str) -> int | float:
        if self.code in "fd":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise MarshalError(f"{what} must be a number, not {type(value).__name__}")
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise MarshalError(f"{what} must be an integer, not {type(value).__name__}")
        bits = self.size * 8
        signed = self.code.islower()
        low = -(1 << (bits - 1)) if signed else 0
        high = (1 << (bits - 1 if signed else bits)) - 1
        if not low <= value <= high:
            raise MarshalError(f"{what}={value} does not fit in {self.name}")
        return value

    def pack_into(self, buffer: Writable, offset: int, value: object, what: str) -> None:
        struct.pack_into("<" + self.code, buffer, offset, self.check(value, what))

    def unpack_from(self, buffer: bytes | memoryview, offset: int) -> int | float:
        (value,) = struct.unpack_from("<" + self.code, buffer, offset)
        return value  # type: ignore[no-any-return]


PRIMITIVES: Final = {
    name: Primitive(name, code)
    for name, code in (
        ("octet", "B"),
        ("uint8", "B"),
        ("int8", "b"),
        ("char", "B"),
        ("boolean", "B"),
        ("uint16", "H"),
        ("int16", "h"),
        ("uint32", "I"),
        ("int32", "i"),
        ("uint64", "Q"),
        ("int64", "q"),
        ("float", "f"),
        ("double", "d"),
    )
}
# Spellings qaic maps onto the sized names (IDL ``long`` is 32 bits).
ALIASES: Final = {
    ("short",): "int16",
    ("unsigned", "short"): "uint16",
    ("long",): "int32",
    ("int",): "int32",
    ("unsigned", "long"): "uint32",
    ("unsigned", "int"): "uint32",
    ("long", "long"): "int64",
    ("unsigned", "long", "long"): "uint64",
    ("unsigned", "char"): "uint8",
}
U32: Final = PRIMITIVES["uint32"]


@dataclasses.dataclass(frozen=True)
class Member:
    """A struct member: a primitive, or a fixed array of ``count`` of them."""

    name: str
    type: Primitive
    count: int | None
    offset: int

    @property
    def size(self) -> int:
        return self.type.size * (self.count or 1)


@dataclasses.dataclass(frozen=True)
class StructType:
    """A flat struct (primitives and fixed arrays), laid out as C lays it out."""

    name: str
    members: tuple[Member, ...]
    size: int
    align: int

    def member(self, name: str) -> Member:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(name)

    def pack_into(self, buffer: Writable, offset: int, value: object, what: str) -> None:
        """Write ``value`` (a mapping of member names) at ``offset``; padding is zeroed."""
        if not isinstance(value, Mapping):
            raise MarshalError(f"{what} must be a mapping of {self.name} members")
        unknown = set(value) - {m.name for m in self.members}
        if unknown:
            raise MarshalError(f"{what}: {self.name} has no member {sorted(unknown)[0]!r}")
        buffer[offset : offset + self.size] = bytes(self.size)
        for member in self.members:
            if member.name not in value:
                continue  # left zero
            item = value[member.name]
            where = f"{what}.{member.name}"
            start = offset + member.offset
            if member.count is None:
                member.type.pack_into(buffer, start, item, where)
            elif member.type.is_text:
                data = text_bytes(item, where)
                if len(data) >= member.count:
                    raise MarshalError(f"{where} is {len(data)} bytes; at most {member.count - 1}")
                buffer[start : start + len(data)] = data
            else:
                items = as_list(item, where)
                if len(items) > member.count:
                    raise MarshalError(f"{where} has {len(items)} items; at most {member.count}")
                for index, element in enumerate(items):
                    member.type.pack_into(
                        buffer, start + index * member.type.size, element, f"{where}[{index}]"
                    )

    def unpack_from(self, buffer: bytes | memoryview, offset: int) -> Values:
        values: dict[str, Value] = {}
        for member in self.members:
            start = offset + member.offset
            if member.count is None:
                values[member.name] = member.type.unpack_from(buffer, start)
            elif member.type.is_text:
                raw = bytes(buffer[start : start + member.count])
                values[member.name] = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
            else:
                values[member.name] = [
                    member.type.unpack_from(buffer, start + i * member.type.size)
                    for i in range(member.count)
                ]
        return Values(values)


Element: TypeAlias = Primitive | StructType


@dataclasses.dataclass(frozen=True)
class SequenceType:
    element: Element

    @property
    def name(self) -> str:
        return f"sequence<{self.element.name}>"


@dataclasses.dataclass(frozen=True)
class StringType:
    name: str = "string"


@dataclasses.dataclass(frozen=True)
class NestedSequenceType:
    """``sequence<sequence<T>>``: one buffer per item, so the number of buffers is known
    only at run time. Declared so that the methods after it keep their indices; a
    method with one is outside the marshalling here (:class:`MarshalError`)."""

    inner: SequenceType

    @property
    def name(self) -> str:
        return f"sequence<{self.inner.name}>"


@dataclasses.dataclass(frozen=True)
class HandleType:
    """``remote_handle64``: travels in a handle slot (the implicit open and close only)."""

    name: str = DOMAIN_BASE


ParamType: TypeAlias = (
    Primitive | StructType | SequenceType | StringType | NestedSequenceType | HandleType
)
Direction = Literal["in", "rout"]


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    direction: Direction
    type: ParamType

    @property
    def is_buffer(self) -> bool:
        """A sequence or string: a buffer of its own plus a count in primIn."""
        return isinstance(self.type, SequenceType | StringType)

    @property
    def element_size(self) -> int:
        if isinstance(self.type, SequenceType):
            return self.type.element.size
        return 1


# --------------------------------------------------------------- values


@runtime_checkable
class BufferRef(Protocol):
    """A buffer the caller passes through untouched (e.g. a DMA-BUF slice); it has a length."""

    @property
    def length(self) -> int: ...


def is_buffer_ref(value: object) -> TypeGuard[BufferRef]:
    """isinstance(value, BufferRef), without a runtime Protocol check's cost on the call path."""
    return not isinstance(value, bytes | bytearray | memoryview | int | str | list | tuple) and (
        isinstance(getattr(value, "length", None), int)
    )


Value: TypeAlias = (
    "int | float | str | bytes | memoryview | BufferRef | Values | list[Value] | None"
)


class Values(Mapping[str, "Value"]):
    """Unpacked arguments by parameter (or member) name, with typed accessors."""

    def __init__(self, values: Mapping[str, Value]) -> None:
        self._values = dict(values)

    def __getitem__(self, name: str) -> Value:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Values({self._values!r})"

    def integer(self, name: str) -> int:
        value = self._values[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} is not an integer: {value!r}")
        return value

    def integers(self, name: str) -> list[int]:
        value = self._values[name]
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise TypeError(f"{name} is not a list of integers")
        return [int(v) for v in value if isinstance(v, int)]

    def text(self, name: str) -> str:
        value = self._values[name]
        if not isinstance(value, str):
            raise TypeError(f"{name} is not text: {value!r}")
        return value

    def texts(self, name: str) -> list[str]:
        """A rout sequence of char sequences, decoded: one text per item."""
        value = self._values[name]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"{name} is not a list of texts")
        return [v for v in value if isinstance(v, str)]

    def data(self, name: str) -> bytes:
        value = self._values[name]
        if not isinstance(value, bytes):
            raise TypeError(f"{name} is not inline bytes")
        return value

    def view(self, name: str) -> memoryview:
        value = self._values[name]
        if not isinstance(value, memoryview):
            raise TypeError(f"{name} is not a buffer view")
        return value

    def records(self, name: str) -> list[Values]:
        value = self._values[name]
        if not isinstance(value, list) or not all(isinstance(v, Values) for v in value):
            raise TypeError(f"{name} is not a list of records")
        return [v for v in value if isinstance(v, Values)]


def text_bytes(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise MarshalError(f"{what} must be text, not {type(value).__name__}")
    data = value.encode("utf-8")
    if b"\0" in data:
        raise MarshalError(f"{what} contains a NUL byte")
    return data


def as_list(value: object, what: str) -> list[object]:
    if isinstance(value, str | bytes | bytearray | memoryview) or not isinstance(value, Sequence):
        raise MarshalError(f"{what} must be a list, not {type(value).__name__}")
    return list(value)
