"""The one loop that turns what a peer sent into messages: the handshake's and the link's.

A server connection (``npu_protocol``) holds the bytes and fds a peer sent;
:func:`drain` takes its events until it needs more data, and says what they
were: the messages, in order, and whether the peer's requests end here
(:class:`Ending`: it closed its stream, or broke the protocol, or its user's
fds pile up waiting to be closed). Fds the peer sent unasked are closed on the
way (logged within the peer's log budget). What to do with an ending (answer a
violation, charge it, drop the connection) is the caller's: the handshake
awaits its sends, the link sends without blocking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

import npu_protocol as p
from npud.ops.loglimit import LogBudget
from npud.ops.loglimit import fields as log_fields


@dataclass(frozen=True, slots=True)
class Ending:
    """Why no more requests come from the peer."""

    reason: str
    """For the log and the connection's end (``Link.reason``)."""
    farewell: p.ErrorMessage | None = None
    """The one answer a violation gets (an error without id) before the connection is
    dropped; None when the peer closed its stream itself."""

    @property
    def violation(self) -> bool:
        """The peer broke the protocol (its user is charged: npud.daemon.penalties)."""
        return self.farewell is not None


def drain(
    protocol: p.ServerConnection,
    *,
    close_later: Callable[[Sequence[int]], bool],
    log: structlog.typing.FilteringBoundLogger,
    log_budget: LogBudget,
    fds_waiting_cap: int,
    first_only: bool = False,
) -> tuple[list[p.ClientMessage], Ending | None]:
    """The messages ``protocol`` holds, and the ending they reached (None: it needs more
    data). ``first_only``: stop after the first message (the handshake's Hello: what
    follows waits for the Welcome). ``close_later`` closes fds off this thread; False
    when their user has more than ``fds_waiting_cap`` waiting (the connection ends)."""
    messages: list[p.ClientMessage] = []
    while True:
        try:
            event = protocol.next_event()
        except p.RemoteProtocolError as exc:
            close_later(protocol.take_pending_fds())
            log.warning("protocol violation", code=exc.code.name, error=str(exc))
            return messages, Ending(
                f"protocol violation: {exc}", p.ErrorMessage.for_code(exc.code, **exc.fields)
            )
        if event is p.NEED_DATA:
            return messages, None
        if isinstance(event, p.StrayFds):
            if not close_later(event.fds):
                log.warning("dropped: its user's fds pile up waiting to be closed")
                return messages, Ending(
                    "too many of its user's fds wait to be closed",
                    fds_waiting_refusal(fds_waiting_cap),
                )
            held = log_budget.take()  # fds on every byte: an event each
            if held is not None:
                log.warning(
                    "closed fds the client sent unasked",
                    count=len(event.fds),
                    **log_fields(held),
                )
            continue
        if isinstance(event, p.ConnectionClosed):
            return messages, Ending("closed by the client")
        messages.append(event)
        if first_only:
            return messages, None


def fds_waiting_refusal(cap: int) -> p.ErrorMessage:
    """What a peer is told, before its connection is dropped, when its user has more
    than ``cap`` fds waiting to be closed (``[uid_limits] max_fds_waiting``)."""
    return p.ErrorMessage.for_code(
        p.ErrorCode.QUOTA_EXCEEDED,
        resource="fds this user sent that wait to be closed",
        limit=cap,
    )
