"""Op batches (dspqueue doorbells) in the scheduler, on a fake clock (issue 28, item 3):
a background client's doorbell waits while realtime work runs or is due (and normal
work runs, with ``batch_yield = "normal"``, the default), goes at once
when nothing else needs the DSP, and never waits past its bound; the batch holds its
slot until ``finish`` (its answer), which charges doorbell-to-answer."""

from __future__ import annotations

import pytest

from npud.runtime.scheduler import (
    BACKGROUND,
    NORMAL,
    REALTIME,
    Account,
    Budget,
    Hold,
    Job,
    Outcome,
    Policy,
    Scheduler,
)
from tests.daemon.test_scheduler import Clock

VAD = Budget(0.032, 0.004)


def make(clock: Clock, **policy: object) -> Scheduler:
    return Scheduler(Policy(**policy), clock)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def doorbell(account: Account) -> Job:
    return Job(account, doorbell=True)


def measured_llm(s: Scheduler, clock: Clock, batch: float = 0.007) -> Account:
    """A background client whose batches typically take ``batch``."""
    llm = s.open_account("llm", BACKGROUND)
    first = doorbell(llm)
    assert s.submit(first) is Outcome.RUN
    clock.now += batch
    s.finish(first, batch)
    return llm


def vad_called(s: Scheduler, clock: Clock) -> Account:
    """A realtime VAD (4 ms every 32 ms) that has just made a 4 ms call: in rhythm, its
    next call due 28 ms from now."""
    vad = s.open_account("vad", REALTIME, VAD)
    call = Job(vad)
    assert s.submit(call) is Outcome.RUN
    clock.now += 0.004
    assert s.finish(call, 0.004) == ([], [])
    return vad


def test_a_doorbell_goes_at_once_when_nothing_else_needs_the_dsp(clock: Clock) -> None:
    s = make(clock)
    llm = measured_llm(s, clock)
    s.open_account("vad", REALTIME, VAD)  # admitted, quiet: never called
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.RUN
    assert s.statistics().running == (0, 0, 1)  # the batch holds its slot until finish
    clock.now += 0.007
    s.finish(bell, 0.007)
    assert s.statistics().running == (0, 0, 0)


def test_a_due_realtime_call_is_not_queued_behind_a_background_doorbell(clock: Clock) -> None:
    s = make(clock)
    llm = measured_llm(s, clock)
    vad = s.open_account("vad", REALTIME, VAD)
    call = Job(vad)
    assert s.submit(call) is Outcome.RUN  # the VAD calls in rhythm from now
    clock.now += 0.004
    assert s.finish(call, 0.004) == ([], [])
    # 28 ms after the VAD's call: it is due in 4 ms, and the batch takes 7, so it would
    # run 3 ms into the call (more than the half of its 4 ms budget a batch may).
    clock.now += 0.024
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    clock.now += 0.004
    due = Job(vad)
    assert s.submit(due) is Outcome.RUN  # the due call finds the DSP free of the batch
    clock.now += 0.004
    started, late = s.finish(due, 0.004)
    assert (started, late) == ([bell], [])  # and the batch goes right after it
    assert bell.dispatched == clock.now


def test_an_overdue_realtime_call_holds_a_doorbell_as_a_due_one_does(clock: Clock) -> None:
    """The host delays a VAD call past its period and its budget (its previous answer
    came late, the client's thread woke late): it is due now, not skipped. A doorbell
    let go then was on the DSP when the call came (the gate took the call for the next
    period's once it was more than a budget late)."""
    s = make(clock)
    llm = measured_llm(s, clock)
    vad = vad_called(s, clock)
    clock.now += 0.034  # 38 ms after its last call: the next, due at 32, is 6 ms late
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    clock.now += 0.003
    late = Job(vad)
    assert s.submit(late) is Outcome.RUN  # the late call finds the DSP free of the batch
    clock.now += 0.004
    assert s.finish(late, 0.004) == ([bell], [])  # and the batch goes right after it


def test_a_doorbell_goes_at_once_once_the_realtime_client_stopped_calling(clock: Clock) -> None:
    """Two periods without a call: the client is quiet, and a batch goes at once."""
    s = make(clock)
    llm = measured_llm(s, clock)
    vad_called(s, clock)
    clock.now += 2 * VAD.period
    assert s.submit(doorbell(llm)) is Outcome.RUN


def test_a_doorbell_waits_while_a_realtime_call_runs(clock: Clock) -> None:
    s = make(clock)
    llm = measured_llm(s, clock)
    vad = s.open_account("vad", REALTIME, VAD)
    call = Job(vad)
    assert s.submit(call) is Outcome.RUN
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    clock.now += 0.004
    assert s.finish(call, 0.004)[0] == [bell]


