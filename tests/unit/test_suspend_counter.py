"""Counting system suspends from the clocks (issue 29, item 7): CLOCK_BOOTTIME runs on
through a suspend and CLOCK_MONOTONIC stops, and /sys/power/suspend_stats says how many."""

from __future__ import annotations

from pathlib import Path

from npud.fastrpc.kernel.suspends import (
    SLEEP_NOISE_NS,
    SuspendCounter,
    clock_offset_ns,
    read_suspend_successes,
)


class Clocks:
    def __init__(self) -> None:
        self.offset = 5_000_000_000
        self.successes: int | None = 7

    def counter(self) -> SuspendCounter:
        return SuspendCounter(lambda: self.offset, lambda: self.successes)


def test_no_suspend_no_count_and_jitter_is_not_a_suspend() -> None:
    clocks = Clocks()
    counter = clocks.counter()
    assert counter.count() == 0
    clocks.offset += SLEEP_NOISE_NS - 1
    assert counter.count() == 0


def test_a_suspend_counts_as_many_as_the_kernel_says() -> None:
    clocks = Clocks()
    counter = clocks.counter()
    clocks.offset += 10_000_000_000
    clocks.successes = 9  # two suspends between two looks
    assert counter.count() == 2
    assert counter.count() == 2
    clocks.offset += 3_000_000_000
    clocks.successes = 10
    assert counter.count() == 3


def test_without_suspend_stats_each_jump_is_one_suspend() -> None:
    clocks = Clocks()
    clocks.successes = None
    counter = clocks.counter()
    clocks.offset += 1_000_000_000
    assert counter.count() == 1
    clocks.offset += 1_000_000_000
    assert counter.count() == 2


def test_a_count_that_did_not_grow_still_counts_the_jump() -> None:
    clocks = Clocks()
    counter = clocks.counter()
    clocks.offset += 1_000_000_000  # the clocks moved, the stats did not (a failed resume)
    assert counter.count() == 1


def test_the_real_clocks_and_file(tmp_path: Path) -> None:
    assert clock_offset_ns() >= -SLEEP_NOISE_NS
    stats = tmp_path / "success"
    stats.write_text("42\n")
    assert read_suspend_successes(stats) == 42
    stats.write_text("garbage")
    assert read_suspend_successes(stats) is None
    assert read_suspend_successes(tmp_path / "missing") is None
    assert SuspendCounter().count() == 0
