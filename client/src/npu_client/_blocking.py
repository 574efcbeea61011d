"""The blocking client: one socket to npud, safe to share between threads.

Requests are pipelined: any number of threads may call at once, each waits
only for its own answer. There is no reader thread. Whichever waiting caller
finds nobody reading becomes the reader: it reads one chunk from the socket
with the lock released, dispatches every complete answer under the lock,
and wakes the other waiters; when its own answer is in, it hands the reading
over. Writes go through a separate lock, so a caller that is sending never
stops another from receiving (and never deadlocks against a server that is
busy writing to us).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final, Self, TypeVar

from npu_client._args import (
    InvokeInput,
    InvokeOutput,
    check_ping_payload,
    check_size,
    check_uri,
    invoke_request,
)
from npu_client._core import (
    ClientCore,
    ClientStatistics,
    DaemonView,
    EventCallback,
    HandleIdentity,
    Pending,
)
from npu_client._errors import ConnectFailed, ConnectionClosedError, DspRestarted, NpuError
from npu_client._memory import MappedBuffer, restart_reason
from npu_client._settings import (
    client_name,
    connect_failure_message,
    priority_class,
    socket_path,
)
from npu_client.transport import OwnedFd, TransportError, fds_ancillary, recv_message
from npu_protocol import (
    AllocReply,
    AllocRequest,
    AnyRequest,
    CloseReply,
    CloseRequest,
    DaemonStatus,
    ErrorCode,
    FreeReply,
    FreeRequest,
    InvokeReply,
    MapReply,
    MapRequest,
    OpenReply,
    OpenRequest,
    PingRequest,
    PongReply,
    Priority,
    Reply,
    ServerEvent,
    SessionRestarted,
    StatusReply,
    StatusRequest,
    UnmapReply,
    UnmapRequest,
)

_log: Final = logging.getLogger("npu_client")

R = TypeVar("R", bound=Reply)


def connect(
    path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    priority: Priority | str = Priority.NORMAL,
    timeout: float | None = None,
    on_event: EventCallback | None = None,
) -> Client:
    """Connect to npud and shake hands; the returned client is ready for requests.

    ``path``: the socket; default ``$NPUD_SOCKET``, else ``/run/npud/npud.sock``.
    ``name``: shown in ``npuctl status`` and the daemon's log; default the
    program's name. ``priority``: ``"realtime"``, ``"normal"`` or
    ``"background"`` (the daemon may grant less: see ``client.priority``).
    ``timeout``: seconds to wait for the connection and for each answer
    (``TimeoutError`` when exceeded); None waits as long as it takes.
    ``on_event``: called with each server event (see :class:`Client`).

    Raises :class:`ConnectFailed` when npud cannot be reached, or the error
    the daemon refused the connection with (e.g. :class:`NotPermitted`).
    """
    resolved = socket_path(path)
    core = ClientCore(client_name(name), priority_class(priority))
    _check_timeout(timeout)
    sock = _open_socket(resolved, timeout)
    client = Client(sock, core, path=resolved, timeout=timeout, on_event=on_event)
    try:
        client._handshake()
    except BaseException:
        client.close()
        raise
    return client


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")


def _open_socket(path: str, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.settimeout(None)  # answers wait by poll(), so the socket itself stays blocking
    except OSError as exc:
        sock.close()
        raise ConnectFailed(connect_failure_message(path, exc), path=path) from exc
    return sock


class Client(DaemonView):
    """A connection to npud. Make one with :func:`connect`; close it (or use ``with``).

    Closing releases everything the connection holds, here (every buffer's fd
    and mapping) and in the daemon (buffers, mappings, handles).

    Server events are read while some request waits for its answer (an idle
    client sees them with its next request). A ``SessionRestarted`` moves
    :attr:`epoch`: the daemon released every buffer, handle and DSP mapping
    of earlier epochs, so the client closes those buffers here (they report
    ``freed``); allocate, open and map again. A ``ShuttingDown`` sets
    :attr:`shutting_down`. Each event is then passed to ``on_event``.
    Requests naming what is gone, or made while the daemon shuts down, fail
    with its errors (``DspRestarted``, ``ShuttingDownError``); once the connection
    is over, every request fails with the reason it ended.
    """

    def __init__(
        self,
        sock: socket.socket,
        core: ClientCore,
        *,
        path: str,
        timeout: float | None,
        on_event: EventCallback | None,
    ) -> None:
        """Internal: use :func:`connect`. Takes ownership of ``sock``."""
        self._sock = sock
        self._core = core
        self._path = path
        self._timeout = timeout
        self._on_event = on_event
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._send_lock = threading.Lock()
        self._reading = False
        self._closed = False
        self._buffers: dict[int, DmaBuffer] = {}

    # --- what the daemon said -----------------------------------------------------------

    @property
    def buffers(self) -> tuple[DmaBuffer, ...]:
        """The live buffers of this connection."""
        with self._lock:
            return tuple(self._buffers.values())

    def statistics(self) -> ClientStatistics:
        with self._lock:
            return self._core.statistics(
                buffers=len(self._buffers), buffer_bytes=sum(b.size for b in self._buffers.values())
            )

    # --- requests ---------------------------------------------------------------------------

    def alloc(self, size: int) -> DmaBuffer:
        """Allocate a DMA-BUF of at least ``size`` bytes (rounded up to whole pages)."""
        size = check_size(size)
        reply, pending = self._call(lambda rid: AllocRequest(id=rid, size=size), AllocReply)
        fd = pending.take_fd()
        try:
            buffer = DmaBuffer(self, reply.buffer, reply.size, fd, pending.epoch)
        except (OSError, ValueError):
            self._free_quietly(reply.buffer)
            raise
        with self._lock:
            if self._core.dead:  # closed here or by the daemon while this call finished
                buffer._release_local()
                self._core.check_alive()
            if buffer.epoch < self._core.epoch:
                # Its session ended before this caller saw it: the daemon released it.
                buffer._release_local(restart_reason(self._core.epoch))
                raise self._core.restarted_error()
            self._buffers[buffer.id] = buffer
        return buffer

    def open(self, uri: str) -> RemoteHandle:
        """Open a skel on the DSP (remotectl), e.g.
        ``file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp``."""
        uri = check_uri(uri)
        epoch = self.epoch
        reply, _ = self._call(lambda rid: OpenRequest(id=rid, uri=uri), OpenReply)
        return RemoteHandle(self, reply.handle, uri, epoch)

    def status(self) -> DaemonStatus:
        """The daemon's status: what ``npuctl status`` shows."""
        reply, _ = self._call(lambda rid: StatusRequest(id=rid), StatusReply)
        return reply.status

    def ping(self, payload: bytes | bytearray | memoryview = b"") -> bytes:
        """A round trip through the daemon; returns the payload it echoed."""
        data = check_ping_payload(payload)
        reply, _ = self._call(lambda rid: PingRequest(id=rid, payload=data), PongReply)
        return reply.payload

    # --- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and every buffer's fd and mapping. Idempotent.

        Requests still waiting fail with :class:`ConnectionClosedError`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._core.die(ErrorCode.CONNECTION_CLOSED, "this client was closed")
            self._changed.notify_all()
            # Wakes a reader blocked in recvmsg and a writer blocked in sendmsg
            # (OSError: not connected any more, nothing to wake).
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            while self._reading:
                self._changed.wait()
            buffers, self._buffers = self._buffers, {}
        with self._send_lock:
            self._sock.close()
        for buffer in buffers.values():
            buffer._release_local("gone: its client was closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"epoch {self.epoch}"
        return f"<npu_client.Client {self._path} {state}>"

    # --- internals: one request -----------------------------------------------------------------

    def _call(self, build: Callable[[int], AnyRequest], expected: type[R]) -> tuple[R, Pending]:
        """Send ``build(id)`` and wait for its answer; raise the error it got."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            self._wait(lambda: self._core.dead or self._core.has_room(), deadline)
            with self._lock:
                self._core.check_alive()
                if self._core.has_room():  # else another caller took the free slot first
                    pending, data, fds = self._core.begin(build)
                    break
        try:
            self._write(data, fds, deadline)
            self._wait(lambda: pending.done, deadline)
        except BaseException:
            with self._lock:
                self._core.abandon(pending)
            raise
        return pending.result(expected), pending

    def _write(self, data: bytes, fds: Sequence[int], deadline: float | None) -> None:
        """Send one frame within the caller's deadline.

        A daemon that stops reading must not hang the caller (nor the callers
        queued behind it): the send waits at most until ``deadline``. A frame
        cut off part-way garbles the stream, so the connection dies with it.
        """
        wait = _remaining(deadline)
        if not self._send_lock.acquire(timeout=-1 if wait is None else wait):
            raise TimeoutError("npud did not take our request in time (the send is blocked)")
        try:
            sent = _send_within(self._sock, data, fds, deadline)
        except OSError as exc:
            with self._lock:
                self._after_send_failed(exc)
            return
        finally:
            self._send_lock.release()
        if sent < len(data):
            with self._lock:
                if sent:
                    self._core.die(ErrorCode.CONNECTION_CLOSED, "a request was cut off mid-frame")
                    self._changed.notify_all()
                    with contextlib.suppress(OSError):
                        self._sock.shutdown(socket.SHUT_RDWR)
            raise TimeoutError("npud did not take our request in time (the send is blocked)")

    def _after_send_failed(self, exc: OSError) -> None:
        """Under the lock: the server closed. What it said before closing (an error
        saying why, then the end of the stream) is already queued on our side of
        the socket; read it, so requests fail with its reason, not a broken pipe."""
        if self._core.dead or self._reading:
            return  # dead already, or the reader is about to find out
        self._reading = True
        try:
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            while not self._core.dead and poller.poll(0):
                self._read_once(None)
            self._core.die(ErrorCode.CONNECTION_CLOSED, f"sending failed: {_reason(exc)}")
        finally:
            self._reading = False
            self._changed.notify_all()

    def _drop_buffers_before(self, epoch: int) -> None:
        """The daemon released every buffer of earlier sessions: close ours."""
        with self._lock:
            stale = [b for b in self._buffers.values() if b.epoch < epoch]
            for buffer in stale:
                del self._buffers[buffer.id]
        for buffer in stale:
            buffer._release_local(restart_reason(epoch))

    def _owns(self, buffer: MappedBuffer) -> bool:
        """Whether ``buffer`` is a live buffer of this connection."""
        with self._lock:
            return self._buffers.get(buffer.id) is buffer

    def _forget_buffer(self, buffer: DmaBuffer) -> None:
        with self._lock:
            if self._buffers.get(buffer.id) is buffer:
                del self._buffers[buffer.id]

    def _free_quietly(self, buffer_id: int) -> None:
        """Free a buffer this side could not use; the connection's end frees it anyway."""
        with contextlib.suppress(NpuError, TimeoutError):
            self._call(lambda rid: FreeRequest(id=rid, buffer=buffer_id), FreeReply)

    # --- internals: waiting and reading ------------------------------------------------------

    def _handshake(self) -> None:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        self._write(self._core.hello(), (), deadline)
        self._wait(lambda: self._core.dead or self._core.welcome is not None, deadline)
        self._core.check_alive()

    def _wait(self, ready: Callable[[], bool], deadline: float | None) -> None:
        """Block until ``ready()`` (checked under the lock), reading when nobody else is.

        Server events are handed to ``on_event`` with no lock held, so the
        callback may call the client.
        """
        while True:
            with self._lock:
                satisfied = self._read_until(ready, deadline)
                events = self._core.take_events()
            self._apply(events)
            if satisfied:
                return

    def _read_until(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Under the lock: wait or read until ``ready()`` or events need delivering."""
        while not ready():
            if self._core.has_events():
                return False
            remaining = _remaining(deadline)
            if self._reading:
                self._changed.wait(remaining)
                continue
            self._reading = True
            try:
                self._read_once(deadline)
            finally:
                self._reading = False
                self._changed.notify_all()
        return True

    def _read_once(self, deadline: float | None) -> None:
        """Under the lock (released while blocked): one recvmsg, then dispatch."""
        self._lock.release()
        try:
            received = _receive(self._sock, deadline)
        except (OSError, TransportError) as exc:
            self._lock.acquire()
            if isinstance(exc, TimeoutError):
                raise
            if isinstance(exc, TransportError):
                self._core.die(ErrorCode.FDS_TRUNCATED, str(exc))
            else:
                self._core.die(ErrorCode.CONNECTION_CLOSED, f"reading failed: {_reason(exc)}")
            return
        except BaseException:
            self._lock.acquire()
            raise
        self._lock.acquire()
        self._core.receive(*received)

    def _apply(self, events: list[ServerEvent]) -> None:
        """Act on server events (with no lock held), then tell ``on_event``."""
        for event in events:
            if isinstance(event, SessionRestarted):
                self._drop_buffers_before(event.epoch)
            if self._on_event is None:
                continue
            try:
                self._on_event(event)
            except Exception:
                # The event is recorded either way; a failing callback must not
                # fail the unrelated request whose thread happened to read it.
                _log.exception("npu_client: the on_event callback failed for %r", event)


def _send_within(
    sock: socket.socket, data: bytes, fds: Sequence[int], deadline: float | None
) -> int:
    """Send ``data`` (fds with its first byte) without blocking past ``deadline``.

    Returns how many bytes went out: all of them, or fewer when time ran out.
    """
    view = memoryview(data)
    sent = 0
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    while sent < len(view):
        try:
            if sent == 0:
                sent = sock.sendmsg([view], fds_ancillary(fds), socket.MSG_DONTWAIT)
            else:
                sent += sock.send(view[sent:], socket.MSG_DONTWAIT)
            continue
        except BlockingIOError:
            pass
        wait = _remaining(deadline)
        if wait is not None and wait <= 0:
            return sent
        poller.poll(None if wait is None else max(1, int(wait * 1000)))
    return sent


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("npud did not answer in time")
    return remaining


def _receive(sock: socket.socket, deadline: float | None) -> tuple[bytes, list[OwnedFd]]:
    """One recvmsg, waiting at most until ``deadline``."""
    remaining = _remaining(deadline)
    if remaining is not None:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if not poller.poll(max(1, int(remaining * 1000))):
            raise TimeoutError("npud did not answer in time")
    return recv_message(sock)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


class DmaBuffer(MappedBuffer):
    """A DMA-BUF allocated by npud and mapped into this process (``MAP_SHARED``, RW).

    ``view()`` gives a writable memoryview; ``slice(offset, length)`` an invoke
    argument the DSP reads or writes in place. ``map()`` maps it into the DSP
    (later calls answer the cached address until ``unmap()``).
    ``free()`` (or leaving a ``with`` block) releases it in the daemon, then
    closes the fd and the mapping here. ``id``, ``size`` and ``fd`` are
    read-only; the buffer owns its fd.
    """

    def __init__(self, client: Client, buffer_id: int, size: int, fd: OwnedFd, epoch: int) -> None:
        """Internal: use :meth:`Client.alloc`. Takes ownership of ``fd``."""
        super().__init__(buffer_id, size, fd, epoch)
        self._client = client

    def map(self) -> int:
        """Map the buffer into the DSP; returns its DSP address (cached until unmap)."""
        address = self.dsp_address
        if address is not None:
            return address
        self._memory()  # refuse a freed buffer before asking
        reply, _ = self._client._call(lambda rid: MapRequest(id=rid, buffer=self.id), MapReply)
        self._remember_mapping(reply.dsp_address)
        return reply.dsp_address

    def unmap(self) -> None:
        """Remove the DSP mapping; nothing to do if it is not mapped."""
        if self.dsp_address is None:
            return
        self._client._call(lambda rid: UnmapRequest(id=rid, buffer=self.id), UnmapReply)
        self._forget_mapping()

    def free(self) -> None:
        """Release the buffer in the daemon, then its fd and mapping here. Idempotent.

        If the connection is gone the daemon already freed it: no error. Other
        errors leave the buffer as it was (the client's close releases it).
        """
        if self.freed:
            return
        with contextlib.suppress(ConnectionClosedError):
            self._client._call(lambda rid: FreeRequest(id=rid, buffer=self.id), FreeReply)
        self._client._forget_buffer(self)
        self._release_local()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.free()


class RemoteHandle(HandleIdentity):
    """A skel opened on the DSP; call its methods with :meth:`invoke`."""

    def __init__(self, client: Client, handle_id: int, uri: str, epoch: int) -> None:
        """Internal: use :meth:`Client.open`."""
        super().__init__(handle_id, uri, epoch)
        self._client = client

    def invoke(
        self,
        method: int | None,
        inputs: Sequence[InvokeInput] = (),
        outputs: Sequence[InvokeOutput] = (),
        *,
        sc: int | None = None,
        timeout: float | None = None,
    ) -> list[bytes | None]:
        """Call ``method`` (0..31; or pass ``method=None`` and a raw scalars word ``sc``).

        ``inputs``: bytes-like (sent inline) or ``buffer.slice(...)`` (read in
        place). ``outputs``: an int capacity (the bytes come back) or a slice
        (written in place). Returns one entry per output: bytes for a
        capacity, None for a slice. ``timeout`` (seconds) bounds the daemon's
        wait for the DSP. A non-zero result from the method raises
        :class:`InvokeFailed` with ``fields["code"]``.
        """
        if self._closed:
            raise ValueError(f"remote handle {self._id} is closed")
        build = invoke_request(
            handle=self._id,
            method=method,
            sc=sc,
            inputs=inputs,
            outputs=outputs,
            timeout=timeout,
            limits=self._client.limits,
            owns=self._client._owns,
        )
        reply, _ = self._client._call(build, InvokeReply)
        return list(reply.outputs)

    def close(self) -> None:
        """Close the handle on the DSP. Idempotent; no error if the handle is already
        gone with the connection or with a DSP restart."""
        if self._closed:
            return
        with contextlib.suppress(ConnectionClosedError, DspRestarted):
            self._client._call(lambda rid: CloseRequest(id=rid, handle=self._id), CloseReply)
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RemoteHandle {self._id} {self._uri!r}{' closed' if self._closed else ''}>"
