"""Several models in one request (model_chain, protocol 7): a wake-word chunk's three
models through both clients, equal to running them one by one and to onnxruntime; every
refusal naming the step; nothing left behind on any path."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import trio

import npu_client
import npu_client._core
import npu_protocol as p
from npu_client import Step, trio_client
from npu_client._core import Call
from npu_client.transport import fds_ancillary
from npu_protocol import ErrorCode
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


# --- what npud refuses, each naming the step --------------------------------------------


async def _raw(npu: Any, steps: list[p.ChainStep], outputs: list[p.ChainOutput]) -> Any:
    """A model_chain as sent, past the client's own checks (trio client)."""
    call = Call(
        lambda rid: p.ModelChainRequest(id=rid, steps=tuple(steps), outputs=tuple(outputs)),
        lambda pending: pending.result(p.ModelChainReply),
    )
    return await npu._run(call)


def _source(step: int, output: str) -> p.ChainSource:
    return p.ChainSource(step=step, output=output)


@asynccontextmanager
async def _wake(tmp_path: Path, config: str = "") -> AsyncIterator[tuple[Any, Any, Any, Any]]:
    files = _files(tmp_path)
    async with (
        serve_daemon(tmp_path, config),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        mel, embedding, head = await _load(npu, files)
        mel.set_input("audio", _audio(0))
        yield npu, mel, embedding, head


def _good(mel: Any, embedding: Any, head: Any) -> list[p.ChainStep]:
    return [
        p.ChainStep(model=mel.id),
        p.ChainStep(model=embedding.id, inputs={"input_1": _source(0, "frames")}),
        p.ChainStep(model=head.id, inputs={"x": _source(1, "features")}),
    ]


SCORE = p.ChainOutput(step=2, output="score")


async def test_the_raw_request_runs_and_answers_every_shape(tmp_path: Path) -> None:
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        reply = await _raw(
            npu, _good(mel, embedding, head), [SCORE, p.ChainOutput(step=1, output="features")]
        )
        assert reply.output_shapes == ((1, 1), (1, 96))
        assert reply.dsp_us > 0
        # Once the models' refs are known, a chain is one invoke on the DSP.
        before = (await npu.status()).session.invokes_done
        await _raw(npu, _good(mel, embedding, head), [SCORE])
        assert (await npu.status()).session.invokes_done == before + 1


async def test_an_unknown_model_is_refused(tmp_path: Path) -> None:
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        steps = _good(mel, embedding, head)
        steps[1] = p.ChainStep(model=999, inputs={"input_1": _source(0, "frames")})
        with pytest.raises(npu_client.ModelNotLoaded, match="999"):
            await _raw(npu, steps, [SCORE])


@pytest.mark.parametrize(
    ("inputs", "error", "words"),
    [
        (  # an output the step feeding it does not have
            {"x": _source(1, "nope")},
            npu_client.InvalidTensorIndex,
            ["step 2 (model 3 'head.onnx')", "input 'x' is fed from step 1", "'nope'", "'features'"],
        ),
        (  # an input the graph does not have
            {"y": _source(1, "features")},
            npu_client.InvalidTensorIndex,
            ["step 2 (model 3 'head.onnx')", "input 'y'", "inputs: 'x'"],
        ),
        (  # dtype or shape differ between the output and the input it feeds
            {"x": _source(0, "frames")},
            npu_client.TensorMismatch,
            ["step 2 (model 3 'head.onnx')", "takes float32 [1, 96]", "is float32 [1, 5, 32]"],
        ),
        (  # a cycle: fed from itself
            {"x": _source(2, "score")},
            npu_client.InvalidArgument,
            ["step 2 (model 3 'head.onnx')", "fed from itself", "no cycles"],
        ),
    ],
)
async def test_a_bad_binding_is_refused_naming_the_step(
    tmp_path: Path, inputs: dict[str, p.ChainSource], error: type[Exception], words: list[str]
) -> None:
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        steps = _good(mel, embedding, head)
        steps[2] = p.ChainStep(model=head.id, inputs=inputs)
        with pytest.raises(error) as caught:
            await _raw(npu, steps, [SCORE])
        for word in words:
            assert word in str(caught.value)


async def test_a_step_fed_by_a_later_one_is_a_cycle(tmp_path: Path) -> None:
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        steps = _good(mel, embedding, head)
        steps[1] = p.ChainStep(model=embedding.id, inputs={"input_1": _source(2, "score")})
        with pytest.raises(npu_client.InvalidArgument, match="step 2, which is not earlier"):
            await _raw(npu, steps, [SCORE])


async def test_a_graph_twice_and_an_output_twice_are_refused(tmp_path: Path) -> None:
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        steps = [*_good(mel, embedding, head), p.ChainStep(model=head.id, inputs={"x": _source(1, "features")})]
        with pytest.raises(npu_client.InvalidArgument, match="step 3 .* runs the graph step 2 runs"):
            await _raw(npu, steps, [SCORE])
        with pytest.raises(npu_client.InvalidArgument, match="'score' is asked for twice"):
            await _raw(npu, _good(mel, embedding, head), [SCORE, SCORE])


async def test_an_output_no_step_produces_is_refused(tmp_path: Path) -> None:
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        with pytest.raises(npu_client.InvalidTensorIndex, match=r"step 2 \(model 3 'head.onnx'\): output 'nope'"):
            await _raw(npu, _good(mel, embedding, head), [p.ChainOutput(step=2, output="nope")])
        with pytest.raises(npu_client.InvalidArgument, match="names step 3; the chain has 3 steps"):
            await _raw(npu, _good(mel, embedding, head), [p.ChainOutput(step=3, output="score")])


async def test_too_many_steps_are_refused_and_the_connection_stays(tmp_path: Path) -> None:
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        steps = [p.ChainStep(model=mel.id, graph="") for _ in range(p.MAX_CHAIN_STEPS + 1)]
        with pytest.raises(npu_client.InvalidArgument, match="at most 16 steps; this one has 17"):
            await _raw(npu, steps, [p.ChainOutput(step=0, output="frames")])
        assert (await _raw(npu, _good(mel, embedding, head), [SCORE])).output_shapes == ((1, 1),)


async def test_intermediate_tensors_past_the_limit_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chains, "MAX_INTERMEDIATE_BYTES", 1024)
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        with pytest.raises(npu_client.QuotaExceeded, match="chain intermediate tensor bytes quota exceeded: the limit is 1024"):
            await _raw(npu, _good(mel, embedding, head), [SCORE])


