"""The blocking client's connection: pipelined requests over one socket.

Requests are pipelined: any number of threads may call at once, each waits
only for its own answer. There is no reader thread. Whichever waiting caller
finds nobody reading becomes the reader: it reads one chunk from the socket
with the lock released, dispatches every complete answer under the lock, and
wakes the callers whose answers came; when its own answer is in, it hands
the reading over to a caller still waiting. A caller that gives up (its
timeout) before a byte of its request was written withdraws the request, so
its in-flight slot is not held for ever. Writes go through a separate
lock, so a caller that is sending never stops another from receiving (and
never deadlocks against a server that is busy writing to us).

The path of a call that has the connection to itself is short on purpose
(measured by ``bench/client_cost.py``): the request is built and encoded
once, written with one non-blocking send and answered by one recvmsg into a
buffer the client keeps; no thread is parked and nothing is allocated for
waiting. Parking (a lock per waiting thread) and polling (two poll objects
made once per connection) happen only when a caller must wait for another
thread or for a deadline.
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final, Generic, TypeVar

from npu_client._core import B, Call, ClientCore, EventCallback, Pending, deliver_events
from npu_client.transport import (
    ANCILLARY_SPACE,
    RECEIVE_BUFFER_SIZE,
    TransportError,
    fds_ancillary,
    parse_ancillary,
)
from npu_protocol import ErrorCode

T = TypeVar("T")

# Plain ints: the socket module's flags are IntFlag members, and ``flags & MSG_CTRUNC``
# on them runs enum code in Python on every read.
_CTRUNC: Final = int(socket.MSG_CTRUNC)
_DONTWAIT: Final = int(socket.MSG_DONTWAIT)
_CLOEXEC: Final = int(socket.MSG_CMSG_CLOEXEC)


class _Parked:
    """A thread waiting for another one (the reader, a free slot): its own lock, held
    from the start, released by whoever finds the thread's wait over."""

    __slots__ = ("_lock", "reads", "ready", "woken")

    def __init__(self, ready: Callable[[], bool], *, reads: bool) -> None:
        self.ready = ready
        self.reads = reads
        """Whether the thread would take over reading (close() only waits)."""
        self.woken = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def wake(self) -> None:
        if not self.woken:
            self.woken = True
            self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout=-1 if timeout is None else timeout)


