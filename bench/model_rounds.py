"""What the model rows share: small ONNX models made in code, onnxruntime sessions as the
in-process baseline runs them, and the interleaved timing of several sides
(npud, onnxruntime in-process, the same-emulator floor) with their ratios.

Used by bench/voice_models.py and bench/voice_chain.py.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from bench import harness


def model(nodes: list[Any], inputs: list[Any], outputs: list[Any], weights: list[Any]) -> bytes:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, weights)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return bytes(proto.SerializeToString())


def matrix(name: str, rows: int, columns: int, seed: int) -> Any:
    values = np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)
    return helper.make_tensor(name, TensorProto.FLOAT, [rows, columns], (values / rows).ravel())


def session(data: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def sides(runs: Sequence[Callable[[], object]], rounds: int, calls: int) -> list[list[float]]:
    """Per side, its per-round median times: every call runs each side once, the order
    turned by one side each call (and each round), so no side is always first or last."""
    medians: list[list[float]] = [[] for _ in runs]
    for index in range(rounds):
        samples: list[list[float]] = [[] for _ in runs]
        for call in range(calls):
            turn = (call + index) % len(runs)
            for side in [*range(turn, len(runs)), *range(turn)]:
                samples[side].append(timed(runs[side]))
        for side, taken in enumerate(samples):
            medians[side].append(statistics.median(taken))
    return medians


def rounds(
    subject: Callable[[], object], baseline: Callable[[], object], rounds: int, calls: int
) -> tuple[list[float], list[float], list[float]]:
    """Per-round median times of each side (call by call alternating) and their ratios."""
    mine, theirs = sides([subject, baseline], rounds, calls)
    return mine, theirs, ratios(mine, theirs)


def ratios(mine: Sequence[float], theirs: Sequence[float]) -> list[float]:
    return [m / t for m, t in zip(mine, theirs, strict=True)]


def floor_figures(mine: Sequence[float], floor: Sequence[float]) -> dict[str, float]:
    """The same-emulator floor's figures for a row: its median time and npud / floor (npud's
    own share: its daemon, socket and client) per round, median and IQR."""
    q1, median, q3 = harness.quartiles([m / f for m, f in zip(mine, floor, strict=True)])
    return {
        "floor_ms": statistics.median(floor) * 1000,
        "npud_over_floor": median,
        "npud_over_floor_q1": q1,
        "npud_over_floor_q3": q3,
    }