async def test_a_protocol_6_client_is_served_and_told_chains_are_later(tmp_path: Path) -> None:
    files = _files(tmp_path)
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock", version=6)
        fd = os.open(files["head"], os.O_RDONLY | os.O_CLOEXEC)
        frame, numbers = peer.protocol.send(p.ModelLoadRequest(id=1, fd=fd))
        await peer.sock.sendmsg([frame], fds_ancillary(numbers))
        os.close(fd)
        loaded = await peer.next()
        assert isinstance(loaded, p.ModelLoadReply)
        await peer.write(p.ModelRunRequest(id=2, model=loaded.model))
        assert isinstance(await peer.next(), p.ModelRunReply)
        await peer.write(
            p.ModelChainRequest(
                id=3,
                steps=(p.ChainStep(model=loaded.model),),
                outputs=(p.ChainOutput(step=0, output="score"),),
            )
        )
        refused = await peer.next()
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.UNSUPPORTED
        assert "model_chain on this connection" in refused.message
        await peer.write(p.ModelRunRequest(id=4, model=loaded.model))
        assert isinstance(await peer.next(), p.ModelRunReply)  # the connection goes on
        peer.close()


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_a_client_refuses_a_chain_against_a_protocol_6_server(
    tmp_path: Path, kind: ClientKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clients offer 6 here, as against an npud that speaks 6 at most: the chain is
    refused before a byte is sent (such a server would end the connection)."""
    monkeypatch.setattr(npu_client._core, "PROTOCOL_VERSION", 6)
    files = _files(tmp_path)
    async with serve_daemon(tmp_path), open_client(kind, tmp_path / "npud.sock") as npu:
        mel, embedding, head = await _load(npu, files)
        with pytest.raises(npu_client.Unsupported, match="protocol version 6; running several"):
            _client(npu).chain(_wake_steps(mel, embedding, head), outputs=["wake:score"])
        await mel.run({"audio": _audio(1)})  # the connection goes on
