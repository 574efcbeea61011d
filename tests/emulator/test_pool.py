"""The buffer pool (npud/pool.py) over a real session on the emulator: what is kept, what is
zeroed and when, who gets a kept buffer, and what is released (and when)."""

from __future__ import annotations

import ctypes
import mmap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from npu_protocol import ErrorCode
from npud.backend import DEV_SHELL
from npud.config import PoolConfig
from npud.fastrpc.dma import SessionBuffer
from npud.fastrpc.errors import RpcError
from npud.fastrpc.invoke_args import Inline, Slice
from npud.fastrpc.session import FastRpcSession
from npud.pool import BufferPool
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver
from tests.emulator.conftest import ECHO_URI, fastrpc_threads, open_fds

PAGE = mmap.PAGESIZE


class Lane:
    """The control lane, run by hand: jobs wait until the test runs them."""

    def __init__(self) -> None:
        self.jobs: list[Callable[[], None]] = []

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.append(job)

    def run(self) -> None:
        while self.jobs:
            self.jobs.pop(0)()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sim() -> EmulatedDriver:
    return EmulatedDriver()


@pytest.fixture
def session(sim: EmulatedDriver) -> Iterator[FastRpcSession]:
    """A loaded session; its close must release every buffer, kept ones included."""
    fds_before = open_fds()
    s = FastRpcSession.open(sim, library_path=(DSP_LIBRARY_DIR,))
    s.load_shell(DEV_SHELL.read_bytes())
    yield s
    s.close()
    assert open_fds() == fds_before, "fds leaked"
    assert not fastrpc_threads()


@pytest.fixture
def lane() -> Lane:
    return Lane()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_pool(session: FastRpcSession, lane: Lane, clock: Clock, **settings: object) -> BufferPool:
    pool = BufferPool(PoolConfig(**settings), lane.submit, clock=clock)  # type: ignore[arg-type]
    pool.attach(session)
    return pool


def dirty(session: FastRpcSession, size: int) -> SessionBuffer:
    buffer = session.alloc(size)
    buffer.view()[:] = b"\xa5" * size
    return buffer


