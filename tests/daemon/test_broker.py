"""The broker in process over the emulator: tables, quotas, timeouts, release, restarts."""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import AsyncIterator

import pytest
import trio

import npu_protocol as p
from npu_protocol import ErrorCode
from npud.backend import select_profile
from npud.broker import Broker, BrokerError, ClientState
from npud.config import parse_config
from npud.fastrpc.dma import DmaBuffer
from npud.sim import EmulatedDriver

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"


def make_broker(extra: str = "") -> Broker:
    config = parse_config("[backend]\nkind = 'emulator'\n" + extra)
    return Broker(config, select_profile(config))


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    b = make_broker()
    await b.start()
    async with trio.open_nursery() as nursery:
        b.attach(nursery)
        yield b
        nursery.cancel_scope.cancel()
    await b.close(grace=5)
    assert b.driver.statistics().device_fds_open == 0  # type: ignore[attr-defined]


def client(
    broker: Broker, priority: p.Priority = p.Priority.NORMAL, uid: int = 1000
) -> ClientState:
    c = ClientState(pid=4242, uid=uid, gid=uid, name="test", priority=priority)
    broker.admit(c)
    return c


def echo(handle: int, data: bytes, capacity: int, timeout_ms: int | None = None) -> p.InvokeRequest:
    return p.InvokeRequest(
        id=1,
        handle=handle,
        method=2,
        inputs=(
            p.InlineInput(data=struct.pack("<II", len(data), capacity)),
            p.InlineInput(data=data),
        ),
        outputs=(p.InlineOutput(capacity=capacity),),
        timeout_ms=timeout_ms,
    )


def busy(handle: int, micros: int, timeout_ms: int | None = None) -> p.InvokeRequest:
    return p.InvokeRequest(
        id=1,
        handle=handle,
        method=4,
        inputs=(p.InlineInput(data=struct.pack("<I", micros)),),
        timeout_ms=timeout_ms,
    )


async def alloc(broker: Broker, c: ClientState, size: int) -> tuple[int, DmaBuffer]:
    """Allocate as the connection does, closing the reply's dup of the fd."""
    buffer_id, buffer, reply_fd = await broker.alloc(c, size)
    reply_fd.close()
    return buffer_id, buffer


async def refused(code: ErrorCode, call: object) -> BrokerError:
    with pytest.raises(BrokerError) as caught:
        await call  # type: ignore[misc]
    assert caught.value.code is code, str(caught.value)
    return caught.value


async def test_alloc_map_invoke_free(broker: Broker) -> None:
    c = client(broker)
    buffer_id, buffer = await alloc(broker, c, 5000)
    assert buffer_id == 1
    assert buffer.mapped_size == 8192
    address = await broker.map(c, buffer_id)
    assert await broker.map(c, buffer_id) == address
    handle = await broker.open(c, ECHO_URI)
    assert handle == 2  # ids are per connection and never reused
    assert await broker.invoke(c, echo(handle, b"hi", 4)) == (b"hi\0\0",)
    status = broker.status()
    assert status.totals.buffers == 1
    assert status.totals.mappings == 1
    assert status.clients[0].calls_done == 1
    await broker.unmap(c, buffer_id)
    await refused(ErrorCode.INVALID_ARGUMENT, broker.unmap(c, buffer_id))
    await broker.free(c, buffer_id)
    await refused(ErrorCode.UNKNOWN_BUFFER, broker.free(c, buffer_id))
    await broker.close_handle(c, handle)
    await refused(ErrorCode.UNKNOWN_HANDLE, broker.close_handle(c, handle))


async def test_ids_from_another_client_mean_nothing(broker: Broker) -> None:
    a, b = client(broker), client(broker)
    buffer_id, _ = await alloc(broker, a, 4096)
    handle = await broker.open(a, ECHO_URI)
    await refused(ErrorCode.UNKNOWN_BUFFER, broker.map(b, buffer_id))
    await refused(ErrorCode.UNKNOWN_BUFFER, broker.free(b, buffer_id))
    await refused(ErrorCode.UNKNOWN_HANDLE, broker.invoke(b, echo(handle, b"x", 1)))


