"""Realtime budgets: what a client declares, whether it is admitted, what it has used.

A realtime client may declare a period and a budget of DSP time per period
(PROTOCOL.md section 8). It is admitted only while the declared realtime use
stays under the configured share of the DSP, for everyone and per user; once
admitted, its use is counted as a leaky bucket that drains at the budget's rate.
The scheduler (npud/runtime/scheduler.py) decides what being over the budget
means for the client's calls; this module only does the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """A realtime client's declaration: at most ``budget`` seconds of DSP every ``period``."""

    period: float
    budget: float

    @property
    def share(self) -> float:
        return self.budget / self.period


class AdmissionRefusedError(Exception):
    """A budget that would take realtime use above the configured bound."""


def check_admission(
    budget: Budget,
    *,
    declared: Iterable[Budget],
    declared_by_owner: Iterable[Budget] | None,
    bound: float,
    bound_per_owner: float,
) -> None:
    """Refuse ``budget`` (AdmissionRefusedError, saying why) if admitting it would take
    the declared realtime use above ``bound`` of the DSP, or its owner's declared use
    above ``bound_per_owner`` (``declared_by_owner`` None: no owner to cap, as for the
    scheduler's own tests and npud's internal clients)."""
    asked = f"{budget.budget * 1000:g} ms every {budget.period * 1000:g} ms"
    total = sum(b.share for b in declared) + budget.share
    if total > bound + 1e-9:
        raise AdmissionRefusedError(
            f"{asked} would bring declared realtime use to {total:.0%} of the DSP, "
            f"above the configured {bound:.0%}"
        )
    if declared_by_owner is None:
        return
    mine = sum(b.share for b in declared_by_owner) + budget.share
    if mine > bound_per_owner + 1e-9:
        raise AdmissionRefusedError(
            f"{asked} would bring this user's declared realtime use to {mine:.0%} of "
            f"the DSP, above the {bound_per_owner:.0%} one user may declare"
        )


class Bucket:
    """A budget's use as a leaky bucket: DSP time charged, less what drained at the
    budget's rate (``budget`` per ``period``) since.

    A budget is counted this way rather than on a grid of periods anchored at the
    client's first call: on a grid, a client calling once a period within its budget
    had two calls land in one period whenever one came a little early and the one
    before a little late (arrival jitter: about 11 % of a 3 ms VAD's calls counted as
    over its 4 ms budget, and lost realtime's protection). The bucket keeps the
    long-run rate (a budget per period) and the burst (a budget at once); one call a
    period within the budget never fills it, whatever its jitter.
    """

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.used = 0.0
        """DSP seconds in the bucket at ``used_at``."""
        self.used_at = -math.inf
        self.over = False
        """``used`` went beyond the budget and has not drained back to it (one overrun)."""
        self.overruns = 0
        """Times the use went beyond the budget."""

    def drain(self, now: float) -> None:
        """Let the bucket drain at the budget's rate since it was last looked at."""
        if now > self.used_at:
            if self.used > 0:
                rate = self.budget.budget / self.budget.period
                self.used = max(0.0, self.used - (now - self.used_at) * rate)
            self.used_at = now
        if self.over and self.used <= self.budget.budget:
            self.over = False

    def charge(self, dsp_seconds: float, now: float) -> None:
        """Add ``dsp_seconds`` of use; going beyond the budget counts one overrun."""
        self.drain(now)
        self.used += dsp_seconds
        if self.used > self.budget.budget and not self.over:
            self.over = True
            self.overruns += 1

    def full(self, in_flight: float, now: float) -> bool:
        """Would a call now be beyond the budget, ``in_flight`` seconds being still on
        the DSP? (Its calls then run as normal until the bucket drains below.)"""
        self.drain(now)
        return self.used + in_flight >= self.budget.budget
