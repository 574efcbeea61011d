"""The broker in process over the emulator: tables, quotas, timeouts, release, restarts."""

from __future__ import annotations

import grp
import os
import struct
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import trio

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode, format_message
from npud.daemon.broker import Broker
from npud.domain.life import Domain
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.ops.backend import select_profile
from npud.ops.config import ConfigError, parse_config
from npud.requests import HANDLERS, Answer
from npud.requests.clients import Client, Gate, Kind
from npud.requests.holdings import HeldBuffer
from npud.runtime.scheduler import NORMAL
from npud.sim import EmulatedDriver
from tests.error_scan import leaked_numbers

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"


def make_broker(extra: str = "") -> Broker:
    config = parse_config("[backend]\nkind = 'emulator'\n" + extra)
    return Broker(config, select_profile(config))


@asynccontextmanager
async def running(extra: str = "") -> AsyncIterator[Broker]:
    """A started broker (its default domain up); closed, leaving no device fd, at the end."""
    b = make_broker(extra)
    try:
        await b.start()
        async with trio.open_nursery() as nursery:
            b.attach(nursery)
            yield b
            nursery.cancel_scope.cancel()
    finally:
        await b.close(grace=5)
    assert emulator(b).statistics().device_fds_open == 0


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with running() as b:
        yield b


def emulator(broker: Broker) -> EmulatedDriver:
    driver = broker.device.driver
    assert isinstance(driver, EmulatedDriver)
    return driver


def default(broker: Broker) -> Domain:
    domain = broker.default_domain
    assert domain is not None
    return domain


DOMAINS: dict[Client, Domain] = {}


async def client(broker: Broker, priority: p.Priority = p.Priority.NORMAL, uid: int = 0) -> Client:
    """A client admitted as at its Hello: quotas, scheduler account, its domain (root's
    by default: the default domain; another uid gets default@UID)."""
    c = Client(pid=4242, uid=uid, gid=uid, name="test", priority=priority)
    DOMAINS[c] = await broker.admit(c, None)
    return c


async def opened(gate: Gate) -> None:
    """Wait from trio until ``gate`` opens (the data path waits with a callback)."""
    token = trio.lowlevel.current_trio_token()
    event = trio.Event()
    gate.when_open(lambda: token.run_sync_soon(event.set))
    await event.wait()


async def answer(broker: Broker, c: Client, request: p.AnyRequest) -> Answer:
    """What the data path does with one request: arrive, wait for its objects, run
    (on a thread: handlers block in ioctls), end."""
    handler = HANDLERS[type(request)](c, DOMAINS[c], request, broker)
    try:
        handler.start()
        try:
            for gate in handler.gates():
                await opened(gate)
            return await trio.to_thread.run_sync(handler.run)
        finally:
            handler.end()
    except CodedError as exc:
        # What the client would be told names only its own ids.
        message = format_message(exc.code, **exc.fields)
        assert c.limits is not None
        leaks = leaked_numbers(request, exc.code, exc.fields, message, c.limits)
        if leaks:
            raise AssertionError(f"{message!r} leaks: {leaks}") from exc
        raise


async def call(broker: Broker, c: Client, request: p.AnyRequest) -> p.AnyReply:
    result = await answer(broker, c, request)
    if result.fd is not None:
        result.fd.close()
    return result.reply


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


async def invoke(broker: Broker, c: Client, request: p.InvokeRequest) -> tuple[bytes | None, ...]:
    reply = await call(broker, c, request)
    assert isinstance(reply, p.InvokeReply)
    return reply.outputs


async def open_handle(broker: Broker, c: Client, uri: str) -> int:
    reply = await call(broker, c, p.OpenRequest(id=1, uri=uri))
    assert isinstance(reply, p.OpenReply)
    return reply.handle


async def alloc(broker: Broker, c: Client, size: int) -> tuple[int, DmaBuffer]:
    """Allocate as the connection does, closing the reply's dup of the fd."""
    reply = await call(broker, c, p.AllocRequest(id=1, size=size))
    assert isinstance(reply, p.AllocReply)
    return reply.buffer, buffer_of(c, reply.buffer)


def buffer_of(c: Client, buffer_id: int) -> DmaBuffer:
    for entry in c.objects.entries(Kind.BUFFER):
        if entry.id == buffer_id:
            assert isinstance(entry.value, HeldBuffer)
            return entry.value.buffer
    raise AssertionError(f"no buffer {buffer_id}")


async def refused(code: ErrorCode, call: Awaitable[object]) -> CodedError:
    with pytest.raises(CodedError) as caught:
        await call
    assert caught.value.code is code, str(caught.value)
    return caught.value


