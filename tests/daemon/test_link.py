"""A link's life over a real socket pair: its states, what it tells its owner, and its
ownership of the fds a peer sends, at the edges of its life."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import structlog

import npu_protocol as p
from npu_client.transport import fds_ancillary
from npud.datapath.link import Link
from npud.datapath.link_states import LinkState, LinkStateError
from npud.requests import Handler


class Owner:
    """Stands in for a connection (npud.daemon.connection.ClientLink): closes fds at once,
    and remembers what it was told."""

    def __init__(self) -> None:
        self.closed: list[int] = []
        self.told: list[tuple[str, object]] = []
        self.arrived: list[p.AnyRequest] = []

    def arrive(self, request: p.AnyRequest) -> Handler[Any]:
        self.arrived.append(request)
        return object()  # type: ignore[return-value]  # the link only keeps it

    def close_later(self, fds: Sequence[int]) -> bool:
        for fd in fds:
            os.close(fd)
        self.closed.extend(fds)
        return True

    def arm_write(self, link: Link) -> None:
        self.told.append(("arm_write", link))

    def violated(self, link: Link, reason: str) -> None:
        self.told.append(("violated", reason))

    def hung_up(self, link: Link) -> None:
        self.told.append(("hung_up", link.state))

    def finished(self, link: Link) -> None:
        self.told.append(("finished", link.state))

    def names(self) -> list[str]:
        return [name for name, _ in self.told]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    daemon_side, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield daemon_side, peer
    daemon_side.close()
    peer.close()


def link_over(sock: socket.socket, owner: Owner, **options: Any) -> Link:
    return Link(sock, p.ServerConnection(), owner, log_context=structlog.get_logger(), **options)


def read(link: Link) -> list[p.ClientMessage | p.ConnectionClosed]:
    """One read in the reader's turn, as a worker's _serve_read does."""
    assert link.take_read_turn()
    try:
        return link.read(bytearray(64 * 1024))
    finally:
        link.end_read_turn()


def send_fds(peer: socket.socket, data: bytes | bytearray) -> tuple[int, int]:
    """Two fds (a pipe's ends) on ``data``'s first byte; the peer's copies are closed."""
    read_end, write_end = os.pipe()
    peer.sendmsg([data], fds_ancillary([read_end, write_end]))
    os.close(read_end)
    os.close(write_end)
    return read_end, write_end


def welcomed(link: Link, peer: socket.socket) -> p.ClientConnection:
    """The handshake done on ``link``'s protocol, as the trio side does before the link."""
    client = p.ClientConnection()
    hello, _ = client.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="test"))
    link.protocol.receive_data(hello)
    assert isinstance(link.protocol.next_event(), p.Hello)
    welcome, _ = link.protocol.send(
        p.Welcome(
            server_version="test",
            protocol_version=p.PROTOCOL_VERSION,
            backend="emulator",
            dsp=p.DspCapabilities(),
            limits=p.ClientLimits(priority=p.Priority.NORMAL),
            epoch=1,
        )
    )
    client.receive_data(welcome)
    assert isinstance(client.next_event(), p.Welcome)
    return client


def ping(client: p.ClientConnection, peer: socket.socket, request_id: int) -> None:
    data, _ = client.send(p.PingRequest(id=request_id))
    peer.sendall(data)


# --- fds at the edges ---------------------------------------------------------------------


def test_fds_held_for_a_frame_begun_are_closed_when_released(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner)
    send_fds(peer, p.FRAME_MAGIC)  # a frame begun, its fds waiting for the rest
    assert read(link) == []
    assert owner.closed == []
    link.release_pending_fds()
    assert len(owner.closed) == 2
    assert link.state is LinkState.RELEASED
    link.close()


