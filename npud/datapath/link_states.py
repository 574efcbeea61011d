"""A link's life as one table (in the style of ``npu_protocol/_states.py``).

A :class:`~npud.datapath.link.Link` is in one :class:`LinkState`; what happens to
it is a :class:`Change`. For every (state, change) pair :data:`MOVES` gives the
next state, or why the change cannot happen there: asking for such a change is
a bug of npud's, raised as :class:`LinkStateError`. The invariants of the link
(npud/datapath/link.py) follow from the table:

* requests arrive only in READING; once it is left, no more can;
* the hang-up is told once: HUNG_UP is entered at most once, and only with
  reading over (the link checks that requests are pending);
* the link finishes once: FINISHED is entered at most once, with reading over
  (the link checks that nothing is pending, the outbox is empty and no worker
  is reading);
* the peer's pending fds are released once: RELEASED is the end, entered once.

``tests/daemon/test_link_states.py`` walks every pair.
"""

from __future__ import annotations

import enum
from typing import Final


class LinkState(enum.Enum):
    READING = "reading"
    """Requests may arrive; answers go out."""
    ANSWERING = "answering"
    """No more requests can arrive (the peer closed its sending side, or the receive
    failed); the answers of those that did still go out."""
    DROPPED = "dropped"
    """npud stopped talking to the peer (it misbehaved, or npud stops): nothing more is
    sent; requests that run finish on their own."""
    HUNG_UP = "hung_up"
    """Requests are pending and nobody can read their answers (the peer closed its
    socket, or was dropped): nothing more is sent, the owner was told."""
    FINISHED = "finished"
    """No more requests can arrive, every one ended, the outbox is flushed or dropped:
    the owner was told, and releases the client."""
    RELEASED = "released"
    """The owner removed the link: the fds of a frame the peer never finished are
    closed; a read still on its way brings nothing."""


class Change(enum.Enum):
    """What happens to a link."""

    REQUESTS_END = "requests_end"  # the peer ended its stream, or the receive failed
    DROP = "drop"  # npud stops talking to the peer
    HANG_UP = "hang_up"  # nobody can read the answers of requests still pending
    FINISH = "finish"  # nothing more to do: the owner may release the client
    RELEASE = "release"  # the owner removed the link


class LinkStateError(RuntimeError):
    """A change the link's state does not allow: a bug of npud's, never the peer's."""


READING, ANSWERING, DROPPED, HUNG_UP, FINISHED, RELEASED = LinkState
TALKING: Final = frozenset({READING, ANSWERING})
"""States in which answers are sent."""

Move = LinkState | str
"""The next state, or why the change cannot happen in this state."""

MOVES: Final[dict[tuple[LinkState, Change], Move]] = {
    (READING, Change.REQUESTS_END): ANSWERING,
    (READING, Change.DROP): DROPPED,
    (READING, Change.HANG_UP): "reading is not over: the peer may still read its answers",
    (READING, Change.FINISH): "reading is not over: more requests may arrive",
    (READING, Change.RELEASE): RELEASED,  # npud stops, or the owner's task was cancelled
    (ANSWERING, Change.REQUESTS_END): "the requests ended already",
    (ANSWERING, Change.DROP): DROPPED,
    (ANSWERING, Change.HANG_UP): HUNG_UP,
    (ANSWERING, Change.FINISH): FINISHED,
    (ANSWERING, Change.RELEASE): RELEASED,
    (DROPPED, Change.REQUESTS_END): "the link was dropped: reading is over",
    (DROPPED, Change.DROP): "the link was dropped already",
    (DROPPED, Change.HANG_UP): HUNG_UP,
    (DROPPED, Change.FINISH): FINISHED,
    (DROPPED, Change.RELEASE): RELEASED,
    (HUNG_UP, Change.REQUESTS_END): "the link hung up: reading is over",
    (HUNG_UP, Change.DROP): "the link hung up: nothing is sent any more",
    (HUNG_UP, Change.HANG_UP): "the hang-up was told already",
    (HUNG_UP, Change.FINISH): FINISHED,
    (HUNG_UP, Change.RELEASE): RELEASED,
    (FINISHED, Change.REQUESTS_END): "the link finished: reading is over",
    (FINISHED, Change.DROP): "the link finished: nothing is sent any more",
    (FINISHED, Change.HANG_UP): "the link finished: nothing is pending",
    (FINISHED, Change.FINISH): "the link finished already",
    (FINISHED, Change.RELEASE): RELEASED,
    **{
        (RELEASED, change): "the link was released: it is over"
        for change in Change
        if change is not Change.RELEASE
    },
    (RELEASED, Change.RELEASE): "the link's fds were released already",
}


def move(state: LinkState, change: Change) -> LinkState:
    """The state ``change`` leads to from ``state``; raises :class:`LinkStateError` when
    the table refuses it."""
    next_state = MOVES[state, change]
    if isinstance(next_state, str):
        raise LinkStateError(
            f"a link cannot {change.value.replace('_', ' ')} in state {state.value}: {next_state}"
        )
    return next_state
