"""The wire between the emulated driver (npud's process) and a PD child process.

Each link is a ``SOCK_SEQPACKET`` Unix socket pair: one ``sendmsg`` is one
message, received whole by one ``recvmsg``, with its fds (SCM_RIGHTS). A
message is::

    u32 header length | header (msgpack, one tagged msgspec Struct) | tail bytes

The tail carries raw bytes without a copy into the header: a call's inline
payload one way, its inline outputs the other. Large data never travels in a
message: it goes in a memfd whose fd the message carries.

Two links (docs/emulator.md, "PD processes"):

* the zygote's control socket: ``Spawn`` (with the new child's socket) from
  the driver, ``Ready`` once from the zygote;
* a child's socket, one per PD: ``Hello`` (with the child's pidfd) once from
  the child; then, from the driver, changes to the child's table of memories
  (``AddMemory``, ``BindFd``, ``BindAlias``, ``DropMemory``), applied in order,
  and calls (``Create``, ``Invoke``, ``Destroy``), each with an id. Calls run
  at once in the child, each on a thread of its own; while one runs, the
  child may ask for ``Work`` and ``ReadFile`` and send ``Log``, all with the
  call's id, and the driver answers (``WorkDone``, ``FileData``,
  ``FileFailed``); the call ends with its answer (``Created``, ``Result``,
  ``Destroyed``). Messages of different calls interleave freely;
* a child's doorbell, one per PD: one byte from the driver after anything it
  sent while calls of the PD were running. The child's threads read the
  socket in turns, and a thread that runs a call does not read: the doorbell
  wakes one that reads what came (a second call, a memory gone), so that the
  usual call, alone on its PD, needs no thread of the child but the one that
  received it.

The child is not trusted: what it sends is decoded into these types only
(msgspec, bounded sizes), never unpickled; anything else ends it. The driver
is trusted by the child: ``Create.factory`` is a pickle.
"""

from __future__ import annotations

import array
import contextlib
import errno
import os
import socket
import struct
from collections.abc import Sequence
from typing import Annotated, Final

import msgspec

HEADER: Final = struct.Struct("<I")
HEADER_MAX: Final = 32 * 1024
"""The largest header: an invoke names at most 255 buffers."""
INLINE_MAX: Final = 64 * 1024
"""A call's plain payload (and its outputs) travel in the message up to this size;
above it the payload is a memfd both sides map."""
MESSAGE_MAX: Final = HEADER.size + HEADER_MAX + INLINE_MAX
MAX_FDS: Final = 64
"""Fds one message may carry (SCM_MAX_FD is 253)."""
INLINE: Final = -1
"""``Span.memory`` for bytes of the message's tail."""
NO_CALL: Final = 0
"""``Log.call`` of a record logged outside any call (a thread of the PD's own); call ids
start at 1."""

_FD_SIZE: Final = array.array("i").itemsize
_GONE: Final = (errno.EBADF, errno.ENOTCONN, errno.EPIPE, errno.ECONNRESET)
"""What a send or receive fails with once either end is closed or shut down."""
_ANCILLARY: Final = socket.CMSG_SPACE(MAX_FDS * _FD_SIZE)
_TRUNCATED: Final = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)

Text = Annotated[str, msgspec.Meta(max_length=4096)]
Count = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=86400.0)]
Field = Text | int | float | bool | None
FieldName = Annotated[str, msgspec.Meta(max_length=64)]
Fields = Annotated[dict[FieldName, Field], msgspec.Meta(max_length=32)]


# -- the zygote's control socket ----------------------------------------------------------


class Spawn(msgspec.Struct, tag="spawn"):
    """Fork a child; the message carries the child's ends of its socket and doorbell."""

    memory_limit: int = 0
    """The child's RLIMIT_DATA in bytes, set before it serves (0: none)."""


class Ready(msgspec.Struct, tag="ready"):
    """The zygote is set up: privileges dropped, modules preloaded."""

    pid: int
    sandbox: str
    """What confines the children, for the log (uid, capabilities, Landlock)."""


# -- a child's socket: the table of memories ------------------------------------------------


