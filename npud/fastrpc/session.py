"""FastRpcSession: one FastRPC session to the CDSP over a Driver. Synchronous; no trio.

Lifecycle::

    session = FastRpcSession.open(driver, library_path=[...])
    session.load_shell(verified_bytes)      # INIT_CREATE + the reverse-RPC listener
    handle = session.remote_open("file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0")
    result = session.invoke(handle, sc, inputs, outputs)
    session.close()

File descriptors. The session opens one fd on the CDSP node, ``rpc_fd``, for
everything: capabilities, allocation, process creation, mappings and invokes,
as libcdsprpc does. Each open of the node is one kernel session (one of the
channel's 12 compute context banks on X1E), so one fd per session leaves the
most DSP processes possible to npud's domains. The session owns that fd and
every DMA-BUF it allocates
itself (:meth:`alloc`, the shell, files it shares with the DSP), and lets go
of each exactly once.

Buffers of others. A DMA-BUF the session did not allocate (one from the
system heap, :mod:`npud.fastrpc.dma_heap`) can be mapped (:meth:`map`) and
passed in invokes just the same: the session keeps its DSP address of every
buffer it mapped, and counts itself as one of the buffer's holders
(``DmaBuffer.add_mapping``) until the mapping is undone or the session
closes, which drops every mapping at once.

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

Allocation takes no lock that an invoke holds (the kernel runs ALLOC_DMA_BUFF
beside an INVOKE on the same fd), so an allocation never waits behind a long
invoke.

Signals: KernelDriver does not retry EINTR. Threads that call into the
session (the daemon's DSP lanes) block signals, so a signal never interrupts
an INVOKE that the DSP would then run anyway. Should one still come back
with EINTR (the suspend freezer), it fails with a DEVICE_ERROR that says the
DSP may have run it; the session never repeats it.

Stale mappings. Before linux-next the kernel finds a mapping by fd number
only. If a MEM_UNMAP fails (a DSP error, ETIMEDOUT), the kernel still holds
that mapping under the buffer's fd number; closing the fd would let a later
buffer that gets the same number alias the stale mapping (the DSP would
read and write the old buffer). So the session then keeps that fd open,
unmapped on the host, until it closes (``SessionStatistics.stale_fds``).

Errors that look like errnos. The kernel returns the DSP's result as the
ioctl's return value; one in -4095..-1 reaches us as an errno. An INVOKE
errno the kernel never produces (``errors.INVOKE_ERRNOS``) is therefore the
DSP's result and is returned as ``rc``; one it does produce is taken as the
kernel's (an ambiguity no userspace can resolve).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from npu_protocol import AEE, MAX_DMA_SIZE, ErrorCode, describe_result
from npud.fastrpc import abi, remotectl
from npud.fastrpc.apps_mem import AppsMemServer
from npud.fastrpc.apps_std import AppsStdServer, SharedSource, SharingError
from npud.fastrpc.capabilities import DspInfo, query_capabilities
from npud.fastrpc.dma import ComputeBank, DeviceFd, DmaBuffer, checked_dma_size
from npud.fastrpc.driver import Driver, IoctlArg
from npud.fastrpc.errors import (
    DriverCall,
    RpcError,
    dsp_result_in_errno_range,
    translate_os_error,
)
from npud.fastrpc.exposed_files import ExposedFile, ExposedFiles
from npud.fastrpc.invoke_args import Capacity, InArg, Inline, InvokeResult, OutArg, Slice
from npud.fastrpc.listener import ReverseRpcListener
from npud.fastrpc.reverse_modules import (
    CallDescription,
    ReverseModules,
    ReverseObserver,
    aee_for_errno,
)
from npud.fastrpc.trace import TraceHooks, trace_hooks_of
from npud.fastrpc.trace_format import Record, encode_data

log = logging.getLogger(__name__)

# FASTRPC_MODE_UNSIGNED_MODULE: load the shell as the unsigned PD, which may
# run skels not signed for this device (ours).
DEFAULT_PROCESS_ATTRS: Final = abi.FASTRPC_MODE_UNSIGNED_MODULE
EXIT_SC: Final = abi.remote_scalars_make(2, 0, 0)  # adsp_current_process1.exit
LISTENER_JOIN_TIMEOUT: Final = 10.0  # the kernel's own timeout for internal calls
CRASH_NOTICE_SECONDS: Final = 0.2
"""How long a call that answered AEE_EBADSTATE waits for the listener to stop, the sign
that its DSP process ended under it."""
OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK
SHARE_CHUNK: Final = 1024 * 1024
PROBED_STATIC_HANDLES: Final = frozenset({9, 10})
"""Static handles (libcdsprpc treats 0..10 as static) that no interface is known for."""
MAP_FLAGS: Final = frozenset({abi.FASTRPC_MAP_FD, abi.FASTRPC_MAP_FD_DELAYED})
"""What a client's map may ask the DSP for: the whole buffer now, or at its first use."""

