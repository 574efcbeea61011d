"""A pipelining client can rely on order (PROTOCOL.md section 6), over a real socket.

Every test writes its requests in one write, so the daemon reads them together
and nothing but the protocol's ordering rules keeps them apart.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import npu_protocol as p
from npu_protocol import ErrorCode
from tests.daemon.wire import ECHO_URI, TEST_URI, RawPeer, busy, echo_slice, serve_daemon


def error_code(message: p.ServerMessage) -> ErrorCode | None:
    assert isinstance(message, p.ErrorMessage), message
    return message.error_code


async def opened(peer: RawPeer, request_id: int, uri: str) -> int:
    await peer.write(p.OpenRequest(id=request_id, uri=uri))
    reply = await peer.next()
    assert isinstance(reply, p.OpenReply), reply
    return reply.handle


async def allocated(peer: RawPeer, request_id: int, size: int) -> int:
    await peer.write(p.AllocRequest(id=request_id, size=size))
    reply = await peer.next()
    assert isinstance(reply, p.AllocReply), reply
    return reply.buffer


async def test_close_after_a_running_invoke_waits_for_it(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(busy(2, handle, 100_000), p.CloseRequest(id=3, handle=handle))
        first, second = await peer.answers(2)
        assert first == p.InvokeReply(id=2)  # not UNKNOWN_HANDLE
        assert second == p.CloseReply(id=3)  # and the close answers after it
        await peer.write(busy(4, handle, 1))
        assert error_code(await peer.next()) is ErrorCode.UNKNOWN_HANDLE
        peer.close()


async def test_free_after_an_invoke_using_the_buffer_waits_for_it(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, ECHO_URI)
        slow = await opened(peer, 2, TEST_URI)
        buffer = await allocated(peer, 3, 4096)
        await peer.write(
            busy(4, slow, 100_000),  # keeps a lane busy: the echo below waits behind it
            echo_slice(5, handle, buffer, 16),
            p.FreeRequest(id=6, buffer=buffer),
        )
        answers = {a.id: a for a in await peer.answers(3)}  # type: ignore[union-attr]
        assert isinstance(answers[5], p.InvokeReply), answers[5]
        assert answers[6] == p.FreeReply(id=6)
        peer.close()


async def test_the_free_answers_after_the_invoke(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, ECHO_URI)
        buffer = await allocated(peer, 2, 4096)
        for round_ in range(20):
            base = 10 + 2 * round_
            await peer.write(
                echo_slice(base, handle, buffer, 64), p.FreeRequest(id=base + 1, buffer=buffer)
            )
            first, second = await peer.answers(2)
            assert isinstance(first, p.InvokeReply), first
            assert first.id == base
            assert second == p.FreeReply(id=base + 1)
            buffer = await allocated(peer, base, 4096)
        peer.close()


async def test_a_request_after_a_free_finds_the_buffer_gone(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, ECHO_URI)
        buffer = await allocated(peer, 2, 4096)
        await peer.write(p.FreeRequest(id=3, buffer=buffer), echo_slice(4, handle, buffer, 8))
        answers = {a.id: a for a in await peer.answers(2)}  # type: ignore[union-attr]
        assert answers[3] == p.FreeReply(id=3)
        refusal = answers[4]
        assert error_code(refusal) is ErrorCode.UNKNOWN_BUFFER
        assert isinstance(refusal, p.ErrorMessage)
        assert refusal.message == f"unknown buffer {buffer}"  # its own id, nothing else
        peer.close()


async def test_ids_created_earlier_in_the_same_write_are_waited_for(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        # One id space, in arrival order: the alloc gets 1, the open 2.
        await peer.write(
            p.AllocRequest(id=1, size=4096),
            p.OpenRequest(id=2, uri=ECHO_URI),
            echo_slice(3, 2, 1, 32),
            p.MapRequest(id=4, buffer=1),
        )
        answers = {a.id: a for a in await peer.answers(4)}  # type: ignore[union-attr]
        assert isinstance(answers[1], p.AllocReply)
        assert answers[1].buffer == 1
        assert answers[2] == p.OpenReply(id=2, handle=2)
        assert isinstance(answers[3], p.InvokeReply), answers[3]
        assert isinstance(answers[4], p.MapReply), answers[4]
        peer.close()


async def test_an_id_whose_creation_failed_is_unknown(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        await peer.write(
            p.OpenRequest(id=1, uri="file:///libnone_skel.so?none_skel_handle_invoke"),
            busy(2, 1, 1),
        )
        answers = {a.id: a for a in await peer.answers(2)}  # type: ignore[union-attr]
        assert error_code(answers[1]) is ErrorCode.OPEN_FAILED
        assert error_code(answers[2]) is ErrorCode.UNKNOWN_HANDLE
        peer.close()


async def test_a_handle_id_is_not_a_buffer_id(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(p.FreeRequest(id=2, buffer=handle), p.MapRequest(id=3, buffer=handle))
        answers = {a.id: a for a in await peer.answers(2)}  # type: ignore[union-attr]
        assert error_code(answers[2]) is ErrorCode.UNKNOWN_BUFFER
        assert error_code(answers[3]) is ErrorCode.UNKNOWN_BUFFER
        await peer.write(busy(4, handle, 1))  # the handle itself is untouched
        assert await peer.next() == p.InvokeReply(id=4)
        peer.close()


async def test_unknown_ids_name_the_requesters_own_id(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        await peer.write(
            busy(1, 4, 1),
            p.CloseRequest(id=2, handle=4),
            p.UnmapRequest(id=3, buffer=9),
            echo_slice(4, 4, 9, 1),
        )
        answers = {a.id: a for a in await peer.answers(4)}  # type: ignore[union-attr]
        messages = {i: a.message for i, a in answers.items() if isinstance(a, p.ErrorMessage)}
        assert messages == {
            1: "unknown remote handle 4",
            2: "unknown remote handle 4",
            3: "unknown buffer 9",
            4: "unknown remote handle 4",
        }
        peer.close()


@pytest.mark.parametrize("size", [5000, 4096, 1])
async def test_a_slice_may_use_every_allocated_byte(tmp_path: Path, size: int) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, ECHO_URI)
        await peer.write(p.AllocRequest(id=2, size=size))
        reply = await peer.next()
        assert isinstance(reply, p.AllocReply)
        assert reply.size % 4096 == 0
        assert reply.size >= size
        tail = p.InvokeRequest(
            id=3,
            handle=handle,
            method=2,
            inputs=(
                p.InlineInput(data=struct.pack("<II", 8, 8)),
                p.BufferSlice(buffer=reply.buffer, offset=reply.size - 8, length=8),
            ),
            outputs=(p.InlineOutput(capacity=8),),
        )
        await peer.write(tail, p.StatusRequest(id=4))
        answers = {a.id: a for a in await peer.answers(2)}  # type: ignore[union-attr]
        assert isinstance(answers[3], p.InvokeReply), answers[3]
        status = answers[4]
        assert isinstance(status, p.StatusReply)
        assert status.status.totals.bytes == reply.size  # the one size, everywhere
        peer.close()


async def test_during_shutdown_releases_status_and_ping_are_still_served(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path, "[daemon]\nshutdown_grace_s = 5\n") as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        buffer = await allocated(peer, 2, 4096)
        # The busy call holds the daemon in its grace period; the pong proves it arrived.
        await peer.write(busy(3, handle, 400_000), p.PingRequest(id=10))
        assert await peer.next() == p.PongReply(id=10)
        daemon.stop()
        assert isinstance(await peer.next(), p.ShuttingDown)
        await peer.write(
            p.PingRequest(id=4, payload=b"still there?"),
            p.StatusRequest(id=5),
            p.FreeRequest(id=6, buffer=buffer),
            p.AllocRequest(id=7, size=4096),
            p.OpenRequest(id=8, uri=ECHO_URI),
            busy(9, handle, 1),
        )
        answers = {a.id: a for a in await peer.answers(7)}  # type: ignore[union-attr]
        assert answers[3] == p.InvokeReply(id=3)
        assert answers[4] == p.PongReply(id=4, payload=b"still there?")
        assert isinstance(answers[5], p.StatusReply)
        assert answers[6] == p.FreeReply(id=6)
        for refused in (7, 8, 9):
            assert error_code(answers[refused]) is ErrorCode.SHUTTING_DOWN
        peer.close()
