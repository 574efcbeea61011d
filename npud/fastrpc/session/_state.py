"""The session's state, and what every job checks or reports through it: usable or
closed, the DSP's death (a restart, or its process ending), calls in flight, tracing."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final, TypeVar

from npu_protocol import AEE, ErrorCode
from npud.fastrpc.kernel.capabilities import DspInfo
from npud.fastrpc.kernel.dma import ComputeBank, DeviceFd, DmaBuffer
from npud.fastrpc.kernel.driver import Driver, IoctlArg
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.trace_hooks import Record, TraceHooks, trace_hooks_of
from npud.fastrpc.reverse.apps_std import AppsStdServer
from npud.fastrpc.reverse.exposed_files import ExposedFiles
from npud.fastrpc.reverse.listener import ReverseRpcListener
from npud.fastrpc.reverse.reverse_modules import ReverseObserver
from npud.fastrpc.session import _remotectl as remotectl
from npud.fastrpc.session._device import checked_ioctl

log = logging.getLogger("npud.fastrpc.session")
"""One logger for the whole session package (its records keep the module's old name)."""

CRASH_NOTICE_SECONDS: Final = 0.2
"""How long a call that answered AEE_EBADSTATE waits for the listener to stop, the sign
that its DSP process ended under it."""

T = TypeVar("T")


class SessionState:
    """The attributes every job of the session shares, and the checks they all use."""

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
        self._interrupted_done = 0
        """Suspends that INVOKEs of this fd waited through, counted when they returned."""
        self._waiting: dict[int, int] = {}
        """INVOKEs on the driver now: the driver's suspend count when each began."""
        self._waiting_ids = itertools.count()

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

    def _ioctl(self, fd: int, request: int, arg: IoctlArg) -> int:
        try:
            return checked_ioctl(self._driver, fd, request, arg, self.device)
        except RpcError as exc:
            if exc.code is ErrorCode.DSP_RESTARTED:
                self._mark_dead(str(exc))
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

    @contextmanager
    def _waiting_call(self) -> Iterator[None]:
        """Around an INVOKE ioctl: the suspends it waits through are counted, each one
        context of this fd that mainline keeps until the fd closes."""
        start = self._driver.suspends()
        with self._state_lock:
            token = next(self._waiting_ids)
            self._waiting[token] = start
        try:
            yield
        finally:
            spanned = self._driver.suspends() - start
            with self._state_lock:
                del self._waiting[token]
                self._interrupted_done += spanned

    def interrupted_contexts(self) -> int:
        """Contexts of this fd's INVOKEs that system suspends interrupted, those still
        waiting included: the kernel keeps every one until the fd closes. An INVOKE
        that was waiting during a suspend counts once per suspend (it is restarted under
        a new context each time); one that had not reached its wait yet counts too, so
        the number errs on the high side only."""
        now = self._driver.suspends()
        with self._state_lock:
            return self._interrupted_done + sum(now - start for start in self._waiting.values())

    def _release_quietly(self, buffer: DmaBuffer) -> None:
        """Release where a caller cannot act on a failure: log it, never strand the rest."""
        try:
            buffer.release()
        except (RpcError, BufferError, OSError) as exc:
            log.error("releasing buffer failed", extra={"buffer": buffer.id, "error": str(exc)})

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
