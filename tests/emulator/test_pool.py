"""The buffer pool (npud/domain/pool.py) and the daemon's memory (npud/domain/memory.py)
over a real session on the emulator: what is kept, what is zeroed and when, who gets a
kept buffer, what is released (and when), and how mappings kept with a buffer behave."""

from __future__ import annotations

import ctypes
import mmap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from npu_protocol import ErrorCode
from npud.domain.memory import Memory
from npud.domain.pool import BufferPool
from npud.domain.registry import Registry
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Inline, Slice
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.ops.config import PoolConfig
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver
from tests.emulator.conftest import ECHO_URI, fastrpc_threads, open_fds

PAGE = mmap.PAGESIZE


class Lane:
    """A control lane, run by hand: jobs wait until the test runs them."""

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


class Released:
    """The pool's ``release``: lets go of a buffer as the daemon's memory would."""

    def __init__(self) -> None:
        self.buffers: list[DmaBuffer] = []

    def __call__(self, buffer: DmaBuffer) -> None:
        self.buffers.append(buffer)
        if buffer.request_release():
            buffer.release()


@pytest.fixture
def sim() -> EmulatedDriver:
    return EmulatedDriver()


@pytest.fixture
def session(sim: EmulatedDriver) -> Iterator[FastRpcSession]:
    """A loaded session; at the end every buffer is released and no fd is left."""
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


@pytest.fixture
def released() -> Released:
    return Released()


@pytest.fixture
def registry(session: FastRpcSession, lane: Lane) -> Registry:
    return Registry(lane.submit, lambda: session)


def make_pool(released: Released, clock: Clock, **settings: object) -> BufferPool:
    return BufferPool(PoolConfig(**settings), released, clock=clock)  # type: ignore[arg-type]


def dirty(session: FastRpcSession, size: int) -> DmaBuffer:
    """A buffer its holder owns (as the daemon owns a heap buffer), written all over."""
    buffer = session.alloc_unowned(size)
    buffer.view()[:] = b"\xa5" * size
    return buffer


def let_go(buffer: DmaBuffer) -> None:
    if buffer.request_release():
        buffer.release()


def test_a_kept_buffer_is_zeroed_before_anyone_gets_it(
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released
) -> None:
    pool = make_pool(released, clock)
    buffer = dirty(session, 3 * PAGE)
    fd = buffer.fd
    assert pool.give("a", buffer, None, lane.submit)
    assert buffer.parked
    assert not buffer.released
    # Not zeroed yet: no allocation may have it. The zeroing waits on the lane.
    assert pool.take("a", 3 * PAGE, None) is None
    assert pool.row().scrubbing == 1
    lane.run()
    taken = pool.take("a", 3 * PAGE, None)
    assert taken is not None
    again, mapping = taken
    assert (again, mapping) == (buffer, None)
    assert again.fd == fd
    assert not again.parked
    assert bytes(again.view()) == bytes(3 * PAGE)
    row = pool.row()
    assert (row.hits, row.misses, row.kept, row.buffers, row.bytes) == (1, 1, 1, 0, 0)
    assert row.scrubbed_bytes == 3 * PAGE
    let_go(again)


def test_only_its_scope_and_its_exact_size_get_a_kept_buffer(
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released
) -> None:
    pool = make_pool(released, clock)
    buffer = dirty(session, 2 * PAGE)
    assert pool.give("a", buffer, None, lane.submit)
    lane.run()
    assert pool.take("b", 2 * PAGE, None) is None
    assert pool.take("a", PAGE, None) is None
    assert pool.take("a", 3 * PAGE, None) is None
    assert pool.take("a", 2 * PAGE, None) == (buffer, None)
    let_go(buffer)


def test_the_scope_follows_the_share_setting(released: Released, clock: Clock) -> None:
    connection = object()
    assert make_pool(released, clock).scope(connection, 1000) is connection
    by_user = make_pool(released, clock, share="user")
    assert by_user.scope(connection, 1000) == by_user.scope(object(), 1000)
    assert by_user.scope(connection, 1000) != by_user.scope(connection, 1001)


