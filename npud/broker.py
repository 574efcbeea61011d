"""The broker: one FastRPC session shared by every client.

:class:`Broker` ties the daemon's parts together for the connections: the
session's life (:mod:`npud.dsp`), the clients and their quotas
(:mod:`npud.clients`) and the configuration; the work of each request is in
:mod:`npud.requests`. It runs on the trio thread.

A client's resources are released when its connection ends, after any call of
it already on the DSP has returned (the session defers releasing what an
invoke uses).
"""

from __future__ import annotations

import os
import time

import structlog
import trio

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud import __version__
from npud.backend import Profile
from npud.clients import Client, Clients, Kind
from npud.config import MAX_TIMEOUT_MS, Config
from npud.dsp import Dsp
from npud.fastrpc.dma import SessionBuffer
from npud.fastrpc.session import FastRpcSession
from npud.requests import release_session_objects

log = structlog.get_logger("npud.broker")


class Broker:
    def __init__(self, config: Config, profile: Profile) -> None:
        self._config = config
        self.profile = profile
        self.started = time.monotonic()
        self.clients = Clients(config)
        self.dsp = Dsp(
            profile,
            invoke_lanes=config.backend.lanes,
            forget_clients=self.clients.forget_all,
            announce=self.broadcast,
        )
        self.calls_total = 0

    @property
    def config(self) -> Config:
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        """A reload: access lists and limits apply to the next request."""
        self._config = config
        self.clients.config = config

    # ------------------------------------------------------------------ life
    def attach(self, nursery: trio.Nursery) -> None:
        self.dsp.attach(nursery)

    async def start(self) -> None:
        await self.dsp.start()

    async def close(self, grace: float) -> None:
        await self.dsp.close(grace)

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
        limits = self.config.client_limits
        return p.ClientLimits(
            priority=client.priority,
            max_in_flight=limits.max_calls_in_flight,
            max_buffers=limits.max_buffers,
            max_buffer_bytes=limits.max_buffer_bytes,
            max_handles=limits.max_handles,
            max_timeout_ms=MAX_TIMEOUT_MS,
            default_timeout_ms=limits.default_timeout_ms or None,
        )

    async def release_client(self, client: Client) -> None:
        """Free everything ``client`` holds. Call after its requests have ended."""
        self.clients.remove(client)
        entries = client.objects.take_all()
        if self.dsp.stopping:
            return  # at shutdown, closing the session releases everything at once
        await self.release(
            self.dsp.session,
            buffers=[e.value for e in entries if e.kind is Kind.BUFFER],
            handles=[e.value for e in entries if e.kind is Kind.HANDLE],
        )

    async def release(
        self,
        session: FastRpcSession | None,
        *,
        buffers: list[SessionBuffer] | None = None,
        handles: list[int] | None = None,
        strict: bool = False,
    ) -> None:
        """Close ``handles`` and free ``buffers`` of ``session``, shielded.

        ``strict``: a client asked for it, so the first failure is raised (as
        the client's code); otherwise failures are logged. Objects of a session
        that is gone were released with it.
        """
        buffers, handles = buffers or [], handles or []
        if not buffers and not handles:
            return
        if session is None or session is not self.dsp.session:
            if strict:
                raise CodedError(ErrorCode.DSP_RESTARTED)
            return
        dsp = self.dsp
        pool = dsp.loader if handles else dsp.control
        with trio.CancelScope(shield=True):
            failures = await dsp.call(
                pool,
                session,
                lambda: release_session_objects(session, buffers, handles),
                operation="release",
            )
        for failure in failures:
            if strict:
                raise dsp.translate(session, failure) from None
            log.warning("release failed", code=failure.code.name, error=str(failure))

    async def broadcast(self, event: p.ServerEvent) -> None:
        """Tell every client at once; one that cannot take it promptly is dropped."""
        async with trio.open_nursery() as nursery:
            for client in self.clients:
                if client.send_event is not None:
                    nursery.start_soon(client.send_event, event)

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
        )
