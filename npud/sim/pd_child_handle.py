"""npud's handle on one PD child: its socket, its doorbell, its pidfd, and the calls
that run on it.

:class:`PdChild` is one child forked by a zygote (:mod:`npud.sim.pd_host`): killed
with ``pidfd_send_signal``, never by pid. Calls carry ids and run at once; the
thread that waits for a call's answer serves what the child asks meanwhile
(``Work`` on the channel's shared compute, ``ReadFile`` through reverse RPC) and
re-emits its log records. A child that ends while a call waits (killed by the
driver, crashed, or breaking the wire) makes that call raise :class:`PdGoneError`;
the DSP process decides what the call answers. Nothing here starts a thread.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import itertools
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Sequence
from typing import Final, NamedTuple, Protocol

import msgspec

from npud.sim import pd_wire as wire
from npud.sim.skels import HostFileError

# The logger of npud.sim.pd_host, where this lived: what operators filter on.
log = logging.getLogger("npud.sim.pd_host")

EXIT_TIMEOUT: Final = 5.0
"""Seconds to wait for a killed child, or a released zygote, to be gone."""
FILE_MEMFD_SEALS: Final = (
    fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
)
CHILD_LOGGER_PREFIX: Final = "npud.sim."
_RECORD_ATTRIBUTES: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

_CHILD: Final = msgspec.msgpack.Decoder(wire.ChildMessage)


class PdGoneError(Exception):
    """The child ended (killed, crashed) or broke the wire while it was needed."""


MAX_OPEN_JOBS: Final = 64
"""Pieces of work one call may have begun and not ended (a child asking more is broken)."""


class CallServices(Protocol):
    """What the waiting thread does for the child while a call runs."""

    def work(self, seconds: float) -> None: ...

    @property
    def metered(self) -> bool:
        """The shared compute is modelled: calls may begin and end pieces of work."""
        ...

    def work_begin(self, matrix: bool, started: float | None = None) -> object:
        """A piece of work joins the shared compute (begun at ``started``, a
        ``time.monotonic()``, when given); what :meth:`work_end` takes."""
        ...

    def work_end(self, job: object, seconds: float) -> None:
        """The piece took ``seconds`` on the host: wait until the model credited it."""
        ...

    def work_drop(self, job: object) -> None:
        """The call ended with the piece begun: it leaves the model."""
        ...

    def read_host_file(self, name: str, *, limit: int) -> bytes: ...


class DspReport:
    """What the DSP told with a call's answer: ``dsp_seconds``, the DSP time of the work
    the call answers for (``SkelCall.report_dsp_seconds``; None: nothing told)."""

    __slots__ = ("dsp_seconds",)

    def __init__(self) -> None:
        self.dsp_seconds: float | None = None


class MemoryRef(NamedTuple):
    """A buffer a call uses in place: ``id`` names its memory in the child.

    ``fd`` is an fd of the buffer, valid during the call (None: the child knows the id
    already, a MEM_MAP binding); ``cached``: the child keeps it after the call, until
    told to drop it; otherwise it maps it for this call only."""

    id: int
    fd: int | None
    size: int
    cached: bool


class BufferSpan(NamedTuple):
    """One buffer of a call: ``length`` bytes at ``offset`` of ``memory`` (None: of the
    call's payload, the kernel's copy of the plain buffers)."""

    memory: MemoryRef | None
    offset: int
    length: int


class CallTransfer(Protocol):
    """How a call's buffers reach the child (built by :class:`npud.sim.invoke.InvokeArguments`)."""

    @property
    def spans(self) -> Sequence[BufferSpan]:
        """Where each buffer is: inputs, then outputs."""
        ...

    @property
    def inbufs(self) -> int: ...

    @property
    def payload(self) -> memoryview:
        """The whole payload (plain buffers), sent in the message when ``payload_fd`` is None."""
        ...

    @property
    def payload_fd(self) -> int | None:
        """A memfd holding the payload, for a payload too large for a message."""
        ...


class _ViolationError(Exception):
    """The child sent what the wire does not allow."""