def test_a_buffer_an_invoke_still_uses_is_never_kept(
    session: FastRpcSession, sim: EmulatedDriver, lane: Lane, clock: Clock, released: Released
) -> None:
    """The DSP may still write into it: a later holder would see what it writes."""
    pool = make_pool(released, clock)
    handle = session.remote_open(ECHO_URI)
    buffer = session.alloc_unowned(PAGE)
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
        assert not pool.give("a", buffer, None, lane.submit)
        assert not buffer.parked
        assert pool.row().passed == 1
        let_go(buffer)  # what the caller does then: released once the invoke returns
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
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released
) -> None:
    pool = make_pool(released, clock, max_bytes=3 * PAGE)
    first, second, third = dirty(session, PAGE), dirty(session, PAGE), dirty(session, 2 * PAGE)
    lane_run_between = [pool.give("a", b, None, lane.submit) for b in (first, second)]
    lane.run()  # the first two are zeroed (not being zeroed, they can be let go)
    assert lane_run_between == [True, True]
    assert pool.give("a", third, None, lane.submit)
    assert first.released
    assert not second.released
    assert not third.released
    row = pool.row()
    assert (row.buffers, row.bytes, row.evicted, row.kept) == (2, 3 * PAGE, 1, 3)
    lane.run()
    assert pool.take("a", PAGE, None) == (second, None)
    assert pool.take("a", 2 * PAGE, None) == (third, None)
    for buffer in (second, third):
        let_go(buffer)


def test_what_is_too_large_mapped_without_leave_or_off_is_not_kept(
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released, registry: Registry
) -> None:
    pool = make_pool(released, clock, max_buffer_bytes=2 * PAGE, keep_dsp_mappings=False)
    large = dirty(session, 3 * PAGE)
    assert not pool.give("a", large, None, lane.submit)
    mapped = dirty(session, PAGE)
    lease = registry.map(session, mapped)
    assert not pool.give("a", mapped, lease, lane.submit)  # the caller unmaps it first
    assert pool.row().passed == 2
    off = make_pool(released, clock, enabled=False)
    small = dirty(session, PAGE)
    assert not off.give("a", small, None, lane.submit)
    assert off.take("a", PAGE, None) is None
    assert off.row().misses == 0  # the pool did not look
    registry.unmap(session, lease, going=True)
    for buffer in (large, mapped, small):
        let_go(buffer)
    assert mapped.released


def test_a_buffer_no_allocation_takes_is_released_after_idle_s(
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released
) -> None:
    pool = make_pool(released, clock, idle_s=10.0)
    assert pool.next_trim_in() == 10.0
    buffer = dirty(session, PAGE)
    assert pool.give("a", buffer, None, lane.submit)
    lane.run()
    clock.now += 9.5
    assert pool.next_trim_in() == pytest.approx(0.5)
    pool.trim()
    assert not buffer.released
    assert pool.holds()
    clock.now += 0.5
    pool.trim()
    assert buffer.released
    assert released.buffers == [buffer]
    assert not pool.holds()
    assert pool.row().trimmed == 1


