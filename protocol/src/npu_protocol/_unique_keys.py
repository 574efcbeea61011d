"""The one rule msgspec does not enforce: no map in a payload has a key twice.

msgspec decodes a map with a repeated key by letting the last value win, so a
peer could show a check one value and the code another. PROTOCOL.md section 4
makes a repeated key fatal (``BAD_MESSAGE``) at every depth, including maps
under keys the receiver ignores.

:func:`repeated_key` walks a payload that msgspec has already decoded without
error (so every length in it is known to be in bounds) and returns the first
repeated key it finds. Two keys are the same when they decode to the same
value: ``"id"`` as a fixstr and as a str8 are one key.

The walk runs in Python, one step per item: a frame of a million one-byte
integers would cost a worker a sixth of a second under the GIL, and every other
client with it. So the receiver bounds it: a payload of more than
``MAX_REQUEST_ITEMS`` items (a request needs a few thousand at most) is refused
before it is walked further (:class:`TooManyItemsError`), which keeps any walk
to a few milliseconds.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec

_U16: Final = struct.Struct(">H").unpack_from
_U32: Final = struct.Struct(">I").unpack_from

# Items of a fixed size after their first byte (nil, bool, numbers, fixext).
_FIXED: Final[dict[int, int]] = {
    0xC0: 1,
    0xC2: 1,
    0xC3: 1,
    0xCA: 5,
    0xCB: 9,
    0xCC: 2,
    0xCD: 3,
    0xCE: 5,
    0xCF: 9,
    0xD0: 2,
    0xD1: 3,
    0xD2: 5,
    0xD3: 9,
    0xD4: 3,
    0xD5: 4,
    0xD6: 6,
    0xD7: 10,
    0xD8: 18,
}
# Items whose length follows the first byte: (bytes of length, bytes before the data).
_SIZED: Final[dict[int, tuple[int, int]]] = {
    0xC4: (1, 2),  # bin8
    0xD9: (1, 2),  # str8
    0xC5: (2, 3),  # bin16
    0xDA: (2, 3),  # str16
    0xC6: (4, 5),  # bin32
    0xDB: (4, 5),  # str32
    0xC7: (1, 3),  # ext8 (length, type byte)
    0xC8: (2, 4),  # ext16
    0xC9: (4, 6),  # ext32
}


class _RepeatedKeyError(Exception):
    def __init__(self, key: object) -> None:
        self.key = key


class TooManyItemsError(ValueError):
    """The payload holds more items than the walk was allowed."""


FAST_PATH_LIMIT: Final = 4096
"""Payloads up to this size are first checked by a round trip through msgspec."""
_FLOAT_MARKERS: Final = (b"\xca", b"\xcb")


def repeated_key(payload: bytes, max_items: int | None = None) -> object | None:
    """The first key that appears twice in one map of ``payload``, or None.
    TooManyItemsError when the payload holds more than ``max_items`` items."""
    if len(payload) <= FAST_PATH_LIMIT and _canonical_without_repeats(payload):
        return None
    walk = _Walk(payload, len(payload) if max_items is None else max_items)
    try:
        walk.skip(0)
    except _RepeatedKeyError as found:
        return found.key
    return None


def _canonical_without_repeats(payload: bytes) -> bool:
    """True when decoding ``payload`` and encoding it again gives as many bytes.

    msgspec encodes every value in its shortest form, so a round trip never
    grows, except for floats (always re-encoded as float64); and a repeated key
    is lost in the round trip, which shrinks it. Without float markers in the
    payload, an equal length therefore proves that no key repeats; anything
    else (a shorter round trip, a possible float, an undecodable key) is left
    to the walk, which is exact. The round trip runs in C: for the small
    payloads of ordinary requests it is several times cheaper than the walk.
    """
    if _FLOAT_MARKERS[0] in payload or _FLOAT_MARKERS[1] in payload:
        return False
    try:
        return len(_ENCODE(_DECODE(payload))) == len(payload)
    except (msgspec.DecodeError, TypeError, ValueError):
        return False


_DECODE: Final = msgspec.msgpack.Decoder().decode
_ENCODE: Final = msgspec.msgpack.Encoder().encode


class _Walk:
    """One walk of a payload, counting the items it steps over."""

    def __init__(self, data: bytes, max_items: int) -> None:
        self.data = data
        self.left = max_items
        self.max_items = max_items

    def skip(self, at: int) -> int:
        """The offset just past the item that starts at ``at``."""
        self.left -= 1
        if self.left < 0:
            raise TooManyItemsError(f"more than {self.max_items} msgpack items in one payload")
        data = self.data
        head = data[at]
        if head <= 0x7F or head >= 0xE0:  # positive and negative fixint
            return at + 1
        if head >= 0xA0 and head <= 0xBF:  # fixstr
            return at + 1 + (head & 0x1F)
        if head <= 0x8F:  # fixmap
            return self.skip_map(at + 1, head & 0x0F)
        if head <= 0x9F:  # fixarray
            return self.skip_items(at + 1, head & 0x0F)
        fixed = _FIXED.get(head)
        if fixed is not None:
            return at + fixed
        sized = _SIZED.get(head)
        if sized is not None:
            width, before = sized
            length = data[at + 1] if width == 1 else (_U16 if width == 2 else _U32)(data, at + 1)[0]
            return at + before + length
        if head == 0xDC:
            return self.skip_items(at + 3, _U16(data, at + 1)[0])
        if head == 0xDD:
            return self.skip_items(at + 5, _U32(data, at + 1)[0])
        if head == 0xDE:
            return self.skip_map(at + 3, _U16(data, at + 1)[0])
        if head == 0xDF:
            return self.skip_map(at + 5, _U32(data, at + 1)[0])
        raise ValueError(f"0x{head:02X} is not a msgpack type")  # 0xC1: msgspec refused it first

    def skip_items(self, at: int, count: int) -> int:
        for _ in range(count):
            at = self.skip(at)
        return at

    def skip_map(self, at: int, count: int) -> int:
        seen: set[object] = set()
        for _ in range(count):
            end = self.skip(at)
            key = _key_identity(self.data, at, end)
            if key in seen:
                raise _RepeatedKeyError(key)
            seen.add(key)
            at = self.skip(end)
        return at


def _key_identity(data: bytes, start: int, end: int) -> object:
    """What a key decodes to, for comparison: strings by their text bytes,
    integers by value, anything else by its encoding."""
    head = data[start]
    if 0xA0 <= head <= 0xBF or head in (0xD9, 0xDA, 0xDB):
        offset = 1 if head <= 0xBF else {0xD9: 2, 0xDA: 3, 0xDB: 5}[head]
        return data[start + offset : end].decode("utf-8", "replace")
    if head <= 0x7F:
        return head
    if head >= 0xE0:
        return head - 0x100
    if head in (0xCC, 0xCD, 0xCE, 0xCF):
        return int.from_bytes(data[start + 1 : end], "big")
    if head in (0xD0, 0xD1, 0xD2, 0xD3):
        return int.from_bytes(data[start + 1 : end], "big", signed=True)
    return data[start:end]
