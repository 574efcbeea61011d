"""The facade: opening a session (the device node, its capabilities) and the class every
caller uses. It makes the parts, each owning its state, and delegates to them; each
public operation is recorded through :class:`SessionTrace` when the driver traces."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.capabilities import DspInfo, query_capabilities
from npud.fastrpc.kernel.dma import ComputeBank, DeviceFd, DmaBuffer
from npud.fastrpc.kernel.driver import Driver
from npud.fastrpc.kernel.errors import RpcError, translate_os_error
from npud.fastrpc.kernel.invoke_args import InArg, InvokeResult, OutArg
from npud.fastrpc.kernel.trace_hooks import Record, trace_hooks_of
from npud.fastrpc.reverse.exposed_files import ExposedFile, ExposedFiles
from npud.fastrpc.reverse.listener import ReverseRpcListener
from npud.fastrpc.session._buffers import Buffers, release_quietly
from npud.fastrpc.session._device import Device, open_first
from npud.fastrpc.session._handles import PROBED_STATIC_HANDLES, Handles
from npud.fastrpc.session._invoke import Invoker
from npud.fastrpc.session._life import Life
from npud.fastrpc.session._log import log
from npud.fastrpc.session._mappings import MAP_FLAGS, Mappings
from npud.fastrpc.session._process import DEFAULT_PROCESS_ATTRS, Process
from npud.fastrpc.session._reverse_host import ReverseHost
from npud.fastrpc.session._statistics import SessionStatistics
from npud.fastrpc.session._trace import SessionTrace


class FastRpcSession:
    """One FastRPC session to the CDSP (see :mod:`npud.fastrpc.session`). Thread-safe;
    every public method may block in an ioctl."""

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
        trace = SessionTrace(hooks, hooks.new_session() if hooks is not None else 0)
        return trace.op(
            "open",
            lambda: {"nodes": list(nodes)},
            lambda: cls._open(driver, nodes, library_path, trace),
            lambda session: {"device": session.device},
        )

    @classmethod
    def _open(
        cls,
        driver: Driver,
        nodes: Sequence[str],
        library_path: Sequence[Path],
        trace: SessionTrace,
    ) -> FastRpcSession:
        device, fd = open_first(driver, nodes)
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
        return cls(driver, device, rpc_fd, capabilities, library_path, trace)

    def __init__(
        self,
        driver: Driver,
        device: str,
        rpc_fd: DeviceFd,
        capabilities: DspInfo,
        library_path: Sequence[Path],
        trace: SessionTrace | None = None,
    ) -> None:
        self.device = device
        self.capabilities = capabilities
        self.bank = ComputeBank()
        """Where this session's ALLOC_DMA_BUFF buffers live; lost at a subsystem restart."""
        self.on_dead: Callable[[str], None] | None = None
        """Called once, on the thread that first sees the DSP restart (EPIPE): often the
        listener's, before any request runs into it. Must not block."""
        self._trace = trace if trace is not None else SessionTrace(trace_hooks_of(driver))
        self._life = Life(self.bank, self._tell_dead)
        self._device = Device(driver, device, rpc_fd, self._life)
        self._mappings = Mappings(self._device, self._life)
        self._buffers = Buffers(
            self._device,
            self._life,
            self._mappings,
            self.bank,
            hooks=self._trace.hooks,
            trace_session=self._trace.session,
        )
        self._invoker = Invoker(self._device, self._life)
        self._exposed = ExposedFiles()  # descriptors lent to the DSP's loader
        self._process = Process(
            self._device,
            self._life,
            self._buffers,
            self._mappings,
            self._invoker,
            self._exposed,
            capabilities=capabilities,
            library_path=library_path,
            trace=self._trace,
        )
        self._handles = Handles(self._invoker, self._life, self._process)

    def _tell_dead(self, reason: str) -> None:
        if self.on_dead is not None:
            self.on_dead(reason)

    def fileno(self) -> int:
        """The session's device fd (owned here; -1 once closed): for the emulator's fault
        injection, which names a DSP process by the fd it is bound to."""
        return self._device.fileno()

    # -- the DSP process -----------------------------------------------------------------
    @property
    def shell_loaded(self) -> bool:
        return self._life.process_loaded

    def load_shell(self, shell: bytes, *, attrs: int = DEFAULT_PROCESS_ATTRS) -> None:
        """Create the DSP process from ``shell`` and start the reverse-RPC listener.

        ``shell`` must be the bytes returned by ``verify_shell_binary``: exactly
        those bytes go to the DSP. Sequence: bound the size → allocate a DMA-BUF
        and map it → copy → INIT_CREATE → start the listener. Any failure undoes
        what was done, in reverse order. On success the shell buffer is kept for
        the session's lifetime (the kernel maps it into the process; when the
        DSP reads it is driver-specific). Loading twice is a no-op.
        """
        self._trace.op(
            "load_shell",
            lambda: {
                "size": len(shell),
                "sha256": hashlib.sha256(shell).hexdigest(),
                "attrs": attrs,
            },
            lambda: self._process.load(shell, attrs),
        )

    def end_process(self) -> None:
        """End the DSP process now (adsp_current_process1.exit), as libcdsprpc's
        FASTRPC_REMOTE_PROCESS_KILL does for a call that never returns: the calls still
        on the DSP fail, and the session can then be closed. Best effort."""
        self._process.exit()

    @property
    def listener(self) -> ReverseRpcListener | None:
        """The reverse-RPC listener of the DSP process (None before the load and after
        close): its statistics, and a join for tests that end the process."""
        return self._process.listener

    @property
    def reverse_host(self) -> ReverseHost | None:
        """What the reverse modules of the DSP process call on the host (heap growth,
        shared files); None before the load."""
        return self._process.host

    @property
    def listener_running(self) -> bool:
        """False once the reverse-RPC listener has ended (skels can no longer load)."""
        listener = self._process.listener
        return listener is not None and listener.running

    # -- buffers and mappings --------------------------------------------------------------
    def alloc(self, size: int) -> DmaBuffer:
        """Allocate a DMA-BUF of ``size`` bytes (page-rounded) with a host mapping."""
        return self._trace.op(
            "alloc",
            lambda: {"size": size},
            lambda: self._buffers.alloc(size),
            lambda buffer: {"buffer": buffer.trace_ref, "size": buffer.size},
        )

    def alloc_unowned(self, size: int) -> DmaBuffer:
        """A DMA-BUF from ALLOC_DMA_BUFF on this session's device that the *caller* owns:
        the session neither tracks nor releases it (where there is no system heap, the
        daemon's buffers come from here). Closing its fd frees it; the kernel keeps the
        memory in this session's context bank, and it lives on after the session closes.
        """
        return self._trace.op(
            "alloc_unowned",
            lambda: {"size": size},
            lambda: self._buffers.alloc_unowned(size),
            lambda buffer: {"buffer": buffer.trace_ref, "size": buffer.size},
        )

    def buffer(self, buffer_id: int) -> DmaBuffer:
        return self._buffers.buffer(buffer_id)

    def owns(self, buffer: DmaBuffer) -> bool:
        """True while ``buffer`` is one of this session's (allocated here, not yet freed)."""
        return self._buffers.owns(buffer)

    def free(self, buffer: DmaBuffer) -> None:
        """Release ``buffer`` (allocated here): DSP unmap, host munmap, close. Deferred
        while an invoke uses it or another session still has it mapped."""
        self._trace.op(
            "free", lambda: {"buffer": buffer.trace_ref}, lambda: self._buffers.free(buffer)
        )

    @property
    def free_dma_buff_supported(self) -> bool:
        """False once the kernel answered FREE_DMA_BUFF with ENOTTY (closing a buffer's fd
        frees it; mainline has no FREE_DMA_BUFF)."""
        return self._buffers.free_supported

    def map(self, buffer: DmaBuffer, flags: int = abi.FASTRPC_MAP_FD) -> int:
        """Map ``buffer`` into the DSP process (MEM_MAP with ``flags``: FASTRPC_MAP_FD, or
        FASTRPC_MAP_FD_DELAYED to let the DSP map it at its first use, or another of
        :data:`MAP_FLAGS`); idempotent. Returns the DSP address."""
        if flags not in MAP_FLAGS:
            raise RpcError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"map flags {flags}: not a value libcdsprpc passes on (RESERVED, or past"
                " the extended FD_DELAYED)",
            )
        args: Record = {"buffer": buffer.trace_ref}
        if flags != abi.FASTRPC_MAP_FD:
            args["flags"] = flags
        return self._trace.op(
            "map",
            lambda: args,
            lambda: self._mappings.map(buffer, flags),
            lambda address: {"address": address},
        )

    def address_of(self, buffer: DmaBuffer) -> int | None:
        """Where ``buffer`` is mapped in this session's DSP process, or None."""
        return self._mappings.address_of(buffer)

    def unmap(self, buffer: DmaBuffer, *, going: bool = False) -> None:
        """Undo :meth:`map`; a buffer that is not mapped here is left as it is. When the
        MEM_UNMAP fails the buffer stays mapped (and usable); a retry may succeed.

        ``going``: its holder is letting the buffer go. A failed MEM_UNMAP then keeps
        the mapping counted until the session closes (the kernel still holds it under
        the fd's number, so the fd must stay open), and the failure is raised.
        """
        mappings = self._mappings
        run = mappings.unmap_for_good if going else mappings.unmap
        self._trace.op("unmap", lambda: {"buffer": buffer.trace_ref}, lambda: run(buffer))

    # -- files lent to the DSP ----------------------------------------------------------
    def expose_file(self, fd: int, *, suffix: str = "") -> ExposedFile:
        """Let the DSP read the regular file open on ``fd`` under a generated name.

        The name (``ExposedFile.name``, ``npud-fd-<hex><suffix>``) is what a
        skel's loader asks the listener's apps_std for; no other name reaches
        the descriptor. The caller keeps ``fd``; the returned ExposedFile owns a
        duplicate and must be closed (it is a context manager) when the load is
        done. ValueError when ``fd`` is not a regular file open for reading.
        """
        return self._trace.expose(fd, suffix, lambda: self._expose_file(fd, suffix))

    def _expose_file(self, fd: int, suffix: str) -> ExposedFile:
        self._life.check_usable()
        self._life.require_process()
        return self._exposed.expose(fd, suffix=suffix)

    @property
    def exposed_files(self) -> int:
        """Descriptors currently lent to the DSP (leak checks)."""
        return len(self._exposed)

    # -- remote handles -----------------------------------------------------------------
    def remote_open(self, uri: str) -> int:
        """remotectl open: load the skel named by ``uri``; returns its handle.

        The first open tries ``remotectl1`` (handle 8) and falls back to
        ``remotectl`` (handle 0) for good when the DSP answers anything but 0, as
        libcdsprpc's ``remote_handle_open_domain`` does: a firmware without handle 8
        may answer any code (AEE_ERPC and AEE_ENOSUCHMOD are only the usual ones).
        """
        return self._trace.op(
            "remote_open",
            lambda: {"uri": uri},
            lambda: self._handles.open(uri),
            lambda handle: {"handle": handle},
        )

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
        return self._trace.op(
            "probe_handle",
            lambda: {"handle": handle},
            lambda: self._handles.probe_static(handle),
            lambda rc: {"rc": rc},
        )

    def invoke(
        self, handle: int, sc: int, inputs: Sequence[InArg], outputs: Sequence[OutArg]
    ) -> InvokeResult:
        """Invoke method ``sc`` on a handle opened by :meth:`remote_open`.

        Returns the DSP's result code (0 = success) and the output bytes;
        transport failures raise RpcError.
        """
        return self._trace.invoke(
            handle, sc, inputs, outputs, lambda: self._handles.invoke(handle, sc, inputs, outputs)
        )

    def remote_close(self, handle: int) -> None:
        """remotectl close (handle 0) of a handle from :meth:`remote_open`.

        While invokes on the handle are still on the DSP the close is deferred:
        the last of them closes it (unloading a skel under a running call would
        take the whole DSP process down).
        """
        self._trace.op(
            "remote_close", lambda: {"handle": handle}, lambda: self._handles.close(handle)
        )

    # -- the session as a whole ---------------------------------------------------------
    def interrupted_contexts(self) -> int:
        """Contexts of this fd's INVOKEs that system suspends interrupted, those still
        waiting included: the kernel keeps every one until the fd closes. An INVOKE
        that was waiting during a suspend counts once per suspend (it is restarted under
        a new context each time); one that had not reached its wait yet counts too, so
        the number errs on the high side only."""
        return self._invoker.interrupted_contexts()

    @property
    def dead(self) -> bool:
        """True once the DSP restarted under this session (every call now fails)."""
        return self._life.dead

    def statistics(self) -> SessionStatistics:
        buffers, buffer_bytes = self._buffers.totals()
        mapped, stale = self._mappings.counts()
        listener = self._process.listener
        apps_std = self._process.apps_std
        return SessionStatistics(
            device=self.device,
            shell_loaded=self._life.process_loaded,
            dead=self._life.dead,
            buffers=buffers,
            buffer_bytes=buffer_bytes,
            mapped_buffers=mapped,
            remote_handles=len(self._handles),
            invokes_in_flight=self._life.in_flight,
            invokes_done=self._life.done,
            listener_running=listener is not None and listener.running,
            listener_requests=listener.stats.requests if listener else 0,
            listener_stopped_because=listener.stats.stopped_because if listener else "",
            stale_fds=stale,
            remotectl=self._handles.remotectl_name,
            listener=listener.stats.generation if listener else "",
            refused_paths=apps_std.refused_paths if apps_std else 0,
            listener_retries=listener.stats.retries if listener else 0,
            interrupted_contexts=self._invoker.interrupted_contexts(),
        )

    def close(self, timeout: float | None = None) -> None:
        """Release everything: waits for in-flight invokes, ends the DSP process and
        the listener, frees every buffer, closes both fds. Idempotent.

        With ``timeout``, raises SESSION_BUSY if invokes are still running on the
        DSP after that many seconds; nothing is released then (their memory may
        still be in use), and a later close() can finish the job.
        """
        if self._life.closed:
            return
        self._trace.op("close", lambda: {"timeout": timeout}, lambda: self._close(timeout))

    def _close(self, timeout: float | None) -> None:
        if not self._life.begin_close(timeout):
            return
        buffers = self._buffers.take_all()
        self._handles.forget_all()
        shell, listener = self._process.take_all()
        listener_gone = True
        try:
            leftover = self._exposed.close_all()
            if leftover:
                log.warning("exposed files still lent at close", extra={"closed": leftover})
            if listener is not None:
                listener_gone = self._process.end(listener)
            shared = self._process.take_shared()
            owned = [*buffers, *([shell] if shell is not None else []), *shared]
            self._let_go_of_buffers(owned)
        finally:
            if listener_gone:
                try:
                    self._device.close()
                except OSError as exc:
                    log.error("closing a device fd failed", extra={"error": exc.strerror})
            else:
                # A thread may still enter INVOKE on rpc_fd: closing it could let
                # that call land on whatever fd reuses the number. Keep it open
                # (one fd, until the process exits) rather than risk that.
                log.error("keeping rpc_fd open: the listener thread is still in it")
        log.info("fastrpc session closed", extra={"device": self.device})

    def _let_go_of_buffers(self, owned: list[DmaBuffer]) -> None:
        """At close: every mapping goes with the process (or with rpc_fd), and the
        buffers allocated here are let go (each released now unless held elsewhere)."""
        due = self._mappings.drop_all()
        for buffer in owned:
            if buffer.request_release():  # False: already released, or held elsewhere
                due.append(buffer)
        for buffer in due:
            release_quietly(buffer)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
