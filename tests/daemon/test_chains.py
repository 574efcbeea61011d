"""Several models in one request (model_chain, protocol 7): a wake-word chunk's three
models through both clients, equal to running them one by one and to onnxruntime; every
refusal naming the step; nothing left behind on any path."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

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
from npu_protocol import AEE, CodedError, ErrorCode
from npud.fastrpc.stubs.portal_qnn import DataType, GraphSpec, TensorSpec
from npud.requests import chains
from npud.requests.models import ArenaLayout
from npud.sim import portal_chain
from npud.sim.portal_qnn import PortalQnnSkel
from tests.daemon.model_clients import CLIENT_KINDS, ClientKind, open_client
from tests.daemon.test_npuctl_models import npuctl_in_thread
from tests.daemon.wire import RawPeer, connections_ended, serve_daemon, settle
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
async def test_wake_word_chain_equals_the_models_one_by_one(
    tmp_path: Path, kind: ClientKind
) -> None:
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
            [
                "step 2 (model 3 'head.onnx')",
                "input 'x' is fed from step 1",
                "'nope'",
                "'features'",
            ],
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
        steps = [
            *_good(mel, embedding, head),
            p.ChainStep(model=head.id, inputs={"x": _source(1, "features")}),
        ]
        with pytest.raises(
            npu_client.InvalidArgument, match=r"step 3 .* runs the graph step 2 runs"
        ):
            await _raw(npu, steps, [SCORE])
        with pytest.raises(npu_client.InvalidArgument, match="'score' is asked for twice"):
            await _raw(npu, _good(mel, embedding, head), [SCORE, SCORE])


async def test_an_output_no_step_produces_is_refused(tmp_path: Path) -> None:
    async with _wake(tmp_path) as (npu, mel, embedding, head):
        with pytest.raises(
            npu_client.InvalidTensorIndex, match=r"step 2 \(model 3 'head.onnx'\): output 'nope'"
        ):
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
        with pytest.raises(
            npu_client.QuotaExceeded,
            match="chain intermediate tensor bytes quota exceeded: the limit is 1024",
        ):
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


# --- a step that fails, and what is left behind -----------------------------------------

THREADS: Final = "[emulator]\npd_isolation = 'thread'\n"
"""The DSP process in npud's own process: the test sees the skel's chains."""


@pytest.fixture
def chain_runs(monkeypatch: pytest.MonkeyPatch) -> list[portal_chain.ChainRun]:
    """Every chain call's intermediate tensors (the DSP side, thread isolation)."""
    made: list[portal_chain.ChainRun] = []

    class Recorded(portal_chain.ChainRun):
        def __init__(self, refs: portal_chain.ModelRefs) -> None:
            super().__init__(refs)
            self.refs = refs
            made.append(self)

    monkeypatch.setattr(portal_chain, "ChainRun", Recorded)
    return made


def _all_freed(runs: list[portal_chain.ChainRun]) -> bool:
    return all(not run.produced and run.refs.live_bytes == 0 for run in runs)  # type: ignore[attr-defined]


async def test_a_step_failing_mid_chain_names_the_step_and_frees_everything(
    tmp_path: Path, chain_runs: list[portal_chain.ChainRun]
) -> None:
    picky = tmp_path / "picky.onnx"
    picky.write_bytes(onnx_models.picky_reshape())
    async with _wake(tmp_path, THREADS) as (npu, mel, embedding, _head):
        reshape = await npu.load_model(picky)
        chain = npu.chain(
            [
                Step("mel", mel),
                Step("embed", embedding, inputs={"input_1": "mel:frames"}),
                Step("reshape", reshape, inputs={"x": "embed:features"}),
            ],
            outputs=["reshape:y"],
        )
        good = await chain.run({"reshape:target": np.array([1, 96], np.int64)})
        assert good["reshape:y"].shape == (1, 96)
        with pytest.raises(npu_client.QnnError) as caught:
            await chain.run({"reshape:target": np.array([7, 7], np.int64)})
        message = str(caught.value)
        assert "step 2 (model 4 'picky.onnx'): failed with QNN error" in message
        assert "Reshape" in message  # onnxruntime's reason, from the step's model
        assert len(chain_runs) == 2
        assert _all_freed(chain_runs)
        # The chain and each model still run.
        again = await chain.run({"reshape:target": np.array([1, 96], np.int64)})
        np.testing.assert_array_equal(again["reshape:y"], good["reshape:y"])
        assert _all_freed(chain_runs)