def test_a_kept_buffer_is_zeroed_before_anyone_gets_it(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    pool = make_pool(session, lane, clock)
    buffer = pool.allocate(session, "a", 3 * PAGE)
    buffer.view()[:] = b"secret!!" * (3 * PAGE // 8)
    fd = buffer.fd
    assert pool.give(session, "a", buffer)
    assert buffer.parked
    assert not buffer.released
    # Not zeroed yet: no allocation may have it. The zeroing waits on the lane.
    assert pool.take(session, "a", 3 * PAGE) is None
    assert pool.row().scrubbing == 1
    lane.run()
    again = pool.allocate(session, "a", 3 * PAGE)
    assert again is buffer
    assert again.fd == fd
    assert not again.parked
    assert bytes(again.view()) == bytes(3 * PAGE)
    row = pool.row()
    assert (row.hits, row.misses, row.kept, row.buffers, row.bytes) == (1, 2, 1, 0, 0)
    assert row.scrubbed_bytes == 3 * PAGE
    session.free(again)


def test_only_its_scope_and_its_exact_size_get_a_kept_buffer(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    pool = make_pool(session, lane, clock)
    buffer = dirty(session, 2 * PAGE)
    assert pool.give(session, "a", buffer)
    lane.run()
    assert pool.take(session, "b", 2 * PAGE) is None
    assert pool.take(session, "a", PAGE) is None
    assert pool.take(session, "a", 3 * PAGE) is None
    assert pool.take(session, "a", 2 * PAGE) is buffer
    session.free(buffer)


def test_the_scope_follows_the_share_setting(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    connection = object()
    assert make_pool(session, lane, clock).scope(connection, 1000) is connection
    by_user = make_pool(session, lane, clock, share="user")
    assert by_user.scope(connection, 1000) == by_user.scope(object(), 1000)
    assert by_user.scope(connection, 1000) != by_user.scope(connection, 1001)


def test_a_buffer_an_invoke_still_uses_is_never_kept(
    session: FastRpcSession, sim: EmulatedDriver, lane: Lane, clock: Clock
) -> None:
    """The DSP may still write into it: a later holder would see what it writes."""
    pool = make_pool(session, lane, clock)
    handle = session.remote_open(ECHO_URI)
    buffer = session.alloc(PAGE)
    sim.faults.set_latency(0.3)
    prim = (PAGE).to_bytes(4, "little") * 2
    results: list[object] = []
    call = threading.Thread(
        target=lambda: results.append(
            session.invoke(
                handle, 0x02020100, [Inline(prim), Inline(b"\x77" * PAGE)], [Slice(buffer, 0, PAGE)]
            )
        )
    )
    call.start()
    try:
        deadline = time.monotonic() + 10
        while session.statistics().invokes_in_flight == 0:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert not pool.give(session, "a", buffer)
        assert not buffer.parked
        assert pool.row().passed == 1
        session.free(buffer)  # what the caller does then: released once the invoke returns
        assert not buffer.released
    finally:
        call.join()
        sim.faults.clear()
    assert buffer.released
    assert not lane.jobs
    assert pool.row().buffers == 0
    session.remote_close(handle)


def test_a_parked_buffer_cannot_be_pinned_and_a_pinned_one_cannot_be_parked(
    session: FastRpcSession,
) -> None:
    buffer = session.alloc(PAGE)
    buffer.pin()
    assert not buffer.park()
    buffer.unpin()
    assert buffer.park()
    assert not buffer.park()  # once
    with pytest.raises(RpcError) as caught:
        buffer.pin()
    assert caught.value.code is ErrorCode.UNKNOWN_BUFFER
    buffer.unpark()
    buffer.pin()
    buffer.unpin()
    session.free(buffer)
    assert buffer.released
    assert not buffer.zero()  # nothing to write through any more


def test_the_longest_kept_go_first_to_stay_within_max_bytes(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    pool = make_pool(session, lane, clock, max_bytes=3 * PAGE)
    first, second, third = dirty(session, PAGE), dirty(session, PAGE), dirty(session, 2 * PAGE)
    assert pool.give(session, "a", first)
    assert pool.give(session, "a", second)
    assert pool.give(session, "a", third)
    assert first.released
    assert not second.released
    assert not third.released
    row = pool.row()
    assert (row.buffers, row.bytes, row.evicted, row.kept) == (2, 3 * PAGE, 1, 3)
    lane.run()
    assert pool.take(session, "a", PAGE) is second
    assert pool.take(session, "a", 2 * PAGE) is third
    for buffer in (second, third):
        session.free(buffer)


def test_what_is_too_large_or_foreign_is_not_kept(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    pool = make_pool(session, lane, clock, max_buffer_bytes=2 * PAGE)
    large = dirty(session, 3 * PAGE)
    assert not pool.give(session, "a", large)
    session.free(large)
    assert not pool.give(session, "a", large)  # no longer the session's
    assert not pool.give(None, "a", dirty(session, PAGE))  # no session (a restart)
    assert pool.row().passed == 3
    off = make_pool(session, lane, clock, enabled=False)
    small = dirty(session, PAGE)
    assert not off.give(session, "a", small)
    assert off.take(session, "a", PAGE) is None
    assert off.row().misses == 0  # the pool did not look
    session.free(small)


def test_a_buffer_no_allocation_takes_is_released_after_idle_seconds(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    pool = make_pool(session, lane, clock, idle_seconds=10.0)
    assert pool.next_trim_in() == 10.0
    buffer = dirty(session, PAGE)
    assert pool.give(session, "a", buffer)
    lane.run()
    clock.now += 9.5
    assert pool.next_trim_in() == pytest.approx(0.5)
    pool.trim()
    assert not buffer.released
    assert pool.holds()
    clock.now += 0.5
    pool.trim()
    assert buffer.released
    assert not pool.holds()
    assert pool.row().trimmed == 1


def test_a_scope_that_ends_releases_its_buffers_even_one_being_zeroed(
    session: FastRpcSession, lane: Lane, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool(session, lane, clock)
    mine, other = dirty(session, PAGE), dirty(session, PAGE)
    zero = mine.zero

    def zero_while_the_connection_ends() -> bool:
        pool.drop("a")  # as from the loader lane, while the control lane zeroes
        assert not mine.released  # not under the zeroing's feet
        return zero()

    monkeypatch.setattr(mine, "zero", zero_while_the_connection_ends)
    assert pool.give(session, "a", mine)
    assert pool.give(session, "b", other)
    assert pool.holds("a")
    assert pool.holds("b")
    lane.run()
    assert mine.released
    assert not other.released
    assert not pool.holds("a")
    assert pool.holds("b")
    assert pool.row().dropped == 1
    assert pool.row().bytes == PAGE
    pool.drop("b")
    assert other.released


def test_a_kept_buffer_keeps_its_dsp_mapping_unless_told_not_to(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    pool = make_pool(session, lane, clock)
    buffer = dirty(session, PAGE)
    address = session.map(buffer)
    assert pool.give(session, "a", buffer)
    lane.run()
    assert pool.row().mapped == 1
    again = pool.take(session, "a", PAGE)
    assert again is buffer
    assert again.dsp_address == address
    assert session.map(again) == address  # no new mapping
    unmapping = make_pool(session, lane, clock, keep_dsp_mappings=False)
    assert unmapping.give(session, "a", again)
    assert again.dsp_address is None
    lane.run()
    session.free(unmapping.take(session, "a", PAGE) or again)


def test_a_restart_forgets_the_kept_buffers_and_the_sessions_close_releases_them(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    pool = make_pool(session, lane, clock)
    buffer = dirty(session, PAGE)
    session.map(buffer)
    assert pool.give(session, "a", buffer)
    lane.run()
    pool.detach()
    assert not pool.holds()
    assert not buffer.released
    assert pool.row().dropped == 1
    assert pool.take(session, "a", PAGE) is None  # not the pool's session any more
    assert not pool.give(session, "a", dirty(session, PAGE))
    # The session fixture closes the session: it releases both, and checks no fd is left.


def test_an_allocation_that_fails_gets_the_pools_memory(
    session: FastRpcSession, lane: Lane, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool(session, lane, clock)
    kept = dirty(session, PAGE)
    assert pool.give(session, "a", kept)
    lane.run()
    alloc = session.alloc
    failures = iter([RpcError(ErrorCode.DMA_BUF_ALLOC, msg="ENOMEM")])

    def short_of_memory(size: int) -> SessionBuffer:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return alloc(size)

    monkeypatch.setattr(session, "alloc", short_of_memory)
    fresh = pool.allocate(session, "b", 2 * PAGE)
    assert kept.released
    assert fresh.size == 2 * PAGE
    assert pool.row().evicted == 1
    # With nothing kept, the failure is the caller's.
    failures = iter([RpcError(ErrorCode.DMA_BUF_ALLOC, msg="ENOMEM")])
    with pytest.raises(RpcError) as caught:
        pool.allocate(session, "b", 2 * PAGE)
    assert caught.value.code is ErrorCode.DMA_BUF_ALLOC
    session.free(fresh)


def test_a_reload_releases_what_its_new_settings_do_not_allow(
    session: FastRpcSession, lane: Lane, clock: Clock
) -> None:
    pool = make_pool(session, lane, clock)
    small, large = dirty(session, PAGE), dirty(session, 4 * PAGE)
    assert pool.give(session, "a", small)
    assert pool.give(session, "a", large)
    lane.run()
    pool.reconfigure(PoolConfig(max_bytes=2 * PAGE))  # a lower bound: trimmed to fit
    lane.run()
    assert large.released
    assert not small.released
    pool.reconfigure(PoolConfig(max_bytes=2 * PAGE, share="user"))  # other scopes: all go
    lane.run()
    assert small.released
    assert pool.row().buffers == 0
    assert pool.row().dropped == 1
    assert pool.row().evicted == 1


def test_zeroing_lets_go_of_the_gil() -> None:
    """The zeroing runs on the control lane while workers serve invokes: it must not hold
    the GIL. ctypes releases it around a foreign call unless the function is a
    PYFUNCTYPE one (FUNCFLAG_PYTHONAPI); ctypes.memset is not."""
    assert not ctypes.memset._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_a_restart_while_a_buffer_is_being_zeroed_leaves_it_to_the_sessions_close(
    session: FastRpcSession, lane: Lane, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung DSP must not be asked to unmap it: the dying session's close releases it."""
    pool = make_pool(session, lane, clock)
    buffer = dirty(session, PAGE)
    session.map(buffer)
    zero = buffer.zero

    def zero_while_the_dsp_restarts() -> bool:
        pool.detach()  # as the trio thread does when recovery starts
        return zero()

    monkeypatch.setattr(buffer, "zero", zero_while_the_dsp_restarts)
    assert pool.give(session, "a", buffer)
    lane.run()
    assert not buffer.released
    assert session.owns(buffer)
    assert pool.row().buffers == 0
    # The session fixture's close releases it (and checks that no fd is left).
