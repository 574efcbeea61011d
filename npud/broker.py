"""The broker: one FastRPC session shared by every client.

:class:`Broker` ties the daemon's parts together for the connections: the
session's life (:mod:`npud.dsp`), the clients and their quotas
(:mod:`npud.clients`), the scheduler (:mod:`npud.scheduler`), the data path
that carries requests (:mod:`npud.datapath`) and the configuration; the work of
each request is in :mod:`npud.requests`. It lives on the trio thread; the
methods the request handlers call (``release_now``, ``status``, ``count_call``)
are safe from any thread.

A client's resources are released when its connection ends, after any call of
it already on the DSP has returned (the session defers releasing what an
invoke uses).
"""

from __future__ import annotations

import os
import threading
import time

import structlog
import trio

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud import __version__
from npud.backend import Profile
from npud.clients import Client, Clients, Kind
from npud.config import MAX_TIMEOUT_MS, Config
from npud.datapath import DataPath
from npud.dsp import Dsp
from npud.fastrpc.dma import SessionBuffer
from npud.fastrpc.session import FastRpcSession
from npud.models import NpuModel
from npud.requests import Route, release_session_objects
from npud.scheduler import (
    BACKGROUND,
    NORMAL,
    REALTIME,
    AdmissionRefusedError,
    Budget,
    Policy,
    Scheduler,
)

log = structlog.get_logger("npud.broker")