def test_a_held_doorbell_goes_at_its_bound_whatever_runs(clock: Clock) -> None:
    s = make(clock, batch_hold_max=0.05, dsp_slots=1, realtime_reserve=0)
    llm = measured_llm(s, clock)
    vad = s.open_account("vad", REALTIME, VAD)
    hog = Job(vad)
    assert s.submit(hog) is Outcome.RUN  # a long realtime call holds the only slot
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    assert bell.bound == pytest.approx(clock.now + 0.05)
    assert s.next_bound() == bell.bound
    clock.now += 0.049
    assert s.tick() == ([], [])
    clock.now += 0.001
    assert s.tick() == ([bell], [])  # at its bound, though the DSP's slot is taken
    assert s.next_bound() is None
    assert s.statistics().running == (1, 0, 1)


def test_doorbells_of_normal_and_realtime_clients_are_not_held_for_realtime(clock: Clock) -> None:
    s = make(clock)
    vad = s.open_account("vad", REALTIME, VAD)
    assert s.submit(Job(vad)) is Outcome.RUN
    tool = s.open_account("tool", NORMAL)
    assert s.submit(doorbell(tool)) is Outcome.RUN
    other = s.open_account("other-voice", REALTIME, VAD)
    assert s.submit(doorbell(other)) is Outcome.RUN


def test_a_batch_is_charged_its_doorbell_to_answer_time(clock: Clock) -> None:
    s = make(clock)
    llm = s.open_account("llm", BACKGROUND)
    tool = s.open_account("tool", NORMAL)
    bell = doorbell(llm)
    s.submit(bell)
    s.finish(bell, 0.25)
    s.charge(tool, 0.1)  # a batch counted without a slot ([scheduler] batches = counted)
    assert (llm.dsp_seconds, llm.vtime, llm.typical_call) == (0.25, 0.25, 0.25)
    assert (tool.dsp_seconds, tool.vtime) == (0.1, 0.1)


def test_counted_batches_count_against_a_budget(clock: Clock) -> None:
    s = make(clock)
    vad = s.open_account("vad", REALTIME, VAD)
    assert s.submit(Job(vad)) is Outcome.RUN  # starts its period
    s.charge(vad, 0.005)
    assert vad.overruns == 1
    with pytest.raises(ValueError, match="batch_hold_max"):
        Policy(batch_hold_max=0)


def test_a_held_doorbell_goes_when_the_realtime_client_it_waits_for_turns_quiet(
    clock: Clock,
) -> None:
    """The VAD stops calling (its stream ended) while a doorbell waits for its overdue
    call: the reason to hold the batch lapses when the VAD turns quiet, two periods after
    its last call, and ``next_recheck`` says so before the batch's bound (issue 28)."""
    s = make(clock, batch_hold_max=0.05)
    llm = measured_llm(s, clock)
    vad = s.open_account("vad", REALTIME, VAD)
    call = Job(vad)
    last = clock.now
    assert s.submit(call) is Outcome.RUN
    clock.now += 0.004
    s.finish(call, 0.004)
    clock.now = last + 0.030  # due in 2 ms, the batch takes 7: held
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    quiet = last + 2 * VAD.period
    assert bell.bound is not None
    assert quiet < bell.bound
    assert s.next_recheck() == quiet  # not the bound: nothing else would look sooner
    clock.now = quiet - 0.001  # the call is overdue: still held
    assert s.tick() == ([], [])
    clock.now = quiet
    assert s.tick() == ([bell], [])
    assert bell.dispatched == quiet
    assert s.next_recheck() is None


def test_the_recheck_is_the_bound_while_realtime_work_runs(clock: Clock) -> None:
    """A running realtime call holds the doorbell until its ``finish`` (which starts the
    batch); the timer is there for the bound only."""
    s = make(clock, batch_hold_max=0.05)
    llm = measured_llm(s, clock)
    vad = s.open_account("vad", REALTIME, VAD)
    call = Job(vad)
    assert s.submit(call) is Outcome.RUN
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    assert bell.bound is not None
    # The VAD turns quiet (64 ms) after the bound (50 ms): the bound comes first.
    assert s.next_recheck() == bell.bound
    clock.now += 0.004
    assert s.finish(call, 0.004) == ([bell], [])
    assert s.next_recheck() is None