_RawBuffer = ctypes.Array[ctypes.c_char]
T = TypeVar("T")


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
    stale_fds: int = 0
    """DMA-BUF fds kept open because their MEM_UNMAP failed (see the module docstring)."""
    remotectl: str = ""
    """The remotectl interface the DSP answered on (remotectl1 or remotectl), once known."""
    listener: str = ""
    """The listener interface the DSP answered on (adsp_listener1 or adsp_listener)."""
    refused_paths: int = 0
    """Files the DSP asked for outside the library directories (apps_std refused them)."""
    listener_retries: int = 0
    """next2 calls the listener sent again after a failure (libcdsprpc's one retry)."""


class FastRpcSession:
    """See the module docstring. Thread-safe; every public method may block in an ioctl."""

    def __init__(
        self,
        driver: Driver,
        device: str,
        rpc_fd: DeviceFd,
        capabilities: DspInfo,
        library_path: Sequence[Path],
        trace_session: int = 0,
    ) -> None:
        self._driver = driver
        self._hooks: TraceHooks | None = trace_hooks_of(driver)
        self._trace_session = trace_session
        self.device = device
        self._rpc_fd = rpc_fd
        self.capabilities = capabilities
        self._library_path = tuple(library_path)
        self._state_lock = threading.Lock()
        self._load_lock = threading.Lock()  # INIT_CREATE runs once
        self._idle = threading.Condition(self._state_lock)
        self._buffers: dict[int, DmaBuffer] = {}  # allocated here, not yet freed
        self._buffer_ids = itertools.count(1)
        self._mapped: dict[DmaBuffer, int] = {}  # every buffer mapped here -> DSP address
        self._handles: set[int] = set()
        self._handle_calls: dict[int, int] = {}  # invokes on the DSP, per handle
        self._closing_handles: set[int] = set()  # closed by the client, awaiting their end
        self._in_flight = 0
        self._invokes_done = 0
        self._shell: DmaBuffer | None = None
        self._listener: ReverseRpcListener | None = None
        self._apps_std: AppsStdServer | None = None
        self._exposed = ExposedFiles()  # descriptors lent to the DSP's loader
        self._shared_files: dict[int, DmaBuffer] = {}  # apps_std *_fd files, by fd
        self._stale: set[DmaBuffer] = set()  # freed, MEM_UNMAP failed: mapped until close
        self._remotectl: remotectl.RemotectlGeneration | None = None
        self._reverse_observer: ReverseObserver | None = None
        self._free_supported = True
        self.bank = ComputeBank()
        """Where this session's ALLOC_DMA_BUFF buffers live; lost at a subsystem restart."""
        self._process_ended = False  # exit sent: the DSP side of every mapping is gone
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
        """Open ``rpc_fd`` and read the DSP's capabilities.

        The secure node is tried first; ENOENT or EACCES fall back to the next
        node, as libcdsprpc does. EBUSY does not: both nodes share one pool.
        GET_DSP_INFO proves the DSP answers before anything else is done.
        """
        hooks = trace_hooks_of(driver)
        if hooks is None:
            return cls._open(driver, nodes, library_path, 0)
        trace_session = hooks.new_session()
        with hooks.operation("open", trace_session, nodes=list(nodes)) as op:
            session = cls._open(driver, nodes, library_path, trace_session)
            op.result(device=session.device)
            return session

    @classmethod
    def _open(
        cls,
        driver: Driver,
        nodes: Sequence[str],
        library_path: Sequence[Path],
        trace_session: int,
    ) -> FastRpcSession:
        device, fd = _open_first(driver, nodes)
        rpc_fd = DeviceFd(fd, driver.close)
        try:
            capabilities = query_capabilities(
                lambda arg: driver.ioctl(fd, abi.FASTRPC_IOCTL_GET_DSP_INFO, arg)
            )
        except OSError as exc:
            rpc_fd.close()
            raise translate_os_error(exc, abi.FASTRPC_IOCTL_GET_DSP_INFO, device=device) from None
        except BaseException:
            rpc_fd.close()
            raise
        log.info("fastrpc session opened", extra={"device": device, "arch": capabilities.arch})
        return cls(driver, device, rpc_fd, capabilities, library_path, trace_session)

    def fileno(self) -> int:
        """The session's device fd (owned here; -1 once closed): for the emulator's fault
        injection, which names a DSP process by the fd it is bound to."""
        return self._rpc_fd.fileno()

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
        self._traced(
            "load_shell",
            lambda: {
                "size": len(shell),
                "sha256": hashlib.sha256(shell).hexdigest(),
                "attrs": attrs,
            },
            lambda: self._load_shell(shell, attrs),
        )

    def _load_shell(self, shell: bytes, attrs: int) -> None:
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
            self._check_unsigned_pd(attrs)
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
                host = _ReverseHost(self)
                apps_std = AppsStdServer(self._library_path, self._exposed, sharing=host)
                modules = ReverseModules(
                    [apps_std, AppsMemServer(host)],
                    observer=self._reverse_observer or self._trace_observer(apps_std),
                )
                listener = ReverseRpcListener(
                    self._listener_invoke(), modules, on_stopped=self._listener_stopped
                )
                try:
                    listener.start()
                except BaseException:
                    self._exit_process()  # undo INIT_CREATE
                    raise
            except BaseException:
                self._discard(buffer)
                raise
            self._shell = buffer
            self._listener = listener
            self._apps_std = apps_std
        log.info("DSP process created", extra={"shell_bytes": len(shell), "attrs": f"0x{attrs:x}"})

    def _check_unsigned_pd(self, attrs: int) -> None:
        """Refuse to ask for the unsigned PD on a DSP whose firmware says it has none
        (capability UNSIGNED_PD_SUPPORT = 0), as Qualcomm's examples check before they
        enable it: the INIT_CREATE would fail with a code that names nothing. A DSP
        without the capability API cannot say, so the request goes ahead there."""
        if not attrs & abi.FASTRPC_MODE_UNSIGNED_MODULE:
            return
        if not self.capabilities.available or self.capabilities.unsigned_pd:
            return
        raise RpcError(
            ErrorCode.UNSUPPORTED,
            what=(
                f"the unsigned PD: the CDSP firmware on {self.device} (Hexagon "
                f"{self.capabilities.arch}) answers UNSIGNED_PD_SUPPORT = 0, so it cannot run "
                "unsigned skels such as npud's; install a CDSP firmware with unsigned PD "
                "support (npud doctor shows the firmware in use)"
            ),
        )

    # ------------------------------------------------------------------- DMA
    def alloc(self, size: int) -> DmaBuffer:
        """Allocate a DMA-BUF of ``size`` bytes (page-rounded) with a host mapping."""
        return self._traced(
            "alloc",
            lambda: {"size": size},
            lambda: self._alloc(size),
            lambda buffer: {"buffer": buffer.trace_ref, "size": buffer.size},
        )

    def _alloc(self, size: int) -> DmaBuffer:
        self._check_usable()
        buffer = self._allocate(size)
        with self._state_lock:
            if self._closing:
                closing = True
            else:
                closing = False
                self._buffers[buffer.id] = buffer
        if closing:
            self._discard(buffer)
            raise RpcError(ErrorCode.SESSION_CLOSED)
        return buffer

    def alloc_unowned(self, size: int) -> DmaBuffer:
        """A DMA-BUF from ALLOC_DMA_BUFF on this session's device that the *caller* owns:
        the session neither tracks nor releases it (where there is no system heap, the
        daemon's buffers come from here). Closing its fd frees it; the kernel keeps the
        memory in this session's context bank, and it lives on after the session closes.
        """
        # No FREE_DMA_BUFF before the close: it would need this session's fd, and closing
        # frees the buffer anyway (mainline has no FREE_DMA_BUFF).
        return self._traced(
            "alloc_unowned",
            lambda: {"size": size},
            lambda: self._alloc_unowned(size),
            lambda buffer: {"buffer": buffer.trace_ref, "size": buffer.size},
        )

    def _alloc_unowned(self, size: int) -> DmaBuffer:
        self._check_usable()
        return self._allocate(size, owned=False)

    def _allocate(self, size: int, *, owned: bool = True) -> DmaBuffer:
        """A DMA-BUF of ``size`` bytes rounded up to whole pages, mapped on the host."""
        allocated = checked_dma_size(size)
        req = abi.fastrpc_alloc_dma_buf(fd=-1, flags=0, size=allocated)
        self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, req)
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
        return DmaBuffer(
            next(self._buffer_ids),
            fd,
            allocated,
            host,
            before_close=self._free_dma_buff if owned else None,
            bank=self.bank,
            hooks=self._hooks,
            trace_session=self._trace_session,
        )

    def buffer(self, buffer_id: int) -> DmaBuffer:
        try:
            return self._buffers[buffer_id]
        except KeyError:
            raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer_id) from None

    def owns(self, buffer: DmaBuffer) -> bool:
        """True while ``buffer`` is one of this session's (allocated here, not yet freed)."""
        with self._state_lock:
            return self._buffers.get(buffer.id) is buffer

    def free(self, buffer: DmaBuffer) -> None:
        """Release ``buffer`` (allocated here): DSP unmap, host munmap, close. Deferred
        while an invoke uses it or another session still has it mapped."""
        self._traced("free", lambda: {"buffer": buffer.trace_ref}, lambda: self._free(buffer))

    def _free(self, buffer: DmaBuffer) -> None:
        with self._state_lock:
            if self._buffers.get(buffer.id) is not buffer:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)
            del self._buffers[buffer.id]
        try:
            self._unmap_for_good(buffer)
        finally:
            if buffer.request_release():
                buffer.release()

    def _unmap_for_good(self, buffer: DmaBuffer) -> None:
        """Undo this session's mapping of ``buffer``, which is going away. When the
        MEM_UNMAP fails the kernel keeps the mapping under the fd's number: the mapping
        then stays counted (so the fd stays open and no later buffer can get its number
        and alias it) until the session closes, and the failure is raised."""
        if self._dead or self._process_ended:
            return  # the process is gone: its mappings go with rpc_fd at close
        due = False
        with buffer.lock:
            if buffer not in self._mapped:
                return
            try:
                self._mem_unmap(buffer, self._mapped[buffer])
            except RpcError as exc:
                with self._state_lock:
                    self._stale.add(buffer)
                log.warning(
                    "MEM_UNMAP failed: keeping the buffer's fd open until the session closes",
                    extra={"buffer": buffer.id, "error": str(exc)},
                )
                raise
            with self._state_lock:
                del self._mapped[buffer]
            due = buffer.drop_mapping()
        if due:
            buffer.release()

    def _discard(self, buffer: DmaBuffer) -> None:
        """Release a buffer of the session's own (the shell, a shared file), quietly."""
        with contextlib.suppress(RpcError):  # kept mapped, counted stale: released at close
            self._unmap_for_good(buffer)
        if buffer.request_release():
            self._release_quietly(buffer)

    def _free_dma_buff(self, fd: int) -> None:
        """FREE_DMA_BUFF where a kernel implements it; ENOTTY means closing frees."""
        if not self._free_supported or self._dead:
            return
        arg = ctypes.c_uint32(fd)
        try:
            self._driver.ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_FREE_DMA_BUFF, _as_arg(arg))
        except OSError as exc:
            if exc.errno == errno.ENOTTY:
                self._free_supported = False
            else:
                log.warning(
                    "FREE_DMA_BUFF failed; closing the fd frees it", extra={"error": exc.strerror}
                )

    # ------------------------------------------------------------ DSP mapping
    def map(self, buffer: DmaBuffer, flags: int = abi.FASTRPC_MAP_FD) -> int:
        """Map ``buffer`` into the DSP process (MEM_MAP with ``flags``: FASTRPC_MAP_FD, or
        FASTRPC_MAP_FD_DELAYED to let the DSP map it at its first use); idempotent.
        Returns the DSP address."""
        if flags not in MAP_FLAGS:
            raise RpcError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"map flags {flags}: FASTRPC_MAP_FD or FASTRPC_MAP_FD_DELAYED only",
            )
        args: Record = {"buffer": buffer.trace_ref}
        if flags != abi.FASTRPC_MAP_FD:
            args["flags"] = flags
        return self._traced(
            "map",
            lambda: args,
            lambda: self._map(buffer, flags),
            lambda address: {"address": address},
        )

    def _map(self, buffer: DmaBuffer, flags: int = abi.FASTRPC_MAP_FD) -> int:
        self._check_usable()
        self._require_process()
        _check_bank(buffer)
        with buffer.lock:
            if buffer.released or buffer.release_pending:
                raise RpcError(ErrorCode.UNKNOWN_BUFFER, buffer=buffer.id)
            address = self._mapped.get(buffer)
            if address is not None:
                return address
            req = _whole_buffer_map(buffer, flags)
            rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_MEM_MAP, req)
            if rc != 0:
                raise RpcError(ErrorCode.MMAP_FAILED, code=rc)
            address = int(req.vaddrout)
            buffer.add_mapping()
            with self._state_lock:
                self._mapped[buffer] = address
            return address

    def address_of(self, buffer: DmaBuffer) -> int | None:
        """Where ``buffer`` is mapped in this session's DSP process, or None."""
        with self._state_lock:
            return self._mapped.get(buffer)

    def unmap(self, buffer: DmaBuffer, *, going: bool = False) -> None:
        """Undo :meth:`map`; a buffer that is not mapped here is left as it is. When the
        MEM_UNMAP fails the buffer stays mapped (and usable); a retry may succeed.

        ``going``: its holder is letting the buffer go. A failed MEM_UNMAP then keeps
        the mapping counted until the session closes (the kernel still holds it under
        the fd's number, so the fd must stay open), and the failure is raised.
        """
        args = {"buffer": buffer.trace_ref}
        if going:
            self._traced("unmap", lambda: args, lambda: self._unmap_for_good(buffer))
        else:
            self._traced("unmap", lambda: args, lambda: self._unmap(buffer))

    def _unmap(self, buffer: DmaBuffer) -> None:
        self._check_usable()
        due = False
        with buffer.lock:
            address = self._mapped.get(buffer)
            if address is None:
                return
            self._mem_unmap(buffer, address)
            with self._state_lock:
                del self._mapped[buffer]
                self._stale.discard(buffer)
            due = buffer.drop_mapping()
        if due:
            buffer.release()

    def _mem_unmap(self, buffer: DmaBuffer, address: int) -> None:
        req = abi.fastrpc_mem_unmap(vesion=0, fd=buffer.fd, vaddr=address, length=buffer.size)
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
        hooks = self._hooks
        if hooks is None:
            return self._invoke(handle, sc, inputs, outputs)
        limit = hooks.capture_limit
        args = {
            "handle": handle,
            "sc": sc,
            "inputs": [_traced_arg(arg, limit, data=True) for arg in inputs],
            "outputs": [_traced_arg(arg, limit, data=False) for arg in outputs],
        }
        with hooks.operation("invoke", self._trace_session, **args) as op:
            result = self._invoke(handle, sc, inputs, outputs)
            outs = [None if out is None else encode_data(out, limit) for out in result.outputs]
            op.result(rc=result.rc, outputs=outs)
            return result

    def _invoke(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        with self._state_lock:
            if handle not in self._handles:
                raise RpcError(ErrorCode.UNKNOWN_HANDLE, handle=handle)
            self._handle_calls[handle] = self._handle_calls.get(handle, 0) + 1
        try:
            result = self._invoke_raw(handle, sc, inputs, outputs)
            if result.rc and self._crashed_under(result.rc):
                raise RpcError(ErrorCode.DSP_RESTARTED)
            return result
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
        pinned: list[DmaBuffer] = []
        try:
            args, memory = self._marshal(inputs, outputs, pinned)
            invoke = abi.fastrpc_invoke(
                handle=handle, sc=sc, args=ctypes.addressof(args) if len(args) else 0
            )
            rc = self._invoke_ioctl(invoke)
            results = tuple(
                None if isinstance(arg, Slice) else (raw.raw if raw is not None else b"")
                for arg, raw in zip(outputs, memory[len(inputs) :], strict=True)
            )
            return InvokeResult(rc=rc, outputs=results)
        finally:
            for buffer in pinned:
                if buffer.unpin():
                    self._release_quietly(buffer)

    def _invoke_ioctl(self, invoke: abi.fastrpc_invoke) -> int:
        """INVOKE; a DSP result that reached us as an errno is returned as that result."""
        try:
            return self._driver.ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_INVOKE, invoke)
        except OSError as exc:
            rc = dsp_result_in_errno_range(exc, abi.FASTRPC_IOCTL_INVOKE)
            if rc is None:
                error = translate_os_error(exc, abi.FASTRPC_IOCTL_INVOKE, device=self.device)
                if error.code is ErrorCode.DSP_RESTARTED:
                    self._mark_dead(str(error))
                raise error from None
            log.warning(
                "a DSP result in the errno range came back as errno",
                extra={"errno": exc.errno, "result": describe_result(rc)},
            )
            return rc

    def _release_quietly(self, buffer: DmaBuffer) -> None:
        """Release where a caller cannot act on a failure: log it, never strand the rest."""
        try:
            buffer.release()
        except (RpcError, BufferError, OSError) as exc:
            log.error("releasing buffer failed", extra={"buffer": buffer.id, "error": str(exc)})

    def _marshal(
        self, inputs: Sequence[InArg], outputs: Sequence[OutArg], pinned: list[DmaBuffer]
    ) -> tuple[ctypes.Array[abi.fastrpc_invoke_args], list[_RawBuffer | None]]:
        """Fill the args array; returns it and, per argument, the ctypes memory behind it."""
        args = (abi.fastrpc_invoke_args * (len(inputs) + len(outputs)))()
        memory: list[_RawBuffer | None] = []
        for slot, arg in zip(args, [*inputs, *outputs], strict=True):
            raw: _RawBuffer | None = None
            if isinstance(arg, Slice):
                _check_bank(arg.buffer)
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
        """remotectl open: load the skel named by ``uri``; returns its handle.

        The first open tries ``remotectl1`` (handle 8) and falls back to
        ``remotectl`` (handle 0) for good when the DSP answers anything but 0, as
        libcdsprpc's ``remote_handle_open_domain`` does: a firmware without handle 8
        may answer any code (AEE_ERPC and AEE_ENOSUCHMOD are only the usual ones).
        """
        return self._traced(
            "remote_open",
            lambda: {"uri": uri},
            lambda: self._remote_open(uri),
            lambda handle: {"handle": handle},
        )

    def _remote_open(self, uri: str) -> int:
        self._require_process()
        request = remotectl.pack_open(uri)

        def call(generation: remotectl.RemotectlGeneration) -> InvokeResult:
            return self._invoke_raw(
                generation.handle,
                generation.open_sc,
                (Inline(request.prim_in), Inline(request.name)),
                (Capacity(generation.open.prim_rout.size), Capacity(remotectl.DLERROR_CAPACITY)),
            )

        generation = self._remotectl
        if generation is None:
            result = call(remotectl.REMOTECTL1)
            if result.rc != 0:
                log.info(
                    "no remotectl1 on the DSP; using remotectl",
                    extra={"result": describe_result(result.rc)},
                )
                self._remotectl = remotectl.REMOTECTL
                result = call(remotectl.REMOTECTL)
            elif result.rc == 0:
                self._remotectl = remotectl.REMOTECTL1
        else:
            result = call(generation)
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

    def probe_static_handle(self, handle: int) -> int:
        """Invoke method 0, without arguments, on static handle 9 or 10, which no interface
        is known for, and return the DSP's answer: what this firmware answers for a static
        module it lacks (the bring-up's fidelity scenario; libcdsprpc falls back from
        handles 7 and 8 on such answers). Never used by the daemon."""
        if handle not in PROBED_STATIC_HANDLES:
            raise RpcError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"handle {handle}: only {sorted(PROBED_STATIC_HANDLES)} may be probed",
            )
        return self._traced(
            "probe_handle",
            lambda: {"handle": handle},
            lambda: self._probe_static_handle(handle),
            lambda rc: {"rc": rc},
        )

    def _probe_static_handle(self, handle: int) -> int:
        self._require_process()
        return self._invoke_raw(handle, abi.remote_scalars_make(0, 0, 0), (), ()).rc

    def remote_close(self, handle: int) -> None:
        """remotectl close (handle 0) of a handle from :meth:`remote_open`.

        While invokes on the handle are still on the DSP the close is deferred:
        the last of them closes it (unloading a skel under a running call would
        take the whole DSP process down).
        """
        self._traced("remote_close", lambda: {"handle": handle}, lambda: self._remote_close(handle))

    def _remote_close(self, handle: int) -> None:
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
        generation = self._remotectl or remotectl.REMOTECTL
        result = self._invoke_raw(
            generation.handle,
            generation.close_sc,
            (Inline(remotectl.pack_close(handle)),),
            (Capacity(generation.close.prim_rout.size), Capacity(remotectl.DLERROR_CAPACITY)),
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
        hooks = self._hooks
        if hooks is None:
            return self._expose_file(fd, suffix)
        limit = hooks.capture_limit
        args: Record = {"suffix": suffix, "data": None}
        with contextlib.suppress(OSError):  # expose() says what is wrong with the descriptor
            args["data"] = _file_record(fd, limit)
        with hooks.operation("expose_file", self._trace_session, **args) as op:
            exposed = self._expose_file(fd, suffix)
            op.result(name=exposed.name)
        session = self._trace_session

        def closed() -> None:
            with hooks.operation("unexpose", session, name=exposed.name):
                pass

        exposed.on_close = closed
        return exposed

    def _expose_file(self, fd: int, suffix: str) -> ExposedFile:
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
                mapped_buffers=len(self._mapped),
                remote_handles=len(self._handles),
                invokes_in_flight=self._in_flight,
                invokes_done=self._invokes_done,
                listener_running=self._listener is not None and self._listener.running,
                listener_requests=self._listener.stats.requests if self._listener else 0,
                listener_stopped_because=(
                    self._listener.stats.stopped_because if self._listener else ""
                ),
                stale_fds=len(self._stale),
                remotectl=self._remotectl.name if self._remotectl else "",
                listener=self._listener.stats.generation if self._listener else "",
                refused_paths=self._apps_std.refused_paths if self._apps_std else 0,
                listener_retries=self._listener.stats.retries if self._listener else 0,
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
        if self._closed:
            return
        self._traced("close", lambda: {"timeout": timeout}, lambda: self._close(timeout))

    def _close(self, timeout: float | None) -> None:
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
            self._let_go_of_buffers([*buffers, *([shell] if shell is not None else [])])
        finally:
            fds = []
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

    def _let_go_of_buffers(self, owned: list[DmaBuffer]) -> None:
        """At close: every mapping goes with the process (or with rpc_fd), and the
        buffers allocated here are let go (each released now unless held elsewhere)."""
        with self._state_lock:
            owned += self._shared_files.values()
            self._shared_files.clear()
            mapped = list(self._mapped)
            self._mapped.clear()
            self._stale.clear()
        due = []
        for buffer in mapped:
            with buffer.lock:
                if buffer.drop_mapping():
                    due.append(buffer)
        for buffer in owned:
            if buffer.request_release():  # False: already released, or held elsewhere
                due.append(buffer)
        for buffer in due:
            self._release_quietly(buffer)

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
        """Ask the DSP process to exit (adsp_current_process1.exit); best effort.

        Sent even when the session believes the DSP restarted: on a real restart it
        fails at once (EPIPE), and a DSP result of -32 that only looked like EPIPE
        must not leave the listener blocked in next2 forever.
        """
        self._process_ended = True
        invoke = abi.fastrpc_invoke(handle=abi.ADSP_CURRENT_PROCESS1_HANDLE, sc=EXIT_SC, args=0)
        try:
            rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_INVOKE, invoke)
            if rc != 0:
                log.warning("DSP process exit refused", extra={"result": f"0x{rc:08X}"})
        except RpcError as exc:
            if not self._dead:
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

    # ----------------------------------------------------------------- trace
    def _traced(
        self,
        name: str,
        args: Callable[[], Record],
        run: Callable[[], T],
        result: Callable[[T], Record] | None = None,
    ) -> T:
        """Run ``run`` as trace operation ``name`` when the driver traces; plainly otherwise."""
        hooks = self._hooks
        if hooks is None:
            return run()
        with hooks.operation(name, self._trace_session, **args()) as op:
            value = run()
            if result is not None:
                op.result(**result(value))
            return value

    def _listener_invoke(
        self,
    ) -> Callable[[int, int, Sequence[InArg], Sequence[OutArg]], InvokeResult]:
        hooks, session = self._hooks, self._trace_session
        if hooks is None:
            return self._invoke_untracked

        def invoke(
            handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
        ) -> InvokeResult:
            hooks.listener_thread(session)
            return self._invoke_untracked(handle, sc, inputs, outputs)

        return invoke

    def _trace_observer(self, apps_std: AppsStdServer) -> ReverseObserver | None:
        hooks, session = self._hooks, self._trace_session
        if hooks is None:
            return None

        def observe(
            handle: int, module: str, method: int, description: CallDescription, result: int
        ) -> None:
            call: Record = {
                "handle": handle,
                "module": module,
                "method": method,
                "name": description.method,
                "file": description.file,
                "result": result,
            }
            hooks.reverse_call(session, call)
            if result == 0 and description.file and module == "apps_std":
                target = apps_std.resolve(description.file)
                if isinstance(target, Path):
                    try:
                        with open(target, "rb") as file:
                            data = file.read(hooks.capture_limit + 1)
                    except OSError:
                        return
                    hooks.file_served(session, target.name, data)

        return observe

    # --------------------------------------------------------------- helpers
    def _ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:
        try:
            return _ioctl(self._driver, fd, request, arg, self.device)
        except RpcError as exc:
            if exc.code is ErrorCode.DSP_RESTARTED:
                self._mark_dead(str(exc))
            raise

    def _listener_stopped(self, reason: str) -> None:
        """The listener's thread: it stopped serving. Unless this session asked its DSP
        process to exit (or is closing), the process ended on its own (it crashed, or
        the DSP killed it): as after a restart, everything it held is gone."""
        if self._process_ended or self._closing or self._closed:
            return
        log.warning("DSP process ended on its own", extra={"reason": reason})
        self._mark_dead(f"the DSP process ended on its own ({reason})", channel_lost=False)

    def _crashed_under(self, rc: int) -> bool:
        """True when a call that answered ``rc`` met its DSP process's end: AEE_EBADSTATE,
        and the listener (whose pending next2 the end completes too) stops right after.
        A skel's own AEE_EBADSTATE leaves the listener running: that waits
        :data:`CRASH_NOTICE_SECONDS` once, on an error path."""
        listener = self._listener
        if rc != AEE.EBADSTATE.dsp or listener is None or self._process_ended:
            return False
        listener.join(CRASH_NOTICE_SECONDS)
        return self._dead

    def _mark_dead(self, reason: str, *, channel_lost: bool = True) -> None:
        """The DSP restarted (EPIPE), or with ``channel_lost`` False only this session's
        DSP process ended: every call fails from now on; tell ``on_dead`` once. A restart
        takes the channel's compute banks, and with them every buffer allocated here."""
        if channel_lost:
            self.bank.lost = True  # the domain's restart says so in its log
        first = not self._dead
        self._dead = True
        if first and self.on_dead is not None:
            self.on_dead(reason)

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


