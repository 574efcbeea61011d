"""What ``next_event()`` returns besides messages, and the statistics snapshot."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class ConnectionState(enum.Enum):
    """Where a connection is in its life.

    ``START``: a client must send its Hello; a server waits for it.
    ``HANDSHAKE``: the Hello is out; the client waits for the Welcome, the
    server must answer with a Welcome or an ErrorMessage without id.
    ``READY``: requests, replies and events flow.
    ``CLOSED``: the peer closed, or the connection ended with an ErrorMessage
    without id; nothing more is sent or read.
    ``ERROR``: the peer broke the protocol; a server may still send one
    ErrorMessage without id saying why, then closes.
    """

    START = "start"
    HANDSHAKE = "handshake"
    READY = "ready"
    CLOSED = "closed"
    ERROR = "error"


class NeedData(enum.Enum):
    """The sentinel type of NEED_DATA."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA
"""``next_event()`` needs more bytes from ``receive_data()`` before it can say more."""


@dataclass(frozen=True, slots=True)
class StrayFds:
    """Fds that arrived with no frame to claim them (or were still queued when
    the connection closed). They are the caller's now: close them."""

    fds: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """Nothing more will arrive: the peer closed its end, or the connection ended."""


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    """A snapshot of one connection's counters."""

    state: ConnectionState
    frames_sent: int
    frames_received: int
    bytes_sent: int
    bytes_received: int
    fds_sent: int
    fds_received: int
    requests_in_flight: int
    bytes_buffered: int