class Hello(msgspec.Struct, tag="hello"):
    """The child's first message; it carries a pidfd of the child (pidfd_open of itself)."""

    pid: int


class AddMemory(msgspec.Struct, tag="add"):
    """Map ``size`` bytes of the buffer the message carries as memory ``id``."""

    id: int
    size: int


class BindFd(msgspec.Struct, tag="bind"):
    """A MEM_MAP: the buffer the message carries, memory ``id``, is what the DSP
    knows by fd number ``fd`` (bytes ``offset..offset+length``)."""

    id: int
    size: int
    fd: int
    offset: int
    length: int


class BindAlias(msgspec.Struct, tag="alias"):
    """A MEM_MAP that an old kernel resolved by fd number to the memory of ``target``."""

    id: int
    target: int
    fd: int
    offset: int
    length: int


class DropMemory(msgspec.Struct, tag="drop"):
    """These memories are gone (MEM_UNMAP, or the caller's mapping of a buffer ended)."""

    ids: list[int]


TableMessage = AddMemory | BindFd | BindAlias | DropMemory


# -- calls: the driver's side ------------------------------------------------------------------


class Span(msgspec.Struct, array_like=True):
    """Where a buffer's bytes are: ``memory`` (an id, or INLINE for the tail) and a range."""

    memory: int
    offset: int
    length: int


class Create(msgspec.Struct, tag="create"):
    """Make skel instance ``instance`` by calling the pickled factory."""

    call: int
    instance: int
    name: str
    factory: bytes


class Invoke(msgspec.Struct, tag="invoke"):
    """Run method ``sc`` of ``instance``. ``transient`` memories (fds in the message,
    in order) live for this call only; ``crash``: die in the middle (fault injection)."""

    call: int
    instance: int
    method_offset: int
    sc: int
    inputs: list[Span]
    outputs: list[Span]
    transient: list[AddMemory]
    crash: bool = False
    metered: bool = False
    """The emulator models the DSP's shared compute: the call may begin and end work
    (``WorkBegin``, ``Work`` with a job) for what it computes on the host."""


class Destroy(msgspec.Struct, tag="destroy"):
    """Close skel instance ``instance`` (remotectl close)."""

    call: int
    instance: int


class WorkDone(msgspec.Struct, tag="worked"):
    call: int


class FileData(msgspec.Struct, tag="data"):
    """The file's bytes: the tail, or (``in_memfd``) a sealed memfd the message carries."""

    call: int
    size: int
    in_memfd: bool


class FileFailed(msgspec.Struct, tag="nofile"):
    call: int
    code: int
    message: str


CallMessage = Create | Invoke | Destroy
NestedReply = WorkDone | FileData | FileFailed
DriverMessage = TableMessage | CallMessage | NestedReply


# -- calls: the child's side ---------------------------------------------------------------------


class Work(msgspec.Struct, tag="work"):
    """SkelCall.work: spend ``seconds`` of the DSP's shared compute; with ``job`` (not 0),
    the end of that begun piece, which took ``seconds`` on the host (SkelCall.computing)."""

    call: int
    seconds: Annotated[float, msgspec.Meta(ge=0, le=1e6)]
    job: U32 = 0


class WorkBegin(msgspec.Struct, tag="workbegin"):
    """A piece of work ``job`` (1..) of a metered call starts (no answer); ``matrix``:
    it needs the HMX unit. Its ``Work`` with the same ``job`` ends it."""

    call: int
    job: Annotated[int, msgspec.Meta(ge=1, le=0xFFFFFFFF)]
    matrix: bool
    started: float = 0.0
    """The child's ``time.monotonic()`` (the host's CLOCK_MONOTONIC, one clock for
    every process) when the piece began; 0: when this message is read."""


class ReadFile(msgspec.Struct, tag="read"):
    """host_files.read_host_file: the driver's waiting thread reads it through reverse RPC."""

    call: int
    name: Text
    limit: Count


