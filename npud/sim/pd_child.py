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

The table of memories is :mod:`npud.sim.pd_memories`'s, a running call (what skel
code reaches the driver through) :mod:`npud.sim.pd_call`'s; this module holds the
runtime: the socket, the threads, the skels and the calls' dispatch.
"""

from __future__ import annotations

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
from collections.abc import Callable, Sequence
from typing import Final, NoReturn

import msgspec

from npu_protocol.aee import AEE
from npud.sim import pd_wire as wire
from npud.sim.pd_call import Answer, Call, DriverGoneError, current, log_message
from npud.sim.pd_memories import MemoryTable, close_mapping, map_shared
from npud.sim.pd_services import FdMemory, PdServices
from npud.sim.skels import Skel, SkelCall, run_method

__all__ = [
    "CRASH_EXIT",
    "LOG_LEVEL",
    "ChildRuntime",
    "Job",
    "MemoryTable",
    "current_runtime",
    "serve",
]

CRASH_EXIT: Final = 70
"""The exit status of a child whose skel code raised: a PD crash."""
LOG_LEVEL: Final = logging.INFO
_DECODER: Final = msgspec.msgpack.Decoder(wire.DriverMessage)


class _ForwardHandler(logging.Handler):
    """Log records of skel code go to the driver with the id of their call; those of
    the PD's own threads (a queue's worker) without one, when the socket takes them."""

    def emit(self, record: logging.LogRecord) -> None:
        call = current.call
        if call is not None:
            with contextlib.suppress(DriverGoneError):
                call.log(record)
            return
        runtime = _runtime
        if runtime is not None:
            runtime.send_unattached(log_message(wire.NO_CALL, record))


Job = tuple[Call, wire.CallMessage, wire.Received, bytearray]
"""A call to run: the call, its message, what came with it and the buffer that holds it."""


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
        self._calls: dict[int, Call] = {}
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
            raise DriverGoneError from None

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
            call = Call(self, message.call)
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

    def answer(self, call: Call) -> Answer:
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
        self, call: Call, message: wire.CallMessage, received: wire.Received, buffer: bytearray
    ) -> None:
        current.call = call
        try:
            self._serve(call, message, received)
        except DriverGoneError:
            os._exit(0)  # the driver is gone: so is this PD
        except BaseException:
            self._crash(call)
        finally:
            current.call = None
            received.close_fds()
            with self._lock:
                self._calls.pop(call.id, None)
                self._buffers.append(buffer)

    def _crash(self, call: Call) -> NoReturn:
        """Skel code raised: the PD crashes, as an exception on the DSP ends the process."""
        text = traceback.format_exc()
        with contextlib.suppress(DriverGoneError):
            call.send(
                wire.Log(call.id, "npud.sim.pd", logging.ERROR, f"PD crash: {text}"[:4096], {})
            )
        os._exit(CRASH_EXIT)

    def _serve(self, call: Call, message: wire.CallMessage, received: wire.Received) -> None:
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

    def _invoke(self, call: Call, message: wire.Invoke, received: wire.Received) -> None:
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
                transient[memory.id] = map_shared(fd, memory.size)
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
            reported: float | None = None
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
                reported = skel_call.reported_dsp_seconds
            tail = [
                out
                for out, span in zip(outputs, message.outputs, strict=True)
                if span.memory == wire.INLINE
            ]
            call.send(wire.Result(call.id, result & 0xFFFFFFFF, reported), tail)
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
                close_mapping(mapping)


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
