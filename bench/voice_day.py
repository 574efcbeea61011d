"""Silero VAD as a realtime client beside Kokoro TTS and a background client, against VAD alone.

The load is examples/voice_day.py's: in one child process, Kokoro-82M
synthesising its sentences one after the other as a normal client (ids padded
to a fixed length) and a background client making 50 ms calls back to back,
each on its own connection to the same npud (emulator, a child process). The
subject is a realtime client with a budget (1 chunk of Silero VAD every
32 ms, ``deadline`` 32 ms), in this process, while the load runs; the
baseline is the same client, same daemon and same models, while the load
child is idle (connected, its models loaded). A round runs one phase of each
(``--seconds`` each; the order alternates round by round). Every phase feeds
the VAD the same test signal from its start with a zero state, so both give
the same probabilities: a phase that does not is an error. The TTS checks each
sentence against its first synthesis (the model is deterministic).

Rows:

* ``voice_day.vad_p99``: the VAD's p99 latency (from when a chunk was due to
  its answer) under the load over its p99 alone, per round (goal at most 1.5);
* ``voice_day.vad_misses``: chunks answered more than 30 ms after they were
  due (or refused as past their deadline) under the load, per round (goal 0).

Figures: both phases' p50 and p99, and the p99 of the time the runs spent in
npud's DSP call (``dsp_us``: a miss whose time is there is the emulated DSP
starved of host CPU, not a queue in npud), the misses alone, the TTS real-time
factor (synthesis time over the audio's length) and the background calls per
second.

Run: ``python -m bench.voice_day [--rounds N] [--seconds S] [--quick]``, or
``python -m bench --only voice_day`` (``--quick``: 2 rounds of 6 s).

``--llm`` runs the mode with llama.cpp as a third client instead of the busy
background one, on an emulator that models the device's DSP, gating on and off,
and Kokoro playing each utterance (its audio's time) before the next rather
than synthesising back to back (:mod:`bench.voice_llm` says what it reports;
``--plot FILE`` draws it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import harness, processes
from bench.voice_clients import (
    BACKGROUND_MS,
    EXAMPLE,
    LOAD,
    Phase,
    Vad,
    load_example,
)

P99_GOAL = 1.5


def _agree(a: Phase, b: Phase) -> None:
    shared = min(len(a.probabilities), len(b.probabilities))
    difference = max(
        (
            abs(x - y)
            for x, y in zip(a.probabilities[:shared], b.probabilities[:shared], strict=True)
        ),
        default=0.0,
    )
    if difference > 1e-5:
        raise RuntimeError(f"the VAD's probabilities differ by {difference:.2e} under load")


def measure(workdir: Path, rounds: int, seconds: float) -> list[harness.Row]:
    example = load_example()
    quiet: list[Phase] = []
    loaded: list[Phase] = []
    load_figures: list[dict[str, float]] = []
    with contextlib.ExitStack() as stack:
        socket = str(stack.enter_context(processes.npud(workdir)))
        args = [
            sys.executable,
            "-c",
            LOAD,
            str(EXAMPLE),
            socket,
            str(workdir / "cache"),
            str(BACKGROUND_MS),
        ]
        child = stack.enter_context(processes.ready_child(args, "the TTS and background load"))
        vad = Vad(example, socket, stack)
        vad.phase(1.0)  # warm-up
        for index in range(rounds):
            for kind in ("quiet", "loaded") if index % 2 == 0 else ("loaded", "quiet"):
                if kind == "quiet":
                    quiet.append(vad.phase(seconds))
                    continue
                load_figures.append(_loaded(child, vad, seconds, loaded))
            _agree(quiet[-1], loaded[-1])
    rtf = [f["synthesis_s"] / f["audio_s"] for f in load_figures if f["audio_s"]]
    figures = {
        "quiet_p50_ms": statistics.median(p.p50_ms for p in quiet),
        "quiet_p99_ms": statistics.median(p.p99_ms for p in quiet),
        "loaded_p50_ms": statistics.median(p.p50_ms for p in loaded),
        "loaded_p99_ms": statistics.median(p.p99_ms for p in loaded),
        "quiet_dsp_p99_ms": statistics.median(p.dsp_p99_ms for p in quiet),
        "loaded_dsp_p99_ms": statistics.median(p.dsp_p99_ms for p in loaded),
        "quiet_misses": float(sum(p.misses for p in quiet)),
        "loaded_misses": float(sum(p.misses for p in loaded)),
        "tts_rtf": statistics.median(rtf) if rtf else float("nan"),
        "tts_sentences": float(sum(f["sentences"] for f in load_figures)),
        "bg_calls_per_s": statistics.median(
            f["background_calls"] / f["wall_s"] for f in load_figures
        ),
    }
    return [
        harness.ratio_row(
            "voice_day.vad_p99",
            "VAD p99 with Kokoro TTS + a background client / VAD p99 alone",
            [a.p99_ms / b.p99_ms for a, b in zip(loaded, quiet, strict=True)],
            figures,
            harness.Goal("ratio", P99_GOAL),
        ),
        harness.ratio_row(
            "voice_day.vad_misses",
            f"VAD chunks answered over 30 ms late with the load, per {seconds:g} s (a count)",
            [float(p.misses) for p in loaded],
            figures,
            harness.Goal("ratio", 0),
        ),
    ]


def _loaded(
    child: subprocess.Popen[str], vad: Vad, seconds: float, loaded: list[Phase]
) -> dict[str, float]:
    """One phase of the VAD while the child runs its load for as long."""
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write(f"{seconds}\n")
    child.stdin.flush()
    loaded.append(vad.phase(seconds))
    line = child.stdout.readline()
    if not line:
        raise RuntimeError(f"the load child ended (exit {child.wait(30)})")
    figures: dict[str, float] = json.loads(line)
    if not figures["sentences"]:
        raise RuntimeError("the TTS synthesised no sentence in the loaded phase")
    return figures


def _main_llm(rounds: int, seconds: float, plot: Path | None, *, quick: bool) -> int:
    from bench import voice_llm  # noqa: PLC0415  (needs the peer build)

    with tempfile.TemporaryDirectory(prefix="npud-bench-") as tmp:
        result = voice_llm.measure(Path(tmp), rounds, seconds, harness.Context(quick, Path(tmp)))
    print(harness.format_table(result, quick=quick))
    print(json.dumps(result[0].figures, indent=1))
    if plot is not None:
        voice_llm.plot(result, plot)
        print(f"plot: {plot}")
    return 0


# --- a module of python -m bench (bench/README.md) -----------------------------------------

NAME = "voice_day"
SUMMARY = "realtime Silero VAD beside Kokoro TTS and a background client vs VAD alone"


def rows(ctx: harness.Context) -> list[harness.Row]:
    return measure(ctx.workdir, ctx.rounds(5, 2), 20.0 if not ctx.quick else 6.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.voice_day",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 6 s")
    parser.add_argument(
        "--llm",
        action="store_true",
        help="llama.cpp (the peer build's llama-simple) as the third client, gating on and off",
    )
    parser.add_argument("--plot", type=Path, help="with --llm: draw the rows into this image")
    args = parser.parse_args(argv)
    rounds, seconds = (2, 6.0) if args.quick else (args.rounds, args.seconds)
    if rounds < 1 or seconds < 1:
        parser.error("--rounds must be at least 1 and --seconds at least 1")
    if args.plot is not None and not args.llm:
        parser.error("--plot goes with --llm")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        # Said before the minutes of measuring, not after them.
        parser.error("--plot needs matplotlib (the bench extra: pip install -e '.[bench]')")
    if args.llm:
        return _main_llm(rounds, seconds, args.plot, quick=args.quick)
    with tempfile.TemporaryDirectory(prefix="npud-bench-") as tmp:
        result = measure(Path(tmp), rounds, seconds)
    print(harness.format_table(result, quick=args.quick))
    f = result[0].figures
    print(
        f"VAD alone p50 {f['quiet_p50_ms']:.2f} ms p99 {f['quiet_p99_ms']:.2f} ms;"
        f" with the load p50 {f['loaded_p50_ms']:.2f} ms p99 {f['loaded_p99_ms']:.2f} ms;"
        f" misses {f['quiet_misses']:.0f} alone, {f['loaded_misses']:.0f} with the load\n"
        f"TTS real-time factor {f['tts_rtf']:.2f} ({f['tts_sentences']:.0f} sentences);"
        f" background {f['bg_calls_per_s']:.1f} calls/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
