"""One call running in a PD child, as skel code reaches the driver through it while it
runs (``SkelCall.work``, the compute meter, host files, log records), and the error
that unwinds it when the driver goes (npud.sim.pd_child runs the child)."""

from __future__ import annotations

import collections
import logging
import mmap
import threading
import traceback
from collections.abc import Sequence
from typing import Final, Protocol

import msgspec

from npud.sim import pd_wire as wire
from npud.sim.pd_memories import Memory
from npud.sim.skels import HostFileError

STANDARD_RECORD: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


Answer = tuple[wire.NestedReply, wire.Received, bytearray]
"""The driver's answer to what a call asked, and the buffer that holds it."""


class Runtime(Protocol):
    """What a call needs of its child's runtime (npud.sim.pd_child.ChildRuntime)."""

    def send(
        self, message: msgspec.Struct, tail: Sequence[bytes | bytearray | memoryview] = ()
    ) -> None: ...

    def answer(self, call: Call) -> Answer:
        """The driver's next answer to ``call``."""
        ...

    def give_back(self, buffer: bytearray) -> None:
        """A received message's buffer, for the next message."""
        ...


class DriverGoneError(BaseException):
    """The driver closed the socket while a call ran: the PD is ending; unwind the call.

    A BaseException, so that skel code catching Exception does not swallow it."""


class Current(threading.local):
    call: Call | None = None


current = Current()


class Call:
    """One call running in this child: its id and the answers the driver sent it."""

    __slots__ = ("answers", "id", "jobs", "memories", "runtime")

    def __init__(self, runtime: Runtime, call_id: int) -> None:
        self.id = call_id
        self.runtime = runtime
        self.answers: collections.deque[Answer] = collections.deque()
        self.memories: dict[int, Memory] | int = {}
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
            raise DriverGoneError

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
            raise DriverGoneError

    def read_host_file(self, name: str, *, limit: int) -> bytes:
        """host_files.read_host_file: read by the driver through reverse RPC."""
        self.send(wire.ReadFile(self.id, name, limit))
        answer, received, buffer = self.runtime.answer(self)
        try:
            if isinstance(answer, wire.FileFailed):
                raise HostFileError(answer.message, answer.code)
            if not isinstance(answer, wire.FileData):
                raise DriverGoneError
            if not answer.in_memfd:
                return bytes(received.tail[: answer.size])
            if len(received.fds) != 1:
                raise DriverGoneError
            if answer.size == 0:
                return b""
            fd = received.fds[0]
            with mmap.mmap(fd, answer.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as data:
                return bytes(data)
        finally:
            received.close_fds()
            self.runtime.give_back(buffer)

    def log(self, record: logging.LogRecord) -> None:
        self.send(log_message(self.id, record))


def log_message(call_id: int, record: logging.LogRecord) -> wire.Log:
    fields: dict[str, wire.Field] = {}
    for key, value in record.__dict__.items():
        if key in STANDARD_RECORD or len(fields) >= 32 or len(key) > 64:
            continue
        if value is None or isinstance(value, bool | int | float):
            fields[key] = value
        else:
            fields[key] = str(value)[:4096]
    message = record.getMessage()
    if record.exc_info:
        message += "\n" + "".join(traceback.format_exception(*record.exc_info))
    return wire.Log(call_id, record.name[:200], record.levelno, message[:4096], fields)
