"""A real npud protocol peer for the client tests: a Unix socket, threads, memfds.

It speaks the protocol through ``npu_protocol.ServerConnection`` over a real
socket and passes real sealed memfds with SCM_RIGHTS, the way npud passes
DMA-BUFs. Invokes run the emulator's own Python skels (echo, npu_test) on
those memfds, so a buffer slice the client wrote is what the skel reads.

Tests steer it with ``Peer.intercept``: a function that sees each request
on the connection's thread and may answer it itself (an error, out of
order, never), or return None to let the peer serve it normally.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec

import npu_protocol as p
from npu_client.transport import OwnedFd, peer_credentials, recv_message, send_message
from npu_protocol.aee import AEE
from npud.sim.skels import DOMAIN_METHOD_OFFSET, EchoSkel, NpuTestSkel, Skel, SkelCall, run_method

PAGE: Final = mmap.PAGESIZE
ECHO_URI: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI: Final = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
SKELS: Final[dict[str, Callable[[], Skel]]] = {ECHO_URI: EchoSkel, TEST_URI: NpuTestSkel}
DSP_BASE: Final = 0xC000_0000

HANDLED: Final = object()
"""What an intercept returns when it answered (or deliberately did not answer) itself."""

Intercept = Callable[["PeerConnection", p.AnyRequest], "p.ServerMessage | object | None"]


def _memfd(size: int) -> OwnedFd:
    """A sealed memfd of ``size`` bytes: what the emulator's DMA-BUFs are."""
    fd = OwnedFd(os.memfd_create("peer-dmabuf", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
    os.ftruncate(fd.fileno(), size)
    fcntl.fcntl(
        fd.fileno(), fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
    )
    return fd


@dataclass
class PeerBuffer:
    id: int
    size: int
    fd: OwnedFd
    memory: mmap.mmap
    dsp_address: int | None = None

    def close(self) -> None:
        self.memory.close()
        self.fd.close()


@dataclass
class PeerConnection:
    """One accepted client, served on its own thread."""

    peer: Peer
    sock: socket.socket
    server: p.ServerConnection = field(default_factory=p.ServerConnection)
    buffers: dict[int, PeerBuffer] = field(default_factory=dict)
    handles: dict[int, Skel] = field(default_factory=dict)
    lost_below: int = 0
    """Ids below this went with a session restart: DSP_RESTARTED, not unknown."""
    version: int = p.PROTOCOL_VERSION
    """The version the client's Hello offered."""
    requests: list[p.AnyRequest] = field(default_factory=list)
    calls_done: int = 0
    _next_id: int = 1
    _send_lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)

    # --- sending (from this thread or a test's) ------------------------------------

    def send(self, message: p.ServerMessage) -> None:
        with self._send_lock:
            data, fds = self.server.send(message)
            with contextlib.suppress(OSError):  # the client may be gone already
                send_message(self.sock, data, fds)

    def send_together(self, first: p.ServerMessage, *rest: p.ServerMessage) -> None:
        """Several frames in one sendmsg (so they arrive in one read); only the
        first may carry fds, which the protocol attaches to its first byte."""
        with self._send_lock:
            data, fds = self.server.send(first)
            for message in rest:
                more, extra = self.server.send(message)
                assert not extra, "only the first frame may carry fds"
                data += more
            send_message(self.sock, data, fds)

    def hang_up(self) -> None:
        """Close the connection now, answering nothing more."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    # --- the serving loop ------------------------------------------------------------

    def run(self) -> None:
        try:
            self._serve()
        finally:
            for buffer in self.buffers.values():
                buffer.close()
            self.buffers.clear()
            for fd in self.server.take_pending_fds():
                os.close(fd)
            self.sock.close()
            self.closed.set()

    def _serve(self) -> None:
        while True:
            try:
                data, fds = recv_message(self.sock)
            except OSError:
                return
            self.server.receive_data(data, [fd.detach() for fd in fds])
            while True:
                try:
                    event = self.server.next_event()
                except p.RemoteProtocolError as exc:
                    self.send(p.ErrorMessage.for_code(exc.code, **exc.fields))
                    return
                if event is p.NEED_DATA:
                    break
                if isinstance(event, p.ConnectionClosed):
                    return
                if isinstance(event, p.StrayFds):
                    for fd in event.fds:
                        os.close(fd)
                elif isinstance(event, p.Hello):
                    if not self._welcome(event):
                        return
                else:
                    self._request(event)

    def _welcome(self, hello: p.Hello) -> bool:
        self.version = hello.protocol_version
        if self.peer.refusal is not None:
            self.send(self.peer.refusal)
            return False
        self.send(
            p.Welcome(
                server_version=self.peer.version,
                protocol_version=min(hello.protocol_version, self.peer.protocol_version),
                backend="emulator",
                dsp=self.peer.dsp,
                limits=self.peer.limits_for(hello),
                epoch=self.peer.epoch,
            )
        )
        return True

    def _request(self, request: p.AnyRequest) -> None:
        self.requests.append(request)
        intercept = self.peer.intercept
        answer = intercept(self, request) if intercept is not None else None
        if answer is HANDLED:
            return
        if answer is None:
            answer = self.serve(request)
        assert isinstance(answer, p.ErrorMessage | p.AnyReply), answer
        self.send(answer)

    # --- normal service ------------------------------------------------------------------

    def serve(self, request: p.AnyRequest) -> p.ServerMessage:
        """The honest answer to ``request``."""
        handlers: dict[type, Callable[[p.AnyRequest], p.ServerMessage]] = {
            p.AllocRequest: self._alloc,
            p.FreeRequest: self._free,
            p.MapRequest: self._map,
            p.UnmapRequest: self._unmap,
            p.OpenRequest: self._open,
            p.CloseRequest: self._close,
            p.InvokeRequest: self._invoke,
            p.StatusRequest: lambda r: p.StatusReply(id=r.id, status=self.peer.status()),
            p.PingRequest: self._pong,
        }
        return handlers[type(request)](request)

    @staticmethod
    def _pong(request: p.AnyRequest) -> p.ServerMessage:
        assert isinstance(request, p.PingRequest)
        return p.PongReply(id=request.id, payload=request.payload)

    def _free(self, request: p.AnyRequest) -> p.ServerMessage:
        assert isinstance(request, p.FreeRequest)
        buffer = self.buffers.pop(request.buffer, None)
        if buffer is None:
            return self._missing(request, request.buffer, p.ErrorCode.UNKNOWN_BUFFER, "buffer")
        buffer.close()
        return p.FreeReply(id=request.id)

    def _map(self, request: p.AnyRequest) -> p.ServerMessage:
        assert isinstance(request, p.MapRequest)
        found = self.buffers.get(request.buffer)
        if found is None:
            return self._missing(request, request.buffer, p.ErrorCode.UNKNOWN_BUFFER, "buffer")
        if found.dsp_address is None:
            found.dsp_address = DSP_BASE + self.peer.next_dsp_offset(found.size)
        return p.MapReply(id=request.id, dsp_address=found.dsp_address)

    def _unmap(self, request: p.AnyRequest) -> p.ServerMessage:
        assert isinstance(request, p.UnmapRequest)
        found = self.buffers.get(request.buffer)
        if found is None:
            return self._missing(request, request.buffer, p.ErrorCode.UNKNOWN_BUFFER, "buffer")
        if found.dsp_address is None:
            detail = f"buffer {request.buffer} is not mapped"
            return _error(request, p.ErrorCode.INVALID_ARGUMENT, detail=detail)
        found.dsp_address = None
        return p.UnmapReply(id=request.id)

    def _open(self, request: p.AnyRequest) -> p.ServerMessage:
        assert isinstance(request, p.OpenRequest)
        factory = SKELS.get(request.uri)
        if factory is None:
            return _error(
                request,
                p.ErrorCode.OPEN_FAILED,
                uri=request.uri,
                code=AEE.ENOSUCHFILE.dsp,
                detail="no such skel",
            )
        handle_id = self._new_id()
        self.handles[handle_id] = factory()
        return p.OpenReply(id=request.id, handle=handle_id)

    def _close(self, request: p.AnyRequest) -> p.ServerMessage:
        assert isinstance(request, p.CloseRequest)
        if self.handles.pop(request.handle, None) is None:
            return self._missing(request, request.handle, p.ErrorCode.UNKNOWN_HANDLE, "handle")
        return p.CloseReply(id=request.id)

    def _missing(
        self, request: p.AnyRequest, object_id: int, unknown: p.ErrorCode, name: str
    ) -> p.ErrorMessage:
        if object_id < self.lost_below:
            return _error(request, p.ErrorCode.DSP_RESTARTED)
        return _error(request, unknown, **{name: object_id})

    def forget_dsp_objects(self) -> None:
        """A session restart as a version 3 daemon makes it: handles go, buffers stay
        (unmapped)."""
        for buffer in self.buffers.values():
            buffer.dsp_address = None
        self.handles.clear()
        self.lost_below = self._next_id

    def forget_everything(self) -> None:
        """A session restart as a version 2 daemon made it: every buffer and handle goes."""
        for buffer in self.buffers.values():
            buffer.close()
        self.buffers.clear()
        self.handles.clear()
        self.lost_below = self._next_id

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _alloc(self, request: p.AnyRequest) -> p.ServerMessage:
        assert isinstance(request, p.AllocRequest)
        rounded = -(-request.size // PAGE) * PAGE
        fd = _memfd(rounded)
        buffer = PeerBuffer(self._new_id(), rounded, fd, mmap.mmap(fd.fileno(), rounded))
        self.buffers[buffer.id] = buffer
        # The fd field holds our fd; the protocol sends it as slot 0 with SCM_RIGHTS.
        return p.AllocReply(id=request.id, buffer=buffer.id, size=rounded, fd=fd.fileno())

    def _invoke(self, request: p.AnyRequest) -> p.ServerMessage:
        assert isinstance(request, p.InvokeRequest)
        skel = self.handles.get(request.handle)
        if skel is None:
            return self._missing(request, request.handle, p.ErrorCode.UNKNOWN_HANDLE, "handle")
        with contextlib.ExitStack() as views:
            inputs: list[memoryview] = []
            outputs: list[memoryview] = []
            inline_outputs: list[bytearray | None] = []
            for arg in request.inputs:
                view = self._arg_view(request, arg, views)
                if isinstance(view, p.ErrorMessage):
                    return view
                inputs.append(view)
            for out in request.outputs:
                if isinstance(out, p.InlineOutput):
                    data = bytearray(out.capacity)
                    inline_outputs.append(data)
                    outputs.append(views.enter_context(memoryview(data)))
                    continue
                view = self._arg_view(request, out, views)
                if isinstance(view, p.ErrorMessage):
                    return view
                inline_outputs.append(None)
                outputs.append(view)
            call = SkelCall(request.scalars, inputs, outputs, time.sleep)
            result = run_method(skel, DOMAIN_METHOD_OFFSET, call)
        self.calls_done += 1
        if result != 0:
            return _error(request, p.ErrorCode.INVOKE_FAILED, code=result)
        return p.InvokeReply(
            id=request.id,
            outputs=tuple(None if data is None else bytes(data) for data in inline_outputs),
        )

    def _arg_view(
        self,
        request: p.InvokeRequest,
        arg: p.InlineInput | p.InlineOutput | p.BufferSlice,
        views: contextlib.ExitStack,
    ) -> memoryview | p.ErrorMessage:
        if isinstance(arg, p.InlineInput):
            return views.enter_context(memoryview(arg.data))
        assert isinstance(arg, p.BufferSlice)
        buffer = self.buffers.get(arg.buffer)
        if buffer is None:
            return self._missing(request, arg.buffer, p.ErrorCode.UNKNOWN_BUFFER, "buffer")
        if arg.offset + arg.length > buffer.size:
            return _error(
                request,
                p.ErrorCode.SLICE_OUT_OF_RANGE,
                offset=arg.offset,
                length=arg.length,
                buffer=arg.buffer,
                size=buffer.size,
            )
        whole = views.enter_context(memoryview(buffer.memory))
        return views.enter_context(whole[arg.offset : arg.offset + arg.length])


def _error(request: p.AnyRequest, error: p.ErrorCode, /, **fields: object) -> p.ErrorMessage:
    return p.ErrorMessage.for_code(error, id=request.id, **fields)


class Peer:
    """A listening socket served by threads; ``with Peer(path) as peer:``."""

    def __init__(self, path: str, *, limits: p.ClientLimits | None = None) -> None:
        self.path = path
        self.version = "0.1.0-peer"
        self.protocol_version = p.PROTOCOL_VERSION
        """The newest version this peer speaks (2 plays a daemon before domains)."""
        self.dsp = p.DspCapabilities(arch_ver=0x73, hvx_support_128b=4, vtcm_page=262144)
        self.limits = limits or p.ClientLimits(priority=p.Priority.NORMAL)
        self.epoch = 1
        self.restarts = 0
        self.refusal: p.ErrorMessage | None = None
        self.intercept: Intercept | None = None
        self.connections: list[PeerConnection] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._dsp_offset = 0
        self._started = time.monotonic()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(16)
        self._accepted = threading.Condition(self._lock)
        self._acceptor = threading.Thread(target=self._accept, name="peer-accept", daemon=True)

    def __enter__(self) -> Peer:
        self._acceptor.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def limits_for(self, hello: p.Hello) -> p.ClientLimits:
        # Grant what was asked, like a daemon whose realtime allow-list is empty.
        return msgspec.structs.replace(self.limits, priority=hello.priority)

    def next_dsp_offset(self, size: int) -> int:
        with self._lock:
            offset, self._dsp_offset = self._dsp_offset, self._dsp_offset + size
            return offset

    # --- test helpers --------------------------------------------------------------------

    def connection(self, index: int = -1) -> PeerConnection:
        """The ``index``-th accepted connection, waiting for it to arrive."""
        with self._accepted:
            wanted = index if index >= 0 else 0
            assert self._accepted.wait_for(lambda: len(self.connections) > wanted, timeout=30)
            return self.connections[index]

    def broadcast(self, event: p.ServerEvent) -> None:
        for conn in list(self.connections):
            if isinstance(event, p.SessionRestarted):
                # What the daemon releases at a restart depends on the version spoken.
                if min(conn.version, self.protocol_version) >= 3:
                    conn.forget_dsp_objects()
                else:
                    conn.forget_everything()
            conn.send(event)
        if isinstance(event, p.SessionRestarted):
            self.epoch = event.epoch
            self.restarts += 1

    def wait_closed(self) -> None:
        """Wait until every connection has ended and released its buffers."""
        for conn in list(self.connections):
            assert conn.closed.wait(timeout=30), "a peer connection did not end"

    def status(self) -> p.DaemonStatus:
        rows = []
        for conn in list(self.connections):
            if conn.closed.is_set() or conn.server.hello is None:
                continue
            pid, uid, _ = peer_credentials(conn.sock)
            buffers = list(conn.buffers.values())
            rows.append(
                p.ClientRow(
                    pid=pid,
                    uid=uid,
                    name=conn.server.hello.client_name,
                    priority=conn.server.hello.priority.value,
                    buffers=len(buffers),
                    bytes=sum(b.size for b in buffers),
                    mappings=sum(b.dsp_address is not None for b in buffers),
                    handles=len(conn.handles),
                    calls_in_flight=0,
                    calls_done=conn.calls_done,
                )
            )
        totals = p.Totals(
            clients=len(rows),
            buffers=sum(r.buffers for r in rows),
            bytes=sum(r.bytes for r in rows),
            mappings=sum(r.mappings for r in rows),
            handles=sum(r.handles for r in rows),
            calls_done=sum(r.calls_done for r in rows),
        )
        return p.DaemonStatus(
            daemon_version=self.version,
            uptime_ms=int((time.monotonic() - self._started) * 1000) + 3_723_000,
            backend="emulator",
            device="/dev/fastrpc-cdsp-secure",
            dsp=self.dsp,
            shell=p.ShellStatus(
                verified=True, path="/usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3", sha256="ab" * 32
            ),
            epoch=self.epoch,
            restarts=self.restarts,
            totals=totals,
            clients=tuple(rows),
        )

    # --- threads --------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            conn = PeerConnection(self, sock)
            thread = threading.Thread(target=conn.run, name="peer-conn", daemon=True)
            with self._accepted:
                self.connections.append(conn)
                self._threads.append(thread)
                self._accepted.notify_all()
            thread.start()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        if self._acceptor.is_alive():
            self._acceptor.join(timeout=30)
        self._listener.close()
        for conn in list(self.connections):
            conn.hang_up()
        for thread in list(self._threads):
            thread.join(timeout=30)
            assert not thread.is_alive(), "a peer connection thread did not stop"


class HoldThenReverse:
    """An intercept that holds requests of ``kinds`` until ``count`` are held, then
    serves them last first. Proves the client had them all in flight at once and
    takes answers in any order."""

    def __init__(self, count: int, kinds: tuple[type[p.AnyRequest], ...] = (p.PingRequest,)):
        self.count = count
        self.kinds = kinds
        self.held: list[p.AnyRequest] = []
        self.most_held = 0
        self.answered: list[int] = []

    def __call__(self, conn: PeerConnection, request: p.AnyRequest) -> object:
        if not isinstance(request, self.kinds):
            return None
        self.held.append(request)
        self.most_held = max(self.most_held, len(self.held))
        if len(self.held) >= self.count:
            held, self.held = self.held, []
            for waiting in reversed(held):
                self.answered.append(waiting.id)  # before the answer wakes the test
                conn.send(conn.serve(waiting))
        return HANDLED


class Hold:
    """An intercept that keeps requests of ``kinds`` unanswered until :meth:`release`."""

    def __init__(self, *kinds: type[p.AnyRequest]) -> None:
        self.kinds = kinds
        self.held: list[tuple[PeerConnection, p.AnyRequest]] = []
        self.arrived = threading.Semaphore(0)

    def __call__(self, conn: PeerConnection, request: p.AnyRequest) -> object:
        if not isinstance(request, self.kinds):
            return None
        self.held.append((conn, request))
        self.arrived.release()
        return HANDLED

    def wait_held(self, count: int = 1) -> None:
        for _ in range(count):
            assert self.arrived.acquire(timeout=30), "the held request never arrived"

    def release(self) -> None:
        """Serve every held request now (from the calling thread)."""
        held, self.held = self.held, []
        for conn, request in held:
            conn.send(conn.serve(request))


def serve_once(path: str, answer: bytes, *, read_hello: bool = True) -> threading.Thread:
    """A listener that reads the Hello (or not), writes ``answer`` and closes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def run() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                if read_hello:
                    conn.recv(4096)
                if answer:
                    conn.sendall(answer)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def raw_frame(message: p.Message) -> bytes:
    payload = msgspec.msgpack.encode(message)
    return b"NP\x00\x00" + len(payload).to_bytes(4, "little") + payload
