"""A wake-word chunk as one chained request (issue 30, item 3), beside onnxruntime in-process.

openWakeWord runs three models on each 80 ms chunk of audio: a
melspectrogram, an embedding of the last 76 mel frames, and a wake-word head.
The stand-ins here have its tensors and roughly its compute (the embedding
the largest): ``mel`` takes the chunk (float32 [1, 1280]) and the previous
window of frames (float32 [1, 76, 32]) and gives the window moved on by the
chunk's 5 frames; ``embedding`` takes the window and gives features [1, 96]
through three products; ``head`` gives the score [1, 1]. Each chunk's window
is the next chunk's input, on both sides, as openWakeWord keeps it.

Two rows, each against the same three models in-process, chunk by chunk
alternating (the order flips each round):

* ``voice_models.wake_chain``: the three models as one ``model_chain``
  request per chunk (a ``Chain`` built once). Goal (issue 30): <= 2x. Beside
  it, a third side: the same-emulator floor, the three models loaded in this
  process through a ``FastRpcSession`` (bench.portal_qnn_vad's ``FloorModel``)
  and run as the same single portal_qnn ``chain`` invoke npud makes, with no
  daemon, socket or client: ``npud_over_floor`` is npud's own share.
* ``voice_models.wake_calls``: the same three as three ``run`` calls per
  chunk, for comparison (what a pipeline paid before chains).

Run: ``python -m bench --only voice_models`` (these rows come with its others).
"""

from __future__ import annotations

import contextlib
import statistics
import struct
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper

import npu_client
from bench import harness, model_rounds
from bench.portal_qnn_vad import FloorModel, floor_session
from npud.fastrpc.stubs.portal_qnn import arena_layout
from npud.requests.chains import DIMS_STRIDE, GIVEN, NO_STEP

CHAIN_GOAL = 2.0
FRAMES = 76
BANDS = 32
NEW_FRAMES = 5
CHUNK = 1280
HIDDEN = 768


def mel_model() -> bytes:
    """audio [1, 1280], window [1, 76, 32] -> next_window [1, 76, 32]: the chunk's 5
    frames (256 samples each through a 256 x 512 product, squared, into 32 bands) after
    the window's last 71."""
    nodes = [
        helper.make_node("Reshape", ["audio", "framing"], ["framed"]),
        helper.make_node("MatMul", ["framed", "spectrum"], ["bins"]),
        helper.make_node("Mul", ["bins", "bins"], ["power"]),
        helper.make_node("MatMul", ["power", "bands"], ["mel"]),
        helper.make_node("Slice", ["window", "keep_from", "keep_to", "frame_axis"], ["kept"]),
        helper.make_node("Concat", ["kept", "mel"], ["next_window"], axis=1),
    ]
    weights = [
        helper.make_tensor("framing", TensorProto.INT64, [3], [1, NEW_FRAMES, CHUNK // NEW_FRAMES]),
        model_rounds.matrix("spectrum", CHUNK // NEW_FRAMES, 512, 40),
        model_rounds.matrix("bands", 512, BANDS, 41),
        helper.make_tensor("keep_from", TensorProto.INT64, [1], [NEW_FRAMES]),
        helper.make_tensor("keep_to", TensorProto.INT64, [1], [FRAMES]),
        helper.make_tensor("frame_axis", TensorProto.INT64, [1], [1]),
    ]
    return model_rounds.model(
        nodes,
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, CHUNK]),
            helper.make_tensor_value_info("window", TensorProto.FLOAT, [1, FRAMES, BANDS]),
        ],
        [helper.make_tensor_value_info("next_window", TensorProto.FLOAT, [1, FRAMES, BANDS])],
        weights,
    )


