"""What both clients show the same way: the daemon's Welcome, and a remote handle."""

from __future__ import annotations

from typing import Generic

from npu_client._core import B, ClientCore
from npu_protocol import (
    ClientLimits,
    DaemonStatus,
    DspCapabilities,
    Priority,
    ShuttingDown,
    Welcome,
)


class DaemonView(Generic[B]):
    """What the daemon said, as both clients expose it (read-only properties).

    Mixed into the blocking and the trio client, which set ``_core``, ``_path``
    and ``_closed``.
    """

    _core: ClientCore[B]
    _path: str
    _closed: bool

    @property
    def path(self) -> str:
        """The socket this client connected to."""
        return self._path

    @property
    def welcome(self) -> Welcome:
        """The daemon's Welcome: versions, backend, DSP capabilities, limits, epoch."""
        welcome = self._core.welcome
        assert welcome is not None  # connect() returns only after it
        return welcome

    @property
    def server_version(self) -> str:
        return self.welcome.server_version

    @property
    def backend(self) -> str:
        """``kernel`` (a real FastRPC device) or ``emulator``."""
        return self.welcome.backend

    @property
    def dsp(self) -> DspCapabilities:
        return self.welcome.dsp

    @property
    def limits(self) -> ClientLimits:
        """The limits the daemon applies to this connection."""
        return self._core.limits

    @property
    def priority(self) -> Priority:
        """The priority class granted (possibly lower than asked)."""
        return self._core.limits.priority

    @property
    def epoch(self) -> int:
        """The DSP session epoch of this client's domain: from the Welcome, then from
        each SessionRestarted."""
        return self._core.epoch

    @property
    def domain(self) -> str:
        """The domain (DSP process) this client's calls run in (protocol version 3; empty
        from an older daemon)."""
        return self.welcome.domain

    @property
    def shutting_down(self) -> bool:
        """True once the daemon announced that it is shutting down."""
        return self._core.shutdown_notice is not None

    @property
    def shutdown_notice(self) -> ShuttingDown | None:
        """The daemon's ShuttingDown event (reason, grace period), once it came."""
        return self._core.shutdown_notice

    @property
    def closed(self) -> bool:
        return self._closed


class HandleIdentity:
    """What a remote handle is, as both clients' handles expose it."""

    def __init__(self, handle_id: int, uri: str, epoch: int) -> None:
        self._id = handle_id
        self._uri = uri
        self._epoch = epoch
        self._closed = False

    @property
    def id(self) -> int:
        """The daemon's id for this handle (scoped to the connection)."""
        return self._id

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def epoch(self) -> int:
        """The session epoch it was opened in; a restart closes it in the daemon (re-open)."""
        return self._epoch

    @property
    def closed(self) -> bool:
        return self._closed

    def _mark_closed(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"remote handle {self._id} is closed")


def dsp_is_up(welcome: Welcome) -> bool:
    """The daemon reported the DSP's capabilities: its DSP process is up (while it
    restarts, the Welcome carries none)."""
    return welcome.dsp.arch_ver != 0


def utilization_of(status: DaemonStatus) -> float:
    """The DSP's busy share, 0..1, as the daemon averages it (0 without a scheduler)."""
    scheduler = status.scheduler
    return 0.0 if scheduler is None else scheduler.utilisation_pct / 100
