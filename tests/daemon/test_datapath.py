"""The data path over a real socket: timeouts, deadlines, budgets, classes, half-closes,
pipelining, slow readers and clients that leave mid-call."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
import trio

import npu_client
import npu_protocol as p
from npu_client import _args, trio_client
from npu_protocol import ErrorCode
from npud.datapath import workers as datapath_module
from npud.datapath.link_states import LinkState
from npud.datapath.workers import Call
from tests.daemon.wire import ECHO_URI, TEST_URI, RawPeer, busy, serve_daemon


async def opened(peer: RawPeer, request_id: int, uri: str) -> int:
    await peer.write(p.OpenRequest(id=request_id, uri=uri))
    reply = await peer.next()
    assert isinstance(reply, p.OpenReply), reply
    return reply.handle


def code_of(message: p.ServerMessage) -> ErrorCode | None:
    assert isinstance(message, p.ErrorMessage), message
    return message.error_code


async def status(peer: RawPeer, request_id: int = 999) -> p.DaemonStatus:
    await peer.write(p.StatusRequest(id=request_id))
    reply = await peer.next()
    assert isinstance(reply, p.StatusReply), reply
    return reply.status


def deadline_busy(request_id: int, handle: int, micros: int, deadline_ms: int) -> p.InvokeRequest:
    call = busy(request_id, handle, micros)
    return p.InvokeRequest(
        id=call.id, handle=call.handle, method=4, inputs=call.inputs, deadline_ms=deadline_ms
    )


# --- timeouts -------------------------------------------------------------------------------


async def test_a_timeout_answers_while_the_call_goes_on(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        slow = busy(2, handle, 300_000)
        slow = p.InvokeRequest(id=2, handle=handle, method=4, inputs=slow.inputs, timeout_ms=30)
        await peer.write(slow, p.CloseRequest(id=3, handle=handle))
        timed_out = await peer.next()
        assert code_of(timed_out) is ErrorCode.TIMEOUT
        assert isinstance(timed_out, p.ErrorMessage)
        assert timed_out.message == "invoke did not finish within 30 ms"
        # The call still runs on the DSP: the close waits for it, then answers.
        assert await peer.next() == p.CloseReply(id=3)
        domain = daemon.broker.default_domain
        assert domain is not None
        session = domain.session
        assert session is not None
        assert session.statistics().invokes_in_flight == 0
        peer.close()


async def test_the_default_timeout_applies_to_invokes_without_one(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path, "[client_limits]\ndefault_timeout_s = 0.03\n") as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(busy(2, handle, 300_000))
        refusal = await peer.next()
        assert code_of(refusal) is ErrorCode.TIMEOUT
        quick = busy(3, handle, 20_000)
        await peer.write(
            p.InvokeRequest(id=3, handle=handle, method=4, inputs=quick.inputs, timeout_ms=5000)
        )
        assert await peer.next() == p.InvokeReply(id=3)  # its own timeout wins
        peer.close()


async def test_a_queued_call_that_times_out_never_runs(tmp_path: Path) -> None:
    config = "[scheduler]\ndsp_slots = 1\nrealtime_reserve = 0\n"
    async with serve_daemon(tmp_path, config) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        waiting = busy(3, handle, 1)
        await peer.write(
            busy(2, handle, 200_000),
            p.InvokeRequest(id=3, handle=handle, method=4, inputs=waiting.inputs, timeout_ms=20),
        )
        first = await peer.next()
        assert first.id == 3  # type: ignore[union-attr]
        assert code_of(first) is ErrorCode.TIMEOUT
        assert await peer.next() == p.InvokeReply(id=2)
        assert daemon.broker.scheduler.statistics().dispatched == 1  # id 3 never ran
        peer.close()


# --- deadlines --------------------------------------------------------------------------------


async def test_a_call_that_cannot_start_by_its_deadline_is_refused_at_once(tmp_path: Path) -> None:
    config = "[scheduler]\ndsp_slots = 1\nrealtime_reserve = 0\n"
    async with serve_daemon(tmp_path, config) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(busy(2, handle, 300_000), deadline_busy(3, handle, 1, deadline_ms=20))
        refusal = await peer.next()
        assert refusal.id == 3  # type: ignore[union-attr]
        assert code_of(refusal) is ErrorCode.DEADLINE_EXCEEDED
        assert isinstance(refusal, p.ErrorMessage)
        assert refusal.message == "invoke was not dispatched within its deadline of 20 ms"
        assert await peer.next() == p.InvokeReply(id=2)
        row = (await status(peer)).clients[0]
        assert (row.late, row.misses, row.calls_done) == (1, 0, 2)
        peer.close()


async def test_a_call_that_finishes_late_succeeds_and_counts_a_miss(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(deadline_busy(2, handle, 100_000, deadline_ms=10))
        assert await peer.next() == p.InvokeReply(id=2)
        row = (await status(peer)).clients[0]
        assert (row.misses, row.late) == (1, 0)
        assert row.dsp_us >= 100_000
        peer.close()


# --- budgets and classes ---------------------------------------------------------------------


async def test_realtime_budgets_are_admitted_while_the_dsp_has_room(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path, "[scheduler]\nrealtime_utilisation_pct = 30\n") as _:
        path = tmp_path / "npud.sock"
        vad = await _hello(
            path, "vad", p.Priority.REALTIME, p.Budget(period_us=32_000, budget_us=4_000)
        )
        assert isinstance(vad.welcome, p.Welcome)
        stt = await _hello(
            path, "stt", p.Priority.REALTIME, p.Budget(period_us=100_000, budget_us=20_000)
        )
        refusal = stt.welcome
        assert isinstance(refusal, p.ErrorMessage)
        assert refusal.error_code is ErrorCode.ADMISSION_REFUSED
        assert refusal.message == (
            "realtime budget refused: 20 ms every 100 ms would bring declared realtime use "
            "to 32% of the DSP, above the configured 30%"
        )
        normal = await _hello(
            path, "llm", p.Priority.BACKGROUND, p.Budget(period_us=1000, budget_us=10)
        )
        assert isinstance(normal.welcome, p.ErrorMessage)
        assert normal.welcome.error_code is ErrorCode.ADMISSION_REFUSED
        row = next(r for r in (await status(vad.peer)).clients if r.name == "vad")
        assert (row.budget_period_us, row.budget_us) == (32_000, 4_000)
        for hello in (vad, stt, normal):
            hello.peer.close()


class _Hello:
    def __init__(self, peer: RawPeer, welcome: p.ServerMessage) -> None:
        self.peer = peer
        self.welcome = welcome


async def _hello(path: Path, name: str, priority: p.Priority, budget: p.Budget | None) -> _Hello:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(path))
    peer = RawPeer(sock)
    await peer.write(
        p.Hello(
            protocol_version=p.PROTOCOL_VERSION, client_name=name, priority=priority, budget=budget
        )
    )
    return _Hello(peer, await peer.next())


async def test_realtime_is_not_queued_behind_background_work(tmp_path: Path) -> None:
    config = "[scheduler]\ndsp_slots = 2\nrealtime_reserve = 1\nbackground_max = 1\n"
    async with serve_daemon(tmp_path, config) as daemon:
        path = tmp_path / "npud.sock"
        llm = (await _hello(path, "llm", p.Priority.BACKGROUND, None)).peer
        voice = (await _hello(path, "voice", p.Priority.REALTIME, None)).peer
        llm_handle = await opened(llm, 1, TEST_URI)
        voice_handle = await opened(voice, 1, TEST_URI)
        await llm.write(*(busy(10 + i, llm_handle, 200_000) for i in range(3)))
        with trio.fail_after(5):
            while daemon.broker.scheduler.statistics().running[2] == 0:
                await trio.sleep(0.005)
        stats = daemon.broker.scheduler.statistics()
        assert stats.running == (0, 0, 1)  # background holds one slot, at most
        assert stats.queued == (0, 0, 2)
        await voice.write(busy(2, voice_handle, 1_000))
        assert await voice.next() == p.InvokeReply(id=2)
        # Not behind the background: its calls still wait their turn, one at a time.
        assert daemon.broker.scheduler.statistics().queued[2] >= 1
        for _ in range(3):
            assert isinstance(await llm.next(), p.InvokeReply)
        llm.close()
        voice.close()


# --- connections -------------------------------------------------------------------------------


async def test_a_half_closed_client_still_gets_its_answers(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(busy(2, handle, 50_000), p.PingRequest(id=3, payload=b"bye"))
        peer.sock.shutdown(socket.SHUT_WR)
        answers = {a.id: a for a in await peer.answers(2)}  # type: ignore[union-attr]
        assert answers == {2: p.InvokeReply(id=2), 3: p.PongReply(id=3, payload=b"bye")}
        with trio.fail_after(5):
            while daemon.broker.clients.__len__():
                await trio.sleep(0.01)  # then the daemon closes and releases
        data = await peer.sock.recv(10)
        assert data == b""
        peer.close()


@pytest.mark.parametrize("leaving", ["close", "half-close, then close"])
async def test_a_departed_clients_queued_calls_never_run(tmp_path: Path, leaving: str) -> None:
    """PROTOCOL.md section 5: a client that closes its socket has its queued requests
    released; only the calls already on the DSP finish (a half-close alone is not
    leaving: that client still reads its answers)."""
    async with serve_daemon(tmp_path) as daemon:
        scheduler = daemon.broker.scheduler
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(*(busy(2 + n, handle, 150_000) for n in range(8)))
        with trio.fail_after(5):
            while scheduler.statistics().dispatched < 2:
                await trio.sleep(0.005)
        assert scheduler.statistics().dispatched == 2  # two per client run, six wait
        if leaving != "close":
            peer.sock.shutdown(socket.SHUT_WR)
            await trio.sleep(0.02)
        peer.close()
        with trio.fail_after(5):
            while len(daemon.broker.clients):
                await trio.sleep(0.01)
        assert scheduler.statistics().dispatched == 2


@pytest.mark.parametrize("leaving", ["close", "dropped"])
async def test_no_worker_wakes_for_a_finished_link_the_trio_thread_has_not_removed(
    tmp_path: Path, leaving: str
) -> None:
    """Issue 27: a link whose reading is over and that has nothing pending is left
    disarmed. Re-armed, its peer's POLLHUP woke a worker over and over until the trio
    thread removed the link; with the trio thread stuck (a blocking sd_notify), every
    worker spun at 100 % CPU. Here the test holds the trio thread itself."""
    async with serve_daemon(tmp_path) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        await peer.write(p.PingRequest(id=1))
        assert isinstance(await peer.next(), p.PongReply)
        (link,) = daemon.broker.datapath.links()
        reads = 0
        real_read = link.read

        def counted(buffer: bytearray) -> list[p.ClientMessage | p.ConnectionClosed]:
            nonlocal reads
            reads += 1
            return real_read(buffer)

        link.read = counted  # type: ignore[method-assign]
        if leaving == "close":
            peer.close()
        else:
            link.drop("the test drops it")
        # The trio thread, which removes a finished link, is held: as by a blocking call.
        deadline = time.monotonic() + 5
        while link.state is not LinkState.FINISHED and time.monotonic() < deadline:
            time.sleep(0.01)
        assert link.state is LinkState.FINISHED
        settled = reads
        time.sleep(0.5)
        # Before the fix: tens of thousands of reads in these 0.5 s, one per wake-up.
        assert reads - settled <= 1, f"{reads - settled} wake-ups for a finished link"
        if leaving != "close":
            peer.close()


async def test_control_requests_are_read_and_answered_during_a_long_call(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(busy(2, handle, 400_000))
        await trio.sleep(0.05)  # the long call is on the DSP now
        await peer.write(p.AllocRequest(id=3, size=4096), p.PingRequest(id=4))
        # Both answered before the long call's reply, which comes last.
        first, second = await peer.answers(2)
        assert {first.id, second.id} == {3, 4}  # type: ignore[union-attr]
        assert await peer.next() == p.InvokeReply(id=2)
        peer.close()


async def test_a_client_gone_mid_call_is_released_after_the_call(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(p.AllocRequest(id=2, size=65536))
        assert isinstance(await peer.next(), p.AllocReply)
        await peer.write(busy(3, handle, 200_000))
        await trio.sleep(0.05)
        peer.close()  # gone while its call runs
        domain = daemon.broker.default_domain
        assert domain is not None
        session = domain.session
        assert session is not None
        memory = daemon.broker.device.require_memory()
        await trio.sleep(0.05)
        assert session.statistics().invokes_in_flight == 1  # not abandoned
        with trio.fail_after(5):
            while len(daemon.broker.clients) or memory.statistics().buffers:
                await trio.sleep(0.01)
        stats = session.statistics()
        assert (stats.remote_handles, stats.invokes_in_flight) == (0, 0)
        assert memory.statistics().buffers == 0


async def test_a_client_that_stops_reading_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datapath_module, "SEND_TIMEOUT", 0.3)
    async with serve_daemon(tmp_path) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        handle = await opened(peer, 1, ECHO_URI)
        big = 512 * 1024
        echo = p.InvokeRequest(
            id=2,
            handle=handle,
            method=2,
            inputs=(p.InlineInput(data=struct.pack("<II", 0, big)), p.InlineInput(data=b"")),
            outputs=(p.InlineOutput(capacity=big),),
        )
        await peer.write(echo)  # its reply is far more than the socket holds; never read
        with trio.fail_after(10):
            while len(daemon.broker.clients):
                await trio.sleep(0.02)
        peer.close()


async def test_pipelined_calls_of_one_client_share_the_dsp(tmp_path: Path) -> None:
    config = "[scheduler]\ndsp_slots = 4\nper_client_running = 2\n"
    async with serve_daemon(tmp_path, config) as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        handle = await opened(peer, 1, TEST_URI)
        await peer.write(*(busy(10 + i, handle, 150_000) for i in range(4)))
        with trio.fail_after(5):  # until all four reached the scheduler (read, then carried)
            while (
                sum(daemon.broker.scheduler.statistics().queued)
                + sum(daemon.broker.scheduler.statistics().running)
                < 4
            ):
                await trio.sleep(0.005)
        stats = daemon.broker.scheduler.statistics()
        assert stats.running[1] == 2  # two at once: the per-client cap
        assert stats.queued[1] == 2
        answers = await peer.answers(4)
        assert sorted(getattr(a, "id", -1) for a in answers) == [10, 11, 12, 13]
        peer.close()


async def test_the_fd_of_an_alloc_reply_survives_a_backlog(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as _:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        await peer.write(*(p.AllocRequest(id=i, size=4096) for i in range(1, 17)))
        replies = await peer.answers(16)
        assert all(isinstance(r, p.AllocReply) for r in replies)
        assert len(peer.fds) == 16
        for fd in peer.fds:
            assert os.fstat(fd).st_size == 4096
        peer.close()


# --- the client library's side of deadlines and budgets ----------------------------------------


async def test_the_clients_carry_deadlines_and_budgets(tmp_path: Path) -> None:
    config = "[scheduler]\ndsp_slots = 1\nrealtime_reserve = 0\n"
    async with serve_daemon(tmp_path, config) as _:
        path = tmp_path / "npud.sock"
        async with trio_client.open_trio_client(
            path, name="vad", priority="realtime", budget=(0.032, 0.004)
        ) as vad:
            assert vad.priority is p.Priority.REALTIME
            handle = await vad.open(TEST_URI)
            micros = struct.pack("<I", 200_000)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle.invoke, 4, [micros])  # holds the only slot
                await trio.sleep(0.05)
                with pytest.raises(npu_client.DeadlineExceeded, match="deadline of 20 ms"):
                    await handle.invoke(4, [struct.pack("<I", 1)], deadline=0.02)
            status = await vad.status()
            assert status.clients[0].budget_us == 4000

        def blocking_refused() -> None:
            with pytest.raises(npu_client.AdmissionRefused, match="above the configured 50%"):
                npu_client.connect(path, name="greedy", priority="realtime", budget=(0.01, 0.009))

        await trio.to_thread.run_sync(blocking_refused)


def test_a_deadline_needs_protocol_version_2() -> None:
    with pytest.raises(npu_client.Unsupported, match=r"deadlines \(npud speaks protocol version 1"):
        _args._deadline_ms(0.01, 1)
    assert _args._deadline_ms(0.0001, 2) == 1  # rounded up to whole ms
    with pytest.raises(ValueError, match="positive"):
        _args._deadline_ms(0, 2)


@pytest.mark.parametrize(
    ("budget", "error"),
    [
        ((0.01, 0.02), "at most its period"),
        ((0.00001, 0.000001), "between 100 µs and 10 s"),
        ((1, "x"), "number of seconds"),
        ((1,), "period, budget"),
    ],
)
def test_bad_budgets_are_refused_before_connecting(budget: object, error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        _args.budget_record(budget)  # type: ignore[arg-type]


def _race_for(call: Call, racers: int) -> list[bool]:
    wins: list[bool] = []
    threads = [threading.Thread(target=lambda: wins.append(call.claim())) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return wins


def test_a_call_is_claimed_once_whoever_races_for_it() -> None:
    for _ in range(200):
        call = Call(None, None)  # type: ignore[arg-type]
        assert sorted(_race_for(call, 4)) == [False, False, False, True]
        assert not call.claim()


# --- statistics ---------------------------------------------------------------------------


def test_statistics_count_links_workers_and_the_busy_ones() -> None:
    from npud.runtime.scheduler import Policy, Scheduler
    from tests.polling import wait_until

    datapath = datapath_module.DataPath(Scheduler(Policy()), workers=2)
    idle = datapath.statistics()
    assert (idle.links, idle.workers, idle.busy_workers, idle.tasks_waiting) == (0, 2, 0, 0)
    datapath.start()
    release = threading.Event()
    try:
        datapath._post(release.wait)  # a worker busy until the test lets it go
        wait_until(lambda: datapath.statistics().busy_workers == 1, "one worker busy")
        assert datapath.statistics().tasks_waiting == 0
    finally:
        release.set()
    wait_until(lambda: datapath.statistics().busy_workers == 0, "the worker idle again")
    assert datapath.stop(5.0)
    assert datapath.statistics().busy_workers == 0  # the workers ended, none busy


async def test_statistics_of_a_served_connection(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        datapath = daemon.broker.datapath
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        try:
            await peer.write(p.PingRequest(id=1))
            assert isinstance(await peer.next(), p.PongReply)
            assert datapath.statistics().links == 1
            (link,) = datapath.links()
            # The pong is sent before its request is counted done: wait for that.
            with trio.fail_after(10):
                while link.statistics().pending:
                    await trio.sleep(0.01)
            stats = link.statistics()
            assert stats.state is LinkState.READING
            assert (stats.pending, stats.outbox_frames, stats.outbox_bytes) == (0, 0, 0)
        finally:
            peer.close()
        with trio.fail_after(10):
            while datapath.statistics().links:
                await trio.sleep(0.01)
        assert link.statistics().state is LinkState.RELEASED
        assert link.statistics().reason == "closed by the client"
