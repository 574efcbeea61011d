"""The DSP's shared compute: processor sharing. The accounting is checked with a fake
clock; threads check only what finishes first (no timing is asserted)."""

from __future__ import annotations

import threading

import pytest

from npud.sim.compute import SharedCompute, _Work
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
