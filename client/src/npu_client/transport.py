"""Unix-socket transport with fd passing: the one place fds cross the socket.

Used by the blocking client, the trio client and the daemon. Frames and fds
are matched by the sans-IO connection of ``npu_protocol``; this module only
moves bytes and fds and owns every fd it receives until someone takes it.

Rules (protocol/PROTOCOL.md, "File descriptors"):

* fds are sent with ``SCM_RIGHTS`` in the same ``sendmsg`` as the first byte
  of the frame that declares them;
* fds are received with ``MSG_CMSG_CLOEXEC`` so no child process inherits them;
* ``MSG_CTRUNC`` (the kernel dropped fds because our ancillary buffer was too
  small) is a protocol error: the fds that did arrive are closed.
"""

from __future__ import annotations

import array
import os
import socket
import struct
import threading
import warnings
from collections.abc import Iterable, Sequence
from typing import Final, Protocol, Self

MAX_FDS_PER_MESSAGE: Final = 16
"""Ancillary space reserved per recvmsg; more fds than this is MSG_CTRUNC."""

RECV_BUFFER: Final = 256 * 1024
"""What :func:`recv_message` reads at most (a new bytes object each time)."""

RECEIVE_BUFFER_SIZE: Final = 64 * 1024
"""The one receive buffer each client connection keeps and reads into; a larger
answer takes several reads."""

ANCILLARY_SPACE: Final = socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * array.array("i").itemsize)

# A plain int: socket.MSG_CTRUNC is an IntFlag, and ``flags & MSG_CTRUNC`` on it
# runs the enum's Python code (its __rand__) on every read.
_CTRUNC: Final = int(socket.MSG_CTRUNC)


class TransportError(Exception):
    """The peer broke the fd-passing rules (truncated ancillary data, odd cmsgs)."""


class OwnedFd:
    """Exactly one owner of one fd: closes it once, or hands it on with :meth:`detach`.

    ``fd`` is -1 once closed or detached.
    """

    __slots__ = ("_lock", "fd")

    def __init__(self, fd: int) -> None:
        if fd < 0:
            raise ValueError(f"not a file descriptor: {fd}")
        self.fd = fd
        # close() and detach() may race between threads; a second os.close
        # could close an unrelated fd that reused the number.
        self._lock = threading.Lock()

    def fileno(self) -> int:
        if self.fd < 0:
            raise ValueError("file descriptor already closed or detached")
        return self.fd

    def detach(self) -> int:
        """Give up ownership: the caller now owns (and must close) the returned fd."""
        with self._lock:
            fd, self.fd = self.fileno(), -1
        return fd

    def close(self) -> None:
        with self._lock:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A leak is a bug: say so (a ResourceWarning, as for an unclosed file or
        # socket, so tests run with warnings as errors catch it), then close
        # late rather than never.
        if getattr(self, "fd", -1) >= 0:
            warnings.warn(
                f"fd {self.fd} was never closed: closed by the garbage collector",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )
            self.close()

    def __repr__(self) -> str:
        return f"<OwnedFd {self.fd}>"


def close_all(fds: Iterable[OwnedFd]) -> None:
    for fd in fds:
        fd.close()


def fds_ancillary(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
    """The ancillary data that carries ``fds`` (empty list for none)."""
    if not fds:
        return []
    if len(fds) > MAX_FDS_PER_MESSAGE:
        raise ValueError(f"{len(fds)} fds in one message; the limit is {MAX_FDS_PER_MESSAGE}")
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


def parse_ancillary(ancdata: list[tuple[int, int, bytes]], msg_flags: int) -> list[OwnedFd]:
    """Take ownership of every fd in ``ancdata``; raise (after closing them) on truncation."""
    received: list[OwnedFd] = []
    unexpected = False
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            received.extend(OwnedFd(fd) for fd in fds)
        else:
            unexpected = True
    if msg_flags & _CTRUNC:
        close_all(received)
        raise TransportError("ancillary data truncated (MSG_CTRUNC): too many fds in one message")
    if unexpected:
        close_all(received)
        raise TransportError("unexpected ancillary data (only SCM_RIGHTS is allowed)")
    return received


def send_message(
    sock: socket.socket, data: bytes | bytearray | memoryview, fds: Sequence[int] = ()
) -> None:
    """Blocking send of ``data`` with ``fds`` attached to its first byte."""
    view = memoryview(data)
    sent = sock.sendmsg([view], fds_ancillary(fds))
    while sent < len(view):
        sent += sock.send(view[sent:])


def recv_message(sock: socket.socket, size: int = RECV_BUFFER) -> tuple[bytes, list[OwnedFd]]:
    """Blocking receive; ``b""`` means the peer closed. The caller owns the fds."""
    data, ancdata, flags, _ = sock.recvmsg(size, ANCILLARY_SPACE, socket.MSG_CMSG_CLOEXEC)
    return data, parse_ancillary(ancdata, flags)


class _HasSockopt(Protocol):
    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes: ...


def peer_credentials(sock: _HasSockopt) -> tuple[int, int, int]:
    """(pid, uid, gid) of the peer from SO_PEERCRED, as the kernel recorded them at connect."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    # struct ucred: pid_t (signed), uid_t and gid_t (unsigned: uids above 2**31 exist).
    pid, uid, gid = struct.unpack("iII", creds)
    return int(pid), int(uid), int(gid)
