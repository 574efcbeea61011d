"""systemd integration: sd_notify messages and socket activation.

A small module of our own rather than a library: the two protocols are a
datagram of ``KEY=value`` lines and three environment variables, while the
bindings on PyPI either compile against libsystemd (systemd-python, cysystemd:
a C toolchain and headers on every machine that installs npud) or are
unmaintained (sdnotify). What we need fits on this page and is tested
against a real NOTIFY_SOCKET and a real passed fd.

Protocols, as sd_notify(3) and sd_listen_fds(3) define them:

* NOTIFY_SOCKET names an AF_UNIX datagram socket (a leading ``@`` means the
  abstract namespace). We send ``READY=1``, ``STATUS=...``, ``WATCHDOG=1``,
  ``RELOADING=1`` with ``MONOTONIC_USEC=``, and ``STOPPING=1``.
* WATCHDOG_USEC (and WATCHDOG_PID, when set, must be our pid) asks for a
  ``WATCHDOG=1`` at least that often; we ping at half the interval.
* LISTEN_PID must be our pid; LISTEN_FDS sockets start at fd 3. We unset the
  variables once read, so a child process never takes them for its own.
"""

from __future__ import annotations

import enum
import os
import socket
import stat
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

SD_LISTEN_FDS_START: Final = 3


class ActivationError(Exception):
    """The passed fds are not what npud can listen on; the message says what is wrong."""


ANNOUNCE_PATIENCE: Final = 5.0
"""Seconds a state change (READY=1, RELOADING=1, STOPPING=1) that finds the notify
socket's queue full is kept and retried; a STATUS= or WATCHDOG=1 is dropped at once."""


class _Sent(enum.Enum):
    SENT = "sent"
    FULL = "full"
    """The reader's queue is full (EAGAIN): it may read later."""
    FAILED = "failed"
    """Nobody listens there (ECONNREFUSED, ENOENT...): the message is lost."""


class Notifier:
    """Sends sd_notify messages; every method is a no-op outside systemd.

    Nothing here ever waits. The socket is non-blocking: a reader that stops
    reading (a supervisor that only wanted READY=1) fills its queue, and a
    blocking ``sendto`` would then stop npud's event loop for good, signals
    included. A full queue drops a routine message (STATUS=, WATCHDOG=1: the
    next one says the same); a state change is kept, in order, for
    :data:`ANNOUNCE_PATIENCE` seconds and sent by :meth:`flush`, which the
    caller calls again while it returns True.
    """

    def __init__(
        self, address: str | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        self._address: str | None = None
        self._sock: socket.socket | None = None
        self.address = address
        """NOTIFY_SOCKET as given (empty outside systemd), for messages."""
        self._clock = clock
        self._held: deque[tuple[float, bytes]] = deque()
        """State changes waiting for room in the reader's queue, with their deadlines."""
        self.dropped = 0
        """Messages dropped because the reader's queue stayed full."""
        if address:
            self._address = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(
                socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            )

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    @property
    def waiting(self) -> bool:
        """State changes wait for room: call :meth:`flush` again soon."""
        return bool(self._held)

    def send(self, *lines: str) -> bool:
        """Send one routine datagram now; False (never an exception, never a wait) when
        not under systemd, nobody listens, or the reader's queue is full (then the
        message is dropped, and so it is while state changes still wait before it)."""
        if self._sock is None:
            return False
        if self.flush():
            self.dropped += 1
            return False
        sent = self._try("\n".join(lines).encode())
        if sent is _Sent.FULL:
            self.dropped += 1
        return sent is _Sent.SENT

    def announce(self, *lines: str) -> bool:
        """Send a state change: now if the reader's queue has room (True), else kept
        and retried by :meth:`flush` for :data:`ANNOUNCE_PATIENCE` seconds."""
        if self._sock is None:
            return False
        data = "\n".join(lines).encode()
        if not self.flush():  # nothing waits before it
            sent = self._try(data)
            if sent is not _Sent.FULL:
                return sent is _Sent.SENT
        self._held.append((self._clock() + ANNOUNCE_PATIENCE, data))
        return False

    def flush(self) -> bool:
        """Send the state changes kept for want of room, in order; True while some still
        wait (within their patience), False once all are sent or given up."""
        while self._held:
            deadline, data = self._held[0]
            if self._try(data) is _Sent.FULL:
                if self._clock() < deadline:
                    return True
                self.dropped += 1
            self._held.popleft()
        return False

    def _try(self, data: bytes) -> _Sent:
        if self._sock is None or self._address is None:
            return _Sent.FAILED
        try:
            self._sock.sendto(data, self._address)
        except BlockingIOError:
            return _Sent.FULL
        except OSError:
            return _Sent.FAILED
        return _Sent.SENT

    def ready(self, status: str) -> bool:
        return self.announce("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.announce("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading")

    def stopping(self) -> bool:
        return self.announce("STOPPING=1", "STATUS=stopping")

    def close(self) -> None:
        self._held.clear()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval() -> float | None:
    """Seconds between pings systemd wants (half its timeout), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None


@dataclass(frozen=True)
class ActivatedSocket:
    sock: socket.socket
    path: str


def activated_socket() -> ActivatedSocket | None:
    """The listening socket systemd passed, or None when not socket-activated.

    Exactly one fd is accepted, and it must be a listening AF_UNIX stream
    socket bound to a path: anything else is an ActivationError (a unit that
    passes the wrong thing should fail loudly, not serve on it).
    """
    pid = os.environ.pop("LISTEN_PID", None)
    count = os.environ.pop("LISTEN_FDS", None)
    os.environ.pop("LISTEN_FDNAMES", None)
    if pid is None or count is None:
        return None
    if pid != str(os.getpid()):
        return None  # meant for another process (we were started by a child of it)
    try:
        n = int(count)
    except ValueError:
        raise ActivationError(f"LISTEN_FDS={count!r} is not a number") from None
    if n != 1:
        raise ActivationError(
            f"systemd passed {n} sockets; npud.socket must define exactly one ListenStream="
        )
    fd = SD_LISTEN_FDS_START
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        raise ActivationError(f"passed fd {fd} is not open: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise ActivationError(f"passed fd {fd} is not a socket")
    sock = socket.socket(fileno=fd)
    try:
        problem = _listening_unix_stream_problem(sock)
        if problem:
            raise ActivationError(f"passed fd {fd} {problem}")
        os.set_inheritable(fd, False)
        path = sock.getsockname()
        if not isinstance(path, str) or not path:
            raise ActivationError(f"passed fd {fd} is not bound to a filesystem path")
    except BaseException:
        sock.detach()  # not ours to close on the error path: systemd owns it
        raise
    return ActivatedSocket(sock, path)


def _listening_unix_stream_problem(sock: socket.socket) -> str:
    if sock.family != socket.AF_UNIX:
        return f"is not an AF_UNIX socket (family {sock.family!r})"
    if sock.type != socket.SOCK_STREAM:
        return f"is not a stream socket (type {sock.type!r})"
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return "is not listening"
    return ""
