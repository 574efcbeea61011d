"""The broker: the daemon's parts, put together for the connections.

:class:`Broker` composes the one DSP and what every domain shares
(:mod:`npud.domain.device`), the domains (:mod:`npud.domain.domains`), the
clients and their quotas (:mod:`npud.requests.clients`), the scheduler
(:mod:`npud.runtime.scheduler`) and the data path that carries requests
(:mod:`npud.datapath.workers`). It admits a client at its Hello (quotas, scheduler
account, domain), releases what it held when it goes, hears of a domain's
restart and tells its clients, charges a hung call to its client, and
assembles the status. The work of each request is in :mod:`npud.requests`,
whose handlers are given their client and its domain and never see the broker.

Lives on the trio thread; ``status``, ``domain_named`` and the watchdog's
``charge_hung`` are safe from any thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any, Final

import structlog
import trio

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud import __version__
from npud.daemon.peers import group_ids
from npud.daemon.penalties import HungCalls
from npud.datapath.workers import DataPath
from npud.domain.device import Device
from npud.domain.domains import Domains
from npud.domain.life import Domain
from npud.ops.backend import Profile
from npud.ops.config import MAX_TIMEOUT_MS, Config
from npud.requests import Handler
from npud.requests.clients import Client, Clients, Kind
from npud.requests.holdings import HeldBuffer, OpenHandle, let_go
from npud.runtime.scheduler import (
    BACKGROUND,
    NORMAL,
    REALTIME,
    AdmissionRefusedError,
    Budget,
    Policy,
    Scheduler,
)

log = structlog.get_logger("npud.daemon.broker")

RELEASE_GRACE: Final = 5.0
"""Seconds an isolated domain's calls get when its client is gone."""


