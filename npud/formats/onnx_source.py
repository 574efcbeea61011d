"""Where an ONNX walk reads from, and what stops it: a model's bytes as a
:class:`Source` (:class:`FdSource` through a descriptor with ``pread`` in windows,
never ``mmap``: a client could truncate the file underneath and fault the reader;
:class:`BytesSource` in memory; :class:`Window` a part of another), the
:class:`Budget` of its time, and its errors."""

from __future__ import annotations

import os
import time
from typing import Final, Protocol

WINDOW: Final = 64 * 1024
CHECK_EVERY: Final = 4096
"""Fields between two looks at a budget's clock."""


class DamagedError(ValueError):
    """The bytes are not a well-formed protobuf message (the text says where)."""


class LimitError(ValueError):
    """The walk went past one of npud's bounds (time, or what it would keep); the model
    may be intact. The text says which bound."""


class CheckTimeoutError(LimitError):
    """The walk's :class:`Budget` ran out."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"checking it took longer than {seconds:g} s")
        self.seconds = seconds


class Budget:
    """The time one model's walks may take together: they raise CheckTimeoutError once
    ``seconds`` have passed since the budget was made (None: no bound). Looked at every
    :data:`CHECK_EVERY` fields, so a walk overruns by at most that many fields."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._deadline = None if seconds is None else time.monotonic() + seconds

    def check(self) -> None:
        if self._deadline is not None and time.monotonic() > self._deadline:
            assert self.seconds is not None
            raise CheckTimeoutError(self.seconds)


class Source(Protocol):
    """Random access to a model's bytes."""

    @property
    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at the end)."""
        ...


class BytesSource:
    """A model already in memory."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._data = memoryview(data).cast("B")

    @property
    def size(self) -> int:
        return len(self._data)

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self._data[offset : offset + length])


class Window:
    """``length`` bytes of another source from ``offset`` on, as a source of their own
    (one member of a graph pack, npud.formats.graph_pack)."""

    def __init__(self, source: Source, offset: int, length: int) -> None:
        self._source = source
        self._offset = offset
        self._size = length

    @property
    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self._size - offset))
        return self._source.read(self._offset + offset, length)


class FdSource:
    """A file read through ``fd`` (borrowed: the caller owns and closes it) in windows."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._size = size
        self._start = 0
        self._window = b""

    @property
    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        end = offset + length
        if not (self._start <= offset and end <= self._start + len(self._window)):
            if length > WINDOW:
                return os.pread(self._fd, length, offset)
            self._start, self._window = offset, os.pread(self._fd, WINDOW, offset)
        return self._window[offset - self._start : end - self._start]
