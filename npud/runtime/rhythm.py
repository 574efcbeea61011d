"""When a realtime client calling in rhythm is expected next.

A realtime client with a budget (a VAD calling every 32 ms) is predictable: its
next call comes one period after its last. The scheduler lends it slots and
holds background batches by that prediction (docs/scheduling.md). These are the
rules of the prediction, in one place, on the scheduler's clock.
"""

from __future__ import annotations

from typing import Final

RHYTHM_PERIODS: Final = 2
"""A realtime client whose last call came within this many periods is calling in rhythm:
its next call is expected one period after its last. After that it is quiet."""
LOAN_SHARE_OF_SLACK: Final = 0.5
"""How much of an in-rhythm realtime client's slack a loan may take (the rest absorbs the
host's own delays)."""


def quiet_from(last_arrival: float, period: float) -> float:
    """When a client whose last call came at ``last_arrival`` turns quiet: it may then
    call at any moment, as anyone may, and nothing is kept for it."""
    return last_arrival + RHYTHM_PERIODS * period


def in_rhythm(last_arrival: float, period: float, now: float) -> bool:
    return now < quiet_from(last_arrival, period)


def expected(last_arrival: float, period: float) -> float:
    """When the next call of a client in rhythm is expected (it may be past: overdue)."""
    return last_arrival + period


def loan_must_end_by(last_arrival: float, period: float, budget: float, now: float) -> float:
    """The latest a call borrowing a slot kept for this realtime client may end.

    A realtime call may wait ``period - budget`` (its slack) and still end in its
    period; a loan may use half of that, so that the host's own delays (its CPUs are
    shared too) fit in the other half:

    * a client in rhythm calls again one period after its last (or at once, if that is
      past): the loan must end within half its slack after that;
    * a quiet client may call at any moment: the loan must end within its whole slack
      from now, since it rarely comes at once.
    """
    slack = period - budget
    if now - last_arrival <= RHYTHM_PERIODS * period:
        due = max(now, expected(last_arrival, period))
        return due + slack * LOAN_SHARE_OF_SLACK
    return now + slack
