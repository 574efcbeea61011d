"""DSP lanes: results, errors, priority order, cancellation, signals blocked, clean stop."""

from __future__ import annotations

import functools
import signal
import threading

import pytest
import trio
from structlog.testing import capture_logs

from npud.runtime.lanes import LanePool, LaneTimeoutError


@pytest.fixture
def pool() -> object:
    lanes = LanePool("test", threads=1)
    lanes.start()
    yield lanes
    assert lanes.stop(timeout=5)


async def test_call_returns_the_result_from_a_lane_thread(pool: LanePool) -> None:
    main = threading.get_ident()
    ident = await pool.call(threading.get_ident)
    assert ident != main
    assert pool.statistics().completed == 1


async def test_exceptions_cross_back(pool: LanePool) -> None:
    def boom() -> None:
        raise ValueError("from the lane")

    with pytest.raises(ValueError, match="from the lane"):
        await pool.call(boom)


async def test_signals_are_blocked_on_lanes(pool: LanePool) -> None:
    blocked = await pool.call(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, []))
    assert signal.SIGTERM in blocked
    assert signal.SIGINT in blocked


async def test_lower_priority_value_runs_first(pool: LanePool) -> None:
    gate = threading.Event()
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.call, gate.wait)  # occupies the only thread
        await trio.sleep(0.05)
        nursery.start_soon(lambda: pool.call(lambda: order.append("background"), priority=1))
        await trio.sleep(0.01)
        nursery.start_soon(lambda: pool.call(lambda: order.append("normal"), priority=0))
        await trio.sleep(0.01)
        gate.set()
    assert order == ["normal", "background"]


async def test_a_queued_job_cancelled_never_runs(pool: LanePool) -> None:
    gate = threading.Event()
    ran: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.call, gate.wait)
        await trio.sleep(0.05)
        with trio.move_on_after(0.05):
            await pool.call(lambda: ran.append(1))
        gate.set()
    await pool.call(lambda: None)  # the queue has drained past the cancelled job
    assert ran == []


async def test_a_running_job_is_waited_for_even_when_cancelled(pool: LanePool) -> None:
    started = threading.Event()
    finished = threading.Event()

    def slow() -> None:
        started.set()
        finished.wait(5)

    returned_after_finish: list[bool] = []

    async def caller(scope: trio.CancelScope) -> None:
        with scope:
            await pool.call(slow)
        returned_after_finish.append(finished.is_set())

    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller, scope)
        await trio.to_thread.run_sync(started.wait)
        scope.cancel()
        await trio.sleep(0.05)
        assert not returned_after_finish  # still waiting for the running job
        finished.set()
    # The cancelled call returned only after the job finished.
    assert returned_after_finish == [True]
    assert pool.statistics().running == 0


def test_stop_drains_and_ends_threads() -> None:
    lanes = LanePool("drain", threads=2)
    lanes.start()
    assert lanes.alive()
    assert lanes.stop(timeout=5)
    assert not lanes.alive()
    assert not [t for t in threading.enumerate() if t.name.startswith("lane-drain")]


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        LanePool("none", threads=0)


async def test_a_timed_out_queued_job_is_dropped(pool: LanePool) -> None:
    gate = threading.Event()
    ran: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.call, gate.wait)
        await trio.sleep(0.05)
        with pytest.raises(LaneTimeoutError, match=r"no result within 0\.05 s"):
            await pool.call(lambda: ran.append(1), timeout=0.05)
        gate.set()
    await pool.call(lambda: None)
    assert ran == []


async def test_a_timed_out_running_job_hands_its_result_to_on_abandoned(pool: LanePool) -> None:
    release = threading.Event()
    abandoned: list[str] = []
    delivered = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "made something"

    def cleanup(value: str) -> None:
        abandoned.append(value)
        delivered.set()

    with pytest.raises(LaneTimeoutError):
        await pool.call(slow, timeout=0.05, on_abandoned=cleanup)
    release.set()
    await trio.to_thread.run_sync(delivered.wait, 5)
    assert abandoned == ["made something"]


async def test_submit_runs_without_waiting_and_logs_failures(pool: LanePool) -> None:
    done = threading.Event()

    def boom() -> None:
        done.set()
        raise RuntimeError("lost")

    with capture_logs() as logs:
        pool.submit(boom)
        assert await trio.to_thread.run_sync(done.wait, 5)
        await pool.call(lambda: None)  # the lane survived the failure
    assert [(e["event"], e["lane"]) for e in logs] == [("lane job failed", "test")]


def test_submitters_take_turns(pool: LanePool) -> None:
    """One user's eight queued loads do not all go before another user's open (issue 16,
    item 4): jobs of different fair keys alternate; jobs of one key keep their order."""
    gate, started = threading.Event(), threading.Event()
    order: list[str] = []
    finished = threading.Event()

    def blocker() -> None:
        started.set()
        gate.wait(10)

    pool.submit(blocker, fair_key="a")
    assert started.wait(10)
    for index in range(4):
        pool.submit(functools.partial(order.append, f"a{index}"), fair_key="a")
    pool.submit(lambda: order.append("b0"), fair_key="b")
    pool.submit(lambda: order.append("b1"), fair_key="b")
    pool.submit(lambda: order.append("none"))
    pool.submit(finished.set, fair_key="a")  # a's last turn: after everything above
    gate.set()
    assert finished.wait(10)
    assert order == ["b0", "none", "a0", "b1", "a1", "a2", "a3"]
