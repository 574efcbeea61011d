"""The life of the one FastRPC session: start, health, recovery from restarts, epochs.

:class:`Dsp` owns the session and the lane threads that run blocking session
calls for trio:

* ``control``: allocation, mapping, client release. One thread, so these never
  wait behind an invoke (invokes run on the data path's workers).
* ``loader``: remotectl open/close (a skel load reads files through the
  listener and can be slow).
* ``closer``: closes fds that peers sent, off the trio thread (a close can block).

It also owns the buffer pool (:mod:`npud.pool`), bound to each session in turn: its
zeroing and trimming run on the control lane, and a restart drops what it kept.

A DSP restart (EPIPE) ends the session: every client's buffers, mappings and
handles are gone with it, a new session is opened as soon as the device is
back, the epoch grows by one and every client is told. :meth:`Dsp.translate` is
the one place where a session call's failure becomes the code a client sees
(:meth:`Dsp.run` on the threads that call the session, :meth:`Dsp.call` on trio).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

import structlog
import trio

import npu_protocol as p
from npu_client.transport import OwnedFd, close_all
from npu_protocol import CodedError, ErrorCode
from npud.backend import Profile
from npud.config import PoolConfig
from npud.fastrpc.errors import RpcError
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.shell import VerifiedShell
from npud.lanes import LanePool, LaneStatistics, LaneTimeoutError
from npud.pool import BufferPool

log = structlog.get_logger("npud.dsp")

T = TypeVar("T")

RECOVERY_POLL: Final = 0.05
"""Seconds between attempts to reopen the device while a restart is young: a subsystem
restart takes about a second, and every 50 ms of polling after it is 50 ms of outage."""
RECOVERY_FAST_FOR: Final = 10.0
"""How long the fast polling lasts; then the attempts back off."""
RECOVERY_BACKOFF: Final = (0.5, 1.0, 2.0, 5.0)
RECOVERY_LOG_EVERY: Final = 2.0
"""Seconds between "DSP not back yet" lines while the device stays away."""
RETIRE_TIMEOUT: Final = 2.0
"""Seconds a dead or hung session gets to close before it is abandoned to the kernel."""
CONTROL_STUCK_SECONDS: Final = 60.0
"""Allocation, mapping and remotectl calls never take this long on a healthy DSP."""

_SESSION_INTERNAL: Final = frozenset({ErrorCode.UNKNOWN_HANDLE, ErrorCode.UNKNOWN_BUFFER})
"""Session errors that name the session's own objects (a DSP handle, a session
buffer number): never shown to a client, whose ids are another table's."""


