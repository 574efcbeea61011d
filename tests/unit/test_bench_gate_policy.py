"""bench.gate_policy's model drives npud's real scheduler; these check the model itself."""

from __future__ import annotations

import pytest

from bench.gate_policy import VAD_WORK, Simulation, p99


def test_a_vad_alone_is_answered_in_its_own_work() -> None:
    out = Simulation(1, 5.0, vad=True, llm=False, gated=True, overlap=0.0).run()
    assert len(out.vad_latencies) == pytest.approx(5.0 / 0.032, abs=2)
    assert VAD_WORK[0] <= min(out.vad_latencies) <= max(out.vad_latencies) <= VAD_WORK[1]


def test_an_llm_alone_is_never_held() -> None:
    gated = Simulation(1, 5.0, vad=False, llm=True, gated=True, overlap=0.0).run()
    ungated = Simulation(1, 5.0, vad=False, llm=True, gated=False, overlap=0.0).run()
    assert gated.batches == ungated.batches > 0


def test_the_gate_keeps_batches_off_the_vads_calls_and_costs_the_llm_some() -> None:
    alone = p99(
        Simulation(2, 10.0, vad=True, llm=False, gated=True, overlap=0.0).run().vad_latencies
    )
    gated = Simulation(2, 10.0, vad=True, llm=True, gated=True, overlap=0.0).run()
    ungated = Simulation(2, 10.0, vad=True, llm=True, gated=False, overlap=0.0).run()
    assert p99(gated.vad_latencies) < 1.25 * alone  # a batch longer than predicted, at most
    assert p99(ungated.vad_latencies) > 1.5 * alone  # slowed by the batches
    assert gated.batches < ungated.batches