class _Call:
    """One call waiting on the child: its id, its receive buffer, what other threads
    received for it, and the condition it waits on (on the child's lock)."""

    __slots__ = ("buffer", "cond", "id", "mailbox")

    def __init__(self, call_id: int, lock: threading.Lock, buffer: bytearray) -> None:
        self.id = call_id
        self.cond = threading.Condition(lock)
        self.buffer = buffer
        self.mailbox: collections.deque[tuple[wire.CallAnswer, bytes]] = collections.deque()


class PdChild:
    """One PD child process; see the module docstring. Thread-safe.

    One socket carries every call. The threads waiting for calls take turns at
    reading it (leader and followers): the reader keeps what is for its own call
    and puts the rest, tail copied, in the mailbox of the call it is for.
    Whatever is sent while calls of this PD run is followed by a ring of its
    doorbell (see :mod:`npud.sim.pd_wire`). So npud holds three fds per PD (the
    socket, the doorbell, the pidfd) however many calls run."""

    def __init__(self, sock: socket.socket, doorbell: socket.socket, pidfd: int, pid: int) -> None:
        self.pid = pid
        self._sock = sock
        self._doorbell = doorbell
        self._pidfd = pidfd
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # calls, reader, known memories, life
        self._table_lock = threading.Lock()
        """Orders an invoke with the table changes around it: what an invoke names is
        sent before it (``_ensure``) and dropped, if at all, after it is sent; taken
        before ``_lock`` and ``_send_lock``."""
        self._calls: dict[int, _Call] = {}
        self._reading = False
        self._broken = False  # end of the socket seen, or killed
        self._killed = False
        self._spare: list[_Call] = []
        self._known: set[int] = set()  # memory ids the child holds
        self._ids = itertools.count(1)
        self._instances = itertools.count(1)

    # -- life ------------------------------------------------------------------------------

    @property
    def killed(self) -> bool:
        """The driver ended it (kill())."""
        with self._lock:
            return self._killed

    @property
    def alive(self) -> bool:
        """The process exists and was not killed by the driver."""
        with self._lock:
            if self._killed or self._pidfd < 0:
                return False
            return not pidfd_exited(self._pidfd, 0)

    def kill(self) -> None:
        """SIGKILL through the pidfd, wake every waiting call, wait until it is gone."""
        with self._lock:
            if self._killed:
                return
            self._killed = True
            self._broken = True
            pidfd = self._pidfd
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # the reader's recvmsg returns now
            for call in self._calls.values():
                call.cond.notify()
        if not pidfd_exited(pidfd, EXIT_TIMEOUT):
            log.error("a killed PD child is still there", extra={"pid": self.pid})
        with self._lock:
            self._pidfd = -1
        os.close(pidfd)
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        """Once killed, close the socket when no thread reads it or sends on it."""
        with self._lock:
            if not self._killed or self._reading:
                return
            with self._send_lock:
                self._sock.close()
                self._doorbell.close()

    # -- sending ---------------------------------------------------------------------------

    def _send(
        self,
        message: msgspec.Struct,
        tail: Sequence[bytes | bytearray | memoryview] = (),
        fds: Sequence[int] = (),
        *,
        ring_above: int | None = 0,
    ) -> None:
        """Send; then ring the doorbell when more than ``ring_above`` calls of this PD
        wait (None: never): a thread of the child may be busy with them, and none reading
        the socket. A call counts itself; the answer to what a call asked needs no ring
        (the call's thread reads it itself when no one else does)."""
        with self._lock:
            ring = ring_above is not None and len(self._calls) > ring_above
        try:
            with self._send_lock:
                wire.send(self._sock, message, tail, fds)
                if ring:
                    self._doorbell.send(b"\1")
        except wire.ClosedError:
            raise PdGoneError("the PD child's socket is closed") from None
        except OSError as exc:
            raise PdGoneError(f"the PD child's doorbell: {exc}") from None

    def bind_fd(self, memory_id: int, fd: int, size: int, offset: int, length: int) -> None:
        """A MEM_MAP through fd number ``fd`` (an fd of the buffer, valid now)."""
        with self._lock:
            if self._broken:
                raise PdGoneError("the PD child is gone")
            self._known.add(memory_id)
        self._send(wire.BindFd(memory_id, size, fd, offset, length), fds=[fd])

    def bind_alias(self, memory_id: int, target: int, fd: int, offset: int, length: int) -> None:
        with self._lock:
            if self._broken or target not in self._known:
                return
            self._known.add(memory_id)
        self._send(wire.BindAlias(memory_id, target, fd, offset, length))

    def drop(self, memory_ids: Sequence[int]) -> None:
        """Memories gone on the driver's side; ignored when the child is gone too."""
        with self._table_lock:
            with self._lock:
                known = [memory_id for memory_id in memory_ids if memory_id in self._known]
                if not known or self._broken:
                    return
                self._known.difference_update(known)
            with contextlib.suppress(PdGoneError):
                self._send(wire.DropMemory(known))

    def _ensure(self, spans: Sequence[BufferSpan]) -> None:
        """Send the cached memories the child does not hold yet (before the call, on the
        same socket: the child maps them before it starts the call)."""
        for span in spans:
            ref = span.memory
            if ref is None or not ref.cached:
                continue
            with self._lock:
                if ref.id in self._known:
                    continue
                if ref.fd is None:
                    # A MEM_MAP unmapped before its call was sent: the child answers
                    # AEE_EBADPARM for it (the caller's bad reference), its PD lives on.
                    continue
                self._known.add(ref.id)
            self._send(wire.AddMemory(ref.id, ref.size), fds=[ref.fd], ring_above=None)

    # -- waiting for answers -------------------------------------------------------------

    def _open_call(self) -> _Call:
        with self._lock:
            if self._broken:
                raise PdGoneError("the PD child is gone")
            if self._spare:
                call = self._spare.pop()
                call.id = next(self._ids)
            else:
                call = _Call(next(self._ids), self._lock, bytearray(wire.MESSAGE_MAX))
            self._calls[call.id] = call
            return call

    def _close_call(self, call: _Call) -> None:
        with self._lock:
            del self._calls[call.id]
            call.mailbox.clear()
            self._spare.append(call)  # its buffer and condition serve the next call

    def _next(self, call: _Call) -> tuple[wire.CallAnswer, memoryview | bytes]:
        """The next message for ``call``: from its mailbox, or read from the socket
        while no other thread reads it. PdGoneError when the child ended."""
        with self._lock:
            while True:
                if call.mailbox:
                    return call.mailbox.popleft()
                if self._broken:
                    raise PdGoneError("the PD child ended")
                if not self._reading:
                    self._reading = True
                    break
                call.cond.wait()
        try:
            return self._read_for(call)
        except (wire.ClosedError, wire.WireError) as exc:
            self._break()
            raise PdGoneError(str(exc)) from None
        except (msgspec.DecodeError, _ViolationError) as exc:
            self._break()
            self._violation(str(exc))
            raise PdGoneError(str(exc)) from None
        finally:
            with self._lock:
                self._reading = False
                for other in self._calls.values():
                    if other is not call:
                        other.cond.notify()  # one without mail reads next
            self._close_if_idle()

    def _read_for(self, call: _Call) -> tuple[wire.CallAnswer, memoryview]:
        """As the reader: messages for other calls go to their mailboxes (tails copied)
        until one for ``call`` comes (its tail a view of ``call.buffer``)."""
        while True:
            received = self._receive(call.buffer)
            answer = _CHILD.decode(received.header)
            if isinstance(answer, wire.Hello):
                raise _ViolationError("hello out of place")
            if isinstance(answer, wire.Log) and answer.call == wire.NO_CALL:
                _emit(answer)  # a thread of the PD's own logged it
                continue
            if answer.call == call.id:
                return answer, received.tail
            with self._lock:
                target = self._calls.get(answer.call)
                if target is None:
                    raise _ViolationError(f"an answer for call {answer.call}")
                target.mailbox.append((answer, bytes(received.tail)))
                target.cond.notify()

    def _break(self) -> None:
        """The socket ended (or lied): every waiting call finds out."""
        with self._lock:
            self._broken = True
            for other in self._calls.values():
                other.cond.notify()

    def _receive(self, buffer: bytearray) -> wire.Received:
        received = wire.receive(self._sock, buffer)
        if received.fds:
            received.close_fds()
            raise _ViolationError("fds from a PD child")
        return received

    def _violation(self, what: str) -> None:
        log.error("a PD child broke the wire", extra={"pid": self.pid, "error": what})
        self.kill()

    def _exchange(
        self,
        call: _Call,
        message: msgspec.Struct,
        services: CallServices | None,
        tail: Sequence[bytes | bytearray | memoryview] = (),
        fds: Sequence[int] = (),
    ) -> tuple[wire.CallAnswer, memoryview | bytes]:
        """Send a call and serve the child until its answer; PdGoneError when it ends."""
        self._send(message, tail, fds, ring_above=1)
        return self._serve_call(call, services)

    def _serve_call(
        self, call: _Call, services: CallServices | None
    ) -> tuple[wire.CallAnswer, memoryview | bytes]:
        """Serve the child for a call sent until its answer; PdGoneError when it ends."""
        jobs: dict[int, object] = {}  # pieces of work the call began (WorkBegin)
        try:
            while True:
                answer, data = self._next(call)
                if isinstance(answer, wire.Log):
                    _emit(answer)
                elif isinstance(answer, wire.WorkBegin | wire.Work) and services is not None:
                    self._serve_work(call, answer, services, jobs)
                elif isinstance(answer, wire.ReadFile) and services is not None:
                    self._serve_file(call, answer, services)
                elif isinstance(answer, wire.Work | wire.WorkBegin | wire.ReadFile):
                    raise self._broken_wire(f"{type(answer).__name__} out of place")
                else:
                    return answer, data
        finally:
            if services is not None:
                for job in jobs.values():
                    services.work_drop(job)

    def _serve_work(
        self,
        call: _Call,
        request: wire.WorkBegin | wire.Work,
        services: CallServices,
        jobs: dict[int, object],
    ) -> None:
        """Work the child asks for (see :class:`CallServices`); ``jobs``: the call's
        pieces begun and not ended."""
        if isinstance(request, wire.WorkBegin):
            if request.job in jobs or len(jobs) >= MAX_OPEN_JOBS or not services.metered:
                raise self._broken_wire(f"work {request.job} begun out of place")
            jobs[request.job] = services.work_begin(request.matrix, request.started or None)
            return
        if request.job:
            job = jobs.pop(request.job, None)
            if job is None:
                raise self._broken_wire(f"work {request.job} ended, never begun")
            services.work_end(job, request.seconds)
        else:
            services.work(request.seconds)
        self._send(wire.WorkDone(call.id), ring_above=None)

    def _broken_wire(self, what: str) -> PdGoneError:
        self._violation(what)
        return PdGoneError("the PD child broke the wire")

    def _serve_file(self, call: _Call, request: wire.ReadFile, services: CallServices) -> None:
        try:
            data = services.read_host_file(request.name, limit=request.limit)
        except HostFileError as exc:
            message = wire.FileFailed(call.id, exc.code & 0xFFFFFFFF, str(exc)[:4096])
            self._send(message, ring_above=None)
            return
        if len(data) <= wire.INLINE_MAX:
            self._send(wire.FileData(call.id, len(data), in_memfd=False), [data], ring_above=None)
            return
        fd = _sealed_memfd(data)
        try:
            self._send(wire.FileData(call.id, len(data), in_memfd=True), fds=[fd], ring_above=None)
        finally:
            os.close(fd)

    # -- calls ---------------------------------------------------------------------------------

    def create(self, name: str, factory: bytes) -> int:
        """A skel instance from the pickled ``factory``: its number in the child.
        ValueError with the child's reason when the factory fails there."""
        instance = next(self._instances)
        call = self._open_call()
        try:
            answer, _ = self._exchange(call, wire.Create(call.id, instance, name, factory), None)
        finally:
            self._close_call(call)
        if not isinstance(answer, wire.Created):
            raise self._broke(answer)
        if answer.error:
            raise ValueError(answer.error)
        return instance

    def destroy(self, instance: int) -> None:
        """Close the instance (its skel's close hook runs in the child)."""
        call = self._open_call()
        try:
            answer, _ = self._exchange(call, wire.Destroy(call.id, instance), None)
        finally:
            self._close_call(call)
        if not isinstance(answer, wire.Destroyed):
            raise self._broke(answer)

    def invoke(
        self,
        instance: int,
        method_offset: int,
        sc: int,
        transfer: CallTransfer,
        outputs: Sequence[memoryview],
        services: CallServices,
        *,
        crash: bool = False,
        report: DspReport | None = None,
    ) -> int:
        """Run a method in the child; its AEE result. Plain outputs come back into
        ``outputs`` (the payload's views) when the payload travelled in the message;
        what the DSP reported with the answer into ``report``."""
        transient: list[wire.AddMemory] = []
        fds: list[int] = []
        payload_id = wire.INLINE
        if transfer.payload_fd is not None:
            payload_id = _new_transient_id()
            transient.append(wire.AddMemory(payload_id, len(transfer.payload)))
            fds.append(transfer.payload_fd)
        spans: list[wire.Span] = []
        for span in transfer.spans:
            ref = span.memory
            if ref is None:
                spans.append(wire.Span(payload_id, span.offset, span.length))
                continue
            if not ref.cached and all(memory.id != ref.id for memory in transient):
                if ref.fd is None:
                    raise PdGoneError(f"memory {ref.id} has no fd")
                transient.append(wire.AddMemory(ref.id, ref.size))
                fds.append(ref.fd)
            spans.append(wire.Span(ref.id, span.offset, span.length))
        inline = payload_id == wire.INLINE
        tail = [transfer.payload] if inline and len(transfer.payload) else []
        call = self._open_call()
        try:
            message = wire.Invoke(
                call.id,
                instance,
                method_offset,
                sc,
                spans[: transfer.inbufs],
                spans[transfer.inbufs :],
                transient,
                crash,
                services.metered,
            )
            with self._table_lock:  # no DropMemory between the memories and the call
                self._ensure(transfer.spans)
                self._send(message, tail, fds, ring_above=1)
            answer, data = self._serve_call(call, services)
            if not isinstance(answer, wire.Result):
                raise self._broke(answer)
            if inline:
                self._copy_outputs(data, message.outputs, outputs)
            elif len(data):
                raise self._broke("outputs in a message with a shared payload")
            if report is not None:
                report.dsp_seconds = answer.dsp_seconds
            return answer.result
        finally:
            self._close_call(call)

    def _copy_outputs(
        self, data: memoryview | bytes, spans: Sequence[wire.Span], outputs: Sequence[memoryview]
    ) -> None:
        cursor = 0
        for span, target in zip(spans, outputs, strict=True):
            if span.memory != wire.INLINE:
                continue
            end = cursor + span.length
            if end > len(data):
                raise self._broke("short outputs")
            target[:] = data[cursor:end]
            cursor = end
        if cursor != len(data):
            raise self._broke("surplus outputs")

    def _broke(self, what: object) -> PdGoneError:
        text = what if isinstance(what, str) else f"a {type(what).__name__} out of place"
        self._violation(text)
        return PdGoneError(text)


_transient_ids = itertools.count(-2, -1)
"""Ids of memories that live for one call (the payload memfd): negative, never a cached
memory's."""


def _new_transient_id() -> int:
    return next(_transient_ids)


def pidfd_exited(pidfd: int, timeout: float) -> bool:
    """True when the process behind ``pidfd`` has exited (waiting up to ``timeout``)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue


def _sealed_memfd(data: bytes) -> int:
    """A memfd holding ``data``, sealed read-only; the caller owns the fd."""
    fd = os.memfd_create("npud-pd-file", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, FILE_MEMFD_SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _emit(record: wire.Log) -> None:
    """Re-emit a child's log record on npud's logger of the same name (under npud.sim)."""
    name = record.logger
    if not name.startswith(CHILD_LOGGER_PREFIX):
        name = f"{CHILD_LOGGER_PREFIX}pd.{name}"
    level = min(max(record.level, logging.DEBUG), logging.CRITICAL)
    extra = {
        key: value
        for key, value in record.fields.items()
        if key.isidentifier() and key not in _RECORD_ATTRIBUTES
    }
    logging.getLogger(name).log(level, record.message, extra=extra)
