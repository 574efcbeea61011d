"""The model walks in a child process (npud.requests.model_check): the same answers and refusals
as in npud's process, within the budget."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto, helper

from npud.fastrpc.stubs.model_format import ModelFileError, ModelFormat
from npud.fastrpc.stubs.model_shapes import ShapeError
from npud.fastrpc.stubs.model_walks import walk_model_file
from npud.formats import onnx_proto
from npud.requests.model_check import walk_in_child
from tests.emulator import onnx_models


@pytest.fixture
def open_file(tmp_path: Path) -> Iterator[list[int]]:
    fds: list[int] = []
    yield fds
    for fd in fds:
        os.close(fd)


def _fd(tmp_path: Path, fds: list[int], data: bytes) -> int:
    path = tmp_path / f"m{len(fds)}.onnx"
    path.write_bytes(data)
    fds.append(os.open(path, os.O_RDONLY))
    return fds[-1]


def _weighty(nodes: list[object] | None = None) -> bytes:
    """A model of 1 MiB of weights (walked in a child by npud), free input dimension."""
    weights = helper.make_tensor("w", TensorProto.UINT8, [1 << 20], b"\x01" * (1 << 20), raw=True)
    return onnx_models.model(
        nodes or [helper.make_node("Identity", ["x"], ["y"])],  # type: ignore[arg-type]
        [onnx_models.tensor("x", "float32", ["n"])],
        [onnx_models.tensor("y", "float32", ["n"])],
        [weights],
    )


def test_the_child_answers_as_npud_would(tmp_path: Path, open_file: list[int]) -> None:
    fd = _fd(tmp_path, open_file, _weighty())
    shapes = {"x": (4,)}
    assert walk_in_child(fd, "emulator", shapes, onnx_proto.Budget(60)) == walk_model_file(
        fd, "emulator", shapes, onnx_proto.Budget(60)
    )
    checked = walk_in_child(fd, "emulator", shapes, None)
    assert checked.file.format is ModelFormat.ONNX
    assert checked.unsized == ()
    assert checked.rooms == (frozenset(),)


def test_the_childs_refusals_are_npuds(tmp_path: Path, open_file: list[int]) -> None:
    fd = _fd(tmp_path, open_file, _weighty())
    with pytest.raises(ShapeError, match=r"give its shape|free"):
        walk_in_child(fd, "emulator", {}, None)
    with pytest.raises(ModelFileError, match="backend takes") as caught:
        walk_in_child(fd, "kernel", {}, None)
    assert caught.value.kind == "wrong-format"
    loop = _fd(tmp_path, open_file, onnx_models.endless_loop() + b"\x32\x00" * (200 << 10))
    with pytest.raises(ModelFileError, match="Loop") as caught:
        walk_in_child(loop, "emulator", {}, None)
    assert caught.value.kind == "refused"
    damaged = _fd(tmp_path, open_file, _weighty()[:-3])
    with pytest.raises(ModelFileError, match="damaged"):
        walk_in_child(damaged, "emulator", {}, None)


def test_the_child_stops_at_its_budget(tmp_path: Path, open_file: list[int]) -> None:
    head = b"\x08\x08" + onnx_proto.length_field(8, b"\x10\x11")
    crafted = head + onnx_proto.length_field(7, b"\x0a\x00" * (512 << 10))
    fd = _fd(tmp_path, open_file, crafted)
    with pytest.raises(ModelFileError, match="not checked in time") as caught:
        walk_in_child(fd, "emulator", {}, onnx_proto.Budget(1e-9))
    assert caught.value.kind == "refused"


def test_the_childs_answer_has_rooms_sizes_and_values(tmp_path: Path, open_file: list[int]) -> None:
    """What a load of a room, of several sizes or with input values needs from the
    walks (the rooms of each graph, the outputs left to the DSP) comes back from the
    child as from the walk in npud."""
    cases: list[tuple[bytes, dict[str, Any]]] = [
        (onnx_models.duration_tts(), {"shapes": {"input": (1, 3), "output": (1, 1, 64)}}),
        (onnx_models.growing_decoder(), {"shapes": {}, "sizes": {"preds": [(1, 1), (1, 4)]}}),
        (onnx_models.rate_branch(), {"shapes": {"x": (4,)}, "constants": {"sr": ()}}),
    ]
    answers = []
    for data, load in cases:
        fd = _fd(tmp_path, open_file, data)
        args = (load["shapes"], None, load.get("constants", {}), load.get("sizes", {}))
        answers.append(walk_in_child(fd, "emulator", *args))
        assert answers[-1] == walk_model_file(fd, "emulator", *args)
    room, sizes, values = answers
    assert room.rooms == (frozenset({"output"}),)
    assert sizes.rooms == (frozenset(), frozenset())
    assert [t.name for t in values.unsized] == ["y"]  # the DSP folds the If: not here


def test_the_child_refuses_values_as_npud_does(tmp_path: Path, open_file: list[int]) -> None:
    fd = _fd(tmp_path, open_file, onnx_models.rate_branch())
    with pytest.raises(ShapeError, match="the model has no input 'nope' to fix"):
        walk_in_child(fd, "emulator", {"x": (4,)}, None, {"nope": ()})
    with pytest.raises(ShapeError, match=r"given the shape \[1\] and a value of shape \[\]"):
        walk_in_child(fd, "emulator", {"x": (4,), "sr": (1,)}, None, {"sr": ()})
