"""FastRpcSession: one FastRPC session to the CDSP over a Driver. Synchronous; no trio.

Lifecycle::

    session = FastRpcSession.open(driver, library_path=[...])
    session.load_shell(verified_bytes)      # INIT_CREATE + the reverse-RPC listener
    handle = session.remote_open("file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0")
    result = session.invoke(handle, sc, inputs, outputs)
    session.close()

File descriptors. The session opens two fds on the CDSP node: ``meta_fd``
for DMA-BUF allocation and ``rpc_fd`` for process creation, mappings and
invokes. Each fd is one kernel session (one of the channel's 12 compute
context banks on X1E). The session owns both, every DMA-BUF fd it allocates
and every host mapping of those, and closes each exactly once.

Serialization rule. The kernel runs ioctls on one fd concurrently (libcdsprpc
invokes from many threads, and the listener sits in INVOKE on ``rpc_fd`` the
whole time), so the session does not serialize INVOKE. What it does
serialize, and why:

* INIT_CREATE runs once, under ``_load_lock`` (the kernel does not stop a
  second create on the same fd; the DSP's behaviour then is undefined).
* Mapping changes of one buffer (MEM_MAP, MEM_UNMAP, release) hold that
  buffer's ``lock``, so a buffer is never unmapped while being mapped.
* A buffer in use by an invoke is pinned; freeing it defers the release
  until the last such invoke returns, because the DSP may still touch it.
* ``close()`` waits for in-flight invokes: the kernel cannot release a file
  while a thread is inside an ioctl on it.

Allocation goes to ``meta_fd`` and takes no lock that an invoke holds, so an
allocation never waits behind a long invoke.

Signals: KernelDriver does not retry EINTR. Threads that call into the
session (the daemon's DSP lanes) block signals, so a signal never interrupts
an INVOKE that the DSP would then run anyway.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from npu_protocol import MAX_DMA_SIZE, ErrorCode
from npud.fastrpc import abi, remotectl
from npud.fastrpc.apps_std import AppsStdServer
from npud.fastrpc.capabilities import DspInfo, query_capabilities
from npud.fastrpc.dma import DeviceFd, SessionBuffer, checked_dma_size
from npud.fastrpc.driver import Driver, IoctlArg
from npud.fastrpc.errors import DriverCall, RpcError, translate_os_error
from npud.fastrpc.exposed_files import ExposedFile, ExposedFiles
from npud.fastrpc.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg, Slice
from npud.fastrpc.listener import ReverseRpcListener

log = logging.getLogger(__name__)

# FASTRPC_MODE_UNSIGNED_MODULE: load the shell as the unsigned PD, which may
# run skels not signed for this device (ours).
DEFAULT_PROCESS_ATTRS: Final = abi.FASTRPC_MODE_UNSIGNED_MODULE
EXIT_SC: Final = abi.remote_scalars_make(2, 0, 0)  # adsp_current_process1.exit
LISTENER_JOIN_TIMEOUT: Final = 10.0  # the kernel's own timeout for internal calls
OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK

_RawBuffer = ctypes.Array[ctypes.c_char]


@dataclass(frozen=True)
class SessionStatistics:
    device: str
    shell_loaded: bool
    dead: bool
    buffers: int
    buffer_bytes: int
    mapped_buffers: int
    remote_handles: int
    invokes_in_flight: int
    invokes_done: int
    listener_running: bool
    listener_requests: int
    listener_stopped_because: str


class FastRpcSession:
    """See the module docstring. Thread-safe; every public method may block in an ioctl."""

    def __init__(
        self,
        driver: Driver,
        device: str,
        meta_fd: DeviceFd,
        rpc_fd: DeviceFd,
        capabilities: DspInfo,
        library_path: Sequence[Path],
    ) -> None:
        self._driver = driver
        self.device = device
        self._meta_fd = meta_fd
        self._rpc_fd = rpc_fd
        self.capabilities = capabilities
        self._library_path = tuple(library_path)
        self._state_lock = threading.Lock()
        self._load_lock = threading.Lock()  # INIT_CREATE runs once
        self._idle = threading.Condition(self._state_lock)
        self._buffers: dict[int, SessionBuffer] = {}
        self._buffer_ids = itertools.count(1)
        self._handles: set[int] = set()
        self._handle_calls: dict[int, int] = {}  # invokes on the DSP, per handle
        self._closing_handles: set[int] = set()  # closed by the client, awaiting their end
        self._in_flight = 0
        self._invokes_done = 0
        self._shell: SessionBuffer | None = None
        self._listener: ReverseRpcListener | None = None
        self._exposed = ExposedFiles()  # descriptors lent to the DSP's loader
        self._free_supported = True
        self._dead = False
        self._closing = False
        self._closed = False
        self.on_dead: Callable[[str], None] | None = None
        """Called once, on the thread that first sees the DSP restart (EPIPE): often the
        listener's, before any request runs into it. Must not block."""

    # ------------------------------------------------------------------ open
    @classmethod
    def open(
        cls,
        driver: Driver,
        *,
        nodes: Sequence[str] = abi.CDSP_NODES,
        library_path: Sequence[Path] = (),
    ) -> FastRpcSession:
        """Open ``meta_fd`` and ``rpc_fd`` and read the DSP's capabilities.

        The secure node is tried first; ENOENT or EACCES fall back to the next
        node, as libcdsprpc does. EBUSY does not: both nodes share one pool.
        GET_DSP_INFO proves the DSP answers before anything else is done.
        """
        device, meta = _open_first(driver, nodes)
        meta_fd = DeviceFd(meta, driver.close)
        fds = [meta_fd]
        try:
            rpc_fd = DeviceFd(_open_node(driver, device), driver.close)
            fds.append(rpc_fd)
            try:
                capabilities = query_capabilities(
                    lambda arg: driver.ioctl(meta, abi.FASTRPC_IOCTL_GET_DSP_INFO, arg)
                )
            except OSError as exc:
                raise translate_os_error(
                    exc, abi.FASTRPC_IOCTL_GET_DSP_INFO, device=device
                ) from None
        except BaseException:
            for fd in fds:
                fd.close()
            raise
        log.info("fastrpc session opened", extra={"device": device, "arch": capabilities.arch})
        return cls(driver, device, meta_fd, rpc_fd, capabilities, library_path)

    # ------------------------------------------------------------- the shell
    @property
    def shell_loaded(self) -> bool:
        return self._shell is not None

    def load_shell(self, shell: bytes, *, attrs: int = DEFAULT_PROCESS_ATTRS) -> None:
        """Create the DSP process from ``shell`` and start the reverse-RPC listener.

        ``shell`` must be the bytes returned by ``verify_shell_binary``: exactly
        those bytes go to the DSP. Sequence: bound the size → allocate a DMA-BUF
        and map it → copy → INIT_CREATE → start the listener. Any failure undoes
        what was done, in reverse order. On success the shell buffer is kept for
        the session's lifetime (the kernel maps it into the process; when the
        DSP reads it is driver-specific). Loading twice is a no-op.
        """
        with self._load_lock:
            self._check_usable()
            if self._shell is not None:
                return
            if not shell:
                raise RpcError(ErrorCode.SHELL_VERIFY, reason="the shell image is empty")
            if len(shell) > abi.INIT_FILELEN_MAX:
                raise RpcError(
                    ErrorCode.SHELL_VERIFY,
                    reason=f"the shell is {len(shell)} bytes; the kernel accepts at most "
                    f"{abi.INIT_FILELEN_MAX}",
                )
            buffer = self._allocate(len(shell))
            try:
                buffer.view()[: len(shell)] = shell
                create = abi.fastrpc_init_create(
                    filelen=len(shell),
                    filefd=buffer.fd,
                    attrs=attrs,
                    siglen=0,
                    file=buffer.host_address,
                )
                rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_INIT_CREATE, create)
                if rc != 0:
                    raise RpcError(ErrorCode.FASTRPC, rc=rc)
                listener = ReverseRpcListener(
                    self._invoke_untracked, AppsStdServer(self._library_path, self._exposed)
                )
                try:
                    listener.start()
                except BaseException:
                    self._exit_process()  # undo INIT_CREATE
                    raise
            except BaseException:
                self._release(buffer)
                raise
            self._shell = buffer
            self._listener = listener
        log.info("DSP process created", extra={"shell_bytes": len(shell), "attrs": f"0x{attrs:x}"})

    # ------------------------------------------------------------------- DMA
    def alloc(self, size: int) -> SessionBuffer:
        """Allocate a DMA-BUF of ``size`` bytes (page-rounded) with a host mapping."""
        self._check_usable()
        buffer = self._allocate(size)
        with self._state_lock:
            if self._closing:
                closing = True
            else:
                closing = False
                self._buffers[buffer.id] = buffer
        if closing:
            self._release(buffer)
            raise RpcError(ErrorCode.SESSION_CLOSED)
        return buffer

    def _allocate(self, size: int) -> SessionBuffer:
        """A DMA-BUF of ``size`` bytes rounded up to whole pages, mapped on the host."""
        allocated = checked_dma_size(size)
        req = abi.fastrpc_alloc_dma_buf(fd=-1, flags=0, size=allocated)
        self._ioctl(self._meta_fd.fileno(), abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, req)
        if int(req.fd) < 0:  # pragma: no cover - a kernel that succeeds always sets it
            raise RpcError(ErrorCode.DMA_BUF_ALLOC, msg="the driver returned no fd")
        fd = DeviceFd(int(req.fd), self._driver.close)
        try:
            host = self._driver.mmap(fd.fileno(), allocated)
        except OSError as exc:
            fd.close()
            raise translate_os_error(exc, DriverCall.MMAP, device=self.device) from None
        except BaseException:
            fd.close()
            raise
        return SessionBuffer(next(self._buffer_ids), fd, allocated, host)

    def buffer(self, buffer_id: int) -> SessionBuffer:
        try:
            return self._buffers[buffer_id]
        except KeyError:
            raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer_id) from None

    def owns(self, buffer: SessionBuffer) -> bool:
        """True while ``buffer`` is one of this session's (allocated here, not yet freed)."""
        with self._state_lock:
            return self._buffers.get(buffer.id) is buffer

    def free(self, buffer: SessionBuffer) -> None:
        """Release ``buffer``: DSP unmap, host munmap, close. Deferred while an invoke uses it."""
        with self._state_lock:
            if self._buffers.get(buffer.id) is not buffer:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)
            del self._buffers[buffer.id]
        if buffer.request_release():
            self._release(buffer)

    def _release(self, buffer: SessionBuffer) -> None:
        """Free order of the seed: DSP unmap → host munmap → FREE_DMA_BUFF → close."""
        with buffer.lock:
            if buffer.released:
                return
            try:
                if buffer.dsp_address is not None and not self._dead:
                    self._mem_unmap(buffer)
            finally:
                buffer.release(self._free_dma_buff)

    def _free_dma_buff(self, fd: int) -> None:
        """FREE_DMA_BUFF where a kernel implements it; ENOTTY means closing frees."""
        if not self._free_supported or self._dead:
            return
        arg = ctypes.c_uint32(fd)
        try:
            self._driver.ioctl(
                self._meta_fd.fileno(), abi.FASTRPC_IOCTL_FREE_DMA_BUFF, _as_arg(arg)
            )
        except OSError as exc:
            if exc.errno == errno.ENOTTY:
                self._free_supported = False
            else:
                log.warning(
                    "FREE_DMA_BUFF failed; closing the fd frees it", extra={"error": exc.strerror}
                )

    # ------------------------------------------------------------ DSP mapping
    def map(self, buffer: SessionBuffer) -> int:
        """Map ``buffer`` into the DSP process (MEM_MAP); idempotent. Returns the DSP address."""
        self._check_usable()
        self._check_owned(buffer)
        self._require_process()
        with buffer.lock:
            if buffer.released:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)
            if buffer.dsp_address is not None:
                return buffer.dsp_address
            req = abi.fastrpc_mem_map(
                version=0,
                fd=buffer.fd,
                offset=0,
                flags=abi.FASTRPC_MAP_FD,
                vaddrin=buffer.host_address,
                length=buffer.size,
                attrs=0,
            )
            rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_MEM_MAP, req)
            if rc != 0:
                raise RpcError(ErrorCode.MMAP_FAILED, code=rc)
            address = int(req.vaddrout)
            buffer.mapped_at(address)
            return address

    def unmap(self, buffer: SessionBuffer) -> None:
        """Undo :meth:`map`; a buffer that is not mapped is left as it is."""
        self._check_usable()
        self._check_owned(buffer)
        with buffer.lock:
            if buffer.dsp_address is None:
                return
            self._mem_unmap(buffer)
            buffer.unmapped()

    def _mem_unmap(self, buffer: SessionBuffer) -> None:
        assert buffer.dsp_address is not None
        req = abi.fastrpc_mem_unmap(
            vesion=0, fd=buffer.fd, vaddr=buffer.dsp_address, length=buffer.size
        )
        rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_MEM_UNMAP, req)
        if rc != 0:
            raise RpcError(ErrorCode.MMAP_FAILED, code=rc)

    # ---------------------------------------------------------------- invoke
    def invoke(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """Invoke method ``sc`` on a handle opened by :meth:`remote_open`.

        Returns the DSP's result code (0 = success) and the output bytes;
        transport failures raise RpcError.
        """
        with self._state_lock:
            if handle not in self._handles:
                raise RpcError(ErrorCode.UNKNOWN_HANDLE, handle=handle)
            self._handle_calls[handle] = self._handle_calls.get(handle, 0) + 1
        try:
            return self._invoke_raw(handle, sc, inputs, outputs)
        finally:
            with self._state_lock:
                self._handle_calls[handle] -= 1
                close_now = not self._handle_calls[handle] and handle in self._closing_handles
                if not self._handle_calls[handle]:
                    del self._handle_calls[handle]
                if close_now:
                    self._closing_handles.discard(handle)
            if close_now:
                self._remotectl_close_quietly(handle)

    def _invoke_raw(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """A counted invoke: close() waits for it; refused once the session is closing."""
        with self._tracked_call():
            return self._invoke_untracked(handle, sc, inputs, outputs)

    def _invoke_untracked(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """The INVOKE itself. The listener uses it directly: its next2 stays pending
        until the DSP process exits, which close() itself brings about."""
        _check_scalars(sc, inputs, outputs)
        pinned: list[SessionBuffer] = []
        try:
            args, memory = self._marshal(inputs, outputs, pinned)
            invoke = abi.fastrpc_invoke(
                handle=handle, sc=sc, args=ctypes.addressof(args) if len(args) else 0
            )
            rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_INVOKE, invoke)
            results = tuple(
                None if isinstance(arg, Slice) else (raw.raw if raw is not None else b"")
                for arg, raw in zip(outputs, memory[len(inputs) :], strict=True)
            )
            return InvokeResult(rc=rc, outputs=results)
        finally:
            for buffer in pinned:
                if buffer.unpin():
                    self._release_quietly(buffer)

    def _release_quietly(self, buffer: SessionBuffer) -> None:
        """Release where a caller cannot act on a failure: log it, never strand the rest."""
        try:
            self._release(buffer)
        except (RpcError, BufferError, OSError) as exc:
            log.error("releasing buffer failed", extra={"buffer": buffer.id, "error": str(exc)})

    def _marshal(
        self, inputs: Sequence[InArg], outputs: Sequence[OutArg], pinned: list[SessionBuffer]
    ) -> tuple[ctypes.Array[abi.fastrpc_invoke_args], list[_RawBuffer | None]]:
        """Fill the args array; returns it and, per argument, the ctypes memory behind it."""
        args = (abi.fastrpc_invoke_args * (len(inputs) + len(outputs)))()
        memory: list[_RawBuffer | None] = []
        for slot, arg in zip(args, [*inputs, *outputs], strict=True):
            raw: _RawBuffer | None = None
            if isinstance(arg, Slice):
                self._check_owned(arg.buffer)
                arg.buffer.check_slice(arg.offset, arg.length)
                arg.buffer.pin()
                pinned.append(arg.buffer)
                slot.ptr = arg.buffer.host_address + arg.offset
                slot.length = arg.length
                slot.fd = arg.buffer.fd
            else:
                data = arg.data if isinstance(arg, Inline) else b""
                size = len(data) if isinstance(arg, Inline) else _capacity(arg)
                if size:
                    raw = ctypes.create_string_buffer(data, size)
                    slot.ptr = ctypes.addressof(raw)
                slot.length = size
                slot.fd = -1
            slot.attr = 0
            memory.append(raw)
        return args, memory

    # ------------------------------------------------------------- remotectl
    def remote_open(self, uri: str) -> int:
        """remotectl open (handle 0): load the skel named by ``uri``; returns its handle."""
        self._require_process()
        request = remotectl.pack_open(uri)
        result = self._invoke_raw(
            abi.REMOTECTL_HANDLE,
            remotectl.OPEN_SC,
            (Inline(request.prim_in), Inline(request.name)),
            (Capacity(8), Capacity(remotectl.DLERROR_CAPACITY)),
        )
        if result.rc != 0:
            raise RpcError(
                ErrorCode.OPEN_FAILED, uri=uri, code=result.rc, detail="remotectl call failed"
            )
        reply = remotectl.unpack_open(result.output(0), result.output(1))
        if reply.error != 0:
            raise RpcError(
                ErrorCode.OPEN_FAILED,
                uri=uri,
                code=reply.error,
                detail=reply.dlerror or "no detail",
            )
        with self._state_lock:
            self._handles.add(reply.handle)
        return reply.handle

    def remote_close(self, handle: int) -> None:
        """remotectl close (handle 0) of a handle from :meth:`remote_open`.

        While invokes on the handle are still on the DSP the close is deferred:
        the last of them closes it (unloading a skel under a running call would
        take the whole DSP process down).
        """
        with self._state_lock:
            if handle not in self._handles:
                raise RpcError(ErrorCode.UNKNOWN_HANDLE, handle=handle)
            self._handles.discard(handle)
            if self._handle_calls.get(handle):
                self._closing_handles.add(handle)
                return
        self._remotectl_close(handle)

    def _remotectl_close_quietly(self, handle: int) -> None:
        try:
            self._remotectl_close(handle)
        except RpcError as exc:
            log.warning(
                "deferred remotectl close failed",
                extra={"handle": f"0x{handle:x}", "error": str(exc)},
            )

    def _remotectl_close(self, handle: int) -> None:
        result = self._invoke_raw(
            abi.REMOTECTL_HANDLE,
            remotectl.CLOSE_SC,
            (Inline(remotectl.pack_close(handle)),),
            (Capacity(4), Capacity(remotectl.DLERROR_CAPACITY)),
        )
        if result.rc != 0:
            raise RpcError(ErrorCode.FASTRPC, rc=result.rc)
        error, dlerror = remotectl.unpack_close(result.output(0), result.output(1))
        if error != 0:
            log.warning(
                "remotectl close refused",
                extra={"handle": f"0x{handle:x}", "result": f"0x{error:x}", "dlerror": dlerror},
            )

    # -------------------------------------------------------- exposed files
    def expose_file(self, fd: int, *, suffix: str = "") -> ExposedFile:
        """Let the DSP read the regular file open on ``fd`` under a generated name.

        The name (``ExposedFile.name``, ``npud-fd-<hex><suffix>``) is what a
        skel's loader asks the listener's apps_std for; no other name reaches
        the descriptor. The caller keeps ``fd``; the returned ExposedFile owns a
        duplicate and must be closed (it is a context manager) when the load is
        done. ValueError when ``fd`` is not a regular file open for reading.
        """
        self._check_usable()
        self._require_process()
        return self._exposed.expose(fd, suffix=suffix)

    @property
    def exposed_files(self) -> int:
        """Descriptors currently lent to the DSP (leak checks)."""
        return len(self._exposed)

    # ------------------------------------------------------------- lifecycle
    def statistics(self) -> SessionStatistics:
        with self._state_lock:
            buffers = list(self._buffers.values())
            return SessionStatistics(
                device=self.device,
                shell_loaded=self._shell is not None,
                dead=self._dead,
                buffers=len(buffers),
                buffer_bytes=sum(b.size for b in buffers),
                mapped_buffers=sum(b.dsp_address is not None for b in buffers),
                remote_handles=len(self._handles),
                invokes_in_flight=self._in_flight,
                invokes_done=self._invokes_done,
                listener_running=self._listener is not None and self._listener.running,
                listener_requests=self._listener.stats.requests if self._listener else 0,
                listener_stopped_because=(
                    self._listener.stats.stopped_because if self._listener else ""
                ),
            )

    @property
    def listener_running(self) -> bool:
        """False once the reverse-RPC listener has ended (skels can no longer load)."""
        return self._listener is not None and self._listener.running

    @property
    def dead(self) -> bool:
        """True once the DSP restarted under this session (every call now fails)."""
        return self._dead

    def close(self, timeout: float | None = None) -> None:
        """Release everything: waits for in-flight invokes, ends the DSP process and
        the listener, frees every buffer, closes both fds. Idempotent.

        With ``timeout``, raises SESSION_BUSY if invokes are still running on the
        DSP after that many seconds; nothing is released then (their memory may
        still be in use), and a later close() can finish the job.
        """
        with self._state_lock:
            if self._closed:
                return
            self._closing = True
            if not self._idle.wait_for(lambda: not self._in_flight, timeout):
                raise RpcError(ErrorCode.SESSION_BUSY)
            self._closed = True
            buffers = list(self._buffers.values())
            self._buffers.clear()
            self._handles.clear()
            shell, self._shell = self._shell, None
            listener, self._listener = self._listener, None
        listener_gone = True
        try:
            leftover = self._exposed.close_all()
            if leftover:
                log.warning("exposed files still lent at close", extra={"closed": leftover})
            if listener is not None:
                listener_gone = self._end_process(listener)
            for buffer in [*buffers, *([shell] if shell is not None else [])]:
                if buffer.request_release():  # False: already released, or pending
                    # The process is gone: closing rpc_fd drops its mappings, so
                    # skip per-buffer DSP unmaps.
                    buffer.unmapped()
                    self._release_quietly(buffer)
        finally:
            fds = [self._meta_fd]
            if listener_gone:
                fds.append(self._rpc_fd)
            else:
                # A thread may still enter INVOKE on rpc_fd: closing it could let
                # that call land on whatever fd reuses the number. Keep it open
                # (one fd, until the process exits) rather than risk that.
                log.error("keeping rpc_fd open: the listener thread is still in it")
            for fd in fds:
                try:
                    fd.close()
                except OSError as exc:
                    log.error("closing a device fd failed", extra={"error": exc.strerror})
        log.info("fastrpc session closed", extra={"device": self.device})

    def __enter__(self) -> FastRpcSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def end_process(self) -> None:
        """End the DSP process now (adsp_current_process1.exit), as libcdsprpc's
        FASTRPC_REMOTE_PROCESS_KILL does for a call that never returns: the calls still
        on the DSP fail, and the session can then be closed. Best effort."""
        self._exit_process()

    def _exit_process(self) -> None:
        """Ask the DSP process to exit (adsp_current_process1.exit); best effort."""
        if self._dead:
            return
        invoke = abi.fastrpc_invoke(handle=abi.ADSP_CURRENT_PROCESS1_HANDLE, sc=EXIT_SC, args=0)
        try:
            rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_INVOKE, invoke)
            if rc != 0:
                log.warning("DSP process exit refused", extra={"result": f"0x{rc:08X}"})
        except RpcError as exc:
            log.warning("DSP process exit failed", extra={"error": str(exc)})

    def _end_process(self, listener: ReverseRpcListener) -> bool:
        """End the DSP process, which completes the listener's pending next2, and join it.

        Returns False when the listener thread is still running after the wait.
        """
        self._exit_process()
        if listener.join(LISTENER_JOIN_TIMEOUT):
            return True
        log.error("reverse-RPC listener did not stop", extra={"timeout_s": LISTENER_JOIN_TIMEOUT})
        return False

    # --------------------------------------------------------------- helpers
    def _ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:
        try:
            return _ioctl(self._driver, fd, request, arg, self.device)
        except RpcError as exc:
            if exc.code is ErrorCode.DSP_RESTARTED:
                first = not self._dead
                self._dead = True
                if first and self.on_dead is not None:
                    self.on_dead(str(exc))
            raise

    def _check_usable(self) -> None:
        if self._closing or self._closed:
            raise RpcError(ErrorCode.SESSION_CLOSED)
        if self._dead:
            raise RpcError(ErrorCode.DSP_RESTARTED)

    def _require_process(self) -> None:
        if self._shell is None:
            raise RpcError(
                ErrorCode.INVALID_ARGUMENT, detail="no DSP process yet: load the shell first"
            )

    def _check_owned(self, buffer: SessionBuffer) -> None:
        if self._buffers.get(buffer.id) is not buffer:
            raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)

    @contextmanager
    def _tracked_call(self) -> Iterator[None]:
        with self._state_lock:
            self._check_usable()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._in_flight -= 1
                self._invokes_done += 1
                if not self._in_flight:
                    self._idle.notify_all()


