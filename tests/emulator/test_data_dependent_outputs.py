"""An output whose length the data decides (a TTS's audio): given its longest shape, a run
that makes less fills the start of its place and zeros the rest; a run that makes more
fails, and says so. examples/voice_day.py relies on the first for Kokoro's audio."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from npud.fastrpc.kernel.invoke_args import Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.portal_qnn import ModelError, ModelFailure, PortalQnn
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver
from tests.emulator import onnx_models

ROOM = 8  # the output's given length


def counting() -> bytes:
    """y = [0, 1, ..., n - 1] as float32: as long as the input n says."""
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    return onnx_models.model(
        [
            helper.make_node("Range", ["zero", "n", "one"], ["steps"]),
            helper.make_node("Cast", ["steps"], ["y"], to=TensorProto.FLOAT),
        ],
        [onnx_models.tensor("n", "int64", [])],
        [onnx_models.tensor("y", "float32", ["length"])],
        [zero, one],
    )


@pytest.fixture
def portal(tmp_path: Path) -> Iterator[tuple[PortalQnn, FastRpcSession]]:
    session = FastRpcSession.open(EmulatedDriver(), library_path=[DSP_LIBRARY_DIR])
    try:
        session.load_shell(DEV_SHELL.read_bytes())
        with PortalQnn.open(session, backend="emulator") as portal:
            yield portal, session
    finally:
        session.close()


def test_a_shorter_output_fills_the_start_and_zeros_the_rest_a_longer_one_fails(
    portal: tuple[PortalQnn, FastRpcSession], tmp_path: Path
) -> None:
    api, session = portal
    path = tmp_path / "counting.onnx"
    path.write_bytes(counting())
    fd = os.open(path, os.O_RDONLY)
    try:
        model = api.load(fd, shapes={"y": (ROOM,)})
    finally:
        os.close(fd)
    (graph,) = model.graphs
    assert graph.output("y").shape == (ROOM,)
    buffer = session.alloc(4096)
    try:
        inputs, outputs = Slice(buffer, 0, graph.input_arena), Slice(buffer, 1024, 64)

        def run(n: int) -> list[float]:
            with buffer.view() as view:
                view[0:8] = np.array(n, np.int64).tobytes()
                view[1024:1088] = b"\xee" * 64
            api.run_arena(model.slot, inputs, outputs)
            with buffer.view() as view:
                values = np.frombuffer(bytes(view[1024 : 1024 + 4 * ROOM]), np.float32)
            return [float(v) for v in values]

        assert run(3) == [0, 1, 2, 0, 0, 0, 0, 0]
        assert run(ROOM) == list(range(ROOM))
        with pytest.raises(ModelError, match=r"output 'y' needs float32 \[9\]") as longer:
            run(ROOM + 1)
        assert longer.value.failure is ModelFailure.OUTPUT_TOO_LARGE
        assert run(0) == [0] * ROOM  # the model runs on afterwards
    finally:
        session.free(buffer)