def embedding_model() -> bytes:
    """input_1 [1, 76, 32] -> features [1, 96]: three products with ReLU over the
    frames, their mean, a projection."""
    nodes = [
        helper.make_node("MatMul", ["input_1", "w0"], ["m0"]),
        helper.make_node("Relu", ["m0"], ["h0"]),
        helper.make_node("MatMul", ["h0", "w1"], ["m1"]),
        helper.make_node("Relu", ["m1"], ["h1"]),
        helper.make_node("MatMul", ["h1", "w2"], ["m2"]),
        helper.make_node("Relu", ["m2"], ["h2"]),
        helper.make_node("ReduceMean", ["h2"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "project"], ["features"]),
    ]
    weights = [
        model_rounds.matrix("w0", BANDS, HIDDEN, 50),
        model_rounds.matrix("w1", HIDDEN, HIDDEN, 51),
        model_rounds.matrix("w2", HIDDEN, HIDDEN, 52),
        model_rounds.matrix("project", HIDDEN, 96, 53),
    ]
    return model_rounds.model(
        nodes,
        [helper.make_tensor_value_info("input_1", TensorProto.FLOAT, [1, FRAMES, BANDS])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 96])],
        weights,
    )


def head_model() -> bytes:
    """x [1, 96] -> score [1, 1] in (0, 1)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["m0"]),
        helper.make_node("Relu", ["m0"], ["h0"]),
        helper.make_node("MatMul", ["h0", "w1"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["score"]),
    ]
    weights = [model_rounds.matrix("w0", 96, 64, 60), model_rounds.matrix("w1", 64, 1, 61)]
    return model_rounds.model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 96])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 1])],
        weights,
    )


Array = np.ndarray[Any, Any]


class FloorChain:
    """The wake-word chain as npud runs it on the DSP (npud.requests.chains: one portal_qnn
    ``chain`` invoke, the caller's inputs gathered into it and the outputs asked for
    read out of its reply), on three :class:`FloorModel` of one floor session."""

    def __init__(self, mel: FloorModel, embedding: FloorModel, head: FloorModel) -> None:
        refs = [model.portal.model_ref(model.slot) for model in (mel, embedding, head)]
        if None in refs:
            raise RuntimeError("the emulator's portal_qnn has no chains")
        self._portal, self._slot = mel.portal, mel.slot
        # The plan (idl/portal_qnn.idl, chain): per step its model, graph and sources;
        # then the outputs asked for: the score, then the window.
        words = [3, 2, refs[0], 0, 2, GIVEN, 0, GIVEN, 1, refs[1], 0, 1, 0, 0]
        words += [refs[2], 0, 1, 1, 0, 2, 0, 0, 0]
        self._plan = struct.pack(f"<{len(words)}I", *words)
        mel_inputs = mel.graphs[0].inputs
        self._given, self._given_bytes = arena_layout(mel_inputs)
        self._given_names = [spec.name for spec in mel_inputs]
        asked = [head.graphs[0].outputs[0], mel.graphs[0].outputs[0]]
        self._asked, self._asked_bytes = arena_layout(asked)
        self._asked_specs = asked

    def run(self, audio: Array, window: Array) -> tuple[Array, Array]:
        """(score, next window) of one chunk."""
        gathered = bytearray(self._given_bytes)
        for name, offset in zip(self._given_names, self._given, strict=True):
            data = (audio if name == "audio" else window).tobytes()
            gathered[offset : offset + len(data)] = data
        rc, values = self._portal.call(
            "chain",
            plan=self._plan,
            inputs=bytes(gathered),
            outputs=self._asked_bytes,
            dims=DIMS_STRIDE * 2,
        )
        if rc != 0 or values.integer("failed_step") != NO_STEP:
            raise RuntimeError(f"the floor's chain failed (rc {rc})")
        data = values.data("outputs")
        score, next_window = (
            np.frombuffer(data, np.float32, spec.nbytes // 4, offset).reshape(spec.shape).copy()
            for spec, offset in zip(self._asked_specs, self._asked, strict=True)
        )
        return score, next_window


def measure(npu: npu_client.Client, workdir: Path, rounds: int, calls: int) -> list[harness.Row]:
    paths = {}
    for name, build in (("mel", mel_model), ("embedding", embedding_model), ("head", head_model)):
        paths[name] = workdir / f"wake_{name}.onnx"
        paths[name].write_bytes(build())
    local = {name: model_rounds.session(path.read_bytes()) for name, path in paths.items()}
    chunks = np.random.default_rng(7).standard_normal((16, 1, CHUNK)).astype(np.float32)
    state: dict[str, Any] = {"chunk": 0}

    def next_chunk() -> np.ndarray[Any, Any]:
        state["chunk"] = (state["chunk"] + 1) % len(chunks)
        chunk: np.ndarray[Any, Any] = chunks[state["chunk"]]
        return chunk

    with (
        floor_session() as session,
        contextlib.ExitStack() as stack,
        npu.load_model(paths["mel"], name="wake-mel") as mel,
        npu.load_model(paths["embedding"], name="wake-embedding") as embedding,
        npu.load_model(paths["head"], name="wake-head") as head,
    ):
        chain = npu.chain(
            [
                npu_client.Step("mel", mel),
                npu_client.Step("embed", embedding, inputs={"input_1": "mel:next_window"}),
                npu_client.Step("wake", head, inputs={"x": "embed:features"}),
            ],
            outputs=["wake:score", "mel:next_window"],
        )
        floor = FloorChain(
            *(FloorModel.open(stack, session, paths[n]) for n in ("mel", "embedding", "head"))
        )
        windows = {
            side: np.zeros((1, FRAMES, BANDS), np.float32)
            for side in ("chain", "calls", "local", "floor")
        }

        def chained() -> None:
            out = chain.run({"mel:audio": next_chunk(), "mel:window": windows["chain"]})
            windows["chain"] = out["mel:next_window"]
            assert out["wake:score"].shape == (1, 1)

        def on_floor() -> None:
            score, windows["floor"] = floor.run(next_chunk(), windows["floor"])
            assert score.shape == (1, 1)

        def three_calls() -> None:
            window = mel.run({"audio": next_chunk(), "window": windows["calls"]})["next_window"]
            windows["calls"] = window
            features = embedding.run({"input_1": window})["features"]
            assert head.run({"x": features})["score"].shape == (1, 1)

        def in_process() -> None:
            (window,) = local["mel"].run(None, {"audio": next_chunk(), "window": windows["local"]})
            windows["local"] = window
            (features,) = local["embedding"].run(None, {"input_1": window})
            (score,) = local["head"].run(None, {"x": features})
            assert score.shape == (1, 1)

        # The chain's score equals the models' in-process on the same chunk and window.
        check = chain.run({"mel:audio": chunks[0], "mel:window": windows["chain"]})
        (window,) = local["mel"].run(None, {"audio": chunks[0], "window": windows["chain"]})
        (features,) = local["embedding"].run(None, {"input_1": window})
        (score,) = local["head"].run(None, {"x": features})
        np.testing.assert_allclose(check["wake:score"], score, rtol=1e-4, atol=1e-6)
        floor_score, _ = floor.run(chunks[0], windows["chain"])
        np.testing.assert_allclose(floor_score, score, rtol=1e-4, atol=1e-6)
        chain_sides = [chained, in_process, on_floor]
        model_rounds.sides(chain_sides, 1, 20)  # warm up
        model_rounds.rounds(three_calls, in_process, 1, 20)
        chain_mine, chain_theirs, chain_floors = model_rounds.sides(chain_sides, rounds, calls)
        calls_mine, calls_theirs, calls_ratios = model_rounds.rounds(
            three_calls, in_process, rounds, calls
        )
    return [
        harness.ratio_row(
            "voice_models.wake_chain",
            "npud / in-process, a three-model wake-word chunk as one chained request",
            model_rounds.ratios(chain_mine, chain_theirs),
            {
                "npud_ms": statistics.median(chain_mine) * 1000,
                "in_process_ms": statistics.median(chain_theirs) * 1000,
                **model_rounds.floor_figures(chain_mine, chain_floors),
            },
            harness.Goal("ratio", CHAIN_GOAL),
        ),
        harness.ratio_row(
            "voice_models.wake_calls",
            "npud / in-process, the same chunk as three model runs (before chains)",
            calls_ratios,
            {
                "npud_ms": statistics.median(calls_mine) * 1000,
                "in_process_ms": statistics.median(calls_theirs) * 1000,
            },
        ),
    ]
