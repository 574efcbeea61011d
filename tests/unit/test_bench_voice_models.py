"""bench/voice_models.py's interleaving and its floor figures (issue 30): each side runs
once per call, no side always first, and npud / floor is taken round by round."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import model_rounds
from bench.portal_qnn_vad import FloorModel, floor_session
from tests.emulator import onnx_models


def test_every_call_runs_each_side_once_turning_who_goes_first() -> None:
    order: list[str] = []
    sides = [
        lambda: order.append("npud"),
        lambda: order.append("ort"),
        lambda: order.append("floor"),
    ]
    medians = model_rounds.sides(sides, rounds=2, calls=3)
    assert [len(m) for m in medians] == [2, 2, 2]
    calls = [order[i : i + 3] for i in range(0, len(order), 3)]
    assert all(sorted(call) == ["floor", "npud", "ort"] for call in calls)
    assert [call[0] for call in calls] == ["npud", "ort", "floor", "ort", "floor", "npud"]


def test_floor_figures_take_npud_over_floor_round_by_round() -> None:
    figures = model_rounds.floor_figures([2.0, 3.0, 4.0], [1.0, 2.0, 2.0])
    assert figures["floor_ms"] == 2000.0
    assert figures["npud_over_floor"] == 2.0  # the median of 2, 1.5 and 2
    assert (figures["npud_over_floor_q1"], figures["npud_over_floor_q3"]) == (1.75, 2.0)
    with pytest.raises(ValueError, match="longer"):
        model_rounds.floor_figures([1.0], [1.0, 2.0])  # rounds of the two sides differ


def test_the_floor_runs_the_graph_the_inputs_fit_and_returns_the_real_length(
    tmp_path: Path,
) -> None:
    """FloorModel loads as npud does (sizes make graphs; a room is filled in part) and
    agrees with onnxruntime in-process."""
    tts, decoder = tmp_path / "tts.onnx", tmp_path / "decoder.onnx"
    tts.write_bytes(onnx_models.duration_tts())
    decoder.write_bytes(onnx_models.growing_decoder())
    given: dict[str, np.ndarray[Any, Any]] = {
        "input": np.array([[2, 3, 1]], np.int64),
        "input_lengths": np.array([3], np.int64),
        "scales": np.array([0.5, 1, 1], np.float32),
    }
    preds = np.array([[1, 3, 0]], np.int64)
    with floor_session() as session, contextlib.ExitStack() as stack:
        shapes = {"input": (1, 3), "output": (1, 1, 8)}
        floor_tts = FloorModel.open(stack, session, tts, shapes)
        floor_decoder = FloorModel.open(stack, session, decoder, {"preds": (1, [1, 3])})
        audio = floor_tts.run(given)["output"]
        assert floor_decoder.graph_for({"preds": preds}) == 1
        logits = floor_decoder.run({"preds": preds})["logits"]
    assert audio.shape == (1, 1, 6)  # the room is 8: the run's real length comes back
    (expected,) = model_rounds.session(tts.read_bytes()).run(None, given)
    np.testing.assert_array_equal(audio, expected)
    (local,) = model_rounds.session(decoder.read_bytes()).run(None, {"preds": preds})
    np.testing.assert_array_equal(logits, local)
