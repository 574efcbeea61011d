"""A link's ownership of the fds a peer sends, at the edges of its life."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence

import pytest
import structlog

import npu_protocol as p
from npu_client.transport import fds_ancillary
from npud.datapath.link import Link


class Closer:
    """Stands in for the closer lane: closes at once and remembers what."""

    def __init__(self) -> None:
        self.closed: list[int] = []

    def __call__(self, fds: Sequence[int]) -> bool:
        for fd in fds:
            os.close(fd)
        self.closed.extend(fds)
        return True


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    daemon_side, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield daemon_side, peer
    daemon_side.close()
    peer.close()


def link_over(sock: socket.socket, closer: Closer) -> Link:
    def refuse(request: p.AnyRequest) -> object:
        raise AssertionError(f"no request expected, got {request!r}")

    return Link(
        sock,
        p.ServerConnection(),
        log_context=structlog.get_logger(),
        arrive=refuse,  # type: ignore[arg-type]
        on_finished=lambda _link: None,
        close_later=closer,
    )


def send_fds(peer: socket.socket, data: bytes | bytearray) -> tuple[int, int]:
    """Two fds (a pipe's ends) on ``data``'s first byte; the peer's copies are closed."""
    read_end, write_end = os.pipe()
    peer.sendmsg([data], fds_ancillary([read_end, write_end]))
    os.close(read_end)
    os.close(write_end)
    return read_end, write_end


def test_fds_held_for_a_frame_begun_are_closed_when_released(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    closer = Closer()
    link = link_over(sock, closer)
    send_fds(peer, p.FRAME_MAGIC)  # a frame begun, its fds waiting for the rest
    assert link.read(bytearray(4096)) == []
    assert closer.closed == []
    link.release_pending_fds()
    assert len(closer.closed) == 2
    link.close()


def test_a_read_after_the_release_closes_what_it_brings(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    closer = Closer()
    link = link_over(sock, closer)
    link.release_pending_fds()
    # As a worker's read that passed its check before the connection ended.
    send_fds(peer, b"\x00")
    assert link.read(bytearray(4096)) == []
    assert len(closer.closed) == 2
    assert link.protocol.take_pending_fds() == []  # nothing was handed to the protocol
    link.close()


def test_a_link_is_not_finished_while_a_worker_reads_it(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, _ = pair
    finished: list[Link] = []
    link = link_over(sock, Closer())
    link.on_finished = finished.append
    with link.read_lock:  # a worker inside read()
        link.drop("dropped by a timer meanwhile")
        assert finished == []
    link.check_finished()  # what the worker's _serve_read does once it lets go
    assert finished == [link]
    link.close()


def test_a_read_of_a_dropped_link_delivers_nothing(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    closer = Closer()
    link = link_over(sock, closer)
    hello, _ = p.ClientConnection().send(
        p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="late")
    )
    send_fds(peer, hello)
    link.reading = True  # as a read that passed its check before the drop
    with link.lock:
        link.closing = True
    assert link.read(bytearray(4096)) == []
    assert len(closer.closed) == 2
    link.close()
