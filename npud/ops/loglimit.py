"""A peer's misbehaviour never costs more log than its connection is worth.

journald drops a service's lines past its rate limit (10,000 per 30 s by
default), and the lines it would then drop include the daemon's important
ones. So the lines a peer can cause at will (a refused request, fds it sent
unasked, a refused connection) go through a :class:`LogBudget`: the first
``burst`` are logged, then at most one per ``interval``, which carries the
number of lines held back since the one before (``held_back=N``). The count
of what is still held back at the end goes into the connection's last line.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

MAX_PEERS: Final = 256
"""Peers (uids) whose refused connections are counted apart; the oldest are forgotten."""


class LogBudget:
    """How many lines one peer may still cause. Thread-safe."""

    def __init__(
        self, burst: int, interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._left = burst
        self._interval = interval
        self._clock = clock
        self._held = 0
        self._next = float("-inf")
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """None: do not log this line (it is counted). Otherwise log it, with the number
        of lines held back since the last one logged."""
        with self._lock:
            if self._left > 0:
                self._left -= 1
            else:
                now = self._clock()
                if now < self._next:
                    self._held += 1
                    return None
                self._next = now + self._interval
            held, self._held = self._held, 0
            return held

    @property
    def held_back(self) -> int:
        """Lines held back and not yet reported."""
        with self._lock:
            return self._held


def fields(held: int) -> dict[str, int]:
    """The field a logged line carries for what was held back before it (none if nothing)."""
    return {"held_back": held} if held else {}


class PeerBudgets:
    """One :class:`LogBudget` per peer key (a uid), for lines outside any connection."""

    def __init__(self, logger: Any, burst: int = 20, interval: float = 10.0) -> None:
        self._logger = logger
        self._burst = burst
        self._interval = interval
        self._budgets: OrderedDict[int, LogBudget] = OrderedDict()

    def note(self, key: int, event: str, **values: object) -> None:
        """Log ``event`` at warning level for peer ``key``, within its budget."""
        budget = self._budgets.pop(key, None) or LogBudget(self._burst, self._interval)
        self._budgets[key] = budget
        while len(self._budgets) > MAX_PEERS:
            self._budgets.popitem(last=False)
        held = budget.take()
        if held is not None:
            self._logger.warning(event, uid=key, **values, **fields(held))
