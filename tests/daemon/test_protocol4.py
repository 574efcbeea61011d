"""Protocol version 4, what npud's libcdsprpc needs: a DSP process of one's own, the
number the DSP knows a buffer by, map flags, and calls that wait for the DSP without
holding a scheduler slot (issue 18, item 2)."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import trio

import npu_protocol as p
from npu_protocol import ErrorCode
from npud.fastrpc.kernel import abi
from npud.server import Daemon
from npud.sim import EmulatedDriver
from tests.daemon.wire import TEST_URI, RawPeer, busy, serve_daemon


async def connect(path: Path, name: str, **hello: object) -> tuple[RawPeer, p.ServerMessage]:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(path))
    peer = RawPeer(sock)
    await peer.write(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name=name, **hello))  # type: ignore[arg-type]
    return peer, await peer.next()


def sim_of(daemon: Daemon) -> EmulatedDriver:
    driver = daemon.broker.device.driver
    assert isinstance(driver, EmulatedDriver)
    return driver


async def test_a_client_may_ask_for_a_dsp_process_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    async with serve_daemon(tmp_path) as daemon:
        peer, welcome = await connect(path, "libcdsprpc", isolate=True)
        assert isinstance(welcome, p.Welcome)
        assert welcome.domain == "default#1"
        assert sim_of(daemon).statistics().sessions_in_use == 2
        peer.close()
        with trio.fail_after(10):
            while sim_of(daemon).statistics().sessions_in_use != 1:
                await trio.sleep(0.01)
    async with serve_daemon(tmp_path, "[domains]\nallow_isolate = false\n"):
        peer, refused = await connect(path, "libcdsprpc", isolate=True)
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.NOT_PERMITTED
        assert "allow_isolate is false" in refused.message
        peer.close()


async def test_the_dsp_fd_is_the_number_the_dsp_maps_the_buffer_by(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        await peer.write(p.AllocRequest(id=1, size=8192), p.AllocRequest(id=2, size=4096))
        first, second = await peer.answers(2)
        assert isinstance(first, p.AllocReply)
        assert isinstance(second, p.AllocReply)
        assert first.dsp_fd > 0
        assert first.dsp_fd != second.dsp_fd
        # The daemon runs in this process: its fd and the client's are the same DMA-BUF.
        ours, theirs = os.fstat(first.dsp_fd), os.fstat(peer.fds[0])
        assert (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)
        await peer.write(p.MapRequest(id=3, buffer=first.buffer, flags=3))
        assert isinstance(await peer.next(), p.MapReply)
        maps = sim_of(daemon).statistics().mem_maps
        assert maps == 1
        for request_id, flags in ((4, 1), (5, 19)):  # RESERVED, beyond the enum
            await peer.write(p.MapRequest(id=request_id, buffer=second.buffer, flags=flags))
            refused = await peer.next()
            assert isinstance(refused, p.ErrorMessage)
            assert refused.error_code is ErrorCode.INVALID_ARGUMENT
            assert "libcdsprpc passes on" in refused.message
        # Version 6: what libcdsprpc passes on, llama.cpp's FD_DELAYED_EXTENDED among them.
        await peer.write(p.MapRequest(id=6, buffer=second.buffer, flags=18))
        assert isinstance(await peer.next(), p.MapReply)
        peer.close()


def waiting_busy(request_id: int, handle: int, micros: int) -> p.InvokeRequest:
    call = busy(request_id, handle, micros)
    return p.InvokeRequest(id=request_id, handle=handle, method=4, inputs=call.inputs, wait=True)


async def test_a_waiting_call_holds_no_slot_and_escapes_the_watchdog(tmp_path: Path) -> None:
    config = "[daemon]\ncall_watchdog_s = 0.2\n[scheduler]\ndsp_slots = 2\nrealtime_reserve = 0\n"
    async with serve_daemon(tmp_path, config) as daemon:
        peer, welcome = await connect(tmp_path / "npud.sock", "waiter", isolate=True)
        assert isinstance(welcome, p.Welcome)
        await peer.write(p.OpenRequest(id=1, uri=TEST_URI))
        opened = await peer.next()
        assert isinstance(opened, p.OpenReply)
        handle = opened.handle
        await peer.write(waiting_busy(2, handle, 600_000), waiting_busy(3, handle, 600_000))
        await trio.sleep(0.1)
        scheduler = daemon.broker.scheduler.statistics()
        assert sum(scheduler.running) == 0  # the waits hold no slot
        # A third wait at once is refused; an ordinary call runs beside the two.
        await peer.write(waiting_busy(4, handle, 1000), busy(5, handle, 1000))
        first_two = await peer.answers(2)
        assert [type(m) for m in first_two] == [p.ErrorMessage, p.InvokeReply]
        refused = first_two[0]
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.QUOTA_EXCEEDED
        assert "calls waiting for the DSP quota exceeded: the limit is 2" in refused.message
        # Past the watchdog (0.2 s), nothing was taken as hung.
        waited = sorted(await peer.answers(2), key=lambda m: getattr(m, "id", 0))  # either first
        assert waited == [p.InvokeReply(id=2), p.InvokeReply(id=3)]
        row = daemon.broker.status().clients[0]
        assert row.hung_calls == 0
        domain = daemon.broker.domains.get(welcome.domain)
        assert domain is not None
        assert domain.restarts == 0
        bad = p.InvokeRequest(
            id=6,
            handle=handle,
            method=4,
            inputs=(p.InlineInput(data=struct.pack("<I", 1)),),
            wait=True,
            timeout_ms=100,
        )
        await peer.write(bad)
        answer = await peer.next()
        assert isinstance(answer, p.ErrorMessage)
        assert answer.error_code is ErrorCode.INVALID_ARGUMENT
        peer.close()


async def test_a_wait_needs_a_dsp_process_of_its_own(tmp_path: Path) -> None:
    """In a shared process nothing would stop a wait whose client left."""
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock", name="shared")
        await peer.write(p.OpenRequest(id=1, uri=TEST_URI))
        opened = await peer.next()
        assert isinstance(opened, p.OpenReply)
        await peer.write(waiting_busy(2, opened.handle, 1000))
        refused = await peer.next()
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.NOT_PERMITTED
        assert "needs a DSP process of its own" in refused.message
        peer.close()


async def test_a_client_gone_with_a_wait_pending_is_let_go(tmp_path: Path) -> None:
    """A libcdsprpc client killed with its dspqueue wait_signal outstanding: the wait
    would never end, so its DSP process is ended, and the client and its domain go
    (before, every such client kept a domain until npud stopped)."""
    async with serve_daemon(tmp_path) as daemon:
        peer, welcome = await connect(tmp_path / "npud.sock", "llama", isolate=True)
        assert isinstance(welcome, p.Welcome)
        await peer.write(p.OpenRequest(id=1, uri=TEST_URI))
        opened = await peer.next()
        assert isinstance(opened, p.OpenReply)
        await peer.write(waiting_busy(2, opened.handle, 0xFFFFFFFF))  # for ever
        with trio.fail_after(10):
            while not sim_of(daemon).statistics().invokes_in_flight:
                await trio.sleep(0.01)
        peer.close()
        with trio.fail_after(10):
            while daemon.broker.domains.get(welcome.domain) is not None or len(
                daemon.broker.clients
            ):
                await trio.sleep(0.01)
        assert sim_of(daemon).statistics().sessions_in_use == 1


def test_the_map_flags_are_the_kernels() -> None:
    assert (abi.FASTRPC_MAP_FD, abi.FASTRPC_MAP_FD_DELAYED) == (2, 3)
