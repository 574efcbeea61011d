"""When a realtime client calling in rhythm is expected next.

A realtime client with a budget (a VAD calling every 32 ms) is predictable: its
calls follow its audio's clock, one a period, each a little late by however long
its thread took to wake. The scheduler lends it slots and holds background
batches by that prediction (docs/scheduling.md). These are the rules of the
prediction, in one place, on the scheduler's clock.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

RHYTHM_PERIODS: Final = 2
"""A realtime client whose last call came within this many periods is calling in rhythm:
its next call is expected on its grid. After that it is quiet."""
LOAN_SHARE_OF_SLACK: Final = 0.5
"""How much of an in-rhythm realtime client's slack a loan may take (the rest absorbs the
host's own delays)."""
GRID_CALLS: Final = 8
"""Recent arrivals the grid is read from (a quarter of a second at 32 ms)."""


class Rhythm:
    """A realtime client's recent arrivals, and when its next call is expected.

    The next call is expected on the client's grid, at the earliest phase its recent
    calls showed, not a period after its last: calls come late (never early) by their
    thread's wake-up, so a call the host delayed by 8 ms made the next one look 8 ms
    early when counted from it, and a batch let go in those 8 ms was on the DSP when
    the call came (``bench.gate_policy`` shows the VAD's p99 it cost). The grid is read
    afresh once the client was quiet, so a stream that stopped and started again at
    another phase is not expected at the old one.
    """

    __slots__ = ("_arrivals",)

    def __init__(self) -> None:
        self._arrivals: deque[float] = deque(maxlen=GRID_CALLS)

    @property
    def last(self) -> float:
        """Its latest arrival (-inf before any)."""
        return self._arrivals[-1] if self._arrivals else -math.inf

    def arrived(self, now: float, period: float) -> None:
        if not in_rhythm(self.last, period, now):
            self._arrivals.clear()  # quiet since: an old grid says nothing of the new one
        self._arrivals.append(now)

    def expected(self, period: float) -> float:
        """When the next call is due: a period after the last on the grid's earliest
        phase (it may be past: the call is overdue). -inf before any call."""
        last = self.last
        if last == -math.inf:
            return last
        return min(a + (round((last - a) / period) + 1) * period for a in self._arrivals)


def quiet_from(last_arrival: float, period: float) -> float:
    """When a client whose last call came at ``last_arrival`` turns quiet: it may then
    call at any moment, as anyone may, and nothing is kept for it."""
    return last_arrival + RHYTHM_PERIODS * period


def in_rhythm(last_arrival: float, period: float, now: float) -> bool:
    return now < quiet_from(last_arrival, period)


def loan_must_end_by(rhythm: Rhythm, period: float, budget: float, now: float) -> float:
    """The latest a call borrowing a slot kept for this realtime client may end.

    A realtime call may wait ``period - budget`` (its slack) and still end in its
    period; a loan may use half of that, so that the host's own delays (its CPUs are
    shared too) fit in the other half:

    * a client in rhythm calls again when expected (or at once, if that is past): the
      loan must end within half its slack after that;
    * a quiet client may call at any moment: the loan must end within its whole slack
      from now, since it rarely comes at once.
    """
    slack = period - budget
    if in_rhythm(rhythm.last, period, now):
        due = max(now, rhythm.expected(period))
        return due + slack * LOAN_SHARE_OF_SLACK
    return now + slack