class Broker:
    def __init__(self, config: Config, profile: Profile) -> None:
        self._config = config
        self.profile = profile
        self.started = time.monotonic()
        self.clients = Clients(config)
        self.dsp = Dsp(
            profile,
            forget_clients=self.clients.forget_all,
            announce=self.broadcast,
            pool=config.pool,
        )
        policy = config.scheduler
        self.scheduler = Scheduler(
            Policy(
                mode=policy.mode,
                dsp_slots=policy.dsp_slots,
                realtime_reserve=policy.realtime_reserve,
                background_max=policy.background_max,
                background_wait=policy.background_wait_ms / 1000,
                per_client_running=policy.per_client_running,
                realtime_utilisation=policy.realtime_utilisation_pct / 100,
            )
        )
        self.datapath = DataPath(
            self.scheduler,
            {Route.CONTROL: self.dsp.control, Route.LOADER: self.dsp.loader},
            workers=policy.worker_threads,
            frame_timeout=config.daemon.frame_timeout,
            call_watchdog=config.daemon.call_watchdog,
            on_hung=self.dsp.notice_hung,
        )
        self._calls_total = 0
        self._calls_lock = threading.Lock()

    @property
    def config(self) -> Config:
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        """A reload: access lists and limits apply to the next request, the pool's
        settings at once."""
        old, self._config = self._config, config
        self.clients.config = config
        if config.pool != old.pool:
            self.dsp.pool.reconfigure(config.pool)

    # ------------------------------------------------------------------ life
    def attach(self, nursery: trio.Nursery) -> None:
        self.dsp.attach(nursery)

    async def start(self) -> None:
        try:
            await self.dsp.start()
        finally:
            self.datapath.start()

    async def close(self, grace: float) -> None:
        """Close the session and stop every thread; calls still on the DSP get ``grace``."""
        await self.dsp.close(grace)
        if not await trio.to_thread.run_sync(self.datapath.stop, 1.0):
            log.warning("data-path worker still in a DSP call at exit")

    @property
    def calls_total(self) -> int:
        """DSP calls answered since start."""
        return self._calls_total

    def count_call(self) -> None:
        with self._calls_lock:
            self._calls_total += 1

    def healthy(self) -> bool:
        return self.dsp.healthy() and self.datapath.alive()

    def describe(self) -> str:
        """One line for systemd's STATUS=."""
        return f"{len(self.clients)} clients; {self.dsp.describe()}"

    # --------------------------------------------------------------- clients
    def grant_priority(self, client: Client, asked: p.Priority) -> p.Priority:
        access = self.config.access
        if asked is p.Priority.REALTIME and (access.realtime_uids or access.realtime_gids):
            allowed = (
                client.uid in (0, os.getuid())
                or client.uid in access.realtime_uids
                or client.gid in access.realtime_gids
            )
            if not allowed:
                return p.Priority.NORMAL
        return asked

    def client_limits(self, client: Client) -> p.ClientLimits:
        """The limits ``client`` was told (every invoke checks them: made once per
        configuration, not per call)."""
        cached = client.limits_cache
        if cached is not None and cached[0] is self._config:
            return cached[1]
        limits = self.config.client_limits
        made = p.ClientLimits(
            priority=client.priority,
            max_in_flight=limits.max_calls_in_flight,
            max_buffers=limits.max_buffers,
            max_buffer_bytes=limits.max_buffer_bytes,
            max_handles=limits.max_handles,
            max_models=limits.max_models,
            max_model_bytes=limits.max_model_bytes,
            max_timeout_ms=MAX_TIMEOUT_MS,
            default_timeout_ms=limits.default_timeout_ms or None,
        )
        client.limits_cache = (self._config, made)
        return made

    def admit(self, client: Client, budget: p.Budget | None) -> None:
        """Take ``client`` in (after its Hello): quotas, then the scheduler's admission."""
        self.clients.admit(client)
        klass = {p.Priority.REALTIME: REALTIME, p.Priority.NORMAL: NORMAL}.get(
            client.priority, BACKGROUND
        )
        declared = (
            None if budget is None else Budget(budget.period_us / 1e6, budget.budget_us / 1e6)
        )
        try:
            client.account = self.scheduler.open_account(client.name, klass, declared)
        except AdmissionRefusedError as exc:
            self.clients.remove(client)
            raise CodedError(ErrorCode.ADMISSION_REFUSED, detail=str(exc)) from None

    async def release_client(self, client: Client) -> None:
        """Free everything ``client`` holds. Call after its requests have ended."""
        self.clients.remove(client)
        if client.account is not None:
            self.scheduler.close_account(client.account)
        entries = client.objects.take_all()
        if self.dsp.stopping:
            return  # at shutdown, closing the session releases everything at once
        # What it still held is released, never kept: its threads may still be writing it.
        await self.release(
            self.dsp.session,
            buffers=[e.value for e in entries if e.kind is Kind.BUFFER],
            handles=[e.value for e in entries if e.kind is Kind.HANDLE],
            models=[e.value for e in entries if e.kind is Kind.MODEL],
        )
        pool = self.dsp.pool
        if pool.holds(client):  # share = client: what it freed was kept for it alone
            with trio.CancelScope(shield=True):
                await self.dsp.control.call(lambda: pool.drop(client))

    async def release(
        self,
        session: FastRpcSession | None,
        *,
        buffers: list[SessionBuffer] | None = None,
        handles: list[int] | None = None,
        models: list[NpuModel] | None = None,
    ) -> None:
        """:meth:`release_now` on a lane (a disconnected client's leftovers), shielded."""
        if not buffers and not handles and not models:
            return
        pool = self.dsp.loader if handles or models else self.dsp.control
        with trio.CancelScope(shield=True):
            await pool.call(
                lambda: self.release_now(session, buffers=buffers, handles=handles, models=models)
            )

    def recycle(self, client: Client, buffer: SessionBuffer) -> None:
        """``client`` freed ``buffer``: the pool keeps it, or it is released here (a lane
        thread); a failure is raised as the client's code."""
        session, pool = self.dsp.session, self.dsp.pool
        if not pool.give(session, pool.scope(client, client.uid), buffer):
            self.release_now(session, buffers=[buffer], strict=True)

    def release_now(
        self,
        session: FastRpcSession | None,
        *,
        buffers: list[SessionBuffer] | None = None,
        handles: list[int] | None = None,
        models: list[NpuModel] | None = None,
        strict: bool = False,
    ) -> None:
        """Release ``models``, close ``handles`` and free ``buffers`` of ``session``, here
        (a lane thread).

        ``strict``: a client asked for it, so the first failure is raised (as
        the client's code); otherwise failures are logged. Objects of a session
        that is gone were released with it.
        """
        buffers, handles, models = buffers or [], handles or [], models or []
        if not buffers and not handles and not models:
            return
        if session is None or session is not self.dsp.session:
            if strict:
                raise CodedError(ErrorCode.DSP_RESTARTED)
            return
        for failure in release_session_objects(session, buffers, handles, models):
            if strict:
                raise self.dsp.translate(session, failure) from None
            log.warning("release failed", code=failure.code.name, error=str(failure))

    async def broadcast(self, event: p.ServerEvent) -> None:
        """Tell every client (sends never block: a slow reader is dropped by the data path)."""
        for client in self.clients:
            if client.send_event is not None:
                client.send_event(event)

    # ---------------------------------------------------------------- status
    def status(self) -> p.DaemonStatus:
        clients = sorted(self.clients, key=lambda c: c.pid)
        rows = [c.row() for c in clients]
        totals = p.Totals(
            clients=len(rows),
            buffers=sum(r.buffers for r in rows),
            bytes=sum(r.bytes for r in rows),
            mappings=sum(r.mappings for r in rows),
            handles=sum(r.handles for r in rows),
            calls_in_flight=sum(r.calls_in_flight for r in rows),
            calls_done=sum(r.calls_done for r in rows),
            models=sum(len(r.models) for r in rows),
            model_bytes=sum(m.bytes for r in rows for m in r.models),
        )
        dsp, shell = self.dsp, self.dsp.shell
        shell_status = (
            p.ShellStatus(
                verified=True,
                path=str(shell.path),
                sha256=shell.sha256,
                detail=f"{shell.size} bytes, key {shell.key_fingerprint[:16]}"
                + (" (development key)" if self.profile.allow_development_key else ""),
            )
            if shell
            else p.ShellStatus(verified=False)
        )
        return p.DaemonStatus(
            daemon_version=__version__,
            uptime_ms=int((time.monotonic() - self.started) * 1000),
            backend=self.profile.kind,
            device=self.profile.device_label(dsp.session.device) if dsp.session else "",
            dsp=dsp.capabilities(),
            shell=shell_status,
            epoch=dsp.epoch,
            restarts=dsp.restarts,
            totals=totals,
            clients=tuple(rows[: p.MAX_STATUS_CLIENTS]),
            session=dsp.session_row(),
            lanes=dsp.lane_rows(),
            scheduler=self._scheduler_row(),
            pool=dsp.pool.row(),
        )

    def _scheduler_row(self) -> p.SchedulerRow:
        stats = self.scheduler.statistics()
        return p.SchedulerRow(
            mode=stats.mode,
            dsp_slots=stats.dsp_slots,
            queued_realtime=stats.queued[REALTIME],
            queued_normal=stats.queued[NORMAL],
            queued_background=stats.queued[BACKGROUND],
            running_realtime=stats.running[REALTIME],
            running_normal=stats.running[NORMAL],
            running_background=stats.running[BACKGROUND],
            utilisation_pct=round(stats.utilisation * 100),
            realtime_declared_pct=round(stats.realtime_declared * 100),
            dispatched=stats.dispatched,
            late=stats.late,
        )