class Pipeline(Generic[B]):
    """One socket to npud that any number of threads send requests on and wait for
    their answers (see the module docstring); the base of :class:`~npu_client.Client`,
    which adds the requests and the closing."""

    def __init__(
        self,
        sock: socket.socket,
        core: ClientCore[B],
        *,
        timeout: float | None,
        on_event: EventCallback | None,
    ) -> None:
        """Takes ownership of ``sock``."""
        self._sock = sock
        self._core = core
        self._timeout = timeout
        self._on_event = on_event
        self._lock = threading.Lock()
        """Guards the core, ``_reading`` and ``_parked``; never held while blocked."""
        self._send_lock = threading.Lock()
        """Held by the one caller writing a frame (frames must not interleave)."""
        self._reading = False
        self._parked: list[_Parked] = []
        self._closed = False
        # Used by the reader only (one at a time), reused by every read.
        self._receive_buffer = bytearray(RECEIVE_BUFFER_SIZE)
        self._received = memoryview(self._receive_buffer)
        # Made once: a deadline needs a poll, and one per call would cost one each.
        self._readable = select.poll()
        self._readable.register(sock, select.POLLIN)
        self._writable = select.poll()  # used by the send-lock holder only
        self._writable.register(sock, select.POLLOUT)

    # --- internals: one call ---------------------------------------------------------------------

    def _run(self, call: Call[T]) -> T:
        """Send ``call``'s request, wait for its answer, and return what it becomes."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        core = self._core
        lock = self._lock
        lock.acquire()
        try:
            begun = core.begin(call)
            while begun is None:  # every slot is taken: wait (reading) for one
                self._wait_until(core.can_begin, deadline)
                begun = core.begin(call)
            pending, data, fds = begun
            if data:  # empty when the connection is over: the Pending says why
                try:
                    lock.release()
                    try:
                        self._write(data, fds, deadline, pending)
                    finally:
                        lock.acquire()
                    self._wait_until(lambda: pending.done, deadline)
                except BaseException:
                    core.abandon(pending)
                    if self._parked:  # a withdrawn request freed its slot
                        self._wake(handoff=False)
                    raise
            return call.finish(pending)
        finally:
            lock.release()

    def _handshake(self) -> None:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        self._write(self._core.hello(), (), deadline)
        with self._lock:
            self._wait_until(self._core.welcomed_or_dead, deadline)
            self._core.check_alive()

    # --- internals: writing ------------------------------------------------------------------

    def _write(
        self,
        data: bytes | bytearray,
        fds: Sequence[int],
        deadline: float | None,
        pending: Pending | None = None,
    ) -> None:
        """Send one frame (fds with its first byte) within the caller's deadline.

        A daemon that stops reading must not hang the caller (nor the callers
        queued behind it): the send waits at most until ``deadline``. A frame
        cut off part-way garbles the stream, so the connection dies with it.
        ``pending.sent`` is set once a byte of the frame went out: a caller whose
        frame did not start withdraws its request (``ClientCore.abandon``).
        """
        send_lock = self._send_lock
        if not send_lock.acquire(False):
            wait = _remaining(deadline)
            if not send_lock.acquire(True, -1 if wait is None else wait):
                raise TimeoutError("npud did not take our request in time (the send is blocked)")
        try:
            sock = self._sock
            try:
                if fds:
                    sent = sock.sendmsg([data], fds_ancillary(fds), _DONTWAIT)
                else:
                    sent = sock.send(data, _DONTWAIT)
            except BlockingIOError:
                sent = 0
            if sent and pending is not None:
                pending.sent = True
            if sent < len(data):
                sent = self._send_rest(data, fds, sent, deadline, pending)
        except OSError as exc:
            with self._lock:
                self._after_send_failed(exc)
            return
        finally:
            send_lock.release()
        if sent < len(data):
            with self._lock:
                if sent:
                    self._core.die(ErrorCode.CONNECTION_CLOSED, "a request was cut off mid-frame")
                    self._wake(handoff=False)
                    with contextlib.suppress(OSError):
                        self._sock.shutdown(socket.SHUT_RDWR)
            raise TimeoutError("npud did not take our request in time (the send is blocked)")

    def _send_rest(
        self,
        data: bytes | bytearray,
        fds: Sequence[int],
        sent: int,
        deadline: float | None,
        pending: Pending | None,
    ) -> int:
        """Under the send lock, the socket's buffer full: send the rest of ``data`` as
        room appears, until ``deadline``. Returns how many bytes went out in all."""
        sock = self._sock
        view = memoryview(data)
        while sent < len(view):
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return sent
            self._writable.poll(None if wait is None else _milliseconds(wait))
            try:
                if sent == 0:  # nothing went yet: the fds still go with the first byte
                    sent = sock.sendmsg([view], fds_ancillary(fds), _DONTWAIT)
                    if sent and pending is not None:
                        pending.sent = True
                else:
                    sent += sock.send(view[sent:], _DONTWAIT)
            except BlockingIOError:
                pass
        return sent

    def _after_send_failed(self, exc: OSError) -> None:
        """Under the lock: the server closed. What it said before closing (an error
        saying why, then the end of the stream) is already queued on our side of
        the socket; read it, so requests fail with its reason, not a broken pipe."""
        if self._core.dead or self._reading:
            return  # dead already, or the reader is about to find out
        try:
            while not self._core.dead and self._readable.poll(0):
                self._read_once(None)
        finally:
            self._core.die(ErrorCode.CONNECTION_CLOSED, f"sending failed: {_reason(exc)}")
            self._wake(handoff=True)

    # --- internals: waiting and reading ------------------------------------------------------

    def _wait_until(self, ready: Callable[[], bool], deadline: float | None) -> None:
        """Under the lock: return once ``ready()``, reading for everyone while nobody
        else reads. Server events read meanwhile are handed to ``on_event`` with
        the lock released, so the callback may call the client."""
        core = self._core
        try:
            while True:
                if core.events:
                    events = core.take_events()
                    self._lock.release()
                    try:
                        deliver_events(events, self._on_event)
                    finally:
                        self._lock.acquire()
                elif ready():
                    return
                elif self._reading:
                    self._park(ready, deadline, reads=True)
                else:
                    self._read_once(deadline)
        finally:
            if self._parked and not self._reading:
                self._wake(handoff=True)  # others wait: one of them reads now

    def _park(self, ready: Callable[[], bool], deadline: float | None, *, reads: bool) -> None:
        """Under the lock (released while parked): wait to be woken, or until ``deadline``."""
        remaining = _remaining(deadline)
        parked = _Parked(ready, reads=reads)
        self._parked.append(parked)
        self._lock.release()
        try:
            woken = parked.wait(remaining)
        finally:
            self._lock.acquire()
            self._parked.remove(parked)
        if not woken and not ready():
            raise TimeoutError("npud did not answer in time")

    def _wake(self, *, handoff: bool) -> None:
        """Under the lock: wake every parked thread whose wait is over; with
        ``handoff`` (nobody reads now), make sure one that would read is awake."""
        reader_awake = False
        for parked in self._parked:
            if not parked.woken and parked.ready():
                parked.wake()
                reader_awake = reader_awake or parked.reads
        if handoff and not reader_awake:
            for parked in self._parked:
                if parked.reads:
                    parked.wake()  # no-op if it is awake already
                    return

    def _read_once(self, deadline: float | None) -> None:
        """Under the lock (released while blocked): one recvmsg into the connection's
        buffer, then dispatch. The end of the stream, a broken connection and
        MSG_CTRUNC end the connection; a deadline that passes raises TimeoutError."""
        self._reading = True
        self._lock.release()
        try:
            if deadline is not None and not self._readable.poll(_poll_timeout(deadline)):
                raise TimeoutError("npud did not answer in time")
            size, ancdata, flags, _ = self._sock.recvmsg_into(
                [self._receive_buffer], ANCILLARY_SPACE, _CLOEXEC
            )
            fds = parse_ancillary(ancdata, flags) if ancdata or flags & _CTRUNC else []
        except BaseException as exc:
            self._lock.acquire()
            self._reading = False
            if isinstance(exc, TransportError):
                self._core.die(ErrorCode.FDS_TRUNCATED, str(exc))
            elif isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
                self._core.die(ErrorCode.CONNECTION_CLOSED, f"reading failed: {_reason(exc)}")
            else:
                raise
        else:
            self._lock.acquire()
            self._reading = False
            self._core.receive(self._received[:size], fds)  # copied by the protocol
        if self._parked:
            self._wake(handoff=False)


def _remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (None: no deadline); TimeoutError once it passed."""
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("npud did not answer in time")
    return remaining


def _milliseconds(seconds: float) -> int:
    """A poll timeout: at least 1 ms, so a deadline a few µs away is still waited for."""
    return max(1, math.ceil(seconds * 1000))


def _poll_timeout(deadline: float) -> int:
    """Milliseconds to poll until ``deadline``; TimeoutError once it passed."""
    remaining = _remaining(deadline)
    assert remaining is not None
    return _milliseconds(remaining)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__