def test_the_time_a_doorbell_was_held_is_kept_by_its_first_reason(clock: Clock) -> None:
    """What the gate cost a background client, by reason (the status row's ``held``):
    counted when the batch goes, from its doorbell's arrival."""
    s = make(clock)
    llm = measured_llm(s, clock)
    vad = s.open_account("vad", REALTIME, VAD)
    call = Job(vad)
    assert s.submit(call) is Outcome.RUN
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED  # held while the VAD's call runs
    assert llm.batch_holds == {}  # counted when it goes
    clock.now += 0.004
    assert s.finish(call, 0.004)[0] == [bell]
    clock.now += 0.007
    s.finish(bell, 0.007)
    clock.now += 0.024  # 35 ms after the VAD's call: the next, due at 32, is overdue
    late = doorbell(llm)
    assert s.submit(late) is Outcome.QUEUED
    clock.now += 0.002
    arrived = Job(vad)
    assert s.submit(arrived) is Outcome.RUN
    clock.now += 0.003
    assert s.finish(arrived, 0.003)[0] == [late]
    on_dsp, overdue = llm.batch_holds[Hold.REALTIME_ON_DSP], llm.batch_holds[Hold.REALTIME_OVERDUE]
    assert on_dsp[0] == 1
    assert on_dsp[1] == pytest.approx(0.004)
    assert overdue[0] == 1
    assert overdue[1] == pytest.approx(0.005)  # its first reason, not the call's
    assert len(llm.batch_holds) == 2


def test_a_doorbell_waiting_only_for_a_slot_is_not_counted_as_held(clock: Clock) -> None:
    s = make(clock, dsp_slots=1, realtime_reserve=0)
    llm = measured_llm(s, clock)
    other = s.open_account("other", BACKGROUND)
    busy = Job(other)
    assert s.submit(busy) is Outcome.RUN  # the one slot not kept for realtime
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    clock.now += 0.01
    assert s.finish(busy, 0.01)[0] == [bell]
    assert llm.batch_holds == {}


@pytest.mark.parametrize(("overlap", "outcome"), [(0.25, Outcome.RUN), (0.0, Outcome.QUEUED)])
def test_a_batch_may_run_into_a_due_call_by_its_share_of_the_calls_budget(
    clock: Clock, overlap: float, outcome: Outcome
) -> None:
    """Due in 6.5 ms, a 7 ms batch would run 0.5 ms into the VAD's call: within a
    quarter of its 4 ms budget it goes (the call is slowed by that half millisecond at
    most); with no overlap allowed it waits for the call."""
    s = make(clock, batch_overlap=overlap)
    llm = measured_llm(s, clock)
    vad_called(s, clock)
    clock.now += 0.0215  # 25.5 ms after the call: the next is due in 6.5 ms
    assert s.submit(doorbell(llm)) is outcome


def test_a_call_after_a_delayed_one_is_expected_on_the_grid_not_a_period_after_it(
    clock: Clock,
) -> None:
    """The VAD calls on its audio's clock. The host delayed one call by 8 ms; the next
    comes on time, 24 ms after it. A 4 ms batch at 61 ms would run into it (at 64 ms): it
    waits, where counting a period from the delayed call (72 ms) let it go."""
    s = make(clock, batch_overlap=0.0)
    llm = measured_llm(s, clock, batch=0.004)
    vad = s.open_account("vad", REALTIME, VAD)
    start = clock.now
    for late in (0.0, 0.040):  # on time, then 8 ms late (the second period's call)
        clock.now = start + late
        call = Job(vad)
        assert s.submit(call) is Outcome.RUN
        clock.now += 0.003
        s.finish(call, 0.003)
    clock.now = start + 0.061
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    assert bell.held is Hold.REALTIME_DUE


def test_the_overlap_is_a_share_of_a_budget() -> None:
    with pytest.raises(ValueError, match="batch_overlap"):
        Policy(batch_overlap=1.5)


def test_batches_yield_to_normal_or_realtime_work_only() -> None:
    with pytest.raises(ValueError, match="batch_yield must be 'normal' or 'realtime'"):
        Policy(batch_yield="background")  # type: ignore[arg-type]


def test_a_doorbell_waits_while_a_normal_call_runs_and_goes_at_its_end(clock: Clock) -> None:
    """A TTS's graph (a normal client) on the DSP: a background batch beside it would
    share the HMX with it and slow it down, so the doorbell waits for its end."""
    s = make(clock)
    llm = measured_llm(s, clock)
    tts = s.open_account("tts", NORMAL)
    graph = Job(tts)
    assert s.submit(graph) is Outcome.RUN
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    assert bell.held is Hold.NORMAL_ON_DSP
    clock.now += 0.02
    assert s.finish(graph, 0.02) == ([bell], [])
    batches, held = llm.batch_holds[Hold.NORMAL_ON_DSP]
    assert batches == 1
    assert held == pytest.approx(0.02)


