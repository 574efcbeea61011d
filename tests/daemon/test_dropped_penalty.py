"""A user npud keeps dropping pays as a user whose calls hang does (issue 27).

The review: a user reconnected after each drop for too many stray fds, 1768 times in
10 s, and looped on a refused ``npu_test.fault``, 63k times in 10 s; both cost npud and
the other users more than their share. Now a connection dropped for breaking the
protocol counts against its uid (``[daemon] dropped_connections_before_refusal``,
shipped as 3): past that its new connections are refused for
``dropped_connection_penalty_s``; and a connection refused NOT_PERMITTED
``refused_requests_before_drop`` times is such a drop.
"""

from __future__ import annotations

import contextlib
import os
import struct
from pathlib import Path

import trio

import npu_protocol as p
from npu_client.transport import fds_ancillary
from tests.daemon.test_user_domains import TEST_URI, answer, said, shipped_daemon
from tests.e2e.daemon import RawPeer
from tests.users import ATTACKER, VICTIM, as_user

REFUSED = (
    f"not permitted: 3 connections of uid {ATTACKER} were dropped for breaking the "
    "protocol; its new connections are refused for 60 s more"
)


def refused_or_welcomed(peer: RawPeer) -> str:
    """A Hello on ``peer``: "welcomed", or what npud said instead."""
    peer.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="again"))
    told = peer.receive()
    if isinstance(told, p.Welcome):
        return "welcomed"
    return told.message if isinstance(told, p.ErrorMessage) else repr(told)


def flood_stray_fds(conn: RawPeer) -> str:
    """The bench's stray_fds_loop, one connection: a frame that never ends, 4 fds on
    each byte, until npud drops it; what it said."""
    conn.hello("strayfds")
    conn.sock.sendall(b"NP\x00\x00" + struct.pack("<I", 1 << 16))
    for _ in range(1 << 16):
        fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(4)]
        try:
            conn.sock.sendmsg([b"\x80"], fds_ancillary(fds))
        except OSError:
            break
        finally:
            for fd in fds:
                os.close(fd)
    told = conn.receive()
    return said(told) if isinstance(told, p.ErrorMessage) else repr(told)


def stray_fds_loop(peer: RawPeer) -> bytes:
    """Three connections dropped for stray fds, then a fourth Hello."""
    told = []
    for n in range(3):
        conn = peer if n == 0 else peer.again()  # type: ignore[attr-defined]
        told.append(flood_stray_fds(conn))
        conn.close()
    told.append(refused_or_welcomed(peer.again()))  # type: ignore[attr-defined]
    return "\n".join(told).encode()


def victim_hello(peer: RawPeer) -> bytes:
    return refused_or_welcomed(peer).encode()


async def test_a_user_dropped_for_stray_fds_again_and_again_is_refused(tmp_path: Path) -> None:
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(tmp_path) as daemon:
        told = await trio.to_thread.run_sync(lambda: as_user(ATTACKER, socket_path, stray_fds_loop))
        *drops, fourth = told.decode().splitlines()
        assert len(drops) == 3, told
        assert all(drop.startswith("QUOTA_EXCEEDED") for drop in drops), drops
        assert fourth == REFUSED
        # Another user is not touched by the attacker's penalty.
        victim = await trio.to_thread.run_sync(lambda: as_user(VICTIM, socket_path, victim_hello))
        assert victim == b"welcomed"
        assert daemon.broker.dropped.refused(VICTIM, 3) is None


def fatal_frames(peer: RawPeer) -> bytes:
    """Two connections that each send a frame of bad magic, then two more Hellos: the
    third connection is the last one welcomed."""
    told = []
    for n in range(3):
        conn = peer if n == 0 else peer.again()  # type: ignore[attr-defined]
        if n < 2:
            conn.hello(f"fatal-{n}")
            conn.sock.sendall(b"XX\x00\x00" + struct.pack("<I", 16))
            error = conn.receive()
            told.append(said(error) if isinstance(error, p.ErrorMessage) else repr(error))
        else:  # a fatal frame before its Hello counts too (the client's protocol object
            # takes no error before its Hello: read the bytes until npud closes)
            conn.sock.sendall(b"XX\x00\x00" + struct.pack("<I", 16))
            while conn.sock.recv(4096):
                pass
            told.append("bad frame before the Hello: closed")
        conn.close()
    told.append(refused_or_welcomed(peer.again()))  # type: ignore[attr-defined]
    return "\n".join(told).encode()


async def test_fatal_frames_count_against_their_user(tmp_path: Path) -> None:
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(tmp_path):
        told = await trio.to_thread.run_sync(lambda: as_user(ATTACKER, socket_path, fatal_frames))
        *drops, fourth = told.decode().splitlines()
        assert len(drops) == 3, told
        assert all(drop.startswith(("BAD_FRAME_HEADER", "bad frame")) for drop in drops), drops
        assert fourth == REFUSED


async def test_drops_below_the_threshold_refuse_nothing(tmp_path: Path) -> None:
    """Two drops of the shipped three: the user's next Hello is welcomed."""

    def two_drops(peer: RawPeer) -> bytes:
        for n in range(2):
            conn = peer if n == 0 else peer.again()  # type: ignore[attr-defined]
            conn.hello(f"fatal-{n}")
            conn.sock.sendall(b"XX\x00\x00" + struct.pack("<I", 16))
            conn.receive()
            conn.close()
        return refused_or_welcomed(peer.again()).encode()  # type: ignore[attr-defined]

    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(tmp_path):
        told = await trio.to_thread.run_sync(lambda: as_user(ATTACKER, socket_path, two_drops))
        assert told == b"welcomed"


def fault_loop(peer: RawPeer) -> bytes:
    """npu_test.fault in a loop on one connection, until npud closes it: the answers
    counted by what they said, then a Hello on a new connection."""
    peer.hello("fault-loop")
    opened = answer(peer, p.OpenRequest(id=peer.next_id(), uri=TEST_URI))
    assert isinstance(opened, p.OpenReply), opened
    counts: dict[str, int] = {}
    for _ in range(1000):
        with contextlib.suppress(BrokenPipeError):  # dropped: what it said is still read
            peer.send(p.InvokeRequest(id=peer.next_id(), handle=opened.handle, method=5))
        told = peer.receive()
        key = (
            said(told)
            if isinstance(told, p.ErrorMessage) and told.id is None
            else (type(told).__name__ if not isinstance(told, p.ErrorMessage) else "refused")
        )
        counts[key] = counts.get(key, 0) + 1
        if isinstance(told, p.ConnectionClosed) or key != "refused":
            break
    lines = [f"{n} {what}" for what, n in counts.items()]
    return "\n".join(lines).encode()


async def test_a_connection_refused_not_permitted_again_and_again_is_dropped(
    tmp_path: Path,
) -> None:
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(tmp_path) as daemon:
        told = await trio.to_thread.run_sync(lambda: as_user(ATTACKER, socket_path, fault_loop))
        refused, closing = told.decode().splitlines()
        assert refused == "64 refused", told  # each answered, then the closing error
        assert closing.startswith(
            "1 NOT_PERMITTED: not permitted: 64 requests of this connection were refused "
            "NOT_PERMITTED ([daemon] refused_requests_before_drop); closing"
        ), closing
        assert all(domain.restarts == 0 for domain in daemon.broker.domains)
        await trio.sleep(0)
        assert daemon.broker.dropped.throttle_left(ATTACKER) > 0
