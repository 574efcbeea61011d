"""The arithmetic the scheduler's budgets and rhythm rules rest on (npud/runtime)."""

from __future__ import annotations

import math

import pytest

from npud.runtime import rhythm
from npud.runtime.budgets import AdmissionRefusedError, Bucket, Budget, check_admission
from npud.runtime.utilisation import BusySlots

VAD = Budget(period=0.032, budget=0.004)


def test_a_bucket_drains_at_the_budgets_rate() -> None:
    bucket = Bucket(VAD)
    bucket.charge(0.004, now=0.0)
    bucket.drain(now=0.016)  # half a period drains half a budget
    assert bucket.used == pytest.approx(0.002)
    bucket.drain(now=1.0)
    assert bucket.used == 0.0  # never below empty


def test_an_overrun_is_counted_once_until_the_bucket_drains_back() -> None:
    bucket = Bucket(VAD)
    bucket.charge(0.005, now=0.0)
    bucket.charge(0.001, now=0.0)
    assert bucket.overruns == 1
    assert bucket.over
    bucket.drain(now=0.032)  # 6 ms less 4 ms drained: 2 ms, within the budget again
    assert not bucket.over
    bucket.charge(0.003, now=0.032)
    assert bucket.overruns == 2


def test_a_bucket_is_full_counting_what_is_still_on_the_dsp() -> None:
    bucket = Bucket(VAD)
    bucket.charge(0.003, now=0.0)
    assert not bucket.full(in_flight=0.0, now=0.0)
    assert bucket.full(in_flight=0.001, now=0.0)
    assert not bucket.full(in_flight=0.001, now=0.008)  # 1 ms drained meanwhile


def test_admission_refuses_past_either_bound_and_says_which() -> None:
    half = Budget(period=0.01, budget=0.005)
    check_admission(VAD, declared=[], declared_by_owner=[], bound=0.5, bound_per_owner=0.25)
    with pytest.raises(AdmissionRefusedError, match="declared realtime use to 62%"):
        check_admission(VAD, declared=[half], declared_by_owner=None, bound=0.5, bound_per_owner=1)
    with pytest.raises(AdmissionRefusedError, match="this user's declared realtime use to 25%"):
        check_admission(VAD, declared=[], declared_by_owner=[VAD], bound=0.5, bound_per_owner=0.2)
    # No owner to cap: only the bound for everyone counts.
    check_admission(VAD, declared=[VAD], declared_by_owner=None, bound=0.5, bound_per_owner=0.0)


def test_a_client_in_rhythm_is_expected_on_its_grid() -> None:
    vad = rhythm.Rhythm()
    assert vad.expected(0.032) == -math.inf  # no call yet
    vad.arrived(1.0, 0.032)
    assert vad.expected(0.032) == pytest.approx(1.032)
    vad.arrived(1.0325, 0.032)  # half a millisecond late
    vad.arrived(1.072, 0.032)  # the host delayed this one by 8 ms
    # The next is expected on the earliest phase seen (1.0 + 3 periods), not 32 ms
    # after the delayed one (1.104): counted from it, the call would look 8 ms early.
    assert vad.expected(0.032) == pytest.approx(1.096)
    assert rhythm.in_rhythm(vad.last, 0.032, now=1.135)
    assert not rhythm.in_rhythm(vad.last, 0.032, now=1.137)  # two periods without a call


def test_a_client_back_from_quiet_is_expected_on_its_new_grid() -> None:
    vad = rhythm.Rhythm()
    vad.arrived(1.0, 0.032)
    vad.arrived(2.010, 0.032)  # quiet for a second, then a stream at another phase
    assert vad.expected(0.032) == pytest.approx(2.042)


def test_a_loan_ends_within_half_the_slack_of_a_client_in_rhythm() -> None:
    vad = rhythm.Rhythm()
    vad.arrived(1.0, 0.032)
    slack = 0.032 - 0.004
    # In rhythm: a loan ends within half the slack after the expected call...
    assert rhythm.loan_must_end_by(vad, 0.032, 0.004, now=1.01) == pytest.approx(1.032 + slack / 2)
    # ...or after now, if the call is overdue; a quiet client gets its whole slack from now.
    assert rhythm.loan_must_end_by(vad, 0.032, 0.004, now=1.05) == pytest.approx(1.05 + slack / 2)
    assert rhythm.loan_must_end_by(vad, 0.032, 0.004, now=2.0) == pytest.approx(2.0 + slack)


def test_busy_slots_average_over_the_recent_window() -> None:
    busy = BusySlots(now=0.0)
    busy.note(now=1.0, running=0)
    busy.note(now=2.0, running=2)  # two of four slots busy for a second
    assert busy.utilisation(now=2.0, slots=4) == pytest.approx(0.25)
    busy.note(now=30.0, running=0)  # idle long after: the busy second leaves the window
    assert busy.utilisation(now=30.0, slots=4) == pytest.approx(0.0)