def test_a_doorbell_waits_for_a_long_normal_call_half_its_bound(clock: Clock) -> None:
    """A normal call longer than the bound (a 1 s graph): the LLM still runs a batch
    every half bound, and a timer looks at the doorbell then."""
    s = make(clock, batch_hold_max=0.05)
    llm = measured_llm(s, clock)
    tts = s.open_account("tts", NORMAL)
    assert s.submit(Job(tts)) is Outcome.RUN
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    assert s.next_recheck() == pytest.approx(clock.now + 0.025)
    clock.now += 0.024
    assert s.tick() == ([], [])
    clock.now += 0.001
    assert s.tick() == ([bell], [])


def test_a_doorbell_past_its_wait_for_normal_work_still_waits_for_a_due_realtime_call(
    clock: Clock,
) -> None:
    """Let go for the TTS's long graph, the batch would still run into the VAD's call due
    in 2 ms: it waits for that call, within its bound."""
    s = make(clock, batch_hold_max=0.05)
    llm = measured_llm(s, clock)
    tts = s.open_account("tts", NORMAL)
    assert s.submit(Job(tts)) is Outcome.RUN
    vad = s.open_account("vad", REALTIME, VAD)
    call = Job(vad)
    assert s.submit(call) is Outcome.RUN
    start = clock.now
    clock.now += 0.004
    s.finish(call, 0.004)
    clock.now += 0.001
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED  # for the TTS: the VAD is due in 27 ms
    assert bell.held is Hold.NORMAL_ON_DSP
    clock.now = bell.arrival + 0.025  # its wait for normal work is over
    assert s.tick() == ([], [])  # but the VAD is due in 2 ms: the 7 ms batch waits
    clock.now = start + 0.032
    due = Job(vad)
    assert s.submit(due) is Outcome.RUN
    clock.now += 0.004
    assert s.finish(due, 0.004) == ([bell], [])


def test_with_batches_yielding_to_realtime_only_a_doorbell_goes_beside_a_normal_call(
    clock: Clock,
) -> None:
    s = make(clock, batch_yield="realtime")
    llm = measured_llm(s, clock)
    tts = s.open_account("tts", NORMAL)
    assert s.submit(Job(tts)) is Outcome.RUN
    assert s.submit(doorbell(llm)) is Outcome.RUN


def test_a_doorbell_held_for_a_normal_call_and_a_due_realtime_one_counts_the_realtime(
    clock: Clock,
) -> None:
    s = make(clock)
    llm = measured_llm(s, clock)
    vad_called(s, clock)
    tts = s.open_account("tts", NORMAL)
    assert s.submit(Job(tts)) is Outcome.RUN
    clock.now += 0.024  # the VAD is due in 4 ms, and the TTS's graph runs
    bell = doorbell(llm)
    assert s.submit(bell) is Outcome.QUEUED
    assert bell.held is Hold.REALTIME_DUE


def test_normal_and_realtime_doorbells_are_not_held_for_normal_calls(clock: Clock) -> None:
    s = make(clock)
    tts = s.open_account("tts", NORMAL)
    assert s.submit(Job(tts)) is Outcome.RUN
    tool = s.open_account("tool", NORMAL)
    assert s.submit(doorbell(tool)) is Outcome.RUN


@pytest.mark.parametrize(("running", "outcome"), [(0, Outcome.RUN), (1, Outcome.QUEUED)])
def test_a_batch_beside_other_work_is_predicted_to_take_longer(
    clock: Clock, running: int, outcome: Outcome
) -> None:
    """A 4 ms batch with the VAD due in 6 ms goes when the DSP is free; beside a running
    call (batches yield to realtime work only here) it would take about twice as long,
    run into the VAD's call, and waits for it."""
    s = make(clock, batch_yield="realtime", batch_overlap=0.0)
    llm = measured_llm(s, clock, batch=0.004)
    vad_called(s, clock)
    tool = s.open_account("tool", NORMAL)
    for _ in range(running):
        assert s.submit(Job(tool)) is Outcome.RUN
    clock.now += 0.022  # the VAD is due in 6 ms
    bell = doorbell(llm)
    assert s.submit(bell) is outcome
    if outcome is Outcome.QUEUED:
        assert bell.held is Hold.REALTIME_DUE