async def test_bad_sizes_and_slices(broker: Broker) -> None:
    c = client(broker)
    await refused(ErrorCode.DMA_BUF_ALLOC, broker.alloc(c, 0))
    await refused(ErrorCode.DMA_EXCEEDS_MAX_SIZE, broker.alloc(c, (256 << 20) + 1))
    buffer_id, _ = await alloc(broker, c, 4096)
    handle = await broker.open(c, ECHO_URI)
    request = p.InvokeRequest(
        id=1,
        handle=handle,
        method=2,
        inputs=(
            p.InlineInput(data=struct.pack("<II", 8, 8)),
            p.BufferSlice(buffer=buffer_id, offset=4092, length=8),
        ),
        outputs=(p.InlineOutput(capacity=8),),
    )
    error = await refused(ErrorCode.SLICE_OUT_OF_RANGE, broker.invoke(c, request))
    assert "outside buffer 1 of 4096 bytes" in str(error)


async def test_a_failing_skel_is_invoke_failed_with_the_code(broker: Broker) -> None:
    c = client(broker)
    handle = await broker.open(c, ECHO_URI)
    lying = p.InvokeRequest(
        id=1,
        handle=handle,
        method=2,
        inputs=(p.InlineInput(data=struct.pack("<II", 99, 1)), p.InlineInput(data=b"x")),
        outputs=(p.InlineOutput(capacity=1),),
    )
    error = await refused(ErrorCode.INVOKE_FAILED, broker.invoke(c, lying))
    assert error.fields == {"code": 0x8000040E}
    await refused(
        ErrorCode.OPEN_FAILED, broker.open(c, "file:///libnone_skel.so?none_skel_handle_invoke")
    )


async def test_per_client_quotas() -> None:
    b = make_broker(
        "[client_limits]\nmax_buffers = 2\nmax_buffer_bytes = 16384\nmax_handles = 1\n"
        "max_calls_in_flight = 1\n"
    )
    await b.start()
    try:
        async with trio.open_nursery() as nursery:
            b.attach(nursery)
            c = client(b)
            await alloc(b, c, 4096)
            error = await refused(ErrorCode.QUOTA_EXCEEDED, b.alloc(c, 16384))
            assert str(error) == "buffer bytes quota exceeded: the limit is 16384"
            await alloc(b, c, 4096)
            await refused(ErrorCode.QUOTA_EXCEEDED, b.alloc(c, 4096))
            handle = await b.open(c, TEST_URI)
            error = await refused(ErrorCode.QUOTA_EXCEEDED, b.open(c, ECHO_URI))
            assert "handles quota" in str(error)
            started = trio.Event()

            async def long_call() -> None:
                started.set()
                await b.invoke(c, busy(handle, 200_000))

            nursery.start_soon(long_call)
            await started.wait()
            await trio.sleep(0.01)
            error = await refused(ErrorCode.QUOTA_EXCEEDED, b.invoke(c, busy(handle, 1)))
            assert "calls in flight" in str(error)
    finally:
        await b.close(grace=5)


async def test_global_limits() -> None:
    b = make_broker("[limits]\nmax_clients = 1\nmax_buffers = 1\n")
    await b.start()
    try:
        c = client(b)
        with pytest.raises(BrokerError) as caught:
            client(b)
        assert caught.value.code is ErrorCode.QUOTA_EXCEEDED
        await alloc(b, c, 4096)
        error = await refused(ErrorCode.QUOTA_EXCEEDED, b.alloc(c, 4096))
        assert "daemon buffers" in str(error)
    finally:
        await b.close(grace=5)


async def test_timeout_answers_while_the_dsp_call_goes_on(broker: Broker) -> None:
    c = client(broker)
    handle = await broker.open(c, TEST_URI)
    _buffer_id, buffer = await alloc(broker, c, 4096)
    error = await refused(ErrorCode.TIMEOUT, broker.invoke(c, busy(handle, 300_000, timeout_ms=20)))
    assert str(error) == "invoke did not finish within 20 ms"
    # The call still runs on the DSP; releasing the client waits for nothing and
    # leaks nothing.
    await broker.release_client(c)
    with trio.fail_after(10):
        while broker.session is not None and broker.session.statistics().invokes_in_flight:
            await trio.sleep(0.01)
    assert buffer.released


