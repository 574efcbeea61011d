"""Protocol version 4, what npud's libcdsprpc needs: a DSP process of one's own, the
number the DSP knows a buffer by, map flags, and calls that wait for the DSP without
holding a scheduler slot (issue 18, item 2)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import trio

import npu_protocol as p
from npu_protocol import ErrorCode
from npud.daemon.server import Daemon
from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver
from npud.sim.skels_dspqueue import URI as DSPQUEUE_SKEL_URI
from tests.daemon.wire import TEST_URI, RawPeer, busy, serve_daemon

DSPQUEUE_URI = DSPQUEUE_SKEL_URI + "&_dom=cdsp"


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


def wait_signal(request_id: int, handle: int) -> p.InvokeRequest:
    """dspqueue_rpc.wait_signal, the method that waits for the DSP: until the DSP has
    something for the CPU, or cancel_wait_signal."""
    return p.InvokeRequest(
        id=request_id,
        handle=handle,
        sc=0x06000100,
        outputs=(p.InlineOutput(capacity=4),),
        wait=True,
    )


def cancel_wait_signal(request_id: int, handle: int) -> p.InvokeRequest:
    return p.InvokeRequest(id=request_id, handle=handle, sc=0x07000000)


async def opened(peer: RawPeer, request_id: int, uri: str) -> int:
    await peer.write(p.OpenRequest(id=request_id, uri=uri))
    reply = await peer.next()
    assert isinstance(reply, p.OpenReply), reply
    return reply.handle


async def test_a_waiting_call_holds_no_slot_and_escapes_the_watchdog(tmp_path: Path) -> None:
    config = "[daemon]\ncall_watchdog_s = 0.2\n[scheduler]\ndsp_slots = 2\nrealtime_reserve = 0\n"
    async with serve_daemon(tmp_path, config) as daemon:
        peer, welcome = await connect(tmp_path / "npud.sock", "waiter", isolate=True)
        assert isinstance(welcome, p.Welcome)
        queue = await opened(peer, 1, DSPQUEUE_URI)
        handle = await opened(peer, 7, TEST_URI)
        await peer.write(wait_signal(2, queue), wait_signal(3, queue))
        await trio.sleep(0.1)
        scheduler = daemon.broker.scheduler.statistics()
        assert sum(scheduler.running) == 0  # the waits hold no slot
        # A third wait at once is refused; an ordinary call runs beside the two.
        await peer.write(wait_signal(4, queue), busy(5, handle, 1000))
        first_two = await peer.answers(2)
        assert [type(m) for m in first_two] == [p.ErrorMessage, p.InvokeReply]
        refused = first_two[0]
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.QUOTA_EXCEEDED
        assert "calls waiting for the DSP quota exceeded: the limit is 2" in refused.message
        await trio.sleep(0.5)  # past the watchdog (0.2 s): nothing is taken as hung
        await peer.write(cancel_wait_signal(6, queue))
        answers = sorted(await peer.answers(3), key=lambda m: getattr(m, "id", 0))
        cancelled = (-1).to_bytes(4, "little", signed=True)
        assert answers == [
            p.InvokeReply(id=2, outputs=(cancelled,)),
            p.InvokeReply(id=3, outputs=(cancelled,)),
            p.InvokeReply(id=6),
        ]
        row = daemon.broker.status().clients[0]
        assert row.hung_calls == 0
        domain = daemon.broker.domains.get(welcome.domain)
        assert domain is not None
        assert domain.restarts == 0
        bad = p.InvokeRequest(
            id=8,
            handle=queue,
            sc=0x06000100,
            outputs=(p.InlineOutput(capacity=4),),
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
        queue = await opened(peer, 1, DSPQUEUE_URI)
        await peer.write(wait_signal(2, queue))
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
        queue = await opened(peer, 1, DSPQUEUE_URI)
        await peer.write(wait_signal(2, queue))  # for ever: nothing signals, nothing cancels
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


async def test_wait_on_a_method_that_computes_is_refused(tmp_path: Path) -> None:
    """Issue 27: ``wait`` on npu_test.busy ran 40 s with no slot and no watchdog. It is
    for methods that wait for the DSP; one that computes is refused before it runs."""
    async with serve_daemon(tmp_path) as daemon:
        peer, welcome = await connect(tmp_path / "npud.sock", "waiter", isolate=True)
        assert isinstance(welcome, p.Welcome)
        handle = await opened(peer, 1, TEST_URI)
        queue = await opened(peer, 2, DSPQUEUE_URI)
        listening = sim_of(daemon).statistics().invokes_in_flight  # the listeners' own
        computing = busy(3, handle, 2_000_000)
        await peer.write(
            p.InvokeRequest(id=3, handle=handle, method=4, inputs=computing.inputs, wait=True),
            # dspqueue's other methods compute too (signal).
            p.InvokeRequest(id=4, handle=queue, sc=0x08000000, wait=True),
        )
        refusals = sorted(await peer.answers(2), key=lambda m: getattr(m, "id", 0))
        for refusal, method, handle_id in zip(refusals, (4, 8), (handle, queue), strict=True):
            assert isinstance(refusal, p.ErrorMessage), refusal
            assert refusal.error_code is ErrorCode.INVALID_ARGUMENT
            assert (
                f"wait is only for a method that waits for the DSP (dspqueue's wait_signal); "
                f"method {method} of handle {handle_id} computes: send it without wait"
            ) in refusal.message
        assert sim_of(daemon).statistics().invokes_in_flight == listening  # busy never ran
        # The same call without wait runs, with a slot and under the watchdog.
        await peer.write(busy(5, handle, 1000))
        assert await peer.next() == p.InvokeReply(id=5)
        peer.close()


def test_the_map_flags_are_the_kernels() -> None:
    assert (abi.FASTRPC_MAP_FD, abi.FASTRPC_MAP_FD_DELAYED) == (2, 3)
