"""The fds a client sends: at most a frame's four per sendmsg, closed where a close that
blocks holds up no one else, and a user whose fds pile up waiting to be closed is
dropped (issue 16, item 2)."""

from __future__ import annotations

import array
import os
import socket
import threading
from pathlib import Path

import msgspec
import pytest
import trio

import npu_protocol as p
from npu_protocol import ErrorCode
from npu_protocol._framing import encode_frame_header
from npud.daemon.server import Daemon
from npud.datapath.link import Link
from npud.datapath.link_states import TALKING
from npud.runtime import closer as closer_module
from tests.daemon.wire import RawPeer, serve_daemon


async def send_with_fds(peer: RawPeer, message: p.ClientMessage, count: int) -> None:
    """``message`` framed as carrying no fds, sent in one sendmsg with ``count`` fds (of
    /dev/null; ours are closed once the kernel took its own references)."""
    frame, _ = peer.protocol.send(message)
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
    try:
        rights = array.array("i", fds).tobytes()
        await peer.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
    finally:
        for fd in fds:
            os.close(fd)


async def send_bytes_with_fds(peer: RawPeer, data: bytes | bytearray, count: int) -> None:
    """``data`` in one sendmsg with ``count`` fds of /dev/null (ours closed after)."""
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
    try:
        rights = array.array("i", fds).tobytes()
        await peer.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
    finally:
        for fd in fds:
            os.close(fd)


async def next_or_closed(peer: RawPeer) -> p.ServerMessage | None:
    """The next message, or None once the daemon closed the connection."""
    while True:
        event = peer.protocol.next_event()
        if isinstance(event, p.ConnectionClosed):
            return None
        if event is not p.NEED_DATA and not isinstance(event, p.StrayFds):
            return event
        data = await peer.sock.recv(65536)
        peer.protocol.receive_data(data, [])


async def connected(tmp_path: Path) -> RawPeer:
    """A peer past its Welcome and one round trip: the daemon's side of it is all set up
    (its link's own fds too) before anyone counts fds."""
    peer = await RawPeer.connect(tmp_path / "npud.sock")
    await peer.write(p.PingRequest(id=100))
    assert isinstance(await peer.next(), p.PongReply)
    return peer


def daemon_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def settled_fds(daemon: Daemon, expected: int) -> None:
    with trio.fail_after(10):
        while daemon.broker.device.peer_fds.pending() or daemon_fds() > expected:
            await trio.sleep(0.01)