async def test_outputs_sized_by_the_data_in_a_chain(tmp_path: Path) -> None:
    """An output with a room comes back at the size the run produced; one that outgrows
    its room, or is smaller than the input it feeds takes, fails naming the step."""
    tts = tmp_path / "tts.onnx"
    tts.write_bytes(onnx_models.duration_tts())
    add = tmp_path / "add.onnx"
    add.write_bytes(onnx_models.add_one((1, 1, 16)))
    async with (
        serve_daemon(tmp_path),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        voice = await npu.load_model(
            tts, shapes={"input": (1, 4), "input_lengths": (1,), "output": (1, 1, 16)}
        )
        plus = await npu.load_model(add)
        alone = npu.chain([Step("tts", voice)], outputs=["tts:output"])
        scales = np.array([0.5, 1, 1], np.float32)
        out = await alone.run(
            {
                "tts:input": np.array([[2, 3, 4, 1]], np.int64),
                "tts:input_lengths": np.array([1], np.int64),
                "tts:scales": scales,
            }
        )
        np.testing.assert_array_equal(
            out["tts:output"], np.arange(10, dtype=np.float32)[None, None] * 0.5
        )
        with pytest.raises(
            npu_client.OutputTooLarge, match=r"step 0 \(model 1 'tts.onnx'\).*'output'"
        ):
            await alone.run({"tts:input": np.array([[9, 9, 9, 9]], np.int64)})
        fed = npu.chain(
            [Step("tts", voice), Step("add", plus, inputs={"x": "tts:output"})],
            outputs=["add:y"],
        )
        full = await fed.run({"tts:input": np.array([[4, 4, 4, 4]], np.int64)})
        np.testing.assert_array_equal(
            full["add:y"], np.arange(16, dtype=np.float32)[None, None] * 0.5 + 1
        )
        with pytest.raises(
            npu_client.TensorMismatch, match=r"step 1 \(model 2 'add.onnx'\).*produced \[1, 1, 10\]"
        ):
            await fed.run({"tts:input": np.array([[2, 3, 4, 1]], np.int64)})


async def test_a_client_gone_mid_chain_leaves_nothing(
    tmp_path: Path, chain_runs: list[portal_chain.ChainRun]
) -> None:
    files = _files(tmp_path)
    async with serve_daemon(tmp_path, THREADS) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        ids = []
        for request_id, name in enumerate(("mel", "embedding", "head"), start=1):
            fd = os.open(files[name], os.O_RDONLY | os.O_CLOEXEC)
            frame, numbers = peer.protocol.send(p.ModelLoadRequest(id=request_id, fd=fd))
            await peer.sock.sendmsg([frame], fds_ancillary(numbers))
            os.close(fd)
            loaded = await peer.next()
            assert isinstance(loaded, p.ModelLoadReply)
            ids.append(loaded.model)
        steps = [
            p.ChainStep(model=ids[0]),
            p.ChainStep(model=ids[1], inputs={"input_1": _source(0, "frames")}),
            p.ChainStep(model=ids[2], inputs={"x": _source(1, "features")}),
        ]
        await peer.write(
            *(
                p.ModelChainRequest(id=10 + i, steps=tuple(steps), outputs=(SCORE,))
                for i in range(4)
            )
        )
        peer.close()  # gone with its chains in flight
        await connections_ended(daemon, 0)
        assert daemon.broker.status().domains[0].models == 0
        await settle(lambda: _all_freed(chain_runs), lambda: f"{len(chain_runs)} chain runs")


# --- a DSP without chains (the C skel today): one run per step --------------------------


@pytest.mark.parametrize("missing", ["_model_ref", "_chain"])
async def test_without_chains_on_the_dsp_the_steps_run_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.setattr(PortalQnnSkel, missing, lambda self, call: AEE.EUNSUPPORTED.dsp)
    files = _files(tmp_path)
    picky = tmp_path / "picky.onnx"
    picky.write_bytes(onnx_models.picky_reshape())
    async with _wake(tmp_path, THREADS) as (npu, mel, embedding, head):
        chain = npu.chain(
            _wake_steps(mel, embedding, head), outputs=["wake:score", "embed:features"]
        )
        audio = _audio(4)
        await chain.run({"mel:audio": audio})
        before = (await npu.status()).session.invokes_done
        got = await chain.run({"mel:audio": audio})
        calls = (await npu.status()).session.invokes_done - before
        assert calls == 3  # a run per step (a skel without chain is asked once)
        want = _reference(files, audio)
        np.testing.assert_allclose(got["wake:score"], want["score"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["embed:features"], want["features"], rtol=1e-5, atol=1e-6)
        reshape = await npu.load_model(picky)
        failing = npu.chain(
            [
                Step("mel", mel),
                Step("embed", embedding, inputs={"input_1": "mel:frames"}),
                Step("reshape", reshape, inputs={"x": "embed:features"}),
            ],
            outputs=["reshape:y"],
        )
        with pytest.raises(
            npu_client.QnnError, match=r"step 2 \(model 4 'picky.onnx'\): graph 0 failed"
        ):
            await failing.run({"reshape:target": np.array([7, 7], np.int64)})


def test_models_of_another_dsp_process_are_refused() -> None:
    """A chain runs in one domain: a model of another session is refused, naming it."""
    spec = GraphSpec(0, (), (TensorSpec(0, "y", DataType.FLOAT32, (1,), 4),))

    def model(name: str, session: object) -> Any:
        return SimpleNamespace(
            name=name,
            session=session,
            graph_names=("",),
            graph_specs=(spec,),
            layouts=(ArenaLayout.of(spec),),
            graph_index=lambda graph: 0,
        )

    here: Any = object()
    there: Any = object()
    request = p.ModelChainRequest(
        id=1,
        steps=(p.ChainStep(model=1), p.ChainStep(model=2)),
        outputs=(p.ChainOutput(step=1, output="y"),),
    )
    with pytest.raises(CodedError) as caught:
        chains.plan_chain(request, [model("a", here), model("b", there)], here)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert "step 1 (model 2 'b'): the model was loaded in another DSP process" in str(caught.value)


# --- what the clients refuse before sending --------------------------------------------


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_the_clients_check_a_chain_when_it_is_built(tmp_path: Path, kind: ClientKind) -> None:
    files = _files(tmp_path)
    async with serve_daemon(tmp_path), open_client(kind, tmp_path / "npud.sock") as npu:
        mel, embedding, head = (_model(m) for m in await _load(npu, files))
        client = _client(npu)
        refusals: list[tuple[Any, Any, type[Exception], str]] = [
            ([], ["a:b"], npu_client.InvalidArgument, "1 to 16 steps; got 0"),
            ([Step("m:x", mel)], ["m:x:frames"], npu_client.InvalidArgument, "has a colon"),
            (
                [Step("m", mel), Step("m", embedding)],
                ["m:frames"],
                npu_client.InvalidArgument,
                "is taken",
            ),
            (
                [Step("m", object())],
                ["m:frames"],
                npu_client.InvalidArgument,
                "not one this client loaded",
            ),
            ([Step("m", mel)], ["frames"], npu_client.InvalidArgument, "is not '<step>:<tensor>'"),
            (
                [Step("m", mel)],
                ["e:frames"],
                npu_client.InvalidArgument,
                "names step 'e', which is not an earlier step",
            ),
            (
                [Step("m", mel)],
                ["m:nope"],
                npu_client.InvalidTensorIndex,
                "output 'nope' (its outputs: 'frames')",
            ),
            (
                [Step("m", mel)],
                ["m:frames", "m:frames"],
                npu_client.InvalidArgument,
                "asked for twice",
            ),
            (
                [Step("m", mel), Step("w", head, inputs={"x": "m:frames"})],
                ["w:score"],
                npu_client.TensorMismatch,
                "input 'x' takes float32 [1, 96]; step 'm' (model 1 'mel.onnx')'s output 'frames' is float32 [1, 5, 32]",
            ),
            (
                [Step("e", embedding, inputs={"input_1": "e:features"})],
                ["e:features"],
                npu_client.InvalidArgument,
                "names step 'e', which is not an earlier step",
            ),
            (
                [Step("m", mel), Step("w", head, inputs={"nope": "m:frames"})],
                ["w:score"],
                npu_client.InvalidTensorIndex,
                "input 'nope' (its inputs: 'x')",
            ),
            (
                [Step("m", mel, graph="other")],
                ["m:frames"],
                npu_client.InvalidTensorIndex,
                "graph 'other'",
            ),
        ]
        for steps, outputs, error, words in refusals:
            with pytest.raises(error) as caught:
                client.chain(steps, outputs)
            assert words in str(caught.value), (words, str(caught.value))
        too_many = [
            Step(str(i), mel if i == 0 else embedding) for i in range(p.MAX_CHAIN_STEPS + 1)
        ]
        with pytest.raises(npu_client.InvalidArgument, match="1 to 16 steps; got 17"):
            client.chain(too_many, ["0:frames"])
        chain = client.chain(_wake_steps(mel, embedding, head), ["wake:score"])
        with pytest.raises(npu_client.InputNotSet, match="chain input 'mel:audio' has no value"):
            await _run(chain, {})
        with pytest.raises(
            npu_client.InvalidArgument, match="embed:input_1 is fed by an earlier step"
        ):
            await _run(chain, {"embed:input_1": np.zeros((1, 5, 32), np.float32)})
        with pytest.raises(npu_client.TensorMismatch):
            await _run(chain, {"mel:audio": np.zeros((1, 5), np.float32)})
        assert "mel -> embed -> wake" in repr(chain)


# --- npuctl chain -----------------------------------------------------------------------


async def test_npuctl_chain_runs_the_wake_word_models_as_one_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _files(tmp_path)
    audio = _audio(2)
    np.save(tmp_path / "chunk.npy", audio)
    feeds = ["--feed", "embedding:input_1=mel:frames", "--feed", "head:x=embedding:features"]
    models = [str(files[name]) for name in ("mel", "embedding", "head")]
    async with serve_daemon(tmp_path):
        socket = tmp_path / "npud.sock"
        code, out, err = await npuctl_in_thread(
            socket,
            capsys,
            "chain",
            *models,
            *feeds,
            "--input",
            f"mel:audio={tmp_path / 'chunk.npy'}",
        )
        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert (
            lines[0] == "chain    mel (mel.onnx) -> embedding (embedding.onnx) -> head (head.onnx)"
        )
        assert f"input    mel:audio float32 [1, 1280] <- {tmp_path / 'chunk.npy'}" in lines
        assert "input    embedding:input_1 float32 [1, 5, 32] <- mel:frames" in lines
        assert "output   head:score float32 [1, 1]" in lines
        assert lines[-1].startswith("time     load ")
        code, out, _ = await npuctl_in_thread(
            socket, capsys, "chain", *models, *feeds, "--output", "embedding:features", "--json"
        )
        report = json.loads(out)
        assert code == 0
        assert [t["name"] for t in report["outputs"]] == ["embedding:features"]
        assert report["inputs"][0]["source"] == "zeros"
        assert report["dsp_us"] > 0
        # Mistakes are told, with what there is.
        code, _, err = await npuctl_in_thread(
            socket, capsys, "chain", *models, "--feed", "head:x=mel:frames"
        )
        assert code == 1
        assert "input 'x' takes float32 [1, 96]" in err
        code, _, err = await npuctl_in_thread(
            socket, capsys, "chain", *models, "--input", "nope:x=a.npy"
        )
        assert code == 64
        assert "names step 'nope'; the steps are 'mel', 'embedding', 'head'" in err
        code, _, err = await npuctl_in_thread(socket, capsys, "chain", models[0], models[0])
        assert code == 64
        assert "step name 'mel' is taken twice" in err


# --- random chains: refused cleanly, never an internal error ------------------------------

FUZZ_CHAINS: Final = 150
"""Random chains sent in the fuzz test (a bound on its time: about 1.5 s here)."""
FUZZ_NAMES: Final = (
    "audio",
    "frames",
    "input_1",
    "features",
    "x",
    "score",
    "",
    "nope",
    "\u00e9" * 40,
)


REAL_OUTPUTS: Final = ((0, "frames"), (1, "features"), (2, "score"))


def _random_chain(
    rng: np.random.Generator, ids: list[int], good: list[p.ChainStep]
) -> tuple[list[p.ChainStep], list[p.ChainOutput]]:
    """A third: the good chain asking for real outputs (it runs); a third: the good chain
    with one step's feed drawn at random; a third: everything drawn at random."""

    def name() -> str:
        return str(rng.choice(FUZZ_NAMES))

    kind = rng.random()
    if kind < 2 / 3:
        asked = rng.choice(len(REAL_OUTPUTS), size=int(rng.integers(1, 4)), replace=False)
        outputs = [p.ChainOutput(step=REAL_OUTPUTS[i][0], output=REAL_OUTPUTS[i][1]) for i in asked]
        if kind < 1 / 3:
            return list(good), outputs
        steps = list(good)
        at = int(rng.integers(0, len(steps)))
        steps[at] = p.ChainStep(
            model=steps[at].model, inputs={name(): _source(int(rng.integers(0, 4)), name())}
        )
        return steps, outputs
    count = int(rng.integers(1, p.MAX_CHAIN_STEPS + 3))
    steps = [
        p.ChainStep(
            model=int(rng.choice([*ids, 99, 4242])),
            graph=name() if rng.random() < 0.2 else "",
            inputs={
                name(): _source(int(rng.integers(0, count + 2)), name())
                for _ in range(int(rng.integers(0, 3)))
            },
        )
        for _ in range(count)
    ]
    outputs = [
        p.ChainOutput(step=int(rng.integers(0, count + 2)), output=name())
        for _ in range(int(rng.integers(1, 4)))
    ]
    return steps, outputs


async def test_random_chains_are_answered_or_refused_and_leave_nothing(
    tmp_path: Path, chain_runs: list[portal_chain.ChainRun]
) -> None:
    """Chains of real and unknown models, names and step numbers drawn at random (and the
    good chain, whole or with one feed drawn at random): each is run or refused with a client's error (never npud's internal one), the connection goes
    on, and every intermediate tensor of the chains that ran is freed."""
    rng = np.random.default_rng(28)
    answered = 0
    refusals: list[npu_client.NpuError] = []
    async with _wake(tmp_path, THREADS) as (npu, mel, embedding, head):
        ids = [mel.id, embedding.id, head.id]
        for _ in range(FUZZ_CHAINS):
            steps, outputs = _random_chain(rng, ids, _good(mel, embedding, head))
            try:
                await _raw(npu, steps, outputs)
                answered += 1
            except npu_client.NpuError as exc:
                refusals.append(exc)
        assert (await _raw(npu, _good(mel, embedding, head), [SCORE])).output_shapes == ((1, 1),)
    assert answered + len(refusals) == FUZZ_CHAINS
    assert answered > FUZZ_CHAINS // 4  # the good chains ran...
    assert len(refusals) > FUZZ_CHAINS // 3  # ...and most others are wrong somewhere
    internal = [e for e in refusals if e.code == ErrorCode.INTERNAL_ERROR]
    dropped = [e for e in refusals if isinstance(e, npu_client.NpuConnectionError)]
    assert not internal, internal
    assert not dropped, dropped
    assert len(chain_runs) >= answered  # the DSP side was seen (thread isolation)...
    assert _all_freed(chain_runs)  # ...and freed everything
