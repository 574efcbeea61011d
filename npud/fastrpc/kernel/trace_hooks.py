"""The trace hooks: what a session and the DMA-BUF code tell a trace about themselves.

A driver that traces (``npud.fastrpc.recording.trace.TracingDriver``) or replays
(``npud.fastrpc.recording.replay``) offers a :class:`TraceHooks` as its
``trace_hooks``; :func:`trace_hooks_of` finds it, and code that finds none traces
nothing. The hooks live here, beside the Driver seam they ride on, so that the
session and the buffers below ``recording/`` report to a trace without importing
the recorder (which replays sessions, and so stands above them).

A hook's values are JSON values; buffer bytes are handed over as
:func:`encode_data` records (docs/trace-format.md, "data").
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final, Protocol, runtime_checkable

from npud.fastrpc.kernel.driver import Driver

JsonValue = Any
Record = dict[str, JsonValue]

DEFAULT_CAPTURE_LIMIT: Final = 1 << 20
"""Bytes of one buffer recorded in full; longer ones are recorded as length + SHA-256."""


def encode_data(data: bytes, limit: int = DEFAULT_CAPTURE_LIMIT) -> Record:
    """``{"len", "b64"}`` (trailing zeros trimmed), or ``{"len", "sha256"}`` past ``limit``."""
    if len(data) > limit:
        return {"len": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {"len": len(data), "b64": base64.b64encode(data.rstrip(b"\0")).decode("ascii")}


class OpScope(Protocol):
    """One session operation, open while the session runs it."""

    def result(self, **values: JsonValue) -> None: ...

    def __enter__(self) -> OpScope: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class TraceHooks(Protocol):
    """What FastRpcSession tells a trace (recording or replaying) about itself."""

    def new_session(self) -> int: ...

    def operation(self, name: str, session: int, /, **args: JsonValue) -> OpScope: ...

    def listener_thread(self, session: int) -> None:
        """The calling thread is ``session``'s reverse-RPC listener."""
        ...

    def reverse_call(self, session: int, call: Mapping[str, JsonValue]) -> None: ...

    def file_served(self, session: int, name: str, data: bytes) -> None: ...

    @property
    def capture_limit(self) -> int: ...


class _NullScope:
    def result(self, **values: JsonValue) -> None:
        """Nothing is recorded."""

    def __enter__(self) -> _NullScope:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


NULL_SCOPE: Final = _NullScope()


def trace_hooks_of(driver: Driver) -> TraceHooks | None:
    """The hooks a driver offers for tracing (a TracingDriver, a replay), else None."""
    hooks = getattr(driver, "trace_hooks", None)
    return hooks if isinstance(hooks, TraceHooks) else None