async def test_alloc_map_invoke_free(broker: Broker) -> None:
    c = await client(broker)
    buffer_id, buffer = await alloc(broker, c, 5000)
    assert buffer_id == 1
    assert buffer.size == 8192  # the allocated size: whole pages
    address = await call(broker, c, p.MapRequest(id=1, buffer=buffer_id))
    assert await call(broker, c, p.MapRequest(id=1, buffer=buffer_id)) == address
    handle = await open_handle(broker, c, ECHO_URI)
    assert handle == 2  # ids are per connection and never reused
    assert await invoke(broker, c, echo(handle, b"hi", 4)) == (b"hi\0\0",)
    status = broker.status()
    assert status.totals.buffers == 1
    assert status.totals.mappings == 1
    assert status.clients[0].calls_done == 1
    await call(broker, c, p.UnmapRequest(id=1, buffer=buffer_id))
    await refused(
        ErrorCode.INVALID_ARGUMENT, call(broker, c, p.UnmapRequest(id=1, buffer=buffer_id))
    )
    await call(broker, c, p.FreeRequest(id=1, buffer=buffer_id))
    await refused(ErrorCode.UNKNOWN_BUFFER, call(broker, c, p.FreeRequest(id=1, buffer=buffer_id)))
    await call(broker, c, p.CloseRequest(id=1, handle=handle))
    await refused(ErrorCode.UNKNOWN_HANDLE, call(broker, c, p.CloseRequest(id=1, handle=handle)))


async def test_ids_from_another_client_mean_nothing(broker: Broker) -> None:
    a, b = await client(broker), await client(broker)
    buffer_id, _ = await alloc(broker, a, 4096)
    handle = await open_handle(broker, a, ECHO_URI)
    await refused(ErrorCode.UNKNOWN_BUFFER, call(broker, b, p.MapRequest(id=1, buffer=buffer_id)))
    await refused(ErrorCode.UNKNOWN_BUFFER, call(broker, b, p.FreeRequest(id=1, buffer=buffer_id)))
    await refused(ErrorCode.UNKNOWN_HANDLE, invoke(broker, b, echo(handle, b"x", 1)))


async def test_bad_sizes_and_slices(broker: Broker) -> None:
    c = await client(broker)
    await refused(ErrorCode.DMA_BUF_ALLOC, call(broker, c, p.AllocRequest(id=1, size=0)))
    # beyond [client_limits] max_buffer_size (2 GiB by default): a limit, like the quotas
    largest = broker.config.client_limits.max_buffer_size
    await refused(ErrorCode.QUOTA_EXCEEDED, call(broker, c, p.AllocRequest(id=1, size=largest + 1)))
    buffer_id, buffer = await alloc(broker, c, 5000)
    assert buffer_id == 3  # the refused allocs took ids 1 and 2
    assert buffer.size == 8192
    handle = await open_handle(broker, c, ECHO_URI)

    def echo_slice(offset: int) -> p.InvokeRequest:
        return p.InvokeRequest(
            id=1,
            handle=handle,
            method=2,
            inputs=(
                p.InlineInput(data=struct.pack("<II", 8, 8)),
                p.BufferSlice(buffer=buffer_id, offset=offset, length=8),
            ),
            outputs=(p.InlineOutput(capacity=8),),
        )

    # Past the 5000 bytes asked for, inside the 8192 allocated: one size, the allocated one.
    buffer.view()[5000:5008] = b"pagetail"
    assert await invoke(broker, c, echo_slice(5000)) == (b"pagetail",)
    error = await refused(ErrorCode.SLICE_OUT_OF_RANGE, invoke(broker, c, echo_slice(8188)))
    assert str(error) == f"slice offset 8188 length 8 is outside buffer {buffer_id} of 8192 bytes"


async def test_a_failing_skel_is_invoke_failed_with_the_code(broker: Broker) -> None:
    c = await client(broker)
    handle = await open_handle(broker, c, ECHO_URI)
    lying = p.InvokeRequest(
        id=1,
        handle=handle,
        method=2,
        inputs=(p.InlineInput(data=struct.pack("<II", 99, 1)), p.InlineInput(data=b"x")),
        outputs=(p.InlineOutput(capacity=1),),
    )
    error = await refused(ErrorCode.INVOKE_FAILED, invoke(broker, c, lying))
    assert error.fields == {"code": 0x8000040E}
    await refused(
        ErrorCode.OPEN_FAILED,
        open_handle(broker, c, "file:///libnone_skel.so?none_skel_handle_invoke"),
    )


