"""The replay's Driver: it answers each call the session makes from the trace and
checks the call against the recorded one (docs/trace-format.md, "Replay").

:class:`ReplayDriver` gives back what the device gave then (return values, errnos,
the fields the kernel wrote, the bytes the DSP wrote) and records the first
:class:`Divergence`. Its :class:`Sequencer` keeps every thread (the replayed
operations' and the session's own listener) to the recorded order of events.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import errno
import mmap
import os
import stat
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Final

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import FaultControl, IoctlArg
from npud.fastrpc.kernel.trace_hooks import (
    DEFAULT_CAPTURE_LIMIT,
    NULL_SCOPE,
    JsonValue,
    OpScope,
    Record,
)
from npud.fastrpc.recording.trace_file import Trace
from npud.fastrpc.recording.trace_format import (
    FD_FIELDS,
    OUTPUT_FIELDS,
    Mappings,
    Symbols,
    decode_data,
    describe_invoke_args,
    invoke_slots,
    mapping_address,
    normalized_fields,
    request_name,
    same_data,
    struct_bytes,
)

DEFAULT_TIMEOUT: Final = 10.0
"""Seconds a replay thread waits for its turn before the trace and the code are declared apart."""


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where the session first did something else than the trace recorded."""

    call: int | None
    """The recorded call number (``n``), or None when an operation's outcome differs."""
    op: int | None
    field: str
    expected: JsonValue
    actual: JsonValue
    where: str

    def __str__(self) -> str:
        if self.call is not None:
            at = f"call {self.call}"
        elif self.op is not None:
            at = f"op {self.op}"
        else:
            at = "replay"
        return (
            f"{at} ({self.where}): {self.field}: trace {_show(self.expected)}, "
            f"session {_show(self.actual)}"
        )


def _show(value: JsonValue) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0xFFFF:
        return f"0x{value:X}"
    return repr(value) if not isinstance(value, str) else value


class AbortedError(Exception):
    """The replay stopped (a divergence, or the end): unwind."""


class Sequencer:
    """The recorded order of events; each thread waits for its own events' turns."""

    def __init__(self, events: Sequence[int], owners: Mapping[int, str], timeout: float) -> None:
        self._events = sorted(events)
        self._owners = owners
        self._position = 0
        self._timeout = timeout
        self._cond = threading.Condition()
        self.aborted = False
        self.stuck_at: int | None = None

    def wait(self, event: int) -> None:
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self.aborted or self._current() == event, self._timeout
            )
            if self.aborted:
                raise AbortedError
            if not ok:
                self.stuck_at = self._current()
                self.aborted = True
                self._cond.notify_all()
                raise AbortedError
            self._position += 1
            self._cond.notify_all()

    def wait_until_stopped(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.aborted)
        raise AbortedError

    def abort(self) -> None:
        with self._cond:
            self.aborted = True
            self._cond.notify_all()

    def _current(self) -> int | None:
        return self._events[self._position] if self._position < len(self._events) else None

    @property
    def next_event(self) -> int | None:
        with self._cond:
            return self._current()

    def owner(self, event: int | None) -> str:
        return self._owners.get(event, "?") if event is not None else "?"


class _ReplayScope:
    def __init__(self, driver: ReplayDriver, op: Record) -> None:
        self._driver = driver
        self._op = op

    def result(self, **values: JsonValue) -> None:
        """The replayer compares results itself."""

    def __enter__(self) -> _ReplayScope:
        self._driver._local.side = f"op:{self._op['id']}"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._driver._local.side = None