def test_a_read_released_on_its_way_closes_what_it_brings(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner)
    send_fds(peer, b"\x00")
    receive = link._receive

    def released_meanwhile(buffer: bytearray) -> Any:
        got = receive(buffer)  # past the read's first check, before it takes the lock
        link.release_pending_fds()  # the connection's task ends meanwhile
        return got

    monkeypatch.setattr(link, "_receive", released_meanwhile)
    assert read(link) == []
    assert len(owner.closed) == 2
    assert link.protocol.take_pending_fds() == []  # nothing was handed to the protocol
    assert read(link) == []  # and a read after the release reads nothing
    link.close()


def test_a_read_of_a_link_dropped_on_its_way_delivers_nothing(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner)
    hello, _ = p.ClientConnection().send(
        p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="late")
    )
    send_fds(peer, hello)
    receive = link._receive

    def dropped_meanwhile(buffer: bytearray) -> Any:
        got = receive(buffer)  # past the read's first check, before it takes the lock
        link.drop("dropped by a timer meanwhile")
        return got

    monkeypatch.setattr(link, "_receive", dropped_meanwhile)
    assert read(link) == []
    assert len(owner.closed) == 2
    assert link.state is LinkState.DROPPED  # not finished while the reader held its turn
    link.check_finished()
    assert link.statistics().state is LinkState.FINISHED
    link.close()


