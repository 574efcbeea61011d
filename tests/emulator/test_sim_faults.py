"""Fault injection: subsystem restart, injected DSP results, latency, session exhaustion."""

from __future__ import annotations

import ctypes
import errno
import math
import os
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver, SimConfig
from tests.emulator.sim_helpers import (
    NPU_TEST_URI,
    PAGE,
    SC_ECHO,
    SC_REMOTECTL_OPEN,
    Arg,
    ReverseResponder,
    alloc_dma_buf,
    busy,
    echo,
    errno_of,
    init_create,
    invoke_args,
    mem_map,
    mmap_heap,
    open_fd_count,
    open_skel,
    remotectl_open,
    running_process,
)
from tests.polling import wait_until


@pytest.fixture
def driver() -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver()
    yield driver
    stats = driver.statistics()
    assert (stats.device_fds_open, stats.releases_pending, stats.invokes_in_flight) == (0, 0, 0)


class _Background:
    """Runs ``function`` on a thread and keeps what it returned or raised."""

    def __init__(self, function: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self._function = function
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._function()
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self._thread.join(10)
        assert not self._thread.is_alive()


def _errno_of_error(error: BaseException | None) -> int | None:
    """The errno of a failure kept by a background thread (None when it did not fail so)."""
    return error.errno if isinstance(error, OSError) else None


# -- subsystem restart --------------------------------------------------------------------


def test_ssr_fails_an_in_flight_invoke_and_the_listener_with_epipe(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        responder = ReverseResponder(driver, fd).start()
        handle = open_skel(driver, fd, NPU_TEST_URI)
        worker = _Background(lambda: busy(driver, fd, handle, 60_000_000))  # a minute
        wait_until(lambda: driver.statistics().invokes_in_flight == 2)  # listener + busy
        driver.faults.subsystem_restart()
        worker.join()
        responder.join()
        assert _errno_of_error(worker.error) == errno.EPIPE
        assert _errno_of_error(responder.exit_error) == errno.EPIPE
        stats = driver.statistics()
        assert (stats.restarts, stats.dsp_up, stats.dsp_processes, stats.remote_handles_open) == (
            1,
            False,
            0,
            0,
        )
    finally:
        driver.close(fd)


def test_the_256th_outstanding_call_is_enospc(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        responder = ReverseResponder(driver, fd).start()  # holds one context
        handle = open_skel(driver, fd, NPU_TEST_URI)
        workers = [_Background(lambda: busy(driver, fd, handle, 60_000_000)) for _ in range(254)]
        wait_until(lambda: driver.statistics().invokes_in_flight == 255)
        assert errno_of(busy, driver, fd, handle, 0) == errno.ENOSPC
        driver.faults.subsystem_restart()
        for worker in workers:
            worker.join()
        responder.join()
        assert {_errno_of_error(worker.error) for worker in workers} == {errno.EPIPE}
    finally:
        driver.close(fd)


def test_ssr_fails_a_pending_skel_load() -> None:
    driver = EmulatedDriver(SimConfig(reverse_rpc_timeout=60))
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        opener = _Background(lambda: remotectl_open(driver, fd, NPU_TEST_URI))
        wait_until(lambda: driver.statistics().reverse_requests_pending == 1)
        driver.faults.subsystem_restart()
        opener.join()
        assert _errno_of_error(opener.error) == errno.EPIPE
    finally:
        driver.close(fd)


def test_every_later_call_on_an_old_fd_is_epipe(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    blank = driver.open(abi.CDSP_NODE, os.O_RDWR)
    buf = alloc_dma_buf(driver, fd, PAGE)
    try:
        assert init_create(driver, fd) == 0
        vaddr = mem_map(driver, fd, buf, PAGE)
        heap = mmap_heap(driver, fd, PAGE)
        driver.faults.subsystem_restart()
        calls: list[Callable[[], object]] = [
            lambda: invoke_args(driver, fd, 0x1000010, SC_ECHO, [Arg(0, 0)] * 3),
            lambda: invoke_args(driver, fd, 1, 0, []),  # EPIPE comes before EPERM
            lambda: init_create(driver, blank),
            lambda: driver.ioctl(blank, abi.FASTRPC_IOCTL_INIT_ATTACH, None),
            lambda: driver.ioctl(blank, abi.FASTRPC_IOCTL_INIT_ATTACH_SNS, None),
            lambda: mmap_heap(driver, fd, PAGE),
            lambda: mem_map(driver, fd, buf, PAGE),
            lambda: driver.ioctl(
                fd, abi.FASTRPC_IOCTL_MEM_UNMAP, abi.fastrpc_mem_unmap(fd=buf, vaddr=vaddr)
            ),
            lambda: driver.ioctl(
                fd, abi.FASTRPC_IOCTL_MUNMAP, abi.fastrpc_req_munmap(vaddrout=heap, size=PAGE)
            ),
        ]
        for function in calls:
            assert errno_of(function) == errno.EPIPE
        # Lookups that fail before the DSP is asked keep their own errno.
        missing = abi.fastrpc_mem_unmap(fd=buf, vaddr=vaddr + PAGE)
        assert errno_of(driver.ioctl, fd, abi.FASTRPC_IOCTL_MEM_UNMAP, missing) == (errno.EINVAL)
        # ALLOC_DMA_BUFF never involves the DSP: the kernel still serves it.
        driver.close(alloc_dma_buf(driver, fd, PAGE))
        assert driver.statistics().mem_maps == 1  # kept until close
    finally:
        driver.close(buf)
        driver.close(blank)
        driver.close(fd)
    assert driver.statistics().mem_maps == 0


def test_the_nodes_vanish_until_boot(driver: EmulatedDriver) -> None:
    old = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    driver.faults.subsystem_restart()
    for path in (abi.CDSP_SECURE_NODE, abi.CDSP_NODE):
        assert errno_of(driver.open, path, os.O_RDWR) == errno.ENOENT
    driver.faults.boot()
    assert driver.statistics().dsp_up
    fresh = driver.open(abi.CDSP_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fresh) == 0
        assert errno_of(init_create, driver, old) == errno.EPIPE
        assert (
            driver.statistics().sessions_in_use == 1
        )  # the old fd's session died with its channel
    finally:
        driver.close(fresh)
        driver.close(old)


def test_a_full_session_works_again_after_boot(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        driver.faults.subsystem_restart()
    driver.faults.boot()
    with running_process(driver) as (fd, _):
        handle = open_skel(driver, fd)
        assert echo(driver, fd, handle, b"back", 4) == (0, b"back")


def test_down_for_boots_on_the_next_open(driver: EmulatedDriver) -> None:
    driver.faults.subsystem_restart(down_for=0)
    driver.close(driver.open(abi.CDSP_NODE, 0))
    driver.faults.subsystem_restart(down_for=3600)
    assert errno_of(driver.open, abi.CDSP_NODE, 0) == errno.ENOENT
    driver.faults.subsystem_restart(down_for=0)  # already down: only the timer changes
    driver.close(driver.open(abi.CDSP_NODE, 0))
    assert driver.statistics().restarts == 2
    driver.faults.boot()  # up already: nothing happens
    assert driver.statistics().restarts == 2


@pytest.mark.parametrize("down_for", [-1.0, math.nan, math.inf])
def test_down_for_must_be_a_duration(driver: EmulatedDriver, down_for: float) -> None:
    with pytest.raises(ValueError, match="down_for"):
        driver.faults.subsystem_restart(down_for=down_for)


# -- injected results ---------------------------------------------------------------------


def test_fail_next_invoke_on_any_remote_handle(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        handle = open_skel(driver, fd)
        driver.faults.fail_next_invoke(0x80000401)
        driver.faults.fail_next_invoke(0x80000402)
        result, out = echo(driver, fd, handle, b"abcd", 4)
        assert (result, out) == (0x80000401, bytes(4))  # the payload is copied back regardless
        assert echo(driver, fd, handle, b"abcd", 4)[0] == 0x80000402
        assert echo(driver, fd, handle, b"abcd", 4) == (0, b"abcd")
        assert driver.faults.pending_failures == 0


def test_fail_next_invoke_on_one_handle(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        first = open_skel(driver, fd)
        second = open_skel(driver, fd)
        driver.faults.fail_next_invoke(0x8000040E, handle=second)
        assert echo(driver, fd, first, b"a", 1) == (0, b"a")
        assert echo(driver, fd, second, b"a", 1)[0] == 0x8000040E
        assert echo(driver, fd, second, b"a", 1) == (0, b"a")


def test_fail_next_invoke_on_a_static_handle(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, responder):
        driver.faults.fail_next_invoke(0x8000043E, handle=0)
        assert remotectl_open(driver, fd, NPU_TEST_URI).result == 0x8000043E
        assert (0, SC_REMOTECTL_OPEN) not in responder.requests  # the DSP never ran it
        open_skel(driver, fd, NPU_TEST_URI)


def test_results_in_the_errno_range_look_like_errnos(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        handle = open_skel(driver, fd)
        driver.faults.fail_next_invoke(0xFFFFFFFF - 13)  # -14 as an int
        assert errno_of(echo, driver, fd, handle, b"", 0) == errno.EFAULT


@pytest.mark.parametrize(
    ("aee", "handle"), [(0, None), (1 << 32, None), (-5, None), (0x80000401, -1)]
)
def test_fail_next_invoke_checks_its_arguments(
    driver: EmulatedDriver, aee: int, handle: int | None
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message names the argument
        driver.faults.fail_next_invoke(aee, handle)


# -- latency ----------------------------------------------------------------------------------


def test_latency_delays_remote_handles_and_ssr_cuts_it_short(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        responder = ReverseResponder(driver, fd).start()
        driver.faults.set_latency(60)
        handle = open_skel(driver, fd)  # static handles are not delayed
        worker = _Background(lambda: echo(driver, fd, handle, b"x", 1))
        wait_until(lambda: driver.statistics().invokes_in_flight == 2)
        driver.faults.subsystem_restart()
        worker.join()
        responder.join()
        assert _errno_of_error(worker.error) == errno.EPIPE
    finally:
        driver.close(fd)


def test_a_small_latency_still_completes(driver: EmulatedDriver) -> None:
    driver.faults.set_latency(0.001)
    with running_process(driver) as (fd, _):
        handle = open_skel(driver, fd)
        assert echo(driver, fd, handle, b"slow", 4) == (0, b"slow")
    driver.faults.clear()
    assert driver.faults.latency == 0


@pytest.mark.parametrize("seconds", [-0.1, math.nan, math.inf])
def test_latency_must_be_a_duration(driver: EmulatedDriver, seconds: float) -> None:
    with pytest.raises(ValueError, match="latency"):
        driver.faults.set_latency(seconds)


# -- sessions ----------------------------------------------------------------------------------


def test_limit_sessions(driver: EmulatedDriver) -> None:
    first = driver.open(abi.CDSP_NODE, 0)
    second = driver.open(abi.CDSP_NODE, 0)
    try:
        driver.faults.limit_sessions(1)  # below what is in use: the open ones stay
        assert driver.statistics().session_limit == 1
        assert errno_of(driver.open, abi.CDSP_SECURE_NODE, 0) == errno.EBUSY
        driver.close(second)
        assert errno_of(driver.open, abi.CDSP_SECURE_NODE, 0) == errno.EBUSY
        driver.faults.limit_sessions(2)
        second = driver.open(abi.CDSP_SECURE_NODE, 0)
        driver.faults.limit_sessions(0)
        assert errno_of(driver.open, abi.CDSP_SECURE_NODE, 0) == errno.EBUSY
        driver.faults.limit_sessions(None)
        assert driver.statistics().session_limit == 12
    finally:
        driver.close(second)
        driver.close(first)


@pytest.mark.parametrize("limit", [-1, 13])
def test_limit_sessions_checks_its_argument(driver: EmulatedDriver, limit: int) -> None:
    with pytest.raises(ValueError, match="session limit"):
        driver.faults.limit_sessions(limit)


def test_clear_forgets_everything(driver: EmulatedDriver) -> None:
    driver.faults.fail_next_invoke(0x80000401)
    driver.faults.set_latency(5)
    driver.faults.limit_sessions(0)
    driver.faults.clear()
    assert (driver.faults.pending_failures, driver.faults.latency) == (0, 0)
    driver.close(driver.open(abi.CDSP_NODE, 0))


# -- leaks ---------------------------------------------------------------------------------------


def test_a_whole_lifecycle_leaks_nothing(driver: EmulatedDriver) -> None:
    before, threads = open_fd_count(), threading.active_count()
    for _ in range(3):
        with running_process(driver) as (fd, _):
            handle = open_skel(driver, fd, NPU_TEST_URI)
            buf = alloc_dma_buf(driver, fd, 2 * PAGE)
            mapping = driver.mmap(buf, 2 * PAGE)
            mem_map(driver, fd, buf, 2 * PAGE)
            mmap_heap(driver, fd, PAGE)
            prim = ctypes.create_string_buffer(struct.pack("<II", 9, PAGE), 8)
            anchor = ctypes.c_char.from_buffer(mapping)
            args = [Arg(ctypes.addressof(prim), 8), Arg(ctypes.addressof(anchor), PAGE, fd=buf)]
            del anchor
            assert invoke_args(driver, fd, handle, 0x02010100, args) == 0
            assert mapping[:2] == bytes([9, 10])
            mapping.close()
            driver.close(buf)
        driver.faults.subsystem_restart(down_for=0)
    stats = driver.statistics()
    assert stats.device_fds_open == stats.sessions_in_use == stats.dsp_processes == 0
    assert stats.remote_handles_open == stats.mem_maps == stats.mmap_buffers == 0
    assert (stats.dma_bufs_alive, stats.dma_bufs_allocated) == (0, 3)
    assert stats.reverse_requests_pending == stats.invokes_in_flight == 0
    assert open_fd_count() == before
    assert threading.active_count() == threads  # the emulator starts no threads
