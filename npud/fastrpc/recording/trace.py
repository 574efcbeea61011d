"""Recording a FastRPC run: every Driver call, every session operation, every reverse call.

``TracingDriver`` wraps any Driver (the kernel's on a laptop, the emulator in
tests) and writes one JSON line per event to a :class:`TraceWriter`: the
format is specified in docs/trace-format.md (``npud-trace`` version 1). The
session reports its operations (alloc, invoke, remotectl open...) and the
reverse calls its listener served through the trace hooks
(:mod:`npud.fastrpc.kernel.trace_hooks`), which it finds on the driver
(``trace_hooks``); ``npud.fastrpc.recording.replay`` plays a trace back against a
FastRpcSession and reports the first divergence.

What a trace holds: request numbers and struct bytes in and out, decoded
fields with fds and pointers made stable across runs, return values, errnos,
thread names and times; the bytes of plain invoke buffers and of DMA-BUF
slices up to a limit (``capture_limit``, 1 MiB per buffer by default: longer
ones are kept as length + SHA-256); the bytes of every file the DSP read from
the library path and of every descriptor lent to it. A trace may therefore
hold model weights and skel binaries: treat it like them.

Thread-safety: one lock orders the event numbers and the writes; a record is
written when its event ends (so a trace cut short by a crash lacks the calls
still running, and has no ``end`` record).
"""

from __future__ import annotations

import itertools
import mmap
import os
import platform
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, Final

import msgspec

from npu_protocol import CodedError
from npud import __version__
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import Driver, FaultControl, IoctlArg
from npud.fastrpc.kernel.trace_hooks import (
    DEFAULT_CAPTURE_LIMIT,
    NULL_SCOPE,
    JsonValue,
    OpScope,
    Record,
    encode_data,
)
from npud.fastrpc.recording.trace_format import (
    OUTPUT_FIELDS,
    TRACE_FORMAT,
    TRACE_VERSION,
    Mappings,
    Symbols,
    describe_invoke_args,
    mapping_address,
    normalized_fields,
    request_name,
    struct_bytes,
)

LISTENER_SIDE: Final = "listener"

