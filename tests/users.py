"""Clients of other users, for tests of what one user can do to another (issue 27).

The tests run as root; :func:`as_user` forks a child that drops to another uid and
speaks to npud over a blocking :class:`tests.e2e.daemon.RawPeer` (forked, not
executed: this machine's interpreter may be out of that user's reach, and the
socket's directory is reached through an fd, so its parents' modes do not matter).
It works for a daemon in a subprocess and for one in the test's own process (run it
on a thread there: the daemon's trio loop must go on serving the child).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.e2e.daemon import RawPeer

VICTIM = 65534
"""nobody: the victim of the tests and the bench."""
ATTACKER = 65533
"""A uid with no name on most systems, as good as any for SO_PEERCRED."""


def as_user(
    uid: int,
    path: Path,
    work: Callable[[RawPeer], bytes],
    meanwhile: Callable[[], object] = lambda: None,
) -> bytes:
    """Run ``work`` on a connection made by a child process running as ``uid``; its
    result (or the repr of what it raised). ``work`` may call ``peer.pause(note)``
    once: the parent then runs ``meanwhile`` (as root), with the child's ``note`` in
    :data:`notes`, before the child goes on; ``peer.again()`` makes another connection
    of the same user, ``peer.path`` is the socket's path as the child reaches it."""
    path.parent.chmod(0o711)
    path.chmod(0o666)
    directory = os.open(path.parent, os.O_PATH | os.O_CLOEXEC)
    read_end, write_end = os.pipe()
    paused, resume = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        outcome = b"error"
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            reachable = Path(f"/proc/self/fd/{directory}/{path.name}")
            peer = RawPeer.connect(reachable, timeout=60)

            def pause(note: bytes = b"") -> None:
                os.write(paused[1], b"p" + note)
                os.read(resume[0], 1)

            peer.pause = pause  # type: ignore[attr-defined]
            peer.again = lambda: RawPeer.connect(reachable, timeout=60)  # type: ignore[attr-defined]
            peer.path = reachable  # type: ignore[attr-defined]
            outcome = work(peer)
        except BaseException as exc:  # the child reports whatever happened
            outcome = repr(exc).encode()
        finally:
            os.write(write_end, outcome)
            os._exit(0)
    os.close(write_end)
    os.close(directory)
    os.close(paused[1])
    note = os.read(paused[0], 4096)
    if note:  # the child paused: do what it waits for
        notes[uid] = note[1:]
        try:
            meanwhile()
        finally:
            os.write(resume[1], b"r")
    for fd in (paused[0], resume[0], resume[1]):
        os.close(fd)
    try:
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


notes: dict[int, bytes] = {}
"""What each paused child said, by uid."""