class Dsp:
    """The session, its lanes, its epoch and its recovery. Lives on the trio thread."""

    def __init__(
        self,
        profile: Profile,
        *,
        forget_clients: Callable[[], None],
        announce: Callable[[p.ServerEvent], Awaitable[None]],
        pool: PoolConfig | None = None,
    ) -> None:
        self.profile = profile
        self.driver = profile.make_driver()
        self.control = LanePool("control", 1)
        self.loader = LanePool("loader", 1)
        self.closer = LanePool("closer", 1)
        self.pool = BufferPool(
            pool or PoolConfig(), self.control.submit, on_filled=self._pool_filled
        )
        self._trimming = False
        self.session: FastRpcSession | None = None
        self.shell: VerifiedShell | None = None
        self.epoch = 0
        self.restarts = 0
        self.stopping = False
        self._forget_clients = forget_clients
        self._announce = announce
        self._recovering = False
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    @property
    def pools(self) -> tuple[LanePool, ...]:
        return (self.control, self.loader, self.closer)

    # ------------------------------------------------------------------ life
    def attach(self, nursery: trio.Nursery) -> None:
        """Where background work (session recovery, the pool's idle trim) runs."""
        self._nursery = nursery
        self._token = trio.lowlevel.current_trio_token()

    async def start(self) -> None:
        """Verify the shell, open the session and load it. Raises on any failure."""
        for pool in self.pools:
            pool.start()
        self.shell = await self.control.call(self.profile.verify_shell)
        self.session = await self._open_session()
        self.pool.attach(self.session)
        self.epoch = 1
        log.info(
            "session ready",
            backend=self.profile.kind,
            device=self.session.device,
            arch=self.session.capabilities.arch,
            shell=str(self.shell.path),
            shell_sha256=self.shell.sha256,
            epoch=self.epoch,
        )

    async def _open_session(self) -> FastRpcSession:
        assert self.shell is not None
        shell = self.shell

        def open_and_load() -> FastRpcSession:
            session = FastRpcSession.open(
                self.driver, nodes=self.profile.nodes, library_path=self.profile.library_path
            )
            session.on_dead = self.notice_restart  # often the listener sees it first
            try:
                session.load_shell(shell.data)
            except BaseException:
                session.close()
                raise
            return session

        return await self.control.call(open_and_load)

    async def close(self, grace: float) -> None:
        """Close the session and stop the lanes; calls still on the DSP get ``grace``
        seconds, the lanes half a second more (all at once)."""
        session, self.session = self.session, None
        self.pool.detach()  # the session's close releases what it kept
        if session is not None:
            try:
                await self.control.call(lambda: session.close(timeout=grace), timeout=grace + 5)
            except (RpcError, LaneTimeoutError) as exc:
                log.error("session not closed cleanly; the kernel frees it at exit", error=str(exc))
        async with trio.open_nursery() as nursery:
            for pool in self.pools:
                nursery.start_soon(self._stop_pool, pool)

    @staticmethod
    async def _stop_pool(pool: LanePool) -> None:
        if not await trio.to_thread.run_sync(pool.stop, 0.5):
            log.warning("lane still busy at exit", lane=pool.name)

    def stop_waiting(self) -> None:
        """Shutdown past its grace: nobody waits for calls still on the DSP."""
        for pool in self.pools:
            pool.stop_waiting()

    def healthy(self) -> bool:
        """Lane threads alive, the control lane not wedged (it only runs short calls),
        and the session usable or being recovered."""
        if not all(pool.alive() for pool in self.pools):
            return False
        if self.control.statistics().oldest_running_seconds >= CONTROL_STUCK_SECONDS:
            return False
        session = self.session
        if session is None:
            return self._recovering or self.stopping
        if session.dead:
            return self._recovering
        return session.listener_running

    def check_session(self) -> None:
        """Notice a restart that no request has run into yet (the listener sees it first)."""
        if self.session is not None and self.session.dead:
            self._start_recovery("the DSP restarted (noticed while idle)")

    def close_later(self, fds: Sequence[int]) -> None:
        """Close peer-supplied fds on a lane: a close can block (SO_LINGER, FUSE...)."""
        if fds:
            owned = [OwnedFd(fd) for fd in fds]
            self.closer.submit(lambda: close_all(owned))

    def describe(self) -> str:
        """One line for systemd's STATUS=."""
        if self.session is None:
            return "DSP restarting"
        return f"DSP up ({self.profile.kind}, {self.session.capabilities.arch}, epoch {self.epoch})"

    def capabilities(self) -> p.DspCapabilities:
        session = self.session
        # A dead session's capabilities are the old epoch's: none until the next one.
        caps = session.capabilities if session is not None and not session.dead else None
        if caps is None or not caps.available:
            return p.DspCapabilities()
        return p.DspCapabilities(
            unsigned_pd_support=int(caps.unsigned_pd),
            hvx_support_64b=caps.hvx_64b,
            hvx_support_128b=caps.hvx_128b,
            vtcm_page=caps.vtcm_page,
            vtcm_count=caps.vtcm_count,
            arch_ver=caps.arch_version,
            hmx_support_depth=caps.hmx_depth,
            hmx_support_spatial=caps.hmx_spatial,
            async_fastrpc_support=int(caps.async_fastrpc),
            status_notification_support=int(caps.status_notification),
        )

    def _pool_filled(self) -> None:
        """The pool kept its first buffer (any thread): trim it from now until it is empty."""
        token = self._token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._start_trimming)

    def _start_trimming(self) -> None:
        if self._trimming or self._nursery is None or self.stopping:
            return
        self._trimming = True
        self._nursery.start_soon(self._trim_pool)

    async def _trim_pool(self) -> None:
        """Have the control lane release what the pool kept too long, when it is due; ends
        when the pool is empty (the next buffer it keeps starts it again)."""
        try:
            while self.pool.holds() and not self.stopping:
                await trio.sleep(self.pool.next_trim_in())
                if self.pool.holds():
                    try:
                        await self.control.call(self.pool.trim)  # one trim queued at a time
                    except Exception:
                        log.exception("trimming the buffer pool failed")
        finally:
            self._trimming = False

    def lane_rows(self) -> tuple[p.LaneRow, ...]:
        return tuple(_lane_row(pool.statistics()) for pool in self.pools)

    def session_row(self) -> p.SessionRow:
        session = self.session
        if session is None:
            return p.SessionRow(state="restarting")
        stats = session.statistics()
        return p.SessionRow(
            state="dead" if stats.dead else "up",
            buffers=stats.buffers,
            remote_handles=stats.remote_handles,
            invokes_in_flight=stats.invokes_in_flight,
            invokes_done=stats.invokes_done,
            listener_running=stats.listener_running,
            listener_requests=stats.listener_requests,
            listener_stopped_because=stats.listener_stopped_because,
        )

    # -------------------------------------------------------------- requests
    def current(self) -> FastRpcSession:
        """The session a new request may use; raises SHUTTING_DOWN or DSP_RESTARTED."""
        if self.stopping:
            raise CodedError(ErrorCode.SHUTTING_DOWN)
        session = self.session
        if session is None:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        if session.dead:
            self.notice_restart("the DSP restarted")
            raise CodedError(ErrorCode.DSP_RESTARTED)
        return session

    async def call(
        self,
        pool: LanePool,
        session: FastRpcSession,
        fn: Callable[[], T],
        *,
        priority: int = 0,
        timeout: float | None = None,
        on_abandoned: Callable[[T], object] | None = None,
        operation: str = "",
    ) -> T:
        """Run ``fn`` (a call on ``session``) on a lane. The one place where its
        failure becomes a client's code, and where a restart is noticed."""
        try:
            result = await pool.call(
                fn, priority=priority, timeout=timeout, on_abandoned=on_abandoned
            )
        except LaneTimeoutError:
            raise CodedError(
                ErrorCode.TIMEOUT,
                operation=operation,
                timeout_ms=round((timeout or 0) * 1000),
            ) from None
        except CodedError as exc:
            raise self.translate(session, exc) from None
        if session is not self.session:
            # The DSP restarted while this ran: what it made died with the old
            # session (whose close releases it).
            raise CodedError(ErrorCode.DSP_RESTARTED)
        return result

    def run(self, session: FastRpcSession, fn: Callable[[], T]) -> T:
        """Run ``fn`` (a call on ``session``) here, on a worker or lane thread; its
        failure becomes a client's code, and a restart is noticed."""
        try:
            result = fn()
        except CodedError as exc:
            raise self.translate(session, exc) from None
        if session is not self.session:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        return result

    def translate(self, session: FastRpcSession, exc: CodedError) -> CodedError:
        """What a client is told of a failed session call. Any thread."""
        replaced = session is not self.session
        if exc.code is ErrorCode.DSP_RESTARTED or session.dead or replaced:
            if not replaced:
                self.notice_restart(str(exc))
            return CodedError(ErrorCode.DSP_RESTARTED)
        if exc.code in _SESSION_INTERNAL:
            # The client's ids are checked before a call is made; the session
            # not knowing its own object is our bug. Its message names the
            # session's numbers, which mean nothing to (and are not for) a client.
            log.error("session lost track of an object", error=str(exc))
            return CodedError(ErrorCode.INTERNAL_ERROR, detail=exc.code.name)
        return exc

    # -------------------------------------------------------------- restarts
    def notice_restart(self, reason: str) -> None:
        """A restart seen on any thread: recovery starts on the trio thread."""
        token = self._token
        if token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(self._start_recovery, reason)

    def notice_hung(self, reason: str) -> None:
        """A call never returned (the data path's watchdog): end the DSP process and
        restart the session, as libcdsprpc does. Any thread."""
        token = self._token
        if token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(self._start_recovery, reason, True)

    def _start_recovery(self, reason: str, end_process: bool = False) -> None:
        if self._recovering or self.stopping or self._nursery is None:
            return
        self._recovering = True
        self._nursery.start_soon(self._recover, reason, end_process)

    async def _recover(self, reason: str, end_process: bool = False) -> None:
        old, self.session = self.session, None
        log.error("DSP restarted; releasing every client's DSP state", reason=reason)
        self._forget_clients()
        self.pool.detach()  # the old session's close releases what it kept
        if old is not None:
            with trio.CancelScope(shield=True):
                await self.control.call(lambda: _retire(old, end_process=end_process))
        started = time.monotonic()
        last_log = float("-inf")
        for attempt in itertools.count():
            if self.stopping:
                return
            try:
                session = await self._open_session()
                break
            except RpcError as exc:
                waited = time.monotonic() - started
                if waited < RECOVERY_FAST_FOR:
                    delay = RECOVERY_POLL
                else:
                    delay = RECOVERY_BACKOFF[min(attempt, len(RECOVERY_BACKOFF) - 1)]
                if time.monotonic() - last_log >= RECOVERY_LOG_EVERY:
                    last_log = time.monotonic()
                    log.warning(
                        "DSP not back yet",
                        error=str(exc),
                        retry_in=delay,
                        waited_s=round(waited, 2),
                    )
                await trio.sleep(delay)
        self.epoch += 1
        self.restarts += 1
        # Every client hears of the new epoch before any answer from the new
        # session can reach it: clients drop what they held when they see it.
        await self._announce(p.SessionRestarted(epoch=self.epoch, reason=reason))
        self.pool.attach(session)
        self.session = session
        self._recovering = False
        log.info(
            "session reopened",
            epoch=self.epoch,
            outage_s=round(time.monotonic() - started, 3),
        )


def _retire(session: FastRpcSession, *, end_process: bool) -> None:
    """Close a session that died or hangs. A call that never returns keeps its memory
    (the kernel frees it when the process exits); the new session does not wait for it."""
    if end_process:
        session.end_process()  # the DSP ends the process: its calls on the DSP fail
    try:
        session.close(timeout=RETIRE_TIMEOUT)
    except RpcError as exc:
        log.error(
            "old session abandoned: calls on it never returned; the kernel frees it at exit",
            error=str(exc),
        )


def _lane_row(stats: LaneStatistics) -> p.LaneRow:
    return p.LaneRow(
        name=stats.name,
        threads=stats.threads,
        queued=stats.queued,
        running=stats.running,
        completed=stats.completed,
    )


def monotonic_ms(since: float) -> int:
    return int((time.monotonic() - since) * 1000)
