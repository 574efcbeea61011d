"""Several models in one request (model_chain, protocol 7): a wake-word chunk's three
models through both clients, equal to running them one by one and to onnxruntime; every
refusal naming the step; nothing left behind on any path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import trio

import npu_client
import npu_protocol as p
from npu_client import Step
from npud import chains
from tests.daemon.model_clients import CLIENT_KINDS, ClientKind, open_client
from tests.daemon.wire import RawPeer, serve_daemon
from tests.emulator import onnx_models


def _audio(seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((1, 1280)).astype(np.float32)


def _reference(files: dict[str, Path], audio: np.ndarray[Any, Any]) -> dict[str, Any]:
    """The three models in onnxruntime in-process, one after the other."""
    sessions = {
        name: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for name, path in files.items()
    }
    (frames,) = sessions["mel"].run(None, {"audio": audio})
    (features,) = sessions["embedding"].run(None, {"input_1": frames})
    (score,) = sessions["head"].run(None, {"x": features})
    return {"frames": frames, "features": features, "score": score}


def _files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for name, data in onnx_models.wake_word_models().items():
        files[name] = tmp_path / f"{name}.onnx"
        files[name].write_bytes(data)
    return files


async def _load(npu: Any, files: dict[str, Path]) -> tuple[Any, Any, Any]:
    mel = await npu.load_model(files["mel"])
    embedding = await npu.load_model(files["embedding"])
    head = await npu.load_model(files["head"])
    return mel, embedding, head


def _wake_steps(mel: Any, embedding: Any, head: Any) -> list[Step]:
    return [
        Step("mel", _model(mel)),
        Step("embed", _model(embedding), inputs={"input_1": "mel:frames"}),
        Step("wake", _model(head), inputs={"x": ("embed", "features")}),
    ]


def _model(model: Any) -> Any:
    """The client's own model object (the blocking one under its awaited wrapper)."""
    return getattr(model, "model", model)


def _client(npu: Any) -> Any:
    return getattr(npu, "client", npu)


async def _run(chain: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    if isinstance(chain, npu_client.Chain):
        return await trio.to_thread.run_sync(chain.run, inputs)
    result: dict[str, Any] = await chain.run(inputs)
    return result


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_wake_word_chain_equals_the_models_one_by_one(tmp_path: Path, kind: ClientKind) -> None:
    files = _files(tmp_path)
    async with serve_daemon(tmp_path), open_client(kind, tmp_path / "npud.sock") as npu:
        mel, embedding, head = await _load(npu, files)
        chain = _client(npu).chain(
            _wake_steps(mel, embedding, head), outputs=["wake:score", "mel:frames"]
        )
        assert chain.outputs == ("wake:score", "mel:frames")
        assert list(chain.inputs) == ["mel:audio"]
        for seed in range(3):  # built once, run per chunk
            audio = _audio(seed)
            got = await _run(chain, {"mel:audio": audio})
            want = _reference(files, audio)
            np.testing.assert_allclose(got["wake:score"], want["score"], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got["mel:frames"], want["frames"], rtol=1e-5, atol=1e-6)
            # The same as the three models run one by one through npud.
            frames = (await mel.run({"audio": audio}))["frames"]
            features = (await embedding.run({"input_1": frames}))["features"]
            score = (await head.run({"x": features}))["score"]
            np.testing.assert_array_equal(got["wake:score"], score)
        assert got["wake:score"].shape == (1, 1)
        status = await npu.status()
        runs = {row.name: row.runs for row in status.clients[0].models}
        assert runs == {"mel.onnx": 6, "embedding.onnx": 6, "head.onnx": 6}