class Log(msgspec.Struct, tag="log"):
    """A log record of skel code (the DSP's FARF), re-emitted by the driver; ``call`` is
    NO_CALL for one logged by a thread of the PD outside any call (sent only when the
    socket takes it at once, and read by whichever thread of the driver reads next)."""

    call: int
    logger: Annotated[str, msgspec.Meta(max_length=200)]
    level: Annotated[int, msgspec.Meta(ge=0, le=100)]
    message: Text
    fields: Fields


class Result(msgspec.Struct, tag="result"):
    """The method's AEE result; the tail holds the inline outputs, in order.
    ``dsp_seconds``: the DSP time the method reported (``SkelCall.report_dsp_seconds``)."""

    call: int
    result: U32
    dsp_seconds: Seconds | None = None


class Created(msgspec.Struct, tag="created"):
    call: int
    error: Text = ""


class Destroyed(msgspec.Struct, tag="destroyed"):
    call: int


CallAnswer = Work | WorkBegin | ReadFile | Log | Result | Created | Destroyed
ChildMessage = Hello | CallAnswer


class WireError(Exception):
    """The peer sent something that is not a message of this wire (or too many fds)."""


class ClosedError(Exception):
    """The peer's end is closed (or was shut down)."""


_ENCODER: Final = msgspec.msgpack.Encoder()


def send(
    sock: socket.socket,
    message: msgspec.Struct,
    tail: Sequence[bytes | bytearray | memoryview] = (),
    fds: Sequence[int] = (),
    *,
    wait: bool = True,
) -> None:
    """One message; the fds are duplicated into the peer (the caller keeps its own).

    ClosedError when the peer is gone; without ``wait``, BlockingIOError when the
    socket cannot take it at once."""
    header = _ENCODER.encode(message)
    if len(header) > HEADER_MAX:
        raise WireError(f"a {type(message).__name__} header of {len(header)} bytes")
    parts: list[bytes | bytearray | memoryview] = [HEADER.pack(len(header)), header, *tail]
    ancillary = []
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    try:
        sock.sendmsg(parts, ancillary, 0 if wait else socket.MSG_DONTWAIT)
    except BlockingIOError:
        raise
    except OSError as exc:
        if exc.errno in _GONE:
            raise ClosedError(str(exc)) from None
        raise


class Received:
    """One received message: its header, its tail (a view of the receive buffer, valid
    until the next receive into it) and the fds it carried (the receiver owns them)."""

    __slots__ = ("fds", "header", "tail")

    def __init__(self, header: memoryview, tail: memoryview, fds: list[int]) -> None:
        self.header = header
        self.tail = tail
        self.fds = fds

    def close_fds(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            _close_quietly(fd)


def receive(sock: socket.socket, buffer: bytearray) -> Received:
    """One message into ``buffer``, waiting for it. ClosedError at the end; WireError
    (its fds closed) for a truncated message or one without a valid header."""
    return _receive(sock, buffer, 0)


def receive_pending(sock: socket.socket, buffer: bytearray) -> Received | None:
    """Like :func:`receive`, None at once when no message is waiting."""
    try:
        return _receive(sock, buffer, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None


def _receive(sock: socket.socket, buffer: bytearray, flags: int) -> Received:
    try:
        size, ancillary, flags, _ = sock.recvmsg_into([buffer], _ANCILLARY, flags)
    except BlockingIOError:
        raise  # receive_pending: nothing there
    except OSError as exc:
        if exc.errno in _GONE:
            raise ClosedError(str(exc)) from None
        raise
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _FD_SIZE
            fds.extend(array.array("i", data[:usable]))
    if size == 0 and not fds:
        raise ClosedError("end of the link")
    view = memoryview(buffer)[:size]
    if flags & _TRUNCATED or size < HEADER.size:
        for fd in fds:
            _close_quietly(fd)
        raise WireError(f"a truncated or empty message ({size} bytes, flags {flags:#x})")
    (length,) = HEADER.unpack_from(view)
    if length > min(HEADER_MAX, size - HEADER.size):
        for fd in fds:
            _close_quietly(fd)
        raise WireError(f"a header of {length} bytes in a {size}-byte message")
    end = HEADER.size + length
    return Received(view[HEADER.size : end], view[end:], fds)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def seqpacket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected SOCK_SEQPACKET pair, both ends close-on-exec."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