async def test_release_frees_everything_the_client_held(broker: Broker) -> None:
    c = client(broker)
    for _ in range(10):
        buffer_id, _ = await alloc(broker, c, 65536)
        await broker.map(c, buffer_id)
    await broker.open(c, ECHO_URI)
    sim = broker.driver
    assert isinstance(sim, EmulatedDriver)
    assert sim.statistics().mem_maps == 10
    await broker.release_client(c)
    assert broker.status().totals == p.Totals()
    assert sim.statistics().mem_maps == 0
    assert sim.statistics().remote_handles_open == 0
    assert broker.session is not None
    assert broker.session.statistics().buffers == 0


async def test_an_alloc_cancelled_while_running_is_not_leaked(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = client(broker)
    session = broker.session
    assert session is not None
    real_alloc = session.alloc
    running = threading.Event()

    def slow_alloc(size: int) -> DmaBuffer:
        running.set()
        time.sleep(0.2)  # the caller is cancelled meanwhile
        return real_alloc(size)

    monkeypatch.setattr(session, "alloc", slow_alloc)
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(alloc, broker, c, 4096)
            await trio.to_thread.run_sync(running.wait)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    with trio.fail_after(5):
        while session.statistics().buffers:
            await trio.sleep(0.01)  # the lane frees what the cancelled caller never got
    assert c.buffers == {}
    assert session.statistics().buffers == 0


async def test_an_alloc_cancelled_before_it_ran_never_runs(broker: Broker) -> None:
    c = client(broker)
    with trio.move_on_after(0):
        await alloc(broker, c, 4096)
    assert broker.session is not None
    await broker.control.call(lambda: None)  # the lane has drained past it
    assert broker.session.statistics().buffers == 0


async def test_realtime_invokes_do_not_queue_behind_background_work(broker: Broker) -> None:
    llm = client(broker, p.Priority.BACKGROUND)
    voice = client(broker, p.Priority.REALTIME)
    llm_handle = await broker.open(llm, TEST_URI)
    voice_handle = await broker.open(voice, ECHO_URI)
    finished: list[str] = []
    async with trio.open_nursery() as nursery:

        async def decode() -> None:
            await broker.invoke(llm, busy(llm_handle, 400_000))
            finished.append("llm")

        for _ in range(broker.config.backend.lanes):
            nursery.start_soon(decode)
        await trio.sleep(0.05)  # every bulk lane is now busy with the LLM
        assert await broker.invoke(voice, echo(voice_handle, b"vad", 3)) == (b"vad",)
        finished.append("voice")
    assert finished[0] == "voice"


async def test_realtime_is_granted_only_to_listed_peers() -> None:
    b = make_broker("[access]\nrealtime_uids = [1234]\n")
    stranger = ClientState(pid=1, uid=999, gid=999)
    friend = ClientState(pid=2, uid=1234, gid=999)
    assert b.grant_priority(stranger, p.Priority.REALTIME) is p.Priority.NORMAL
    assert b.grant_priority(friend, p.Priority.REALTIME) is p.Priority.REALTIME
    assert b.grant_priority(stranger, p.Priority.BACKGROUND) is p.Priority.BACKGROUND


async def test_a_dsp_restart_releases_everyone_and_opens_a_new_epoch(broker: Broker) -> None:
    c = client(broker)
    events: list[p.ServerEvent] = []

    async def record(event: p.ServerEvent) -> None:
        events.append(event)

    c.send_event = record
    buffer_id, _ = await alloc(broker, c, 4096)
    handle = await broker.open(c, ECHO_URI)
    sim = broker.driver
    assert isinstance(sim, EmulatedDriver)
    sim.faults.subsystem_restart(down_for=0.3)
    await refused(ErrorCode.DSP_RESTARTED, broker.invoke(c, echo(handle, b"x", 1)))
    with trio.fail_after(10):
        while not events:
            await trio.sleep(0.02)
    assert len(events) == 1
    assert isinstance(events[0], p.SessionRestarted)
    assert events[0].epoch == 2
    assert broker.epoch == 2
    assert broker.restarts == 1
    # What the client held is gone, and says why.
    await refused(ErrorCode.DSP_RESTARTED, broker.map(c, buffer_id))
    await refused(ErrorCode.DSP_RESTARTED, broker.invoke(c, echo(handle, b"x", 1)))
    # New work goes through the new session.
    new_handle = await broker.open(c, ECHO_URI)
    assert new_handle > handle
    assert await broker.invoke(c, echo(new_handle, b"ok", 2)) == (b"ok",)
    assert broker.status().restarts == 1


async def test_shutting_down_refuses_new_work(broker: Broker) -> None:
    c = client(broker)
    broker.shutting_down = True
    await refused(ErrorCode.SHUTTING_DOWN, broker.alloc(c, 4096))
    broker.shutting_down = False


async def test_a_restart_noticed_only_by_the_listener_is_recovered(broker: Broker) -> None:
    c = client(broker)
    events: list[p.ServerEvent] = []

    async def record(event: p.ServerEvent) -> None:
        events.append(event)

    c.send_event = record
    sim = broker.driver
    assert isinstance(sim, EmulatedDriver)
    sim.faults.subsystem_restart(down_for=0.2)
    session = broker.session
    assert session is not None
    with trio.fail_after(10):
        while not session.dead:  # the listener's pending next2 got EPIPE
            await trio.sleep(0.01)
    assert not broker.healthy()  # dead and nobody recovering: the watchdog would stop
    broker.check_session()  # what the status and watchdog loops do while idle
    with trio.fail_after(10):
        while not events:
            await trio.sleep(0.02)
    assert broker.epoch == 2
    assert broker.healthy()


async def test_inline_limits_and_timeouts_are_enforced_by_the_daemon(broker: Broker) -> None:
    c = client(broker)
    handle = await broker.open(c, ECHO_URI)
    limit = broker.client_limits(c).max_inline_bytes
    greedy = p.InvokeRequest(
        id=1,
        handle=handle,
        method=2,
        inputs=(p.InlineInput(data=struct.pack("<II", 1, 1)), p.InlineInput(data=b"x")),
        outputs=tuple(p.InlineOutput(capacity=limit // 2 + 1) for _ in range(2)),
    )
    error = await refused(ErrorCode.QUOTA_EXCEEDED, broker.invoke(c, greedy))
    assert "inline output bytes quota exceeded" in str(error)
    patient = echo(handle, b"x", 1, timeout_ms=broker.client_limits(c).max_timeout_ms + 1)
    await refused(ErrorCode.INVALID_ARGUMENT, broker.invoke(c, patient))


async def test_a_free_cancelled_while_queued_still_frees(broker: Broker) -> None:
    c = client(broker)
    buffer_id, buffer = await alloc(broker, c, 4096)
    gate = threading.Event()

    async def open_gate_later() -> None:
        await trio.sleep(0.2)
        gate.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.control.call, gate.wait)  # the control lane is busy
        nursery.start_soon(open_gate_later)
        await trio.sleep(0.02)
        with trio.move_on_after(0.05):
            await broker.free(c, buffer_id)  # the client hangs up while it is queued
    assert buffer_id not in c.buffers
    assert buffer.released  # freed all the same: it had already left the table


async def test_the_reply_fd_is_this_buffers_even_if_it_is_freed_at_once(broker: Broker) -> None:
    c = client(broker)
    buffer_id, buffer, reply_fd = await broker.alloc(c, 8192)
    await broker.free(c, buffer_id)  # a pipelined Free ran before the reply went out
    assert buffer.released
    try:
        assert os.fstat(reply_fd.fileno()).st_size == 8192  # still that DMA-BUF
        assert os.readlink(f"/proc/self/fd/{reply_fd.fileno()}").startswith("/memfd:")
    finally:
        reply_fd.close()