TRACE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_private(path: Path) -> IO[str]:
    """A new file at ``path`` that only its owner may read (0600): a trace holds the bytes
    of clients' buffers. Never an existing file, never through a symlink (O_EXCL, and
    O_NOFOLLOW for the last component): a daemon running as root must not be made to
    write over, or into, a file someone else put there. FileExistsError when it exists."""
    fd = os.open(path, TRACE_FLAGS, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8")


class TraceWriter:
    """The trace file, its event counter and its operations. Owns the file, which it
    creates (:func:`open_private`)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        backend: str,
        capture_limit: int = DEFAULT_CAPTURE_LIMIT,
    ) -> None:
        self.path = Path(path)
        self.capture_limit = capture_limit
        self._file: IO[str] | None = open_private(self.path)
        self._lock = threading.Lock()
        self._events = itertools.count(1)
        self._calls = itertools.count(1)
        self._ops = itertools.count(1)
        self._sessions = itertools.count(0)
        self._files: set[tuple[str, int]] = set()
        self._local = threading.local()
        self._started = time.monotonic()
        self._encoder = msgspec.json.Encoder()
        self.write(
            {
                "kind": "header",
                "format": TRACE_FORMAT,
                "version": TRACE_VERSION,
                "npud": __version__,
                "backend": backend,
                "kernel": "emulated" if backend == "emulator" else platform.release(),
                "machine": platform.machine(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "capture_limit": capture_limit,
            }
        )

    # -- counters and the file ---------------------------------------------------
    def event(self) -> int:
        with self._lock:
            return next(self._events)

    def call_number(self) -> int:
        with self._lock:
            return next(self._calls)

    def now(self) -> float:
        return round(time.monotonic() - self._started, 6)

    def write(self, record: Record) -> None:
        line = self._encoder.encode(record) + b"\n"
        with self._lock:
            if self._file is None:
                return  # closed: the daemon is stopping
            self._file.write(line.decode("utf-8"))
            self._file.flush()

    def close(self) -> None:
        """Write the ``end`` record and close the file; idempotent."""
        with self._lock:
            file, self._file = self._file, None
            if file is None:
                return
            end = {"kind": "end", "event": next(self._events), "t": self.now()}
            file.write(self._encoder.encode(end).decode("utf-8") + "\n")
            file.close()

    # -- who is calling --------------------------------------------------------------
    def side(self) -> tuple[str, int | None]:
        """The calling thread's side (``op:<id>`` or ``listener:<session>``) and op id."""
        op: int | None = getattr(self._local, "op", None)
        if op is not None:
            return f"op:{op}", op
        session: int | None = getattr(self._local, "listener", None)
        if session is not None:
            return f"{LISTENER_SIDE}:{session}", None
        return "none", None

    # -- TraceHooks ----------------------------------------------------------------
    def new_session(self) -> int:
        with self._lock:
            return next(self._sessions)

    def operation(self, name: str, session: int, /, **args: JsonValue) -> OpScope:
        if getattr(self._local, "op", None) is not None:
            return NULL_SCOPE  # an operation inside another one belongs to the outer
        return _RecordedOp(self, name, session, args)

    def listener_thread(self, session: int) -> None:
        self._local.listener = session

    def reverse_call(self, session: int, call: Mapping[str, JsonValue]) -> None:
        self.write(
            {
                "kind": "reverse",
                "session": session,
                "thread": threading.current_thread().name,
                "t": self.now(),
                **call,
            }
        )

    def file_served(self, session: int, name: str, data: bytes) -> None:
        key = (name, len(data))
        with self._lock:
            if key in self._files:
                return
            self._files.add(key)
        self.write({"kind": "file", "name": name, "data": encode_data(data, self.capture_limit)})

    def _enter_op(self, op: int) -> None:
        self._local.op = op

    def _leave_op(self) -> None:
        self._local.op = None


class _RecordedOp:
    def __init__(self, writer: TraceWriter, name: str, session: int, args: Record) -> None:
        self._writer = writer
        self._record: Record = {"kind": "op", "op": name, "session": session, "args": args}
        self._result: Record | None = None

    def result(self, **values: JsonValue) -> None:
        self._result = dict(values)

    def __enter__(self) -> _RecordedOp:
        writer = self._writer
        with writer._lock:
            op_id = next(writer._ops)
        self._record.update(
            id=op_id,
            thread=threading.current_thread().name,
            start=writer.event(),
            t=writer.now(),
        )
        writer._enter_op(op_id)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        writer = self._writer
        writer._leave_op()
        record = self._record
        record["end"] = writer.event()
        record["dur"] = round(writer.now() - record["t"], 6)
        if exc is not None:
            code = exc.code.name if isinstance(exc, CodedError) else type(exc).__name__
            record["error"] = {"code": code, "message": str(exc)}
        else:
            record["result"] = self._result or {}
        writer.write(record)


class TracingDriver:
    """A Driver that records every call of the Driver it wraps to ``writer``."""

    def __init__(self, inner: Driver, writer: TraceWriter) -> None:
        self.inner = inner
        self.writer = writer
        self.symbols = Symbols()
        self.mappings = Mappings()

    @property
    def trace_hooks(self) -> TraceWriter:
        return self.writer

    # -- the Driver protocol -----------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        with self._call("open", {"path": path, "flags": flags}) as record:
            fd = self.inner.open(path, flags)
            record["ret"] = self.symbols.assign("dev", fd)
            return fd

    def close(self, fd: int) -> None:
        symbol = self.symbols.name(fd)
        with self._call("close", {"fd": symbol}):
            try:
                self.inner.close(fd)
            finally:
                forgotten = self.symbols.forget(fd)
                if isinstance(forgotten, str):
                    self.mappings.forget(forgotten)

    def mmap(self, fd: int, length: int, offset: int = 0) -> mmap.mmap:
        symbol = self.symbols.name(fd)
        with self._call("mmap", {"fd": symbol, "length": length, "offset": offset}):
            mapping = self.inner.mmap(fd, length, offset)
            if isinstance(symbol, str):
                self.mappings.add(symbol, mapping_address(mapping), length)
            return mapping

    def shutdown(self) -> None:
        """Passed on, not recorded: no syscall (the emulator's own teardown)."""
        self.inner.shutdown()

    def suspends(self) -> int:
        """Passed on, not recorded: clock reads, not a call to the driver."""
        return self.inner.suspends()

    def fault_control(self) -> FaultControl | None:
        """Passed on, not recorded: a fault is the emulator's, not a call to the driver."""
        return self.inner.fault_control()

    def dsp_report(self) -> float | None:
        """Passed on, not recorded: what the DSP reported with the INVOKE just recorded."""
        return self.inner.dsp_report()

    def ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:
        raw_in = struct_bytes(arg)
        fields: Record = {
            "fd": self.symbols.name(fd),
            "request": request_name(request),
            "number": f"0x{request:08X}",
            "in": raw_in.hex(),
            "fields": normalized_fields(request, raw_in, self.symbols, self.mappings),
        }
        limit = self.writer.capture_limit
        if request == abi.FASTRPC_IOCTL_INVOKE:
            fields["args"] = describe_invoke_args(
                raw_in, self.symbols, self.mappings, limit, outputs=False
            )
        with self._call("ioctl", fields) as record:
            ret = self.inner.ioctl(fd, request, arg)
            raw_out = struct_bytes(arg)
            if isinstance(arg, abi.fastrpc_alloc_dma_buf | abi.dma_heap_allocation_data):
                self.symbols.assign("buf", _signed32(int(arg.fd)))
            record["ret"] = ret
            record["out"] = raw_out.hex()
            outputs = normalized_fields(request, raw_out, self.symbols, self.mappings)
            record["out_fields"] = {
                name: outputs[name] for name in OUTPUT_FIELDS.get(request, ()) if name in outputs
            }
            if request == abi.FASTRPC_IOCTL_INVOKE:
                record["outputs"] = [
                    entry.get("data")
                    for entry in describe_invoke_args(
                        raw_in, self.symbols, self.mappings, limit, outputs=True
                    )
                    if entry["dir"] == "out"
                ]
            return ret

    @contextmanager
    def _call(self, call: str, fields: Record) -> Iterator[Record]:
        writer = self.writer
        side, op = writer.side()
        record: Record = {
            "kind": "call",
            "n": writer.call_number(),
            "call": call,
            "side": side,
            "op": op,
            "thread": threading.current_thread().name,
            "start": writer.event(),
            "t": writer.now(),
            **fields,
        }
        try:
            yield record
        except OSError as exc:
            record["errno"] = exc.errno
            raise
        finally:
            record["end"] = writer.event()
            record["dur"] = round(writer.now() - record["t"], 6)
            record.setdefault("errno", None)
            writer.write(record)


def _signed32(value: int) -> int:
    """A u32 fd field (the heap's) as the fd it holds."""
    return value - (1 << 32) if value & 0x8000_0000 else value
