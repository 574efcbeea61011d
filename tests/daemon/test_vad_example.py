"""examples/vad_stream.py on the emulator: Silero VAD through npud matches onnxruntime in-process."""

from __future__ import annotations

import importlib.util
import wave
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import trio

from tests.daemon.wire import serve_daemon

EXAMPLE = Path(__file__).parents[2] / "examples" / "vad_stream.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vad_stream", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_vad_example_finds_the_bursts_and_matches_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    async with serve_daemon(tmp_path):
        argv = ["--socket", str(tmp_path / "npud.sock"), "--seconds", "2.5", "--fast"]
        code = await trio.to_thread.run_sync(example.main, argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "vad_stream: silero_vad.onnx on npud (emulator), class realtime" in out
    assert "check: largest difference from onnxruntime in-process" in out
    assert "(ok)" in out
    # The test signal speaks for 0.6 s of every 1.2 s.
    segments = [line.split() for line in out.splitlines() if line.startswith("speech")]
    starts = [float(words[1]) for words in segments]
    assert len(starts) == 3
    assert starts[0] < 0.1
    assert 1.1 < starts[1] < 1.4
    assert 2.3 < starts[2] < 2.5


async def test_the_vad_example_reads_a_wav_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    samples = (example.test_signal(1.0) * 32767).astype("<i2")
    path = tmp_path / "speech.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16_000)
        wav.writeframes(samples.tobytes())
    async with serve_daemon(tmp_path):
        argv = [str(path), "--socket", str(tmp_path / "npud.sock"), "--fast"]
        code = await trio.to_thread.run_sync(example.main, argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "31 chunks of 32 ms" in out
    assert "(ok)" in out


def test_the_vad_example_refuses_other_wav_formats(tmp_path: Path) -> None:
    example = load_example()
    path = tmp_path / "stereo.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(44_100)
        wav.writeframes(np.zeros(200, "<i2").tobytes())
    with pytest.raises(SystemExit, match="44100 Hz, 2 channel"):
        example.read_wav(path)
