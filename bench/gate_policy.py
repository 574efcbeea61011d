"""The batch gate's trade-off, on npud's own scheduler and a modelled DSP (no host noise).

``voice_day --llm`` measures the gate end to end, on this host's 2 shared cores,
where a VAD's p99 moves by 5x between runs with the host's load. This module
measures the rule alone: npud's :class:`~npud.runtime.scheduler.Scheduler` on a
fake clock, driven by a discrete-event model of a VAD and an LLM sharing one
DSP, so the figures change only when the rule does.

The model (each figure's why in the comments beside its constant):

* **The DSP** is shared as the device's one HMX unit is: work that overlaps
  progresses at 1/n each (processor sharing), so a VAD call that comes while a
  batch runs is slowed by the batch's remaining time, at most.
* **The VAD** is realtime with the default budget (4 ms every 32 ms); a call of
  2.5-3.5 ms of DSP work arrives every 32 ms, most a little late (0-1 ms) and
  one in twenty late by up to 8 ms (its host delayed it).
* **The LLM** is background: a batch of 3-5 ms of DSP work, then 1-2 ms of CPU
  before the next doorbell (llama.cpp's tiny model: ``batch_rtt``'s figures).
* **Gated** runs every doorbell through the scheduler (``[scheduler] batches =
  "gated"``) with ``batch_overlap_pct`` of 0, 25, 50 and 100; **ungated**
  (``"counted"``) passes doorbells at once.

Rows, the median over seeds of per-seed ratios (IQR), each configuration and its
baselines simulated with the same seed (so the same arrivals and work):

* ``gate_policy.llm_<config>``: LLM batches/s beside the VAD / alone;
* ``gate_policy.vad_p99_<config>``: the VAD's p99 latency beside the LLM / alone.

``--plot FILE`` draws both against the overlap allowed (needs matplotlib:
``pip install -e '.[bench]'``). Run: ``python -m bench.gate_policy [--seeds N]
[--seconds S] [--plot FILE]``, or ``python -m bench --only gate_policy``.
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
from typing import Final

from bench import harness
from npud.runtime.scheduler import BACKGROUND, REALTIME, Budget, Job, Outcome, Policy, Scheduler

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
OVERLAPS: Final = (0.0, 0.25, 0.5, 1.0)
"""The ``batch_overlap_pct`` settings compared (as shares of a budget)."""


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
    batches: int = 0


class Simulation:
    """One run: the scheduler, the modelled DSP and the clients, on one event queue."""

    def __init__(
        self, seed: int, seconds: float, *, vad: bool, llm: bool, gated: bool, overlap: float
    ) -> None:
        self.clock = Clock()
        self.scheduler = Scheduler(Policy(batch_overlap=overlap), self.clock)
        self.seconds = seconds
        self.gated = gated
        self.out = Outcomes()
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._running: list[Work] = []
        self._vad_random = random.Random(seed)
        self._llm_random = random.Random(seed + 1_000_003)
        if vad:
            self.vad = self.scheduler.open_account("vad", REALTIME, VAD_BUDGET)
            self._plan_vad_calls()
        if llm:
            self.llm = self.scheduler.open_account("llm", BACKGROUND)
            self._at(0.0, self._doorbell)

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
        def answered(_dsp: float) -> None:
            self.out.vad_latencies.append(self.clock.now - arrival)

        self._submit(Job(self.vad), work, answered)

    def _doorbell(self) -> None:
        work = self._llm_random.uniform(*LLM_BATCH)
        if self.gated:
            self._submit(Job(self.llm, doorbell=True), work, self._answered)
        else:  # counted: the batch runs at once, outside any slot
            self._run_on_dsp(work, self._answered)

    def _answered(self, _dsp: float) -> None:
        self.out.batches += 1
        self._at(self.clock.now + self._llm_random.uniform(*LLM_CPU), self._doorbell)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


@dataclass(frozen=True)
class Configuration:
    name: str
    gated: bool
    overlap: float


CONFIGURATIONS: Final = (
    Configuration("ungated", gated=False, overlap=0.0),
    *(Configuration(f"overlap{round(o * 100)}", gated=True, overlap=o) for o in OVERLAPS),
)


def measure(seeds: int, seconds: float) -> dict[str, tuple[list[float], list[float]]]:
    """Per configuration, per seed: (LLM batches/s beside the VAD / alone, VAD p99
    beside the LLM / alone)."""
    ratios: dict[str, tuple[list[float], list[float]]] = {c.name: ([], []) for c in CONFIGURATIONS}
    for seed in range(seeds):
        vad_alone = Simulation(seed, seconds, vad=True, llm=False, gated=True, overlap=0.0).run()
        quiet_p99 = p99(vad_alone.vad_latencies)
        for config in CONFIGURATIONS:
            gated, overlap = config.gated, config.overlap
            alone = Simulation(seed, seconds, vad=False, llm=True, gated=gated, overlap=overlap)
            both = Simulation(seed, seconds, vad=True, llm=True, gated=gated, overlap=overlap)
            alone_out, both_out = alone.run(), both.run()
            llm, vad = ratios[config.name]
            llm.append(both_out.batches / alone_out.batches)
            vad.append(p99(both_out.vad_latencies) / quiet_p99)
    return ratios


def _rows(ratios: dict[str, tuple[list[float], list[float]]]) -> list[harness.Row]:
    figures = {
        f"{kind}_{name}": statistics.median(values[index])
        for name, values in ratios.items()
        for index, kind in enumerate(("llm", "vad_p99"))
    }
    rows = []
    for config in CONFIGURATIONS:
        llm, vad = ratios[config.name]
        rule = (
            "batches not gated"
            if not config.gated
            else f"gated, a batch may run into a due call by {config.overlap:.0%} of its budget"
        )
        rows.append(
            harness.ratio_row(
                f"{NAME}.llm_{config.name}",
                f"LLM batches/s beside the VAD / alone ({rule})",
                llm,
                figures,
            )
        )
        rows.append(
            harness.ratio_row(
                f"{NAME}.vad_p99_{config.name}",
                f"VAD p99 beside the LLM / alone ({rule})",
                vad,
                figures,
            )
        )
    return rows


def rows(ctx: harness.Context) -> list[harness.Row]:
    return _rows(measure(ctx.rounds(7, 2), 30.0 if not ctx.quick else 5.0))


def plot(ratios: dict[str, tuple[list[float], list[float]]], path: Path) -> None:
    import matplotlib  # noqa: PLC0415  (a bench-only extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    gated = [c for c in CONFIGURATIONS if c.gated]
    overlaps = [c.overlap * 100 for c in gated]
    figure, axis = plt.subplots(figsize=(6, 4))
    for index, label in ((0, "LLM batches/s beside the VAD / alone"), (1, "VAD p99 / alone")):
        medians = [statistics.median(ratios[c.name][index]) for c in gated]
        line = axis.plot(overlaps, medians, marker="o", label=label)[0]
        ungated = statistics.median(ratios["ungated"][index])
        axis.axhline(ungated, color=line.get_color(), linestyle=":", label=f"{label}, ungated")
    axis.set_xlabel("batch_overlap_pct (% of the VAD's budget a batch may run into its call)")
    axis.set_ylabel("ratio")
    axis.legend(fontsize=7)
    axis.set_title("The batch gate on a modelled DSP")
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
        "--seconds", type=float, default=30.0, help="modelled seconds per run (default 30)"
    )
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE", help="draw the ratios")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.seconds <= 1:
        parser.error("--seeds must be at least 1 and --seconds more than 1")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401, PLC0415
        except ImportError:
            parser.error("--plot needs matplotlib: pip install -e '.[bench]'")
    ratios = measure(args.seeds, args.seconds)
    print(harness.format_table(_rows(ratios)))
    if args.plot is not None:
        plot(ratios, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
