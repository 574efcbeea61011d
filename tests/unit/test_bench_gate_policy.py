"""bench.gate_policy's model drives npud's real scheduler; these check the model itself."""

from __future__ import annotations

import pytest

from bench.gate_policy import (
    TTS_RTF,
    TTS_WORK,
    VAD_WORK,
    BatchYield,
    Outcomes,
    Simulation,
    main,
    p99,
)
from npud.runtime.scheduler import NORMAL, Hold, Job, Outcome


def test_a_vad_alone_is_answered_in_its_own_work() -> None:
    out = Simulation(1, 5.0, vad=True, llm=False, gated=True, overlap=0.0).run()
    assert len(out.vad_latencies) == pytest.approx(5.0 / 0.032, abs=2)
    assert VAD_WORK[0] <= min(out.vad_latencies) <= max(out.vad_latencies) <= VAD_WORK[1]
    assert out.vad_over_budget == 0  # 3 ms of its 4 ms budget a period


def test_a_vad_sharing_the_dsp_is_charged_the_time_shared_and_counted_over_budget() -> None:
    out = Simulation(1, 5.0, vad=True, llm=True, gated=False, overlap=0.0).run()
    assert len(out.vad_latencies) / 2 < out.vad_over_budget <= len(out.vad_latencies)


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


def test_a_tts_alone_synthesises_at_its_real_time_factor() -> None:
    out = Simulation(1, 12.0, vad=False, llm=False, tts=True, gated=True, overlap=0.25).run()
    assert len(out.utterances) >= 2
    for synthesis, audio in out.utterances:
        assert TTS_WORK[0] <= synthesis <= TTS_WORK[1]
        assert audio == pytest.approx(synthesis / TTS_RTF)
    assert out.tts_rtf == pytest.approx(TTS_RTF)


def test_a_real_time_factor_of_no_utterance_is_refused() -> None:
    with pytest.raises(ValueError, match="no utterance"):
        _ = Outcomes().tts_rtf


def test_the_tts_calls_are_normal_calls_through_the_scheduler() -> None:
    submitted: list[Job] = []

    def simulate(batch_yield: BatchYield) -> Simulation:
        sim = Simulation(
            3, 8.0, vad=False, llm=True, tts=True, gated=True, overlap=0.25, batch_yield=batch_yield
        )
        submit = sim.scheduler.submit

        def spy(job: Job) -> Outcome:
            outcome = submit(job)
            if job.account is sim.tts:
                submitted.append(job)
            return outcome

        sim.scheduler.submit = spy  # type: ignore[method-assign]
        out = sim.run()
        assert len(out.utterances) <= len(submitted) <= len(out.utterances) + 1
        assert all(job.klass == NORMAL and not job.doorbell for job in submitted)
        submitted.clear()
        return sim

    # The scheduler saw them as normal work: batches waited for them where they yield
    # to normal calls, and for nothing where they yield to realtime calls only.
    assert Hold.NORMAL_ON_DSP in simulate("normal").llm.batch_holds
    assert simulate("realtime").llm.batch_holds == {}


def test_batches_that_yield_to_normal_calls_give_the_tts_more_and_the_llm_less() -> None:
    def simulate(batch_yield: BatchYield, *, llm: bool) -> Outcomes:
        return Simulation(
            2, 15.0, vad=True, llm=llm, tts=True, gated=True, overlap=0.25, batch_yield=batch_yield
        ).run()

    without_llm = simulate("normal", llm=False).tts_rtf
    normal, realtime = simulate("normal", llm=True), simulate("realtime", llm=True)
    assert normal.tts_rtf / without_llm < realtime.tts_rtf / without_llm
    assert normal.batches < realtime.batches


def test_too_short_a_run_with_the_tts_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--voice-seconds", "5"])
    assert exited.value.code == 2
    assert "--voice-seconds must be at least" in capsys.readouterr().err