async def test_per_client_quotas() -> None:
    async with (
        running(
            "[client_limits]\nmax_buffers = 2\nmax_buffer_bytes = 16384\nmax_handles = 1\n"
            "max_calls_in_flight = 1\n"
        ) as b,
        trio.open_nursery() as nursery,
    ):
        c = await client(b)
        assert (await alloc(b, c, 4096))[0] == 1
        error = await refused(
            ErrorCode.QUOTA_EXCEEDED, call(b, c, p.AllocRequest(id=1, size=16384))
        )
        assert str(error) == "buffer bytes quota exceeded: the limit is 16384"
        # Every creating request takes its id, refused or not (PROTOCOL.md section 6).
        assert (await alloc(b, c, 4096))[0] == 3
        await refused(ErrorCode.QUOTA_EXCEEDED, call(b, c, p.AllocRequest(id=1, size=4096)))
        await refused(ErrorCode.DMA_BUF_ALLOC, call(b, c, p.AllocRequest(id=1, size=0)))
        handle = await open_handle(b, c, TEST_URI)
        assert handle == 6
        error = await refused(ErrorCode.QUOTA_EXCEEDED, open_handle(b, c, ECHO_URI))
        assert "handles quota" in str(error)
        await call(b, c, p.CloseRequest(id=1, handle=handle))
        assert await open_handle(b, c, TEST_URI) == 8
        handle = 8
        started = trio.Event()

        async def long_call() -> None:
            started.set()
            await invoke(b, c, busy(handle, 200_000))

        nursery.start_soon(long_call)
        await started.wait()
        await trio.sleep(0.01)
        error = await refused(ErrorCode.QUOTA_EXCEEDED, invoke(b, c, busy(handle, 1)))
        assert "calls in flight" in str(error)


async def test_global_limits() -> None:
    async with running("[limits]\nmax_clients = 1\nmax_buffers = 1\n") as b:
        c = await client(b)
        with pytest.raises(CodedError) as caught:
            await client(b)
        assert caught.value.code is ErrorCode.QUOTA_EXCEEDED
        await alloc(b, c, 4096)
        error = await refused(ErrorCode.QUOTA_EXCEEDED, call(b, c, p.AllocRequest(id=1, size=4096)))
        assert "daemon buffers" in str(error)


async def test_release_frees_everything_the_client_held(broker: Broker) -> None:
    c = await client(broker)
    for _ in range(10):
        buffer_id, _ = await alloc(broker, c, 65536)
        await call(broker, c, p.MapRequest(id=1, buffer=buffer_id))
    await open_handle(broker, c, ECHO_URI)
    sim = emulator(broker)
    assert sim.statistics().mem_maps == 10
    await broker.release_client(c, DOMAINS[c])
    assert broker.status().totals == p.Totals()
    assert sim.statistics().mem_maps == 0
    assert sim.statistics().remote_handles_open == 0
    assert broker.device.require_memory().statistics().buffers == 0
    assert default(broker).registry.statistics().mappings == 0


async def test_realtime_is_granted_only_to_listed_peers() -> None:
    b = make_broker("[access]\nrealtime_uids = [1234]\n")
    stranger = Client(pid=1, uid=999, gid=999)
    friend = Client(pid=2, uid=1234, gid=999)
    assert b.grant_priority(stranger, p.Priority.REALTIME) is p.Priority.NORMAL
    assert b.grant_priority(friend, p.Priority.REALTIME) is p.Priority.REALTIME
    assert b.grant_priority(stranger, p.Priority.BACKGROUND) is p.Priority.BACKGROUND


async def test_a_dsp_restart_releases_everyone_and_opens_a_new_epoch(broker: Broker) -> None:
    c = await client(broker)
    events: list[p.ServerEvent] = []
    c.send_event = events.append
    buffer_id, _ = await alloc(broker, c, 4096)
    handle = await open_handle(broker, c, ECHO_URI)
    sim = emulator(broker)
    sim.faults.subsystem_restart(down_for=0.3)
    await refused(ErrorCode.DSP_RESTARTED, invoke(broker, c, echo(handle, b"x", 1)))
    with trio.fail_after(10):
        while not events:
            await trio.sleep(0.02)
    assert len(events) == 1
    assert isinstance(events[0], p.SessionRestarted)
    assert events[0].epoch == 2
    assert events[0].domain == "default"
    assert default(broker).epoch == 2
    assert default(broker).restarts == 1
    # Its handles are gone, and say why; its buffers (protocol 3) live on, unmapped.
    await refused(ErrorCode.DSP_RESTARTED, invoke(broker, c, echo(handle, b"x", 1)))
    assert isinstance(await call(broker, c, p.MapRequest(id=1, buffer=buffer_id)), p.MapReply)
    # New work goes through the new session.
    new_handle = await open_handle(broker, c, ECHO_URI)
    assert new_handle > handle
    assert await invoke(broker, c, echo(new_handle, b"ok", 2)) == (b"ok",)
    assert broker.status().restarts == 1


