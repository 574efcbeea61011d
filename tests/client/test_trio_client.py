"""The trio client against the same real protocol peer (pytest-trio, trio_mode)."""

from __future__ import annotations

import pathlib
import struct
import zlib

import pytest
import trio
import trio.testing

import npu_client
import npu_protocol as p
from npu_client import _requests, trio_client
from npu_protocol.aee import AEE
from tests.client.conftest import open_fds
from tests.client.peer import (
    ECHO_URI,
    HANDLED,
    TEST_URI,
    Hold,
    HoldThenReverse,
    Peer,
    PeerConnection,
    raw_frame,
    serve_once,
)


async def test_every_method(peer: Peer) -> None:
    before = open_fds()
    async with npu_client.open_trio_client(peer.path, name="trio", priority="background") as npu:
        assert isinstance(npu, trio_client.TrioClient)
        assert npu.priority is p.Priority.BACKGROUND
        assert (npu.server_version, npu.backend, npu.epoch) == ("0.1.0-peer", "emulator", 1)
        assert npu.dsp.arch_ver == 0x73
        assert await npu.ping(b"hi") == b"hi"
        assert (await npu.status()).clients[0].name == "trio"
        async with await npu.alloc(5000) as buffer:
            assert (buffer.id, buffer.size) == (1, 8192)
            address = await buffer.map()
            assert await buffer.map() == address == buffer.dsp_address
            data = bytes(range(256)) * 4
            buffer.view()[:1024] = data
            async with await npu.open(ECHO_URI) as echo:
                [out] = await echo.invoke(2, [struct.pack("<II", 3, 3), b"abc"], [3])
                assert out == b"abc"
                result = await echo.invoke(
                    2,
                    [struct.pack("<II", 1024, 1024), buffer.slice(0, 1024)],
                    [buffer.slice(4096, 1024)],
                )
                assert result == [None]
                assert bytes(buffer.view()[4096 : 4096 + 1024]) == data
            assert echo.closed
            async with await npu.open(TEST_URI) as skel:
                [crc] = await skel.invoke(3, [struct.pack("<I", 1024), buffer.slice(0, 1024)], [4])
                assert crc is not None
                assert struct.unpack("<I", crc)[0] == zlib.crc32(data)
            await buffer.unmap()
            assert buffer.dsp_address is None
        assert buffer.freed
        assert npu.buffers == ()
        stats = npu.statistics()
        assert stats.connection.fds_received == 1
    assert npu.closed
    peer.wait_closed()
    assert open_fds() == before


async def test_connect_and_close_without_a_context_manager(peer: Peer) -> None:
    npu = await trio_client.connect(peer.path, name="plain")
    buffer = await npu.alloc(4096)
    await npu.close()
    await npu.aclose()  # idempotent
    assert buffer.freed
    with pytest.raises(npu_client.ConnectionClosedError, match="this client was closed"):
        await npu.ping()


async def test_tasks_pipeline_and_get_their_answers_out_of_order(peer: Peer) -> None:
    holder = HoldThenReverse(6, kinds=(p.PingRequest, p.AllocRequest))
    peer.intercept = holder
    results: dict[int, object] = {}
    async with npu_client.open_trio_client(peer.path, name="tasks") as npu:

        async def ping(index: int) -> None:
            results[index] = await npu.ping(bytes([index]))

        async def alloc(index: int) -> None:
            buffer = await npu.alloc(4096 * index)
            results[index] = buffer.size
            await buffer.free()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for index in range(3):
                    nursery.start_soon(ping, index)
                for index in range(3, 6):
                    nursery.start_soon(alloc, index)
    assert holder.most_held == 6
    assert results == {0: b"\x00", 1: b"\x01", 2: b"\x02", 3: 12288, 4: 16384, 5: 20480}


async def test_errors_map_to_their_classes(peer: Peer) -> None:
    def refuse(conn: PeerConnection, request: p.AnyRequest) -> object:
        if isinstance(request, p.AllocRequest):
            return p.ErrorMessage.for_code(
                p.ErrorCode.QUOTA_EXCEEDED, id=request.id, resource="buffers", limit=1
            )
        return None

    peer.intercept = refuse
    async with npu_client.open_trio_client(peer.path, name="errors") as npu:
        with pytest.raises(
            npu_client.QuotaExceeded, match="buffers quota exceeded: the limit is 1"
        ):
            await npu.alloc(4096)
        async with await npu.open(ECHO_URI) as echo:
            with pytest.raises(npu_client.InvokeFailed) as caught:
                await echo.invoke(2, [struct.pack("<II", 9, 9), b"x"], [9])
        assert caught.value.fields["code"] == AEE.EBADPARM.dsp
        with pytest.raises(npu_client.OpenFailed):
            await npu.open("file:///libmissing_skel.so")


