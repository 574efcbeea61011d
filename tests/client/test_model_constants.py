"""``constants=`` as the clients send it, and what they do when npud ignored it."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pytest

from npu_client import Unsupported
from npu_client._models import ModelState, check_constants, ignored_constants
from npu_client._requests import ignored_constants_error
from npu_client.transport import OwnedFd
from npu_protocol import ModelConstant, ModelInfo, TensorInfo


def test_values_travel_with_their_type_and_shape() -> None:
    assert check_constants({"sr": 16000, "gain": 0.5, "on": True}) == {
        "sr": ModelConstant(dtype="int64", shape=(), values=(16000,)),
        "gain": ModelConstant(dtype="float64", shape=(), values=(0.5,)),
        "on": ModelConstant(dtype="bool", shape=(), values=(1,)),
    }
    scales = np.array([0.667, 1.0, 0.8], np.float32)
    assert check_constants({"scales": scales})["scales"] == ModelConstant(
        dtype="float32", shape=(3,), values=tuple(float(v) for v in scales)
    )
    assert check_constants({"m": [[1, 2], [3, 4]]})["m"].shape == (2, 2)
    assert check_constants({"h": np.float16(1.5)})["h"].dtype == "float32"
    assert check_constants(None) == {}


@pytest.mark.parametrize(
    ("constants", "error", "why"),
    [
        ([1], TypeError, "constants must map input names to values"),
        ({1: 1}, TypeError, "input names are non-empty str"),
        ({"s": "16000"}, TypeError, "'s' must be a bool, int, float"),
        ({"s": np.zeros(0)}, ValueError, "'s' has 0 values"),
        ({"s": np.zeros(257)}, ValueError, "'s' has 257 values"),
        ({"s": 1 + 2j}, TypeError, "'s' is complex128"),
    ],
)
def test_values_that_are_no_constant(constants: object, error: type[Exception], why: str) -> None:
    with pytest.raises(error, match=why):
        check_constants(constants)


def test_a_model_that_kept_a_fixed_input_is_an_older_npuds() -> None:
    sr = TensorInfo(name="sr", dtype="int64", shape=(), nbytes=8, offset=0)
    x = TensorInfo(name="x", dtype="float32", shape=(4,), nbytes=16, offset=64)
    info = ModelInfo(arena_bytes=4096, inputs=(x, sr))
    fd = os.memfd_create("arena", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)  # as a DMA-BUF: it cannot shrink
    state = ModelState(1, info, OwnedFd(fd), 0)
    try:
        assert ignored_constants(state, {"sr": 16000}) == ["sr"]
        assert ignored_constants(state, {"gain": 1}) == []
    finally:
        state.release_local("test over")
    error = ignored_constants_error(["sr"])
    assert isinstance(error, Unsupported)
    assert "npud loaded the model with 'sr' still an input" in str(error)


def test_several_sizes_of_a_dimension_are_shapes_of_their_own() -> None:
    from npu_client._models import check_shapes, split_shapes

    assert split_shapes({"x": (2, 4), "preds": (1, [1, 2, 4])}) == (
        {"x": (2, 4)},
        {"preds": ((1, 1), (1, 2), (1, 4))},
    )
    assert split_shapes({"preds": (1, range(1, 4)), "mask": ((1, 2, 3), 1)})[1] == {
        "preds": ((1, 1), (1, 2), (1, 3)),
        "mask": ((1, 1), (2, 1), (3, 1)),
    }
    assert split_shapes({"one": (1, [5])})[1] == {"one": ((1, 5),)}
    for bad, why in (
        ({"p": (1, range(1, 10))}, "at most 8"),
        ({"p": (1, [1, 2]), "q": (1, [1, 2, 3])}, "as many for every tensor"),
        ({"p": ([1, 2], [1, 2])}, "more than one dimension"),
        ({"p": (1, [])}, "positive integer dimensions"),
        ({"p": (1, [0, 1])}, "positive integer dimensions"),
    ):
        with pytest.raises(ValueError, match=why):
            split_shapes(bad)
    with pytest.raises(ValueError, match="need a load"):
        check_shapes({"p": (1, [1, 2])})
