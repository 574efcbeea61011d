"""FastRpcSession over a Driver: the emulator always, the device where one exists."""

from __future__ import annotations

import os
import struct
import threading
import zlib

import pytest

from npu_protocol import AEE, MAX_BUFFER_SIZE, MAX_DMA_SIZE, ErrorCode
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.dma import PAGE_SIZE
from npud.fastrpc.kernel.driver import KernelDriver
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline, Slice
from npud.fastrpc.session import FastRpcSession
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from tests.emulator.conftest import ECHO_URI, TEST_URI, fastrpc_threads, open_fds

ECHO_SC = abi.remote_scalars_make(2, 2, 1)
FILL_SC = abi.remote_scalars_make(2, 1, 1)
CHECKSUM_SC = abi.remote_scalars_make(3, 2, 1)
BUSY_SC = abi.remote_scalars_make(4, 1, 0)


def code_of(exc: pytest.ExceptionInfo[RpcError]) -> ErrorCode:
    return exc.value.code


def echo_inline(session: FastRpcSession, handle: int, data: bytes, capacity: int) -> bytes:
    result = session.invoke(
        handle, ECHO_SC, [Inline(struct.pack("<II", len(data), capacity)), Inline(data)],
        [Capacity(capacity)],
    )  # fmt: skip
    assert result.rc == 0
    return result.output(0)


# --------------------------------------------------------------------- open


def test_open_reads_the_capabilities(session: FastRpcSession) -> None:
    caps = session.capabilities
    assert caps.available
    assert caps.arch.startswith("v")
    assert session.device in abi.CDSP_NODES
    assert session.shell_loaded


def test_a_missing_secure_node_falls_back_to_the_plain_node(emulator: EmulatedDriver) -> None:
    with FastRpcSession.open(emulator, nodes=("/dev/fastrpc-cdsp-gone", abi.CDSP_NODE)) as s:
        assert s.device == abi.CDSP_NODE


def test_no_device_node_is_device_not_found(emulator: EmulatedDriver) -> None:
    before = open_fds()
    with pytest.raises(RpcError) as caught:
        FastRpcSession.open(emulator, nodes=("/dev/fastrpc-adsp", "/dev/nothing"))
    assert code_of(caught) is ErrorCode.DEVICE_NOT_FOUND
    assert "/dev/fastrpc-adsp (ENOENT), /dev/nothing (ENOENT)" in str(caught.value)
    assert open_fds() == before


def test_a_busy_device_is_no_free_session_and_leaks_nothing(emulator: EmulatedDriver) -> None:
    before = open_fds()
    emulator.faults.limit_sessions(1)
    held = FastRpcSession.open(emulator)  # takes the one compute session there is
    with pytest.raises(RpcError) as caught:
        FastRpcSession.open(emulator)
    assert code_of(caught) is ErrorCode.NO_FREE_SESSION
    held.close()
    assert open_fds() == before
    assert emulator.statistics().sessions_in_use == 0


def test_twelve_sessions_fill_the_twelve_context_banks(emulator: EmulatedDriver) -> None:
    """One device fd per session (as libcdsprpc): each session takes one of the X1E
    CDSP's twelve compute context banks, so twelve DSP processes fit."""
    sessions = [FastRpcSession.open(emulator) for _ in range(12)]
    try:
        with pytest.raises(RpcError) as caught:
            FastRpcSession.open(emulator)
        assert code_of(caught) is ErrorCode.NO_FREE_SESSION
    finally:
        for s in sessions:
            s.close()
    assert emulator.statistics().sessions_in_use == 0


def test_old_kernels_that_copy_the_capability_to_offset_zero() -> None:
    driver = EmulatedDriver(SimConfig(capability_copyback_bug=True, capability_domain_check=True))
    with FastRpcSession.open(driver) as s:
        assert s.capabilities.arch == "v73"
        assert s.capabilities.unsigned_pd


def test_a_dsp_without_the_capability_api_still_opens() -> None:
    with FastRpcSession.open(EmulatedDriver(SimConfig(capability_api=False))) as s:
        assert not s.capabilities.available


# -------------------------------------------------------------------- shell


def test_loading_twice_is_a_no_op(session: FastRpcSession, shell_bytes: bytes) -> None:
    session.load_shell(shell_bytes)
    assert session.statistics().shell_loaded