def _traced_arg(arg: InArg | OutArg, limit: int, *, data: bool) -> Record:
    """An invoke argument as a trace records it (a slice's bytes too, for inputs)."""
    if isinstance(arg, Slice):
        record: Record = {"slice": [arg.buffer.trace_ref, arg.offset, arg.length]}
        if data:
            view = arg.buffer.view()
            record["data"] = encode_data(bytes(view[arg.offset : arg.offset + arg.length]), limit)
            del view
        return record
    if isinstance(arg, Inline):
        return {"inline": encode_data(arg.data, limit)}
    return {"capacity": arg.size}


def _file_record(fd: int, limit: int) -> Record:
    """The file behind ``fd`` as a trace data record, read with pread (the offset stays
    the caller's); past ``limit`` only its length and SHA-256, hashed as it streams."""
    size = os.fstat(fd).st_size
    digest = hashlib.sha256()
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(1 << 20, size - offset), offset)
        if not chunk:
            break
        digest.update(chunk)
        if size <= limit:
            chunks.append(chunk)
        offset += len(chunk)
    if size <= limit:
        return encode_data(b"".join(chunks), limit)
    return {"len": offset, "sha256": digest.hexdigest()}


def _check_bank(buffer: DmaBuffer) -> None:
    """A buffer whose compute bank a subsystem restart removed is never given to a DSP."""
    if buffer.bank_lost:
        raise RpcError(
            ErrorCode.INVALID_ARGUMENT,
            detail=f"buffer {buffer.id} was allocated in a compute bank that a DSP restart "
            "removed; allocate a new one",
        )


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


