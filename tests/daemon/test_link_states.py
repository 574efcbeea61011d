"""The link's state table (npud/datapath/link_states.py): every (state, change) pair."""

from __future__ import annotations

import pytest

from npud.datapath.link_states import MOVES, TALKING, Change, LinkState, LinkStateError, move

S = LinkState

ALLOWED = {
    (S.READING, Change.REQUESTS_END): S.ANSWERING,
    (S.READING, Change.DROP): S.DROPPED,
    (S.READING, Change.RELEASE): S.RELEASED,
    (S.ANSWERING, Change.DROP): S.DROPPED,
    (S.ANSWERING, Change.HANG_UP): S.HUNG_UP,
    (S.ANSWERING, Change.FINISH): S.FINISHED,
    (S.ANSWERING, Change.RELEASE): S.RELEASED,
    (S.DROPPED, Change.HANG_UP): S.HUNG_UP,
    (S.DROPPED, Change.FINISH): S.FINISHED,
    (S.DROPPED, Change.RELEASE): S.RELEASED,
    (S.HUNG_UP, Change.FINISH): S.FINISHED,
    (S.HUNG_UP, Change.RELEASE): S.RELEASED,
    (S.FINISHED, Change.RELEASE): S.RELEASED,
}
"""Written out again here, not derived from the table: a move added or lost there fails."""


def test_the_table_covers_every_pair() -> None:
    assert set(MOVES) == {(state, change) for state in LinkState for change in Change}


@pytest.mark.parametrize(("state", "change"), sorted(ALLOWED, key=str))
def test_allowed_moves(state: LinkState, change: Change) -> None:
    assert move(state, change) is ALLOWED[state, change]


@pytest.mark.parametrize(
    ("state", "change"),
    sorted(set(MOVES) - set(ALLOWED), key=str),
)
def test_refused_moves_raise_with_the_reason(state: LinkState, change: Change) -> None:
    reason = MOVES[state, change]
    assert isinstance(reason, str)
    assert reason
    with pytest.raises(LinkStateError) as caught:
        move(state, change)
    message = str(caught.value)
    assert state.value in message
    assert reason in message


def test_each_once_only_state_is_entered_from_no_state_it_leads_to() -> None:
    """Hang-up told once, finished once, released once: no path leads back to a state
    from which the change that enters them is allowed again."""

    def reachable(start: LinkState) -> set[LinkState]:
        seen, todo = set(), [start]
        while todo:
            state = todo.pop()
            for (source, _), target in MOVES.items():
                if source is state and isinstance(target, LinkState) and target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    for once, change in (
        (S.HUNG_UP, Change.HANG_UP),
        (S.FINISHED, Change.FINISH),
        (S.RELEASED, Change.RELEASE),
    ):
        for later in reachable(once) | {once}:
            assert isinstance(MOVES[later, change], str), (once, later)


def test_requests_arrive_only_while_reading() -> None:
    """Once reading is left, no move leads back to it."""
    assert all(target is not S.READING for target in MOVES.values())
    assert {S.READING, S.ANSWERING} == TALKING
