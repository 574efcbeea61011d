"""Inputs fixed to values and the If nodes they decide folded (npud.sim.onnx_fold),
checked against onnxruntime on the model as it was."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from npud.formats import onnx_proto
from npud.formats.onnx_values import Constant
from npud.sim.onnx_fold import FoldError, fold_constants
from tests.emulator import onnx_models

SR_16K = Constant("int64", (), (16000,))


def session(data: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def test_a_fixed_input_is_gone_and_the_branch_it_decides_is_inlined() -> None:
    folded = fold_constants(onnx_models.rate_branch(), {"sr": SR_16K})
    assert [i.name for i in session(folded).get_inputs()] == ["x"]
    assert "If" not in [n for n in _op_types(folded)]
    # With x's shape fixed, inference now sizes y: it follows from x alone.
    sized = onnx_proto.with_input_shapes(onnx_proto.BytesSource(folded), {"x": (4,)})
    assert session(sized).get_outputs()[0].shape == [4]
    x = np.arange(4, dtype=np.float32)
    (y,) = session(folded).run(None, {"x": x})
    (want,) = session(onnx_models.rate_branch()).run(None, {"x": x, "sr": np.array(16000)})
    np.testing.assert_array_equal(y, want)


def test_the_other_value_takes_the_other_branch() -> None:
    folded = fold_constants(onnx_models.rate_branch(), {"sr": Constant("int32", (), (8000,))})
    x = np.arange(6, dtype=np.float32)
    (y,) = session(folded).run(None, {"x": x})
    np.testing.assert_array_equal(y, x)  # the else branch: reshaped and flattened back
    with pytest.raises(Exception, match="Reshape"):
        session(folded).run(None, {"x": np.arange(4, dtype=np.float32)})


def test_a_value_that_decides_nothing_is_an_initializer() -> None:
    folded = fold_constants(onnx_models.affine(), {"k": Constant("int64", (), (41,))})
    out = session(folded).run(None, {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
    assert out[1] == 42
    assert fold_constants(onnx_models.affine(), {}) == onnx_models.affine()


@pytest.mark.parametrize(
    ("constants", "why"),
    [
        ({"nope": SR_16K}, r"the model has no input 'nope' to fix \(its inputs: 'x', 'sr'\)"),
        ({"sr": Constant("float64", (), (16000.0,))}, "input 'sr' is int64; a floating point"),
        ({"sr": Constant("bool", (), (1,))}, "input 'sr' is int64; a boolean value"),
        ({"sr": Constant("int64", (2,), (1, 2))}, r"input 'sr' is int64 \[\]; the value given"),
        ({"x": Constant("int64", (3,), (1, 2, 2**40))}, None),
    ],
    ids=["unknown", "float into int", "bool into int", "rank", "int into float"],
)
def test_values_that_do_not_fit(constants: dict[str, Constant], why: str | None) -> None:
    if why is None:  # integers go into a float input, exactly as given
        folded = fold_constants(onnx_models.rate_branch(), constants)
        assert [i.name for i in session(folded).get_inputs()] == ["sr"]
        return
    with pytest.raises(FoldError, match=why):
        fold_constants(onnx_models.rate_branch(), constants)


def test_an_integer_that_does_not_fit_the_input_type_is_refused() -> None:
    data = onnx_models.identity("int8", (2,))
    with pytest.raises(FoldError, match="does not fit in int8"):
        fold_constants(data, {"x": Constant("int64", (2,), (1, 300))})


def _op_types(data: bytes) -> list[str]:
    import onnx

    return [node.op_type for node in onnx.load_from_string(data).graph.node]
