"""One domain: one FastRPC session, one DSP process, its lanes, epoch and recovery.

A :class:`Domain` owns its session and two lane threads that run its blocking
session calls for trio:

* ``control``: allocation, mapping, the pool's zeroing, client release. One thread,
  so these never wait behind an invoke (invokes run on the data path's workers).
* ``loader``: remotectl open and close, model load and unload (a skel or model load
  reads files through the listener and can be slow).

What the domain holds on the DSP is in its :class:`~npud.domain.registry.Registry`.

A fault of the domain's DSP process (EPIPE from a subsystem restart, the process
ending, a call past the watchdog) ends this domain's session only: its clients'
DSP objects are forgotten, a new session is opened as soon as the device lets it,
the epoch grows by one and the domain's clients are told. Other domains see
nothing; a subsystem restart of the whole DSP reaches every domain, and each
recovers on its own. :meth:`Domain.translate` is the one place where a session
call's failure becomes the code a client sees.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Final, Literal, TypeVar

import structlog
import trio

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.domain.device import LANE_STOP_SECONDS, Device
from npud.domain.digests import FileDigests
from npud.domain.registry import Registry
from npud.fastrpc.kernel.capabilities import (
    DSPSIGNAL_DSP_SUPPORT,
    MAP_DMA_HANDLE_REVERSERPC,
    PERF_V2_DSP_SUPPORT,
    PROC_SHARED_BUFFER_SUPPORT,
    DspInfo,
)
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.session import FastRpcSession
from npud.runtime.lanes import LanePool, LaneTimeoutError

log = structlog.get_logger("npud.domain")

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
WAIT_THREADS: Final = 4
"""Threads of a domain's waits lane: two waiting calls for each of two clients."""

_SESSION_INTERNAL: Final = frozenset({ErrorCode.UNKNOWN_HANDLE, ErrorCode.UNKNOWN_BUFFER})
"""Session errors that name the session's own objects (a DSP handle, a session
buffer number): never shown to a client, whose ids are another table's."""

State = Literal["starting", "up", "restarting", "closing", "closed"]

Restarted = Callable[["Domain", str], None]
"""Called on the trio thread when the domain's DSP process is gone (its clients'
objects are forgotten there), with the reason."""
Reopened = Callable[["Domain", str], Awaitable[None]]
"""Awaited on the trio thread once the new session is up, before it is used (the
domain's clients are told of the new epoch there)."""


