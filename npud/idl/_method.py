"""One method's marshalling, both directions (see npud.idl)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Final, Literal

from npud.idl._types import (
    U32,
    BufferRef,
    Element,
    HandleType,
    IdlError,
    MarshalError,
    NestedSequenceType,
    Param,
    Primitive,
    SequenceType,
    StringType,
    StructType,
    Value,
    Values,
    as_list,
    is_buffer_ref,
    text_bytes,
)

DOMAIN_FIRST_METHOD: Final = 2
ESCAPE_METHOD: Final = 31
MAX_INBUFS: Final = 0xFF
MAX_OUTBUFS: Final = 0xFF

SlotKind = Literal["value", "count", "method"]
"""A primIn/primROut item: a scalar's value, a sequence's count, or the escaped method index."""


@dataclasses.dataclass(frozen=True)
class Slot:
    """One item of primIn or primROut."""

    param: str
    kind: SlotKind
    type: Primitive | StructType
    offset: int


@dataclasses.dataclass(frozen=True)
class PrimLayout:
    slots: tuple[Slot, ...]
    size: int

    @staticmethod
    def build(
        items: Sequence[tuple[str, Literal["value", "count", "method"], Element]],
    ) -> PrimLayout:
        offset, align, slots = 0, 1, []
        for param, kind, item_type in items:
            offset += -offset % item_type.align
            slots.append(Slot(param, kind, item_type, offset))
            offset += item_type.size
            align = max(align, item_type.align)
        return PrimLayout(tuple(slots), offset + (-offset % align) if slots else 0)

    def __bool__(self) -> bool:
        return bool(self.slots)


@dataclasses.dataclass(frozen=True)
class EncodedCall:
    """What a stub sends: the scalars word and the buffers, in qaic order.

    ``inputs`` holds bytes the stub built (primIn, strings, sequences given
    as values) or the caller's :class:`BufferRef`; ``outputs`` holds inline
    capacities in bytes (primROut, sequences given as a count) or the
    caller's :class:`BufferRef`.
    """

    sc: int
    inputs: tuple[bytes | BufferRef, ...]
    outputs: tuple[int | BufferRef, ...]


SCALARS_FIELDS: Final = (
    ("attr", 29, 0x7),
    ("method", 24, 0x1F),
    ("nin", 16, 0xFF),
    ("nout", 8, 0xFF),
    ("hin", 4, 0xF),
    ("hout", 0, 0xF),
)
"""The scalars word's fields: name (as in the kernel's FASTRPC_BUILD_SCALARS), shift, mask."""


def make_scalars(
    method: int,
    inbufs: int,
    outbufs: int,
    inhandles: int = 0,
    outhandles: int = 0,
    *,
    attr: int = 0,
) -> int:
    """REMOTE_SCALARS_MAKEX (reference section 4): the one place npud builds the word
    (npud.fastrpc.kernel.abi and npud.sim.layout call it; npu_protocol keeps a checked copy).
    Every field is range-checked instead of silently masked: ValueError."""
    sc = 0
    values = (attr, method, inbufs, outbufs, inhandles, outhandles)
    for (name, shift, mask), value in zip(SCALARS_FIELDS, values, strict=True):
        if not 0 <= value <= mask:
            raise ValueError(f"scalars field {name}={value} is outside 0..{mask}")
        sc |= value << shift
    return sc


# --------------------------------------------------------------- methods


@dataclasses.dataclass(frozen=True)
class Method:
    """One method of an interface, with everything qaic derives from it."""

    name: str
    index: int
    params: tuple[Param, ...]
    prim_in: PrimLayout
    prim_rout: PrimLayout
    runtime_counted: str = ""
    """An ``in`` sequence of sequences, or "". Such a method is declared for its index
    only: marshalling it is a MarshalError."""
    items_param: Param | None = None
    """A ``rout`` sequence of sequences (at most one, after every other sequence and
    string): its count in primIn, one extra input buffer with each item's capacity (a
    u32 each), and one output buffer per item after all the others. The scalars word
    then depends on the number of items (:meth:`sc_for`)."""

    @staticmethod
    def build(name: str, index: int, params: Sequence[Param]) -> Method:
        in_items: list[tuple[str, SlotKind, Element]] = []
        if index >= ESCAPE_METHOD:
            in_items.append(("", "method", U32))
        rout_items: list[tuple[str, SlotKind, Element]] = []
        nested = [p for p in params if isinstance(p.type, NestedSequenceType)]
        if any(p.direction == "in" for p in nested):
            empty = PrimLayout((), 0)
            first = next(p.name for p in nested if p.direction == "in")
            return Method(name, index, tuple(params), empty, empty, first)
        if len(nested) > 1:
            raise IdlError(f"{name}: at most one rout sequence of sequences")
        items = nested[0] if nested else None
        if items is not None and any(p.is_buffer for p in params[params.index(items) :]):
            raise IdlError(f"{name}: {items.name} must come after every sequence and string")
        for param in params:
            if isinstance(param.type, HandleType):
                continue
            if param.is_buffer or param is items:
                in_items.append((param.name, "count", U32))
            elif param.direction == "in":
                assert isinstance(param.type, Primitive | StructType)
                in_items.append((param.name, "value", param.type))
            else:
                assert isinstance(param.type, Primitive | StructType)
                rout_items.append((param.name, "value", param.type))
        method = Method(
            name,
            index,
            tuple(params),
            PrimLayout.build(in_items),
            PrimLayout.build(rout_items),
            items_param=items,
        )
        if method.inbufs > MAX_INBUFS or method.outbufs > MAX_OUTBUFS:
            raise IdlError(f"{name}: too many buffers for one scalars word")
        return method

    # -- derived shape ----------------------------------------------------
    @functools.cached_property
    def in_buffers(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_buffer and p.direction == "in")

    @functools.cached_property
    def rout_buffers(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_buffer and p.direction == "rout")

    @functools.cached_property
    def inbufs(self) -> int:
        return int(bool(self.prim_in)) + len(self.in_buffers) + int(self.items_param is not None)

    @functools.cached_property
    def outbufs(self) -> int:
        """Output buffers, without the items of a rout sequence of sequences."""
        return int(bool(self.prim_rout)) + len(self.rout_buffers)

    @functools.cached_property
    def _items_element(self) -> Element:
        assert self.items_param is not None
        assert isinstance(self.items_param.type, NestedSequenceType)
        return self.items_param.type.inner.element

    @functools.cached_property
    def inhandles(self) -> int:
        return sum(isinstance(p.type, HandleType) and p.direction == "in" for p in self.params)

    @functools.cached_property
    def outhandles(self) -> int:
        return sum(isinstance(p.type, HandleType) and p.direction == "rout" for p in self.params)

    def _require_static(self) -> None:
        if self.runtime_counted:
            raise MarshalError(
                f"{self.name}: {self.runtime_counted} is a sequence of sequences, counted"
                " at run time; outside this marshalling"
            )

    @functools.cached_property
    def sc(self) -> int:
        """The scalars word (method 31 carries the real index in primIn); MarshalError
        for a method whose word depends on its items (:meth:`sc_for`)."""
        if self.items_param is not None:
            raise MarshalError(
                f"{self.name}: the scalars word depends on how many {self.items_param.name}"
                " are asked for"
            )
        return self.sc_for(0)

    def sc_for(self, items: int) -> int:
        """The scalars word of a call with ``items`` items of its rout sequence of sequences
        (0 for a method without one)."""
        self._require_static()
        if items and self.items_param is None:
            raise MarshalError(f"{self.name} has no rout sequence of sequences")
        number = min(self.index, ESCAPE_METHOD)
        outbufs = self.outbufs + items
        if outbufs > MAX_OUTBUFS:
            raise MarshalError(f"{self.name}: {items} items do not fit in one scalars word")
        return make_scalars(number, self.inbufs, outbufs, self.inhandles, self.outhandles)

    def param(self, name: str) -> Param:
        for param in self.params:
            if param.name == name:
                return param
        raise KeyError(f"{self.name} has no parameter {name!r}")

    # -- the stub side ----------------------------------------------------
    @functools.cached_property
    def _argument_names(self) -> frozenset[str]:
        return frozenset(
            p.name
            for p in self.params
            if p.direction == "in" or p.is_buffer or p is self.items_param
        )

    def encode(self, **arguments: object) -> EncodedCall:
        """Marshal a call. Give every ``in`` parameter its value and every ``rout``
        sequence either its capacity in elements or a :class:`BufferRef`.

        ``in`` sequences take bytes-like data (a whole number of elements), a list
        of element values, or a :class:`BufferRef`; strings take ``str``.
        """
        self._require_static()
        if self.inhandles or self.outhandles:
            raise MarshalError(f"{self.name} passes handles: remotectl runs it, not a stub")
        wanted = self._argument_names
        if arguments.keys() != wanted:
            missing = wanted - arguments.keys()
            extra = arguments.keys() - wanted
            problem = f"missing {sorted(missing)}" if missing else f"unexpected {sorted(extra)}"
            raise MarshalError(f"{self.name}: {problem}")
        counts: dict[str, int] = {}
        in_buffers: list[bytes | BufferRef] = []
        for param in self.in_buffers:
            buffer, counts[param.name] = _encode_in_buffer(param, arguments[param.name])
            in_buffers.append(buffer)
        out_buffers: list[int | BufferRef] = []
        for param in self.rout_buffers:
            size, counts[param.name] = _encode_rout_buffer(param, arguments[param.name])
            out_buffers.append(size)
        items: list[int] = []
        if self.items_param is not None:
            items = _item_capacities(self.items_param.name, arguments[self.items_param.name])
            counts[self.items_param.name] = len(items)
            lengths = bytearray(U32.size * len(items))
            for position, capacity in enumerate(items):
                U32.pack_into(lengths, position * U32.size, capacity, self.items_param.name)
            in_buffers.append(bytes(lengths))
            out_buffers.extend(capacity * self._items_element.size for capacity in items)
        inputs: list[bytes | BufferRef] = []
        if self.prim_in:
            prim = bytearray(self.prim_in.size)
            for slot in self.prim_in.slots:
                if slot.kind == "method":
                    value: object = self.index
                elif slot.kind == "count":
                    value = counts[slot.param]
                else:
                    value = arguments[slot.param]
                slot.type.pack_into(prim, slot.offset, value, f"{self.name}.{slot.param}")
            inputs.append(bytes(prim))
        outputs: list[int | BufferRef] = [self.prim_rout.size] if self.prim_rout else []
        sc = self.sc_for(len(items))
        return EncodedCall(sc, (*inputs, *in_buffers), (*outputs, *out_buffers))

    def decode(self, outputs: Sequence[bytes | None]) -> Values:
        """The rout values of a successful call, from the output buffers in order
        (None where the caller passed a :class:`BufferRef`: that parameter is None)."""
        self._require_static()
        items = len(outputs) - self.outbufs
        if items < 0 or (items and self.items_param is None):
            raise MarshalError(f"{self.name} has {self.outbufs} output buffers, got {len(outputs)}")
        values: dict[str, Value] = {}
        rest = list(outputs)
        if self.prim_rout:
            prim = rest.pop(0)
            if prim is None or len(prim) != self.prim_rout.size:
                raise MarshalError(f"{self.name}: primROut must be {self.prim_rout.size} bytes")
            for slot in self.prim_rout.slots:
                values[slot.param] = slot.type.unpack_from(prim, slot.offset)
        for param, data in zip(self.rout_buffers, rest[: len(self.rout_buffers)], strict=True):
            values[param.name] = None if data is None else _decode_sequence(param, data)
        if self.items_param is not None:
            decoded: list[Value] = []
            for data in rest[len(self.rout_buffers) :]:
                if data is None:
                    raise MarshalError(
                        f"{self.name}: an item of {self.items_param.name} has no data"
                    )
                decoded.append(_decode_items(self._items_element, data))
            values[self.items_param.name] = decoded
        return Values(values)

    # -- the skel side ----------------------------------------------------
    def unpack(self, inputs: Sequence[memoryview], outputs: Sequence[memoryview]) -> Values:
        """Check the buffers a skel received and unpack them.

        ``in`` scalars and structs come back as values, strings as ``str``, ``in``
        sequences and ``rout`` sequences as the memoryviews themselves (their
        lengths checked against the counts in primIn). MarshalError on any mismatch.
        """
        self._require_static()
        if len(inputs) != self.inbufs or (
            self.items_param is None and len(outputs) != self.outbufs
        ):
            raise MarshalError(
                f"{self.name} takes {self.inbufs} in / {self.outbufs} out buffers,"
                f" got {len(inputs)} / {len(outputs)}"
            )
        values: dict[str, Value] = {}
        counts: dict[str, int] = {}
        ins, outs = list(inputs), list(outputs)
        capacities = ins.pop() if self.items_param is not None else None
        if self.prim_in:
            prim = ins.pop(0)
            if len(prim) != self.prim_in.size:
                raise MarshalError(
                    f"{self.name}: primIn has {len(prim)} bytes, expected {self.prim_in.size}"
                )
            for slot in self.prim_in.slots:
                item = slot.type.unpack_from(prim, slot.offset)
                if slot.kind == "count":
                    assert isinstance(item, int)
                    counts[slot.param] = item
                elif slot.kind == "value":
                    values[slot.param] = item
        if self.prim_rout:
            prim_out = outs.pop(0)
            if len(prim_out) != self.prim_rout.size:
                raise MarshalError(
                    f"{self.name}: primROut has {len(prim_out)} bytes, expected"
                    f" {self.prim_rout.size}"
                )
        for param, view in zip(self.in_buffers, ins, strict=True):
            values[param.name] = _unpack_in_buffer(param, view, counts[param.name])
        if self.items_param is not None:
            assert capacities is not None
            name = self.items_param.name
            item_views = outs[len(self.rout_buffers) :]
            outs = outs[: len(self.rout_buffers)]
            values[name] = self._unpack_items(counts[name], capacities, item_views)
        for param, view in zip(self.rout_buffers, outs, strict=True):
            expected = counts[param.name] * param.element_size
            if len(view) != expected:
                raise MarshalError(
                    f"{self.name}.{param.name}: primIn announces {expected} bytes,"
                    f" the buffer has {len(view)}"
                )
            values[param.name] = view
        return Values(values)

    def _unpack_items(
        self, count: int, capacities: memoryview, views: Sequence[memoryview]
    ) -> list[Value]:
        """The item buffers of the rout sequence of sequences, checked against the count
        in primIn and the capacities in their input buffer."""
        name = f"{self.name}.{self.items_param.name if self.items_param else ''}"
        if len(capacities) != count * U32.size:
            raise MarshalError(
                f"{name}: primIn announces {count} items, their capacities take"
                f" {len(capacities)} bytes"
            )
        if len(views) != count:
            raise MarshalError(f"{name}: primIn announces {count} items, got {len(views)} buffers")
        element = self._items_element
        items: list[Value] = []
        for index, view in enumerate(views):
            expected = int(U32.unpack_from(capacities, index * U32.size)) * element.size
            if len(view) != expected:
                raise MarshalError(
                    f"{name}[{index}]: its capacity is {expected} bytes, the buffer has {len(view)}"
                )
            items.append(view)
        return items

    def prim_in_values(self, prim: bytes | memoryview) -> Values:
        """The ``in`` scalars of a primIn buffer, for a skel that checks the other buffers
        itself (a sequence's count is not among them). MarshalError when it is too short."""
        self._require_static()
        if len(prim) < self.prim_in.size:
            raise MarshalError(
                f"{self.name}: primIn has {len(prim)} bytes, expected {self.prim_in.size}"
            )
        return Values(
            {
                slot.param: slot.type.unpack_from(prim, slot.offset)
                for slot in self.prim_in.slots
                if slot.kind == "value"
            }
        )

    def pack_prim_rout(self, values: Mapping[str, object]) -> bytes:
        """primROut with every rout scalar of ``values`` (all must be given)."""
        self._require_static()
        prim = bytearray(self.prim_rout.size)
        for slot in self.prim_rout.slots:
            if slot.param not in values:
                raise MarshalError(f"{self.name}: rout {slot.param} has no value")
            slot.type.pack_into(prim, slot.offset, values[slot.param], slot.param)
        return bytes(prim)

    def pack_routs(self, outputs: Sequence[memoryview], values: Mapping[str, object]) -> None:
        """Write rout values into a skel's output buffers.

        Every rout scalar must be given (primROut is written whole); a rout
        sequence may be given as a list of element values, which fills the
        buffer from the start and zeroes the rest. Call it only on success:
        rout values reach the caller only when the method returns 0.
        """
        self._require_static()
        outs = list(outputs)
        if self.prim_rout:
            prim = outs.pop(0)
            if len(prim) != self.prim_rout.size:
                raise MarshalError(f"{self.name}: primROut must be {self.prim_rout.size} bytes")
            prim[:] = self.pack_prim_rout(values)
        for param, view in zip(self.rout_buffers, outs[: len(self.rout_buffers)], strict=True):
            if param.name in values:
                _fill_sequence(param, view, values[param.name])
        item_views = outs[len(self.rout_buffers) :]
        if self.items_param is None:
            if item_views:
                raise MarshalError(f"{self.name} has {self.outbufs} output buffers")
            return
        if self.items_param.name in values:
            items = as_list(values[self.items_param.name], self.items_param.name)
            if len(items) > len(item_views):
                raise MarshalError(
                    f"{self.items_param.name}: {len(items)} items, {len(item_views)} buffers"
                )
            for index, (view, item) in enumerate(zip(item_views, items, strict=False)):
                _fill_item(self._items_element, view, item, f"{self.items_param.name}[{index}]")


def _element(param: Param) -> Element:
    assert isinstance(param.type, SequenceType)
    return param.type.element


def _encode_in_buffer(param: Param, value: object) -> tuple[bytes | BufferRef, int]:
    what = param.name
    if isinstance(param.type, StringType):
        data = text_bytes(value, what) + b"\0"
        return data, len(data)
    element = _element(param)
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        if len(data) % element.size:
            raise MarshalError(f"{what}: {len(data)} bytes is not a whole number of {element.name}")
        return data, len(data) // element.size
    if is_buffer_ref(value):
        if value.length % element.size:
            raise MarshalError(
                f"{what}: {value.length} bytes is not a whole number of {element.name}"
            )
        return value, value.length // element.size
    items = as_list(value, what)
    buffer = bytearray(element.size * len(items))
    for index, item in enumerate(items):
        element.pack_into(buffer, index * element.size, item, f"{what}[{index}]")
    return bytes(buffer), len(items)


def _encode_rout_buffer(param: Param, value: object) -> tuple[int | BufferRef, int]:
    element_size = param.element_size
    if is_buffer_ref(value):
        if value.length % element_size:
            raise MarshalError(f"{param.name}: {value.length} bytes is not a whole number of items")
        return value, value.length // element_size
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MarshalError(f"{param.name}: give a capacity (items, >= 0) or a buffer")
    U32.check(value, param.name)
    return value * element_size, value


def _decode_sequence(param: Param, data: bytes) -> Value:
    return _decode_items(_element(param), data)


def _decode_items(element: Element, data: bytes) -> Value:
    if isinstance(element, Primitive) and element.size == 1 and not element.is_text:
        return data
    if isinstance(element, Primitive) and element.is_text:
        return data.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    count = len(data) // element.size
    return [element.unpack_from(data, i * element.size) for i in range(count)]


def _item_capacities(name: str, value: object) -> list[int]:
    """A rout sequence of sequences given as each item's capacity, in elements."""
    capacities = as_list(value, name)
    for index, capacity in enumerate(capacities):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise MarshalError(f"{name}[{index}]: give a capacity (items, >= 0)")
        U32.check(capacity, f"{name}[{index}]")
    return [int(c) for c in capacities if isinstance(c, int)]


def _fill_item(element: Element, view: memoryview, value: object, what: str) -> None:
    """One item of a rout sequence of sequences: text (char, with its NUL), bytes, or a
    list of element values; the rest of the buffer is zeroed."""
    if isinstance(value, str) and isinstance(element, Primitive) and element.is_text:
        data = text_bytes(value, what) + b"\0"
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    else:
        items = as_list(value, what)
        buffer = bytearray(element.size * len(items))
        for index, item in enumerate(items):
            element.pack_into(buffer, index * element.size, item, f"{what}[{index}]")
        data = bytes(buffer)
    if len(data) > len(view):
        raise MarshalError(f"{what}: {len(data)} bytes do not fit in {len(view)}")
    view[:] = data.ljust(len(view), b"\0")


def _unpack_in_buffer(param: Param, view: memoryview, count: int) -> Value:
    expected = count * param.element_size
    if len(view) != expected:
        raise MarshalError(
            f"{param.name}: primIn announces {expected} bytes, the buffer has {len(view)}"
        )
    if isinstance(param.type, StringType):
        raw = bytes(view)
        if not raw or raw[-1] != 0 or b"\0" in raw[:-1]:
            raise MarshalError(f"{param.name}: not one NUL-terminated string")
        return raw[:-1].decode("utf-8", errors="replace")
    return view


def _fill_sequence(param: Param, view: memoryview, value: object) -> None:
    element = _element(param)
    items = as_list(value, param.name)
    capacity = len(view) // element.size
    if len(items) > capacity:
        raise MarshalError(f"{param.name}: {len(items)} items do not fit in {capacity}")
    data = bytearray(len(view))
    for index, item in enumerate(items):
        element.pack_into(data, index * element.size, item, f"{param.name}[{index}]")
    view[:] = data


# --------------------------------------------------------------- interfaces


@dataclasses.dataclass(frozen=True)
class Interface:
    name: str
    domain: bool
    """Derives from remote_handle64: user methods from 2, open/close at 0 and 1."""
    methods: tuple[Method, ...]

    def method(self, name: str) -> Method:
        for method in self.methods:
            if method.name == name:
                return method
        raise KeyError(f"interface {self.name} has no method {name!r}")

    def by_index(self, index: int) -> Method | None:
        for method in self.methods:
            if method.index == index:
                return method
        return None

    def called(self, number: int, prim_in: bytes | memoryview) -> Method | None:
        """The method a call names: ``number`` is the scalars word's method, and method 31
        carries the real index first in primIn. None for an index the interface lacks;
        MarshalError for a method 31 whose primIn cannot hold the index."""
        if number == ESCAPE_METHOD:
            if len(prim_in) < U32.size:
                raise MarshalError(f"{self.name}: method {number} without its index in primIn")
            index = U32.unpack_from(prim_in, 0)
            return self.by_index(int(index)) if int(index) >= ESCAPE_METHOD else None
        return self.by_index(number)

    @property
    def user_methods(self) -> tuple[Method, ...]:
        """The methods a stub invokes (without the implicit open and close)."""
        first = DOMAIN_FIRST_METHOD if self.domain else 0
        return tuple(m for m in self.methods if m.index >= first)


def implicit_methods() -> list[Method]:
    """What a remote_handle64 interface inherits: open (0) and close (1)."""
    handle = HandleType()
    return [
        Method.build("open", 0, [Param("uri", "in", StringType()), Param("h", "rout", handle)]),
        Method.build("close", 1, [Param("h", "in", handle)]),
    ]
