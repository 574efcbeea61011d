"""Lifecycle: the session's statistics and its close (in-flight calls awaited, the DSP
process ended, every buffer let go once, the device fd closed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.session._handles import RemoteHandles
from npud.fastrpc.session._state import log


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
    interrupted_contexts: int = 0
    """INVOKEs of this fd that a system suspend interrupted while they waited for the DSP:
    mainline keeps each one's context (one of the channel's 255) until the fd closes."""


class Lifecycle(RemoteHandles):
    """The session's state as a whole, and its close."""

    def statistics(self) -> SessionStatistics:
        interrupted = self.interrupted_contexts()
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
                interrupted_contexts=interrupted,
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