class _ReverseHost:
    """What the reverse modules need from the session: heap growth (MMAP / MUNMAP on
    ``rpc_fd``) for apps_mem, and shared files (a DMA-BUF MEM_MAP'd with
    FASTRPC_MAP_FD) for the apps_std ``_fd`` calls. Runs on the listener thread."""

    def __init__(self, session: FastRpcSession) -> None:
        self._session = session

    # -- apps_mem ---------------------------------------------------------------
    def heap_map(self, size: int, flags: int) -> tuple[int, int]:
        request = abi.fastrpc_req_mmap(fd=-1, flags=flags, vaddrin=0, size=size)
        rc = self._raw_ioctl(abi.FASTRPC_IOCTL_MMAP, request)
        return rc, int(request.vaddrout)

    def heap_unmap(self, vaddr: int, size: int) -> int:
        request = abi.fastrpc_req_munmap(vaddrout=vaddr, size=size)
        return self._raw_ioctl(abi.FASTRPC_IOCTL_MUNMAP, request)

    def _raw_ioctl(self, request: int, arg: IoctlArg) -> int:
        """The errno stays an OSError here: apps_mem answers the DSP with an AEE code."""
        session = self._session
        try:
            return session._driver.ioctl(session._rpc_fd.fileno(), request, arg)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                session._mark_dead("the DSP restarted (EPIPE)")
            raise

    # -- apps_std *_fd ------------------------------------------------------------
    def share(self, source: SharedSource, size: int) -> int:
        session = self._session
        try:
            buffer = session._allocate(max(size, 1))
        except RpcError as exc:
            log.warning("no DMA-BUF for a file the DSP reads", extra={"error": str(exc)})
            raise SharingError(int(AEE.ENOMEMORY)) from None
        try:
            view = buffer.view()
            done = 0
            while done < size:
                data = source.read_at(done, min(SHARE_CHUNK, size - done))
                if not data:
                    raise SharingError(int(AEE.EFREAD))
                view[done : done + len(data)] = data
                done += len(data)
            del view
            # The file's size, not the page-rounded buffer's: what libcdsprpc's fopen_fd maps.
            request = _whole_buffer_map(buffer, length=size)
            try:
                rc = self._raw_ioctl(abi.FASTRPC_IOCTL_MEM_MAP, request)
            except OSError as exc:
                raise SharingError(aee_for_errno(exc.errno)) from None
            if rc != 0:
                raise SharingError(rc)
            with buffer.lock:
                buffer.add_mapping()
                with session._state_lock:
                    session._mapped[buffer] = int(request.vaddrout)
        except BaseException:
            session._discard(buffer)
            raise
        with session._state_lock:
            session._shared_files[buffer.fd] = buffer
        return buffer.fd

    def unshare(self, fd: int) -> None:
        session = self._session
        with session._state_lock:
            buffer = session._shared_files.pop(fd, None)
        if buffer is None:
            raise SharingError(int(AEE.EBADFD))
        try:
            session._unmap_for_good(buffer)
        except RpcError:
            raise SharingError(int(AEE.EFAILED)) from None
        finally:
            if buffer.request_release():
                session._release_quietly(buffer)


def _whole_buffer_map(
    buffer: DmaBuffer, flags: int = abi.FASTRPC_MAP_FD, *, length: int | None = None
) -> abi.fastrpc_mem_map:
    """MEM_MAP of ``buffer`` by fd (FASTRPC_MAP_FD unless told), at its host address: all
    of it, or its first ``length`` bytes."""
    return abi.fastrpc_mem_map(
        version=0,
        fd=buffer.fd,
        offset=0,
        flags=flags,
        vaddrin=buffer.host_address,
        length=buffer.size if length is None else length,
        attrs=0,
    )
