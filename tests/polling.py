"""Waiting in a test for something another thread or process makes true."""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_TIMEOUT = 10.0
"""Seconds before a wait fails: a bound against a hang, never a measure of speed."""


def wait_until(
    condition: Callable[[], object],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.002,
) -> None:
    """Return once ``condition()`` is true; fail the test naming ``what`` when it is still
    false after ``timeout`` seconds. Looks every ``interval`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened within {timeout} s: {what}"
        time.sleep(interval)
