"""The closer of peers' fds: one thread per uid, sockets reset, what waits counted and
capped, and a blocked close that holds up only its own user (issue 16, item 2)."""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from npud.runtime import closer as closer_module
from npud.runtime.closer import Closer, close_now
from tests.polling import wait_until


def pipe_fds(count: int) -> tuple[list[int], list[int]]:
    reads, writes = [], []
    for _ in range(count):
        r, w = os.pipe()
        reads.append(r)
        writes.append(w)
    return reads, writes


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def blocking(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[set[int], threading.Event]]:
    """close_now blocks on the fds in the set until the event is set (a FUSE file whose
    daemon does not answer, say)."""
    stuck: set[int] = set()
    release = threading.Event()
    real = closer_module.close_now

    def slow(fd: int) -> None:
        if fd in stuck:
            release.wait(30)
        real(fd)

    monkeypatch.setattr(closer_module, "close_now", slow)
    yield stuck, release
    release.set()


def test_fds_are_closed_and_the_thread_goes_when_idle() -> None:
    closer = Closer(idle_seconds=0.01)
    reads, writes = pipe_fds(3)
    assert closer.submit(1000, reads)
    wait_until(lambda: closer.closed == 3 and closer.threads() == 0)
    assert not any(is_open(fd) for fd in reads)
    assert closer.pending() == 0
    for fd in writes:
        os.close(fd)


def test_a_blocked_close_holds_up_only_its_own_user(
    blocking: tuple[set[int], threading.Event],
) -> None:
    stuck, release = blocking
    closer = Closer()
    (slow, *_), slow_writes = pipe_fds(1)
    stuck.add(slow)
    fast, fast_writes = pipe_fds(2)
    assert closer.submit(1000, [slow])
    assert closer.submit(2000, fast)
    wait_until(lambda: not any(is_open(fd) for fd in fast))
    assert is_open(slow)
    assert (closer.pending(1000), closer.pending(2000), closer.threads()) == (1, 0, 2)
    release.set()
    wait_until(lambda: not is_open(slow))
    assert closer.close(10)
    for fd in (*slow_writes, *fast_writes):
        os.close(fd)


def test_a_user_past_the_cap_is_told(blocking: tuple[set[int], threading.Event]) -> None:
    stuck, release = blocking
    closer = Closer(max_pending_per_uid=4)
    reads, writes = pipe_fds(6)
    stuck.add(reads[0])
    assert closer.submit(1000, reads[:4])  # 4 waiting: at the cap
    assert not closer.submit(1000, reads[4:5])  # 5: past it (still closed, later)
    assert closer.submit(2000, reads[5:])  # another user is not concerned
    assert not closer.submit(1000, [])  # asking again says the same
    release.set()
    wait_until(lambda: closer.pending() == 0)
    assert closer.submit(1000, [])
    assert not any(is_open(fd) for fd in reads)
    for fd in writes:
        os.close(fd)


def test_close_reports_a_thread_still_blocked_and_later_fds_close_at_once(
    blocking: tuple[set[int], threading.Event],
) -> None:
    stuck, release = blocking
    closer = Closer()
    reads, writes = pipe_fds(2)
    stuck.add(reads[0])
    closer.submit(1000, reads[:1])
    wait_until(lambda: closer.threads() == 1)
    assert not closer.close(0.05)
    assert closer.submit(1000, reads[1:])  # stopping: closed on this thread
    assert not is_open(reads[1])
    release.set()
    wait_until(lambda: closer.threads() == 0)
    for fd in writes:
        os.close(fd)


def drain(sock: socket.socket) -> None:
    while sock.recv(65536):
        pass


def test_a_lingering_socket_is_reset_not_waited_for() -> None:
    """A TCP socket with SO_LINGER 30 s and unsent data: its close would block for 30 s;
    close_now resets it, and the peer sees a reset."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.setblocking(False)
    try:
        while True:
            client.send(b"x" * 65536)
    except BlockingIOError:
        pass  # the send buffer is full: a lingering close would wait
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 30))
    fd = client.detach()
    closing = threading.Thread(target=close_now, args=(fd,), daemon=True)
    closing.start()
    closing.join(10)
    try:
        assert not closing.is_alive(), "the close lingered"
        with pytest.raises(ConnectionResetError):
            drain(server)
    finally:
        server.close()
        listener.close()
