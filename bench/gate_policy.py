"""The batch gate's trade-off, on npud's own scheduler and a modelled DSP (no host noise).

``voice_day --llm`` measures the gate end to end, on this host's 2 shared cores,
where a VAD's p99 moves by 5x between runs with the host's load. This module
measures the rule alone: npud's :class:`~npud.runtime.scheduler.Scheduler` on a
fake clock, driven by a discrete-event model of a VAD, an LLM and a TTS sharing
one DSP, so the figures change only when the rule does.

The model (each figure's why in the comments beside its constant):

* **The DSP** is shared as the device's one HMX unit is: work that overlaps
  progresses at 1/n each (processor sharing), so a VAD call that comes while a
  batch runs is slowed by the batch's remaining time, at most. npud is told each
  call's time from its start to its end, the sharing included, and charges it
  (fairness, budgets, the client's typical call).
* **The VAD** is realtime with the default budget (4 ms every 32 ms); a call of
  2.5-3.5 ms of DSP work arrives every 32 ms, most a little late (0-1 ms) and
  one in twenty late by up to 8 ms (its host delayed it).
* **The LLM** is background: a batch of 3-5 ms of DSP work, then 1-2 ms of CPU
  before the next doorbell (llama.cpp's tiny model: ``batch_rtt``'s figures).
* **The TTS** is normal, as Kokoro in ``voice_day --llm``: an utterance is one
  call of 1.0-1.4 s of DSP work, then it plays the audio (waits its length,
  the work / 0.53: Kokoro's real-time factor alone) before the next.
* **Gated** runs every doorbell through the scheduler (``[scheduler] batches =
  "gated"``); **ungated** (``"counted"``) passes doorbells at once. With the VAD
  and the LLM, gated runs with ``batch_overlap_pct`` of 0, 25, 50 and 100, at
  the default ``batch_yield`` (``"normal"``: where batches run into the VAD's
  calls, at 100, the VAD is charged the time shared, goes over its budget, and
  its calls, run as normal then, hold batches as a normal call does). With the
  TTS too, gated runs at the default overlap (25) with ``batch_yield``
  ``"realtime"`` and ``"normal"``.

Rows, the median over seeds of per-seed ratios (IQR), each configuration and its
baselines simulated with the same seed (so the same arrivals and work):

* ``gate_policy.llm_<config>``: LLM batches/s beside the VAD / alone;
* ``gate_policy.vad_p99_<config>``: the VAD's p99 latency beside the LLM / alone,
  for ``<config>`` ``ungated``, ``overlap0``, ``overlap25``, ``overlap50``,
  ``overlap100``;
* ``gate_policy.llm_voice_<config>``: LLM batches/s beside the VAD and the TTS /
  alone;
* ``gate_policy.tts_rtf_<config>``: the TTS's real-time factor (its synthesis
  time, queue and DSP, over its audio's length, of the utterances answered) with
  the LLM / without (the VAD and the TTS);
* ``gate_policy.vad_p99_voice_<config>``: the VAD's p99 beside the TTS and the
  LLM / alone, for ``<config>`` ``ungated``, ``yield_realtime``, ``yield_normal``.
  The TTS's graph shares the DSP with the VAD's calls whatever the gate does
  (nothing holds a normal call for a realtime one that is due): the figure
  ``vad_p99_voice_without_llm`` is that share alone. Charged the time shared,
  the VAD goes over its budget while the TTS speaks, and the pauses are too
  short for its bucket to drain (it uses 3 of its 4 ms a period): nearly all
  its calls run as normal (``vad_over_budget_<config>``: the share of them), and
  batches then wait for them only where they yield to normal calls.

``--plot FILE`` draws the first rows against the overlap allowed and the others
by configuration (needs matplotlib: ``pip install -e '.[bench]'``). Run:
``python -m bench.gate_policy [--seeds N] [--seconds S] [--voice-seconds S]
[--plot FILE]``, or ``python -m bench --only gate_policy``.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from bench import harness
from npud.runtime.scheduler import (
    BACKGROUND,
    NORMAL,
    REALTIME,
    Budget,
    Job,
    Outcome,
    Policy,
    Scheduler,
)

NAME: Final = "gate_policy"
SUMMARY: Final = "the batch gate's trade-off on npud's scheduler and a modelled DSP (no host)"

VAD_BUDGET: Final = Budget(period=0.032, budget=0.004)
"""npud's default realtime budget, which the VAD in voice_day declares."""
VAD_WORK: Final = (0.0025, 0.0035)
"""A Silero VAD chunk's DSP time, uniform between (issue 28: "a VAD of about 3 ms")."""
VAD_JITTER: Final = 0.001
"""Every call is late by up to this (the client's thread wakes a little late)."""
VAD_HOST_DELAY: Final = (0.05, 0.008)
"""One call in twenty is late by up to 8 ms more (the host delayed its thread)."""
LLM_BATCH: Final = (0.003, 0.005)
"""An op batch's DSP time, uniform between (``batch_rtt``: about 4 ms a batch)."""
LLM_CPU: Final = (0.001, 0.002)
"""llama.cpp's CPU time between an answer and its next doorbell."""
TTS_WORK: Final = (1.0, 1.4)
"""An utterance's DSP time, uniform between (Kokoro on the emulator, one call an
utterance: about 1.2 s, ``voice_day --llm``)."""
TTS_RTF: Final = 0.53
"""Kokoro's real-time factor alone there: an utterance's audio lasts its work / this."""
OVERLAPS: Final = (0.0, 0.25, 0.5, 1.0)
"""The ``batch_overlap_pct`` settings compared (as shares of a budget)."""
DEFAULT_OVERLAP: Final = Policy().batch_overlap
"""The overlap the configurations with the TTS run at (npud's default)."""
VOICE_SECONDS: Final = 120.0
"""Modelled seconds of the runs with the TTS: an utterance and its playing take about
3.5 s, and the rows average the utterances' real-time factor over some 30."""
MIN_VOICE_SECONDS: Final = 10.0
"""Fewer, and a run with the LLM ungated might answer no utterance (or one)."""
BatchYield = Literal["normal", "realtime"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class Work:
    """DSP work under way: a VAD call or an op batch."""

    remaining: float
    started: float
    done: Callable[[float], None]
    """Called at its end with the DSP time it took (start to end: what npud charges)."""


@dataclass
class Outcomes:
    vad_latencies: list[float] = field(default_factory=list)
    vad_over_budget: int = 0
    """The VAD's calls that ran as normal: its bucket was full (npud charges a call the
    time it took, sharing the DSP included)."""
    batches: int = 0
    utterances: list[tuple[float, float]] = field(default_factory=list)
    """The TTS's answered utterances: (synthesis time, queue and DSP; audio length)."""

    @property
    def tts_rtf(self) -> float:
        """The TTS's real-time factor: synthesis time over audio time, in all."""
        if not self.utterances:
            raise ValueError("no utterance was answered: simulate longer")
        return sum(s for s, _ in self.utterances) / sum(a for _, a in self.utterances)


class Simulation:
    """One run: the scheduler, the modelled DSP and the clients, on one event queue."""

    def __init__(
        self,
        seed: int,
        seconds: float,
        *,
        vad: bool,
        llm: bool,
        gated: bool,
        overlap: float,
        tts: bool = False,
        batch_yield: BatchYield = "normal",
    ) -> None:
        self.clock = Clock()
        policy = Policy(batch_overlap=overlap, batch_yield=batch_yield)
        self.scheduler = Scheduler(policy, self.clock)
        self.seconds = seconds
        self.gated = gated
        self.out = Outcomes()
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._running: list[Work] = []
        self._vad_random = random.Random(seed)
        self._llm_random = random.Random(seed + 1_000_003)
        self._tts_random = random.Random(seed + 2_000_003)
        if vad:
            self.vad = self.scheduler.open_account("vad", REALTIME, VAD_BUDGET)
            self._plan_vad_calls()
        if llm:
            self.llm = self.scheduler.open_account("llm", BACKGROUND)
            self._at(0.0, self._doorbell)
        if tts:
            self.tts = self.scheduler.open_account("tts", NORMAL)
            self._at(0.0, self._utterance)

    # --- the event loop ---------------------------------------------------------------------
    def run(self) -> Outcomes:
        while self.clock.now <= self.seconds and (self._events or self._running):
            finishing = self._next_end()
            if finishing is not None and (not self._events or finishing[0] <= self._events[0][0]):
                self._advance(finishing[0])
                self._end(finishing[1])
                continue
            when, _, action = heapq.heappop(self._events)
            self._advance(when)
            action()
        return self.out

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    # --- the DSP: processor sharing ------------------------------------------------------
    def _next_end(self) -> tuple[float, Work] | None:
        if not self._running:
            return None
        first = min(self._running, key=lambda work: work.remaining)
        return self.clock.now + first.remaining * len(self._running), first

    def _advance(self, to: float) -> None:
        if self._running:
            progress = (to - self.clock.now) / len(self._running)
            for work in self._running:
                work.remaining -= progress
        self.clock.now = to

    def _end(self, work: Work) -> None:
        self._running.remove(work)
        work.done(self.clock.now - work.started)

    def _run_on_dsp(self, seconds: float, done: Callable[[float], None]) -> None:
        self._running.append(Work(seconds, self.clock.now, done))

    # --- the scheduler --------------------------------------------------------------------
    def _submit(self, job: Job, work: float, done: Callable[[float], None]) -> None:
        job.payload = (work, done)
        if self.scheduler.submit(job) is Outcome.RUN:
            self._start(job)
        self._recheck_later()

    def _start(self, job: Job) -> None:
        work, done = job.payload
        self._run_on_dsp(work, lambda dsp: self._finish(job, dsp, done))

    def _finish(self, job: Job, dsp: float, done: Callable[[float], None]) -> None:
        started, late = self.scheduler.finish(job, dsp)
        assert not late, "no call here has a deadline of its own"
        for other in started:
            self._start(other)
        done(dsp)
        self._recheck_later()

    def _recheck_later(self) -> None:
        when = self.scheduler.next_recheck()
        if when is not None:
            self._at(max(when, self.clock.now), self._tick)

    def _tick(self) -> None:
        started, _ = self.scheduler.tick()
        for job in started:
            self._start(job)
        self._recheck_later()

    # --- the clients ----------------------------------------------------------------------
    def _plan_vad_calls(self) -> None:
        rng = self._vad_random
        chance, most = VAD_HOST_DELAY
        for index in range(int(self.seconds / VAD_BUDGET.period) + 1):
            late = rng.uniform(0, VAD_JITTER)
            if rng.random() < chance:
                late += rng.uniform(0, most)
            work = rng.uniform(*VAD_WORK)
            arrival = index * VAD_BUDGET.period + late
            self._at(arrival, functools.partial(self._vad_call, arrival, work))

    def _vad_call(self, arrival: float, work: float) -> None:
        job = Job(self.vad)

        def answered(_dsp: float) -> None:
            self.out.vad_latencies.append(self.clock.now - arrival)
            self.out.vad_over_budget += job.over_budget

        self._submit(job, work, answered)

    def _doorbell(self) -> None:
        work = self._llm_random.uniform(*LLM_BATCH)
        if self.gated:
            self._submit(Job(self.llm, doorbell=True), work, self._answered)
        else:  # counted: the batch runs at once, outside any slot
            self._run_on_dsp(work, self._answered)

    def _answered(self, _dsp: float) -> None:
        self.out.batches += 1
        self._at(self.clock.now + self._llm_random.uniform(*LLM_CPU), self._doorbell)

    def _utterance(self) -> None:
        work = self._tts_random.uniform(*TTS_WORK)
        asked = self.clock.now

        def synthesised(_dsp: float) -> None:
            audio = work / TTS_RTF  # what it says does not depend on how long it took
            self.out.utterances.append((self.clock.now - asked, audio))
            self._at(self.clock.now + audio, self._utterance)  # played, then the next

        self._submit(Job(self.tts), work, synthesised)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


@dataclass(frozen=True)
class Configuration:
    name: str
    gated: bool
    overlap: float
    batch_yield: BatchYield = "normal"

    def simulate(
        self, seed: int, seconds: float, *, vad: bool, llm: bool, tts: bool = False
    ) -> Outcomes:
        return Simulation(
            seed,
            seconds,
            vad=vad,
            llm=llm,
            tts=tts,
            gated=self.gated,
            overlap=self.overlap,
            batch_yield=self.batch_yield,
        ).run()


CONFIGURATIONS: Final = (
    Configuration("ungated", gated=False, overlap=0.0),
    *(Configuration(f"overlap{round(o * 100)}", gated=True, overlap=o) for o in OVERLAPS),
)
"""With the VAD and the LLM: the overlap's trade-off."""
VOICE_CONFIGURATIONS: Final = (
    Configuration("ungated", gated=False, overlap=DEFAULT_OVERLAP),
    Configuration("yield_realtime", gated=True, overlap=DEFAULT_OVERLAP, batch_yield="realtime"),
    Configuration("yield_normal", gated=True, overlap=DEFAULT_OVERLAP, batch_yield="normal"),
)
"""With the VAD, the TTS and the LLM: ``batch_yield``'s trade-off."""
VOICE_KINDS: Final = ("llm_voice", "tts_rtf", "vad_p99_voice")
"""The rows of each of :data:`VOICE_CONFIGURATIONS`, ``<kind>_<config>``."""


@dataclass
class Measured:
    """Per seed, each configuration's ratios, by row (``llm_overlap25``, ...)."""

    overlap: dict[str, list[float]] = field(default_factory=dict)
    """The rows of :data:`CONFIGURATIONS`."""
    voice: dict[str, list[float]] = field(default_factory=dict)
    """The rows of :data:`VOICE_CONFIGURATIONS`, and figures: the baseline's own,
    ``tts_rtf_without_llm`` (the TTS's real-time factor beside the VAD) and
    ``vad_p99_voice_without_llm`` (the VAD's p99 beside the TTS / alone), and
    ``vad_over_budget_<config>`` (``without_llm`` too): the share of the VAD's calls
    that ran as normal, over its budget."""


def measure(seeds: int, seconds: float, voice_seconds: float) -> Measured:
    """Every row's per-seed ratios: the VAD and the LLM simulated for ``seconds``, the
    runs with the TTS for ``voice_seconds`` (an utterance and its audio take ~3.5 s)."""
    measured = Measured()
    for seed in range(seeds):
        quiet_p99 = _vad_alone_p99(seed, seconds)
        for config in CONFIGURATIONS:
            alone = config.simulate(seed, seconds, vad=False, llm=True)
            both = config.simulate(seed, seconds, vad=True, llm=True)
            _add(measured.overlap, f"llm_{config.name}", both.batches / alone.batches)
            _add(measured.overlap, f"vad_p99_{config.name}", p99(both.vad_latencies) / quiet_p99)
        if voice_seconds != seconds:
            quiet_p99 = _vad_alone_p99(seed, voice_seconds)
        # Without the LLM, the gate has nothing to hold: one baseline serves all three.
        voice = VOICE_CONFIGURATIONS[-1].simulate(
            seed, voice_seconds, vad=True, llm=False, tts=True
        )
        _add(measured.voice, "tts_rtf_without_llm", voice.tts_rtf)
        _add(measured.voice, "vad_p99_voice_without_llm", p99(voice.vad_latencies) / quiet_p99)
        _add(measured.voice, "vad_over_budget_without_llm", _over_budget(voice))
        for config in VOICE_CONFIGURATIONS:
            alone = config.simulate(seed, voice_seconds, vad=False, llm=True)
            every = config.simulate(seed, voice_seconds, vad=True, llm=True, tts=True)
            _add(measured.voice, f"llm_voice_{config.name}", every.batches / alone.batches)
            _add(measured.voice, f"tts_rtf_{config.name}", every.tts_rtf / voice.tts_rtf)
            ratio = p99(every.vad_latencies) / quiet_p99
            _add(measured.voice, f"vad_p99_voice_{config.name}", ratio)
            _add(measured.voice, f"vad_over_budget_{config.name}", _over_budget(every))
    return measured


def _over_budget(out: Outcomes) -> float:
    return out.vad_over_budget / len(out.vad_latencies)


def _vad_alone_p99(seed: int, seconds: float) -> float:
    alone = Simulation(seed, seconds, vad=True, llm=False, gated=True, overlap=0.0)
    return p99(alone.run().vad_latencies)


def _add(ratios: dict[str, list[float]], name: str, value: float) -> None:
    ratios.setdefault(name, []).append(value)


def _rule(config: Configuration, *, by_yield: bool) -> str:
    """What ``config`` does to batches: by its overlap, or (``by_yield``) its yield."""
    if not config.gated:
        return "batches not gated"
    if by_yield:
        yielding = "realtime calls" if config.batch_yield == "realtime" else "normal calls too"
        return f"gated, batches wait for {yielding}"
    return f"gated, a batch may run into a due call by {config.overlap:.0%} of its budget"


def _rows(measured: Measured) -> list[harness.Row]:
    rows = []
    figures = {name: statistics.median(values) for name, values in measured.overlap.items()}
    for config in CONFIGURATIONS:
        rule = _rule(config, by_yield=False)
        for kind, what in (
            ("llm", f"LLM batches/s beside the VAD / alone ({rule})"),
            ("vad_p99", f"VAD p99 beside the LLM / alone ({rule})"),
        ):
            name = f"{kind}_{config.name}"
            rows.append(harness.ratio_row(f"{NAME}.{name}", what, measured.overlap[name], figures))
    figures = {name: statistics.median(values) for name, values in measured.voice.items()}
    for config in VOICE_CONFIGURATIONS:
        rule = _rule(config, by_yield=True)
        for kind, what in (
            ("llm_voice", f"LLM batches/s beside the VAD and the TTS / alone ({rule})"),
            ("tts_rtf", f"TTS real-time factor with the LLM / without ({rule})"),
            ("vad_p99_voice", f"VAD p99 beside the TTS and the LLM / alone ({rule})"),
        ):
            name = f"{kind}_{config.name}"
            rows.append(harness.ratio_row(f"{NAME}.{name}", what, measured.voice[name], figures))
    return rows


def rows(ctx: harness.Context) -> list[harness.Row]:
    seconds = 30.0 if not ctx.quick else 5.0
    return _rows(measure(ctx.rounds(7, 2), seconds, VOICE_SECONDS if not ctx.quick else 10.0))


def plot(measured: Measured, path: Path) -> None:
    import matplotlib  # noqa: PLC0415  (a bench-only extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    def median(ratios: dict[str, list[float]], name: str) -> float:
        return statistics.median(ratios[name])

    gated = [c for c in CONFIGURATIONS if c.gated]
    overlaps = [c.overlap * 100 for c in gated]
    figure, (axis, voice) = plt.subplots(1, 2, figsize=(11, 4))
    for kind, label in (
        ("llm", "LLM batches/s beside the VAD / alone"),
        ("vad_p99", "VAD p99 / alone"),
    ):
        medians = [median(measured.overlap, f"{kind}_{c.name}") for c in gated]
        line = axis.plot(overlaps, medians, marker="o", label=label)[0]
        ungated = median(measured.overlap, f"{kind}_ungated")
        axis.axhline(ungated, color=line.get_color(), linestyle=":", label=f"{label}, ungated")
    axis.set_xlabel("batch_overlap_pct (% of the VAD's budget a batch may run into its call)")
    axis.set_ylabel("ratio")
    axis.legend(fontsize=7)
    axis.set_title("The batch gate on a modelled DSP: VAD + LLM")

    width = 0.8 / len(VOICE_KINDS)
    labels = (
        "LLM batches/s beside voice / alone",
        "TTS real-time factor with the LLM / without",
        "VAD p99 beside TTS + LLM / alone",
    )
    highest = 0.0
    for index, (kind, label) in enumerate(zip(VOICE_KINDS, labels, strict=True)):
        offset = (index - (len(VOICE_KINDS) - 1) / 2) * width
        places = [at + offset for at in range(len(VOICE_CONFIGURATIONS))]
        medians = [median(measured.voice, f"{kind}_{c.name}") for c in VOICE_CONFIGURATIONS]
        voice.bar(places, medians, width, label=label)
        highest = max(highest, *medians)
    voice.axhline(1.0, color="grey", linewidth=0.5)
    voice.set_ylim(0, 1.4 * highest)  # room for the legend above the bars
    voice.set_xticks(range(len(VOICE_CONFIGURATIONS)))
    voice.set_xticklabels(
        [f'batch_yield\n"{c.batch_yield}"' if c.gated else "ungated" for c in VOICE_CONFIGURATIONS]
    )
    voice.set_ylabel("ratio")
    voice.legend(fontsize=7)
    voice.set_title(f"VAD + TTS + LLM (batch_overlap_pct {DEFAULT_OVERLAP:.0%})")
    figure.tight_layout()
    figure.savefig(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gate_policy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=7, help="runs of the model (default 7)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="modelled seconds per run of the VAD and the LLM (default 30)",
    )
    parser.add_argument(
        "--voice-seconds",
        type=float,
        default=VOICE_SECONDS,
        help=f"modelled seconds per run with the TTS (default {VOICE_SECONDS:g})",
    )
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE", help="draw the ratios")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.seconds <= 1:
        parser.error("--seeds must be at least 1 and --seconds more than 1")
    if args.voice_seconds < MIN_VOICE_SECONDS:
        parser.error(f"--voice-seconds must be at least {MIN_VOICE_SECONDS:g} (two utterances)")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401, PLC0415
        except ImportError:
            parser.error("--plot needs matplotlib: pip install -e '.[bench]'")
    measured = measure(args.seeds, args.seconds, args.voice_seconds)
    print(harness.format_table(_rows(measured)))
    if args.plot is not None:
        plot(measured, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