def test_a_shell_the_dsp_rejects_is_undone(emulator: EmulatedDriver) -> None:
    before = open_fds()
    with FastRpcSession.open(emulator, library_path=[DSP_LIBRARY_DIR]) as s:
        with pytest.raises(RpcError) as caught:
            s.load_shell(b"not an ELF image at all")
        assert code_of(caught) is ErrorCode.FASTRPC
        assert "AEE_EBADELF" in str(caught.value)
        assert not s.shell_loaded
        assert emulator.statistics().dma_bufs_alive == 0
        assert not fastrpc_threads()
    assert open_fds() == before


@pytest.mark.parametrize(("size", "needle"), [(0, "empty"), (abi.INIT_FILELEN_MAX + 1, "at most")])
def test_shell_size_bounds(emulator: EmulatedDriver, size: int, needle: str) -> None:
    with FastRpcSession.open(emulator) as s:
        with pytest.raises(RpcError, match=needle) as caught:
            s.load_shell(b"\x7fELF" * (size // 4) + b"x" * (size % 4))
        assert code_of(caught) is ErrorCode.SHELL_VERIFY
        assert emulator.statistics().dma_bufs_alive == 0


def test_calls_that_need_the_process_refuse_before_the_shell(emulator: EmulatedDriver) -> None:
    with FastRpcSession.open(emulator) as s:
        buffer = s.alloc(4096)
        with pytest.raises(RpcError, match="load the shell first"):
            s.map(buffer)
        with pytest.raises(RpcError, match="load the shell first"):
            s.remote_open(ECHO_URI)


# ---------------------------------------------------------------------- DMA


@pytest.mark.parametrize(
    ("size", "code"),
    [
        (0, ErrorCode.DMA_BUF_ALLOC),
        (-4096, ErrorCode.INVALID_ARGUMENT),
        (MAX_BUFFER_SIZE + 1, ErrorCode.DMA_EXCEEDS_MAX_SIZE),
        (2**64 - 1, ErrorCode.DMA_EXCEEDS_MAX_SIZE),
        (2**64 - PAGE_SIZE + 1, ErrorCode.DMA_EXCEEDS_MAX_SIZE),
    ],
)
def test_bad_sizes_leave_nothing_behind(
    session: FastRpcSession, size: int, code: ErrorCode
) -> None:
    before = open_fds()
    with pytest.raises(RpcError) as caught:
        session.alloc(size)
    assert code_of(caught) is code
    assert open_fds() == before
    assert session.statistics().buffers == 0


def test_alloc_is_page_rounded_shared_and_freed(session: FastRpcSession) -> None:
    before = open_fds()
    buffer = session.alloc(100)
    assert buffer.size == PAGE_SIZE  # the allocated size, the one size there is
    # Its fd, and the private dup CPython's mmap keeps of it.
    assert open_fds() == before + 2
    view = buffer.view()
    view[:5] = b"hello"
    assert len(view) == PAGE_SIZE
    view.release()
    session.free(buffer)
    assert buffer.released
    assert open_fds() == before
    with pytest.raises(RpcError) as caught:
        session.free(buffer)
    assert code_of(caught) is ErrorCode.UNKNOWN_BUFFER


def test_the_largest_buffer_is_allowed(emulator: EmulatedDriver) -> None:
    with FastRpcSession.open(emulator) as s:
        buffer = s.alloc(MAX_DMA_SIZE)
        assert buffer.size == MAX_DMA_SIZE
        s.free(buffer)
        # llama.cpp's chunk of 256 MiB with its guard page, and a 300 MiB tensor
        for size in (MAX_DMA_SIZE + 4096, 300 << 20):
            buffer = s.alloc(size)
            assert buffer.size == size
            s.free(buffer)


def test_dma_bufs_are_sealed(session: FastRpcSession, driver: object) -> None:
    if not isinstance(driver, EmulatedDriver):
        pytest.skip("sealing is how the emulator models a DMA-BUF")
    buffer = session.alloc(4096)
    with pytest.raises(PermissionError):
        os.ftruncate(buffer.fd, 8192)
    session.free(buffer)


def test_map_is_idempotent_and_free_unmaps(session: FastRpcSession, driver: object) -> None:
    buffer = session.alloc(1 << 20)
    address = session.map(buffer)
    assert 0 < address < 2**32
    assert session.map(buffer) == address
    assert session.statistics().mapped_buffers == 1
    session.unmap(buffer)
    session.unmap(buffer)  # not mapped: left as it is
    assert session.address_of(buffer) is None
    session.map(buffer)
    session.free(buffer)
    if isinstance(driver, EmulatedDriver):
        assert driver.statistics().mem_maps == 0


def test_free_dma_buff_enotty_is_remembered(session: FastRpcSession) -> None:
    for _ in range(3):
        session.free(session.alloc(4096))
    # The first free learnt that FREE_DMA_BUFF is not implemented; closing frees.
    assert session.free_dma_buff_supported is False


def test_a_buffer_of_another_session_maps_here_and_is_freed_by_its_own(
    session: FastRpcSession, driver: object, shell_bytes: bytes
) -> None:
    """A DMA-BUF belongs to no DSP process: any session maps it (MEM_MAP attaches it to
    that session's context bank) and passes slices of it; only the session that
    allocated it frees it, and it stays until every session's mapping of it is gone."""
    assert isinstance(driver, EmulatedDriver | KernelDriver)
    with FastRpcSession.open(driver) as other:
        other.load_shell(shell_bytes)
        foreign = other.alloc(4096)
        with pytest.raises(RpcError) as caught:
            session.free(foreign)
        assert code_of(caught) is ErrorCode.UNKNOWN_BUFFER
        here, there = session.map(foreign), other.map(foreign)
        assert session.address_of(foreign) == here
        assert other.address_of(foreign) == there
        assert foreign.mappings == 2
        other.free(foreign)
        assert not foreign.released  # still mapped here
        assert other.address_of(foreign) is None
        session.unmap(foreign)
        assert foreign.released
        session.unmap(foreign)  # not mapped: left as it is


# ------------------------------------------------------------------- invoke


def test_echo_inline(session: FastRpcSession) -> None:
    handle = session.remote_open(ECHO_URI)
    assert echo_inline(session, handle, b"hello", 8) == b"hello\0\0\0"
    assert echo_inline(session, handle, b"0123456789", 4) == b"0123"
    session.remote_close(handle)


def test_echo_through_dma_buffer_slices(session: FastRpcSession) -> None:
    handle = session.remote_open(ECHO_URI)
    buffer = session.alloc(8192)
    view = buffer.view()
    view[100:164] = bytes(range(64))
    result = session.invoke(
        handle, ECHO_SC,
        [Inline(struct.pack("<II", 64, 64)), Slice(buffer, 100, 64)],
        [Slice(buffer, 4096, 64)],
    )  # fmt: skip
    assert result.rc == 0
    assert result.outputs == (None,)
    assert bytes(view[4096:4160]) == bytes(range(64))
    view.release()
    session.free(buffer)


@pytest.mark.parametrize(("offset", "length"), [(-1, 4), (0, 4097), (4096, 1), (10, -1)])
def test_slices_out_of_range_are_refused(session: FastRpcSession, offset: int, length: int) -> None:
    handle = session.remote_open(ECHO_URI)
    buffer = session.alloc(4096)
    with pytest.raises(RpcError) as caught:
        session.invoke(
            handle, ECHO_SC, [Inline(struct.pack("<II", 4, 4)), Slice(buffer, offset, length)],
            [Capacity(4)],
        )  # fmt: skip
    assert code_of(caught) is ErrorCode.SLICE_OUT_OF_RANGE
    session.free(buffer)  # nothing stayed pinned


def test_unknown_and_closed_handles_are_refused(session: FastRpcSession) -> None:
    for handle in (0, 1, 3, 0x12345):
        with pytest.raises(RpcError) as caught:
            session.invoke(handle, ECHO_SC, [Inline(b""), Inline(b"")], [Capacity(0)])
        assert code_of(caught) is ErrorCode.UNKNOWN_HANDLE
    handle = session.remote_open(ECHO_URI)
    session.remote_close(handle)
    with pytest.raises(RpcError) as caught:
        session.remote_close(handle)
    assert code_of(caught) is ErrorCode.UNKNOWN_HANDLE


def test_scalars_that_disagree_with_the_arguments_are_refused(session: FastRpcSession) -> None:
    handle = session.remote_open(ECHO_URI)
    with pytest.raises(RpcError, match="declares 2 inputs and 1 outputs; 1 and 1") as caught:
        session.invoke(handle, ECHO_SC, [Inline(b"x")], [Capacity(1)])
    assert code_of(caught) is ErrorCode.INVALID_ARGUMENT
    with pytest.raises(RpcError) as caught:
        session.invoke(handle, abi.remote_scalars_makex(0, 2, 0, 0, 1, 0), [], [])
    assert code_of(caught) is ErrorCode.UNSUPPORTED


def test_dsp_result_codes_come_back_as_results(session: FastRpcSession) -> None:
    handle = session.remote_open(ECHO_URI)
    # primIn claims 100 input bytes but 4 are sent: the skel answers AEE_EBADPARM.
    result = session.invoke(
        handle, ECHO_SC, [Inline(struct.pack("<II", 100, 4)), Inline(b"abcd")], [Capacity(4)]
    )
    assert result.rc == AEE.EBADPARM.dsp


def test_the_test_skel_fills_and_checksums_shared_memory(
    session: FastRpcSession, driver: object
) -> None:
    if not isinstance(driver, EmulatedDriver):
        pytest.skip("npu_test is the emulator's test skel")
    handle = session.remote_open(TEST_URI)
    buffer = session.alloc(1 << 20)
    session.map(buffer)
    assert (
        session.invoke(
            handle, FILL_SC, [Inline(struct.pack("<II", 7, 4096))], [Slice(buffer, 0, 4096)]
        ).rc
        == 0
    )
    expected = bytes((7 + i) & 0xFF for i in range(4096))
    assert bytes(buffer.view()[:4096]) == expected
    result = session.invoke(
        handle,
        CHECKSUM_SC,
        [Inline(struct.pack("<I", 4096)), Slice(buffer, 0, 4096)],
        [Capacity(4)],
    )
    assert struct.unpack("<I", result.output(0))[0] == zlib.crc32(expected)
    session.free(buffer)


def test_remote_open_failures_carry_the_dlerror(session: FastRpcSession) -> None:
    with pytest.raises(RpcError) as caught:
        session.remote_open("file:///libmissing_skel.so?missing_skel_handle_invoke&_modver=1.0")
    assert code_of(caught) is ErrorCode.OPEN_FAILED
    assert "libmissing_skel.so" in str(caught.value)
    with pytest.raises(RpcError) as caught:
        session.remote_open("file:///libecho_skel.so?nope_skel_handle_invoke&_modver=1.0")
    assert code_of(caught) is ErrorCode.OPEN_FAILED
    assert "nope_skel_handle_invoke" in str(caught.value)
    for bad in ("", "a\0b", "x" * 2000):
        with pytest.raises(RpcError) as caught:
            session.remote_open(bad)
        assert code_of(caught) is ErrorCode.INVALID_ARGUMENT
    assert session.statistics().remote_handles == 0


def test_an_injected_dsp_failure_is_returned(session: FastRpcSession, driver: object) -> None:
    if not isinstance(driver, EmulatedDriver):
        pytest.skip("fault injection is the emulator's")
    handle = session.remote_open(ECHO_URI)
    driver.faults.fail_next_invoke(AEE.ENOMEMORY.dsp, handle=handle)
    result = session.invoke(
        handle, ECHO_SC, [Inline(struct.pack("<II", 1, 1)), Inline(b"x")], [Capacity(1)]
    )
    assert result.rc == AEE.ENOMEMORY.dsp
    assert echo_inline(session, handle, b"y", 1) == b"y"


# ------------------------------------------------------------- concurrency


def _busy_on_thread(
    session: FastRpcSession, handle: int, micros: int
) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(
                session.invoke(handle, BUSY_SC, [Inline(struct.pack("<I", micros))], []).rc
            )
        except RpcError as exc:
            outcome.append(exc.code)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _wait_in_flight(session: FastRpcSession, count: int) -> None:
    for _ in range(2000):
        if session.statistics().invokes_in_flight >= count:
            return
        threading.Event().wait(0.001)
    raise AssertionError("the invoke never started")


def test_alloc_and_free_do_not_wait_behind_a_long_invoke(emulator: EmulatedDriver) -> None:
    with FastRpcSession.open(emulator, library_path=[DSP_LIBRARY_DIR]) as s:
        s.load_shell(
            (DSP_LIBRARY_DIR.parent.parent / "devshell" / "fastrpc_shell_unsigned_3").read_bytes()
        )
        handle = s.remote_open(TEST_URI)
        thread, outcome = _busy_on_thread(s, handle, 30_000_000)  # far longer than this test
        _wait_in_flight(s, 1)
        buffer = s.alloc(1 << 20)  # would hang here if allocation queued behind the invoke
        s.map(buffer)
        s.free(buffer)
        assert outcome == []  # the long invoke is still running
        emulator.faults.subsystem_restart()  # end it: in-flight invokes fail with EPIPE
        thread.join(10)
        assert outcome == [ErrorCode.DSP_RESTARTED]


def test_free_during_an_invoke_is_deferred_until_it_returns(
    session: FastRpcSession, driver: object
) -> None:
    if not isinstance(driver, EmulatedDriver):
        pytest.skip("needs the emulator's busy skel")
    handle = session.remote_open(TEST_URI)
    buffer = session.alloc(4096)
    gate = threading.Event()
    results: list[int] = []

    def checksum() -> None:
        gate.set()
        res = session.invoke(
            handle,
            CHECKSUM_SC,
            [Inline(struct.pack("<I", 4096)), Slice(buffer, 0, 4096)],
            [Capacity(4)],
        )
        results.append(res.rc)

    driver.faults.set_latency(0.2)
    thread = threading.Thread(target=checksum)
    thread.start()
    gate.wait()
    _wait_in_flight(session, 1)
    session.free(buffer)
    assert not buffer.released  # the DSP may still read it
    thread.join(10)
    driver.faults.set_latency(0)
    assert results == [0]
    assert buffer.released


def test_a_subsystem_restart_fails_everything_and_close_still_releases(
    emulator: EmulatedDriver,
) -> None:
    before = open_fds()
    s = FastRpcSession.open(emulator, library_path=[DSP_LIBRARY_DIR])
    s.load_shell(
        (DSP_LIBRARY_DIR.parent.parent / "devshell" / "fastrpc_shell_unsigned_3").read_bytes()
    )
    handle = s.remote_open(ECHO_URI)
    buffer = s.alloc(4096)
    s.map(buffer)
    emulator.faults.subsystem_restart()
    with pytest.raises(RpcError) as caught:
        echo_inline(s, handle, b"x", 1)
    assert code_of(caught) is ErrorCode.DSP_RESTARTED
    assert s.dead
    with pytest.raises(RpcError) as caught:
        s.alloc(4096)
    assert code_of(caught) is ErrorCode.DSP_RESTARTED
    s.close()
    assert open_fds() == before
    assert not fastrpc_threads()
    # The nodes are gone until the DSP boots again.
    with pytest.raises(RpcError) as caught:
        FastRpcSession.open(emulator)
    assert code_of(caught) is ErrorCode.DEVICE_NOT_FOUND
    emulator.faults.boot()
    with FastRpcSession.open(emulator) as again:
        assert not again.dead


def test_close_waits_for_invokes_and_refuses_new_calls(
    session: FastRpcSession, driver: object
) -> None:
    if not isinstance(driver, EmulatedDriver):
        pytest.skip("needs the emulator's busy skel")
    handle = session.remote_open(TEST_URI)
    thread, outcome = _busy_on_thread(session, handle, 50_000)
    _wait_in_flight(session, 1)
    with pytest.raises(RpcError) as caught:
        session.close(timeout=0.001)
    assert code_of(caught) is ErrorCode.SESSION_BUSY
    with pytest.raises(RpcError) as caught:
        session.alloc(4096)
    assert code_of(caught) is ErrorCode.SESSION_CLOSED
    session.close()  # waits for the busy call
    thread.join(5)
    assert outcome == [0]


def test_statistics_count_calls(session: FastRpcSession) -> None:
    handle = session.remote_open(ECHO_URI)
    done = session.statistics().invokes_done
    echo_inline(session, handle, b"abc", 3)
    stats = session.statistics()
    assert stats.invokes_done == done + 1
    assert stats.invokes_in_flight == 0
    assert stats.remote_handles == 1
    assert stats.listener_running
    assert stats.listener_requests > 0


def test_a_hostile_skel_name_does_not_kill_the_listener(session: FastRpcSession) -> None:
    with pytest.raises(RpcError) as caught:
        session.remote_open("file:///" + "x" * 300 + "_skel.so?x_skel_handle_invoke")
    assert code_of(caught) is ErrorCode.OPEN_FAILED
    assert session.listener_running
    handle = session.remote_open(ECHO_URI)  # skels still load
    assert echo_inline(session, handle, b"ok", 2) == b"ok"


def test_closing_a_handle_under_a_running_invoke_waits_for_it(
    session: FastRpcSession, driver: object
) -> None:
    if not isinstance(driver, EmulatedDriver):
        pytest.skip("needs the emulator's busy skel")
    handle = session.remote_open(TEST_URI)
    thread, outcome = _busy_on_thread(session, handle, 200_000)
    _wait_in_flight(session, 1)
    session.remote_close(handle)  # returns at once; the skel stays loaded
    assert session.statistics().remote_handles == 0
    assert driver.statistics().remote_handles_open == 1
    with pytest.raises(RpcError) as caught:
        session.invoke(handle, BUSY_SC, [Inline(struct.pack("<I", 1))], [])
    assert code_of(caught) is ErrorCode.UNKNOWN_HANDLE
    thread.join(10)
    assert outcome == [0]
    assert driver.statistics().remote_handles_open == 0  # closed by the last invoke
