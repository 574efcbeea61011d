"""The hung-call penalty is the user's (issue 27): npud.daemon.penalties.HungCalls on a clock
the test turns."""

from __future__ import annotations

from npud.daemon.penalties import Charge, HungCalls


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_users_hung_calls_add_up_across_its_connections_and_expire() -> None:
    clock = Clock()
    hung = HungCalls(clock)
    assert hung.charge(1000, remember=60, revoke_at=2, revoke_always=False) == Charge(1, False)
    assert hung.throttle_left(1000) == 60
    assert hung.refused(1000, 2) is None
    clock.now += 30
    # A second call, whichever connection made it: the user is revoked and refused.
    assert hung.charge(1000, remember=60, revoke_at=2, revoke_always=False) == Charge(2, True)
    assert hung.refused(1000, 2) == (2, 60)
    assert hung.throttle_left(1001) == 0  # another user pays nothing
    clock.now += 60
    assert hung.refused(1000, 2) is None  # forgotten a throttle time after the last
    assert hung.throttle_left(1000) == 0
    assert hung.charge(1000, remember=60, revoke_at=2, revoke_always=False) == Charge(1, False)


def test_revoke_always_and_never() -> None:
    hung = HungCalls(Clock())
    assert hung.charge(5, remember=10, revoke_at=0, revoke_always=True).revoke
    assert not hung.charge(6, remember=10, revoke_at=0, revoke_always=False).revoke
    assert hung.refused(6, 0) is None  # revoke_at 0: never refused
    # remember 0 (hung_call_throttle_s = 0): each call counts alone.
    assert hung.charge(7, remember=0, revoke_at=2, revoke_always=False) == Charge(1, False)
    assert hung.charge(7, remember=0, revoke_at=2, revoke_always=False) == Charge(1, False)