def test_a_link_is_not_finished_while_a_worker_reads_it(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, _ = pair
    owner = Owner()
    link = link_over(sock, owner)
    assert link.take_read_turn()  # a worker inside read()
    link.drop("dropped by a timer meanwhile")
    assert owner.names() == []
    assert link.state is LinkState.DROPPED
    link.end_read_turn()
    link.check_finished()  # what the worker's _serve_read does once it lets go
    assert owner.told == [("finished", LinkState.FINISHED)]
    link.close()


# --- one reader at a time -------------------------------------------------------------------


def test_one_reader_at_a_time(pair: tuple[socket.socket, socket.socket]) -> None:
    sock, _ = pair
    link = link_over(sock, Owner())
    assert link.take_read_turn()
    other: list[bool] = []
    thread = threading.Thread(target=lambda: other.append(link.take_read_turn()))
    thread.start()
    thread.join()
    assert other == [False]
    link.end_read_turn()
    link.close()


def test_a_read_outside_the_turn_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    sock, _ = pair
    link = link_over(sock, Owner())
    with pytest.raises(LinkStateError, match="reader's turn"):
        link.read(bytearray(16))
    link.close()


# --- the life, told to the owner --------------------------------------------------------------


def test_a_half_close_answers_every_request_then_finishes(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner)
    client = welcomed(link, peer)
    ping(client, peer, 1)
    peer.shutdown(socket.SHUT_WR)
    messages = read(link) + read(link)  # the bytes, then the end of the stream
    assert [type(m) for m in messages] == [p.PingRequest, p.ConnectionClosed]
    assert link.state is LinkState.ANSWERING
    assert link.reason == "closed by the client"
    link.arrived("call 1")
    link.tell_hangup()  # a half-close is not a hang-up
    assert owner.names() == []
    assert link.send(p.PongReply(id=1))
    link.ended("call 1")
    assert owner.told == [("finished", LinkState.FINISHED)]
    client.receive_data(peer.recv(4096))
    assert isinstance(client.next_event(), p.PongReply)
    link.close()


def test_a_peer_gone_with_requests_pending_is_told_once_then_finishes(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner)
    client = welcomed(link, peer)
    ping(client, peer, 1)
    peer.close()
    messages = read(link) + read(link)
    assert isinstance(messages[-1], p.ConnectionClosed)
    link.arrived("call 1")
    link.tell_hangup()
    link.tell_hangup()
    link.drop("a timer drops it too")  # nothing more to do: it talks no more
    assert owner.told == [("hung_up", LinkState.HUNG_UP)]
    assert link.hung_up
    assert not link.send(p.PongReply(id=1))  # nobody reads it
    link.ended("call 1")
    assert owner.names() == ["hung_up", "finished"]
    link.close()


def test_a_drop_with_requests_pending_hangs_up_and_sends_nothing(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner)
    client = welcomed(link, peer)
    ping(client, peer, 1)
    read(link)
    link.arrived("call 1")
    link.drop("the test drops it")
    assert link.state is LinkState.HUNG_UP
    assert link.reason == "the test drops it"
    assert not link.send(p.PongReply(id=1))
    link.ended("call 1")
    assert owner.names() == ["hung_up", "finished"]
    assert peer.recv(4096) == b""  # shut at the drop
    link.close()


def test_a_protocol_violation_is_charged_before_the_client_is_told(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner)
    peer.sendall(b"garbage that is no frame header")
    messages = read(link)
    assert isinstance(messages[-1], p.ConnectionClosed)
    assert owner.names() == ["violated"]
    link.check_finished()  # the reader's turn is over
    assert owner.names() == ["violated", "finished"]
    assert str(owner.told[0][1]).startswith("protocol violation")
    assert peer.recv(4096).startswith(p.FRAME_MAGIC)  # its one answer
    link.close()


def test_refusals_past_the_cap_drop_the_link_as_a_violation(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner, refusals_cap=2)
    welcomed(link, peer)
    link.note_not_permitted()
    assert link.state is LinkState.READING
    link.note_not_permitted()
    assert link.statistics().state is LinkState.FINISHED  # nothing was pending
    assert owner.names() == ["violated", "finished"]
    link.note_not_permitted()  # one more changes nothing
    assert owner.names() == ["violated", "finished"]
    link.close()


def test_what_the_socket_does_not_take_waits_and_arms_the_write(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    owner = Owner()
    link = link_over(sock, owner)
    welcomed(link, peer)
    notice = p.SessionRestarted(epoch=2, reason="x" * 1000)
    while not owner.told:
        assert link.send(notice)
    assert owner.names() == ["arm_write"]
    stats = link.statistics()
    assert stats.outbox_frames >= 1
    assert stats.outbox_bytes == link.outbox_bytes > 0
    assert stats.backlog_seconds is not None
    link.drop("the test drops it")
    stats = link.statistics()
    assert (stats.outbox_frames, stats.outbox_bytes, stats.backlog_seconds) == (0, 0, None)
    link.close()


def test_the_release_is_once(pair: tuple[socket.socket, socket.socket]) -> None:
    sock, _ = pair
    link = link_over(sock, Owner())
    link.release_pending_fds()
    with pytest.raises(LinkStateError, match="released already"):
        link.release_pending_fds()
    link.close()


def test_no_request_arrives_at_a_finished_link(pair: tuple[socket.socket, socket.socket]) -> None:
    sock, _ = pair
    link = link_over(sock, Owner())
    link.drop("the test drops it")
    assert link.state is LinkState.FINISHED
    with pytest.raises(LinkStateError, match="finished link"):
        link.arrived("late call")
    link.close()


# --- statistics --------------------------------------------------------------------------------


def test_statistics_show_a_partial_frame_and_what_is_pending(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    sock, peer = pair
    link = link_over(sock, Owner())
    client = welcomed(link, peer)
    fresh = link.statistics()
    assert fresh.state is LinkState.READING
    assert (fresh.pending, fresh.outbox_frames, fresh.outbox_bytes) == (0, 0, 0)
    assert fresh.partial_frame_seconds is None
    assert fresh.reason == ""
    data, _ = client.send(p.PingRequest(id=1))
    peer.sendall(data[:-1])  # all but its last byte
    assert read(link) == []
    link.arrived("call 0")
    stats = link.statistics()
    assert stats.partial_frame_seconds is not None
    assert stats.partial_frame_seconds >= 0
    assert stats.pending == 1
    peer.sendall(data[-1:])
    assert [type(m) for m in read(link)] == [p.PingRequest]
    assert link.statistics().partial_frame_seconds is None
    link.close()
