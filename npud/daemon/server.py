"""The listening socket and the daemon's main loop.

Binding: a stale socket file left by a dead daemon is replaced; a socket with
a live daemon behind it, or a path that is not a socket, stops start-up with
a message that says so. The socket gets the configured mode and group.

Every accepted peer is identified with SO_PEERCRED and checked against the
allow-list before a byte of it is read.

Shutdown (SIGTERM/SIGINT): stop accepting, tell every client, let requests in
flight finish within the grace period, release everything, close the session.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gc
import grp
import os
import signal
import socket
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec
import structlog
import trio

import npu_protocol as p
from npu_client.transport import fds_ancillary
from npu_protocol import CodedError, ErrorCode
from npud.daemon.broker import Broker
from npud.daemon.connection import PeerConnection
from npud.daemon.peers import identify
from npud.daemon.sd import Notifier, watchdog_interval
from npud.ops import cli
from npud.ops.config import Config, ConfigError
from npud.ops.loglimit import PeerBudgets
from npud.ops.logs import set_level
from npud.requests.clients import Client

log = structlog.get_logger("npud.daemon.server")

STATUS_INTERVAL: Final = 5.0
"""Seconds between STATUS= updates to systemd."""
SUSPEND_CHECK_INTERVAL: Final = 0.5
"""Seconds between looks at the suspend count (two clock reads): a resume is seen well
before the next suspend, seconds later at the soonest."""
FREEZE_AFTER_READY: Final = 1.0
"""Seconds after ready at which what start-up made is frozen (:meth:`Daemon._freeze`)."""
NOTIFY_RETRY: Final = 0.05
"""Seconds between retries of a state change the notify socket had no room for."""
REFUSE_LINGER: Final = 1.0
REFUSE_DRAIN_BYTES: Final = 64 * 1024


class StartupError(Exception):
    """npud cannot start; the message says what is wrong and how to fix it, and
    ``exit_status`` is npud's exit status for it (sysexits, ``npud --help``)."""

    def __init__(self, message: str, exit_status: int = cli.EX_CANTCREAT) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class SocketPathError(StartupError):
    """The socket's path names something else (a directory, a file): a usage error when
    ``--socket`` named it, a configuration error when the configuration did."""


@dataclass
class BoundSocket:
    sock: socket.socket
    path: Path
    inode: int

    def unlink_if_ours(self) -> None:
        """Remove the socket file, unless another daemon has replaced it since."""
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)


def bind_socket(path: Path, mode: int, group: str) -> BoundSocket:
    """Bind and listen on ``path``; replace a stale socket file, refuse a live one."""
    _clear_stale(path)
    if not path.parent.is_dir():
        try:
            path.parent.mkdir(mode=0o755, parents=True)
        except OSError as exc:
            raise StartupError(
                f"cannot create {path.parent} for the socket: {exc.strerror}; "
                "create it or pass --socket PATH"
            ) from None
    gid = -1
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise StartupError(
                f"socket_group {group!r} does not exist; create it (groupadd {group}) "
                "or clear daemon.socket_group",
                cli.EX_CONFIG,
            ) from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        # umask keeps the socket closed between bind and chmod.
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chown(path, -1, gid)
        os.chmod(path, mode)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {path}: {exc.strerror}") from None
    return BoundSocket(sock, path, os.stat(path).st_ino)


