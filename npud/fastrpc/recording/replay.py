"""Playing a trace back against FastRpcSession: the first divergence, by call number and field.

:func:`replay` reads a trace (docs/trace-format.md), runs every recorded
session operation again on a FastRpcSession whose driver is a
:class:`ReplayDriver`, and compares each Driver call the session makes with
the recorded one, field by field. The driver answers with what the device
answered then: return values, errnos, the struct fields the kernel wrote, the
bytes the DSP wrote into output buffers. So the session code of today is
checked against a device of the past, in CI, without the device.

Order. Operations run on one thread per recorded thread, and every event
(an operation's start and end, a call's start and end, the listener's calls
included) happens in the recorded order: a thread waits for its turn. The
session's own listener thread replays the recorded listener's calls.

What must match: the call's kind and device (``dev0``), the request, every
struct field (fds and pointers in their stable forms), every invoke argument
and the bytes of the inputs, and each operation's result or error code. What
is given back: return values, errnos, output fields, output bytes.

Limits: a trace whose DSP read files by absolute path (get_search_paths_with_env)
replays only with the same library directories; names the daemon generated
(``npud-fd-...``) are substituted; host files come from the trace's ``file``
records (into a temporary directory) unless a library path is given.
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
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

import msgspec

from npu_protocol import CodedError
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.dma_heap import DmaHeap
from npud.fastrpc.kernel.driver import IoctlArg
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, OutArg, Slice
from npud.fastrpc.kernel.trace_hooks import (
    DEFAULT_CAPTURE_LIMIT,
    NULL_SCOPE,
    JsonValue,
    OpScope,
    Record,
)
from npud.fastrpc.recording.trace_format import (
    FD_FIELDS,
    OUTPUT_FIELDS,
    TRACE_FORMAT,
    TRACE_VERSION,
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
from npud.fastrpc.reverse.exposed_files import EXPOSED_PREFIX, ExposedFile
from npud.fastrpc.session import FastRpcSession

DEFAULT_TIMEOUT: Final = 10.0
"""Seconds a replay thread waits for its turn before the trace and the code are declared apart."""


class TraceFormatError(Exception):
    """The file is not a trace this version can read; ``str()`` says why (and where)."""


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


@dataclasses.dataclass(frozen=True)
class Trace:
    header: Record
    calls: tuple[Record, ...]
    ops: tuple[Record, ...]
    files: tuple[Record, ...]
    complete: bool
    """The recorder closed it (an ``end`` record): nothing ran past its last call."""


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and check a trace file. TraceFormatError names the line of any problem."""
    decoder = msgspec.json.Decoder()
    kinds: dict[str, list[Record]] = {"call": [], "op": [], "file": [], "reverse": [], "end": []}
    header: Record | None = None
    with open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise TraceFormatError(f"{where}: not a JSON line: {exc}") from None
            if not isinstance(record, dict) or "kind" not in record:
                raise TraceFormatError(f"{where}: a record must be an object with a kind")
            if header is None:
                header = _check_header(record, where)
            elif record["kind"] in kinds:
                kinds[record["kind"]].append(record)
            else:
                raise TraceFormatError(f"{where}: unknown record kind {record['kind']!r}")
    if header is None:
        raise TraceFormatError(f"{path}: empty")
    return Trace(
        header,
        tuple(sorted(kinds["call"], key=lambda r: int(r["n"]))),
        tuple(sorted(kinds["op"], key=lambda r: int(r["start"]))),
        tuple(kinds["file"]),
        bool(kinds["end"]),
    )


def _check_header(record: Record, where: str) -> Record:
    if record.get("kind") != "header" or record.get("format") != TRACE_FORMAT:
        raise TraceFormatError(f"{where}: not an {TRACE_FORMAT} file")
    if record.get("version") != TRACE_VERSION:
        raise TraceFormatError(
            f"{where}: version {record.get('version')!r}; this npud reads version {TRACE_VERSION}"
        )
    return record


class _AbortedError(Exception):
    """The replay stopped (a divergence, or the end): unwind."""


