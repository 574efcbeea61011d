"""What DSP-side code of one PD reaches beyond the call it runs in.

A skel method sees its call (:class:`npud.sim.skels.SkelCall`); some DSP code
needs more than that, for as long as its DSP process lives:

* the memory the host mapped into the process with MEM_MAP, found by the fd
  number the MEM_MAP carried (what ``HAP_mmap(fd)`` does on the DSP):
  :meth:`PdServices.map_fd` returns an :class:`FdMemory`, a zero-copy view of
  the buffer pinned until it is closed (the host may unmap it meanwhile: the
  memory stays until the DSP lets go, and the DSP never touches freed memory);
* state that belongs to the DSP process, not to one handle (the dspqueue
  library's queues and signals): :meth:`PdServices.resident` makes one object
  of a :class:`PdResident` class per PD, on first use;
* threads of its own (a worker that serves a packet queue):
  :meth:`PdServices.start_thread`. An exception that escapes one crashes the
  PD, as one escaping a method does.

One :class:`PdServices` exists per DSP process: with process isolation the
PD child holds it (the child is killed when the PD ends, and its threads and
mappings go with it); with thread isolation the DSP process holds it in
npud's process, and :meth:`PdServices.end` runs when the PD ends (exit, crash,
restart, close of its fd): every resident's :meth:`PdResident.pd_ended` and
every end callback runs, then every thread started here is joined, so nothing
of the PD is left in npud. Code that waits for something on a PD's behalf
wakes up then and raises :meth:`PdServices.end_error` (the invoke answers
AEE_EBADSTATE, or EPIPE after a restart).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Final, TypeVar

from npud.sim.errors import ProcessExitedError, SubsystemDownError

log = logging.getLogger(__name__)

EndReason = type[ProcessExitedError] | type[SubsystemDownError]
JOIN_TIMEOUT: Final = 60.0
"""Seconds :meth:`PdServices.end` waits for each thread of the PD (a long op in flight)."""


class NoSuchMapError(Exception):
    """No MEM_MAP of this process was made through that fd number."""


class FdMemory:
    """The memory of the newest MEM_MAP made through fd number ``fd``, pinned.

    ``buffer`` is the whole buffer, ``view`` the MEM_MAP'd range of it (``offset``,
    ``length``); both are writable views of the host's own pages (another process
    writes the same memory). :meth:`close` lets go (idempotent); numpy arrays made
    over the views must be gone by then, or the memory stays until they are."""

    __slots__ = ("_release", "buffer", "fd", "length", "offset", "view")

    def __init__(
        self,
        fd: int,
        whole: memoryview,
        offset: int,
        length: int,
        release: Callable[[], None],
    ) -> None:
        self.fd = fd
        self.offset = offset
        self.length = length
        self.buffer = whole
        self.view = whole[offset : offset + length]
        self._release: Callable[[], None] | None = release

    @property
    def closed(self) -> bool:
        return self._release is None

    def close(self) -> None:
        release, self._release = self._release, None
        if release is None:
            return
        for view in (self.view, self.buffer):
            with contextlib.suppress(BufferError):  # an export lives on: it goes with it
                view.release()
        release()

    def __enter__(self) -> FdMemory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


FdResolver = Callable[[int], FdMemory | None]
"""Pins the newest MEM_MAP made through an fd number (None: there is none)."""


class PdResident:
    """Base of the per-PD objects of :meth:`PdServices.resident`."""

    def __init__(self, pd: PdServices) -> None:
        self.pd = pd

    def pd_ended(self) -> None:
        """The PD ends (thread isolation): wake what waits, let go of memory."""


R = TypeVar("R", bound=PdResident)


class PdServices:
    """See the module docstring. Thread-safe."""

    def __init__(self, resolve: FdResolver, crash: Callable[[str], None]) -> None:
        """``resolve`` finds MEM_MAPs of the process by fd number; ``crash(text)`` makes
        the PD crash (a thread of it raised), ``text`` the traceback."""
        self._resolve = resolve
        self._crash = crash
        self._lock = threading.Lock()
        self._residents: dict[type[PdResident], PdResident] = {}
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next_callback = 0
        self._threads: list[threading.Thread] = []
        self._reason: EndReason | None = None

    # -- memory ----------------------------------------------------------------------------

    def map_fd(self, fd: int) -> FdMemory:
        """The memory of the MEM_MAP made through fd number ``fd`` (the newest); the
        caller closes it. NoSuchMapError when the process has none."""
        memory = self._resolve(fd)
        if memory is None:
            raise NoSuchMapError(f"fd {fd} names no MEM_MAP of this process")
        return memory

    # -- state of the PD -----------------------------------------------------------------

    def resident(self, kind: type[R]) -> R:
        """The PD's one ``kind`` object, made on first use (``kind(self)``)."""
        with self._lock:
            self._check_locked()
            found = self._residents.get(kind)
        if found is None:
            made = kind(self)  # outside the lock: a constructor may use the services
            with self._lock:
                self._check_locked()
                found = self._residents.setdefault(kind, made)
        assert isinstance(found, kind)
        return found

    def on_end(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` when the PD ends; returns what cancels that."""
        with self._lock:
            self._next_callback += 1
            key = self._next_callback
            self._callbacks[key] = callback

        def cancel() -> None:
            with self._lock:
                self._callbacks.pop(key, None)

        return cancel

    # -- threads ---------------------------------------------------------------------------

    def start_thread(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """A thread of the PD running ``target``; an exception escaping it crashes the
        PD (the end error of an ended PD does not)."""
        thread = threading.Thread(target=self._run, args=(target,), name=name, daemon=True)
        with self._lock:
            self._check_locked()
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    def _run(self, target: Callable[[], None]) -> None:
        try:
            target()
        except (ProcessExitedError, SubsystemDownError):
            if not self.ended:
                self._crash_from_thread()
        except BaseException:
            self._crash_from_thread()

    def _crash_from_thread(self) -> None:
        text = traceback.format_exc()
        log.error("a thread of the DSP process raised: the PD crashes", extra={"error": text})
        self._crash(text)

    # -- the end ---------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        with self._lock:
            return self._reason is not None

    def end_error(self) -> Exception:
        """What code waiting for an ended PD raises (ProcessExitedError before the end)."""
        with self._lock:
            reason = self._reason
        return (reason or ProcessExitedError)()

    def check(self) -> None:
        """Raise :meth:`end_error` once the PD has ended."""
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        if self._reason is not None:
            raise self._reason()

    def end(self, reason: EndReason = ProcessExitedError) -> None:
        """The PD ends: every resident and end callback runs, then every thread of the PD
        is joined (not the caller's own). Idempotent."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            residents = list(self._residents.values())
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
            threads, self._threads = self._threads, []
        for resident in residents:
            resident.pd_ended()
        for callback in callbacks:
            callback()
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join(JOIN_TIMEOUT)
                if thread.is_alive():
                    log.error(
                        "a thread of an ended DSP process is still running",
                        extra={"thread": thread.name},
                    )