async def test_bad_inputs_are_refused_before_sending(peer: Peer) -> None:
    async with npu_client.open_trio_client(peer.path, name="bad") as npu:
        with pytest.raises(ValueError, match="size must be between 1 and"):
            await npu.alloc(-1)
        buffer = await npu.alloc(4096)
        with pytest.raises(ValueError, match="outside buffer 1 of 4096 bytes"):
            buffer.slice(4000, 200)
        async with await npu.open(ECHO_URI) as echo:
            with pytest.raises(TypeError, match="wrap a single one"):
                await echo.invoke(2, b"abc")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="exactly one of method and sc"):
                await echo.invoke(2, sc=0x02000000)
        sent = len(peer.connection().requests)
        with pytest.raises(ValueError, match="not allowed"):
            await npu.open("has space")
        assert len(peer.connection().requests) == sent


async def test_events_are_recorded_and_old_buffers_kept_unmapped(peer: Peer) -> None:
    seen: list[p.ServerEvent] = []
    async with npu_client.open_trio_client(peer.path, name="events", on_event=seen.append) as npu:
        buffer = await npu.alloc(4096)
        await buffer.map()
        peer.broadcast(p.SessionRestarted(epoch=3, reason="SSR"))
        await npu.ping()
        assert npu.epoch == 3
        assert seen == [p.SessionRestarted(epoch=3, reason="SSR")]
        assert not buffer.freed
        assert buffer.dsp_address is None
        await buffer.free()


async def test_events_are_recorded_and_old_buffers_released_with_version_2(peer: Peer) -> None:
    peer.protocol_version = 2
    seen: list[p.ServerEvent] = []
    async with npu_client.open_trio_client(peer.path, name="events", on_event=seen.append) as npu:
        buffer = await npu.alloc(4096)
        peer.broadcast(p.SessionRestarted(epoch=3, reason="SSR"))
        peer.broadcast(p.ShuttingDown(reason="stop"))
        await npu.ping()
        assert npu.epoch == 3
        assert npu.shutting_down
        assert npu.shutdown_notice == p.ShuttingDown(reason="stop")
        assert seen == [p.SessionRestarted(epoch=3, reason="SSR"), p.ShuttingDown(reason="stop")]
        assert buffer.freed
        with pytest.raises(npu_client.DspRestarted):
            await npu._run(_requests.discard(buffer.id))


async def test_a_server_that_closes_mid_request_fails_every_waiter(peer: Peer) -> None:
    before = open_fds()
    hold = Hold(p.StatusRequest)

    def hang_up_on_invoke(conn: PeerConnection, request: p.AnyRequest) -> object:
        if isinstance(request, p.InvokeRequest):
            conn.hang_up()
            return HANDLED
        return hold(conn, request)

    peer.intercept = hang_up_on_invoke
    failures: list[str] = []
    async with npu_client.open_trio_client(peer.path, name="abandoned") as npu:
        buffer = await npu.alloc(4096)
        echo = await npu.open(ECHO_URI)

        async def status() -> None:
            with pytest.raises(npu_client.ConnectionClosedError) as caught:
                await npu.status()
            failures.append(caught.value.message)

        async def invoke() -> None:
            await trio.to_thread.run_sync(hold.wait_held)
            with pytest.raises(npu_client.ConnectionClosedError) as caught:
                await echo.invoke(2, [struct.pack("<II", 1, 1), buffer.slice(0, 1)], [1])
            failures.append(caught.value.message)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(status)
                nursery.start_soon(invoke)
        assert failures == ["the connection is closed: npud closed the connection"] * 2
        with pytest.raises(npu_client.ConnectionClosedError):
            await npu.ping()
    assert buffer.freed
    peer.wait_closed()
    assert open_fds() == before


async def test_a_cancelled_call_drops_its_answer_and_its_fd(peer: Peer) -> None:
    before = open_fds()
    hold = Hold(p.AllocRequest)
    peer.intercept = hold
    async with npu_client.open_trio_client(peer.path, name="cancel") as npu:
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:

                async def alloc() -> None:
                    await npu.alloc(4096)

                nursery.start_soon(alloc)
                await trio.to_thread.run_sync(hold.wait_held)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
        peer.intercept = None
        hold.release()  # the late answer arrives with its fd
        assert await npu.ping(b"after") == b"after"
        assert npu.buffers == ()
        assert npu.statistics().requests_in_flight == 0
    peer.wait_closed()
    assert open_fds() == before


