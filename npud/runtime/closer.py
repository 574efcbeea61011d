"""Closing the fds peers send, where a close that blocks holds up no one else.

A client's fd may take long to close: a socket with SO_LINGER waits for its unsent
data, a file on a FUSE filesystem waits for the filesystem's daemon, which the client
may run. npud closes what peers sent (stray fds, the fds of a refused or broken frame,
a model file once its load is over) here, never on the trio thread, a worker or a
domain's lane, and:

* one thread per uid does the closing, started when needed and gone when idle: a close
  that blocks holds up only the closes of its own user;
* a socket is reset (SO_LINGER 0) before it is closed, so it never lingers;
* every uid's fds waiting to be closed are counted: :meth:`Closer.submit` says when a
  uid has more waiting than its cap (``[uid_limits] max_fds_waiting``), and the
  connection that sent
  them is then dropped (npud cannot refuse fds it was already given, but it can stop
  reading more from that peer).
"""

from __future__ import annotations

import collections
import os
import socket
import stat
import struct
import threading
from collections.abc import Sequence
from typing import Final

import structlog

log = structlog.get_logger("npud.runtime.closer")

MAX_PENDING_PER_UID: Final = 64
"""Fds of one uid waiting to be closed, at most, before its connections are dropped
(``[uid_limits] max_fds_waiting``)."""
IDLE_SECONDS: Final = 5.0
"""A uid's closing thread ends after this long with nothing to close."""
_NO_LINGER: Final = struct.pack("ii", 1, 0)


def close_now(fd: int) -> None:
    """Close ``fd`` (owned); a socket is reset first, so the close cannot linger."""
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _NO_LINGER)
    except OSError:
        pass  # not a socket we can set options on: closed all the same
    try:
        os.close(fd)
    except OSError as exc:
        log.warning("closing a peer's fd failed", error=exc.strerror)


class _Worker:
    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.queue: collections.deque[int] = collections.deque()
        self.thread: threading.Thread | None = None


class Closer:
    """See the module docstring. Any thread may :meth:`submit`."""

    def __init__(
        self, max_pending_per_uid: int = MAX_PENDING_PER_UID, idle_seconds: float = IDLE_SECONDS
    ) -> None:
        self.max_pending = max_pending_per_uid
        """The cap :meth:`submit` checks; a reload may change it."""
        self._idle = idle_seconds
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._workers: dict[int, _Worker] = {}
        self._pending: collections.Counter[int] = collections.Counter()
        self._stopping = False
        self.closed = 0

    def submit(self, uid: int, fds: Sequence[int]) -> bool:
        """Close ``fds`` (now owned here) on ``uid``'s thread. False when ``uid`` has more
        than the cap waiting to be closed: its sender should be dropped."""
        if not fds:
            with self._lock:
                return self._pending[uid] <= self.max_pending
        with self._lock:
            if self._stopping:
                run_here = True
            else:
                run_here = False
                worker = self._workers.get(uid)
                if worker is None:
                    worker = self._workers[uid] = _Worker(uid)
                worker.queue.extend(fds)
                self._pending[uid] += len(fds)
                if worker.thread is None:
                    worker.thread = threading.Thread(
                        target=self._run, args=(worker,), name=f"closer:{uid}", daemon=True
                    )
                    worker.thread.start()
                self._wake.notify_all()
                within = self._pending[uid] <= self.max_pending
        if run_here:  # stopping: no thread is left to do it
            for fd in fds:
                close_now(fd)
            return True
        return within

    def pending(self, uid: int | None = None) -> int:
        """Fds waiting to be closed: ``uid``'s, or everyone's."""
        with self._lock:
            return self._pending[uid] if uid is not None else sum(self._pending.values())

    def threads(self) -> int:
        with self._lock:
            return sum(worker.thread is not None for worker in self._workers.values())

    def close(self, timeout: float) -> bool:
        """Close what is queued, then stop the threads; later submits close at once, on
        the caller's thread. False when a thread is still inside a close after
        ``timeout`` (it is left to end on its own: a daemon thread)."""
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
            threads = [w.thread for w in self._workers.values() if w.thread is not None]
        done = True
        for thread in threads:
            thread.join(timeout)
            if thread.is_alive():
                done = False
        if not done:
            log.warning("a close of a peer's fd is still blocked at exit")
        return done

    def _run(self, worker: _Worker) -> None:
        while True:
            with self._lock:
                if not worker.queue and not self._stopping:
                    self._wake.wait_for(
                        lambda: bool(worker.queue) or self._stopping, timeout=self._idle
                    )
                if not worker.queue:
                    worker.thread = None
                    del self._workers[worker.uid]
                    return
                fd = worker.queue.popleft()
            close_now(fd)
            with self._lock:
                self._pending[worker.uid] -= 1
                if not self._pending[worker.uid]:
                    del self._pending[worker.uid]
                self.closed += 1
