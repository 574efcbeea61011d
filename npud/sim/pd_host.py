"""npud's side of the PD processes: the zygote, and one child per emulated DSP process.

* :class:`Zygote` starts ``python -m npud.sim.zygote`` (:mod:`npud.sim.zygote`)
  and asks it to fork children. Zygotes are shared within npud's process by
  every driver whose children run as the same user: :func:`acquire_zygote`
  gives a :class:`ZygoteLease`, and the zygote ends (its control socket
  closed, the process reaped, its empty working directory removed) when the
  last lease is released. A zygote that died is replaced at the next spawn.
* :class:`PdChild` (:mod:`npud.sim.pd_child_handle`, importable from here too)
  is one child: its socket and its pidfd (killed with ``pidfd_send_signal``,
  never by pid). Calls carry ids and run at once; the thread that waits for a
  call's answer serves what the child asks meanwhile (``Work`` on the channel's
  shared compute, ``ReadFile`` through reverse RPC) and re-emits its log records.

Nothing here starts a thread. A child that ends while a call waits (killed by
the driver, crashed, or breaking the wire) makes that call raise
:class:`PdGoneError`; the DSP process decides what the call answers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Final

import msgspec

from npud.sim import pd_wire as wire
from npud.sim.pd_child_handle import (
    EXIT_TIMEOUT,
    MAX_OPEN_JOBS,
    BufferSpan,
    CallServices,
    CallTransfer,
    MemoryRef,
    PdChild,
    PdGoneError,
)

__all__ = [  # PdChild and its call types moved to pd_child_handle: importable from here
    "EXIT_TIMEOUT",
    "HELLO_TIMEOUT",
    "MAX_OPEN_JOBS",
    "READY_TIMEOUT",
    "BufferSpan",
    "CallServices",
    "CallTransfer",
    "Credentials",
    "MemoryRef",
    "PdChild",
    "PdGoneError",
    "PdSpawnError",
    "Preload",
    "Zygote",
    "ZygoteLease",
    "acquire_zygote",
    "credentials_for",
    "live_zygotes",
]

log = logging.getLogger(__name__)

READY_TIMEOUT: Final = 120.0
"""Seconds a zygote may take to import and drop privileges (a cold start on a slow disk)."""
HELLO_TIMEOUT: Final = 30.0

_CHILD: Final = msgspec.msgpack.Decoder(wire.ChildMessage)
_READY: Final = msgspec.msgpack.Decoder(wire.Ready)

Credentials = tuple[int, int] | None
"""The (uid, gid) children run as, or None: npud's own uid (npud is not root)."""
Preload = Sequence[str]
"""Modules a zygote imports besides its own before it confines itself."""
_Key = tuple[Credentials, bool, tuple[str, ...]]
"""What zygotes are shared by: the children's credentials, Landlock, the preload."""


class PdSpawnError(Exception):
    """A PD child could not be started (the zygote failed, or fork did)."""


def credentials_for(user: str) -> Credentials:
    """Who children run as: ``user`` when npud is root, else npud's own uid (None)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"pd_user={user!r}: no such user") from None
    if entry.pw_uid == 0:
        raise ValueError(f"pd_user={user!r} is root: PD processes must not run as root")
    return entry.pw_uid, entry.pw_gid


def _environment() -> dict[str, str]:
    """A clean environment: only where npud's Python code is, and single-threaded BLAS."""
    path = [entry for entry in sys.path if entry and os.path.isabs(entry)]
    return {
        "PYTHONPATH": os.pathsep.join(path),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "ORT_DISABLE_TELEMETRY": "1",
    }