class _Sequencer:
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
                raise _AbortedError
            if not ok:
                self.stuck_at = self._current()
                self.aborted = True
                self._cond.notify_all()
                raise _AbortedError
            self._position += 1
            self._cond.notify_all()

    def wait_until_stopped(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.aborted)
        raise _AbortedError

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
        self.sequencer = _Sequencer(events, owners, timeout)
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
        raise _AbortedError

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
        except _AbortedError:
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


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    calls: int
    ops: int
    replayed: int
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        if self.divergence is None:
            return f"replayed {self.replayed} calls in {self.ops} operations: no divergence"
        return f"first divergence: {self.divergence}"


class _Replayer:
    def __init__(self, trace: Trace, driver: ReplayDriver, library: Path) -> None:
        self.trace = trace
        self.driver = driver
        self.library = library
        self.sessions: dict[int, FastRpcSession] = {}
        self.heaps: dict[int, DmaHeap | None] = {}
        self.buffers: dict[tuple[int, JsonValue], object] = {}
        self.exposed: dict[str, ExposedFile] = {}
        self.format_error: TraceFormatError | None = None

    def run(self) -> None:
        by_thread: dict[str, list[Record]] = collections.defaultdict(list)
        for op in self.trace.ops:
            by_thread[str(op.get("thread", "?"))].append(op)
        threads = [
            threading.Thread(target=self._thread, args=(ops,), name=f"replay-{name}", daemon=True)
            for name, ops in by_thread.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _thread(self, ops: list[Record]) -> None:
        driver = self.driver
        for op in ops:
            try:
                driver.sequencer.wait(int(op["start"]))
                driver.expect_op(op)
                try:
                    outcome = self._run(op)
                    error: str | None = None
                except CodedError as exc:
                    outcome, error = None, exc.code.name
                except (OSError, ValueError) as exc:
                    outcome, error = None, type(exc).__name__
                finally:
                    driver.expect_op(None)
                if driver.sequencer.aborted:
                    return
                self._compare(op, outcome, error)
                driver.sequencer.wait(int(op["end"]))
            except _AbortedError:
                return
            except (TraceFormatError, KeyError, TypeError) as exc:
                # The trace itself is wrong (hand-edited, another writer): stop, say where.
                self.format_error = TraceFormatError(f"op {op.get('id')}: {exc}")
                driver.sequencer.abort()
                return

    def _compare(self, op: Record, outcome: Record | None, error: str | None) -> None:
        recorded_error = (op.get("error") or {}).get("code")
        where = f"{op['op']}"
        if recorded_error != error:
            self.driver.diverge(
                Divergence(None, int(op["id"]), "error", recorded_error, error, where)
            )
        if outcome is None or "result" not in op:
            return
        for key, expected in (op.get("result") or {}).items():
            actual = outcome.get(key, expected)
            if key == "outputs" and isinstance(expected, list) and isinstance(actual, list):
                for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
                    if want is None or got is None:
                        continue
                    if not same_data(want, self.driver.to_recorded(decode_data(got) or b"")):
                        self.driver.diverge(
                            Divergence(
                                None, int(op["id"]), f"result.outputs[{index}]", want, got, where
                            )
                        )
            elif expected != actual:
                self.driver.diverge(
                    Divergence(None, int(op["id"]), f"result.{key}", expected, actual, where)
                )

    # -- the operations --------------------------------------------------------------
    def _run(self, op: Record) -> Record:
        name = str(op["op"])
        args: Record = op.get("args") or {}
        session_id = int(op.get("session", 0))
        if name == "open":
            return _op_open(self, session_id, args)
        if name in _HEAP_OPERATIONS:
            return _HEAP_OPERATIONS[name](self, session_id, args, op)
        handler = _OPERATIONS.get(name)
        if handler is None:
            raise TraceFormatError(f"op {op.get('id')}: unknown operation {name!r}")
        session = self.sessions.get(session_id)
        if session is None:
            raise TraceFormatError(f"op {op.get('id')}: session {session_id} was never opened")
        return handler(self, session, session_id, args, op)

    def buffer(self, session: int, buffer_ref: JsonValue) -> object:
        """A buffer by its trace name: ``h<n>`` is the system heap's (any session may pass
        it), a number is the session's own."""
        if isinstance(buffer_ref, str):
            return self.buffers[(HEAP_BUFFERS, buffer_ref)]
        return self.buffers[(session, int(buffer_ref))]

    def close_leftovers(self) -> None:
        for heap in self.heaps.values():
            if heap is not None:
                with contextlib.suppress(Exception):
                    heap.close()
        for exposed in list(self.exposed.values()):
            with contextlib.suppress(Exception):
                exposed.close()
        for session in self.sessions.values():
            with contextlib.suppress(Exception):
                session.close(timeout=1.0)


def _op_open(r: _Replayer, sid: int, args: Record) -> Record:
    nodes = [str(n) for n in args.get("nodes", abi.CDSP_NODES)]
    session = FastRpcSession.open(r.driver, nodes=nodes, library_path=[r.library])
    r.sessions[sid] = session
    return {"device": session.device}


def _op_load_shell(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    # The shell's bytes travel in a DMA-BUF: the trace compares their length, not them.
    s.load_shell(bytes(int(args["size"])) or b"\0", attrs=int(args.get("attrs", 8)))
    return {}


def _op_alloc(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    buffer = s.alloc(int(args["size"]))
    recorded = (op.get("result") or {}).get("buffer", buffer.id)
    r.buffers[(sid, int(recorded))] = buffer
    return {"buffer": buffer.id, "size": buffer.size}


def _op_alloc_unowned(
    r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record
) -> Record:
    buffer = s.alloc_unowned(int(args["size"]))
    recorded = (op.get("result") or {}).get("buffer", buffer.id)
    r.buffers[(sid, int(recorded))] = buffer
    return {"buffer": recorded, "size": buffer.size}


def _op_free(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    s.free(r.buffer(sid, args["buffer"]))  # type: ignore[arg-type]
    return {}


def _op_map(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    buffer = r.buffer(sid, args["buffer"])
    flags = int(args.get("flags", abi.FASTRPC_MAP_FD))
    return {"address": s.map(buffer, flags)}  # type: ignore[arg-type]


def _op_unmap(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    s.unmap(r.buffer(sid, args["buffer"]))  # type: ignore[arg-type]
    return {}


def _op_invoke(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    inputs: list[InArg] = []
    for item in args.get("inputs", []):
        if "slice" in item:
            buffer_id, offset, length = item["slice"]
            buffer = r.buffer(sid, buffer_id)
            data = decode_data(item["data"]) if item.get("data") else None
            if data is not None:
                view = buffer.view()  # type: ignore[attr-defined]
                view[offset : offset + length] = r.driver.to_actual(data)
                del view
            inputs.append(Slice(buffer, offset, length))  # type: ignore[arg-type]
        else:
            inputs.append(Inline(r.driver.to_actual(decode_data(item["inline"]) or b"")))
    outputs: list[OutArg] = []
    for item in args.get("outputs", []):
        if "slice" in item:
            buffer_id, offset, length = item["slice"]
            outputs.append(Slice(r.buffer(sid, buffer_id), offset, length))  # type: ignore[arg-type]
        else:
            outputs.append(Capacity(int(item["capacity"])))
    result = s.invoke(int(args["handle"]), int(args["sc"]), inputs, outputs)
    encoded = [
        None if data is None else {"len": len(data), "b64": _b64(data)} for data in result.outputs
    ]
    return {"rc": result.rc, "outputs": encoded}


def _b64(data: bytes) -> str:
    import base64  # noqa: PLC0415 - only results of replayed invokes need it

    return base64.b64encode(data.rstrip(b"\0")).decode("ascii")


def _op_remote_open(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    return {"handle": s.remote_open(str(args["uri"]))}


def _op_remote_close(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    s.remote_close(int(args["handle"]))
    return {}


def _op_probe_handle(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    return {"rc": s.probe_static_handle(int(args["handle"]))}


def _op_expose_file(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    record = args.get("data") or {"len": 0, "b64": ""}
    data = decode_data(record)
    if data is None:
        data = bytes(int(record.get("len", 0)))  # only a digest: the DSP reads zeros
    fd = os.memfd_create("replay-exposed", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        exposed = s.expose_file(fd, suffix=str(args.get("suffix", "")))
    finally:
        os.close(fd)
    recorded = str((op.get("result") or {}).get("name", exposed.name))
    if recorded.startswith(EXPOSED_PREFIX):
        r.driver.alias(recorded, exposed.name)
    r.exposed[recorded] = exposed
    return {"name": recorded}


def _op_unexpose(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    exposed = r.exposed.pop(str(args["name"]), None)
    if exposed is not None:
        exposed.close()
    return {}


def _op_close(r: _Replayer, s: FastRpcSession, sid: int, args: Record, op: Record) -> Record:
    timeout = args.get("timeout")
    s.close(timeout=None if timeout is None else float(timeout))
    return {}


HEAP_BUFFERS: Final = -1
"""Where the replayer keeps the system heap's buffers (their trace names are ``h<n>``)."""


def _op_heap_open(r: _Replayer, sid: int, args: Record, op: Record) -> Record:
    heap = DmaHeap.open(r.driver, str(args.get("path", abi.DMA_HEAP_SYSTEM)))
    r.heaps[sid] = heap
    return {"available": heap is not None}


def _op_heap_alloc(r: _Replayer, sid: int, args: Record, op: Record) -> Record:
    heap = r.heaps.get(sid)
    if heap is None:
        raise TraceFormatError(f"op {op.get('id')}: heap {sid} was never opened")
    buffer = heap.allocate(int(args["size"]))
    recorded = (op.get("result") or {}).get("buffer", buffer.trace_ref)
    r.buffers[(HEAP_BUFFERS, str(recorded))] = buffer
    return {"buffer": recorded, "size": buffer.size}


def _op_heap_close(r: _Replayer, sid: int, args: Record, op: Record) -> Record:
    heap = r.heaps.pop(sid, None)
    if heap is not None:
        heap.close()
    return {}


def _op_release(r: _Replayer, sid: int, args: Record, op: Record) -> Record:
    buffer = r.buffer(sid, args["buffer"])
    assert isinstance(buffer, DmaBuffer)
    buffer.give_up()
    return {}


_Operation = Callable[[_Replayer, FastRpcSession, int, Record, Record], Record]
_HeapOperation = Callable[[_Replayer, int, Record, Record], Record]
_HEAP_OPERATIONS: Final[dict[str, _HeapOperation]] = {
    "heap_open": _op_heap_open,
    "heap_alloc": _op_heap_alloc,
    "heap_close": _op_heap_close,
    "release": _op_release,
}
"""Operations of the system heap and of buffers let go by their owner: no session."""
_OPERATIONS: Final[dict[str, _Operation]] = {
    "load_shell": _op_load_shell,
    "alloc": _op_alloc,
    "alloc_unowned": _op_alloc_unowned,
    "free": _op_free,
    "map": _op_map,
    "unmap": _op_unmap,
    "invoke": _op_invoke,
    "remote_open": _op_remote_open,
    "remote_close": _op_remote_close,
    "probe_handle": _op_probe_handle,
    "expose_file": _op_expose_file,
    "unexpose": _op_unexpose,
    "close": _op_close,
}


def replay(
    trace: Trace | str | os.PathLike[str],
    *,
    library_path: Sequence[Path] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> ReplayReport:
    """Play ``trace`` back against FastRpcSession; the report names the first divergence.

    Host files come from ``library_path`` when given, else from the trace's
    ``file`` records (written to a temporary directory for the replay).
    """
    loaded = trace if isinstance(trace, Trace) else load_trace(trace)
    driver = ReplayDriver(loaded, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="npud-replay-") as scratch:
        if library_path:
            library = Path(library_path[0])
        else:
            library = Path(scratch)
            for record in loaded.files:
                data = decode_data(record["data"])
                name = os.path.basename(str(record["name"]))
                if data is not None and name:
                    (library / name).write_bytes(data)
        replayer = _Replayer(loaded, driver, library)
        try:
            replayer.run()
        finally:
            stuck = driver.sequencer.stuck_at
            driver.sequencer.abort()
            replayer.close_leftovers()
            driver.close_all()
    if replayer.format_error is not None:
        raise replayer.format_error
    divergence = driver.divergence
    if divergence is None and stuck is not None:
        divergence = Divergence(
            None, None, "order", driver.sequencer.owner(stuck), "never got there", "waiting"
        )
    if divergence is None and driver.sequencer.next_event is not None and loaded.complete:
        missing = driver.sequencer.next_event
        divergence = Divergence(
            None, None, "call", driver.sequencer.owner(missing), "did not make it", "end of replay"
        )
    return ReplayReport(len(loaded.calls), len(loaded.ops), driver.calls_replayed, divergence)
