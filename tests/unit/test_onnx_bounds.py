"""npud.sim.onnx_bounds: the bounds a model shows of the sizes its data decides."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npud.sim.onnx_bounds import output_bounds
from tests.emulator import onnx_models
from tests.emulator.onnx_models import model, tensor


def _produced(data: bytes, feeds: dict[str, np.ndarray]) -> tuple[int, ...]:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return tuple(session.run(None, feeds)[0].shape)


def test_clipped_durations_bound_the_audio_by_phonemes_times_the_limit() -> None:
    data = onnx_models.clipped_tts()
    bounds = output_bounds(data, {"durations": (1, 3)})
    assert bounds["audio"] == (1, 1, 3 * onnx_models.CLIPPED_DURATION)
    # The bound holds for the longest durations the model lets through.
    assert _produced(data, {"durations": np.array([[99, 99, 99]])}) == (1, 1, 24)
    assert output_bounds(data, {"durations": (1, 10)})["audio"] == (1, 1, 80)


def test_a_max_len_constant_bounds_unclipped_durations() -> None:
    data = onnx_models.clipped_tts(limit=None, max_len=100)
    assert output_bounds(data, {"durations": (1, 50)})["audio"] == (1, 1, 100)
    both = onnx_models.clipped_tts(limit=2, max_len=100)
    assert output_bounds(both, {"durations": (1, 3)})["audio"] == (1, 1, 6)  # the tighter


def test_durations_with_no_bound_leave_the_dimension_free() -> None:
    """Piper's durations are exp of a prediction, clipped only from below: the sum
    has no bound, and the output needs its room given."""
    bounds = output_bounds(onnx_models.clipped_tts(limit=None), {"durations": (1, 3)})
    assert bounds["audio"] == (1, 1, None)
    tts = onnx_models.duration_tts()
    shapes = {"input": (1, 3), "input_lengths": (1,), "scales": (3,)}
    assert output_bounds(tts, shapes)["output"] == (1, 1, None)


def test_nonzero_is_at_most_every_element() -> None:
    data = onnx_models.nonzero()
    assert output_bounds(data, {"x": (4, 5)})["where"] == (2, 20)
    assert _produced(data, {"x": np.ones((4, 5), np.float32)}) == (2, 20)


def test_an_input_of_a_bounded_type_bounds_what_it_counts() -> None:
    """uint8 durations are at most 255 each: Range to their sum is at most 255 * n."""
    nodes = [
        helper.make_node("Cast", ["d"], ["wide"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["wide"], ["total"], keepdims=0),
        helper.make_node("Range", ["zero", "total", "two"], ["steps"]),
    ]
    weights = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("two", TensorProto.INT64, [], [2]),
    ]
    data = model(nodes, [tensor("d", "uint8", [4])], [tensor("steps", "int64", ["n"])], weights)
    assert output_bounds(data, {"d": (4,)})["steps"] == (math.ceil(4 * 255 / 2),)


@pytest.mark.parametrize(
    ("delta", "op"),
    [(-1, "Range"), (0, "Range"), (1, "Unknown")],
)
def test_no_bound_from_what_is_not_understood(delta: int, op: str) -> None:
    """A step that is not positive, or an op without a rule: no bound."""
    nodes = [
        helper.make_node("Clip", ["d", "zero", "limit"], ["c"]),
        helper.make_node("ReduceSum", ["c"], ["total"], keepdims=0),
        helper.make_node(op, ["zero", "total", "delta"], ["steps"]),
    ]
    weights = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("limit", TensorProto.INT64, [], [4]),
        helper.make_tensor("delta", TensorProto.INT64, [], [delta]),
    ]
    data = model(nodes, [tensor("d", "int64", [3])], [tensor("steps", "int64", ["n"])], weights)
    assert output_bounds(data, {"d": (3,)}).get("steps", (None,)) == (None,)


def test_shapes_made_of_shape_concat_and_reshape() -> None:
    """Piper's Reshape target: Concat(Shape(lengths), [1], [-1]); a 0 keeps a dimension."""
    nodes = [
        helper.make_node("Clip", ["d", "zero", "limit"], ["c"]),
        helper.make_node("ReduceSum", ["c"], ["total"], keepdims=0),
        helper.make_node("Range", ["zero", "total", "one"], ["steps"]),
        helper.make_node("Shape", ["lengths"], ["batch"]),
        helper.make_node("Concat", ["batch", "one_d", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["steps", "target"], ["out"]),
        helper.make_node("Unsqueeze", ["out", "axes"], ["wide"]),
        helper.make_node("Transpose", ["wide"], ["flipped"], perm=[3, 1, 2, 0]),
    ]
    weights = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("limit", TensorProto.INT64, [], [5]),
        helper.make_tensor("one_d", TensorProto.INT64, [1], [1]),
        helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
    ]
    data = model(
        nodes,
        [tensor("d", "int64", [1, 6]), tensor("lengths", "int64", [1])],
        [tensor("flipped", "int64", ["t", 1, 1, 1])],
        weights,
    )
    bounds = output_bounds(data, {"d": (1, 6), "lengths": (1,)})
    assert bounds["out"] == (1, 1, 30)
    assert bounds["flipped"] == (30, 1, 1, 1)
    feeds = {"d": np.full((1, 6), 9, np.int64), "lengths": np.array([6])}
    assert _produced(data, feeds) == (30, 1, 1, 1)


def test_a_model_it_cannot_read_has_no_bounds() -> None:
    assert output_bounds(b"\xff\xff not a model", {"x": (1,)}) == {}
    assert output_bounds(b"", {}) == {}
