"""How busy the DSP's slots have been lately: the scheduler's utilisation figure."""

from __future__ import annotations

from collections import deque
from typing import Final

UTILISATION_WINDOW: Final = 10.0
"""Seconds over which the utilisation figure is averaged."""
SNAPSHOT_EVERY: Final = 0.5
SNAPSHOTS: Final = 64


class BusySlots:
    """Slot-seconds used, summed at every start and finish (cheap); a snapshot now and
    then lets :meth:`utilisation` look back over the last ``UTILISATION_WINDOW``."""

    def __init__(self, now: float) -> None:
        self._area = 0.0
        self._since = now
        self._history: deque[tuple[float, float]] = deque(maxlen=SNAPSHOTS)
        self._history.append((now, 0.0))

    def note(self, now: float, running: int) -> None:
        """``running`` slots were busy since the last note."""
        self._area += running * (now - self._since)
        self._since = now
        if now - self._history[-1][0] >= SNAPSHOT_EVERY:
            self._history.append((now, self._area))

    def utilisation(self, now: float, slots: int) -> float:
        """Busy slots over about the last UTILISATION_WINDOW seconds, 0..1 (call
        :meth:`note` first, so the time up to ``now`` is counted)."""
        then, area = self._history[0]
        for when, at in self._history:
            if now - when <= UTILISATION_WINDOW:
                break
            then, area = when, at
        elapsed = now - then
        if elapsed <= 0:
            return 0.0
        return min(1.0, (self._area - area) / (elapsed * slots))
