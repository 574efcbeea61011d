"""Who is at the other end of a Unix socket: credentials and groups, from the kernel.

SO_PEERCRED gives the peer's pid, uid and primary gid as they were at
connect(); SO_PEERGROUPS (Linux 4.13+) its supplementary groups, from the same
moment. The allow-list, the realtime list and the domain rules all match the
whole set: a user added to the ``npu`` group with ``usermod -aG`` is in it.
"""

from __future__ import annotations

import errno
import grp
import socket
import struct
from collections.abc import Iterable
from typing import Final, Protocol

import structlog

from npu_client.transport import peer_credentials

log = structlog.get_logger("npud.daemon.peers")

SO_PEERGROUPS: Final = getattr(socket, "SO_PEERGROUPS", 59)
"""include/uapi/asm-generic/socket.h (Python 3.11's socket module does not name it)."""
FIRST_GUESS: Final = 64
NGROUPS_MAX: Final = 65536
_GID: Final = struct.Struct("I")


class _HasSockopt(Protocol):
    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes: ...


def peer_groups(sock: _HasSockopt, primary: int) -> tuple[int, ...]:
    """Every group of the peer: its primary gid first, then its supplementary groups
    (each once). A kernel without SO_PEERGROUPS gives the primary gid alone."""
    for room in (FIRST_GUESS, NGROUPS_MAX):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, room * _GID.size)
        except OSError as exc:
            if exc.errno == errno.ERANGE and room != NGROUPS_MAX:
                continue  # more groups than the first guess holds
            if exc.errno in (errno.ENOPROTOOPT, errno.EINVAL):
                return (primary,)
            raise
        found = [gid for (gid,) in _GID.iter_unpack(raw[: len(raw) // _GID.size * _GID.size])]
        return tuple(dict.fromkeys([primary, *found]))
    return (primary,)  # pragma: no cover - the loop returns or raises


def identify(sock: _HasSockopt) -> tuple[int, int, int, tuple[int, ...]]:
    """(pid, uid, primary gid, every gid) of the peer."""
    pid, uid, gid = peer_credentials(sock)
    return pid, uid, gid, peer_groups(sock, gid)


def group_ids(names: Iterable[str]) -> frozenset[int]:
    """The gids of the groups named (the system's group database); a name it does not
    know matches no one, and the log says so."""
    found: set[int] = set()
    for name in names:
        try:
            found.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            log.info("group not on this system; it grants nothing", group=name)
    return frozenset(found)