class Zygote:
    """One zygote process; see the module docstring. Thread-safe."""

    def __init__(
        self, credentials: Credentials, *, landlock: bool = True, preload: Preload = ()
    ) -> None:
        self.credentials = credentials
        self.sandbox = ""
        """What confines the children, as the zygote describes it (once ready)."""
        self._lock = threading.Lock()
        self._ready = False
        self._closed = False
        self._workdir = tempfile.mkdtemp(prefix="npud-pd-")
        # The children may enter it; not list it, not write it.
        os.chmod(self._workdir, 0o111)  # noqa: S103
        control, remote = wire.seqpacket_pair()
        argv = [
            sys.executable,
            "-s",
            "-B",
            "-m",
            "npud.sim.zygote",
            "--parent",
            str(os.getpid()),
            "--control",
            str(remote.fileno()),
        ]
        if credentials is not None:
            argv += ["--uid", str(credentials[0]), "--gid", str(credentials[1])]
        if not landlock:
            argv.append("--no-landlock")
        for module in preload:
            argv += ["--preload", module]
        try:
            self._process = subprocess.Popen(
                argv,
                cwd=self._workdir,
                env=_environment(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=(remote.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            control.close()
            self._remove_workdir()
            raise
        finally:
            remote.close()
        self._control = control

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return not self._closed and self._process.poll() is None

    def spawn(self, memory_limit: int = 0) -> PdChild:
        """A new child, its private memory limited to ``memory_limit`` bytes (0: not);
        PdSpawnError when the zygote or the fork fails."""
        with self._lock:
            if self._closed:
                raise PdSpawnError("the PD zygote was released")
            self._wait_ready()
            parent_end, child_end = wire.seqpacket_pair()
            bell, child_bell = wire.seqpacket_pair()
            try:
                wire.send(
                    self._control,
                    wire.Spawn(memory_limit),
                    fds=[child_end.fileno(), child_bell.fileno()],
                )
            except wire.ClosedError:
                parent_end.close()
                bell.close()
                raise PdSpawnError(f"the PD zygote (pid {self.pid}) is gone") from None
            finally:
                child_end.close()
                child_bell.close()
        try:
            parent_end.settimeout(HELLO_TIMEOUT)
            received = wire.receive(parent_end, bytearray(wire.MESSAGE_MAX))
            parent_end.settimeout(None)
        except (wire.ClosedError, wire.WireError, TimeoutError) as exc:
            parent_end.close()
            bell.close()
            raise PdSpawnError(f"the PD child did not start: {exc}") from None
        try:
            hello = _CHILD.decode(received.header)
        except msgspec.DecodeError:
            hello = None
        if not isinstance(hello, wire.Hello) or len(received.fds) != 1:
            received.close_fds()
            parent_end.close()
            bell.close()
            raise PdSpawnError("the PD child did not say hello")
        return PdChild(parent_end, bell, received.fds[0], hello.pid)

    def _wait_ready(self) -> None:
        """Under the lock."""
        if self._ready:
            return
        try:
            self._control.settimeout(READY_TIMEOUT)
            received = wire.receive(self._control, bytearray(wire.MESSAGE_MAX))
            self._control.settimeout(None)
            received.close_fds()
            ready = _READY.decode(received.header)
        except (wire.ClosedError, wire.WireError, TimeoutError, msgspec.DecodeError) as exc:
            status = self._process.poll()
            what = f"exited with status {status}" if status is not None else f"failed: {exc}"
            raise PdSpawnError(f"the PD zygote (pid {self.pid}) {what}") from None
        self._ready = True
        self.sandbox = ready.sandbox
        # Its working directory stays the zygote's (and its children's) after the
        # name is gone: empty, unwritable, and nothing left in /tmp even if npud dies.
        self._remove_workdir()
        log.debug("PD zygote ready", extra={"pid": ready.pid, "sandbox": ready.sandbox})

    def close(self) -> None:
        """End the zygote (its children die with it), reap it, remove its directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._control.close()
        try:
            self._process.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._remove_workdir()

    def _remove_workdir(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self._workdir)  # empty: nothing can write in it


class _Pool:
    """The zygotes of this process, shared by credentials, counted by leases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._zygotes: dict[_Key, tuple[Zygote, int]] = {}

    # A zygote is started and closed outside the lock: a driver's finalizer (the
    # garbage collector, on any thread, at any allocation) may release a lease.

    def acquire(self, key: _Key) -> Zygote:
        with self._lock:
            entry = self._zygotes.get(key)
            if entry is not None:
                self._zygotes[key] = (entry[0], entry[1] + 1)
                return entry[0]
        started = Zygote(key[0], landlock=key[1], preload=key[2])
        with self._lock:
            entry = self._zygotes.get(key)
            if entry is None:
                self._zygotes[key] = (started, 1)
                return started
            self._zygotes[key] = (entry[0], entry[1] + 1)
        started.close()  # another thread started one meanwhile
        return entry[0]

    def replace(self, key: _Key, dead: Zygote) -> Zygote:
        """A fresh zygote in place of ``dead`` (same users)."""
        started = Zygote(key[0], landlock=key[1], preload=key[2])
        with self._lock:
            zygote, users = self._zygotes[key]
            if zygote is dead:
                self._zygotes[key] = (started, users)
                zygote = started
        if zygote is not started:
            started.close()
        dead.close()
        return zygote

    def release(self, key: _Key) -> None:
        with self._lock:
            zygote, users = self._zygotes[key]
            if users > 1:
                self._zygotes[key] = (zygote, users - 1)
                return
            del self._zygotes[key]
        zygote.close()

    def zygotes(self) -> list[Zygote]:
        with self._lock:
            return [zygote for zygote, _ in self._zygotes.values()]


_POOL: Final = _Pool()


class ZygoteLease:
    """A share of the zygote for children of ``credentials``; :meth:`release` once."""

    def __init__(
        self, credentials: Credentials, *, landlock: bool = True, preload: Preload = ()
    ) -> None:
        self._key: _Key = (credentials, landlock, tuple(sorted(set(preload))))
        self._lock = threading.Lock()
        self._zygote: Zygote | None = _POOL.acquire(self._key)

    @property
    def zygote(self) -> Zygote | None:
        with self._lock:
            return self._zygote

    def spawn(self, memory_limit: int = 0) -> PdChild:
        with self._lock:
            zygote = self._zygote
        if zygote is None:
            raise PdSpawnError("the zygote lease was released")
        try:
            return zygote.spawn(memory_limit)
        except PdSpawnError:
            if zygote.alive:
                raise
        replacement = _POOL.replace(self._key, zygote)  # it died: one more try with a new one
        with self._lock:
            if self._zygote is zygote:
                self._zygote = replacement
        return replacement.spawn(memory_limit)

    def release(self) -> None:
        with self._lock:
            zygote, self._zygote = self._zygote, None
        if zygote is not None:
            _POOL.release(self._key)


def acquire_zygote(
    user: str = "nobody", *, landlock: bool = True, preload: Preload = ()
) -> ZygoteLease:
    """A lease on the zygote for children of ``user`` (npud's uid when npud is not root),
    starting it (in the background) when no one holds it. Holding one keeps the zygote
    between drivers (tests hold one for the whole session). ``preload``: modules the
    zygote imports besides its own (:data:`npud.sim.zygote.PRELOAD`) before it confines
    itself, those of skels outside npud (a zygote per set of them)."""
    return ZygoteLease(credentials_for(user), landlock=landlock, preload=preload)


def live_zygotes() -> list[int]:
    """Pids of the zygotes this process runs now (for tests and diagnostics)."""
    return [zygote.pid for zygote in _POOL.zygotes() if zygote.alive]
