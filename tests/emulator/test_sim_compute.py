"""The DSP's shared compute: processor sharing. The accounting is checked with a fake
clock; threads check only what finishes first (no timing is asserted)."""

from __future__ import annotations

import threading

import pytest

from npud.sim.compute import BACKDATE_MAX, SharedCompute, _Work
from npud.sim.errors import SubsystemDownError


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_work_is_shared_out_between_the_calls_at_min_one_or_units_over_n() -> None:
    clock = Clock()
    compute = SharedCompute(1, threading.Event(), clock)
    a, b = _Work(0.2), _Work(0.1)
    compute._active += [a, b]
    clock.now = 0.1  # two calls on one unit: each did 0.05
    compute._advance()
    assert (a.remaining, b.remaining) == pytest.approx((0.15, 0.05))
    compute._active.remove(b)
    clock.now = 0.2  # alone now: full speed
    compute._advance()
    assert a.remaining == pytest.approx(0.05)


def test_more_units_than_calls_is_full_speed_for_each() -> None:
    clock = Clock()
    compute = SharedCompute(4, threading.Event(), clock)
    jobs = [_Work(1.0) for _ in range(3)]
    compute._active += jobs
    clock.now = 0.5
    compute._advance()
    assert [job.remaining for job in jobs] == pytest.approx([0.5] * 3)


def test_the_shorter_of_two_calls_started_together_finishes_first() -> None:
    compute = SharedCompute(1, threading.Event())
    finished: list[str] = []
    start = threading.Barrier(2)

    def job(name: str, seconds: float) -> None:
        start.wait()
        compute.work(seconds)
        finished.append(name)

    threads = [
        threading.Thread(target=job, args=("long", 0.12)),
        threading.Thread(target=job, args=("short", 0.03)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert finished == ["short", "long"]
    assert compute.active == 0


def test_a_restart_interrupts_the_work() -> None:
    down = threading.Event()
    compute = SharedCompute(1, down)
    threading.Timer(0.05, down.set).start()
    with pytest.raises(SubsystemDownError):
        compute.work(60.0)
    assert compute.active == 0
    with pytest.raises(SubsystemDownError):
        SharedCompute(0, down).work(60.0)


def test_no_work_returns_at_once_and_negative_units_are_refused() -> None:
    SharedCompute(1, threading.Event()).work(0)
    with pytest.raises(ValueError, match="units"):
        SharedCompute(-1, threading.Event())


def test_matrix_work_shares_the_hmx_unit_and_vector_work_only_the_hvx_contexts() -> None:
    clock = Clock()
    compute = SharedCompute(4, threading.Event(), clock, hmx_units=1)
    vector, first, second = _Work(1.0), _Work(1.0, matrix=True), _Work(1.0, matrix=True)
    with compute._cond:
        for job in (vector, first, second):
            compute._join_locked(job)
    clock.now = 0.2  # 3 pieces on 4 contexts; the two matrix ones take turns on the HMX
    compute._advance()
    assert (vector.remaining, first.remaining, second.remaining) == pytest.approx((0.8, 0.9, 0.9))


def test_hvx_contexts_bound_matrix_work_too() -> None:
    clock = Clock()
    compute = SharedCompute(1, threading.Event(), clock, hmx_units=1)
    vector, matrix = _Work(1.0), _Work(1.0, matrix=True)
    with compute._cond:
        compute._join_locked(vector)
        compute._join_locked(matrix)
    clock.now = 0.4  # one context for both: half each
    compute._advance()
    assert (vector.remaining, matrix.remaining) == pytest.approx((0.8, 0.8))


def test_a_begun_piece_is_credited_while_it_runs_and_ends_at_once_when_it_was_alone() -> None:
    clock = Clock()
    compute = SharedCompute(1, threading.Event(), clock, hmx_units=1)
    job = compute.begin(matrix=True)
    assert compute.active == 1
    clock.now = 0.3
    compute.end(job, 0.3)  # it had the DSP alone: nothing left to wait for
    assert job.done_credit == pytest.approx(0.3)
    assert compute.active == 0
    assert compute.busy_seconds == pytest.approx(0.3)


def test_a_begun_piece_that_shared_the_dsp_owes_the_rest() -> None:
    clock = Clock()
    compute = SharedCompute(1, threading.Event(), clock)
    other = _Work(10.0)
    with compute._cond:
        compute._join_locked(other)
    job = compute.begin()
    clock.now = 0.2  # two on one context: the piece got half of its 0.2 s
    compute._advance()
    assert other.remaining == pytest.approx(9.9)
    assert job._work.done == pytest.approx(0.1)
    compute.drop(job)
    assert compute.active == 1
    compute.drop(job)  # idempotent


def test_a_piece_told_late_is_credited_from_its_start_at_its_rate() -> None:
    """Issue 28, item 5: a DSP process's piece reaches the model through a call's thread;
    the time that took is credited at once (the piece ran meanwhile), not owed again
    at its end. Before, the piece joined at the begin and owed those 3 ms."""
    clock = Clock()
    clock.now = 1.0
    compute = SharedCompute(4, threading.Event(), clock, hmx_units=1)
    job = compute.begin(matrix=True, started=0.997)
    assert job._work.done == pytest.approx(0.003)
    clock.now = 1.007
    compute.end(job, 0.010)  # 10 ms since its start, alone: nothing owed
    assert job.done_credit == pytest.approx(0.010)
    assert compute.active == 0


def test_a_late_piece_beside_another_matrix_piece_gets_its_share_of_the_lag() -> None:
    clock = Clock()
    clock.now = 1.0
    compute = SharedCompute(4, threading.Event(), clock, hmx_units=1)
    other = _Work(10.0, matrix=True)
    with compute._cond:
        compute._join_locked(other)
    job = compute.begin(matrix=True, started=0.996)  # two on the one HMX: half
    assert job._work.done == pytest.approx(0.002)
    compute.drop(job)


def test_a_start_in_the_future_or_long_ago_is_bounded() -> None:
    clock = Clock()
    clock.now = 100.0
    compute = SharedCompute(1, threading.Event(), clock)
    future = compute.begin(started=101.0)
    assert future._work.done == 0.0
    ancient = compute.begin(started=0.0)
    assert ancient._work.done == pytest.approx(BACKDATE_MAX * 0.5)  # at its share of 1
    compute.drop(future)
    compute.drop(ancient)


def test_without_a_model_a_late_piece_ends_its_time_after_its_start() -> None:
    clock = Clock()
    clock.now = 1.0
    compute = SharedCompute(0, threading.Event(), clock)
    job = compute.begin(started=0.99)
    clock.now = 1.02
    compute.end(job, 0.03)  # its 30 ms are up at 1.02: no sleep
    assert job.done_credit == pytest.approx(0.03)


def test_without_a_model_a_begun_piece_is_not_joined_and_ends_when_its_time_is_up() -> None:
    clock = Clock()
    compute = SharedCompute(0, threading.Event(), clock)
    job = compute.begin(matrix=True)
    assert compute.active == 0
    clock.now = 0.05
    compute.end(job, 0.05)
    assert compute.busy_seconds == 0
    with pytest.raises(ValueError, match="hmx_units"):
        SharedCompute(0, threading.Event(), hmx_units=-1)


def test_a_restart_interrupts_the_end_of_a_shared_piece() -> None:
    down = threading.Event()
    compute = SharedCompute(1, down)
    hog = compute.begin()
    job = compute.begin()
    threading.Timer(0.05, down.set).start()
    with pytest.raises(SubsystemDownError):
        compute.end(job, 60.0)
    compute.drop(hog)
    assert compute.active == 0