async def test_more_fds_than_a_frame_may_carry_are_fatal(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        peer = await connected(tmp_path)
        before = daemon_fds()
        await send_with_fds(peer, p.PingRequest(id=1), 5)
        error = await next_or_closed(peer)
        assert isinstance(error, p.ErrorMessage)
        assert error.error_code is ErrorCode.FDS_TRUNCATED
        assert await next_or_closed(peer) is None
        peer.close()
        await settled_fds(daemon, before - 1)  # the connection's own socket went too


async def test_four_stray_fds_are_closed_and_the_connection_lives(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        peer = await connected(tmp_path)
        before = daemon_fds()
        await send_with_fds(peer, p.PingRequest(id=1), 4)
        pong = await next_or_closed(peer)
        assert isinstance(pong, p.PongReply)
        await settled_fds(daemon, before)
        assert daemon.broker.device.peer_fds.closed >= 4
        peer.close()


async def test_a_user_whose_fds_pile_up_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closes that block (a FUSE file's, say) hold up that user's closing thread: past
    the cap of fds waiting, the connection that sends more is dropped with
    QUOTA_EXCEEDED, and the fds are closed once the closes unblock."""
    release = threading.Event()
    real = closer_module.close_now

    def blocked(fd: int) -> None:
        release.wait(30)
        real(fd)

    monkeypatch.setattr(closer_module, "close_now", blocked)
    async with serve_daemon(tmp_path, "[uid_limits]\nmax_fds_waiting = 8\n") as daemon:
        peer = await connected(tmp_path)
        before = daemon_fds()
        answers: list[p.ServerMessage | None] = []
        for index in range(3):  # 4, 8 (at the cap), 12 waiting: dropped
            await send_with_fds(peer, p.PingRequest(id=index + 1), 4)
            answers.append(await next_or_closed(peer))
        assert [type(a) for a in answers[:2]] == [p.PongReply, p.PongReply]
        refusal = answers[2]
        assert isinstance(refusal, p.ErrorMessage)
        assert refusal.error_code is ErrorCode.QUOTA_EXCEEDED
        assert "fds this user sent that wait to be closed" in refusal.message
        assert await next_or_closed(peer) is None
        assert daemon.broker.device.peer_fds.pending() == 12
        release.set()
        peer.close()
        await settled_fds(daemon, before - 1)


async def test_fds_piling_up_before_the_hello_are_refused_with_quota_exceeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stray fds that take the user past ``max_fds_waiting`` before its Hello: the
    handshake says why (QUOTA_EXCEEDED, as the data path does) and then closes; it used
    to close without a word."""
    release = threading.Event()
    real = closer_module.close_now

    def blocked(fd: int) -> None:
        release.wait(30)
        real(fd)

    monkeypatch.setattr(closer_module, "close_now", blocked)
    async with serve_daemon(tmp_path, "[uid_limits]\nmax_fds_waiting = 8\n") as daemon:
        before = daemon_fds()
        first = await connected(tmp_path)
        for index in range(2):  # 8 of this user's fds wait: at the cap
            await send_with_fds(first, p.PingRequest(id=index + 1), 4)
            assert isinstance(await next_or_closed(first), p.PongReply)
        late = RawPeer(trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        await late.sock.connect(str(tmp_path / "npud.sock"))
        hello, _ = late.protocol.send(p.Hello(client_name="late"))
        await late.sock.send(hello[:9])  # its header and a byte: the Hello is on its way
        # Then its next bytes one at a time with 4 fds each: inside a frame that claims
        # none, they are stray as they come (the first may share the header's recvmsg and
        # be held for the frame; the kernel never joins two sends that carry fds).
        for offset in (9, 10):
            try:
                await send_bytes_with_fds(late, hello[offset : offset + 1], 4)
            except OSError:  # refused and closed already
                break
        refusal = await next_or_closed(late)
        assert isinstance(refusal, p.ErrorMessage), refusal
        assert refusal.id is None
        assert refusal.error_code is ErrorCode.QUOTA_EXCEEDED
        assert refusal.message == (
            "fds this user sent that wait to be closed quota exceeded: the limit is 8"
        )
        assert refusal.fields == {
            "resource": "fds this user sent that wait to be closed",
            "limit": 8,
        }
        assert await next_or_closed(late) is None
        assert daemon.broker.device.peer_fds.pending() in (12, 16)  # 8, and one or both sends
        release.set()
        late.close()
        first.close()
        await settled_fds(daemon, before)  # both connections' sockets and every fd sent


def ping_frames(first_id: int, count: int) -> bytes:
    """Ping frames made by hand: a hostile client is no npu_protocol connection, and
    counts no requests in flight."""
    payload = b"x" * p.MAX_PING_PAYLOAD
    frames = []
    for request_id in range(first_id, first_id + count):
        body = msgspec.msgpack.encode(p.PingRequest(id=request_id, payload=payload))
        frames.append(encode_frame_header(len(body), 0) + body)
    return b"".join(frames)


async def test_a_client_that_reads_no_replies_is_dropped_at_the_bound(tmp_path: Path) -> None:
    """Pings sent 16 at a time (the most in flight), each batch once the daemon answered
    the last, none of the replies read: they wait in npud's outbox only up to its
    bound, then the connection is dropped and what waited is let go (issue 16, item 10;
    npud grew by 66 MiB before)."""
    async with serve_daemon(tmp_path) as daemon:
        peer = await connected(tmp_path)
        link = next(iter(daemon.broker.datapath._links.values()))
        base = link.protocol.statistics().frames_received
        sent = 0
        with trio.fail_after(60):
            try:
                while link.state in TALKING:
                    view = memoryview(ping_frames(1000 + sent, 16))
                    while view:
                        view = view[await peer.sock.send(view) :]
                    sent += 16
                    while link.state in TALKING and not answered(link, base + sent):
                        await trio.sleep(0.001)  # the daemon's worker reads and answers
                    assert link.outbox_bytes <= link.outbox_bound
            except OSError:
                pass  # the daemon shut the connection down under the write
        assert sent * p.MAX_PING_PAYLOAD > link.outbox_bound
        assert link.outbox_bytes == 0
        await settle_clients(daemon)
        peer.close()


def answered(link: Link, frames: int) -> bool:
    """The daemon read ``frames`` frames of the link and answered every one."""
    stats = link.protocol.statistics()
    return stats.frames_received >= frames and not stats.requests_in_flight


async def settle_clients(daemon: Daemon) -> None:
    with trio.fail_after(10):
        while daemon.broker.status().totals.clients:
            await trio.sleep(0.01)