def _capacity(arg: InArg | OutArg) -> int:
    if isinstance(arg, Capacity):
        if arg.size < 0:
            raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"negative capacity {arg.size}")
        if arg.size > MAX_DMA_SIZE:
            raise RpcError(ErrorCode.DMA_EXCEEDS_MAX_SIZE, size=arg.size)
        return arg.size
    raise TypeError(f"not an invoke argument: {arg!r}")


def _check_scalars(sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]) -> None:
    if not 0 <= sc <= 0xFFFFFFFF:
        raise RpcError(ErrorCode.INVALID_ARGUMENT, detail=f"scalars word {sc:#x} is not u32")
    expected = (abi.remote_scalars_inbufs(sc), abi.remote_scalars_outbufs(sc))
    if expected != (len(inputs), len(outputs)):
        raise RpcError(
            ErrorCode.INVALID_ARGUMENT,
            detail=f"scalars word 0x{sc:08X} declares {expected[0]} inputs and {expected[1]} "
            f"outputs; {len(inputs)} and {len(outputs)} were given",
        )
    if abi.remote_scalars_inhandles(sc) or abi.remote_scalars_outhandles(sc):
        raise RpcError(ErrorCode.UNSUPPORTED, what="handle arguments in invokes")


def _as_arg(value: ctypes.c_uint32) -> IoctlArg:
    return (ctypes.c_char * ctypes.sizeof(value)).from_buffer(value)


def _ioctl(driver: Driver, fd: int, request: int, arg: IoctlArg, device: str) -> int:
    try:
        return driver.ioctl(fd, request, arg)
    except OSError as exc:
        raise translate_os_error(exc, request, device=device) from None


def _open_node(driver: Driver, path: str) -> int:
    try:
        return driver.open(path, OPEN_FLAGS)
    except OSError as exc:
        raise translate_os_error(exc, DriverCall.OPEN, device=path) from None


def _open_first(driver: Driver, nodes: Sequence[str]) -> tuple[str, int]:
    """The first node that opens; ENOENT/EACCES/ENODEV try the next one."""
    if not nodes:
        raise RpcError(ErrorCode.DEVICE_NOT_FOUND, tried="(no device nodes configured)")
    failures: list[str] = []
    for path in nodes:
        try:
            return path, driver.open(path, OPEN_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENODEV, errno.ENXIO):
                failures.append(f"{path} ({errno.errorcode.get(exc.errno or 0, '?')})")
                continue
            raise translate_os_error(exc, DriverCall.OPEN, device=path) from None
    raise RpcError(ErrorCode.DEVICE_NOT_FOUND, tried=", ".join(failures))
