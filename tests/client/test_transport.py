"""fd passing over a real socketpair: ownership, CLOEXEC, truncation, credentials."""

from __future__ import annotations

import fcntl
import os
import socket

import pytest

from npu_client.transport import (
    MAX_FDS_PER_MESSAGE,
    OwnedFd,
    TransportError,
    fds_ancillary,
    parse_ancillary,
    peer_credentials,
    recv_message,
    send_message,
)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def pair() -> object:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_bytes_and_fds_arrive_together_and_are_owned(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    r, w = os.pipe()
    try:
        send_message(a, b"frame", [r, w])
        data, fds = recv_message(b)
        assert data == b"frame"
        assert len(fds) == 2
        for fd in fds:
            assert fcntl.fcntl(fd.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        os.write(fds[1].fileno(), b"x")
        assert os.read(r, 1) == b"x"
        for fd in fds:
            fd.close()
            assert fd.closed
    finally:
        os.close(r)
        os.close(w)


def test_too_many_fds_truncate_and_are_all_closed(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    before = _open_fds()
    r, w = os.pipe()
    try:
        many = [r] * (MAX_FDS_PER_MESSAGE + 4)
        import array

        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", many).tobytes())]
        a.sendmsg([b"x"], anc)
        with pytest.raises(TransportError, match="MSG_CTRUNC"):
            recv_message(b)
    finally:
        os.close(r)
        os.close(w)
    assert _open_fds() == before


def test_sender_refuses_more_fds_than_a_message_carries() -> None:
    with pytest.raises(ValueError, match="limit is 16"):
        fds_ancillary(list(range(MAX_FDS_PER_MESSAGE + 1)))
    assert fds_ancillary([]) == []


def test_unexpected_ancillary_data_is_refused_and_fds_closed() -> None:
    r, w = os.pipe()
    os.close(w)
    import array

    dup = os.dup(r)
    anc = [
        (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [dup]).tobytes()),
        (socket.SOL_SOCKET, 99, b"junk"),
    ]
    with pytest.raises(TransportError, match="unexpected ancillary"):
        parse_ancillary(anc, 0)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(dup)  # closed by the parser
    os.close(r)


def test_owned_fd_closes_once_and_detaches() -> None:
    r, w = os.pipe()
    owner = OwnedFd(r)
    assert owner.detach() == r
    assert owner.closed
    owner.close()  # no-op: it no longer owns anything
    os.close(r)
    with OwnedFd(w) as again:
        assert again.fileno() == w
    assert again.closed
    with pytest.raises(ValueError, match="already closed"):
        again.fileno()
    with pytest.raises(ValueError, match="not a file descriptor"):
        OwnedFd(-1)


def test_peer_closed_reads_empty(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.close()
    assert recv_message(b) == (b"", [])


def test_peer_credentials_are_ours(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    assert peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())


def test_peer_credentials_read_uids_unsigned() -> None:
    import struct

    class Fake:
        def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes:
            return struct.pack("iII", 4242, 3_000_000_000, 4_000_000_000)

    assert peer_credentials(Fake()) == (4242, 3_000_000_000, 4_000_000_000)
