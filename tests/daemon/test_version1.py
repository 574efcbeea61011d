"""A version 1 client, written against the version 1 text, still works (PROTOCOL.md 12).

Its hello names no version; its freed memory is never handed to anyone else while its
fd and mapping live (7.2 as version 1 wrote it); everything it used is still served.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import npu_protocol as p
from tests.daemon.wire import ECHO_URI, RawPeer, serve_daemon


async def allocated(peer: RawPeer, request_id: int, size: int) -> tuple[int, int]:
    """(buffer id, fd) of a new buffer."""
    await peer.write(p.AllocRequest(id=request_id, size=size))
    reply = await peer.next()
    assert isinstance(reply, p.AllocReply), reply
    return reply.buffer, peer.fds[-1]


async def test_a_hello_without_a_version_is_welcomed_as_version_1(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock", version=None)
        assert peer.welcome is not None
        assert peer.welcome.protocol_version == 1
        peer.close()


async def test_a_version_1_clients_freed_memory_is_never_reused(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path, "[pool]\nshare = 'user'\n"):
        peer = await RawPeer.connect(tmp_path / "npud.sock", "old-tool", version=None)
        first, fd = await allocated(peer, 1, 8192)
        view = mmap.mmap(fd, 8192)
        view[:8] = b"mine-v1!"
        await peer.write(p.FreeRequest(id=2, buffer=first))
        assert isinstance(await peer.next(), p.FreeReply)
        inode = os.fstat(fd).st_ino
        # The same connection, and another of the same user (share = "user"), allocate.
        other = await RawPeer.connect(tmp_path / "npud.sock", "new-tool")
        for client in (peer, other):
            _, again = await allocated(client, 3, 8192)
            assert os.fstat(again).st_ino != inode
            assert mmap.mmap(again, 8192)[:8] == bytes(8)
        assert view[:8] == b"mine-v1!"  # still the client's own
        view.close()
        other.close()
        peer.close()


async def test_a_version_1_client_invokes_as_it_always_did(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock", version=None)
        await peer.write(p.OpenRequest(id=1, uri=ECHO_URI))
        opened = await peer.next()
        assert isinstance(opened, p.OpenReply)
        await peer.write(
            p.InvokeRequest(
                id=2,
                handle=opened.handle,
                method=2,
                inputs=(p.InlineInput(data=struct.pack("<II", 3, 3)), p.InlineInput(data=b"abc")),
                outputs=(p.InlineOutput(capacity=3),),
            )
        )
        reply = await peer.next()
        assert reply == p.InvokeReply(id=2, outputs=(b"abc",))
        peer.close()


async def test_a_later_versions_request_is_unsupported_on_a_version_1_connection(
    tmp_path: Path,
) -> None:
    """Not MODEL_NOT_LOADED as if the request were understood: UNSUPPORTED, saying a later
    version brought it; the connection goes on."""
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock", version=None)
        await peer.write(p.ModelInfoRequest(id=1, model=1), p.PingRequest(id=2))
        refusal, pong = await peer.answers(2)
        assert isinstance(refusal, p.ErrorMessage)
        assert refusal.error_code is p.ErrorCode.UNSUPPORTED
        assert refusal.message == (
            "not supported: model_info on this connection: it came with a later protocol"
            " version than this connection speaks; offer that version in the hello"
        )
        assert pong == p.PongReply(id=2)
        peer.close()