class Domain:
    """See the module docstring. Lives on the trio thread; ``current``, ``run``,
    ``translate`` and the ``notice_*`` methods may be called from any thread."""

    def __init__(
        self,
        device: Device,
        name: str,
        *,
        isolated: bool = False,
        owner: int | None = None,
        on_restarted: Restarted = lambda domain, reason: None,
        on_reopened: Reopened | None = None,
    ) -> None:
        self.device = device
        self.name = name
        self.isolated = isolated
        self.owner = owner
        """The user this DSP process is counted against (``max_domains_per_uid``) and
        closed for when it leaves; None: shared, or the privileged users'."""
        self.control = LanePool(f"control:{name}", 1)
        self.loader = LanePool(f"loader:{name}", 1)
        self.waits = LanePool(f"waits:{name}", WAIT_THREADS)
        """Calls that wait for the DSP (dspqueue's wait_signal): no scheduler slot, no
        worker, no watchdog."""
        self.session: FastRpcSession | None = None
        self.registry = Registry(self.control.submit, lambda: self.session)
        self.digests = FileDigests()
        """The digests of model files loaded here (shared loads are found by them)."""
        self.epoch = 0
        self.restarts = 0
        self.hung_calls = 0
        self.suspend_reopens = 0
        """Sessions reopened to free the contexts that suspends left on their fds."""
        self._dsp_seconds = 0.0
        """DSP time of its clients' calls and op batches (under ``_lock``)."""
        self._invokes_retired = 0
        """FastRPC calls of the sessions this domain closed (under ``_lock``)."""
        self._retiring: FastRpcSession | None = None
        """The session being closed after a fault, its calls not yet in ``_invokes_retired``."""
        self.state: State = "starting"
        self.created = time.monotonic()
        self.members: set[object] = set()
        """The clients in this domain (trio thread)."""
        self._on_restarted = on_restarted
        self._on_reopened = on_reopened
        self._recovering = False
        self._recovered: trio.Event | None = None
        """Set when the recovery under way ends (close waits for it: a session it opens
        after the close began is closed there, never left open)."""
        self._lock = threading.Lock()
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    def __repr__(self) -> str:
        return f"<Domain {self.name} epoch={self.epoch} {self.state}>"

    @property
    def lanes(self) -> tuple[LanePool, ...]:
        return (self.control, self.loader, self.waits)

    def _named_lanes(self) -> tuple[tuple[str, LanePool], ...]:
        """Each lane with the name the status gives it (PROTOCOL.md section 7.5, Lanes)."""
        return (("control", self.control), ("loader", self.loader), ("waits", self.waits))

    @property
    def stopping(self) -> bool:
        return self.device.stopping or self.state in ("closing", "closed")

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        """Start the lanes, open the session and load the shell. Raises on failure
        (the lanes are stopped again). A restart is recovered once :meth:`attach`
        gave the domain a nursery."""
        self._token = trio.lowlevel.current_trio_token()
        for lane in self.lanes:
            lane.start()
        try:
            self.session = await self._open_session()
        except BaseException:
            self.state = "closed"
            with trio.CancelScope(shield=True):
                await self._stop_lanes()
            raise
        self.epoch = 1
        self.state = "up"
        log.info(
            "domain ready",
            domain=self.name,
            isolated=self.isolated,
            uid=self.owner,
            backend=self.device.kind,
            device=self.session.device,
            arch=self.session.capabilities.arch,
            epoch=self.epoch,
        )

    def attach(self, nursery: trio.Nursery) -> None:
        """Where recovery runs."""
        self._nursery = nursery
        session = self.session
        if session is not None and session.dead:
            self._start_recovery("the DSP restarted (before the domain was attached)")

    async def _open_session(self) -> FastRpcSession:
        shell = self.device.shell
        assert shell is not None, "the device verifies the shell first"
        profile, driver = self.device.profile, self.device.driver

        def open_and_load() -> FastRpcSession:
            session = FastRpcSession.open(
                driver, nodes=profile.nodes, library_path=profile.library_path
            )
            # Often the listener sees it first, on its own thread.
            session.on_dead = functools.partial(self._session_dead, session)
            try:
                session.load_shell(shell.data)
            except BaseException:
                session.close()
                raise
            return session

        return await self.control.call(open_and_load)

    def abandoned(self, reason: str) -> None:
        """The client of this isolated domain hung up with calls still on its DSP process
        (a dspqueue ``wait_signal`` never returns on its own): end the process now, as
        the end of a libcdsprpc process does, so they return and the client can be let
        go. Any thread; the exit goes on the device's closer lane, not this domain's."""
        session = self.session
        if not self.isolated or session is None or self.state != "up":
            return
        log.info(
            "client gone with calls on its DSP process; ending it", domain=self.name, reason=reason
        )
        self.device.closer.submit(session.end_process)

    async def close(self, grace: float) -> None:
        """Close the session and stop the lanes; calls still on the DSP get ``grace``
        seconds, the lanes half a second more. What the DSP held is forgotten."""
        if self.state == "closed":
            return
        self.state = "closing"
        recovered = self._recovered
        if self._recovering and recovered is not None:
            # A restart is under way (its client left meanwhile): it sees "closing" and
            # stops, closing a session it just opened; the lanes it runs on stay up until.
            await recovered.wait()
        with self._lock:
            session, self.session = self.session, None
            self._retiring = session
        self.registry.forget_all()
        self.digests.clear()
        if session is not None:
            try:
                await self.control.call(lambda: session.close(timeout=grace), timeout=grace + 5)
            except (RpcError, LaneTimeoutError) as exc:
                log.error(
                    "session not closed cleanly; the kernel frees it at exit",
                    domain=self.name,
                    error=str(exc),
                )
            self._count_retired(session)
        await self._stop_lanes()
        self.state = "closed"
        log.info("domain closed", domain=self.name, epoch=self.epoch)

    async def _stop_lanes(self) -> None:
        async with trio.open_nursery() as nursery:
            for lane in self.lanes:
                nursery.start_soon(_stop_lane, lane)

    def stop_waiting(self) -> None:
        """Shutdown past its grace: nobody waits for calls still on the DSP."""
        for lane in self.lanes:
            lane.stop_waiting()

    def healthy(self) -> bool:
        """Lanes alive, the control lane not wedged, the session usable or recovering."""
        if self.state != "up":
            return self.state in ("restarting", "starting")
        if not all(lane.alive() for lane in self.lanes):
            return False
        if self.control.statistics().oldest_running_seconds >= CONTROL_STUCK_SECONDS:
            return False
        session = self.session
        if session is None or session.dead:
            return self._recovering
        return session.listener_running

    def check_session(self) -> None:
        """Notice a restart that no request has run into yet (the listener sees it first)."""
        session = self.session
        if session is not None and session.dead:
            self._start_recovery("the DSP restarted (noticed while idle)", False, session)

    @property
    def interrupted_contexts(self) -> int:
        """Contexts the kernel keeps for this domain's fd: its calls that system suspends
        interrupted (they go when the session's fd closes). Any thread."""
        session = self.session
        return session.interrupted_contexts() if session is not None else 0

    def reopen_for_suspends(self, held: int, total: int, limit: int) -> None:
        """Reopen the session to free the ``held`` contexts suspends left on its fd
        (``total`` of npud's, ``limit`` the setting): its clients see a DSP restart.
        Trio thread."""
        session = self.session
        if session is None or self._recovering or self.state != "up":
            return
        reason = (
            f"reopening the session: system suspends interrupted {held} of its calls, whose "
            f"contexts the kernel keeps until its fd closes ({total} of npud's, limit "
            f"{limit}; the CDSP has 255 for every program)"
        )
        log.warning(
            "session reopened to free contexts that suspends left",
            domain=self.name,
            interrupted_contexts=held,
            npud_total=total,
            limit=limit,
        )
        self.suspend_reopens += 1
        # The process is ended first: calls that wait on it (a dspqueue wait_signal)
        # return, so the old fd can be released at once and its contexts with it.
        self._start_recovery(reason, True, session)

    def capabilities(self) -> p.DspCapabilities:
        session = self.session
        # A dead session's capabilities are the old epoch's: none until the next one.
        caps = session.capabilities if session is not None and not session.dead else None
        return capabilities_record(caps)

    def session_row(self) -> p.SessionRow:
        session = self.session
        if session is None:
            return p.SessionRow(state="restarting" if self.state != "closed" else "closed")
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
            refused_paths=stats.refused_paths,
            interrupted_contexts=stats.interrupted_contexts,
        )

    def lane_rows(self) -> tuple[p.LaneRow, ...]:
        return tuple(_lane_row(lane, name) for name, lane in self._named_lanes())

    # -------------------------------------------------------------- requests
    def current(self) -> FastRpcSession:
        """The session a new request may use; raises SHUTTING_DOWN or DSP_RESTARTED."""
        if self.stopping:
            raise CodedError(ErrorCode.SHUTTING_DOWN)
        session = self.session
        if session is None:
            raise CodedError(ErrorCode.DSP_RESTARTED)
        if session.dead:
            self.notice_restart("the DSP restarted", session)
            raise CodedError(ErrorCode.DSP_RESTARTED)
        return session

    def run(self, session: FastRpcSession, fn: Callable[[], T]) -> T:
        """Run ``fn`` (a call on ``session``) here, on a worker or lane thread; its
        failure becomes a client's code, and a restart is noticed."""
        try:
            result = fn()
        except CodedError as exc:
            raise self.translate(session, exc) from None
        if session is not self.session:
            # The DSP restarted while this ran: what it made died with the old
            # session (whose close releases it).
            raise CodedError(ErrorCode.DSP_RESTARTED)
        return result

    def translate(self, session: FastRpcSession, exc: CodedError) -> CodedError:
        """What a client is told of a failed session call. Any thread."""
        replaced = session is not self.session
        if exc.code is ErrorCode.DSP_RESTARTED or session.dead or replaced:
            if not replaced:
                self.notice_restart(str(exc), session)
            return CodedError(ErrorCode.DSP_RESTARTED)
        if exc.code in _SESSION_INTERNAL:
            # The client's ids are checked before a call is made; the session
            # not knowing its own object is our bug. Its message names the
            # session's numbers, which mean nothing to (and are not for) a client.
            log.error("session lost track of an object", domain=self.name, error=str(exc))
            return CodedError(ErrorCode.INTERNAL_ERROR, detail=exc.code.name)
        return exc

    # -------------------------------------------------------------- restarts
    def _session_dead(self, session: FastRpcSession, reason: str) -> None:
        self.notice_restart(reason, session)

    def notice_restart(self, reason: str, session: FastRpcSession | None = None) -> None:
        """A restart seen on any thread: recovery starts on the trio thread. ``session``:
        the session the news is about; news of one already replaced is old and changes
        nothing (a listener may stop, or a watchdog fire, after its domain restarted)."""
        self._soon(reason, False, session)

    def notice_hung(self, reason: str, session: FastRpcSession | None = None) -> None:
        """A call never returned (the data path's watchdog): end the DSP process and
        restart this domain's session, as libcdsprpc does. Any thread."""
        with self._lock:
            self.hung_calls += 1
        self._soon(reason, True, session)

    def _soon(self, reason: str, end_process: bool, session: FastRpcSession | None) -> None:
        token = self._token
        if token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(self._start_recovery, reason, end_process, session)

    def _start_recovery(
        self, reason: str, end_process: bool = False, session: FastRpcSession | None = None
    ) -> None:
        if session is not None and session is not self.session:
            return  # about a session this domain no longer has
        if self._recovering or self.state != "up" or self.device.stopping:
            return
        if self._nursery is None:
            return
        self._recovering = True
        self._recovered = trio.Event()
        self.state = "restarting"
        self._nursery.start_soon(self._recover, reason, end_process)

    async def _recover(self, reason: str, end_process: bool) -> None:
        try:
            await self._recover_session(reason, end_process)
        finally:
            self._recovering = False
            if self._recovered is not None:
                self._recovered.set()

    async def _recover_session(self, reason: str, end_process: bool) -> None:
        with self._lock:
            old, self.session = self.session, None
            self._retiring = old
        log.error(
            "DSP process of the domain gone; releasing its clients' DSP state",
            domain=self.name,
            reason=reason,
        )
        self.registry.forget_all()
        self._on_restarted(self, reason)
        if old is not None:
            with trio.CancelScope(shield=True):
                await self.control.call(lambda: _retire(old, self.name, end_process=end_process))
            self._count_retired(old)
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
                        domain=self.name,
                        error=str(exc),
                        retry_in=delay,
                        waited_s=round(waited, 2),
                    )
                await trio.sleep(delay)
        if self.stopping:  # closed (or npud stopping) while it opened: not to be used
            with trio.CancelScope(shield=True):
                await self.control.call(lambda: _retire(session, self.name, end_process=False))
            return
        self.epoch += 1
        self.restarts += 1
        # Every client of the domain hears of the new epoch before any answer from
        # the new session can reach it: clients drop what they held when they see it.
        if self._on_reopened is not None:
            await self._on_reopened(self, reason)
        self.session = session
        self.state = "up" if not self.stopping else self.state
        log.info(
            "domain session reopened",
            domain=self.name,
            epoch=self.epoch,
            outage_s=round(time.monotonic() - started, 3),
        )

    def _count_retired(self, session: FastRpcSession) -> None:
        """``session`` is closed: its calls join the domain's total (nothing counts twice:
        until now the row counted it as the one retiring)."""
        done = session.statistics().invokes_done
        with self._lock:
            self._invokes_retired += done
            if self._retiring is session:
                self._retiring = None

    def charge_dsp(self, seconds: float) -> None:
        """A call or an op batch of a client of this domain used ``seconds`` of DSP."""
        with self._lock:
            self._dsp_seconds += seconds

    def row(self, clients: int) -> p.DomainRow:
        with self._lock:
            session, retiring, retired = self.session, self._retiring, self._invokes_retired
            dsp_seconds = self._dsp_seconds
        stats = session.statistics() if session is not None else None
        before = retired + (retiring.statistics().invokes_done if retiring is not None else 0)
        registry = self.registry.statistics()
        return p.DomainRow(
            name=self.name,
            isolated=self.isolated,
            state=self.state if not (stats and stats.dead) else "dead",
            epoch=self.epoch,
            restarts=self.restarts,
            hung_calls=self.hung_calls,
            clients=clients,
            mappings=registry.mappings,
            mapped_bytes=registry.mapped_bytes,
            remote_handles=stats.remote_handles if stats else 0,
            models=registry.shared,
            invokes_in_flight=stats.invokes_in_flight if stats else 0,
            invokes_done=stats.invokes_done if stats else 0,
            uptime_ms=int((time.monotonic() - self.created) * 1000),
            invokes_total=before + (stats.invokes_done if stats else 0),
            lanes=self.lane_rows(),
            interrupted_contexts=stats.interrupted_contexts if stats else 0,
            suspend_reopens=self.suspend_reopens,
            dsp_us=round(dsp_seconds * 1_000_000),
        )