async def test_a_version_2_clients_buffers_go_with_a_restart(broker: Broker) -> None:
    """Version 2 promised that a restart releases every id: such a client's buffers
    are released by the daemon (it closes its own copies when it is told)."""
    c = await client(broker)
    c.protocol_version = 2
    events: list[p.ServerEvent] = []
    c.send_event = events.append
    buffer_id, buffer = await alloc(broker, c, 4096)
    emulator(broker).faults.subsystem_restart(down_for=0.2)
    with trio.fail_after(10):
        while not events:
            await trio.sleep(0.02)
    await refused(ErrorCode.DSP_RESTARTED, call(broker, c, p.MapRequest(id=1, buffer=buffer_id)))
    assert buffer.released
    assert broker.device.require_memory().statistics().buffers == 0


async def test_shutting_down_refuses_new_work(broker: Broker) -> None:
    c = await client(broker)
    broker.device.stopping = True
    await refused(ErrorCode.SHUTTING_DOWN, call(broker, c, p.AllocRequest(id=1, size=4096)))
    broker.device.stopping = False


async def test_a_restart_noticed_only_by_the_listener_is_recovered_at_once(
    broker: Broker,
) -> None:
    c = await client(broker)
    events: list[p.ServerEvent] = []
    c.send_event = events.append
    emulator(broker).faults.subsystem_restart(down_for=0.2)
    # Nobody calls anything: the listener's pending next2 gets EPIPE, and that
    # alone starts the recovery (no status or watchdog round needed).
    with trio.fail_after(10):
        while not events:
            await trio.sleep(0.02)
    assert default(broker).epoch == 2
    assert default(broker).healthy()


async def test_a_dead_session_nobody_noticed_is_recovered_by_the_idle_check(
    broker: Broker,
) -> None:
    """A domain's trouble is the domain's: the daemon stays healthy (systemd's watchdog
    keeps being pinged) and the idle round restarts the domain."""
    domain = default(broker)
    session = domain.session
    assert session is not None
    session.on_dead = None  # as if the restart went unnoticed
    emulator(broker).faults.subsystem_restart(down_for=0.2)
    with trio.fail_after(10):
        while not session.dead:
            await trio.sleep(0.01)
    assert not domain.healthy()
    assert broker.healthy()
    broker.domains.check_sessions()  # what the status and watchdog loops do while idle
    with trio.fail_after(10):
        while domain.epoch < 2:
            await trio.sleep(0.02)
    assert domain.healthy()


