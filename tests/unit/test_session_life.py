"""The session's life (issue 32, item 3): its state table, the calls in flight a close
waits for, and the DSP's death told once."""

from __future__ import annotations

import itertools
import threading

import pytest

from npu_protocol import ErrorCode
from npud.fastrpc.kernel.dma import ComputeBank
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.session._life import TRANSITIONS, Life, State, check_move
from tests.polling import wait_until

ALLOWED = {(State.OPEN, State.CLOSING), (State.CLOSING, State.CLOSED)}


def state_of(life: Life) -> State:
    """The state now (a call, so that mypy does not carry a narrowed state across moves)."""
    return life.state


def make_life() -> tuple[Life, ComputeBank, list[str]]:
    bank = ComputeBank()
    told: list[str] = []
    return Life(bank, told.append), bank, told


def test_the_table_holds_exactly_the_two_moves_forward() -> None:
    table = {(start, to) for start, targets in TRANSITIONS.items() for to in targets}
    assert table == ALLOWED
    assert set(TRANSITIONS) == set(State)


@pytest.mark.parametrize(("start", "to"), sorted(ALLOWED, key=str))
def test_an_allowed_move_passes(start: State, to: State) -> None:
    check_move(start, to)


@pytest.mark.parametrize(
    ("start", "to"),
    [pair for pair in itertools.product(State, State) if pair not in ALLOWED],
    ids=lambda state: state.name,
)
def test_every_other_move_is_refused(start: State, to: State) -> None:
    with pytest.raises(RuntimeError, match=f"{start.name} -> {to.name} is not allowed"):
        check_move(start, to)


def test_a_new_life_is_open_and_usable() -> None:
    life, _, _ = make_life()
    assert life.state is State.OPEN
    assert not life.closing
    assert not life.closed
    assert not life.dead
    life.check_usable()


def test_a_close_without_calls_ends_closed_and_a_second_is_a_no_op() -> None:
    life, _, _ = make_life()
    assert life.begin_close(None) is True
    assert life.state is State.CLOSED
    assert life.begin_close(None) is False
    assert life.state is State.CLOSED
    with pytest.raises(RpcError) as caught:
        life.check_usable()
    assert caught.value.code is ErrorCode.SESSION_CLOSED


def test_calls_are_counted_while_in_flight_and_when_done() -> None:
    life, _, _ = make_life()
    with life.call():
        assert life.in_flight == 1
        with life.call():
            assert life.in_flight == 2
    assert (life.in_flight, life.done) == (0, 2)


def test_a_call_that_raises_is_still_counted_done() -> None:
    life, _, _ = make_life()
    with pytest.raises(ValueError, match="the call failed"), life.call():
        raise ValueError("the call failed")
    assert (life.in_flight, life.done) == (0, 1)
    assert life.begin_close(0) is True


def test_a_close_that_times_out_stays_closing_and_refuses_new_calls() -> None:
    life, _, _ = make_life()
    with life.call():
        with pytest.raises(RpcError) as caught:
            life.begin_close(0)
        assert caught.value.code is ErrorCode.SESSION_BUSY
        assert life.state is State.CLOSING
        with pytest.raises(RpcError) as refused, life.call():
            pass
        assert refused.value.code is ErrorCode.SESSION_CLOSED
        assert life.in_flight == 1  # the refused call was never counted
    # The call ended: a later close finishes (CLOSING -> CLOSED, no second CLOSING).
    assert life.begin_close(0) is True
    assert state_of(life) is State.CLOSED


def test_a_close_waits_for_the_call_in_flight() -> None:
    life, _, _ = make_life()
    release = threading.Event()
    entered = threading.Event()

    def running_call() -> None:
        with life.call():
            entered.set()
            release.wait()

    caller = threading.Thread(target=running_call, daemon=True)
    caller.start()
    assert entered.wait(10)
    closer = threading.Thread(target=life.begin_close, args=(None,), daemon=True)
    closer.start()
    try:
        wait_until(lambda: life.state is not State.OPEN, "the close began")
        assert closer.is_alive()  # waiting for the call, not closed under it
        assert state_of(life) is State.CLOSING
    finally:
        release.set()
    caller.join(10)
    closer.join(10)
    assert not closer.is_alive()
    assert state_of(life) is State.CLOSED


def test_a_dead_life_refuses_calls_and_tells_once() -> None:
    life, bank, told = make_life()
    life.mark_dead("the DSP restarted")
    life.mark_dead("again")
    assert told == ["the DSP restarted"]
    assert life.dead
    assert bank.lost
    assert life.state is State.OPEN  # dead is not closed: the owner still closes it
    with pytest.raises(RpcError) as caught, life.call():
        pass
    assert caught.value.code is ErrorCode.DSP_RESTARTED
    assert life.begin_close(0) is True


def test_a_process_that_ended_on_its_own_keeps_the_bank() -> None:
    life, bank, told = make_life()
    life.mark_dead("the DSP process ended", channel_lost=False)
    assert life.dead
    assert not bank.lost
    assert told == ["the DSP process ended"]


def test_the_process_marks() -> None:
    life, _, _ = make_life()
    with pytest.raises(RpcError) as caught:
        life.require_process()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    life.loaded()
    life.require_process()
    assert life.process_loaded
    assert not life.process_ended
    life.ended()
    assert life.process_ended
    life.unloaded()
    assert not life.process_loaded
