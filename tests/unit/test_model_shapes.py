"""The daemon's shape check of an ONNX model (npud.fastrpc.stubs.model_shapes): ONNX's
rules for dimension names, and refusals that name every free dimension and suggest
shapes that keep what is fixed."""

from __future__ import annotations

import pytest

from npud.fastrpc.stubs.model_shapes import ShapeError, check_shapes, unsized_outputs_refusal
from npud.formats import onnx_proto
from tests.emulator import onnx_models


def source(data: bytes) -> onnx_proto.BytesSource:
    return onnx_proto.BytesSource(data)


def refusal(data: bytes, given: dict[str, tuple[int, ...]]) -> ShapeError:
    with pytest.raises(ShapeError) as caught:
        check_shapes(source(data), given)
    return caught.value


def test_dim_name_takes_no_name_from_question_marks_or_empty_params() -> None:
    assert [onnx_proto.dim_name(d) for d in ("batch", "?", "", None, 3)] == [
        "batch",
        None,
        None,
        None,
        None,
    ]


def test_question_mark_dimensions_are_each_free_on_their_own() -> None:
    """An OCR classifier [?, 3, 48, ?] at 48 x 192, as onnxruntime runs it."""
    assert check_shapes(source(onnx_models.ocr_classifier()), {"x": (1, 3, 48, 192)}) == [
        onnx_proto.GraphTensor("output", "y", ("?", 3))
    ]
    free = refusal(onnx_models.ocr_classifier(), {})
    assert free.kind == "free"
    assert str(free).startswith(
        "input 'x' dimensions 0 and 3 are free: give each tensor's whole shape at load, with N"
        " the sizes for your data: shapes={'x': [N, 3, 48, N]} (npuctl run --shape x=N,3,48,N);"
    )


def test_every_free_dimension_is_named_and_outputs_are_not_said_to_follow() -> None:
    """Piper's tensors: batch_size and phonemes free in input, batch_size in
    input_lengths; output's time follows from no input."""
    free = str(refusal(onnx_models.duration_tts(), {}))
    assert free.startswith(
        "inputs 'input' dimensions 0 ('batch_size') and 1 ('phonemes'), 'input_lengths'"
        " dimension 0 ('batch_size') are free: give each tensor's whole shape at load, with"
        " your data's sizes for each name and N: shapes={'input': [batch_size, phonemes],"
        " 'input_lengths': [batch_size]} (npuctl run --shape input=batch_size,phonemes"
        " --shape input_lengths=batch_size) (fixed already: scales [3]); output 'output'"
        " dimension 2 ('time') is not fixed by the inputs' shapes"
    )
    assert "follow from the inputs'" not in free
    # Where every output dimension is fixed or named by an input, they do follow.
    named = str(refusal(onnx_models.add_one(("n", 4)), {}))
    assert named.endswith("; output shapes follow from the inputs'")


def test_a_named_dimension_an_input_fixes_is_fixed_in_every_output() -> None:
    left = check_shapes(source(onnx_models.duration_tts()), {"input": (1, 9)})
    assert left == [onnx_proto.GraphTensor("output", "output", (1, 1, "time"))]
    message = unsized_outputs_refusal(left)
    assert message.startswith("output 'output' dimension 2 ('time') does not follow")
    assert "shapes={'output': [1, 1, N]} (npuctl run --shape output=1,1,N)" in message


def test_a_named_dimension_given_two_sizes_is_refused() -> None:
    mismatch = refusal(onnx_models.duration_tts(), {"input": (1, 9), "input_lengths": (2,)})
    assert mismatch.kind == "mismatch"
    assert str(mismatch) == (
        "dimension 'batch_size' is given as 1 and as 2 (input 'input_lengths' dimension 0)"
    )
