"""The batch gate: whether a background client's op batch would run beside other work.

llama.cpp's op batches cannot be stopped once on the DSP, so npud decides when a
background client's doorbell is passed on (docs/scheduling.md, "The LLM's
batches"). This is the rule; the scheduler applies it, holds the doorbell while
it gives a reason, and keeps the time held by that reason.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

from npud.runtime import rhythm
from npud.runtime.budgets import Budget

NORMAL_HOLD_SHARE: Final = 0.5
"""The share of ``batch_hold_max`` a background doorbell waits for normal work, at most.
The rest of its bound is left for a realtime call due then: a doorbell let go for a long
normal call (a TTS's graph) still waits for the VAD's call it would have run into."""


class Hold(enum.Enum):
    """Why a background client's doorbell was held."""

    REALTIME_ON_DSP = "realtime_on_dsp"
    """A realtime call was running or queued."""
    REALTIME_DUE = "realtime_due"
    """A realtime client calling in rhythm was due before the batch would end."""
    REALTIME_OVERDUE = "realtime_overdue"
    """A realtime client's call was overdue (the host delayed it)."""
    NORMAL_ON_DSP = "normal_on_dsp"
    """A normal call was running or queued (``batch_yield = "normal"``)."""


def hold_batch(
    *,
    realtime_on_dsp: bool,
    normal_on_dsp: bool,
    realtime: Iterable[tuple[rhythm.Rhythm, Budget]],
    batch: float,
    overlap: float,
    now: float,
) -> Hold | None:
    """Why a batch predicted to take ``batch`` seconds, started ``now``, would run beside
    work it yields to, or None: a realtime call is on the DSP (``realtime_on_dsp``:
    running or queued), or one of the ``realtime`` clients (each its rhythm and budget)
    calling in rhythm is overdue, or due before the batch ends less ``overlap`` of its
    budget, or a normal call is on the DSP (``normal_on_dsp``; the caller passes False
    where batches do not yield to normal work). Realtime reasons come first: a batch held
    for both is counted as held for the realtime client.

    The overlap: a call that comes as a batch ends shares the DSP with the batch's last
    moments and is slowed by them at most, and holding every batch that would end a
    little after the call cost the LLM the whole window (``bench.gate_policy``).
    """
    if realtime_on_dsp:
        return Hold.REALTIME_ON_DSP
    for grid, budget in realtime:
        if not rhythm.in_rhythm(grid.last, budget.period, now):  # as next_recheck has it
            continue  # quiet: it may call at any moment, as anyone may
        # The next call is expected on the client's grid. Once that is past, the call is
        # overdue, not skipped (a call that came would have moved the grid on): the host
        # delayed it, and it is due now. A batch let go then would be on the DSP when it
        # comes.
        expected = grid.expected(budget.period)
        if expected < now:
            return Hold.REALTIME_OVERDUE
        if expected + budget.budget * overlap < now + batch:
            return Hold.REALTIME_DUE
    return Hold.NORMAL_ON_DSP if normal_on_dsp else None


def normal_hold_ends(arrival: float, hold_max: float) -> float:
    """When a doorbell that arrived at ``arrival`` stops waiting for normal work, its bound
    being ``hold_max`` after it (:data:`NORMAL_HOLD_SHARE`)."""
    return arrival + hold_max * NORMAL_HOLD_SHARE


def predicted_batch(typical: float, beside: int) -> float:
    """How long a batch whose client's typical batch takes ``typical`` would take, started
    beside ``beside`` calls: a batch let go beside a TTS's graph (once its wait for normal
    work is over) takes about twice its typical time on one HMX unit, and predicted at its
    typical time it ran into the VAD's next call. npud cannot see which units a call
    uses, so every call running counts."""
    return typical * (1 + beside)