class Broker:
    def __init__(self, config: Config, profile: Profile) -> None:
        self._config = config
        self._realtime_group_ids = group_ids(config.access.realtime_groups)
        self.profile = profile
        self.started = time.monotonic()
        self.clients = Clients(config)
        self.device = Device(profile, config.pool)
        self.device.peer_fds.max_pending = config.uid_limits.max_fds_waiting
        self.device.model_check_seconds = config.daemon.model_check_s
        self.domains = Domains(
            self.device,
            config.domains,
            on_restarted=self._restarted,
            on_reopened=self._reopened,
        )
        policy = config.scheduler
        self.scheduler = Scheduler(
            Policy(
                mode=policy.mode,
                dsp_slots=policy.dsp_slots,
                realtime_reserve=policy.realtime_reserve,
                background_max=policy.background_max,
                background_wait=policy.background_wait_s,
                per_client_running=policy.per_client_running,
                batch_hold_max=policy.batch_hold_max_s,
                batch_overlap=policy.batch_overlap_pct / 100,
                batch_yield=policy.batch_yield,
                realtime_utilisation=policy.realtime_utilisation_pct / 100,
                realtime_utilisation_per_owner=policy.realtime_utilisation_per_uid_pct / 100,
                realtime_default_budget=Budget(
                    policy.realtime_default_period_s,
                    policy.realtime_default_budget_s,
                ),
            )
        )
        self.datapath = DataPath(
            self.scheduler,
            workers=policy.worker_threads,
            frame_timeout=config.daemon.frame_timeout_s,
            call_watchdog=config.daemon.call_watchdog_s,
            on_hung=self.charge_hung,
            batches=policy.batches,
            batch_answer_max=policy.batch_answer_max_s,
        )
        self._revoke: dict[Client, Any] = {}
        """How to close each welcomed client's connection (the connection's revoke)."""
        self.hung = HungCalls()
        """Each user's hung calls (the watchdog's catches), counted across connections."""
        self.dropped = HungCalls()
        """Each user's connections dropped for breaking the protocol (npud.daemon.penalties)."""
        self.privileged = frozenset({0, os.getuid()})
        """Root and npud's own user: they share the plain-named domains (placement)."""
        self._token: trio.lowlevel.TrioToken | None = None

    @property
    def config(self) -> Config:
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        """A reload: access lists, limits and domain rules apply to the next request or
        Hello, the pool's settings at once."""
        old, self._config = self._config, config
        self._realtime_group_ids = group_ids(config.access.realtime_groups)
        self.clients.config = config
        self.domains.config = config.domains
        for client in self.clients:
            client.limits = self.make_limits(client)
            if client.priority is p.Priority.REALTIME and not self.may_be_realtime(client):
                self._demote(client)
        self.device.peer_fds.max_pending = config.uid_limits.max_fds_waiting
        self.device.model_check_seconds = config.daemon.model_check_s
        memory = self.device.memory
        if memory is not None and config.pool != old.pool:
            self.device.closer.submit(lambda: memory.pool.reconfigure(config.pool))

    @property
    def default_domain(self) -> Domain | None:
        return self.domains.default

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        """Verify the shell, open the heap and the default domain. Raises on failure."""
        self._token = trio.lowlevel.current_trio_token()
        try:
            await self.device.start()
            await self.domains.start()
        finally:
            self.datapath.start()

    def attach(self, nursery: trio.Nursery) -> None:
        """Where background work runs from now on: domain recovery, the pool's trim."""
        self.device.attach(nursery)
        self.domains.attach(nursery)

    async def close(self, grace: float) -> None:
        """Close every domain and stop every thread; calls still on the DSP get ``grace``."""
        self.device.stopping = True
        await self.domains.close(grace)
        await self.device.close()
        if not await trio.to_thread.run_sync(self.datapath.stop, 1.0):
            log.warning("data-path worker still in a DSP call at exit")

    def stop_waiting(self) -> None:
        """Shutdown past its grace: nobody waits for calls still on the DSP."""
        self.domains.stop_waiting()
        self.device.stop_waiting()

    @property
    def calls_total(self) -> int:
        """DSP calls answered since start."""
        return self.datapath.calls_done

    def healthy(self) -> bool:
        """What the systemd watchdog ping stands for: the data path's workers and the
        daemon's own lanes are alive. A domain's trouble is the domain's: it restarts its
        DSP process; it never makes the daemon unhealthy."""
        return self.datapath.alive() and all(lane.alive() for lane in self.device.lanes())

    def describe(self) -> str:
        """One line for systemd's STATUS=."""
        default = self.domains.default
        session = default.session if default is not None else None
        dsp = (
            f"DSP up ({self.profile.kind}, {session.capabilities.arch}, epoch {default.epoch})"
            if default is not None and session is not None and default.state == "up"
            else "DSP restarting"
        )
        domains = len(self.domains)
        return f"{len(self.clients)} clients; {domains} domain{'s' * (domains != 1)}; {dsp}"

    # --------------------------------------------------------------- clients
    def grant_priority(self, client: Client, asked: p.Priority) -> p.Priority:
        if asked is p.Priority.REALTIME and not self.may_be_realtime(client):
            return p.Priority.NORMAL
        return asked

    def _demote(self, client: Client) -> None:
        """A reload took ``client``'s user off the realtime lists: normal from now on."""
        client.priority = p.Priority.NORMAL
        if client.account is not None:
            self.scheduler.demote(client.account)
        log.warning(
            "realtime no longer granted (configuration reloaded); the client now runs as normal",
            client=client.name,
            pid=client.pid,
            uid=client.uid,
        )

    def may_be_realtime(self, client: Client) -> bool:
        """Root, npud's own user, and the users and groups ``[access]`` names."""
        access = self.config.access
        groups = set(client.groups or (client.gid,))
        return (
            client.uid in (0, os.getuid())
            or client.uid in access.realtime_uids
            or bool(groups & set(access.realtime_gids))
            or bool(groups & self._realtime_group_ids)
        )

    def make_limits(self, client: Client) -> p.ClientLimits:
        """The limits ``client`` is told and held to, from the configuration now."""
        limits = self.config.client_limits
        return p.ClientLimits(
            priority=client.priority,
            max_in_flight=limits.max_calls_in_flight,
            max_buffers=limits.max_buffers,
            max_buffer_bytes=limits.max_buffer_bytes,
            max_buffer_size=limits.max_buffer_size,
            max_handles=limits.max_handles,
            max_models=limits.max_models,
            max_model_bytes=limits.max_model_bytes,
            max_timeout_ms=MAX_TIMEOUT_MS,
            # The Welcome counts milliseconds; a timeout set below one is one, not none.
            default_timeout_ms=max(1, round(limits.default_timeout_s * 1000))
            if limits.default_timeout_s
            else None,
        )

    async def admit(
        self,
        client: Client,
        budget: p.Budget | None,
        *,
        isolate: bool = False,
        watch: bool = False,
    ) -> Domain:
        """Take ``client`` in (after its Hello): quotas, the scheduler's admission, then
        its domain (opened if it needs one of its own, or ``isolate`` asks for one).
        ``watch``: it only watches; it is counted as a client and joins no domain (the
        domain returned is the default one, whose capabilities its Welcome shows, and
        that it is no member of). Raises CodedError to refuse; nothing is held then."""
        if watch and not isolate:
            default = self.domains.default
            if default is None:
                raise CodedError(ErrorCode.SHUTTING_DOWN)
            self.clients.admit(client)
            client.watch_only = True
            client.limits = self.make_limits(client)
            return default
        if isolate and not self.config.domains.allow_isolate:
            raise CodedError(
                ErrorCode.NOT_PERMITTED,
                detail="a DSP process of one's own ([domains] allow_isolate is false)",
            )
        daemon = self.config.daemon
        refused = (
            None
            if client.uid in self.privileged
            else self.hung.refused(client.uid, daemon.hung_calls_before_revoke)
        )
        if refused is not None:
            calls, left = refused
            raise CodedError(
                ErrorCode.NOT_PERMITTED,
                detail=f"{calls} calls of uid {client.uid} hung past the watchdog; its new "
                f"connections are refused for {max(1, round(left))} s more",
            )
        self.clients.admit(client)
        klass = {p.Priority.REALTIME: REALTIME, p.Priority.NORMAL: NORMAL}.get(
            client.priority, BACKGROUND
        )
        declared = (
            None if budget is None else Budget(budget.period_us / 1e6, budget.budget_us / 1e6)
        )
        try:
            client.account = self.scheduler.open_account(
                client.name, klass, declared, owner=client.uid
            )
        except AdmissionRefusedError as exc:
            self.clients.remove(client)
            raise CodedError(ErrorCode.ADMISSION_REFUSED, detail=str(exc)) from None
        throttled = self.hung.throttle_left(client.uid)
        if throttled > 0:  # its user's call hung a moment ago: a new connection sheds nothing
            self.scheduler.throttle(client.account, throttled)
        placement = self.domains.placement(client.uid, client.groups, client.name, self.privileged)
        if isolate and not placement.isolate:
            # A process of its own is its user's, whoever shares the domain's name.
            owner = None if client.uid in self.privileged else client.uid
            placement = dataclasses.replace(placement, isolate=True, owner=owner)
        try:
            domain = await self.domains.join(placement, client)
        except BaseException:
            self.scheduler.close_account(client.account)
            self.clients.remove(client)
            raise
        client.domain_name = domain.name
        client.limits = self.make_limits(client)
        return domain

    def welcomed(self, client: Client, revoke: Any) -> None:
        """``client``'s connection is served; ``revoke(detail)`` closes it (trio thread)."""
        self._revoke[client] = revoke

    async def release_client(self, client: Client, domain: Domain | None) -> None:
        """Free everything ``client`` holds, and its domain if it had one of its own.
        Call after its requests have ended."""
        self._revoke.pop(client, None)
        self.clients.remove(client)
        if client.account is not None:
            self.scheduler.close_account(client.account)
        entries = client.objects.take_all()
        if domain is None:
            return
        if not self.device.stopping:
            # What it still held is released, never kept: its threads may still be writing it.
            buffers = [e.value for e in entries if e.kind is Kind.BUFFER]
            # A domain of its own ends with its client, and the DSP process's exit
            # unloads every skel: its handles get no remotectl close, as libcdsprpc
            # skips the close of the last handle and ends the session instead.
            handles = [] if domain.isolated else [e.value for e in entries if e.kind is Kind.HANDLE]
            models = [e.value for e in entries if e.kind is Kind.MODEL]
            if buffers or handles or models:
                lane = domain.loader if handles or models else domain.control
                with trio.CancelScope(shield=True):
                    await lane.call(
                        lambda: let_go(domain, buffers=buffers, handles=handles, models=models)
                    )
            memory = self.device.memory
            if memory is not None and memory.pool.holds(client):  # share = client: its own
                with trio.CancelScope(shield=True):
                    await domain.control.call(lambda: memory.pool.drop(client))
        await self.domains.leave(domain, client, RELEASE_GRACE)

    # -------------------------------------------------------------- restarts
    def _restarted(self, domain: Domain, reason: str) -> None:
        """``domain``'s DSP process is gone (trio thread): its clients' DSP objects are
        forgotten, and what lives outside the DSP (buffers of version-2 clients, model
        arenas) is let go."""
        memory = self.device.require_memory()
        memory.forget_lost()
        for member in list(domain.members):
            assert isinstance(member, Client)
            for entry in member.objects.forget_dsp_objects(keep_buffers=member.keeps_buffers):
                value = entry.value
                if isinstance(value, HeldBuffer):
                    memory.release(value.buffer)
                elif entry.kind is Kind.MODEL:
                    # an npud.requests.models.NpuModel (not imported before a model load)
                    value.forget()
                else:
                    assert isinstance(value, OpenHandle)

    async def _reopened(self, domain: Domain, reason: str) -> None:
        """``domain`` has a new session: its clients hear of the new epoch first."""
        event = p.SessionRestarted(epoch=domain.epoch, reason=reason, domain=domain.name)
        for member in list(domain.members):
            assert isinstance(member, Client)
            if member.send_event is not None:
                member.send_event(event)

    def charge_hung(self, handler: Handler[Any], reason: str) -> None:
        """The watchdog caught ``handler``'s call (timer thread): its domain's DSP process
        is ended and restarted, and its user pays (``daemon.hung_call_penalty``; counted
        per uid, :mod:`npud.daemon.penalties`): every connection of the user is throttled, and
        the one whose call hung is revoked past ``hung_calls_before_revoke``."""
        handler.domain.notice_hung(reason, handler.session)
        client = handler.client
        client.hung_calls += 1
        daemon = self.config.daemon
        charge = self.hung.charge(
            client.uid,
            remember=daemon.hung_call_throttle_s,
            revoke_at=daemon.hung_calls_before_revoke,
            revoke_always=daemon.hung_call_penalty == "revoke",
        )
        if daemon.hung_call_throttle_s:
            for other in self.clients:
                if other.uid == client.uid and other.account is not None:
                    self.scheduler.throttle(other.account, daemon.hung_call_throttle_s)
        log.error(
            "hung call charged to its user",
            pid=client.pid,
            uid=client.uid,
            client=client.name,
            domain=handler.domain.name,
            hung_calls=client.hung_calls,
            hung_calls_of_uid=charge.calls,
            penalty="revoke" if charge.revoke else "throttle",
        )
        token = self._token
        if charge.revoke and token is not None:
            detail = (
                f"{charge.calls} calls of uid {client.uid} hung past the watchdog "
                f"({self.config.daemon.call_watchdog_s:g} s)"
            )
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._revoke_client, client, detail)

    def charge_dropped(self, client: Client, reason: str) -> None:
        """``client``'s connection was dropped for breaking the protocol (any thread):
        its user pays, past ``dropped_connections_before_refusal`` drops, with its new
        connections refused for ``dropped_connection_penalty_s`` (:mod:`npud.daemon.penalties`)."""
        if client.uid in self.privileged:
            return
        daemon = self.config.daemon
        charge = self.dropped.charge(
            client.uid,
            remember=daemon.dropped_connection_penalty_s,
            revoke_at=daemon.dropped_connections_before_refusal,
            revoke_always=False,
        )
        if charge.revoke:
            log.warning(
                "dropped connection charged to its user: its new connections are refused",
                pid=client.pid,
                uid=client.uid,
                reason=reason,
                dropped_of_uid=charge.calls,
                seconds=daemon.dropped_connection_penalty_s,
            )

    def refused_for_drops(self, uid: int) -> str | None:
        """Why ``uid``'s new connection is refused now (its connections were dropped too
        often), or None."""
        if uid in self.privileged:
            return None
        refused = self.dropped.refused(uid, self.config.daemon.dropped_connections_before_refusal)
        if refused is None:
            return None
        drops, left = refused
        return (
            f"{drops} connections of uid {uid} were dropped for breaking the protocol; its "
            f"new connections are refused for {max(1, round(left))} s more"
        )

    def _revoke_client(self, client: Client, detail: str) -> None:
        revoke = self._revoke.get(client)
        if revoke is not None:
            revoke(detail)

    async def broadcast(self, event: p.ServerEvent) -> None:
        """Tell every client (sends never block: a slow reader is dropped by the data path)."""
        for client in self.clients:
            if client.send_event is not None:
                client.send_event(event)

    # ---------------------------------------------------------------- status
    def domain_named(self, name: str) -> Domain | None:
        return self.domains.get(name)

    def status(self, viewer: Client | None = None) -> p.DaemonStatus:
        """The daemon's status as ``viewer`` may see it: every client's row for root, for
        npud's own user and for npud itself (no viewer); for anyone else, only the rows
        of its own uid (pids, names and models of other users are theirs). The totals
        count everyone."""
        connected, departed_calls = self.clients.census()
        rows = [c.row() for c in sorted(connected, key=lambda c: c.pid)]
        if viewer is None or viewer.uid in (0, os.getuid()):
            shown = rows
        else:
            shown = [row for row in rows if row.uid == viewer.uid]
        totals = p.Totals(
            clients=len(rows),
            buffers=sum(r.buffers for r in rows),
            bytes=sum(r.bytes for r in rows),
            mappings=sum(r.mappings for r in rows),
            handles=sum(r.handles for r in rows),
            calls_in_flight=sum(r.calls_in_flight for r in rows),
            calls_done=departed_calls + sum(r.calls_done for r in rows),
            models=sum(len(r.models) for r in rows),
            model_bytes=sum(m.bytes for r in rows for m in r.models),
        )
        shell = self.device.shell
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
        default = self.domains.default
        session = default.session if default is not None else None
        memory = self.device.memory
        memory_stats = memory.statistics() if memory is not None else None
        return p.DaemonStatus(
            daemon_version=__version__,
            uptime_ms=int((time.monotonic() - self.started) * 1000),
            backend=self.profile.kind,
            device=self.profile.device_label(session.device) if session else "",
            dsp=default.capabilities() if default is not None else p.DspCapabilities(),
            shell=shell_status,
            epoch=default.epoch if default is not None else 0,
            restarts=default.restarts if default is not None else 0,
            totals=totals,
            clients=tuple(shown[: p.MAX_STATUS_CLIENTS]),
            session=default.session_row() if default is not None else None,
            lanes=self._lane_rows(
                viewer.protocol_version if viewer is not None else p.PROTOCOL_VERSION
            ),
            scheduler=self._scheduler_row(),
            pool=memory.pool.row() if memory is not None else None,
            domains=self.domains.rows(
                None if viewer is None or viewer.uid in self.privileged else viewer.uid
            )[:64],
            memory=(
                p.MemoryRow(
                    source=memory_stats.source,
                    buffers=memory_stats.buffers,
                    bytes=memory_stats.bytes,
                )
                if memory_stats is not None
                else None
            ),
        )

    def _lane_rows(self, protocol_version: int) -> tuple[p.LaneRow, ...]:
        """The daemon's own lanes; before protocol 6 the default domain's first (from 6 on
        each domain's are in its row: PROTOCOL.md section 7.5, Lanes)."""
        rows = []
        default = self.domains.default
        if default is not None and not p.speaks(protocol_version, p.Feature.DOMAIN_LANES):
            rows += list(default.lane_rows())
        rows += [
            p.LaneRow(
                name=stats.name,
                threads=stats.threads,
                queued=stats.queued,
                running=stats.running,
                completed=stats.completed,
            )
            for stats in (lane.statistics() for lane in self.device.lanes())
        ]
        return tuple(rows[:16])

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
