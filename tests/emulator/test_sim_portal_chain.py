"""The emulated portal_qnn's chains at the wire: model_ref and chain (idl/portal_qnn.idl),
with every AEE code a malformed plan gets, below npud's own checks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from npu_protocol import AEE
from npud.fastrpc.session import FastRpcSession
from npud.idl import arena
from npud.sim.portal_chain import GIVEN, MAX_STEPS, NO_STEP
from tests.emulator import onnx_models
from tests.emulator.test_sim_portal_qnn import Raw, session  # noqa: F401  (the fixture)

MODELS = ("mel", "embedding", "head")


@pytest.fixture
def wake(session: FastRpcSession, tmp_path: Path) -> Iterator[dict[str, Any]]:  # noqa: F811
    """The three wake-word models, each in a handle of its own (as npud loads them), and
    their refs."""
    data = {**onnx_models.wake_word_models(), "picky": onnx_models.picky_reshape()}
    with contextlib.ExitStack() as stack:
        loaded: dict[str, Any] = {}
        for name, model in data.items():
            fd = stack.enter_context(onnx_models.opened(tmp_path, f"{name}.onnx", model))
            exposed = stack.enter_context(session.expose_file(fd, suffix=".onnx"))
            raw = Raw(session)
            rc, values = raw.load(exposed.name)
            assert (rc, values.integer("qnn_status")) == (0, 0)
            rc, values = raw.call("model_ref", model_index=0)
            assert rc == 0
            loaded[name] = (raw, values.integer("ref"))
        loaded["data"] = data
        yield loaded


def _wake_plan(refs: dict[str, Any], asked: list[tuple[int, int]]) -> list[int]:
    words = [3, len(asked)]
    words += [refs["mel"][1], 0, 1, GIVEN, 0]
    words += [refs["embedding"][1], 0, 1, 0, 0]
    words += [refs["head"][1], 0, 1, 1, 0]
    for pair in asked:
        words += list(pair)
    return words


def _chain(raw: Raw, plan: list[int], inputs: bytes, outputs: int, dims: int = 9 * 32) -> Any:
    return raw.call("chain", plan=plan, inputs=inputs, outputs=outputs, dims=dims)


def test_a_chain_runs_every_step_in_one_call(wake: dict[str, Any]) -> None:
    audio = np.random.default_rng(0).standard_normal((1, 1280)).astype(np.float32)
    sessions = {n: ort.InferenceSession(wake["data"][n]) for n in MODELS}
    (frames,) = sessions["mel"].run(None, {"audio": audio})
    (features,) = sessions["embedding"].run(None, {"input_1": frames})
    (score,) = sessions["head"].run(None, {"x": features})
    offsets, size = arena.arena_layout([4, 96 * 4])
    raw = wake["head"][0]  # any handle of the process runs it
    rc, values = _chain(raw, _wake_plan(wake, [(2, 0), (1, 0)]), audio.tobytes(), size, 18)
    assert rc == 0
    assert [values.integer(k) for k in ("failed_step", "step_status", "qnn_status")] == [
        NO_STEP,
        0,
        0,
    ]
    data = values.data("outputs")
    got_score = np.frombuffer(data, np.float32, 1, offsets[0])
    got_features = np.frombuffer(data, np.float32, 96, offsets[1])
    np.testing.assert_allclose(got_score, score.ravel(), rtol=1e-6)
    np.testing.assert_allclose(got_features, features.ravel(), rtol=1e-6)
    assert values.integers("dims")[:12] == [2, 1, 1, 0, 0, 0, 0, 0, 0, 2, 1, 96]


def test_refs_name_a_model_in_the_whole_process_until_it_goes(wake: dict[str, Any]) -> None:
    refs = [wake[n][1] for n in MODELS]
    assert len(set(refs)) == 3
    assert GIVEN not in refs
    raw = wake["mel"][0]
    assert raw.call("model_ref", model_index=0)[1].integer("ref") == wake["mel"][1]
    assert raw.call("model_ref", model_index=4)[0] == AEE.EBADPARM.dsp
    assert raw.call("model_ref", model_index=1)[0] == AEE.EBADSTATE.dsp
    head = wake["head"][0]
    assert head.call("model_unload", model_index=0)[0] == 0
    audio = bytes(1280 * 4)
    rc, _ = _chain(raw, _wake_plan(wake, [(2, 0)]), audio, 64)
    assert rc == AEE.EBADPARM.dsp  # the head's ref went with it


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda w: [], AEE.EBADPARM),  # no words
        (lambda w: [0, 1, *w[2:]], AEE.EBADPARM),  # no steps
        (lambda w: [MAX_STEPS + 1, *w[1:]], AEE.EBADPARM),  # too many steps
        (lambda w: [*w, 0], AEE.EBADPARM),  # a word past the end
        (lambda w: w[:-1], AEE.EBADPARM),  # ends early
        (lambda w: [*w[:2], 999, *w[3:]], AEE.EBADPARM),  # an unknown ref
        (lambda w: [*w[:3], 5, *w[4:]], AEE.EBADPARM),  # no such graph
        (lambda w: [*w[:10], 2, *w[11:]], AEE.EBADPARM),  # fed from a later step
        (lambda w: [*w[:15], 0, *w[16:]], AEE.EBADPARM),  # frames [1,5,32] into x [1,96]
        (lambda w: [*w[:6], 1, *w[7:]], AEE.EBADPARM),  # a given tensor out of order
        (lambda w: [*w[:-2], 2, 1], AEE.EBADPARM),  # an output the step has not
    ],
)
def test_a_malformed_plan_is_refused_before_anything_runs(
    wake: dict[str, Any], edit: Any, code: AEE
) -> None:
    plan = edit(_wake_plan(wake, [(2, 0)]))
    assert _chain(wake["mel"][0], plan, bytes(1280 * 4), 64)[0] == code.dsp


def test_arenas_of_the_wrong_size_are_refused(wake: dict[str, Any]) -> None:
    raw, plan = wake["mel"][0], _wake_plan(wake, [(2, 0)])
    assert _chain(raw, plan, bytes(1280 * 4 - 4), 64)[0] == AEE.EBADSIZE.dsp
    assert _chain(raw, plan, bytes(1280 * 4), 0)[0] == AEE.EBUFFERTOOSMALL.dsp
    assert _chain(raw, plan, bytes(1280 * 4), 64, 8)[0] == AEE.EBUFFERTOOSMALL.dsp
    twice = _wake_plan(wake, [(2, 0), (2, 0)])
    assert _chain(raw, twice, bytes(1280 * 4), 128)[0] == AEE.EBADPARM.dsp


def test_a_failing_step_is_named_and_its_model_keeps_the_reason(wake: dict[str, Any]) -> None:
    refs = {n: wake[n][1] for n in (*MODELS, "picky")}
    plan = [3, 1]
    plan += [refs["mel"], 0, 1, GIVEN, 0]
    plan += [refs["embedding"], 0, 1, 0, 0]
    plan += [refs["picky"], 0, 2, 1, 0, GIVEN, 1]
    plan += [2, 0]
    offsets, size = arena.arena_layout([1280 * 4, 16])
    inputs = bytearray(size)
    inputs[offsets[1] : offsets[1] + 16] = np.array([7, 7], np.int64).tobytes()
    rc, values = _chain(wake["mel"][0], plan, bytes(inputs), 512)
    assert rc == 0
    assert values.integer("failed_step") == 2
    assert values.integer("qnn_status") != 0
    picky = wake["picky"][0]
    rc, said = picky.call("last_error", model_index=0, text=256)
    assert "Reshape" in said.data("text")[: said.integer("text_len")].decode()
    inputs[offsets[1] : offsets[1] + 16] = np.array([1, 96], np.int64).tobytes()
    rc, values = _chain(wake["mel"][0], plan, bytes(inputs), 512)
    assert (rc, values.integer("failed_step")) == (0, NO_STEP)
    assert picky.call("last_error", model_index=0, text=256)[1].integer("text_len") == 0