def _clear_stale(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StartupError(
            f"cannot inspect socket path {path}: {exc.strerror}", cli.EX_IOERR
        ) from None
    if not stat.S_ISSOCK(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise SocketPathError(
                f"{path} is a directory; name the socket file itself (--socket or "
                f"daemon.socket), e.g. {path / 'npud.sock'}"
            )
        raise SocketPathError(f"{path} exists and is not a socket; remove it or pass --socket PATH")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except ConnectionRefusedError:
        log.warning("replacing a stale socket left by a daemon that is gone", path=str(path))
        os.unlink(path)
        return
    except OSError as exc:
        raise StartupError(f"cannot probe {path}: {exc.strerror}", cli.EX_IOERR) from None
    finally:
        probe.close()
    raise StartupError(
        f"another npud is already listening on {path}; stop it (systemctl stop npud) "
        "or pass --socket PATH",
        cli.EX_TEMPFAIL,
    )


def peer_allowed(config: Config, uid: int, groups: tuple[int, ...]) -> bool:
    """Root, npud's own user, a listed uid, or a member of a listed group (primary or
    supplementary)."""
    access = config.access
    return (
        uid in (0, os.getuid())
        or uid in access.allow_uids
        or bool(set(groups) & set(access.allow_gids))
    )


class Daemon:
    def __init__(
        self,
        config: Config,
        broker: Broker,
        listener: socket.socket,
        *,
        notifier: Notifier | None = None,
        reload_config: Callable[[], Config] | None = None,
    ) -> None:
        self.config = config
        self.broker = broker
        self.listener = trio.socket.from_stdlib_socket(listener)
        self.notifier = notifier or Notifier("")
        self._reload_config = reload_config
        self._connections: set[PeerConnection] = set()
        self._handshakes: collections.Counter[int] = collections.Counter()
        self._refusals = PeerBudgets(
            log, config.daemon.log_burst, config.daemon.log_summary_interval_s
        )
        self._stop = trio.Event()
        self._notify_waiting = trio.Event()
        """Set when a state change waits for room in the notify socket's queue."""
        self._notify_dropped = 0

    @property
    def connections(self) -> int:
        """Connections being served: from their admission to the handshake until the
        connection has ended, its client's holdings let go and its socket closed (a
        client's count in the status drops earlier, before what it held is released)."""
        return len(self._connections)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the session, serve until SIGTERM/SIGINT, then shut down cleanly.

        A start-up failure (shell refused, no device) is raised as is, after
        the lanes are stopped.
        """
        signals_of_interest = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        try:
            with trio.open_signal_receiver(*signals_of_interest) as signals:
                await self.broker.start()
                async with trio.open_nursery() as nursery:
                    self.broker.attach(nursery)
                    nursery.start_soon(self._accept_loop, nursery)
                    nursery.start_soon(self._report_status)
                    nursery.start_soon(self._watch_signals, signals)
                    interval = watchdog_interval()
                    if interval is not None:
                        nursery.start_soon(self._feed_watchdog, interval)
                    nursery.start_soon(self._freeze)
                    nursery.start_soon(self._retry_notifications)
                    nursery.start_soon(self._watch_suspends)
                    self._announced(self.notifier.ready(self.broker.describe()))
                    log.info("ready", socket=self.listener.getsockname())
                    task_status.started()
                    await self._stop.wait()
                    self.notifier.stopping()
                    await self._shutdown(nursery)
                # STOPPING=1 (and anything before it) had its retries cancelled with the
                # nursery: they go on here, as long as their patience lasts.
                while self.notifier.flush():
                    await trio.sleep(NOTIFY_RETRY)
        finally:
            with trio.CancelScope(shield=True):
                # The grace was spent waiting for the calls; what still runs now
                # is left to the kernel, which frees it when the process exits.
                await self.broker.close(0.0 if self._stop.is_set() else 1.0)
        log.info("stopped")

    async def _freeze(self) -> None:
        """What start-up made lives as long as the daemon: out of the collector's sight,
        its full collections stay short (a 35 ms pause every second under load
        otherwise, with the GIL held). The collection before the freeze (tens of ms)
        runs a moment after ready: no client waits for it to say Hello."""
        await trio.sleep(FREEZE_AFTER_READY)
        gc.collect()
        gc.freeze()

    def stop(self) -> None:
        """Shut down as on SIGTERM (call on the trio thread)."""
        self._stop.set()

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                self._reload()
                continue
            log.info("stopping", signal=signal.Signals(signum).name)
            self.stop()

    # ------------------------------------------------------------- systemd
    def _announced(self, sent: bool) -> None:
        """After a state change went to the notifier: if it waits for room, retry it."""
        if not sent and self.notifier.waiting:
            self._notify_waiting.set()

    async def _retry_notifications(self) -> None:
        """Send the state changes the notify socket had no room for, never waiting on it."""
        while True:
            await self._notify_waiting.wait()
            self._notify_waiting = trio.Event()
            while self.notifier.flush():
                await trio.sleep(NOTIFY_RETRY)

    def _report_drops(self) -> None:
        dropped = self.notifier.dropped
        if dropped > self._notify_dropped:
            log.warning(
                "the notify socket takes no more messages; whoever reads NOTIFY_SOCKET "
                "(systemd, make run's helper) has stopped reading",
                dropped=dropped - self._notify_dropped,
                socket=self.notifier.address,
            )
            self._notify_dropped = dropped

    async def _report_status(self) -> None:
        last_calls, last_time = self.broker.calls_total, trio.current_time()
        while True:
            await trio.sleep(STATUS_INTERVAL)
            now, calls = trio.current_time(), self.broker.calls_total
            rate = (calls - last_calls) / max(now - last_time, 1e-9)
            last_calls, last_time = calls, now
            self.broker.domains.check_sessions()
            self.notifier.status(f"{self.broker.describe()}; {rate:.1f} calls/s")
            self._report_drops()

    async def _watch_suspends(self) -> None:
        """After each system suspend, let the domains count the contexts the kernel kept
        for their interrupted calls (and reopen sessions before the CDSP runs out)."""
        driver = self.broker.device.driver
        seen = driver.suspends()
        while True:
            await trio.sleep(SUSPEND_CHECK_INTERVAL)
            now = driver.suspends()
            if now != seen:
                seen = now
                log.info("system suspend seen", suspends=now)
                self.broker.domains.check_interrupted()

    async def _feed_watchdog(self, interval: float) -> None:
        """Ping only while healthy: a wedged lane or a dead thread lets systemd restart us."""
        while True:
            self.broker.domains.check_sessions()
            if self.broker.healthy():
                self.notifier.watchdog()
            else:
                log.error("unhealthy: withholding the watchdog ping")
            await trio.sleep(interval)

    def _reload(self) -> None:
        """SIGHUP: re-read the config; access lists, limits and log level apply at once."""
        self._announced(self.notifier.reloading())
        if self._reload_config is None:
            log.warning("reload requested, but npud has no config file to re-read")
        else:
            try:
                new = self._reload_config()
            except ConfigError as exc:
                log.error("reload failed; keeping the running configuration", error=str(exc))
                self._announced(
                    self.notifier.ready(f"{self.broker.describe()}; reload failed: {exc}")
                )
                return
            self.config = applied = apply_reload(self.config, new)
            self.broker.config = applied
            set_level(applied.daemon.log_level)
            revoked = 0
            for connection in list(self._connections):
                client = connection.client
                if not peer_allowed(applied, client.uid, client.groups or (client.gid,)):
                    revoked += 1
                    connection.revoke(
                        f"uid {client.uid} (gid {client.gid}) is no longer allowed to use npud "
                        "(the configuration was reloaded)"
                    )
            log.info("configuration reloaded", clients=len(self._connections), revoked=revoked)
        self._announced(self.notifier.ready(self.broker.describe()))

    # ------------------------------------------------------------- clients
    async def _accept_loop(self, clients: trio.Nursery) -> None:
        while True:
            try:
                sock, _ = await self.listener.accept()
            except trio.ClosedResourceError:
                return  # shutting down
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                    log.error("the listening socket is unusable", error=os.strerror(exc.errno))
                    raise
                # EMFILE, ENFILE, ENOBUFS, ECONNABORTED, EPERM...: transient or the
                # peer's problem; never the end of the daemon.
                log.error("accept failed; backing off", error=os.strerror(exc.errno or 0))
                await trio.sleep(0.1)
                continue
            clients.start_soon(self._serve_client, sock)

    async def _serve_client(self, sock: trio.socket.SocketType) -> None:
        try:
            pid, uid, gid, groups = identify(sock)
        except OSError as exc:
            log.warning("connection dropped: no peer credentials", error=exc.strerror)
            sock.close()
            return
        if not peer_allowed(self.config, uid, groups):
            self._refusals.note(uid, "connection refused: not on the allow-list", pid=pid, gid=gid)
            await _refuse(sock, f"uid {uid} (gid {gid}) is not allowed to use npud")
            return
        if self.broker.device.stopping:
            await _refuse_code(sock, p.ErrorMessage.for_code(ErrorCode.SHUTTING_DOWN))
            return
        # Before anything of it is read: a user that gets dropped over and over (for
        # stray fds, fatal frames) costs one accept per try while its penalty runs.
        penalty = self.broker.refused_for_drops(uid)
        if penalty is not None:
            self._refusals.note(uid, "connection refused: dropped too often", pid=pid)
            await _refuse(sock, penalty)
            return
        # Connections that have not said Hello are counted apart from clients
        # (admitted at their Hello): sockets that connect and say nothing hold
        # only these slots, a few per user, and only until hello_timeout_s.
        daemon = self.config.daemon
        for used, limit, what in (
            (sum(self._handshakes.values()), daemon.max_handshakes, "connections"),
            (self._handshakes[uid], daemon.max_handshakes_per_uid, "connections of this user"),
        ):
            if used >= limit:
                self._refusals.note(
                    uid, "connection refused: too many waiting for their Hello", pid=pid
                )
                await _refuse_code(
                    sock,
                    p.ErrorMessage.for_code(
                        ErrorCode.QUOTA_EXCEEDED, resource=f"{what} before Hello", limit=limit
                    ),
                )
                return
        self._handshakes[uid] += 1
        released = False

        def handshake_over() -> None:
            nonlocal released
            if not released:
                released = True
                self._handshakes[uid] -= 1

        connection = PeerConnection(
            self.broker,
            _stdlib_socket(sock),
            Client(pid=pid, uid=uid, gid=gid, groups=groups),
        )
        self._connections.add(connection)
        try:
            await connection.serve(handshake_over)
        except Exception:
            # One client's failure is never the daemon's.
            log.exception("client connection failed", pid=pid, uid=uid)
        finally:
            handshake_over()
            self._connections.discard(connection)

    async def _shutdown(self, nursery: trio.Nursery) -> None:
        grace = self.config.daemon.shutdown_grace_s
        self.broker.device.stopping = True
        self.listener.close()
        await self.broker.broadcast(
            p.ShuttingDown(reason="npud is stopping", grace_ms=int(grace * 1000))
        )
        datapath = self.broker.datapath
        with trio.move_on_after(grace):
            while any(link.pending for link in datapath.links()):
                await trio.sleep(0.02)
        # Past the grace every request still unanswered is told (SHUTTING_DOWN,
        # as shutting_down promised), the clients are closed, and nobody waits
        # for calls still on the DSP: the process exit releases them.
        stopping = CodedError(ErrorCode.SHUTTING_DOWN)
        for link in datapath.links():
            datapath.fail_unanswered(link, stopping)
            link.drop("npud is stopping")
        self.broker.stop_waiting()
        nursery.cancel_scope.cancel()


def apply_reload(running: Config, new: Config) -> Config:
    """What a reload may change: access, limits and log level. The rest needs a restart."""
    fixed = {
        "backend": (running.backend, new.backend),
        "shell": (running.shell, new.shell),
        "daemon.socket": (running.daemon.socket, new.daemon.socket),
        "daemon.socket_mode": (running.daemon.socket_mode, new.daemon.socket_mode),
        "daemon.socket_group": (running.daemon.socket_group, new.daemon.socket_group),
        "daemon.log_format": (running.daemon.log_format, new.daemon.log_format),
    }
    for key, (old, wanted) in fixed.items():
        if old != wanted:
            log.warning("this change needs a restart; ignored until then", key=key)
    return msgspec.structs.replace(
        new,
        backend=running.backend,
        shell=running.shell,
        daemon=msgspec.structs.replace(
            running.daemon,
            log_level=new.daemon.log_level,
            shutdown_grace_s=new.daemon.shutdown_grace_s,
        ),
    )


async def _refuse(sock: trio.socket.SocketType, detail: str) -> None:
    await _refuse_code(sock, p.ErrorMessage.for_code(ErrorCode.NOT_PERMITTED, detail=detail))


async def _refuse_code(sock: trio.socket.SocketType, message: p.ErrorMessage) -> None:
    """Send one ErrorMessage, then close without resetting the connection.

    Closing a socket with unread data makes the kernel send a reset, which can
    destroy the error before the peer reads it; so read (and discard) what the
    peer sends, briefly and boundedly, after shutting down our side.
    """
    data, fds = p.ServerConnection().send(message)
    with trio.move_on_after(REFUSE_LINGER), contextlib.suppress(OSError):
        await sock.sendmsg([data], fds_ancillary(fds))
        sock.shutdown(socket.SHUT_WR)
        drained = 0
        while drained < REFUSE_DRAIN_BYTES:
            chunk = await sock.recv(4096)
            if not chunk:
                break
            drained += len(chunk)
    sock.close()


def _stdlib_socket(sock: trio.socket.SocketType) -> socket.socket:
    """The accepted socket as a plain socket object: after the handshake it belongs
    to the data path's threads, not to trio."""
    plain = socket.socket(fileno=sock.detach())
    plain.setblocking(False)
    return plain