def _retire(session: FastRpcSession, domain: str, *, end_process: bool) -> None:
    """Close a session that died or hangs. A call that never returns keeps its memory
    (the kernel frees it when the process exits); the new session does not wait for it."""
    if end_process:
        session.end_process()  # the DSP ends the process: its calls on the DSP fail
    try:
        session.close(timeout=RETIRE_TIMEOUT)
    except RpcError as exc:
        log.error(
            "old session abandoned: calls on it never returned; the kernel frees it at exit",
            domain=domain,
            error=str(exc),
        )


async def _stop_lane(lane: LanePool) -> None:
    if not await trio.to_thread.run_sync(lane.stop, LANE_STOP_SECONDS):
        log.warning("lane still busy at exit", lane=lane.name)


def _lane_row(lane: LanePool, name: str) -> p.LaneRow:
    stats = lane.statistics()
    return p.LaneRow(
        name=name,
        threads=stats.threads,
        queued=stats.queued,
        running=stats.running,
        completed=stats.completed,
    )


def capabilities_record(caps: DspInfo | None) -> p.DspCapabilities:
    """What the wire says of the DSP's GET_DSP_INFO answers: zeros when it gave none."""
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
        status_notification_support=caps.status_notification_answer,
        status_notifications=caps.status_notification,
        perf_v2_dsp_support=caps.attribute(PERF_V2_DSP_SUPPORT),
        map_dma_handle_reverserpc=caps.attribute(MAP_DMA_HANDLE_REVERSERPC),
        dspsignal_dsp_support=caps.attribute(DSPSIGNAL_DSP_SUPPORT),
        proc_shared_buffer_support=caps.attribute(PROC_SHARED_BUFFER_SUPPORT),
    )