def test_a_scope_that_ends_releases_its_buffers_even_one_being_zeroed(
    session: FastRpcSession,
    lane: Lane,
    clock: Clock,
    released: Released,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = make_pool(released, clock)
    mine, other = dirty(session, PAGE), dirty(session, PAGE)
    zero = mine.zero

    def zero_while_the_connection_ends() -> bool:
        pool.drop("a")  # as from another lane, while this one zeroes
        assert not mine.released  # not under the zeroing's feet
        return zero()

    monkeypatch.setattr(mine, "zero", zero_while_the_connection_ends)
    assert pool.give("a", mine, None, lane.submit)
    assert pool.give("b", other, None, lane.submit)
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


def test_a_kept_buffer_keeps_its_dsp_mapping_for_its_own_domain_only(
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released, registry: Registry
) -> None:
    pool = make_pool(released, clock)
    buffer = dirty(session, PAGE)
    lease = registry.map(session, buffer)
    assert pool.give("a", buffer, lease, lane.submit)
    lane.run()
    assert pool.row().mapped == 1
    other_domain = Registry(lane.submit, lambda: session)
    assert pool.take("a", PAGE, other_domain) is None  # never seen by another DSP process
    taken = pool.take("a", PAGE, registry)
    assert taken == (buffer, lease)
    assert lease.valid
    second = registry.map(session, buffer)
    assert second.address == lease.address  # the same mapping
    assert registry.statistics().mapping_leases == 2
    registry.unmap(session, lease, going=True)
    assert session.address_of(buffer) == lease.address  # one lease still holds it
    registry.unmap(session, second, going=True)
    assert session.address_of(buffer) is None
    let_go(buffer)
    assert buffer.released


def test_a_restart_of_the_domain_leaves_kept_buffers_kept_and_unmapped(
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released, registry: Registry
) -> None:
    pool = make_pool(released, clock)
    buffer = dirty(session, PAGE)
    lease = registry.map(session, buffer)
    assert pool.give("a", buffer, lease, lane.submit)
    lane.run()
    registry.forget_all()  # the domain's DSP process is gone
    assert not lease.valid
    assert pool.row().mapped == 0
    other_domain = Registry(lane.submit, lambda: session)
    assert pool.take("a", PAGE, other_domain) == (buffer, None)  # unmapped: anyone's now
    let_go(buffer)
    assert not buffer.released  # the old session still counts its mapping until it closes
    # The session fixture's close drops it; the buffer is released then.


def test_releasing_a_mapped_kept_buffer_unmaps_it_on_its_lane_first(
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released, registry: Registry
) -> None:
    pool = make_pool(released, clock)
    buffer = dirty(session, PAGE)
    lease = registry.map(session, buffer)
    assert pool.give("a", buffer, lease, lane.submit)
    lane.run()
    pool.drop("a")
    assert released.buffers == []  # not before its domain's lane unmapped it
    assert session.address_of(buffer) == lease.address
    lane.run()
    assert session.address_of(buffer) is None
    assert released.buffers == [buffer]
    assert buffer.released


def test_an_allocation_that_fails_gets_the_pools_memory(
    session: FastRpcSession, lane: Lane
) -> None:
    memory = Memory(None, PoolConfig())
    kept, _ = memory.allocate(PAGE, "a", None, session.alloc_unowned)
    assert memory.free("a", kept, None, lane.submit)
    lane.run()
    failures = iter([RpcError(ErrorCode.DMA_BUF_ALLOC, msg="ENOMEM")])

    def short_of_memory(size: int) -> DmaBuffer:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return session.alloc_unowned(size)

    fresh, _ = memory.allocate(2 * PAGE, "b", None, short_of_memory)
    assert kept.released
    assert fresh.size == 2 * PAGE
    assert memory.pool.row().evicted == 1
    # With nothing kept, the failure is the caller's.
    failures = iter([RpcError(ErrorCode.DMA_BUF_ALLOC, msg="ENOMEM")])
    with pytest.raises(RpcError) as caught:
        memory.allocate(2 * PAGE, "b", None, short_of_memory)
    assert caught.value.code is ErrorCode.DMA_BUF_ALLOC
    assert memory.statistics().buffers == 1
    memory.release(fresh)
    memory.release(fresh)  # once
    assert fresh.released
    assert memory.statistics().buffers == 0


def test_a_reload_releases_what_its_new_settings_do_not_allow(
    session: FastRpcSession, lane: Lane, clock: Clock, released: Released
) -> None:
    pool = make_pool(released, clock)
    small, large = dirty(session, PAGE), dirty(session, 4 * PAGE)
    assert pool.give("a", small, None, lane.submit)
    assert pool.give("a", large, None, lane.submit)
    lane.run()
    pool.reconfigure(PoolConfig(max_bytes=2 * PAGE))  # a lower bound: trimmed to fit
    assert large.released
    assert not small.released
    pool.reconfigure(PoolConfig(max_bytes=2 * PAGE, share="user"))  # other scopes: all go
    assert small.released
    assert pool.row().buffers == 0
    assert pool.row().dropped == 1
    assert pool.row().evicted == 1


def test_zeroing_lets_go_of_the_gil() -> None:
    """The zeroing runs on a control lane while workers serve invokes: it must not hold
    the GIL. ctypes releases it around a foreign call unless the function is a
    PYFUNCTYPE one (FUNCFLAG_PYTHONAPI); ctypes.memset is not."""
    assert not ctypes.memset._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]
