"""The runtime of a PD child: the simulated DSP's compute for one user process.

A child is forked by the zygote (:mod:`npud.sim.zygote`) for one DSP process
and runs :func:`serve` until its socket closes (then it exits) or it is
killed. It holds what runs on the DSP for that process:

* skel instances, one per open remote handle, made from the factory the
  driver sends (``Create``) and closed on ``Destroy``;
* a table of memories: buffers mapped here by id (``AddMemory``, sent once
  per buffer while the caller's mapping lives), MEM_MAP'd buffers also by the
  fd number the DSP was told (``BindFd``, ``BindAlias``; what a HAP_mmap-style
  "map by fd" call looks up: skel code asks ``SkelCall.pd.map_fd``), dropped on
  ``DropMemory``;
* the PD's services (:class:`npud.sim.pd_services.PdServices`): state of the
  process (dspqueue), threads of its own, memory by fd. They end with the child.

Threads: the main thread reads the socket. It applies table changes in
order (so a call finds every memory sent before it), hands each call to a
worker thread (an idle one, or a new one: as many as calls ever ran at
once), and routes the driver's answers to the call that asked. Skel code
reaches the driver while its call runs: ``SkelCall.work`` and
``host_files.read_host_file`` send a request with the call's id and wait for
the answer, which the driver's thread waiting for that call gives; log
records go the same way.

An exception that escapes skel code is a crash of the PD, as on the DSP: its
traceback is logged through the call and the process exits. The driver's
socket closing ends the process too. So does running out of memory: the
zygote limits the child's private memory (``[emulator] pd_memory_limit``,
RLIMIT_DATA), and a MemoryError, which the skels let through, ends the PD
from whichever thread it came (one PD's blow-up ends that PD, never npud).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import mmap
import os
import pickle
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Final, NoReturn

import msgspec

from npu_protocol.aee import AEE
from npud.sim import pd_wire as wire
from npud.sim.pd_services import FdMemory, PdServices
from npud.sim.skels import HostFileError, Skel, SkelCall, run_method

CRASH_EXIT: Final = 70
"""The exit status of a child whose skel code raised: a PD crash."""
LOG_LEVEL: Final = logging.INFO
_STANDARD_RECORD: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

_DECODER: Final = msgspec.msgpack.Decoder(wire.DriverMessage)


class _DriverGoneError(BaseException):
    """The driver closed the socket while a call ran: the PD is ending; unwind the call.

    A BaseException, so that skel code catching Exception does not swallow it."""


class _Memory:
    __slots__ = ("holders", "mapping", "users")

    def __init__(self, mapping: mmap.mmap) -> None:
        self.mapping = mapping
        self.holders = 1  # ids that name it
        self.users = 0  # calls using it now


class MemoryTable:
    """Buffers mapped in this child, by id; MEM_MAP'd ones also by the DSP's fd number."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, _Memory] = {}
        self._by_fd: dict[int, list[tuple[int, int, int]]] = {}  # fd -> [(id, offset, length)]

    def add(self, memory_id: int, fd: int, size: int) -> None:
        """Map ``size`` bytes of ``fd`` as ``memory_id``; takes (and closes) ``fd``."""
        try:
            mapping = _map(fd, size)
        finally:
            os.close(fd)
        with self._lock:
            replaced = self._by_id.get(memory_id)
            self._by_id[memory_id] = _Memory(mapping)
            if replaced is not None:  # an id sent again: it names the new mapping now
                replaced.holders -= 1
                if replaced.holders or replaced.users:
                    return
        if replaced is not None:
            _close_mapping(replaced.mapping)

    def bind(self, memory_id: int, fd_number: int, offset: int, length: int) -> None:
        with self._lock:
            if memory_id in self._by_id:
                self._by_fd.setdefault(fd_number, []).append((memory_id, offset, length))

    def alias(self, memory_id: int, target: int, fd_number: int, offset: int, length: int) -> None:
        with self._lock:
            memory = self._by_id.get(target)
            if memory is None:
                return
            memory.holders += 1
            self._by_id[memory_id] = memory
            self._by_fd.setdefault(fd_number, []).append((memory_id, offset, length))

    def drop(self, memory_ids: list[int]) -> None:
        closing: list[mmap.mmap] = []
        with self._lock:
            for memory_id in memory_ids:
                memory = self._by_id.pop(memory_id, None)
                if memory is None:
                    continue
                for fd_number, bound in list(self._by_fd.items()):
                    kept = [entry for entry in bound if entry[0] != memory_id]
                    if kept:
                        self._by_fd[fd_number] = kept
                    else:
                        del self._by_fd[fd_number]
                memory.holders -= 1
                if memory.holders == 0 and memory.users == 0:
                    closing.append(memory.mapping)
        for mapping in closing:
            _close_mapping(mapping)

    def acquire(self, memory_id: int) -> _Memory | None:
        """The memory ``memory_id`` names, for one call (:meth:`release` it after); None
        when this child holds no such memory."""
        with self._lock:
            memory = self._by_id.get(memory_id)
            if memory is None:
                return None
            memory.users += 1
            return memory

    def acquire_all(self, memory_ids: Iterable[int]) -> dict[int, _Memory] | int:
        """The memories of every id, acquired at once (:meth:`release` each); or the
        first id this child does not hold (nothing is then acquired)."""
        acquired: dict[int, _Memory] = {}
        with self._lock:
            for memory_id in memory_ids:
                if memory_id in acquired:
                    continue
                memory = self._by_id.get(memory_id)
                if memory is None:
                    for taken in acquired.values():
                        taken.users -= 1
                    return memory_id
                memory.users += 1
                acquired[memory_id] = memory
        return acquired

    def release(self, memory: _Memory) -> None:
        """A call is done with ``memory``: its mapping closes with its last user once no
        id names it any more (dropped while calls used it)."""
        with self._lock:
            memory.users -= 1
            if memory.users or memory.holders:
                return
        _close_mapping(memory.mapping)

    def acquire_by_fd(self, fd_number: int) -> tuple[_Memory, int, int] | None:
        """(memory, offset, length) of the newest MEM_MAP made through ``fd_number``,
        acquired as by :meth:`acquire` (:meth:`release` it); None when there is none."""
        with self._lock:
            bound = self._by_fd.get(fd_number)
            if not bound:
                return None
            memory_id, offset, length = bound[-1]
            memory = self._by_id.get(memory_id)
            if memory is None:  # bound and dropped together: never, but never a crash
                return None
            memory.users += 1
            return memory, offset, length

    def find_by_fd(self, fd_number: int) -> tuple[int, int, int] | None:
        """(id, offset, length) of the newest MEM_MAP made through ``fd_number``."""
        with self._lock:
            bound = self._by_fd.get(fd_number)
            return bound[-1] if bound else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _close_mapping(mapping: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # skel code still holds a view: it goes with it
        mapping.close()


class _Current(threading.local):
    call: _Call | None = None


_current = _Current()


class _Call:
    """One call running in this child: its id and the answers the driver sent it."""

    __slots__ = ("answers", "id", "jobs", "memories", "runtime")

    def __init__(self, runtime: ChildRuntime, call_id: int) -> None:
        self.id = call_id
        self.runtime = runtime
        self.answers: collections.deque[Answer] = collections.deque()
        self.memories: dict[int, _Memory] | int = {}
        """An invoke's memories, acquired when it was read (in order with the table
        changes around it); or the id of one the child did not hold then."""
        self.jobs = 0  # pieces of work begun (SkelCall.computing)

    def send(
        self,
        message: msgspec.Struct,
        tail: Sequence[bytes | bytearray | memoryview] = (),
    ) -> None:
        self.runtime.send(message, tail)

    def work(self, seconds: float) -> None:
        """SkelCall.work: the driver spends it on the channel's shared compute."""
        self.send(wire.Work(self.id, max(0.0, seconds)))
        answer, received, buffer = self.runtime.answer(self)
        received.close_fds()
        self.runtime.give_back(buffer)
        if not isinstance(answer, wire.WorkDone):
            raise _DriverGoneError

    def begin(self, matrix: bool, started: float | None = None) -> int:
        """ComputeMeter.begin: the driver's thread for this call joins the piece to the
        shared compute (from ``started`` on, when given); no answer."""
        self.jobs += 1
        self.send(wire.WorkBegin(self.id, self.jobs, matrix, started or 0.0))
        return self.jobs

    def end(self, job: int, seconds: float) -> None:
        """ComputeMeter.end: the driver waits until the model credited the piece."""
        self.send(wire.Work(self.id, max(0.0, seconds), job))
        answer, received, buffer = self.runtime.answer(self)
        received.close_fds()
        self.runtime.give_back(buffer)
        if not isinstance(answer, wire.WorkDone):
            raise _DriverGoneError

    def read_host_file(self, name: str, *, limit: int) -> bytes:
        """host_files.read_host_file: read by the driver through reverse RPC."""
        self.send(wire.ReadFile(self.id, name, limit))
        answer, received, buffer = self.runtime.answer(self)
        try:
            if isinstance(answer, wire.FileFailed):
                raise HostFileError(answer.message, answer.code)
            if not isinstance(answer, wire.FileData):
                raise _DriverGoneError
            if not answer.in_memfd:
                return bytes(received.tail[: answer.size])
            if len(received.fds) != 1:
                raise _DriverGoneError
            if answer.size == 0:
                return b""
            fd = received.fds[0]
            with mmap.mmap(fd, answer.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as data:
                return bytes(data)
        finally:
            received.close_fds()
            self.runtime.give_back(buffer)

    def log(self, record: logging.LogRecord) -> None:
        self.send(_log_message(self.id, record))


def _log_message(call_id: int, record: logging.LogRecord) -> wire.Log:
    fields: dict[str, wire.Field] = {}
    for key, value in record.__dict__.items():
        if key in _STANDARD_RECORD or len(fields) >= 32 or len(key) > 64:
            continue
        if value is None or isinstance(value, bool | int | float):
            fields[key] = value
        else:
            fields[key] = str(value)[:4096]
    message = record.getMessage()
    if record.exc_info:
        message += "\n" + "".join(traceback.format_exception(*record.exc_info))
    return wire.Log(call_id, record.name[:200], record.levelno, message[:4096], fields)


class _ForwardHandler(logging.Handler):
    """Log records of skel code go to the driver with the id of their call; those of
    the PD's own threads (a queue's worker) without one, when the socket takes them."""

    def emit(self, record: logging.LogRecord) -> None:
        call = _current.call
        if call is not None:
            with contextlib.suppress(_DriverGoneError):
                call.log(record)
            return
        runtime = _runtime
        if runtime is not None:
            runtime.send_unattached(_log_message(wire.NO_CALL, record))


Job = tuple[_Call, wire.CallMessage, wire.Received, bytearray]
"""A call to run: the call, its message, what came with it and the buffer that holds it."""
Answer = tuple[wire.NestedReply, wire.Received, bytearray]
"""The driver's answer to what a call asked, and the buffer that holds it."""


def _fatal(what: str) -> NoReturn:
    """The driver broke the wire (a bug in npud): this PD ends."""
    print(f"PD child {os.getpid()}: {what}", file=sys.stderr, flush=True)
    os._exit(CRASH_EXIT)


class _Thread:
    """A worker thread of the child: idle, reading the socket, or running a call."""

    __slots__ = ("job", "number")

    def __init__(self, number: int) -> None:
        self.number = number
        self.job: Job | None = None


class ChildRuntime:
    """The child's tables and threads; see the module docstring.

    The threads take turns at reading the socket (leader and followers). An idle
    worker reads when no thread does, and runs the call it receives itself,
    without handing the socket on: while a PD has one call at a time, the thread
    that received a call runs it and the one that finished it reads next. A call's
    thread waiting for the driver's answer reads when no thread does. Whatever the
    driver sends while calls run comes with a ring of the doorbell: the doorbell's
    thread then reads what is waiting, handing calls to idle workers (or new ones);
    when a thread was reading at the ring, that thread reads what is waiting before
    it leaves the socket (the message may have come after its last read)."""

    def __init__(self, sock: socket.socket, doorbell: socket.socket) -> None:
        self._sock = sock
        self._doorbell = doorbell
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._idle_cond = threading.Condition(self._lock)  # idle workers wait here
        self._answer_cond = threading.Condition(self._lock)  # calls waiting for answers
        self._reading = False
        self._missed = False  # the doorbell rang while another thread read the socket
        self._calls: dict[int, _Call] = {}
        self._idle: list[_Thread] = []
        self._threads = 0
        self._buffers: list[bytearray] = []
        self._skels: dict[int, Skel] = {}
        self.memory = MemoryTable()
        self.pd = PdServices(self._resolve_fd, self._crash_thread)

    # -- plumbing ------------------------------------------------------------------------

    def send(
        self, message: msgspec.Struct, tail: Sequence[bytes | bytearray | memoryview] = ()
    ) -> None:
        try:
            with self._send_lock:
                wire.send(self._sock, message, tail)
        except wire.ClosedError:
            raise _DriverGoneError from None

    def send_unattached(self, message: msgspec.Struct) -> None:
        """Send what belongs to no call, if the socket takes it at once (nobody may read
        it until the next call); dropped otherwise."""
        with contextlib.suppress(BlockingIOError, wire.ClosedError), self._send_lock:
            wire.send(self._sock, message, wait=False)

    def _resolve_fd(self, fd: int) -> FdMemory | None:
        """PdServices.map_fd: the newest MEM_MAP bound to fd number ``fd``, acquired."""
        found = self.memory.acquire_by_fd(fd)
        if found is None:
            return None
        memory, offset, length = found

        def release() -> None:
            self.memory.release(memory)

        return FdMemory(fd, memoryview(memory.mapping), offset, length, release)

    def _crash_thread(self, text: str) -> NoReturn:
        """A thread of the PD's own raised (PdServices logged it): the PD crashes."""
        os._exit(CRASH_EXIT)

    def give_back(self, buffer: bytearray) -> None:
        with self._lock:
            self._buffers.append(buffer)

    def _take_buffer(self) -> bytearray:
        with self._lock:
            return self._buffers.pop() if self._buffers else bytearray(wire.MESSAGE_MAX)

    def _give_job(self, job: Job) -> None:
        """Under the lock: an idle worker runs ``job`` (a new one when none is idle)."""
        if self._idle:
            self._idle.pop().job = job
            self._idle_cond.notify_all()
            return
        self._threads += 1
        worker = _Thread(self._threads)
        worker.job = job
        threading.Thread(
            target=self._work, args=(worker,), name=f"pd-{worker.number}", daemon=True
        ).start()

    def _leave(self, *, for_a_call: bool = False) -> None:
        """As the reader, give the socket up; but first read, without waiting, whatever
        came with a ring of the doorbell that the doorbell's thread skipped because this
        thread was reading (the message may have arrived after this thread's last read,
        and no one else would read it)."""
        while True:
            with self._lock:
                if not self._missed:
                    self._stop_reading(for_a_call=for_a_call)
                    return
                self._missed = False
            while (read := self._next(wait=False)) is not None:
                job = self._dispatch(*read)
                if job is not None:
                    with self._lock:
                        self._give_job(job)

    def _stop_reading(self, *, for_a_call: bool = False) -> None:
        """Under the lock: give the socket up. Calls waiting for answers may read now;
        so may an idle worker, unless this thread stops to run a call it received (then
        the doorbell covers what comes meanwhile, and the thread reads again after)."""
        self._reading = False
        self._answer_cond.notify_all()
        if not for_a_call:
            self._idle_cond.notify()

    # -- reading -------------------------------------------------------------------------

    def _next(self, *, wait: bool) -> tuple[wire.DriverMessage, wire.Received, bytearray] | None:
        """As the reader: the next message (None when ``wait`` is False and none is there)."""
        buffer = self._take_buffer()
        try:
            if wait:
                received: wire.Received | None = wire.receive(self._sock, buffer)
            else:
                received = wire.receive_pending(self._sock, buffer)
        except wire.ClosedError:
            os._exit(0)  # the driver ended this PD (or npud is gone)
        except wire.WireError as exc:
            _fatal(str(exc))
        if received is None:
            self.give_back(buffer)
            return None
        try:
            message = _DECODER.decode(received.header)
        except msgspec.DecodeError as exc:
            _fatal(f"not a message of the driver: {exc}")
        return message, received, buffer

    def _dispatch(
        self, message: wire.DriverMessage, received: wire.Received, buffer: bytearray
    ) -> Job | None:
        """What the reader does with a message that is not for itself: an answer goes to
        its call, a table change is applied; a call is returned."""
        if isinstance(message, wire.WorkDone | wire.FileData | wire.FileFailed):
            with self._lock:
                call = self._calls.get(message.call)
                if call is None:
                    _fatal(f"an answer for call {message.call}, which is not running")
                call.answers.append((message, received, buffer))
                self._answer_cond.notify_all()
            return None
        if isinstance(message, wire.Create | wire.Invoke | wire.Destroy):
            call = _Call(self, message.call)
            if isinstance(message, wire.Invoke):
                # Now, by the reader, not later by the worker that runs it: a DropMemory
                # read after the invoke (its buffer unmapped meanwhile) must not pull a
                # memory away before the call holds it.
                call.memories = self.memory.acquire_all(_named_memories(message))
            with self._lock:
                self._calls[message.call] = call
            return (call, message, received, buffer)
        self._apply(message, received.fds)
        self.give_back(buffer)
        return None

    def answer(self, call: _Call) -> Answer:
        """The driver's next answer to ``call``: delivered by the reader, or read here."""
        with self._lock:
            while not call.answers:
                if not self._reading:
                    self._reading = True
                    break
                self._answer_cond.wait()
            else:
                return call.answers.popleft()
        try:
            while True:
                message, received, buffer = self._next(wait=True)  # type: ignore[misc]
                if (
                    isinstance(message, wire.WorkDone | wire.FileData | wire.FileFailed)
                    and message.call == call.id
                ):
                    return message, received, buffer
                job = self._dispatch(message, received, buffer)
                if job is not None:
                    with self._lock:
                        self._give_job(job)  # this thread is busy with its own call
        finally:
            self._leave()

    def _work(self, me: _Thread) -> None:
        """A worker: run the job it was given, or read when no one does and run the call
        it receives (keeping no one on the socket meanwhile: the doorbell covers what the
        driver sends while it runs); then again."""
        while True:
            with self._lock:
                job, me.job = me.job, None
                while job is None and self._reading:
                    self._idle.append(me)
                    self._idle_cond.wait()
                    if me in self._idle:
                        self._idle.remove(me)
                    job, me.job = me.job, None
                reader = job is None
                if reader:
                    self._reading = True
            if reader:
                try:
                    while job is None:
                        message, received, buffer = self._next(wait=True)  # type: ignore[misc]
                        job = self._dispatch(message, received, buffer)
                finally:
                    self._leave(for_a_call=True)
            assert job is not None
            self.run_call(*job)

    def _ring(self) -> None:
        """The doorbell's thread: after each ring, read what is waiting if no one reads."""
        while True:
            try:
                rang = self._doorbell.recv(64)
            except OSError:
                rang = b""
            if not rang:
                os._exit(0)  # the driver is gone
            with self._lock:
                if self._reading:
                    self._missed = True  # the reader reads what came before it leaves
                    continue
                self._reading = True
            try:
                while (read := self._next(wait=False)) is not None:
                    job = self._dispatch(*read)
                    if job is not None:
                        with self._lock:
                            self._give_job(job)
            finally:
                with self._lock:
                    self._stop_reading()

    def run(self) -> NoReturn:
        pidfd = os.pidfd_open(os.getpid())
        try:
            wire.send(self._sock, wire.Hello(os.getpid()), fds=[pidfd])
        finally:
            os.close(pidfd)
        threading.Thread(target=self._ring, name="pd-doorbell", daemon=True).start()
        self._threads = 1
        self._work(_Thread(1))
        os._exit(0)

    def _apply(self, message: wire.TableMessage, fds: list[int]) -> None:
        expected = 0 if isinstance(message, wire.DropMemory | wire.BindAlias) else 1
        if len(fds) != expected:
            _fatal(f"{type(message).__name__} with {len(fds)} fds")
        if isinstance(message, wire.AddMemory):
            self.memory.add(message.id, fds[0], message.size)
        elif isinstance(message, wire.BindFd):
            self.memory.add(message.id, fds[0], message.size)
            self.memory.bind(message.id, message.fd, message.offset, message.length)
        elif isinstance(message, wire.BindAlias):
            self.memory.alias(
                message.id, message.target, message.fd, message.offset, message.length
            )
        else:
            self.memory.drop(message.ids)

    # -- running a call ----------------------------------------------------------------------

    def run_call(
        self, call: _Call, message: wire.CallMessage, received: wire.Received, buffer: bytearray
    ) -> None:
        _current.call = call
        try:
            self._serve(call, message, received)
        except _DriverGoneError:
            os._exit(0)  # the driver is gone: so is this PD
        except BaseException:
            self._crash(call)
        finally:
            _current.call = None
            received.close_fds()
            with self._lock:
                self._calls.pop(call.id, None)
                self._buffers.append(buffer)

    def _crash(self, call: _Call) -> NoReturn:
        """Skel code raised: the PD crashes, as an exception on the DSP ends the process."""
        text = traceback.format_exc()
        with contextlib.suppress(_DriverGoneError):
            call.send(
                wire.Log(call.id, "npud.sim.pd", logging.ERROR, f"PD crash: {text}"[:4096], {})
            )
        os._exit(CRASH_EXIT)

    def _serve(self, call: _Call, message: wire.CallMessage, received: wire.Received) -> None:
        if isinstance(message, wire.Invoke):
            self._invoke(call, message, received)
        elif isinstance(message, wire.Create):
            call.send(wire.Created(call.id, self._create(message)))
        else:
            with self._lock:
                skel = self._skels.pop(message.instance, None)
            if skel is not None:
                skel.close()
            call.send(wire.Destroyed(call.id))

    def _create(self, message: wire.Create) -> str:
        try:
            factory: Callable[[], Skel] = pickle.loads(message.factory)  # noqa: S301 - from npud
            skel = factory()
        except MemoryError:
            raise  # past the PD's memory limit: run_call ends the PD
        except Exception as exc:
            return f"skel {message.name!r} cannot be made in the PD process: {exc!r}"
        with self._lock:
            self._skels[message.instance] = skel
        return ""

    def _invoke(self, call: _Call, message: wire.Invoke, received: wire.Received) -> None:
        if len(received.fds) != len(message.transient):
            _fatal("an invoke whose fds do not match its memories")
        transient: dict[int, mmap.mmap] = {}
        acquired = call.memories if isinstance(call.memories, dict) else {}
        views: list[memoryview] = []
        try:
            if isinstance(call.memories, int):
                # A memory this PD does not hold (never mapped, or unmapped before the
                # call came): the caller's bad reference, as on the DSP an error code
                # for it, never the end of the process.
                logging.getLogger("npud.sim.pd").warning(
                    "invoke names memory %d, which this DSP process does not hold",
                    call.memories,
                )
                call.send(wire.Result(call.id, AEE.EBADPARM.dsp))
                return
            for memory, fd in zip(message.transient, received.fds, strict=True):
                transient[memory.id] = _map(fd, memory.size)
            received.close_fds()

            def view(span: wire.Span) -> memoryview:
                if span.memory == wire.INLINE:
                    whole = received.tail
                elif span.memory in transient:
                    whole = memoryview(transient[span.memory])
                    views.append(whole)
                else:
                    whole = memoryview(acquired[span.memory].mapping)
                    views.append(whole)
                part = whole[span.offset : span.offset + span.length]
                views.append(part)
                return part

            inputs = [view(span).toreadonly() for span in message.inputs]
            views.extend(inputs)
            outputs = [view(span) for span in message.outputs]
            if message.crash:
                os.kill(os.getpid(), signal.SIGKILL)  # fault injection: the PD dies mid-call
            skel = self._skels.get(message.instance)
            if skel is None:
                result = AEE.EINVHANDLE.dsp
            else:
                skel_call = SkelCall(
                    message.sc,
                    inputs,
                    outputs,
                    call.work,
                    call,
                    pd=self.pd,
                    meter=call if message.metered else None,
                )
                result = run_method(skel, message.method_offset, skel_call)
            tail = [
                out
                for out, span in zip(outputs, message.outputs, strict=True)
                if span.memory == wire.INLINE
            ]
            call.send(wire.Result(call.id, result & 0xFFFFFFFF), tail)
        finally:
            for part in reversed(views):
                try:  # noqa: SIM105 - no context manager per view on every call
                    part.release()
                except BufferError:  # skel code kept an export: it goes with its object
                    pass
            for held in acquired.values():
                self.memory.release(held)
            call.memories = {}
            for mapping in transient.values():
                _close_mapping(mapping)


def _named_memories(message: wire.Invoke) -> list[int]:
    """The table's memories an invoke names (not its tail, not its transient ones)."""
    transient = {memory.id for memory in message.transient}
    return [
        span.memory
        for span in (*message.inputs, *message.outputs)
        if span.memory != wire.INLINE and span.memory not in transient
    ]


_runtime: ChildRuntime | None = None


def current_runtime() -> ChildRuntime | None:
    """The runtime of this PD child (None outside one): what DSP-side code reaches, e.g.
    :meth:`MemoryTable.find_by_fd` for a buffer the host MEM_MAP'd."""
    return _runtime


def _memory_exhausted(args: threading.ExceptHookArgs) -> None:
    """A thread of the child ran out of memory (past its RLIMIT_DATA, the zygote's
    ``memory_limit``): the PD ends as a crashed PD does, whatever thread it was; another
    exception is reported as Python reports it."""
    if issubclass(args.exc_type, MemoryError):
        print(f"PD child {os.getpid()}: out of memory", file=sys.stderr, flush=True)
        os._exit(CRASH_EXIT)
    threading.__excepthook__(args)


def serve(sock_fd: int, doorbell_fd: int) -> NoReturn:
    """Run the child on its socket and doorbell; never returns."""
    global _runtime  # noqa: PLW0603 - one runtime per child process, set once
    threading.excepthook = _memory_exhausted
    root = logging.getLogger()
    root.handlers[:] = [_ForwardHandler()]
    root.setLevel(LOG_LEVEL)
    _runtime = ChildRuntime(socket.socket(fileno=sock_fd), socket.socket(fileno=doorbell_fd))
    _runtime.run()
