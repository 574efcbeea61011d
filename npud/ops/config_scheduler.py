"""npud.toml's ``[scheduler]``: how DSP-bound calls share the NPU (docs/scheduling.md)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from npud.ops.config_values import doc


class SchedulerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """How DSP-bound calls share the NPU (docs/scheduling.md). Changes need a restart."""

    mode: Annotated[
        Literal["fair", "fifo"],
        doc(
            "fair: classes, deadlines, fair share by DSP time, realtime reserve; fifo: "
            "arrival order with no policy (to measure what the policy buys)."
        ),
    ] = "fair"
    dsp_slots: Annotated[
        int, msgspec.Meta(ge=1, le=64), doc("Calls npud keeps on the DSP at once.")
    ] = 4
    realtime_reserve: Annotated[
        int,
        msgspec.Meta(ge=0, le=63),
        doc(
            "Slots kept for realtime calls: lent to a normal or background call only when"
            " its client's typical call ends before a realtime client would need the slot"
            " (docs/scheduling.md)."
        ),
    ] = 1
    background_max: Annotated[
        int,
        msgspec.Meta(ge=1, le=64),
        doc("Background calls on the DSP at once, at most, while a normal call waits."),
    ] = 2
    background_wait_s: Annotated[
        float,
        msgspec.Meta(ge=0.001, le=60),
        doc("Seconds: a background call that has waited this long goes before normal calls."),
    ] = 0.5
    per_client_running: Annotated[
        int, msgspec.Meta(ge=1, le=64), doc("Calls of one client on the DSP at once, at most.")
    ] = 2
    batches: Annotated[
        Literal["gated", "counted"],
        doc(
            "dspqueue op batches (llama.cpp): 'gated', a doorbell is dispatched as a call of "
            "its client's class and its batch holds the slot until the answer; a background "
            "client's doorbell also waits while realtime work runs or is due, and while "
            "normal work runs (batch_yield), at most batch_hold_max_s. 'counted': doorbells "
            "pass at once, as plain calls; either way doorbell-to-answer is charged to the "
            "client as DSP time (docs/scheduling.md)."
        ),
    ] = "gated"
    batch_hold_max_s: Annotated[
        float,
        msgspec.Meta(ge=0.001, le=10),
        doc("Seconds a background client's batch may be held for other work, at most."),
    ] = 0.05
    batch_overlap_pct: Annotated[
        int,
        msgspec.Meta(ge=0, le=100),
        doc(
            "Percent of a realtime client's budget a background batch may be predicted to "
            "still run into the client's next call; a batch that would end later waits "
            "for the call (0: every batch that would overlap it waits)."
        ),
    ] = 25
    batch_yield: Annotated[
        Literal["normal", "realtime"],
        doc(
            "The least class whose calls on the DSP (running or queued) hold a background "
            "client's doorbell, at most batch_hold_max_s: 'normal', the calls of every "
            "client above background (a TTS's graph as well as a VAD's); 'realtime', "
            "realtime calls only (a batch then shares the DSP with normal calls, which "
            "gives the LLM more of the DSP and the normal clients less)."
        ),
    ] = "normal"
    batch_answer_max_s: Annotated[
        float,
        msgspec.Meta(ge=0.01, le=600),
        doc(
            "Seconds a batch keeps its slot waiting for its answer; past it the slot is "
            "given back (logged) and the time charged."
        ),
    ] = 2.0
    realtime_utilisation_pct: Annotated[
        int,
        msgspec.Meta(ge=1, le=100),
        doc("Realtime budgets declared at hello are admitted up to this share of the DSP."),
    ] = 50
    realtime_utilisation_per_uid_pct: Annotated[
        int,
        msgspec.Meta(ge=1, le=100),
        doc(
            "The share of the DSP the realtime budgets of one user's connections may take "
            "together, so one user cannot shut another's voice client out."
        ),
    ] = 25
    realtime_default_budget_s: Annotated[
        float,
        msgspec.Meta(ge=0.000_001, le=10),
        doc(
            "A realtime client that declares no budget is admitted as though it declared "
            "this many seconds of DSP time every realtime_default_period_s (beyond it, its "
            "calls run as normal)."
        ),
    ] = 0.004
    realtime_default_period_s: Annotated[
        float,
        msgspec.Meta(ge=0.001, le=10),
        doc("The period of that default budget, in seconds."),
    ] = 0.032
    workers: Annotated[
        int,
        msgspec.Meta(ge=0, le=256),
        doc("Threads of the data path (they read requests and run DSP calls); 0: dsp_slots + 2."),
    ] = 0

    def __post_init__(self) -> None:
        if self.realtime_reserve >= self.dsp_slots:
            raise ValueError(
                f"realtime_reserve {self.realtime_reserve} leaves no slot of {self.dsp_slots} "
                "for normal and background calls"
            )
        if self.realtime_default_budget_s > self.realtime_default_period_s:
            raise ValueError(
                f"realtime_default_budget_s {self.realtime_default_budget_s} is longer than "
                f"its period, realtime_default_period_s {self.realtime_default_period_s}"
            )

    @property
    def worker_threads(self) -> int:
        return self.workers or self.dsp_slots + 2