async def test_a_refusal_before_the_hello_is_read_still_names_its_reason(socket_path: str) -> None:
    refusal = p.ErrorMessage.for_code(p.ErrorCode.NOT_PERMITTED, detail="uid 65534 is not allowed")
    thread = serve_once(socket_path, raw_frame(refusal), read_hello=False)
    with pytest.raises(npu_client.NotPermitted, match="uid 65534 is not allowed"):
        await trio_client.connect(socket_path, name="stranger")
    await trio.to_thread.run_sync(thread.join, 30)


async def test_a_refused_hello_and_an_unreachable_daemon(peer: Peer, socket_path: str) -> None:
    peer.refusal = p.ErrorMessage.for_code(p.ErrorCode.NOT_PERMITTED, detail="not on the list")
    with pytest.raises(npu_client.NotPermitted, match="not permitted: not on the list"):
        await trio_client.connect(peer.path, name="stranger")
    with pytest.raises(npu_client.ConnectFailed, match="is npud running"):
        await trio_client.connect(socket_path + ".missing")
    directory = str(pathlib.Path(socket_path).parent)
    with pytest.raises(npu_client.ConnectFailed, match="it is a directory, not a socket") as caught:
        await trio_client.connect(directory)
    assert "NPUD_SOCKET" not in caught.value.message


async def test_a_request_to_a_daemon_that_already_left_fails_with_its_reason(peer: Peer) -> None:
    async with npu_client.open_trio_client(peer.path, name="late") as npu:
        conn = peer.connection()
        conn.send(p.ErrorMessage.for_code(p.ErrorCode.SHUTTING_DOWN))
        conn.hang_up()
        assert await trio.to_thread.run_sync(conn.closed.wait, 30)
        with pytest.raises(npu_client.ShuttingDownError, match="npud is shutting down"):
            await npu.ping()
        with pytest.raises(npu_client.ShuttingDownError):
            await npu.status()


async def test_answers_larger_than_the_receive_buffer_arrive_whole(peer: Peer) -> None:
    data = bytes(range(256)) * 1200  # 300 KiB: several reads of the client's 64 KiB buffer
    async with (
        npu_client.open_trio_client(peer.path, name="big") as npu,
        await npu.open(ECHO_URI) as echo,
    ):
        for size in (65_536, len(data)):
            [out] = await echo.invoke(2, [struct.pack("<II", size, size), data[:size]], [size])
            assert out == data[:size]


async def test_tasks_beyond_the_in_flight_limit_wait_for_a_free_slot(socket_path: str) -> None:
    limits = p.ClientLimits(priority=p.Priority.NORMAL, max_in_flight=2)
    with Peer(socket_path, limits=limits) as peer:
        holder = HoldThenReverse(2)
        peer.intercept = holder
        results: list[bytes] = []
        async with npu_client.open_trio_client(peer.path, name="bounded") as npu:

            async def ping(index: int) -> None:
                results.append(await npu.ping(bytes([index])))

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for index in range(6):
                        nursery.start_soon(ping, index)
        assert sorted(results) == [bytes([i]) for i in range(6)]
        assert holder.most_held == 2  # the peer refuses a third in flight (fatal)


async def test_a_call_cancelled_before_its_request_went_out_frees_its_slot(
    socket_path: str,
) -> None:
    # A request framed but never written is never answered: kept in flight, it held
    # one of the daemon's max_in_flight slots for ever, and once they were all taken
    # every call of the connection waited for a slot while npud sat idle.
    limits = p.ClientLimits(priority=p.Priority.NORMAL, max_in_flight=1)
    with Peer(socket_path, limits=limits) as peer:
        async with npu_client.open_trio_client(peer.path, name="withdrawn") as npu:
            # Another task's request holds the socket.
            async with trio.open_nursery() as nursery, npu._send_lock:
                for _ in range(3):
                    nursery.start_soon(npu.status)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
            assert npu.statistics().requests_in_flight == 0
            with trio.fail_after(30):  # a hang guard: the slot was taken for ever
                assert await npu.ping(b"after") == b"after"
        assert [type(r) for r in peer.connection().requests] == [p.PingRequest]