class ReplayDriver:
    """A Driver that answers from a trace and checks every call against it."""

    def __init__(self, trace: Trace, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.trace = trace
        self.capture_limit = int(trace.header.get("capture_limit", DEFAULT_CAPTURE_LIMIT))
        self._sides: dict[str, collections.deque[Record]] = collections.defaultdict(
            collections.deque
        )
        events: list[int] = []
        owners: dict[int, str] = {}
        for call in trace.calls:
            self._sides[str(call["side"])].append(call)
            for key in ("start", "end"):
                events.append(int(call[key]))
                owners[int(call[key])] = f"call {call['n']} ({_what(call)})"
        for op in trace.ops:
            for key in ("start", "end"):
                events.append(int(op["start"]) if key == "start" else int(op["end"]))
            owners[int(op["start"])] = f"op {op['id']} ({op['op']}) start"
            owners[int(op["end"])] = f"op {op['id']} ({op['op']}) end"
        self.sequencer = Sequencer(events, owners, timeout)
        self.symbols = Symbols()
        self.mappings = Mappings()
        self.divergence: Divergence | None = None
        self.calls_replayed = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._sessions = 0
        self._aliases: dict[bytes, bytes] = {}  # recorded generated name -> this run's
        self._real_fds: set[int] = set()
        # DMA-BUF fd numbers of the recording, by symbol, while those fds were open: the
        # apps_std _fd calls carry them inside reverse-RPC payloads.
        self._recorded_numbers: dict[str, int] = {}
        self._requests: dict[str, bytes] = {}  # listener side -> the last request it got

    # -- what the session asks of a trace (TraceHooks) -----------------------------
    @property
    def trace_hooks(self) -> ReplayDriver:
        return self

    def new_session(self) -> int:
        with self._lock:
            number = self._sessions
            self._sessions += 1
            return number

    def operation(self, name: str, session: int, /, **args: JsonValue) -> OpScope:
        expected: Record | None = getattr(self._local, "expected_op", None)
        if expected is None or getattr(self._local, "side", None) is not None:
            return NULL_SCOPE  # inside another operation, or not one the replayer runs
        if name != expected["op"]:
            self.diverge(
                Divergence(None, int(expected["id"]), "op", expected["op"], name, "operation")
            )
        return _ReplayScope(self, expected)

    def listener_thread(self, session: int) -> None:
        self._local.side = f"listener:{session}"

    def reverse_call(self, session: int, call: Mapping[str, JsonValue]) -> None:
        """Reverse calls are checked through the listener's own calls."""

    def file_served(self, session: int, name: str, data: bytes) -> None:
        """Served from the trace's files."""

    def expect_op(self, op: Record | None) -> None:
        self._local.expected_op = op

    def alias(self, recorded: str, actual: str) -> None:
        """A name the daemon generated (an exposed file's) differs between runs."""
        if len(recorded) != len(actual):
            raise ValueError("generated names have a fixed length")
        with self._lock:
            self._aliases[recorded.encode()] = actual.encode()

    def to_actual(self, data: bytes) -> bytes:
        for recorded, actual in self._aliases.items():
            data = data.replace(recorded, actual)
        return data

    def to_recorded(self, data: bytes) -> bytes:
        for recorded, actual in self._aliases.items():
            data = data.replace(actual, recorded)
        return data

    # -- divergences -------------------------------------------------------------
    def diverge(self, divergence: Divergence) -> None:
        with self._lock:
            if self.divergence is None:
                self.divergence = divergence
        self.sequencer.abort()
        raise AbortedError

    def _check(self, call: Record, field: str, expected: JsonValue, actual: JsonValue) -> None:
        if expected != actual:
            self.diverge(
                Divergence(int(call["n"]), call.get("op"), field, expected, actual, _what(call))
            )

    # -- the Driver protocol -----------------------------------------------------
    # Each call checks what the session sent at its recorded start, and answers (returns,
    # raises the recorded errno, writes outputs) at its recorded end.
    def open(self, path: str, flags: int) -> int:
        with self._guard():
            call = self._begin("open")
            self._check(call, "path", call.get("path"), path)
            self._check(call, "flags", call.get("flags"), flags)
            self._end(call)
            self._raise_recorded(call)
            fd = os.eventfd(0, os.EFD_CLOEXEC)
            with self._lock:
                self._real_fds.add(fd)
            self._check(call, "ret", call.get("ret"), self.symbols.assign("dev", fd))
            return fd

    def close(self, fd: int) -> None:
        try:
            with self._guard():
                call = self._begin("close")
                self._check(call, "fd", call.get("fd"), self.symbols.name(fd))
                with self._lock:
                    self._recorded_numbers.pop(str(call.get("fd")), None)
                self._end(call)
        finally:
            symbol = self.symbols.forget(fd)
            if isinstance(symbol, str):
                self.mappings.forget(symbol)
            with self._lock:
                self._real_fds.discard(fd)
            os.close(fd)

    def mmap(self, fd: int, length: int, offset: int = 0) -> mmap.mmap:
        with self._guard():
            call = self._begin("mmap")
            symbol = self.symbols.name(fd)
            self._check(call, "fd", call.get("fd"), symbol)
            self._check(call, "length", call.get("length"), length)
            self._check(call, "offset", call.get("offset"), offset)
            self._end(call)
            self._raise_recorded(call)
            mapping = mmap.mmap(
                fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
            if isinstance(symbol, str):
                self.mappings.add(symbol, mapping_address(mapping), length)
            return mapping

    def shutdown(self) -> None:
        """Nothing to let go of: a replay holds no DSP."""

    def suspends(self) -> int:
        """A replay runs through no suspend (a trace does not record them)."""
        return 0

    def fault_control(self) -> FaultControl | None:
        """None: a replay answers what was recorded, nothing else."""
        return None

    def dsp_report(self) -> float | None:
        """None: a trace records the syscalls, and the report is none."""
        return None

    def ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:
        with self._guard():
            call = self._begin("ioctl")
            raw = struct_bytes(arg)
            self._check(call, "fd", call.get("fd"), self.symbols.name(fd))
            self._check(call, "request", call.get("request"), request_name(request))
            fields = normalized_fields(request, raw, self.symbols, self.mappings)
            recorded_fields = call.get("fields") or {}
            for name in sorted(set(recorded_fields) | set(fields)):
                self._check(call, f"fields.{name}", recorded_fields.get(name), fields.get(name))
            if request == abi.FASTRPC_IOCTL_INVOKE:
                self._check_invoke_inputs(call, raw)
            self._end(call)
            self._raise_recorded(call)
            if isinstance(arg, abi.fastrpc_alloc_dma_buf):
                self._allocate(call, arg, int(arg.size))
            elif isinstance(arg, abi.dma_heap_allocation_data):
                self._allocate(call, arg, int(arg.len))
            self._apply_outputs(call, request, arg)
            if request == abi.FASTRPC_IOCTL_INVOKE:
                self._write_invoke_outputs(call, raw)
            ret = call.get("ret")
            return int(ret) if isinstance(ret, int) else 0

    # -- the call's turns ----------------------------------------------------------
    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """A stopped replay answers every call with EPIPE, so sessions unwind."""
        if self.sequencer.aborted:
            raise OSError(errno.EPIPE, "the replay has stopped")
        try:
            yield
        except AbortedError:
            raise OSError(errno.EPIPE, "the replay has stopped") from None

    def _begin(self, kind: str) -> Record:
        """The calling side's next recorded call, once its start's turn has come."""
        side = getattr(self._local, "side", None) or "none"
        with self._lock:
            queue = self._sides.get(side)
            call = queue.popleft() if queue else None
        if call is None:
            if not self.trace.complete and side.startswith("listener:"):
                self.sequencer.wait_until_stopped()  # the trace was cut while it waited
            expected = self.sequencer.next_event
            self.diverge(
                Divergence(
                    None,
                    None,
                    "call",
                    f"nothing more on {side} (next: {self.sequencer.owner(expected)})",
                    f"made a {kind} call",
                    side,
                )
            )
        assert call is not None
        self.sequencer.wait(int(call["start"]))
        self._check(call, "call", call.get("call"), kind)
        return call

    def _end(self, call: Record) -> None:
        with self._lock:
            self.calls_replayed += 1
        self.sequencer.wait(int(call["end"]))

    # -- giving back what the device answered ----------------------------------------------
    @staticmethod
    def _raise_recorded(call: Record) -> None:
        err = call.get("errno")
        if isinstance(err, int):
            raise OSError(err, os.strerror(err))

    def _allocate(
        self,
        call: Record,
        arg: abi.fastrpc_alloc_dma_buf | abi.dma_heap_allocation_data,
        size: int,
    ) -> None:
        """The recorded DMA-BUF, stood in for by a memfd of its size."""
        fd = os.memfd_create("replay-dmabuf", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        arg.fd = fd
        with self._lock:
            self._real_fds.add(fd)
        recorded = (call.get("out_fields") or {}).get("fd")
        self._check(call, "out_fields.fd", recorded, self.symbols.assign("buf", fd))
        out = bytes.fromhex(str(call.get("out", "")))
        if len(out) >= 4:
            with self._lock:
                self._recorded_numbers[str(recorded)] = int.from_bytes(
                    out[:4], "little", signed=True
                )

    def _apply_outputs(self, call: Record, request: int, arg: IoctlArg) -> None:
        recorded = call.get("out_fields") or {}
        fds = FD_FIELDS.get(request, frozenset())
        for name in OUTPUT_FIELDS.get(request, ()):
            if name in fds or name not in recorded:
                continue
            setattr(arg, name, int(recorded[name]))

    def _check_invoke_inputs(self, call: Record, raw: bytes) -> None:
        actual = describe_invoke_args(
            raw, self.symbols, self.mappings, self.capture_limit, outputs=False
        )
        recorded = list(call.get("args") or [])
        self._check(call, "args.count", len(recorded), len(actual))
        reply_to = self._requests.get(str(call.get("side"))) if _is_next2(call) else None
        for index, (want, got) in enumerate(zip(recorded, actual, strict=True)):
            for key in ("dir", "len", "attr", "where", "fd"):
                self._check(call, f"args[{index}].{key}", want.get(key), got.get(key))
            if "data" in want:
                data = decode_data(got["data"]) if "data" in got else None
                if data is not None and index == 1 and reply_to is not None:
                    data = self._reply_fd_to_recorded(reply_to, data)
                    data = _stat_reply_as_recorded(reply_to, data, decode_data(want["data"]))
                if data is None or not same_data(want["data"], self.to_recorded(data)):
                    self._check(call, f"args[{index}].data", want["data"], got.get("data"))

    def _write_invoke_outputs(self, call: Record, raw: bytes) -> None:
        outputs = list(call.get("outputs") or [])
        slots = [slot for index, slot in enumerate(invoke_slots(raw)) if _is_output(raw, index)]
        next2 = _is_next2(call)
        for position, (slot, recorded) in enumerate(zip(slots, outputs, strict=False)):
            if not recorded:
                continue
            data = decode_data(recorded)
            if data is None:
                continue  # only a digest was kept: the bytes are not ours to give
            if next2 and position == 1:
                header = decode_data(outputs[0]) if outputs[0] else None
                data = self._request_fd_to_actual(header or b"", data)
                with self._lock:
                    self._requests[str(call.get("side"))] = (header or b"")[:12] + data
            data = self.to_actual(data)[: int(slot.length)]
            ctypes.memmove(int(slot.ptr), data, len(data))

    # -- fd numbers inside reverse-RPC payloads (the apps_std _fd calls) ------------------
    def _reply_fd_to_recorded(self, request: bytes, reply: bytes) -> bytes:
        """A reply to fopen_fd / fopen_with_env_fd carries this run's fd: write the
        recorded number of the same DMA-BUF in its place before comparing."""
        if _apps_std_fd_call(request) not in (_FOPEN_FD, _FOPEN_WITH_ENV_FD) or len(reply) < 12:
            return reply
        actual = int.from_bytes(reply[8:12], "little", signed=True)
        symbol = self.symbols.name(actual)
        with self._lock:
            number = self._recorded_numbers.get(str(symbol))
        if number is None:
            return reply
        return reply[:8] + number.to_bytes(4, "little", signed=True) + reply[12:]

    def _request_fd_to_actual(self, header: bytes, blob: bytes) -> bytes:
        """A recorded fclose_fd request names the recording's fd: name this run's."""
        if _apps_std_fd_call(header[:12] + blob) != _FCLOSE_FD or len(blob) < 16:
            return blob
        recorded = int.from_bytes(blob[12:16], "little", signed=True)
        with self._lock:
            symbol = next((s for s, n in self._recorded_numbers.items() if n == recorded), None)
        actual = self.symbols.fd(symbol) if symbol is not None else None
        if actual is None:
            return blob
        return blob[:12] + actual.to_bytes(4, "little", signed=True) + blob[16:]

    def close_all(self) -> None:
        """Close the fds this replay created that the session did not (after a divergence)."""
        with self._lock:
            fds, self._real_fds = self._real_fds, set()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


_FOPEN_FD: Final = 34
_FCLOSE_FD: Final = 35
_FOPEN_WITH_ENV_FD: Final = 36
_NEXT2_SCS: Final = frozenset({0x04020200, 0x06020200})  # adsp_listener, adsp_listener1


def _is_next2(call: Record) -> bool:
    fields = call.get("fields") or {}
    return call.get("request") == "INVOKE" and fields.get("sc") in _NEXT2_SCS


def _apps_std_fd_call(request: bytes) -> int | None:
    """The apps_std id of a request (next2 header + packed blob) sent as method 31, else None.

    The header is {ctx, handle, sc}; the blob's first input is primIn, whose first
    u32 is the real id (a u32 length, padding to 8, then the data).
    """
    if len(request) < 12 + 12:
        return None
    sc = int.from_bytes(request[8:12], "little")
    if abi.remote_scalars_method(sc) != 31:
        return None
    return int.from_bytes(request[12 + 8 : 12 + 12], "little")


_STAT: Final = 31
_STAT_REPLY: Final = struct.Struct("<I4xQQQIIQQqqqqqq")  # packed: length, pad, apps_std_STAT


def _stat_reply_as_recorded(request: bytes, reply: bytes, recorded: bytes | None) -> bytes:
    """A stat reply describes this machine's file (device, inode, times): when the file
    type and size are the recorded ones, take the recorded bytes."""
    if _apps_std_fd_call(request) != _STAT or recorded is None:
        return reply
    if len(reply) != _STAT_REPLY.size or len(recorded) != _STAT_REPLY.size:
        return reply
    mine, theirs = _STAT_REPLY.unpack(reply), _STAT_REPLY.unpack(recorded)
    same_type = stat.S_IFMT(mine[4]) == stat.S_IFMT(theirs[4])
    return recorded if same_type and mine[7] == theirs[7] else reply


def _is_output(raw: bytes, index: int) -> bool:
    sc = int.from_bytes(raw[4:8], "little")
    inbufs = abi.remote_scalars_inbufs(sc)
    return inbufs <= index < inbufs + abi.remote_scalars_outbufs(sc)


def _what(call: Record) -> str:
    kind = call.get("call")
    if kind == "ioctl":
        text = f"{call.get('request')} on {call.get('fd')}"
        fields = call.get("fields") or {}
        if call.get("request") == "INVOKE":
            text += (
                f", handle 0x{int(fields.get('handle', 0)):X}, sc 0x{int(fields.get('sc', 0)):08X}"
            )
    elif kind == "open":
        text = f"open {call.get('path')}"
    else:
        text = f"{kind} {call.get('fd')}"
    if call.get("op") is not None:
        text += f", in op {call['op']}"
    elif str(call.get("side", "")).startswith("listener"):
        text += ", on the listener"
    return text


# --- the replayer ---------------------------------------------------------------------
