"""The session's life: a state (OPEN, CLOSING, CLOSED) moved only along its table, the
calls in flight that a close waits for, and the DSP's death (a restart, or the session's
DSP process ending on its own), told once.

The death is not a state: a dead session is still open until its owner closes it, and a
restart may be seen while the session closes. The DSP process's own two marks (a shell
loaded, an exit sent) are kept here too, because the mappings, the exposed files and the
listener all ask them and none of them owns the process.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.dma import ComputeBank
from npud.fastrpc.kernel.errors import RpcError


class State(enum.Enum):
    OPEN = "open"
    """Calls are taken."""
    CLOSING = "closing"
    """close() began: new calls are refused, the ones in flight are awaited (a close that
    timed out leaves the session here; a later close finishes)."""
    CLOSED = "closed"
    """Everything is let go of."""


TRANSITIONS: Final[dict[State, frozenset[State]]] = {
    State.OPEN: frozenset({State.CLOSING}),
    State.CLOSING: frozenset({State.CLOSED}),
    State.CLOSED: frozenset(),
}
"""The moves a session's life may make; every other one is a bug (RuntimeError)."""


def check_move(current: State, to: State) -> None:
    """RuntimeError unless the table allows ``current`` -> ``to``."""
    if to not in TRANSITIONS[current]:
        raise RuntimeError(f"session life: {current.name} -> {to.name} is not allowed")


class Life:
    """The state, the in-flight count and its condition, the DSP's death. Thread-safe."""

    def __init__(self, bank: ComputeBank, on_dead: Callable[[str], None]) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._state = State.OPEN
        self._in_flight = 0
        self._done = 0
        self._dead = False
        self._bank = bank
        self._on_dead = on_dead
        self._process_loaded = False
        self._process_ended = False

    # -- the state ---------------------------------------------------------------------
    @property
    def state(self) -> State:
        return self._state

    def _move(self, to: State) -> None:
        """Under the lock: one move of the table."""
        check_move(self._state, to)
        self._state = to

    @property
    def closing(self) -> bool:
        """close() began (or finished): new calls are refused."""
        return self._state is not State.OPEN

    @property
    def closed(self) -> bool:
        return self._state is State.CLOSED

    def check_usable(self) -> None:
        """SESSION_CLOSED once close() began, DSP_RESTARTED once the DSP died."""
        if self._state is not State.OPEN:
            raise RpcError(ErrorCode.SESSION_CLOSED)
        if self._dead:
            raise RpcError(ErrorCode.DSP_RESTARTED)

    def begin_close(self, timeout: float | None) -> bool:
        """Refuse new calls and wait up to ``timeout`` for those in flight, then CLOSED.
        False when it was closed already; SESSION_BUSY when calls are still running (the
        session stays CLOSING, and a later call may finish)."""
        with self._lock:
            if self._state is State.CLOSED:
                return False
            if self._state is State.OPEN:
                self._move(State.CLOSING)
            if not self._idle.wait_for(lambda: not self._in_flight, timeout):
                raise RpcError(ErrorCode.SESSION_BUSY)
            self._move(State.CLOSED)
            return True

    # -- calls in flight ---------------------------------------------------------------
    @contextmanager
    def call(self) -> Iterator[None]:
        """One counted call: refused unless usable; close() waits for it to end."""
        with self._lock:
            self.check_usable()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._done += 1
                if not self._in_flight:
                    self._idle.notify_all()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def done(self) -> int:
        """Counted calls that have returned."""
        return self._done

    # -- the DSP's death ---------------------------------------------------------------
    @property
    def dead(self) -> bool:
        return self._dead

    def mark_dead(self, reason: str, *, channel_lost: bool = True) -> None:
        """The DSP restarted (EPIPE), or with ``channel_lost`` False only this session's
        DSP process ended: every call fails from now on; ``on_dead`` is told once. A
        restart takes the channel's compute banks, and with them every buffer allocated
        on this session's fd."""
        if channel_lost:
            self._bank.lost = True  # the domain's restart says so in its log
        with self._lock:
            first = not self._dead
            self._dead = True
        if first:
            self._on_dead(reason)

    # -- the DSP process's marks -------------------------------------------------------
    @property
    def process_loaded(self) -> bool:
        return self._process_loaded

    @property
    def process_ended(self) -> bool:
        """Its exit was sent: the DSP side of every mapping is gone."""
        return self._process_ended

    def loaded(self) -> None:
        self._process_loaded = True

    def unloaded(self) -> None:
        """At close: the shell is let go of."""
        self._process_loaded = False

    def ended(self) -> None:
        self._process_ended = True

    def require_process(self) -> None:
        if not self._process_loaded:
            raise RpcError(
                ErrorCode.INVALID_ARGUMENT, detail="no DSP process yet: load the shell first"
            )