async def test_inline_limits_and_timeouts_are_enforced_by_the_daemon(broker: Broker) -> None:
    c = await client(broker)
    handle = await open_handle(broker, c, ECHO_URI)
    assert c.limits is not None
    limit = c.limits.max_inline_bytes
    greedy = p.InvokeRequest(
        id=1,
        handle=handle,
        method=2,
        inputs=(p.InlineInput(data=struct.pack("<II", 1, 1)), p.InlineInput(data=b"x")),
        outputs=tuple(p.InlineOutput(capacity=limit // 2 + 1) for _ in range(2)),
    )
    error = await refused(ErrorCode.QUOTA_EXCEEDED, invoke(broker, c, greedy))
    assert "inline output bytes quota exceeded" in str(error)
    patient = echo(handle, b"x", 1, timeout_ms=c.limits.max_timeout_ms + 1)
    await refused(ErrorCode.INVALID_ARGUMENT, invoke(broker, c, patient))


async def test_the_reply_fd_is_this_buffers_even_if_it_is_freed_at_once(broker: Broker) -> None:
    c = await client(broker)
    allocated = await answer(broker, c, p.AllocRequest(id=1, size=8192))
    assert isinstance(allocated.reply, p.AllocReply)
    assert allocated.fd is not None
    reply_fd, buffer = allocated.fd, buffer_of(c, allocated.reply.buffer)
    # A pipelined Free runs before the reply goes out.
    await call(broker, c, p.FreeRequest(id=2, buffer=allocated.reply.buffer))
    assert buffer.parked  # kept by the pool for this client
    assert not buffer.released
    try:
        assert os.fstat(reply_fd.fileno()).st_size == 8192  # still that DMA-BUF
        assert os.readlink(f"/proc/self/fd/{reply_fd.fileno()}").startswith("/memfd:")
    finally:
        reply_fd.close()


async def test_no_default_timeout_is_announced_unless_configured(broker: Broker) -> None:
    limits = (await client(broker)).limits
    assert limits is not None
    assert limits.default_timeout_ms is None


def test_a_default_timeout_above_the_largest_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"client_limits\.default_timeout_s: .* <= 600"):
        parse_config("[client_limits]\ndefault_timeout_s = 600.001\n")


@pytest.mark.parametrize(("seconds", "announced"), [(0.03, 30), (2.5, 2500), (0.0001, 1)])
async def test_the_default_timeout_is_announced_in_milliseconds(
    seconds: float, announced: int
) -> None:
    async with running(f"[client_limits]\ndefault_timeout_s = {seconds}\n") as broker:
        limits = (await client(broker)).limits
        assert limits is not None
        assert limits.default_timeout_ms == announced


async def test_a_client_gone_while_its_alloc_runs_leaks_nothing(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = await client(broker)
    memory = broker.device.require_memory()
    real_allocate = memory.allocate

    def allocate_while_the_client_leaves(*args: Any, **kwargs: Any) -> tuple[DmaBuffer, Any]:
        c.objects.take_all()  # the connection ended meanwhile
        return real_allocate(*args, **kwargs)

    monkeypatch.setattr(memory, "allocate", allocate_while_the_client_leaves)
    await refused(ErrorCode.DSP_RESTARTED, call(broker, c, p.AllocRequest(id=1, size=4096)))
    assert memory.statistics().buffers == 0  # what nobody will ever name was let go


async def test_status_shows_other_users_only_as_counts(broker: Broker) -> None:
    """Another user's pids, client names and models are theirs: a client sees the rows of
    its own uid, root and npud's own user see every row, and the totals count everyone
    (issue 16, item 8)."""
    mine = await client(broker, uid=1000)
    also_mine = await client(broker, uid=1000)
    theirs = await client(broker, uid=1001)
    root = await client(broker, uid=0)
    seen = broker.status(mine)
    assert {row.uid for row in seen.clients} == {1000}
    assert len(seen.clients) == 2
    assert seen.totals.clients == 4
    assert {row.uid for row in broker.status(theirs).clients} == {1001}
    assert len(broker.status(root).clients) == 4
    assert len(broker.status().clients) == 4
    for c in (mine, also_mine, theirs, root):
        await broker.release_client(c, DOMAINS[c])


def test_realtime_is_for_the_users_and_groups_the_configuration_names() -> None:
    """With nothing named, only root and npud's own user may be realtime (it was open to
    every allowed peer); groups may be named, and a name the system lacks grants nothing
    (issue 16, item 6)."""
    closed = make_broker()
    stranger = Client(pid=1, uid=1000, gid=1000, groups=(1000, 1001))
    assert closed.grant_priority(stranger, p.Priority.REALTIME) is p.Priority.NORMAL
    assert closed.grant_priority(stranger, p.Priority.BACKGROUND) is p.Priority.BACKGROUND
    assert closed.grant_priority(Client(pid=2, uid=0, gid=0), p.Priority.REALTIME) is (
        p.Priority.REALTIME
    )
    root_group = grp.getgrgid(0).gr_name
    by_name = make_broker(f"[access]\nrealtime_groups = ['{root_group}', 'no-such-group']\n")
    member = Client(pid=3, uid=1000, gid=1000, groups=(1000, 0))
    assert by_name.grant_priority(member, p.Priority.REALTIME) is p.Priority.REALTIME
    assert by_name.grant_priority(stranger, p.Priority.REALTIME) is p.Priority.NORMAL
    by_uid = make_broker("[access]\nrealtime_uids = [1000]\nrealtime_groups = []\n")
    assert by_uid.grant_priority(stranger, p.Priority.REALTIME) is p.Priority.REALTIME


async def test_a_reload_that_takes_a_user_off_the_list_demotes_its_clients() -> None:
    async with running("[access]\nrealtime_uids = [1000]\n") as broker:
        voice = await client(broker, priority=p.Priority.REALTIME, uid=1000)
        assert voice.account is not None
        assert voice.account.budget is not None  # the default budget: it declared none
        broker.config = msgspec.structs.replace(
            broker.config, access=msgspec.structs.replace(broker.config.access, realtime_uids=())
        )
        assert voice.priority is p.Priority.NORMAL
        assert voice.account.klass == NORMAL
        assert broker.scheduler.statistics().realtime_declared == 0
        assert broker.status().clients[0].priority == "normal"
        await broker.release_client(voice, DOMAINS[voice])
