"""bench/voice_llm.py's table from its phases (issue 28, the benchmark): each row divides
the phases the issue names, round by round."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import voice_llm
from bench.voice_clients import Phase
from bench.voice_llm import LlmRun


def _phase(p99: float, misses: int = 0) -> Phase:
    return Phase(p99 / 2, p99, 1.0, misses, [])


def _runs(tokens_per_s: float, per_token_ms: float, dsp_ms: float, npud_us: int) -> list[LlmRun]:
    batches = [int(dsp_ms * 1000)] * 11  # the prompt's, then 10 decode batches
    return [LlmRun(100, 100 / tokens_per_s, per_token_ms, batches, npud_us, {})]


def _round(scale: float) -> dict[tuple[str, str], dict[str, object]]:
    return {
        ("gated", "quiet"): {"vad": _phase(10.0)},
        ("gated", "voice"): {"vad": _phase(11.0), "rtf": 0.5, "voice_dsp_share": 0.4},
        ("gated", "all"): {"vad": _phase(12.0 * scale, 1), "rtf": 0.55, "llm": _runs(80, 6, 4, 0)},
        ("gated", "llm"): {"llm": _runs(100, 5.0, 4.0, 48_000)},
        ("yield-realtime", "all"): {
            "vad": _phase(15.0, 2),
            "rtf": 0.65,
            "llm": _runs(85, 6, 4, 0),
        },
        ("counted", "quiet"): {"vad": _phase(10.0)},
        ("counted", "all"): {"vad": _phase(20.0, 3), "rtf": 0.6, "llm": _runs(90, 6, 4, 0)},
        ("counted", "llm"): {"llm": _runs(100, 5.0, 4.0, 48_400)},
    }


def test_the_rows_divide_the_phases_the_issue_names() -> None:
    rows = {row.name: row for row in voice_llm._rows([_round(1.0), _round(1.0)], [0.5, 0.5], 6)}
    assert rows["voice_llm.vad_misses"].ratio == 1
    assert rows["voice_llm.vad_p99"].ratio == pytest.approx(1.2)
    assert rows["voice_llm.vad_p99_ungated"].ratio == pytest.approx(2.0)
    assert rows["voice_llm.tts_rtf"].ratio == pytest.approx(1.1)
    assert rows["voice_llm.llm_beside_voice"].ratio == pytest.approx(0.8)
    assert rows["voice_llm.llm_beside_voice_ungated"].ratio == pytest.approx(0.9)
    assert rows["voice_llm.llm_beside_voice_ungated"].goal is None
    assert rows["voice_llm.llm_gate_cost"].ratio == pytest.approx(1.0)
    assert rows["voice_llm.vad_p99_yield_realtime"].ratio == pytest.approx(1.5)
    assert rows["voice_llm.tts_rtf_yield_realtime"].ratio == pytest.approx(1.3)
    assert rows["voice_llm.llm_beside_voice_yield_realtime"].ratio == pytest.approx(0.85)
    assert rows["voice_llm.vad_misses"].figures["misses_yield_realtime"] == 4
    assert rows["voice_llm.dsp_share"].ratio == pytest.approx(48 / 44)  # npud / 11 x 4 ms
    assert rows["voice_llm.dsp_share"].goal_met is True
    assert rows["voice_llm.added_per_batch"].ratio == pytest.approx(2.0)  # (5 - 4) / 0.5
    assert rows["voice_llm.added_per_batch"].goal is None  # bench.batch_rtt has it
    assert rows["voice_llm.llm_beside_voice"].goal_met is True
    assert rows["voice_llm.vad_misses"].goal_met is False


def test_a_missing_peer_build_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPUD_PEER_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="make peer-llama"):
        voice_llm.find_peer()


def test_a_plot_without_matplotlib_is_refused_before_measuring(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from bench import voice_day

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    monkeypatch.setattr(voice_day, "_main_llm", lambda *a, **k: pytest.fail("it measured"))
    with pytest.raises(SystemExit) as caught:
        voice_day.main(["--llm", "--plot", "out.png"])
    assert caught.value.code == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
